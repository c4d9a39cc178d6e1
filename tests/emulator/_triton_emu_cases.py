"""Every Triton kernel nvgemm ships, run from its real sm_90a / sm_100a / sm_120a PTX on the PTX emulator, with the
reference each is compared against (shared by ``test_triton_kernels_emu.py`` and
``bench/triton_emulator_sweep.py``).

Each case calls the production host function with ``kernel=EmuTritonKernel(<the module's kernel>, arch)``:
the host code picks the GPU config (``is_interpreted`` is False for the stand-in), PDL is compiled in on
both archs (``use_gdc`` sees the stand-in's capability), and Triton's own binder, compiler and launcher
packing produce the launch (:mod:`nvgemm.emulator.triton_ptx`).

TOLERANCES (the only non-bit-exact comparisons, and why):

* ``silu_mul`` quantizer, GEMM / MoE ``silu`` epilogues: ``tl.exp`` compiles to ``ex2.approx.f32``, whose
  bits the PTX ISA does not define (it bounds the relative error, 2**-22 over the full range). The emulator
  computes ``ex2.approx`` as the correctly rounded 2**x; the *kernel formula* reference below evaluates the
  same formula with the same exp2 model in fp32, op by op, and must match **bit for bit** (it checks every
  other instruction of the kernel). Against the torch reference (``torch.exp``) the pre-quantization
  value may differ by 1 ulp of x's dtype (:data:`Y_ULPS`), and the codes and scales must be **byte-identical**
  to quantizing the kernel's own value.
* The W4A16 GEMM's ``silu`` / ``silu_mul`` / ``gelu_tanh`` epilogues: bit for bit against the kernel formula
  (:func:`epilogue_formula`, same exp2 model) on top of the exact ``acc * alpha + bias``; against torch within
  ``Y_ULPS + 1`` ulps (silu), and for ``gelu_tanh`` (whose ``tanh = 1 - 2 / (exp(2x) + 1)`` has an unbounded
  *relative* error near 0) within ``2**-6`` relative plus ``2**-14 * max|pre-activation|`` absolute. The Triton
  MoE with ``silu_mul`` (GEMM1's activation feeds GEMM2 through a requantization): within ``Y_ULPS + 1`` ulps.
* RMSNorm: the torch reference uses ``rsqrt``; the kernel ``1 / sqrt_rn``. The kernel formula reference
  (``div.rn`` / ``sqrt.rn`` in fp32, exact sums on the chosen data) matches bit for bit; the HF reference
  within :data:`Y_ULPS`.

Everything else is bit-exact against an independent torch reference: the quantizers (integer RNE and
``div.rn`` only), the RoPE + KV-cache write (fp32 mul / add without contraction, integer RNE to bf16), the GEMMs on exact data (every fp32 sum exact in any order), the MoE prep / finalize
(integers; fp32 sums in slot order without contraction).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from nvgemm.core.formats import dequantize, quantize_activation, quantize_weight, to_blocked
from nvgemm.emulator.triton_ptx import EmuTritonKernel
from nvgemm.templates.triton import reference as ref

Y_ULPS = 1  # pre-quantization value vs the torch reference (ex2.approx / rsqrt vs 1/sqrt), in x-dtype ulps
#: the archs of the default subset (every default case on each)
ARCHS = ("sm_90a", "sm_100a")
#: every arch whose PTX the sweep runs (``bench/triton_emulator_sweep.py --archs``): sm_120a is what an RTX 50xx /
#: RTX PRO Blackwell GPU runs (``mma.sync``, no ``wgmma`` / ``tcgen05``)
SWEEP_ARCHS = ("sm_90a", "sm_100a", "sm_120a")


def _eq(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    a8 = a.contiguous().view(torch.uint8)
    b8 = b.contiguous().view(torch.uint8)
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    if not torch.equal(a8, b8):
        bad = int((a8 != b8).sum())
        raise AssertionError(f"{what}: {bad} of {a8.numel()} bytes differ")


def _ulps(y: torch.Tensor, want: torch.Tensor, dtype) -> int:
    """Largest distance in ``dtype`` ulps between two fp32 tensors whose values are in ``dtype``."""
    a = y.to(dtype).view(torch.int16).int()
    b = want.to(dtype).view(torch.int16).int()
    a = torch.where(a < 0, -(a & 0x7FFF), a)  # sign-magnitude -> ordered ints
    b = torch.where(b < 0, -(b & 0x7FFF), b)
    return int((a - b).abs().max()) if a.numel() else 0


def _f32(v) -> np.ndarray:
    return np.asarray(v, dtype=np.float32)


def _exp_model(x: np.ndarray) -> np.ndarray:
    """Triton's ``tl.exp(x)`` on sm_90a / sm_100a: ``ex2.approx.f32(x * log2(e))`` (``mul.f32`` then ``ex2``;
    checked in the PTX by the tests), ``ex2`` as the emulator models it: 2**t correctly rounded to fp32."""
    t = _f32(_f32(x) * _f32(1.4426950408889634))
    with np.errstate(over="ignore"):
        return _f32(np.exp2(t.astype(np.float64)))


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    name: str  # kernel name (the sweep's row)
    module: str  # the source file
    kernels: tuple  # the @triton.jit kernels the case launches
    run: Callable[[str], None]  # run(arch): launches through the host function and asserts
    shape: str


def _cfg(config) -> str:
    return "-cfg" + ".".join(map(str, config)) if config else ""


def _emu(kernel, arch):
    return EmuTritonKernel(kernel, arch)


def _adversarial(dtype):
    """The interpreter tests' 16-blocks that hit every e2m1 / e4m3 rounding rule (exact ties at each e2m1
    boundary, one ulp either side, saturation, e4m3-subnormal scales): [12, 64] and gs = 2**-4."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu" / "triton_interp"))
    from nvfp4_cases import adversarial  # noqa: E402  (tests' NVFP4 rounding cases)

    x, gs = adversarial(dtype)
    return x, gs.float()


