"""The sm_100a kernel with the fused SwiGLU + NVFP4 requant epilogue (``EpilogueSpec(out_quant=True)``)
executed on the PTX emulator through its real AOT artifact: the packed FP4 codes and the 128x4-swizzled e4m3
scales it writes must equal, byte for byte, ``quantize_nvfp4`` of the rounded SwiGLU output computed in torch
from the same (exact) operands -- and the lane model of :mod:`nvgemm.epilogues.requant`.

Exactness-preserving data: random E2M1 codes with power-of-two block scales and alpha = 1 (every fp32
accumulator is exact, see test_isa_sm100_kernel.py); the gate rows get a bias of 4096, so every gate lies in
[2048, 6144] where ``g / (1 + exp(-g)) == g * sigmoid(g) == g`` exactly in fp32 (kernel and torch agree
without depending on exp's accuracy); ``h = g * up`` is one fp32 product in both, then one rounding to bf16.
The quantization steps (amax, e4m3 scale, true division, E2M1 RNE) are what is under test.
Token tails (M = 7 in a 16-token tile), I = 80 (a ragged second 128-row tile, K blocks padded 5 -> 8), and
M = 40 / 128 tokens, whose scale bytes sit in the 32-row groups 1..3 of the 128x4 swizzle.
"""

import pytest
import torch
from isa_env import kernel_test_env

kernel_test_env("sm_100a")

import nvgemm.ops.linear  # noqa: E402,F401
from _fused_chain_emu import exact_chain as _exact_chain  # noqa: E402
from _fused_chain_emu import exact_codes as _exact_codes  # noqa: E402
from nvgemm.epilogues import EpilogueSpec  # noqa: E402
from nvgemm.epilogues.requant import fused_requant_reference  # noqa: E402
from nvgemm.core.formats import dequantize, from_blocked, to_blocked  # noqa: E402
from nvgemm.aot.compile_spec import make_spec  # noqa: E402
from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig as C  # noqa: E402
from nvgemm.templates.sm100_w4a4.launch import prepare_sm100_requant_args, requant_config  # noqa: E402



@pytest.mark.emulator
@pytest.mark.parametrize("m,i,k,sk,tile_n", [(7, 64, 512, 1, 16), (7, 80, 256, 1, 16), (7, 64, 512, 2, 16),
                                             (40, 32, 256, 1, 64), (128, 32, 256, 1, 128)],
                         ids=["m7-i64-k512", "m7-i80-k256", "m7-i64-k512-sk2", "m40-i32-k256-t64",
                              "m128-i32-k256-t128"])
