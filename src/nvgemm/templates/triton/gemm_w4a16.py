"""Triton weight-only NVFP4 GEMM (W4A16) with nvgemm's full epilogue: the fallback backend.

``out = epilogue(alpha * x @ dequant(W).T)`` for NVFP4 weights (packed uint8 [N, K/2], even K in
the low nibble; 128x4-swizzled e4m3 block scales; fp32 ``weight_scale_2`` scalar or per-N) and
bf16/fp16 activations. For GPUs with no CuTeDSL kernel (sm_80, sm_89, sm_120; also runs on
sm_90/sm_100) and as a benchmark baseline.

Per [BLOCK_M, BLOCK_N] output tile and BLOCK_K step, the program loads the x tile and the packed
weight tile, decodes ``E2M1[q] * float(sf)`` in fp32 (exact: <= 6 significant bits), casts it to
x's dtype (still exact: bf16 and fp16 both hold every e2m1*e4m3 product, verified exhaustively in
``tests/cpu``) and accumulates ``tl.dot`` in fp32. ``weight_scale_2`` is *not* applied to the
weight: it is part of ``alpha`` in the epilogue, like the emulated reference.

**W4A4 by quantize-dequantize** (``QUANT_A``): when an ``input_scale`` is given, each x tile is
quantized exactly like :func:`nvgemm.core.formats.quantize_activation` (16-blocks along K align with
the K tiles) and dequantized to ``E2M1[qx] * float(sfx)`` — exact in bf16/fp16 — and alpha becomes
``input_scale * weight_scale_2``. The products and the accumulator then see the same values as a
real W4A4 kernel: the result equals W4A4 up to fp32 summation order.

**Epilogue** (``nvgemm.epilogues.epilogue_ref`` order, all fp32, one rounding): alpha (scalar or
per-column vector) -> bias -> activation none | silu | gelu_tanh | silu_mul (two accumulators:
gate rows n and up rows n + N/2) -> residual -> cast (RNE). Compiled without FMA contraction.

**PDL**: ``gdc_wait`` before the K loop (x is the predecessor's output), ``gdc_launch_dependents``
after it (all of x has been read; the epilogue's residual read is still ordered because every
dependent waits for this grid's completion in its own ``gdc_wait``).

In the interpreter the dot runs on fp32 operands with ``input_precision="ieee"`` (its bf16 dot is
not supported); the operand values are identical, so the math is the same.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from nvgemm.core.validation import alpha_of, check_linear_args
from nvgemm.core.epilogue import EpilogueSpec
from nvgemm.templates.triton._common import (
    cast_to_kind,
    ceil_div,
    check_device,
    dtype_kind,
    e2m1_decode,
    e4m3_to_f32,
    is_interpreted,
    launch_options,
    next_pow2,
    nvfp4_qdq_tile,
    pdl_launch_dependents,
    pdl_wait,
    use_gdc,
)

__all__ = ["w4a16_gemm_kernel", "nvfp4_linear_triton", "gemm_config", "ACT_CODES"]

ACT_CODES = {"none": 0, "silu": 1, "gelu_tanh": 2, "silu_mul": 3}


@triton.jit
def _silu(y):
    return y * tl.math.div_rn(1.0, 1.0 + tl.exp(-y))


@triton.jit
def _gelu_tanh(y):
    inner = 0.7978845608028654 * (y + 0.044715 * (y * y * y))
    t = 1.0 - tl.math.div_rn(2.0, tl.exp(2.0 * inner) + 1.0)  # tanh, saturating to +-1
    return 0.5 * y * (1.0 + t)


@triton.jit
def _w_tile(w_ptr, wsf_ptr, rows, k0, N, K, stride_wn, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """Dequantized weight tile [BLOCK_N, BLOCK_K] fp32: E2M1[q] * float(sf) (no global scale)."""
    pc = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    rmask = rows[:, None] < N
    b = tl.load(w_ptr + rows.to(tl.int64)[:, None] * stride_wn + pc[None, :],
                mask=rmask & (pc[None, :] < K // 2), other=0).to(tl.int32)
    codes = tl.reshape(tl.join(b & 0xF, b >> 4), (BLOCK_N, BLOCK_K))  # even K in the low nibble
    kb = k0 // 16 + tl.arange(0, BLOCK_K // 16)
    r = rows[:, None]
    kbb = kb[None, :]
    n_kb = K // 16
    off = ((r // 128) * ((n_kb + 3) // 4) + kbb // 4).to(tl.int64) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + kbb % 4
    sf = tl.load(wsf_ptr + off, mask=rmask & (kbb < n_kb), other=0).to(tl.int32)
    vals = tl.reshape(e2m1_decode(codes), (BLOCK_N, BLOCK_K // 16, 16)) * e4m3_to_f32(sf)[:, :, None]
    return tl.reshape(vals, (BLOCK_N, BLOCK_K))


@triton.jit
def _epi_pre(acc, alpha_ptr, bias_ptr, cols, N, ALPHA_VECTOR: tl.constexpr, HAS_BIAS: tl.constexpr):
    """acc * alpha + bias for output columns ``cols`` of the [.., N] GEMM (fp32, two roundings)."""
    if ALPHA_VECTOR:
        alpha = tl.load(alpha_ptr + cols, mask=cols < N, other=0.0)
        y = acc * alpha[None, :]
    else:
        y = acc * tl.load(alpha_ptr)
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    return y


@triton.jit
def w4a16_gemm_kernel(
    x_ptr, w_ptr, wsf_ptr, alpha_ptr, gs_ptr, bias_ptr, res_ptr, out_ptr,
    M, N, N_OUT, K, stride_xm, stride_wn, stride_rm, stride_om,
    QUANT_A: tl.constexpr, ALPHA_VECTOR: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, X_KIND: tl.constexpr, OUT_KIND: tl.constexpr, DOT_FP32: tl.constexpr,
    USE_GDC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # output columns, in [0, N_OUT)
    GATED: tl.constexpr = ACTIVATION == 3
    if QUANT_A:
        gs = tl.load(gs_ptr)  # static input_scale
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if GATED:
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    pdl_wait(USE_GDC)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + offs_k[None, :],
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        if QUANT_A:
            a = nvfp4_qdq_tile(a.to(tl.float32), gs, BLOCK_M, BLOCK_K)
            if not DOT_FP32:
                a = a.to(x_ptr.dtype.element_ty)  # exact: e2m1 * e4m3 fits bf16 and fp16
        elif DOT_FP32:
            a = a.to(tl.float32)
        w = _w_tile(w_ptr, wsf_ptr, offs_n, k0, N, K, stride_wn, BLOCK_K, BLOCK_N)
        if DOT_FP32:
            acc = tl.dot(a, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(w.to(x_ptr.dtype.element_ty)), acc)
        if GATED:
            wu = _w_tile(w_ptr, wsf_ptr, offs_n + N_OUT, k0, N, K, stride_wn, BLOCK_K, BLOCK_N)
            if DOT_FP32:
                acc_up = tl.dot(a, tl.trans(wu), acc_up, input_precision="ieee")
            else:
                acc_up = tl.dot(a, tl.trans(wu.to(x_ptr.dtype.element_ty)), acc_up)
    pdl_launch_dependents(USE_GDC)

    # epilogue: alpha -> bias -> activation -> residual -> one rounding
    y = _epi_pre(acc, alpha_ptr, bias_ptr, offs_n, N, ALPHA_VECTOR, HAS_BIAS)
    if ACTIVATION == 1:
        y = _silu(y)
    elif ACTIVATION == 2:
        y = _gelu_tanh(y)
    elif ACTIVATION == 3:
        y = _silu(y) * _epi_pre(acc_up, alpha_ptr, bias_ptr, offs_n + N_OUT, N, ALPHA_VECTOR, HAS_BIAS)
    out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N_OUT)
    if HAS_RESIDUAL:
        y = y + tl.load(res_ptr + offs_m.to(tl.int64)[:, None] * stride_rm + offs_n[None, :],
                        mask=out_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :], cast_to_kind(y, OUT_KIND),
             mask=out_mask)


def gemm_config(m: int, n_out: int, k: int, gated: bool, interpreted: bool) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) — a fixed decode-oriented policy.

    Decode (M <= 16): 16 x 64 tiles, BLOCK_K 128 (N/64 programs stream the weight once).
    Larger M: 64 x 64 (gated: 32 x 64, two accumulators). The interpreter gets the largest tiles
    the problem allows (its cost is per program and per op, not per element).
    """
    kp = next_pow2(max(k, 16))
    if interpreted:
        return (min(max(next_pow2(m), 16), 64), min(max(next_pow2(n_out), 16), 64), min(kp, 256), 4, 1)
    if m <= 16:
        return (16, 64, min(kp, 128), 4, 4)
    return (32 if gated else 64, 64, min(kp, 64), 4, 3)