def quantize_case(m=5, k=128, dtype=torch.bfloat16, swizzle=True, config=None, seed=0, adversarial=False):
    from nvgemm.templates.triton.quantize import quantize_nvfp4_kernel, quantize_nvfp4_triton

    def run(arch):
        g = torch.Generator().manual_seed(seed)
        if adversarial:
            x, gs = _adversarial(dtype)
        else:
            x = (torch.randn(m, k, generator=g) * 3).to(dtype)
            x[0, :16] = 0  # an all-zero block -> sf 0, codes 0
            gs = torch.tensor(0.02)
        q, s = quantize_nvfp4_triton(x, gs, swizzle, config=config, kernel=_emu(quantize_nvfp4_kernel, arch))
        rq, rs = ref.quantize_ref(x, gs, swizzle)
        _eq(q, rq, "codes")
        _eq(s, rs, "scales")

    shape = "adversarial-m12-k64" if adversarial else f"m{m}-k{k}"
    return Case("quantize_nvfp4_kernel", "triton/quantize.py", (quantize_nvfp4_kernel,), run,
                f"{shape}-{str(dtype)[6:]}{'' if swizzle else '-linear'}{_cfg(config)}")


def qdq_case(m=5, k=128, dtype=torch.bfloat16, seed=1, adversarial=False):
    from nvgemm.templates.triton.quantize import qdq_nvfp4_kernel, qdq_nvfp4_triton

    def run(arch):
        g = torch.Generator().manual_seed(seed)
        if adversarial:
            x, gs = _adversarial(dtype)
        else:
            x = (torch.randn(m, k, generator=g) * 3).to(dtype)
            gs = torch.tensor(0.013)
        y = qdq_nvfp4_triton(x, gs, kernel=_emu(qdq_nvfp4_kernel, arch))
        q, s = quantize_activation(x, gs)
        _eq(y, dequantize(q, s).to(dtype), "qdq values")

    return Case("qdq_nvfp4_kernel", "triton/quantize.py", (qdq_nvfp4_kernel,), run,
                f"{'adversarial-m12-k64' if adversarial else f'm{m}-k{k}'}-{str(dtype)[6:]}")


def _exact_rows(g, m, k, dtype):
    """Activations on a 1/4 grid in [-4, 4]: squares and their sums are exact in fp32 in any order."""
    return (torch.randint(-16, 17, (m, k), generator=g).float() * 0.25).to(dtype)


def _rmsnorm_formula(h: torch.Tensor, w: torch.Tensor, k: int, eps: float, dtype, round_y: bool) -> torch.Tensor:
    """The kernel's RMSNorm in fp32, op by op: rstd = 1 / sqrt_rn(sum(h*h) / K + eps) (the sum is exact on
    :func:`_exact_rows` data), y = dtype(h * rstd) * w, rounded to dtype when w has x's dtype."""
    hf = h.float()
    s = (hf * hf).sum(-1, keepdim=True)  # exact
    rstd = 1.0 / torch.sqrt(s / float(k) + torch.tensor(eps, dtype=torch.float32))
    y = (hf * rstd).to(dtype).float() * w.float()
    return y.to(dtype).float() if round_y else y


