"""Fused Triton quantizers for the NVFP4 decode chain (one launch instead of two or three).

* ``rmsnorm_quantize_nvfp4_triton``      RMSNorm(x) -> NVFP4
* ``add_rmsnorm_quantize_nvfp4_triton``  r = x + residual; RMSNorm(r) -> NVFP4; returns r too
* ``silu_mul_quantize_nvfp4_triton``     silu(gate) * up -> NVFP4  (x = [gate | up])

Each computes the value the unfused chain would materialise (see
:mod:`nvgemm.templates.triton.reference`: rounded once to x's dtype, RMSNorm the Hugging Face way)
and quantizes it exactly like :func:`nvgemm.core.formats.quantize_activation`, writing scales in the
128x4 swizzled layout with zero-filled padding. ``return_y=True`` also returns that
pre-quantization value (fp32) so tests can check the quantization byte for byte.

RMSNorm kernels: one program owns BLOCK_M whole rows. When the padded row fits one tile
(``ONE_TILE``) x is read once; otherwise pass 1 accumulates sum(x**2) over BLOCK_K chunks and
pass 2 re-reads x (from L2) to normalize and quantize. Rows between M and the next multiple of
128 (swizzle padding) read nothing and write zero scales.

PDL: static operands (input_scale) are read first, then ``gdc_wait``; ``gdc_launch_dependents``
follows the last load of x / residual.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nvgemm.core.formats import blocked_numel

from nvgemm.templates.triton._common import (
    cast_to_kind,
    ceil_div,
    check_device,
    dtype_kind,
    is_interpreted,
    launch_options,
    next_pow2,
    nvfp4_quantize_tile,
    pdl_launch_dependents,
    pdl_wait,
    round_to_kind,
    store_nvfp4_tile,
    use_gdc,
)
from nvgemm.templates.triton.reference import check_fused_args
from nvgemm.templates.triton.quantize import quantize_config

__all__ = [
    "rmsnorm_quantize_kernel",
    "silu_mul_quantize_kernel",
    "rmsnorm_quantize_nvfp4_triton",
    "add_rmsnorm_quantize_nvfp4_triton",
    "silu_mul_quantize_nvfp4_triton",
    "rmsnorm_config",
]


@triton.jit
def _load_h(x_ptr, res_ptr, rout_ptr, rows, cols, M, K, stride_xm, stride_rm, stride_om,
            HAS_RESIDUAL: tl.constexpr, STORE_RESIDUAL: tl.constexpr, X_KIND: tl.constexpr):
    """The RMSNorm input tile (fp32): x, or x + residual rounded to x's dtype (stored if asked)."""
    r64 = rows.to(tl.int64)[:, None]
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    h = tl.load(x_ptr + r64 * stride_xm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + r64 * stride_rm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        h = round_to_kind(h + res, X_KIND)
        if STORE_RESIDUAL:
            tl.store(rout_ptr + r64 * stride_om + cols[None, :], cast_to_kind(h, X_KIND), mask=mask)
    return h


@triton.jit
def _rmsnorm_tile(h, rstd, w_ptr, cols, K, X_KIND: tl.constexpr, ROUND_Y: tl.constexpr):
    """``weight * dtype(h * rstd)`` (HF order), rounded to x's dtype when weight has x's dtype."""
    w = tl.load(w_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
    y = round_to_kind(h * rstd[:, None], X_KIND) * w[None, :]
    if ROUND_Y:
        y = round_to_kind(y, X_KIND)
    return y


@triton.jit
def rmsnorm_quantize_kernel(
    x_ptr, res_ptr, w_ptr, gs_ptr, q_ptr, sf_ptr, rout_ptr, y_ptr,
    M, K, KP, stride_xm, stride_rm, stride_om, stride_qm, stride_ym, eps,
    HAS_RESIDUAL: tl.constexpr, STORE_Y: tl.constexpr, SWIZZLE: tl.constexpr, USE_GDC: tl.constexpr,
    X_KIND: tl.constexpr, ROUND_Y: tl.constexpr, ONE_TILE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    gs = tl.load(gs_ptr)  # static input_scale
    pdl_wait(USE_GDC)
    if ONE_TILE:
        cols = tl.arange(0, BLOCK_K)
        h = _load_h(x_ptr, res_ptr, rout_ptr, rows, cols, M, K, stride_xm, stride_rm, stride_om,
                    HAS_RESIDUAL, True, X_KIND)
        pdl_launch_dependents(USE_GDC)
        rstd = tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(tl.sum(h * h, axis=1), K.to(tl.float32)) + eps))
        y = _rmsnorm_tile(h, rstd, w_ptr, cols, K, X_KIND, ROUND_Y)
        packed, sf = nvfp4_quantize_tile(y, gs, BLOCK_M, BLOCK_K)
        store_nvfp4_tile(q_ptr, sf_ptr, packed, sf, rows, 0, M, K, stride_qm, SWIZZLE, BLOCK_K)
        if STORE_Y:
            tl.store(y_ptr + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :], y,
                     mask=(rows[:, None] < M) & (cols[None, :] < K))
    else:
        acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            h = _load_h(x_ptr, res_ptr, rout_ptr, rows, cols, M, K, stride_xm, stride_rm, stride_om,
                        HAS_RESIDUAL, True, X_KIND)
            acc += tl.sum(h * h, axis=1)
        rstd = tl.math.div_rn(1.0, tl.sqrt_rn(tl.math.div_rn(acc, K.to(tl.float32)) + eps))
        for k0 in range(0, KP, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            # recompute x + residual from the inputs (not from this kernel's own residual store)
            h = _load_h(x_ptr, res_ptr, rout_ptr, rows, cols, M, K, stride_xm, stride_rm, stride_om,
                        HAS_RESIDUAL, False, X_KIND)
            y = _rmsnorm_tile(h, rstd, w_ptr, cols, K, X_KIND, ROUND_Y)
            packed, sf = nvfp4_quantize_tile(y, gs, BLOCK_M, BLOCK_K)
            store_nvfp4_tile(q_ptr, sf_ptr, packed, sf, rows, k0 // BLOCK_K, M, K, stride_qm, SWIZZLE, BLOCK_K)
            if STORE_Y:
                tl.store(y_ptr + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :], y,
                         mask=(rows[:, None] < M) & (cols[None, :] < K))
        pdl_launch_dependents(USE_GDC)


@triton.jit
def silu_mul_quantize_kernel(
    x_ptr, gs_ptr, q_ptr, sf_ptr, y_ptr,
    M, I, stride_xm, stride_qm, stride_ym,
    STORE_Y: tl.constexpr, SWIZZLE: tl.constexpr, USE_GDC: tl.constexpr, X_KIND: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    gs = tl.load(gs_ptr)  # static input_scale
    pdl_wait(USE_GDC)
    mask = (rows[:, None] < M) & (cols[None, :] < I)
    base = x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols[None, :]
    g = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(base + I, mask=mask, other=0.0).to(tl.float32)
    pdl_launch_dependents(USE_GDC)
    y = round_to_kind(tl.math.div_rn(g, 1.0 + tl.exp(-g)) * u, X_KIND)
    packed, sf = nvfp4_quantize_tile(y, gs, BLOCK_M, BLOCK_K)
    store_nvfp4_tile(q_ptr, sf_ptr, packed, sf, rows, pid_k, M, I, stride_qm, SWIZZLE, BLOCK_K)
    if STORE_Y:
        tl.store(y_ptr + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :], y, mask=mask)


# --------------------------------------------------------------------------- host


def _padded(m: int, k: int, swizzle: bool) -> tuple[int, int]:
    """Rows and columns a quantizer grid must cover (swizzle padding included)."""
    if swizzle:
        return ceil_div(m, 128) * 128, ceil_div(k // 16, 4) * 64
    return m, k


def _alloc(m: int, k: int, swizzle: bool, dev) -> tuple[torch.Tensor, torch.Tensor]:
    packed = torch.empty((m, k // 2), dtype=torch.uint8, device=dev)
    if swizzle:
        scale = torch.empty((blocked_numel(m, k // 16),), dtype=torch.uint8, device=dev)
    else:
        scale = torch.empty((m, k // 16), dtype=torch.uint8, device=dev)
    return packed, scale


def rmsnorm_config(m: int, k: int, swizzle: bool, interpreted: bool) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_K, num_warps). BLOCK_K >= padded K means one pass over x."""
    mp, kp = _padded(m, k, swizzle)
    if interpreted:
        block_k = min(next_pow2(kp), 4096)
        return min(next_pow2(mp), max(1, 65536 // block_k)), block_k, 4
    block_k = min(next_pow2(kp), 8192)
    block_m = min(next_pow2(mp), max(1, 4096 // block_k))
    num_warps = 4 if block_m * block_k <= 2048 else 8 if block_m * block_k <= 4096 else 16
    return block_m, block_k, num_warps


def _rmsnorm_launch(x, residual, weight, input_scale, eps, swizzle, pdl, config, kernel, return_y, op):
    kernel = kernel or rmsnorm_quantize_kernel
    check_fused_args(op, x, input_scale, weight=weight, residual=residual)
    dev = check_device(kernel, x, weight, residual, op=f"nvgemm.{op}")
    input_scale = input_scale.to(dev).reshape(1)
    x = x if x.stride(-1) == 1 else x.contiguous()
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    weight = weight.contiguous()
    m, k = x.shape
    packed, scale = _alloc(m, k, swizzle, dev)
    res_out = torch.empty_like(x) if residual is not None else None
    y = torch.empty((m, k), dtype=torch.float32, device=dev) if return_y else None
    if scale.numel():
        block_m, block_k, num_warps = config or rmsnorm_config(m, k, swizzle, is_interpreted(kernel))
        mp, kp = _padded(m, k, swizzle)
        gdc = use_gdc(kernel, dev, pdl)
        kernel[(ceil_div(mp, block_m),)](
            x, residual if residual is not None else x, weight, input_scale, packed, scale,
            res_out if res_out is not None else x, y if y is not None else x,
            m, k, kp, x.stride(0), residual.stride(0) if residual is not None else 0,
            res_out.stride(0) if res_out is not None else 0, packed.stride(0), y.stride(0) if y is not None else 0,
            float(eps),
            HAS_RESIDUAL=residual is not None, STORE_Y=return_y, SWIZZLE=swizzle, USE_GDC=gdc,
            X_KIND=dtype_kind(x.dtype), ROUND_Y=weight.dtype == x.dtype, ONE_TILE=block_k >= kp,
            BLOCK_M=block_m, BLOCK_K=block_k, num_warps=num_warps, **launch_options(gdc),
        )
    out = [packed, scale.view(torch.float8_e4m3fn)]
    if res_out is not None:
        out.append(res_out)
    if return_y:
        out.append(y)
    return tuple(out)


def rmsnorm_quantize_nvfp4_triton(x, weight, input_scale, eps: float = 1e-6, swizzle: bool = True, *,
                                  pdl=None, config=None, kernel=None, return_y: bool = False):
    """RMSNorm(x) * weight -> NVFP4 (packed, scales[, y]); see :func:`reference.rmsnorm_quantize_ref`."""
    return _rmsnorm_launch(x, None, weight, input_scale, eps, swizzle, pdl, config, kernel, return_y,
                           "rmsnorm_quantize_nvfp4")


def add_rmsnorm_quantize_nvfp4_triton(x, residual, weight, input_scale, eps: float = 1e-6, swizzle: bool = True,
                                      *, pdl=None, config=None, kernel=None, return_y: bool = False):
    """r = x + residual; RMSNorm(r) * weight -> NVFP4. Returns (packed, scales, r[, y])."""
    return _rmsnorm_launch(x, residual, weight, input_scale, eps, swizzle, pdl, config, kernel, return_y,
                           "add_rmsnorm_quantize_nvfp4")


def silu_mul_quantize_nvfp4_triton(x, input_scale, swizzle: bool = True, *, pdl=None, config=None, kernel=None,
                                   return_y: bool = False):
    """x = [gate | up] [M, 2I] -> NVFP4 of silu(gate) * up: (packed [M, I/2], scales[, y])."""
    kernel = kernel or silu_mul_quantize_kernel
    check_fused_args("silu_mul_quantize_nvfp4", x, input_scale, gated=True)
    dev = check_device(kernel, x, op="nvgemm.silu_mul_quantize_nvfp4")
    input_scale = input_scale.to(dev).reshape(1)
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, i = x.shape[0], x.shape[1] // 2
    packed, scale = _alloc(m, i, swizzle, dev)
    y = torch.empty((m, i), dtype=torch.float32, device=dev) if return_y else None
    if scale.numel():
        block_m, block_k, num_warps = config or quantize_config(m, i, swizzle, is_interpreted(kernel))
        mp, kp = _padded(m, i, swizzle)
        gdc = use_gdc(kernel, dev, pdl)
        kernel[(ceil_div(mp, block_m), ceil_div(kp, block_k))](
            x, input_scale, packed, scale, y if y is not None else x,
            m, i, x.stride(0), packed.stride(0), y.stride(0) if y is not None else 0,
            STORE_Y=return_y, SWIZZLE=swizzle, USE_GDC=gdc, X_KIND=dtype_kind(x.dtype),
            BLOCK_M=block_m, BLOCK_K=block_k, num_warps=num_warps, **launch_options(gdc),
        )
    out = (packed, scale.view(torch.float8_e4m3fn))
    return out + (y,) if return_y else out
