"""nvgemm's sm_120a / sm_121a NVFP4 W4A4 decode kernel (``mma.sync m16n8k64 .kind::mxf4nvf4
.block_scale``) executed on the PTX emulator through its real AOT artifact (production ``AotKernel``
host path relinked against the fake CUDA runtime), compared with :func:`kernel_view_ref` (both
operands decoded with their block scales, fp32 ``X @ W^T``, nvgemm's epilogue).

Data are exact: random E2M1 codes with power-of-two ue4m3 block scales (2**-2 .. 2**2) on both sides,
alpha, bias and residual powers of two / on a 2**-3 grid: every product and every fp32 partial sum
is exact (|sum| < 2**12 with a quantum of 2**-10 at worst: K <= 1024 terms of |x w| <= 36 * 16 ...
all within 24 bits), so the summation order (the tensor core's, the split-K reduce's, torch's) cannot
change a bit; the only rounding is the final store, done alike on both sides (RNE).

Default cases reach every code path: M > 8 rows and several M tiles, odd M, an N tail (rows past N
zero-filled, never stored), K tails (K % 64 == 32: a half slab with two zero-filled scale bytes;
K % tile_k != 0: a partial last stage), split-K (even and uneven splits, an empty split, every CTA
order, counters back at zero, a second launch), scalar / per-feature alpha, bias, residual, silu,
gelu_tanh, silu_mul (gate/up pairing), bf16 / fp16 / fp32 out, 1-8 warps, 2-4 slabs per stage.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from isa_env import kernel_test_env

kernel_test_env("sm_120a")

from nvgemm.aot.compile_spec import make_spec  # noqa: E402
from nvgemm.core.epilogue import EpilogueSpec  # noqa: E402
from nvgemm.core.formats import to_blocked  # noqa: E402
from nvgemm.emulator.ptx import EmulationError  # noqa: E402
from nvgemm.templates.sm120_w4a4.config import Sm120W4A4Config as C  # noqa: E402
from nvgemm.templates.sm120_w4a4.launch import Sm120Workspace, kernel_view_ref, prepare_sm120_args  # noqa: E402

pytestmark = pytest.mark.emulator

POW2_E4M3 = torch.tensor([0x28, 0x30, 0x38, 0x40, 0x48], dtype=torch.uint8)  # 2**-2 .. 2**2
#: activation (gelu_tanh, silu, silu_mul) outputs: the kernel's tanh / ex2 are ``.approx`` (on hardware
#: and in the emulator's model), torch's are exact; both sides then round to bf16 once. 2**-7 relative
#: (1-2 bf16 ulp; the sm90 emulator check's RANDOM_RTOL) plus 2**-7 absolute for outputs near zero; a
#: wrong fragment, scale or index is off by O(1).
APPROX_RTOL = 2.0**-7


#: e4m3 NaN: written into every padding byte of the 128x4 scale layouts (rows past the matrix, K blocks
#: past K/16). The kernel must never let one reach an MMA: a padding scale times a zero-filled code is NaN.
POISON = 0x7F


def poisoned_blocked(scales: torch.Tensor) -> torch.Tensor:
    """``to_blocked(scales)`` with every padding byte set to :data:`POISON` (instead of zero)."""
    rows, kb = scales.shape
    rp, kp = -(-rows // 128) * 128, -(-kb // 4) * 4
    full = torch.full((rp, kp), POISON, dtype=torch.uint8)
    full[:rows, :kb] = scales.view(torch.uint8)
    return to_blocked(full.view(torch.float8_e4m3fn)).reshape(-1)


def _codes(g, rows, k):
    packed = torch.randint(0, 256, (rows, k // 2), generator=g, dtype=torch.uint8)
    scales = POW2_E4M3[torch.randint(0, 5, (rows, k // 16), generator=g)].view(torch.float8_e4m3fn)
    return packed, poisoned_blocked(scales)


def exact_args(cfg, m, n, k, epi, seed, workspace=None):
    """Arguments of one exact call: the production host path (:func:`prepare_sm120_args`) with the
    activation given already quantized (exact codes, the quantizer's layout)."""
    g = torch.Generator().manual_seed(seed)
    w, ws = _codes(g, n, k)
    xq, xs = _codes(g, m, k)
    n_out = n // 2 if epi.gated else n
    ws2 = torch.tensor(2.0 ** int(torch.randint(-2, 1, (1,), generator=g)))
    if epi.alpha == "vector":
        ws2 = ws2 * torch.pow(2.0, torch.randint(-1, 2, (n,), generator=g).float())
    bias = (torch.randint(-64, 65, (n,), generator=g).float() / 8).to(epi.out_dtype) if epi.bias else None
    res = (torch.randint(-64, 65, (m, n_out), generator=g).float() / 8).to(epi.out_dtype) if epi.residual else None
    return prepare_sm120_args(None, w, ws, ws2, torch.tensor(0.5), bias, res, epi, cfg, quantized=(xq, xs),
                              workspace=workspace or Sm120Workspace(torch.device("cpu")))


def run(cfg, args, *, arch="sm_120a", order="forward", kernel=None):
    from nvgemm.emulator.runner import prepare

    dev = {"sm_120a": "RTX5090", "sm_121a": "GB10"}[arch]
    k = kernel or prepare(make_spec("sm120_nvfp4_gemm", cfg, arch, epilogue=args.spec), device=dev)
    args.out.fill_(float("nan"))
    launch = k.launch(*args.abi_values(), 0, order=order)
    return launch, k


def check(cfg, m, n, k, epi, seed=0, args=None, **kw):
    args = args or exact_args(cfg, m, n, k, epi, seed)
    want = kernel_view_ref(args)
    run(cfg, args, **kw)
    if epi.activation in ("none",):
        diff = (args.out.float() - want.float()).abs()
        assert torch.equal(args.out, want), f"max |diff| {diff.max()} at {divmod(int(diff.argmax()), want.shape[-1])}"
    else:
        assert not args.out.isnan().any()
        torch.testing.assert_close(args.out.float(), want.float(), rtol=APPROX_RTOL, atol=APPROX_RTOL)
    if cfg.split_k > 1:
        assert not args.count.any(), "split-K counters left non-zero: the next launch would misreduce"
    return args


S = EpilogueSpec(alpha="scalar", out_dtype=torch.bfloat16)
FULL = EpilogueSpec(alpha="vector", bias=True, residual=True, out_dtype=torch.float32)

CASES = [
    # M = 1 decode, one CTA of 8 warps x 1 row tile, 4 slabs per stage, PDL
    pytest.param(C(tile_m=8, tile_n=128, tile_k=256, num_warps=8, stages=3, pdl=True), 1, 128, 512, S,
                 id="m1-n128-k512-w8-pdl"),
    # M = 13 over two M tiles of 8, N tail (200 = 12.5 row tiles), K = 544 (K % 64 == 32: a half slab,
    # K % 256: a partial last stage), vector alpha + bias + residual, fp32 out
    pytest.param(C(tile_m=8, tile_n=64, tile_k=256, num_warps=2, stages=4), 13, 200, 544, FULL,
                 id="m13-n200-k544-ktail-full"),
    # split-K 3 over 5 stages of 128 (2 + 2 + 1, uneven), 16 tokens x 2 row tiles, K tail, fp16 out + bias
    pytest.param(C(tile_m=16, tile_n=64, tile_k=128, num_warps=2, stages=3, split_k=3), 11, 128, 608,
                 EpilogueSpec(alpha="scalar", bias=True, out_dtype=torch.float16), id="m11-n128-k608-sk3-uneven"),
    # split-K 4 over 5 stages of 256 (2 + 2 + 1 + 0: an empty split), 32 tokens, vector alpha + residual
    pytest.param(C(tile_m=32, tile_n=32, tile_k=256, num_warps=1, stages=2, split_k=4), 29, 96, 1120,
                 EpilogueSpec(alpha="vector", residual=True, out_dtype=torch.bfloat16), id="m29-n96-k1120-sk4-empty"),
    # gated silu_mul (gate rows [0, N/2), up rows [N/2, N) paired in each warp) with split-K
    pytest.param(C(tile_m=8, tile_n=64, tile_k=128, num_warps=2, stages=3, split_k=2), 5, 192, 384,
                 EpilogueSpec(alpha="vector", bias=True, activation="silu_mul", out_dtype=torch.bfloat16),
                 id="m5-n192-k384-silu_mul-sk2"),
    pytest.param(C(tile_m=16, tile_n=64, tile_k=128, num_warps=4, stages=2), 9, 64, 256,
                 EpilogueSpec(alpha="scalar", activation="gelu_tanh", out_dtype=torch.bfloat16), id="m9-n64-k256-gelu"),
    pytest.param(C(tile_m=8, tile_n=64, tile_k=128, num_warps=4, stages=2), 3, 80, 192,
                 EpilogueSpec(alpha="scalar", bias=True, activation="silu", residual=True, out_dtype=torch.bfloat16),
                 id="m3-n80-k192-silu-res"),
]


@pytest.mark.parametrize("cfg,m,n,k,epi", CASES)
def test_sm120_kernel_on_emulator_matches_reference(cfg, m, n, k, epi, tmp_path, monkeypatch):
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    check(cfg, m, n, k, epi, seed=m * 31 + k)


def test_sm121a_artifact_bit_exact_on_gb10_profile(tmp_path, monkeypatch):
    """The same kernel compiled for sm_121a (DGX Spark GB10) runs bit-exact on the GB10 device profile."""
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    check(C(tile_m=16, tile_n=64, tile_k=128, num_warps=2, stages=3, split_k=2), 10, 96, 416, FULL, seed=7,
          arch="sm_121a")


def test_split_k_every_cta_order_same_bits_and_a_second_launch(tmp_path, monkeypatch):
    """The deterministic reduce: forward, reverse and shuffled CTA orders give identical bits; the counters
    are back at zero after each launch, so a second launch on the same workspace reduces correctly."""
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    cfg = C(tile_m=8, tile_n=64, tile_k=128, num_warps=2, stages=3, split_k=3)
    args = exact_args(cfg, 7, 128, 736, FULL, seed=3)
    outs = []
    for order in ("forward", "reverse", 1234, "forward"):
        check(cfg, 7, 128, 736, FULL, args=args, order=order)
        outs.append(args.out.clone())
    assert all(torch.equal(o, outs[0]) for o in outs)


def test_pdl_prologue_reads_only_the_weights_before_griddepcontrol_wait(tmp_path, monkeypatch):
    """The PDL design: weight and weight-scale copies are issued before ``griddepcontrol.wait`` (a
    predecessor never writes them), activations and every store after it."""
    from _pdl import check_pdl_prologue

    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    cfg = C(tile_m=8, tile_n=64, tile_k=256, num_warps=2, stages=3, split_k=2, pdl=True)
    args = check(cfg, 6, 128, 800, FULL, seed=9)
    launch, _ = run(cfg, args)
    check_pdl_prologue(launch, weights={"mW", "mWS"}, prefetch=False)
    assert launch.ext.get("pdl_pre_wait_reads"), "no weight copy before the wait: the PDL prologue is gone"


def test_production_host_path_with_the_quantizer_matches_the_emulated_op(tmp_path, monkeypatch):
    """End to end on random data: ``prepare_sm120_args`` quantizes bf16 activations with nvgemm's quantizer
    (torch reference on CPU) and derives alpha = weight_scale_2 x input_scale; the kernel's output matches
    the emulated op (``nvfp4_linear_emulated``: the same quantized operands, fp32 mm) to fp32 summation
    order and one bf16 rounding (2**-7 relative, the emulator check's RANDOM_RTOL)."""
    from nvgemm.core.formats import quantize_weight
    from nvgemm.emulator.check import RANDOM_RTOL, rel_err
    from nvgemm.ops.linear import nvfp4_linear_emulated

    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    g = torch.Generator().manual_seed(17)
    n, k, m = 192, 736, 12
    q = quantize_weight(torch.randn(n, k, generator=g))
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    ins = (x.float().abs().amax() / 2688).reshape(())
    bias = torch.randn(n, generator=g).to(torch.bfloat16)
    ws2 = q.global_scale.reshape(())
    cfg = C(tile_m=16, tile_n=64, tile_k=256, num_warps=2, stages=3, split_k=2)
    epi = EpilogueSpec(alpha="scalar", bias=True, out_dtype=torch.bfloat16)
    args = prepare_sm120_args(x, q.packed, to_blocked(q.scale), ws2, ins, bias, None, epi, cfg,
                              workspace=Sm120Workspace(torch.device("cpu")))
    run(cfg, args)
    want = nvfp4_linear_emulated(x, q.packed, to_blocked(q.scale), ws2, ins, bias, None, "none", None)
    assert rel_err(args.out, want) < RANDOM_RTOL


# ------------------------------------------------------------------------------------------ mutations


def _mutate(kernel, pattern: str, repl, count_min: int = 1):
    new, n = re.subn(pattern, repl, kernel.ptx)
    assert n >= count_min, f"mutation pattern {pattern!r} matched {n} times"
    return dataclasses.replace(kernel, ptx=new, records=[])


def test_mutations_of_the_real_ptx_fail_the_comparison(tmp_path, monkeypatch):
    """Mutations of the kernel's PTX, each a plausible bug, make the exact comparison fail: (1) the A
    fragment's K halves swapped (registers 0/1 <-> 2/3: a shifted fragment offset), (2) the scale
    copies' K-tail predicate dropped (every scale word copies 4 bytes: the poisoned padding past K/16
    reaches the MMA, or the slabs wholly past K read past the scale tensor)."""
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    cfg = C(tile_m=8, tile_n=64, tile_k=256, num_warps=2, stages=4)
    args = exact_args(cfg, 9, 112, 544, S, seed=5)
    want = kernel_view_ref(args)
    _, good = run(cfg, args)
    assert torch.equal(args.out, want)
    swapped = _mutate(good, r"(mma\.sync\.aligned\.kind::mxf4nvf4[^{]*)\{(%r\d+), (%r\d+), (%r\d+), (%r\d+)\}",
                      r"\1{\4, \5, \2, \3}", 8)
    run(cfg, args, kernel=swapped)
    assert not torch.equal(args.out, want)
    ktail = _mutate(good, r"(cp\.async\.ca\.shared\.global \[%r\d+\], \[%rd\d+\], 4), %r\d+;", r"\1;", 2)
    try:
        run(cfg, args, kernel=ktail)
        failed = args.out.float().isnan().any()  # a poisoned padding scale reached an MMA
    except EmulationError as e:  # the slabs wholly past K read past the end of the scale tensor
        failed = "out-of-bounds global access" in str(e)
    assert failed, "the K-tail scale predicate is not what keeps padding scales out"
    run(cfg, args)  # the unmutated kernel still passes (its PTX is re-registered per launch)
    assert torch.equal(args.out, want)


# ------------------------------------------------------------------------------------------ policy picks


def _policy_picks():
    from nvgemm.cli import sass_tool
    from nvgemm.templates.sm120_w4a4.policy import pick_config

    picks = {}
    for arch in ("sm_120a", "sm_121a"):
        for n, k in sass_tool.LLAMA_SHAPES:
            for m in (1, 2, 4, 8, 16, 32, 64):
                for act in ("none", "silu_mul"):
                    picks.setdefault((pick_config(m, n, k, act, arch), act, arch), m)
    return sorted(picks.items(), key=lambda kv: (kv[0][2], kv[0][0].name(), kv[0][1]))


@pytest.mark.emulator_full
@pytest.mark.parametrize("pick", _policy_picks(), ids=lambda p: f"{p[0][0].name()}-{p[0][1]}-{p[0][2]}")
def test_every_policy_pick_bit_exact_scaled_down(pick, tmp_path, monkeypatch):
    """Every config the policy picks for the Llama shapes (M = 1..64, both activations, both arches), on a
    problem scaled down to two CTAs of rows (a tail in the second) and enough K for every split plus a K tail."""
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    (cfg, act, arch), m = pick
    n = 2 * cfg.tile_n if act == "silu_mul" else 2 * cfg.tile_n - 16
    k = max(2, cfg.split_k) * cfg.tile_k + 32
    mm = min(m, 2 * cfg.tile_m - 1)
    epi = EpilogueSpec(alpha="vector", bias=True, activation=act, out_dtype=torch.bfloat16)
    check(cfg, mm, n, k, epi, seed=mm + k, arch=arch)


# ------------------------------------------------------------------------------------------ backend


def _exact_w4a4_operands(m, n, k, seed):
    """:func:`exact_operands` plus activations the quantizer encodes exactly: each 16-element block is E2M1
    values x ``2**e`` (e in [-2, 2]) x ``input_scale`` with one element at +-6 (the block amax, so the block
    scale is exactly ``2**e``), ``input_scale`` = 2**-1: the kernel and the emulated op quantize to the same
    codes and every product and fp32 sum is exact, so only the final bf16 rounding is left (same on both)."""
    from nvgemm.core.formats import E2M1_VALUES
    from nvgemm.emulator.check import exact_operands

    ops = exact_operands(m, n, k, alpha="vector", bias=True, residual=True, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    vals = E2M1_VALUES[torch.randint(0, 16, (m, k // 16, 16), generator=g)]
    vals[:, :, 0] = torch.where(torch.rand(m, k // 16, generator=g) < 0.5, 6.0, -6.0)
    exp = torch.pow(2.0, torch.randint(-2, 3, (m, k // 16, 1), generator=g).float())
    ops.input_scale = torch.tensor(0.5)
    ops.x = (vals * exp * 0.5).reshape(m, k).to(torch.bfloat16)
    ops.bias = ops.bias.to(torch.bfloat16)
    return ops


def test_emu_sm120_backend_bit_exact_with_the_emulated_op(tmp_path, monkeypatch):
    """``NVGEMM_BACKEND=emu_sm120``: ``nvgemm::nvfp4_linear`` runs the sm_120a W4A4 kernel (the policy's pick
    for the RTX 5090 profile, the ``cutedsl_sm120`` host path with the activation quantizer) on the emulator,
    equal bit for bit to the emulated op on exact data (M = 5 rows, K = 288: a half slab, vector alpha, bias,
    residual); unforced, the CPU op never picks it. The activation quantizer runs from its sm_120a Triton PTX
    (the emulator's Triton stand-in follows the forced backend's arch)."""
    import nvgemm.ops.linear  # noqa: F401
    from nvgemm.dispatch.registry import last_selected
    from nvgemm.emulator.check import reference
    from nvgemm.emulator.triton_ptx import LAUNCHES

    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    ops = _exact_w4a4_operands(5, 192, 288, seed=41)
    want = reference(ops)
    assert last_selected() != "emu_sm120"
    monkeypatch.setenv("NVGEMM_BACKEND", "emu_sm120")
    before = len(LAUNCHES)
    got = torch.ops.nvgemm.nvfp4_linear(*ops.args())
    assert last_selected() == "emu_sm120"
    assert [(r.kernel, r.arch) for r in LAUNCHES[before:]] == [("quantize_nvfp4_kernel", "sm_120a")]
    assert torch.equal(got, want), f"max |diff| {(got.float() - want.float()).abs().max()}"


def test_emu_sm120_w4a16_runs_the_mma_kernel_compiled_for_sm_120a(tmp_path, monkeypatch):
    """A W4A16 call (no ``input_scale``) on ``emu_sm120`` runs what an sm_120 GPU runs for it: the W4A16
    ``mma`` kernel (``cutedsl_mma_w4a16``) compiled for sm_120a, on the RTX 5090 profile; exact operands
    (:func:`exact_operands`: 13 rows over two M tiles, a K tail past the 128-wide stage), equal bit for bit
    to the emulated op."""
    import nvgemm.ops.linear  # noqa: F401
    from nvgemm.dispatch.registry import last_selected
    from nvgemm.emulator import runner
    from nvgemm.emulator.check import exact_operands, reference

    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    ops = exact_operands(13, 128, 416, alpha="vector", bias=True, seed=5)
    want = reference(ops)
    archs = []
    real_prepare = runner.prepare
    monkeypatch.setattr("nvgemm.emulator.backend.prepare",
                        lambda spec, **kw: archs.append((spec.template_id, spec.arch, kw)) or real_prepare(spec, **kw))
    monkeypatch.setenv("NVGEMM_BACKEND", "emu_sm120")
    got = torch.ops.nvgemm.nvfp4_linear(*ops.args())
    assert last_selected() == "emu_sm120"
    assert [(a, kw) for _t, a, kw in archs] == [("sm_120a", {"device": "RTX5090"})]
    assert "sm120" not in archs[0][0]  # the W4A16 mma template, not the W4A4 one
    assert torch.equal(got, want), f"max |diff| {(got.float() - want.float()).abs().max()}"


@pytest.mark.parametrize("case,match", [
    ("k48", r"NVGEMM_BACKEND=emu_sm120 cannot run .*K=48 is not a multiple of 32"),
    ("w4a16-k48", r"NVGEMM_BACKEND=emu_sm120 cannot run .*K=48 is not a multiple of 32"),
])
def test_emu_sm120_refuses_what_the_kernels_cannot_run(case, match, monkeypatch):
    """Forced, ``emu_sm120`` refuses a K that is not a multiple of 32 (W4A4 and W4A16) with an error naming
    the reason, before anything is compiled or launched."""
    import nvgemm.ops.linear  # noqa: F401

    ops = _exact_w4a4_operands(2, 64, 48, seed=3)
    if case.startswith("w4a16"):
        ops.input_scale = None
    monkeypatch.setenv("NVGEMM_BACKEND", "emu_sm120")
    with pytest.raises(RuntimeError, match=match):
        torch.ops.nvgemm.nvfp4_linear(*ops.args())


# ------------------------------------------------------------------------------------------ fused requant


@pytest.mark.parametrize("m,i,k,cfg", [
    pytest.param(7, 64, 512, C(tile_m=8, tile_n=64, tile_k=256, num_warps=2, stages=3), id="m7-i64-k512"),
    # split-K (the last split reduces, then requantizes), I = 80 (K blocks of the scales padded 5 -> 8),
    # 13 tokens over two M tiles, a K tail
    pytest.param(13, 80, 544, C(tile_m=8, tile_n=64, tile_k=256, num_warps=2, stages=3, split_k=2),
                 id="m13-i80-k544-sk2"),
    # 40 tokens: scale bytes in the 32-row group 1 of the 128x4 swizzle; vector alpha
    pytest.param(40, 32, 256, C(tile_m=32, tile_n=64, tile_k=128, num_warps=2, stages=2), id="m40-i32-k256"),
])
def test_fused_requant_bytes_equal_quantize_nvfp4_of_the_swiglu_output(m, i, k, cfg, tmp_path, monkeypatch):
    """The fused SwiGLU + NVFP4 requant epilogue (``EpilogueSpec(out_quant=True)``): the packed codes and the
    swizzled e4m3 scales equal, byte for byte, ``quantize_nvfp4`` of the rounded SwiGLU output computed in torch
    from the same exact operands (and the lane model of :mod:`nvgemm.epilogues.requant`). Gate rows get a bias
    of +-4096, so every gate lies where ``silu(g) == g`` (or -0) exactly in fp32 whichever way exp is computed;
    ``h = g * up`` is one fp32 product, then one bf16 rounding; gs is chosen so some blocks saturate the e4m3
    scale. The codes are allocated uninitialised (garbage-filled here): the kernel writes every byte."""
    import nvgemm.ops.linear  # noqa: F401 -- registers torch.ops.nvgemm (the quantizer)
    from nvgemm.core.formats import dequantize, from_blocked
    from nvgemm.epilogues.requant import fused_requant_reference
    from nvgemm.templates.sm120_w4a4.launch import prepare_sm120_requant_args

    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    g = torch.Generator().manual_seed(m + i + k)
    w_packed = torch.randint(0, 256, (2 * i, k // 2), generator=g, dtype=torch.uint8)
    w_lin = POW2_E4M3[torch.randint(0, 5, (2 * i, k // 16), generator=g)].view(torch.float8_e4m3fn)
    x_packed = torch.randint(0, 256, (m, k // 2), generator=g, dtype=torch.uint8)
    x_lin = POW2_E4M3[torch.randint(0, 5, (m, k // 16), generator=g)].view(torch.float8_e4m3fn)
    gate_bias = torch.where(torch.arange(i) % 3 == 2, -4096.0, 4096.0)
    bias = torch.cat([gate_bias, torch.zeros(i)]).to(torch.bfloat16)
    alpha_kind = "vector" if m == 40 else "scalar"
    ws2 = torch.tensor(1.0) if alpha_kind == "scalar" else torch.ones(2 * i)
    acc = dequantize(x_packed, x_lin) @ dequantize(w_packed, w_lin).t()  # [m, 2I], exact
    pre = acc + bias.float()
    h = (pre[:, :i] * torch.sigmoid(pre[:, :i]) * pre[:, i:]).to(torch.bfloat16)
    gs = (h.float().abs().amax() / 2688 * 0.25).reshape(()).float()
    ref_p, ref_s = torch.ops.nvgemm.quantize_nvfp4(h, gs, True)
    model_p, model_s = fused_requant_reference(pre, gs, torch.bfloat16)
    assert torch.equal(model_p, ref_p) and torch.equal(model_s.view(torch.uint8), ref_s.view(torch.uint8))
    assert (from_blocked(ref_s, m, i // 16).float() == 448).any()

    epi = EpilogueSpec(alpha=alpha_kind, bias=True, activation="silu_mul", out_quant=True)
    args = prepare_sm120_requant_args(None, w_packed, poisoned_blocked(w_lin), ws2, torch.tensor(1.0), bias, gs,
                                      epi, cfg, quantized=(x_packed, poisoned_blocked(x_lin)),
                                      workspace=Sm120Workspace(torch.device("cpu")))
    from nvgemm.emulator.runner import prepare

    kernel = prepare(make_spec("sm120_nvfp4_gemm", cfg, "sm_120a", epilogue=epi), device="RTX5090")
    for launch_no in range(2):  # a second launch on the same split-K counters, onto garbage codes
        args.out.fill_(0xA5)
        kernel.launch(*args.abi_values(), 0)
        assert torch.equal(args.out, ref_p), launch_no
        assert torch.equal(args.residual, ref_s.view(torch.uint8).reshape(-1)), launch_no
        assert not args.count.any()