def test_fused_requant_kernel_on_emulator(m, i, k, sk, tile_n, tmp_path, monkeypatch, seed):
    """Tokens past 32 (M = 40, and M = 128: every 32-row group of a 128-row scale atom) reach the
    row-group term of the scale-factor swizzle, on the token tiles the launcher picks for them."""
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    from nvgemm.emulator.runner import prepare

    if m > 16:
        assert requant_config(m).tile_n == tile_n  # the production launch's tile for m tokens
    config = C(tile_n=tile_n, swap_ab=True, split_k=sk)  # split-K: the last split reduces, then requantizes
    g = torch.Generator().manual_seed(seed)
    w_packed, w_scale = _exact_codes(g, 2 * i, k)  # checkpoint order [gate; up]
    # gate bias +4096, and -4096 on every 3rd feature: silu(g) = -0 there in kernel and torch alike, so h
    # holds signed zeros inside non-zero blocks (E2M1 code 0, not 0x8 = -0, per nvgemm.core.formats)
    gate_bias = torch.where(torch.arange(i) % 3 == 2, -4096.0, 4096.0)
    bias = torch.cat([gate_bias, torch.zeros(i)]).to(torch.bfloat16)
    one = torch.tensor(1.0)
    gs = torch.tensor(1.0)  # replaced below, once h is known
    epi = EpilogueSpec(alpha="scalar", bias=True, activation="silu_mul", out_quant=True)
    args = prepare_sm100_requant_args(torch.zeros(m, k, dtype=torch.bfloat16), w_packed, to_blocked(w_scale), one,
                                      one, bias, gs, epi, config)
    x_packed, x_scale = _exact_codes(g, m, k)
    args.b.copy_(x_packed)
    args.sfb.view(torch.uint8).copy_(to_blocked(x_scale).view(torch.uint8).reshape(args.sfb.shape))

    # torch reference from the checkpoint-order operands
    acc = dequantize(x_packed, x_scale) @ dequantize(w_packed, w_scale).t()  # [m, 2I], exact
    pre = acc + bias.float()
    h = (pre[:, :i] * torch.sigmoid(pre[:, :i]) * pre[:, i:]).to(torch.bfloat16)
    gs = (h.float().abs().amax() / 2688 * 0.25).reshape(())  # some blocks saturate the e4m3 scale
    ref_p, ref_s = torch.ops.nvgemm.quantize_nvfp4(h, gs, True)
    model_p, model_s = fused_requant_reference(pre, gs, torch.bfloat16)
    assert torch.equal(model_p, ref_p) and torch.equal(model_s.view(torch.uint8), ref_s.view(torch.uint8))
    assert (from_blocked(ref_s, m, i // 16).float() == 448).any()
    assert torch.signbit(h.float()[h == 0]).any()  # negative zeros reach the quantizer

    args.alpha[-1] = gs
    spec = make_spec("sm100_nvfp4_gemm", config, "sm_100a", epilogue=epi)
    z = lambda t: t if t is not None else 0  # noqa: E731
    kernel = prepare(spec)
    # the launcher allocates codes and scales uninitialised (torch.empty): the kernel must write every byte,
    # the layout's padding rows / K blocks included. Two launches on the same split-K workspace and
    # counters, each onto outputs filled with garbage (0xff: an e4m3 NaN scale), give the same bytes.
    for launch_no in range(2):
        args.out.fill_(0xA5)
        args.residual.fill_(0xFF)
        launch = kernel.launch(args.a, args.b, args.sfa, args.sfb, args.out, args.alpha, args.bias,
                               args.residual, z(args.workspace), z(args.counters), args.m, args.n, args.k, 0)
        assert launch is not None and launch.stats["warp_instructions"] > 0
        assert torch.equal(args.out, ref_p), launch_no
        assert torch.equal(args.residual, ref_s.view(torch.uint8)), launch_no  # incl. the zero padding
        if args.counters is not None:
            assert not args.counters.any(), "split-K counters left non-zero: the next launch would misreduce"


def test_emulator_narrow_conversions_match_torch():
    """The emulator's cvt.rn.satfinite.{e2m1x2,e4m3x2}.f32 / cvt.rn.f16x2.e4m3x2 element rules against
    nvgemm.core.formats' E2M1 encoder (ModelOpt's rule) and torch's float8_e4m3fn cast: ties, saturation,
    subnormal e4m3 scales, signed zeros, every e4m3 byte decoded."""
    import numpy as np

    from nvgemm.emulator.ptx.ops.fp import e2m1_rn_satfinite, e4m3_rn_satfinite, e4m3_to_f64
    from nvgemm.core.formats import e2m1_encode

    g = torch.Generator().manual_seed(0)
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0, -0.25, -0.1, -5.0, 0.0, 6.0, -6.5]
    x = torch.cat([torch.randn(20000, generator=g) * 3, torch.tensor(ties)])
    assert np.array_equal(e2m1_rn_satfinite(x.double().numpy()), e2m1_encode(x).numpy().astype(np.uint32))
    y = torch.cat([torch.randn(20000, generator=g).abs() * torch.logspace(-4, 3, 20000),
                   torch.tensor([448.0, 460.0, 464.0, 470.0, 1e4, 2.0**-10, 2.0**-9 * 1.5, 0.0, 2.0**-9 * 2.5])])
    ref = y.clamp(max=448).to(torch.float8_e4m3fn).view(torch.uint8).numpy().astype(np.uint32)
    assert np.array_equal(e4m3_rn_satfinite(y.double().numpy()), ref)
    every = np.arange(256)
    t = torch.tensor(every, dtype=torch.uint8).view(torch.float8_e4m3fn).double().numpy()
    v = e4m3_to_f64(every)
    assert np.array_equal(np.isnan(v), np.isnan(t)) and np.array_equal(v[~np.isnan(v)], t[~np.isnan(t)])


@pytest.mark.emulator
def test_gated_mlp_chain_with_the_kernel_on_emulator(tmp_path, monkeypatch):
    """gate_up -> down for two NVFP4Linear layers with the gate_up GEMM run by the sm_100a kernel's fused
    requant epilogue on the emulator (``NVGEMM_BACKEND=emu_sm100``; down on the W4A4 kernel fed its codes and
    scales): the output equals the emulated unfused chain ``down(gate_up(x))`` bit for bit. Exact data as
    above, and x chosen so that its own NVFP4 quantization is exact (every 16-block holds +-6 * 2**j,
    input_scale 1)."""
    from nvgemm.ops.fused import gated_mlp
    from nvgemm.dispatch.fused import PREQUANT, REQUANT, last_fused_selected

    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    gu, down, x = _exact_chain()
    ref = gated_mlp(gu, down, x)
    assert torch.equal(ref, down(gu(x)))
    monkeypatch.setenv("NVGEMM_BACKEND", "emu_sm100")
    assert torch.equal(gated_mlp(gu, down, x), ref)
    # both fused ops ran the sm_100a kernels (requant: the out_quant epilogue; prequant: the W4A4 kernel fed
    # the codes + scales the first one wrote), through the backend registry
    assert last_fused_selected(REQUANT) == "emu_sm100" and last_fused_selected(PREQUANT) == "emu_sm100"
    # the requant op on an activation that arrives quantized (what the fused RMSNorm quantizer feeds it under
    # torch.compile): the same out_quant launch fed the codes, the same bytes as quantizing x inside
    xq, xs = torch.ops.nvgemm.quantize_nvfp4(x, gu.input_scale, True)
    rq = (gu.weight, gu.weight_scale, gu.weight_scale_2, gu.input_scale, gu.bias, down.input_scale)
    got = torch.ops.nvgemm.nvfp4_linear_prequant_requant(xq, xs, *rq, torch.bfloat16)
    assert last_fused_selected(REQUANT) == "emu_sm100"
    want = torch.ops.nvgemm.nvfp4_linear_requant(x, *rq, torch.bfloat16)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1].view(torch.uint8), want[1].view(torch.uint8))


