"""nvgemm's sm100 NVFP4 kernel executed on the PTX emulator with the ISA opcode modules for mbarrier, TMA and
tcgen05 (nvgemm.emulator.isa.ops_sm100): the real AOT artifact, relinked against the fake CUDA runtime, must
produce the bits of the emulated backend's arithmetic (``kernel_view_ref``).

Data are exact: random E2M1 codes with power-of-two block scales (ue4m3 2**-2 .. 2**2), so every product is
exact and every fp32 partial sum is exact (|sum| < 2**11 with a quantum of 2**-6 at most 2**17 apart), and the
summation order (the hardware's or torch's) cannot matter. Most cases use alpha = 1 and no bias; the epilogue
cases (``cfg["epi"]``) scale by power-of-two alphas (scalar 2**-1, or per feature 2**-2 .. 2**0) and add bf16
biases on a 2**-2 grid, which keeps ``acc * alpha + bias`` exact in fp32 (quantum >= 2**-8, magnitude < 2**14),
so the reference's order alpha -> bias is checked by value: ``(acc + bias) * alpha`` differs wherever bias != 0.
The native gated (``silu_mul``) case gives every gate a bias of +-8192 and checks |gate| > 32: then
``1 + exp(-gate)`` rounds to 1 (or is inf) in fp32, so ``silu(gate)`` is the gate itself (or -0) in kernel and
torch alike, whatever the accuracy of ``exp``, and ``silu(gate) * up`` is one fp32 product in both; the up
biases are small and differ from the gate's, so an up value given its gate's bias is off by ~8192.

The run also exercises what the unit tests could only derive: the tensor-map decoding of CuTeDSL's inline
encoder, the TMA box swizzle, the UMMA descriptors, and the scale-factor placement in tensor memory after
``tcgen05.cp .32x128b.warpx4`` -- CuTe's NVIDIA-written atoms and partitioners build all of them in this kernel.
Mutation check (by hand, see the commit message): reversing the scale bytes of a TMEM cell fails every case.
Every case also checks the PDL prologue from the emulator's record of global accesses before
``griddepcontrol.wait`` (:func:`check_pdl_prologue`).
"""

import pytest
import torch
from _pdl import check_pdl_prologue
from isa_env import kernel_test_env

kernel_test_env("sm_100a")

import nvgemm.ops.linear  # noqa: E402,F401 -- registers torch.ops.nvgemm (the activation quantizer)
from nvgemm.epilogues import EpilogueSpec  # noqa: E402
from nvgemm.core.formats import dequantize, to_blocked  # noqa: E402
from nvgemm.aot.compile_spec import make_spec  # noqa: E402
from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig as C  # noqa: E402
from nvgemm.templates.sm100_w4a4.launch import kernel_view_ref, prepare_sm100_args  # noqa: E402

POW2_E4M3 = torch.tensor([0x28, 0x30, 0x38, 0x40, 0x48], dtype=torch.uint8)  # 2**-2 .. 2**2

CASES = [
    pytest.param(128, 256, 512, dict(tile_n=128), id="m128-n256-k512-t128", marks=pytest.mark.emulator),
    pytest.param(7, 512, 512, dict(tile_n=16, swap_ab=True), id="m7-n512-k512-swap16", marks=pytest.mark.emulator),
    pytest.param(256, 256, 512, dict(tile_n=128, cluster_m=2, cluster_n=2), id="m256-n256-k512-t128-c2x2-multicast",
                 marks=pytest.mark.emulator),
    # 2-CTA MMA (tcgen05 .cta_group::2, M = 256 over a CTA pair; the pair leader's mbarrier reached by clearing
    # bit 24 of a shared address); M = 200 leaves a row tail in the peer CTA's half
    pytest.param(200, 384, 512, dict(tile_m=256, tile_n=128, cluster_m=2), id="m200-n384-k512-t256x128-2cta",
                 marks=pytest.mark.emulator),
    pytest.param(256, 512, 512, dict(tile_m=256, tile_n=128, cluster_m=2, cluster_n=2),
                 id="m256-n512-k512-t256x128-2cta-c2x2-multicast", marks=pytest.mark.emulator),
    pytest.param(37, 512, 1024, dict(tile_m=256, tile_n=64, cluster_m=2, swap_ab=True, split_k=2),
                 id="m37-n512-k1024-t256x64-2cta-swap-sk2", marks=pytest.mark.emulator),
    # a K tail (K = 640: three K tiles, the last 128 wide) split unevenly (3 tiles over 2 splits: 1 + 2); a
    # split range that drops the leftover tile or a K-tile count rounded down fails it
    pytest.param(7, 256, 640, dict(tile_n=16, swap_ab=True, split_k=2), id="m7-n256-k640-swap16-sk2-ktail",
                 marks=pytest.mark.emulator),
    # the native orientation with a K tail (K = 352: one whole K tile and 96 of the next), with bias and a
    # scalar alpha of 2**-1 (the ungated epilogue's order alpha -> bias by value)
    pytest.param(9, 128, 352, dict(tile_n=64, epi=dict(alpha="scalar", bias=True)),
                 id="m9-n128-k352-t64-ktail-bias-alpha", marks=pytest.mark.emulator),
    # a native (non-swap-AB) gated tile: silu_mul over interleaved gate/up columns, per-feature alpha and
    # distinct gate / up biases (the up value's own alpha and bias by value)
    pytest.param(5, 256, 256, dict(tile_n=64, epi=dict(alpha="vector", bias=True, activation="silu_mul")),
                 id="m5-n256-k256-t64-silu_mul-bias-valpha", marks=pytest.mark.emulator),
    pytest.param(100, 384, 1024, dict(tile_n=64), id="m100-n384-k1024-t64", marks=[pytest.mark.emulator,
                                                                                  pytest.mark.slow]),
    pytest.param(16, 256, 1024, dict(tile_n=16, swap_ab=True, split_k=4), id="m16-n256-k1024-swap16-sk4",
                 marks=[pytest.mark.emulator, pytest.mark.slow]),
]