def rmsnorm_case(m=3, k=128, dtype=torch.bfloat16, residual=True, config=None, seed=2, eps=1e-6):
    from nvgemm.templates.triton.fused import (add_rmsnorm_quantize_nvfp4_triton, rmsnorm_quantize_kernel,
                                               rmsnorm_quantize_nvfp4_triton)

    def run(arch):
        g = torch.Generator().manual_seed(seed)
        x = _exact_rows(g, m, k, dtype)
        res = _exact_rows(g, m, k, dtype) if residual else None
        w = (torch.randint(1, 9, (k,), generator=g).float() * 0.125).to(dtype)
        gs = torch.tensor(2.0 ** -6)
        kern = _emu(rmsnorm_quantize_kernel, arch)
        if residual:
            q, s, r, y = add_rmsnorm_quantize_nvfp4_triton(x, res, w, gs, eps, True, config=config, kernel=kern,
                                                           return_y=True)
            h = (x.float() + res.float()).to(dtype)
            _eq(r, h, "new residual")
            y_hf, _ = ref.add_rmsnorm_ref(x, res, w, eps)
        else:
            q, s, y = rmsnorm_quantize_nvfp4_triton(x, w, gs, eps, True, config=config, kernel=kern, return_y=True)
            h = x
            y_hf = ref.rmsnorm_ref(x, w, eps)
        _eq(y, _rmsnorm_formula(h, w, k, eps, dtype, True), "y vs the kernel formula")
        assert _ulps(y, y_hf.float(), dtype) <= Y_ULPS, "y vs the Hugging Face RMSNorm"
        rq, rs = ref.quantize_ref(y, gs, True)
        _eq(q, rq, "codes")
        _eq(s, rs, "scales")

    name = "add_rmsnorm" if residual else "rmsnorm"
    return Case("rmsnorm_quantize_kernel", "triton/fused.py", (rmsnorm_quantize_kernel,), run,
                f"{name}-m{m}-k{k}-{str(dtype)[6:]}{'-cfg' + '.'.join(map(str, config)) if config else ''}")


def silu_mul_formula(x: torch.Tensor, dtype) -> torch.Tensor:
    """The kernel's ``dtype(div_rn(g, 1 + exp(-g)) * u)`` in fp32 with :func:`_exp_model`."""
    i = x.shape[1] // 2
    g = _f32(x[:, :i].float().numpy())
    u = _f32(x[:, i:].float().numpy())
    d = _f32(_f32(1.0) + _exp_model(-g))
    with np.errstate(all="ignore"):
        y = _f32(_f32(g / d) * u)
    return torch.from_numpy(y).to(dtype).float()


def silu_mul_case(m=3, i=64, dtype=torch.bfloat16, config=None, seed=3):
    from nvgemm.templates.triton.fused import silu_mul_quantize_kernel, silu_mul_quantize_nvfp4_triton

    def run(arch):
        g = torch.Generator().manual_seed(seed)
        x = (torch.randn(m, 2 * i, generator=g) * 3).to(dtype)
        x[0, :8] = torch.tensor([-100.0, -30.0, -10.0, 0.0, -0.0, 10.0, 30.0, 80.0]).to(dtype)  # exp tails
        gs = torch.tensor(0.01)
        q, s, y = silu_mul_quantize_nvfp4_triton(x, gs, True, config=config,
                                                 kernel=_emu(silu_mul_quantize_kernel, arch), return_y=True)
        _eq(y, silu_mul_formula(x, dtype), "y vs the kernel formula (ex2.approx as correctly rounded 2**x)")
        assert _ulps(y, ref.silu_mul_ref(x).float(), dtype) <= Y_ULPS, "y vs torch silu"
        rq, rs = ref.quantize_ref(y, gs, True)
        _eq(q, rq, "codes")
        _eq(s, rs, "scales")

    return Case("silu_mul_quantize_kernel", "triton/fused.py", (silu_mul_quantize_kernel,), run,
                f"m{m}-i{i}-{str(dtype)[6:]}{'-cfg' + '.'.join(map(str, config)) if config else ''}")