@pytest.mark.emulator
def test_gpu_backend_runners_on_emulator(tmp_path, monkeypatch, request):
    """The ``cutedsl_sm100`` fused backends' own GPU entry points (``run_sm100_requant`` /
    ``run_sm100_prequant``: device properties, config, occupancy-resolved compile spec, kernel cache,
    ``launch_sm100``) on CPU tensors, with only the CUDA queries faked (a B200: capability 10.0, 148 SMs, the
    guaranteed cluster count) and the kernel cache's loader replaced by the emulator's: the bytes and the
    output equal the emulated ops'. Data as in the chain test above (exact)."""
    import types

    from nvgemm.emulator.runner import prepare
    from nvgemm.ops.fused import prequant_emulated, requant_emulated
    from nvgemm.templates.common import occupancy
    from nvgemm.templates.sm100_w4a4 import backend as sm100_backend
    from nvgemm.templates.sm100_w4a4.occupancy import aot_max_active_clusters

    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))

    class Stream(int):
        cuda_stream = 0

    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda dev: types.SimpleNamespace(major=10, minor=0, multi_processor_count=148))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: Stream(0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(occupancy, "query_max_active_clusters",
                        lambda dev, cs: aot_max_active_clusters("sm_100a", 148, cs))
    loaded = []
    # the per-problem launch plans are process-wide: start empty (so this test's kernels are the emulator's) and
    # leave none of these emulator kernels behind for later tests
    sm100_backend.launch_plan.cache_clear()
    request.addfinalizer(sm100_backend.launch_plan.cache_clear)
    monkeypatch.setattr(sm100_backend, "kernel_for",
                        lambda cspec, cache=None: loaded.append(cspec) or prepare(cspec, device="B200"))
    gu, down, x = _exact_chain()
    rq = (x, gu.weight, gu.weight_scale, gu.weight_scale_2, gu.input_scale, gu.bias, down.input_scale, torch.bfloat16)
    packed, scales = sm100_backend.run_sm100_requant(*rq)
    want_p, want_s = requant_emulated(*rq)
    assert torch.equal(packed, want_p) and torch.equal(scales.view(torch.uint8), want_s.view(torch.uint8))
    xq, xs = torch.ops.nvgemm.quantize_nvfp4(x, gu.input_scale, True)  # the activation arrives quantized
    p2, s2 = sm100_backend.run_sm100_requant(None, *rq[1:], quantized=(xq, xs))
    assert torch.equal(p2, want_p) and torch.equal(s2.view(torch.uint8), want_s.view(torch.uint8))
    pq = (packed, scales, down.weight, down.weight_scale, down.weight_scale_2, down.input_scale, down.bias, None,
          torch.bfloat16)
    assert torch.equal(sm100_backend.run_sm100_prequant(*pq), prequant_emulated(*pq))
    # two plans: the requant launch (its quantized= call is the same problem, served by the same plan) and prequant
    assert [c.epilogue.out_quant for c in loaded] == [True, False] and all(c.arch == "sm_100a" for c in loaded)