def nvfp4_linear_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
    activation: str = "none",
    out_dtype: Optional[torch.dtype] = None,
    *,
    pdl: bool | None = None,
    config: tuple[int, int, int, int, int] | None = None,
    kernel=None,
    spec: EpilogueSpec | None = None,
) -> torch.Tensor:
    """``nvgemm::nvfp4_linear`` on the Triton W4A16 kernel (same arguments and checks; ``spec``: the
    epilogue of a call the op has already validated, which is then not checked again).

    ``input_scale`` given: W4A4 semantics by in-kernel quantize-dequantize of x (see module doc).
    """
    kernel = kernel or w4a16_gemm_kernel
    if spec is None:
        spec = check_linear_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation,
                                 out_dtype)
    n, k = weight.shape[0], weight.shape[1] * 2
    n_out = spec.out_features(n)
    dev = check_device(kernel, x, weight, weight_scale, bias, residual, op="nvgemm.nvfp4_linear[triton_w4a16]")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    weight = weight.contiguous()
    wsf = weight_scale.view(torch.uint8) if weight_scale.dtype != torch.uint8 else weight_scale
    alpha = alpha_of(weight_scale_2, input_scale, dev).contiguous()
    gs = alpha.reshape(-1) if input_scale is None else input_scale.to(dev).float().reshape(1)  # unused for W4A16
    res2 = residual.reshape(-1, n_out) if residual is not None else None
    if res2 is not None and res2.stride(-1) != 1:
        res2 = res2.contiguous()
    out = torch.empty((m, n_out), dtype=spec.out_dtype, device=dev)
    if m and n_out:
        interp = is_interpreted(kernel)
        bm, bn, bk, num_warps, num_stages = config or gemm_config(m, n_out, k, spec.gated, interp)
        gdc = use_gdc(kernel, dev, pdl)
        kernel[(ceil_div(m, bm), ceil_div(n_out, bn))](
            x2, weight, wsf, alpha, gs, bias if bias is not None else alpha, res2 if res2 is not None else out, out,
            m, n, n_out, k, x2.stride(0), weight.stride(0), res2.stride(0) if res2 is not None else 0, out.stride(0),
            QUANT_A=input_scale is not None, ALPHA_VECTOR=spec.alpha == "vector", HAS_BIAS=bias is not None,
            ACTIVATION=ACT_CODES[activation], HAS_RESIDUAL=residual is not None, X_KIND=dtype_kind(x.dtype),
            OUT_KIND=dtype_kind(spec.out_dtype), DOT_FP32=interp, USE_GDC=gdc,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=num_warps, num_stages=num_stages,
            **launch_options(gdc),
        )
    return out.reshape(*x.shape[:-1], n_out)