def rope_case(t=2, hq=8, hkv=2, d=64, s_len=16, dtype=torch.bfloat16, table_dtype=torch.float32, seed=9):
    """The fused RoPE + KV-cache write: q, the written k / v slots and every other slot, bit for bit against the
    torch fp32 reference (no FMA in the kernel: ``enable_fp_fusion=False``)."""
    from nvgemm.templates.triton.rope import rope_kv_write_kernel, rope_kv_write_triton

    def run(arch):
        g = torch.Generator().manual_seed(seed)
        qkv = (torch.randn(t, (hq + 2 * hkv) * d, generator=g) * 2).to(dtype)
        ang = torch.arange(s_len, dtype=torch.float64)[:, None] * 10000.0 ** (
            -torch.arange(0, d, 2, dtype=torch.float64) / d)
        ang = torch.cat((ang, ang), -1)
        cos, sin = ang.cos().to(table_dtype), ang.sin().to(table_dtype)
        pos = torch.randperm(s_len, generator=g)[:t]
        kc = torch.randn(1, hkv, s_len, d, generator=g).to(dtype)
        vc = torch.randn(1, hkv, s_len, d, generator=g).to(dtype)
        rk, rv = kc.clone(), vc.clone()
        q = rope_kv_write_triton(qkv, cos, sin, pos, kc, vc, hq, hkv, kernel=_emu(rope_kv_write_kernel, arch))
        rq = ref.rope_kv_write_ref(qkv, cos, sin, pos, rk, rv, hq, hkv)
        _eq(q, rq, "roped q")
        _eq(kc, rk, "k cache")
        _eq(vc, rv, "v cache")

    return Case("rope_kv_write_kernel", "triton/rope.py", (rope_kv_write_kernel,), run,
                f"t{t}-hq{hq}-hkv{hkv}-d{d}-{str(dtype)[6:]}-cos{str(table_dtype)[6:]}")


def _exact_weight(g, n, k):
    w = torch.randint(-6, 7, (n, k), generator=g).float() * 0.5
    return quantize_weight(w, torch.tensor(2.0 ** -8))


def epilogue_formula(pre: torch.Tensor, activation: str, n_out: int, residual, out_dtype) -> torch.Tensor:
    """The W4A16 kernel's epilogue after ``acc * alpha + bias`` (``pre``, fp32 [M, N]), op by op in fp32 with
    :func:`_exp_model`: ``silu(y) = y * div_rn(1, 1 + exp(-y))``; ``gelu_tanh(y) = (0.5 * y) * (1 + t)``,
    ``t = 1 - div_rn(2, exp(2 * inner) + 1)``, ``inner = c * (y + 0.044715 * ((y * y) * y))``; ``silu_mul``:
    ``silu(gate) * up``; then + residual and one rounding."""
    y = _f32(pre.numpy())
    with np.errstate(all="ignore"):
        def silu(v):
            return _f32(v * _f32(_f32(1.0) / _f32(_f32(1.0) + _exp_model(-v))))

        if activation == "silu":
            y = silu(y)
        elif activation == "silu_mul":
            y = _f32(silu(y[:, :n_out]) * y[:, n_out:2 * n_out])
        elif activation == "gelu_tanh":
            inner = _f32(_f32(0.7978845608028654) * _f32(y + _f32(_f32(0.044715) * _f32(_f32(y * y) * y))))
            t = _f32(_f32(1.0) - _f32(_f32(2.0) / _f32(_exp_model(_f32(_f32(2.0) * inner)) + _f32(1.0))))
            y = _f32(_f32(_f32(0.5) * y) * _f32(_f32(1.0) + t))
        else:
            raise ValueError(activation)
    out = torch.from_numpy(np.ascontiguousarray(y))
    if residual is not None:
        out = out + residual.float()
    return out.to(out_dtype)


def gemm_case(m=5, n=64, k=128, activation="none", w4a4=True, bias=True, residual=True, dtype=torch.bfloat16,
              out_dtype=None, config=None, seed=4):
    from nvgemm.ops.linear import nvfp4_linear_emulated
    from nvgemm.templates.triton.gemm_w4a16 import nvfp4_linear_triton, w4a16_gemm_kernel

    def run(arch):
        g = torch.Generator().manual_seed(seed)
        n_out = n // 2 if activation == "silu_mul" else n
        qw = _exact_weight(g, n, k)
        x = (torch.randint(-8, 9, (m, k), generator=g).float() * 0.25).to(dtype)
        ins = torch.tensor(2.0 ** -9) if w4a4 else None
        b = (torch.randint(-4, 5, (n,), generator=g).float() * 0.5).to(dtype) if bias else None
        odt = out_dtype or dtype
        r = (torch.randint(-4, 5, (m, n_out), generator=g).float() * 0.5).to(odt) if residual else None
        args = (x, qw.packed, to_blocked(qw.scale), qw.global_scale.reshape(()),
                ins, b, r, activation, out_dtype)
        got = nvfp4_linear_triton(*args, config=config, kernel=_emu(w4a16_gemm_kernel, arch))
        want = nvfp4_linear_emulated(*args)
        if activation in ("none",):
            _eq(got, want, "GEMM output")
        else:  # exp in the epilogue: see TOLERANCES
            pre = nvfp4_linear_emulated(x, *args[1:5], b, None, "none", torch.float32)  # acc * alpha + bias (exact acc)
            _eq(got, epilogue_formula(pre, activation, n_out, r, odt), f"{activation} epilogue vs the kernel formula")
            if activation != "gelu_tanh":  # tanh(~0) through 1 - 2 / (e + 1): relative error unbounded near 0
                assert _ulps(got.float(), want.float(), odt) <= Y_ULPS + 1, f"{activation} epilogue vs torch"
            else:
                err = (got.float() - want.float()).abs()
                assert bool((err <= want.float().abs() * 2.0 ** -6 + 2.0 ** -14 * float(pre.abs().max())).all())

    tag = f"m{m}-n{n}-k{k}-{activation}-{'w4a4' if w4a4 else 'w4a16'}{'-bias' if bias else ''}" \
          f"{'-res' if residual else ''}-{str(dtype)[6:]}{'-cfg' + '.'.join(map(str, config)) if config else ''}"
    return Case("w4a16_gemm_kernel", "triton/gemm_w4a16.py", (w4a16_gemm_kernel,), run, tag)


