"""Triton NVFP4 activation quantizer: bf16/fp16/fp32 [M, K] -> packed E2M1 + e4m3 block scales.

Bit-exact with :func:`nvgemm.core.formats.quantize_activation` (static global scale ``input_scale``,
true fp32 division, RNE everywhere, all-zero blocks -> sf 0 and codes 0). Scales are written
directly in the 128x4 swizzled layout the block-scaled MMA reads (rows padded to 128, K/16
padded to 4, padding written as 0 by the kernel itself: no separate memset), or linear [M, K/16].

Grid: ``(ceil(Mp / BLOCK_M), ceil(Kp / BLOCK_K))`` where Mp/Kp include the swizzle padding; each
program quantizes one [BLOCK_M, BLOCK_K] tile (BLOCK_K/16 scale blocks per row).

PDL: the program reads the static ``input_scale``, then ``gdc_wait`` (x is the predecessor's
output), loads its x tile, then ``gdc_launch_dependents``.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from nvgemm.core.formats import NVFP4, blocked_numel
from nvgemm.templates.triton._common import (
    ceil_div,
    check_device,
    launch_options,
    next_pow2,
    nvfp4_qdq_tile,
    nvfp4_quantize_tile,
    pdl_launch_dependents,
    pdl_wait,
    store_nvfp4_tile,
    use_gdc,
    is_interpreted,
)
from nvgemm.templates.triton.prebound import PreboundLaunch, prebindable

__all__ = ["bind_quantize_nvfp4", "qdq_nvfp4_kernel", "qdq_nvfp4_triton", "quantize_nvfp4_kernel",
           "quantize_nvfp4_triton", "quantize_config", "quantize_launch"]


@triton.jit
def quantize_nvfp4_kernel(
    x_ptr, gs_ptr, q_ptr, sf_ptr,
    M, K, stride_xm, stride_qm,
    SWIZZLE: tl.constexpr, USE_GDC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    gs = tl.load(gs_ptr)  # static input_scale, not a predecessor output
    pdl_wait(USE_GDC)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=mask, other=0.0)
    pdl_launch_dependents(USE_GDC)
    packed, sf = nvfp4_quantize_tile(x.to(tl.float32), gs, BLOCK_M, BLOCK_K)
    store_nvfp4_tile(q_ptr, sf_ptr, packed, sf, rows, pid_k, M, K, stride_qm, SWIZZLE, BLOCK_K)


def quantize_config(m: int, k: int, swizzle: bool, interpreted: bool) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_K, num_warps) for an [m, k] quantization.

    GPU: ~4K elements per program along K-contiguous rows (8 KB of bf16 in, 2.25 KB out).
    Interpreter: up to 64K elements per program (per-op Python overhead dominates there).
    """
    kp = ceil_div(k // 16, 4) * 64 if swizzle else k
    mp = ceil_div(m, 128) * 128 if swizzle else m
    if interpreted:
        block_k = min(next_pow2(kp), 2048)
        return min(next_pow2(mp), max(1, 65536 // block_k)), block_k, 4
    block_k = min(next_pow2(kp), 512)
    block_m = min(next_pow2(mp), max(1, 4096 // block_k))
    return block_m, block_k, 4


def quantize_nvfp4_triton(
    x: torch.Tensor,
    input_scale: torch.Tensor,
    swizzle: bool = True,
    *,
    pdl: bool | None = None,
    config: tuple[int, int, int] | None = None,
    kernel=None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x [M, K] (bf16/fp16/fp32, K % 16 == 0) with the static ``input_scale``.

    Returns (packed uint8 [M, K/2], scales float8_e4m3fn): 1-D 128x4-swizzled
    (``blocked_numel(M, K/16)`` bytes) when ``swizzle``, else linear [M, K/16].
    ``pdl``: launch with programmatic dependent launch (default: on for sm_90+).
    ``kernel``: the jitted kernel to launch instead of :func:`quantize_nvfp4_kernel`.
    ``out``: preallocated (packed, scales) to write (e.g. static buffers for CUDA graphs); every
    byte of both, swizzle padding included, is overwritten.
    """
    kernel = kernel or quantize_nvfp4_kernel
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"nvgemm quantize_nvfp4: x must be bfloat16, float16 or float32, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"nvgemm quantize_nvfp4: x must be 2-D [M, K], got shape {tuple(x.shape)}")
    m, k = x.shape
    if k % NVFP4.block_size:
        raise ValueError(f"nvgemm quantize_nvfp4: K must be a multiple of 16, got K={k}")
    if input_scale.dtype != torch.float32 or input_scale.numel() != 1:
        raise ValueError(
            f"nvgemm quantize_nvfp4: input_scale must be a float32 scalar tensor, got "
            f"{input_scale.dtype} {tuple(input_scale.shape)}"
        )
    dev = check_device(kernel, x, op="nvgemm quantize_nvfp4")
    input_scale = input_scale.to(dev).reshape(1)
    if x.stride(-1) != 1:
        x = x.contiguous()
    scale_shape = (blocked_numel(m, k // 16),) if swizzle else (m, k // 16)
    if out is None:
        packed = torch.empty((m, k // 2), dtype=torch.uint8, device=dev)
        scale = torch.empty(scale_shape, dtype=torch.uint8, device=dev)
    else:
        packed, scale = out
        if packed.dtype != torch.uint8 or tuple(packed.shape) != (m, k // 2) or packed.stride(-1) != 1:
            raise ValueError(f"nvgemm quantize_nvfp4: out[0] must be uint8 {(m, k // 2)} with unit K stride")
        if scale.element_size() != 1 or tuple(scale.shape) != scale_shape or not scale.is_contiguous():
            raise ValueError(f"nvgemm quantize_nvfp4: out[1] must be a contiguous 1-byte tensor of shape {scale_shape}")
        check_device(kernel, x, packed, scale, op="nvgemm quantize_nvfp4")
        scale = scale.view(torch.uint8)
    if scale.numel() == 0:
        return packed, scale.view(torch.float8_e4m3fn)
    block_m, block_k, num_warps = config or quantize_config(m, k, swizzle, is_interpreted(kernel))
    mp = ceil_div(m, 128) * 128 if swizzle else m
    kp = ceil_div(k // 16, 4) * 64 if swizzle else k
    grid = (ceil_div(mp, block_m), ceil_div(kp, block_k))
    gdc = use_gdc(kernel, dev, pdl)
    if prebindable(kernel):  # compiled Triton: the problem's pre-bound launch (only the pointers change)
        quantize_launch(kernel, grid, m, k, x.stride(0), packed.stride(0), swizzle, gdc, block_m, block_k,
                        num_warps)(x, input_scale, packed, scale)
    else:  # the interpreter, a kernel stand-in (the PTX emulator's)
        kernel[grid](
            x, input_scale, packed, scale, m, k, x.stride(0), packed.stride(0),
            SWIZZLE=swizzle, USE_GDC=gdc, BLOCK_M=block_m, BLOCK_K=block_k,
            num_warps=num_warps, **launch_options(gdc),
        )
    return packed, scale.view(torch.float8_e4m3fn)


@functools.lru_cache(maxsize=512)
def quantize_launch(kernel, grid: tuple, m: int, k: int, stride_xm: int, stride_qm: int, swizzle: bool, gdc: bool,
                    block_m: int, block_k: int, num_warps: int) -> PreboundLaunch:
    """The pre-bound ``kernel[grid](x, input_scale, packed, scale, m, k, stride_xm, stride_qm, SWIZZLE=...,
    USE_GDC=..., BLOCK_M=..., BLOCK_K=..., num_warps=..., launch_pdl=..., enable_fp_fusion=False)`` of one
    problem: called with the four tensors. Bounded (least recently used problems drop out)."""
    return PreboundLaunch(
        kernel, grid, (None, None, None, None, m, k, stride_xm, stride_qm), (0, 1, 2, 3),
        dict(SWIZZLE=swizzle, USE_GDC=gdc, BLOCK_M=block_m, BLOCK_K=block_k, num_warps=num_warps,
             **launch_options(gdc)))


def bind_quantize_nvfp4(m: int, k: int, dtype: torch.dtype, device: torch.device, input_scale: torch.Tensor, *,
                        pdl: bool | None = None, kernel=None):
    """The activation quantizer of one bound call shape: ``quantize(x2, input_scale, swizzle=True) -> (packed,
    scales)`` for x2 [m, k] of ``dtype`` on ``device`` with contiguous rows and this ``input_scale`` tensor
    (a fp32 scalar on ``device``), swizzled scales -- what a bound W4A4 launcher calls per step.

    Decided here once: the checks, the block sizes, the grid, PDL and the problem's pre-bound launch
    (:func:`quantize_launch`, shared with :func:`quantize_nvfp4_triton`); a call compares x2's dtype, shape,
    strides and device and the scale tensor's identity with the bound ones, allocates the two outputs and
    launches. Any other call (or a kernel that is not pre-bindable) is :func:`quantize_nvfp4_triton`'s."""
    kernel = kernel or quantize_nvfp4_kernel
    general = functools.partial(quantize_nvfp4_triton, pdl=pdl, kernel=kernel)
    if (not prebindable(kernel) or m <= 0 or k <= 0 or k % NVFP4.block_size
            or dtype not in (torch.bfloat16, torch.float16, torch.float32)
            or input_scale.dtype != torch.float32 or input_scale.numel() != 1 or input_scale.device != device):
        return general  # its checks name the problem
    block_m, block_k, num_warps = quantize_config(m, k, True, False)
    grid = (ceil_div(ceil_div(m, 128) * 128, block_m), ceil_div(ceil_div(k // 16, 4) * 64, block_k))
    launch = quantize_launch(kernel, grid, m, k, k, k // 2, True, use_gdc(kernel, device, pdl), block_m, block_k,
                             num_warps)
    gs = input_scale.reshape(1)
    shape, stride = torch.Size((m, k)), (k, 1)
    packed_shape, scale_shape = (m, k // 2), (blocked_numel(m, k // 16),)
    empty, u8, e4m3 = torch.empty, torch.uint8, torch.float8_e4m3fn

    def quantize(x2: torch.Tensor, scale_in: torch.Tensor, swizzle: bool = True):
        if (scale_in is not input_scale or swizzle is not True or x2.dtype is not dtype or x2.shape != shape
                or x2.stride() != stride or x2.device != device):
            return general(x2, scale_in, swizzle)
        packed = empty(packed_shape, dtype=u8, device=device)
        scale = empty(scale_shape, dtype=u8, device=device)
        launch(x2, gs, packed, scale)
        return packed, scale.view(e4m3)

    return quantize


@triton.jit
def qdq_nvfp4_kernel(
    x_ptr, gs_ptr, y_ptr,
    M, K, stride_xm, stride_ym,
    USE_GDC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """x [M, K] -> ``E2M1[q] * float(sf)`` in x's dtype (the W4A4 activation of a Hopper W4A16 GEMM),
    one pass: the codes and scales are :func:`quantize_nvfp4_kernel`'s, never stored."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    gs = tl.load(gs_ptr)
    pdl_wait(USE_GDC)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=mask, other=0.0)
    pdl_launch_dependents(USE_GDC)
    y = nvfp4_qdq_tile(x.to(tl.float32), gs, BLOCK_M, BLOCK_K)  # exact in bf16 / fp16
    tl.store(y_ptr + rows[:, None].to(tl.int64) * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def qdq_nvfp4_triton(x: torch.Tensor, input_scale: torch.Tensor, *, out: torch.Tensor | None = None,
                     pdl: bool | None = None, kernel=None) -> torch.Tensor:
    """Quantize-dequantize x [M, K] (bf16/fp16, K % 16 == 0) with the static ``input_scale``:
    ``E2M1[q_x] * s_x`` in x's dtype, bit-exact with ``nvgemm.core.formats.quantize_activation`` +
    ``dequantize`` (no global scale; E2M1 x e4m3 is exact in bf16 and fp16). One kernel, no
    intermediate tensors; ``out`` (same shape and dtype, unit K stride) is written if given."""
    kernel = kernel or qdq_nvfp4_kernel
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"nvgemm qdq_nvfp4: x must be bfloat16 or float16, got {x.dtype}")
    if x.dim() != 2 or x.shape[1] % NVFP4.block_size:
        raise ValueError(f"nvgemm qdq_nvfp4: x must be [M, K] with K % 16 == 0, got shape {tuple(x.shape)}")
    if input_scale.dtype != torch.float32 or input_scale.numel() != 1:
        raise ValueError(f"nvgemm qdq_nvfp4: input_scale must be a float32 scalar tensor, got "
                         f"{input_scale.dtype} {tuple(input_scale.shape)}")
    dev = check_device(kernel, x, op="nvgemm qdq_nvfp4")
    m, k = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or out.dtype != x.dtype or out.stride(-1) != 1:
        raise ValueError(f"nvgemm qdq_nvfp4: out must be {x.dtype} {tuple(x.shape)} with unit K stride")
    if m == 0:
        return out
    block_m, block_k, num_warps = quantize_config(m, k, False, is_interpreted(kernel))
    grid = (ceil_div(m, block_m), ceil_div(k, block_k))
    gdc = use_gdc(kernel, dev, pdl)
    kernel[grid](x, input_scale.to(dev).reshape(1), out, m, k, x.stride(0), out.stride(0),
                 USE_GDC=gdc, BLOCK_M=block_m, BLOCK_K=block_k, num_warps=num_warps, **launch_options(gdc))
    return out