# cfg["epi"]: the case's epilogue (default: scalar alpha 1, no bias, no activation): alpha "scalar" (2**-1) or
# "vector" (per feature 2**-2 .. 2**0); bias: bf16 on a 2**-2 grid (gated: gate biases +-8192, module docstring)


def _epilogue_operands(g, n, alpha="none", bias=False, activation="none"):
    """(weight_scale_2, input_scale, bias [n] in checkpoint order, EpilogueSpec) of one case."""
    input_scale = torch.tensor(1.0)
    if alpha == "vector":
        ws2 = torch.pow(2.0, torch.randint(-2, 1, (n,), generator=g).float())
    else:
        ws2 = torch.tensor(0.5 if alpha == "scalar" else 1.0)
    b = None
    if bias:
        b = torch.randint(-16, 17, (n,), generator=g) * 0.25
        if activation == "silu_mul":  # checkpoint order [gate; up]: gates +-8192 (-8192 on every 3rd feature)
            i = n // 2
            b[:i] = torch.where(torch.arange(i) % 3 == 2, -8192.0, 8192.0)
            assert not torch.isin(b[i:], b[:i]).any()  # every up bias differs from every gate bias
        b = b.to(torch.bfloat16)
    spec = EpilogueSpec(alpha="vector" if alpha == "vector" else "scalar", bias=bias, activation=activation,
                        out_dtype=torch.bfloat16)
    return ws2, input_scale, b, spec


def _exact_codes(g, rows, k):
    packed = torch.randint(0, 256, (rows, k // 2), generator=g, dtype=torch.uint8)
    scales = POW2_E4M3[torch.randint(0, 5, (rows, k // 16), generator=g)].view(torch.float8_e4m3fn)
    return packed, scales


@pytest.mark.parametrize("m,n,k,cfg", CASES)
def test_sm100_kernel_on_emulator_matches_reference(m, n, k, cfg, tmp_path, monkeypatch, seed):
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    from nvgemm.emulator.runner import prepare

    cfg = dict(cfg)
    epi_kw = cfg.pop("epi", {})
    config = C(**cfg)
    g = torch.Generator().manual_seed(seed)
    w_packed, w_scale = _exact_codes(g, n, k)
    ws2, input_scale, bias, epi = _epilogue_operands(g, n, **epi_kw)
    args = prepare_sm100_args(torch.zeros(m, k, dtype=torch.bfloat16), w_packed, to_blocked(w_scale), ws2,
                              input_scale, bias, None, epi, config)
    x_packed, x_scale = _exact_codes(g, m, k)  # replace the quantized activations by exact codes, same layout
    xa, xs = (args.b, args.sfb) if config.swap_ab else (args.a, args.sfa)
    xa.copy_(x_packed)
    xs.view(torch.uint8).copy_(to_blocked(x_scale).view(torch.uint8).reshape(xs.shape))
    if epi.gated:  # the exactness condition of the gated case (module docstring)
        acc = dequantize(x_packed, x_scale) @ dequantize(w_packed, w_scale).t()  # [m, n], checkpoint order
        gate = (acc * ws2 + bias.float())[:, : n // 2]
        assert gate.abs().min() > 32, "a gate near 0: silu would depend on exp's accuracy"
    spec = make_spec("sm100_nvfp4_gemm", config, "sm_100a", epilogue=epi)
    z = lambda t: t if t is not None else 0  # noqa: E731
    kernel = prepare(spec)
    want = kernel_view_ref(args)
    # split-K: the second launch reuses the workspace and counters the first left behind (the last split of
    # each tile resets its counter; nothing zeroes them between calls); the output is uninitialised each time
    for launch_no in range(2 if config.split_k > 1 else 1):
        args.out.fill_(float("nan"))
        launch = kernel.launch(args.a, args.b, args.sfa, args.sfb, args.out, args.alpha, z(args.bias),
                               z(args.residual), z(args.workspace), z(args.counters), args.m, args.n, args.k, 0)
        assert launch is not None and launch.stats["warp_instructions"] > 0
        torch.testing.assert_close(args.out, want, rtol=0, atol=0, msg=f"launch {launch_no}")
        check_pdl_prologue(launch, weights={"a_ptr", "sfa_ptr"} if config.swap_ab else {"b_ptr", "sfb_ptr"})
        if args.counters is not None:
            assert not args.counters.any(), "split-K counters left non-zero: the next launch would misreduce"