def moe_case(e=4, h=64, i=32, m=6, topk=2, activation="relu2", w4a4=True, config=None, seed=5):
    """The Triton grouped MoE (GEMM1, GEMM2 and finalize kernels) vs the emulated op on exact data."""
    import sys
    from pathlib import Path

    from nvgemm.ops.moe import nvfp4_moe_emulated
    from nvgemm.templates.triton.moe import moe_finalize_kernel, moe_gemm1_kernel, moe_gemm2_kernel, nvfp4_moe_triton

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu" / "triton_interp"))
    from moe_cases import make_moe  # noqa: E402  (tests' MoE weights builder)

    def run(arch):
        w = make_moe(e, h, i, gated=activation == "silu_mul", w4a4=w4a4, exact=True, seed=seed)
        g = torch.Generator().manual_seed(seed + 1)
        x = (torch.randint(-4, 5, (m, h), generator=g).float() * 0.25).bfloat16()
        ids = torch.stack([torch.randperm(e, generator=g)[:topk] for _ in range(m)]).to(torch.int32)
        ids[1, -1] = -1  # a slot routed nowhere
        wts = torch.tensor([0.5, 0.25, 0.125, 0.0625][:topk]).repeat(m, 1)
        args = (x, ids, wts, w["w13"], w["w13_scale"], w["w13_scale_2"], w["w13_input_scale"], w["w2"], w["w2_scale"],
                w["w2_scale_2"], w["w2_input_scale"], activation, False, None, None, None, None)
        kernels = tuple(_emu(k, arch) for k in (moe_gemm1_kernel, moe_gemm2_kernel, moe_finalize_kernel))
        got = nvfp4_moe_triton(*args, config=config, kernels=kernels)
        want = nvfp4_moe_emulated(*args)
        if activation == "relu2":
            _eq(got, want, "MoE output")
        else:
            assert _ulps(got.float(), want.float(), torch.bfloat16) <= Y_ULPS + 1, f"{activation} MoE"

    return Case("moe_gemm1+gemm2+finalize", "triton/moe.py", (moe_gemm1_kernel, moe_gemm2_kernel,
                                                                moe_finalize_kernel), run,
                f"e{e}-h{h}-i{i}-m{m}-top{topk}-{activation}-{'w4a4' if w4a4 else 'w4a16'}"
                f"{'-cfg' + '.'.join(map(str, config)) if config else ''}")


def _w13_stack(g, e, i, h):
    """GEMM1's stacked A operand (:func:`~nvgemm.templates.sm100_moe.launch.prepare_moe_stack`) of ``e`` experts
    whose scale bytes name their expert: every scale of expert ``x`` is the e4m3 bit pattern ``0x30 + x``."""
    from nvgemm.templates.sm100_moe.launch import prepare_moe_stack

    w = torch.randint(0, 256, (e, 2 * i, h // 2), generator=g, dtype=torch.uint8)
    sc = torch.stack([to_blocked(torch.full((2 * i, h // 16), 0x30 + x, dtype=torch.uint8).view(torch.float8_e4m3fn))
                      for x in range(e)])
    return prepare_moe_stack(w, sc, True)


def check_w13_prefetch(launch, ids, emap, stack, h: int) -> None:
    """The prep's L2 prefetches (``Launch.ext["l2_prefetch_lines"]``, ``stats["l2_prefetches"]``) are exactly the
    128-byte lines of GEMM1's weight rows and scales of the experts ``ids`` select, each once, nothing else.

    Reference, independent of the kernel: the local experts from the ids (``-1`` and ids ``emap`` maps to ``-1``
    select nothing); expert ``x``'s weight bytes are rows ``[x * rows_p, (x + 1) * rows_p)`` of the row-major
    ``[E * rows_p, H/2]`` stack; its scale bytes are where the 128x4 swizzle of the stack's ``[E * rows_p, H/16]``
    scale matrix (:func:`nvgemm.core.formats.to_blocked` of a row-index matrix) puts its rows -- checked against
    the stack's bytes, whose scales name their expert."""
    sel = set()
    for gid in ids.flatten().tolist():
        loc = gid if emap is None or gid < 0 else int(emap[gid])
        if loc >= 0:
            sel.add(loc)
    rp, e = stack.rows_padded, stack.num_experts
    row_bytes = h // 2
    w_lines = {b // 128 for x in sorted(sel) for b in range(x * rp * row_bytes, (x + 1) * rp * row_bytes)}
    kp = -(-(h // 16) // 4) * 4  # K blocks with the swizzle's column padding (which belongs to its row)
    row_of_byte = to_blocked(torch.arange(e * rp, dtype=torch.int32)[:, None].expand(e * rp, kp).contiguous())
    expert_of_byte = row_of_byte.reshape(-1) // rp
    sbytes = stack.scale.view(torch.uint8)
    assert expert_of_byte.numel() == sbytes.numel()
    named = sbytes != 0  # padding rows and columns carry zero scales
    assert torch.equal(sbytes[named].long(), 0x30 + expert_of_byte[named].long()), "stack scale layout"
    in_sel = torch.isin(expert_of_byte, torch.tensor(sorted(sel), dtype=expert_of_byte.dtype))
    sf_lines = set((torch.nonzero(in_sel).flatten() // 128).tolist())
    got = launch.ext.get("l2_prefetch_lines", {})
    assert set(got) <= {"w13_ptr", "w13_sf_ptr"}, f"prefetches outside GEMM1's weights: {sorted(got)}"
    assert got.get("w13_ptr", set()) == w_lines, \
        f"weight lines: {len(got.get('w13_ptr', ()))} prefetched, {len(w_lines)} expected, " \
        f"{len(got.get('w13_ptr', set()) ^ w_lines)} differ"
    assert got.get("w13_sf_ptr", set()) == sf_lines, \
        f"scale lines: {len(got.get('w13_sf_ptr', ()))} prefetched, {len(sf_lines)} expected, " \
        f"{len(got.get('w13_sf_ptr', set()) ^ sf_lines)} differ"
    assert launch.stats.get("l2_prefetches", 0) == len(w_lines) + len(sf_lines), "a line prefetched twice"


def sm100_slot_prep_case(m=5, topk=2, e=4, h=96, tn=8, dtype=torch.bfloat16, seed=6, i=32, ep=False, ids=None,
                         emap=None, prefetch=True):
    """The sm100 MoE prep: work list, slot activations, tables and GEMM2's scale padding bit-exact against the torch
    construction; with ``prefetch`` (fused launches) the L2 prefetch of the selected experts' GEMM1 weights
    (:func:`check_w13_prefetch`). ``ep``: a random expert map over ``2 e`` global experts; ``ids`` / ``emap``: the
    routing and expert map to use instead of random ones."""
    fixed_map = emap
    from nvgemm.ops.moe import local_ids
    from nvgemm.templates.sm100_moe.launch import b2_scale_atoms_ref, slot_activations, slot_rows_of_pairs
    from nvgemm.templates.sm100_moe.prep_triton import FUSED_MAX_PAIRS, _moe_prep_kernel, moe_prep_triton
    from nvgemm.templates.sm90_moe.launch import build_work_list

    def run(arch):
        g = torch.Generator().manual_seed(seed)
        eg = 2 * e if ep else e
        rid = torch.randint(-1, eg, (m, topk), generator=g, dtype=torch.int32)
        if ids is not None:
            rid = ids
        x = (torch.randn(m, h, generator=g) * 3).to(dtype)
        x[0, :16] = 0
        ins = torch.rand(e, generator=g) * 0.01 + 1e-3
        emap = fixed_map
        if ep and emap is None:
            emap = torch.full((eg,), -1, dtype=torch.int32)
            emap[torch.randperm(eg, generator=g)[:e]] = torch.arange(e, dtype=torch.int32)
        stack = _w13_stack(g, e, i, h) if prefetch else None
        kernel = _emu(_moe_prep_kernel, arch)
        got = moe_prep_triton(x, rid, emap, e, ins, tn, i, kernel=kernel, w13=stack.weight if prefetch else None,
                              w13_scale=stack.scale if prefetch else None)
        wl = build_work_list(local_ids(rid, emap), e, tn)
        for f in ("rows", "tiles", "pos", "valid", "counts"):
            _eq(getattr(got.work_list, f), getattr(wl, f), f"work list {f}")
        wq, ws = slot_activations(x, wl, ins, tn)
        _eq(got.y_rows[wl.valid], slot_rows_of_pairs(wl, tn)[wl.valid], "pair -> slot row")
        _eq(got.finalize_rows, torch.where(wl.valid, slot_rows_of_pairs(wl, tn), -1).to(torch.int32).reshape(-1),
            "pair -> slot row, -1 for an empty slot (the fused finalize's table)")
        _eq(got.codes, wq, "slot codes")
        _eq(got.scales, ws, "slot scale atoms")
        pad = b2_scale_atoms_ref(wl.slots, tn, i, "cpu") == 0
        _eq(got.b2_scales[pad], torch.zeros_like(got.b2_scales[pad]), "GEMM2 scale padding")
        if prefetch and m * topk <= FUSED_MAX_PAIRS:
            check_w13_prefetch(kernel.last, rid, emap, stack, h)
        else:
            assert not kernel.last.ext.get("l2_prefetch_lines"), "prefetches without weights to prefetch"

    return Case("_moe_prep_kernel", "sm100_moe/prep_triton.py", (_moe_prep_kernel,), run,
                f"m{m}-top{topk}-e{e}-h{h}-i{i}-tn{tn}-{str(dtype)[6:]}{'-ep' if ep or emap is not None else ''}"
                f"{'-prefetch' if prefetch else ''}")


def sm90_prep_case(m=5, topk=2, e=4, tm=8, ep=False, seed=7):
    from nvgemm.ops.moe import local_ids
    from nvgemm.templates.sm90_moe.launch import build_work_list
    from nvgemm.templates.sm90_moe.prep_triton import _prep_kernel, build_work_list_triton

    def run(arch):
        g = torch.Generator().manual_seed(seed)
        eg = 2 * e if ep else e
        ids = torch.randint(-1, eg, (m, topk), generator=g, dtype=torch.int32)
        emap = None
        if ep:
            emap = torch.full((eg,), -1, dtype=torch.int32)
            emap[torch.randperm(eg, generator=g)[:e]] = torch.arange(e, dtype=torch.int32)
        want = build_work_list(local_ids(ids, emap), e, tm)
        got = build_work_list_triton(ids, emap, e, tm, kernel=_emu(_prep_kernel, arch))
        for f in ("rows", "tiles", "pos", "valid", "counts", "y_rows"):
            _eq(getattr(got, f), getattr(want, f), f"work list {f}")

    return Case("_prep_kernel", "sm90_moe/prep_triton.py", (_prep_kernel,), run,
                f"m{m}-top{topk}-e{e}-tm{tm}{'-ep' if ep else ''}")


def sm90_finalize_case(m=3, topk=2, h=40, extras=True, odt=torch.bfloat16, seed=8):
    from nvgemm.templates.sm90_moe.finalize_triton import _finalize_kernel, finalize_triton
    from nvgemm.templates.sm90_moe.launch import build_work_list, finalize_ref

    def run(arch):
        g = torch.Generator().manual_seed(seed)
        local = torch.randint(-1, 6, (m, topk), generator=g)
        wl = build_work_list(local, 6, 8)
        y = torch.randn(m * topk, h, generator=g) * 100
        w = torch.rand(m, topk, generator=g)
        sh = torch.randn(m, h, generator=g).to(odt) if extras else None
        res = torch.randn(m, h, generator=g).to(odt) if extras else None
        got = finalize_triton(y, wl.pos, wl.valid, w, sh, res, odt, kernel=_emu(_finalize_kernel, arch))
        _eq(got, finalize_ref(y, wl, w, sh, res, odt), "finalize output")

    return Case("_finalize_kernel", "sm90_moe/finalize_triton.py", (_finalize_kernel,), run,
                f"m{m}-top{topk}-h{h}{'-shared-res' if extras else ''}-{str(odt)[6:]}")


def default_cases() -> list[Case]:
    """One shape per kernel: the default CI subset (each run on both archs); the W4A16 GEMM also at its M > 16
    tile (64 x 64: ``wgmma`` on sm_90a, ``tcgen05.mma`` with A in tensor memory on sm_100a)."""
    from nvgemm.templates.triton.gemm_w4a16 import gemm_config

    return [quantize_case(adversarial=True), qdq_case(adversarial=True), rmsnorm_case(), silu_mul_case(), rope_case(),
            gemm_case(),
            gemm_case(24, 128, 256, config=gemm_config(24, 128, 256, False, False)),
            moe_case(),
            sm100_slot_prep_case(), sm90_prep_case(), sm90_finalize_case()]


def sm120_default_cases() -> list[Case]:
    """The default subset's sm_120a cases: the two cheapest kernels of the sm_120 op path (the activation
    quantizer and add + RMSNorm + quantize); the sweep runs every kernel on sm_120a."""
    return [quantize_case(adversarial=True), rmsnorm_case()]


def sweep_cases() -> list[Case]:
    """Every kernel at each config its host code can pick on a GPU (the opt-in sweep)."""
    from nvgemm.templates.triton.fused import rmsnorm_config
    from nvgemm.templates.triton.gemm_w4a16 import gemm_config
    from nvgemm.templates.triton.moe import moe_config
    from nvgemm.templates.triton.quantize import quantize_config

    cases = []
    # quantizer: the policy's block shapes for decode and prefill widths, swizzled and linear scales
    for m, k in ((1, 64), (5, 128), (33, 512), (130, 2048)):
        cases.append(quantize_case(m, k, config=quantize_config(m, k, True, False)))
    cases.append(quantize_case(7, 256, torch.float16, swizzle=False))
    cases.append(quantize_case(adversarial=True))
    cases.append(quantize_case(dtype=torch.float16, adversarial=True))
    cases.append(qdq_case(adversarial=True))
    cases.append(qdq_case(5, 128))
    cases.append(qdq_case(9, 512, torch.float16))
    # RMSNorm: one-tile and two-pass (BLOCK_K < padded K), with and without the residual add
    for m, k, resid, cfg in ((3, 128, True, None), (3, 128, False, None), (2, 4096, True, None),
                             (3, 256, True, (1, 64, 4)), (5, 192, False, (2, 64, 4))):
        cases.append(rmsnorm_case(m, k, residual=resid, config=cfg or rmsnorm_config(m, k, True, False)))
    cases.append(rmsnorm_case(4, 128, torch.float16, residual=True))
    for m, i in ((3, 64), (17, 256)):
        cases.append(silu_mul_case(m, i, config=quantize_config(m, i, True, False)))
    cases.append(silu_mul_case(3, 64, torch.float16))
    # RoPE + KV write: Llama-3.1-8B decode (GQA 4, D 128), several tokens, MHA fp16, MQA with D 96 (masked lanes)
    for t, hq, hkv, d, dt, tdt in ((1, 32, 8, 128, torch.bfloat16, torch.bfloat16),
                                   (5, 8, 2, 64, torch.bfloat16, torch.float32),
                                   (3, 4, 4, 32, torch.float16, torch.float16),
                                   (2, 6, 1, 96, torch.bfloat16, torch.bfloat16)):
        cases.append(rope_case(t, hq, hkv, d, 16, dt, tdt))
    # the W4A16 GEMM: both GPU configs (decode 16x64, and the M > 16 tile), gated and not, W4A4 and W4A16
    for m, act, w4a4 in ((5, "none", True), (5, "silu_mul", True), (5, "none", False), (24, "none", True),
                         (24, "silu_mul", False), (3, "gelu_tanh", True)):
        n, k = 128, 256
        cfg = gemm_config(m, n // 2 if act == "silu_mul" else n, k, act == "silu_mul", False)
        cases.append(gemm_case(m, n, k, act, w4a4, config=cfg))
    cases.append(gemm_case(5, 64, 128, "none", True, dtype=torch.float16, out_dtype=torch.float32))
    # MoE: decode (BLOCK_M 16) and a larger batch (BLOCK_M 32), relu2 (exact) and silu_mul
    for m, act in ((6, "relu2"), (6, "silu_mul"), (40, "relu2")):
        cfg = moe_config(m, 2, 4, 64, 64, False)
        cases.append(moe_case(m=m, activation=act, config=cfg))
    cases.append(moe_case(m=6, activation="relu2", w4a4=False))
    for m, topk, e, h, tn in ((5, 2, 4, 96, 8), (19, 1, 3, 512, 16), (9, 4, 6, 160, 64)):
        cases.append(sm100_slot_prep_case(m, topk, e, h, tn))
    # decode: one token, top-8, an expert map, GEMM1 rows in three 128-row tiles (two prefetch steps per program)
    cases.append(sm100_slot_prep_case(1, 8, 16, 256, 8, i=192, ep=True))
    for m, topk, e, tm, ep in ((1, 8, 256, 8, False), (5, 2, 4, 8, False), (33, 4, 8, 16, True), (7, 1, 3, 32, True)):
        cases.append(sm90_prep_case(m, topk, e, tm, ep))
    for m, topk, h, extras, odt in ((3, 2, 40, True, torch.bfloat16), (5, 4, 1100, True, torch.float16),
                                    (2, 1, 64, False, torch.float32)):
        cases.append(sm90_finalize_case(m, topk, h, extras, odt))
    return cases
