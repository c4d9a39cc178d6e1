"""Fused rotary embedding + KV-cache write for the decode step (one launch after the qkv GEMM).

``rope_kv_write_triton(qkv, cos_cache, sin_cache, positions, k_cache, v_cache, num_heads, num_kv_heads)``
reads the fused qkv GEMM output ``[T, (Hq + 2 Hkv) * D]``, and for each token ``t`` at position
``p = positions[t]``:

* q heads: ``x * cos[p] + rotate_half(x) * sin[p]`` -> the returned q ``[T, Hq, D]``;
* k heads: the same rotation -> ``k_cache[0, h, p, :]``;
* v heads: copied -> ``v_cache[0, h, p, :]``.

``rotate_half(x) = cat(-x[D/2:], x[:D/2])`` (Llama / NeoX form; the cos / sin tables hold full-width rows
``cat(f, f)`` with any rope scaling -- Llama-3.1's included -- already folded in). Numerics: fp32 math, each
multiply and the add rounded in fp32 (compiled with ``enable_fp_fusion=False``: no FMA), one RNE rounding to
x's dtype -- :func:`nvgemm.templates.triton.reference.rope_kv_write_ref`, bit for bit.

One program per (token, head) of the ``Hq + 2 Hkv`` heads; a token whose position is outside the tables or
the cache (only possible under CUDA-graph capture, where the host skips its value check) reads nothing and
writes no cache slot (its q rows are zero). PDL: ``gdc_wait`` before the first load (positions may come from a kernel still in the chain),
``gdc_launch_dependents`` after the last.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nvgemm.templates.triton._common import (
    cast_to_kind,
    check_device,
    dtype_kind,
    launch_options,
    next_pow2,
    pdl_launch_dependents,
    pdl_wait,
    use_gdc,
)
from nvgemm.templates.triton.reference import check_rope_args

__all__ = ["launch_bytes", "rope_kv_write_kernel", "rope_kv_write_triton"]


@triton.jit
def rope_kv_write_kernel(
    qkv_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_ptr, v_ptr,
    stride_xt, stride_ct, stride_st, stride_qt, stride_kh, stride_ks, stride_vh, stride_vs,
    HQ, HKV, D, LIMIT,
    USE_GDC: tl.constexpr, X_KIND: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)  # q heads [0, HQ), k heads [HQ, HQ + HKV), v heads [HQ + HKV, HQ + 2 HKV)
    half = D // 2
    d = tl.arange(0, BLOCK_D)
    pdl_wait(USE_GDC)
    p = tl.load(pos_ptr + t).to(tl.int64)
    ok = (p >= 0) & (p < LIMIT)
    dm = d < D * ok.to(tl.int32)  # an out-of-range token: nothing
    row = qkv_ptr + t.to(tl.int64) * stride_xt + h * D
    xv = tl.load(row + d, mask=dm, other=0.0)
    if h < HQ + HKV:
        x = xv.to(tl.float32)
        partner = tl.where(d < half, d + half, d - half)
        xr = tl.load(row + partner, mask=dm, other=0.0).to(tl.float32)
        c = tl.load(cos_ptr + p * stride_ct + d, mask=dm, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + p * stride_st + d, mask=dm, other=0.0).to(tl.float32)
        pdl_launch_dependents(USE_GDC)
        y = x * c + tl.where(d < half, -xr, xr) * s
        if h < HQ:
            tl.store(q_ptr + t.to(tl.int64) * stride_qt + h * D + d, cast_to_kind(y, X_KIND), mask=d < D)
        else:
            tl.store(k_ptr + (h - HQ) * stride_kh + p * stride_ks + d, cast_to_kind(y, X_KIND), mask=dm)
    else:
        pdl_launch_dependents(USE_GDC)
        tl.store(v_ptr + (h - HQ - HKV) * stride_vh + p * stride_vs + d, xv, mask=dm)


def rope_kv_write_triton(qkv, cos_cache, sin_cache, positions, k_cache, v_cache, num_heads: int,
                         num_kv_heads: int, *, pdl=None, kernel=None) -> torch.Tensor:
    """RoPE q and k of ``qkv``, write k and v into the caches at ``positions`` (in place); returns q
    ``[T, num_heads, D]``. Arguments are checked (:func:`check_rope_args`); position values are the caller's
    (the ``nvgemm::rope_kv_write`` op checks them outside CUDA-graph capture)."""
    kernel = kernel or rope_kv_write_kernel
    d = check_rope_args(qkv, cos_cache, sin_cache, positions, k_cache, v_cache, num_heads, num_kv_heads)
    dev = check_device(kernel, qkv, cos_cache, sin_cache, positions, k_cache, v_cache, op="nvgemm.rope_kv_write")
    t = qkv.shape[0]
    q = torch.empty((t, num_heads, d), dtype=qkv.dtype, device=dev)
    if t:
        gdc = use_gdc(kernel, dev, pdl)
        kernel[(t, num_heads + 2 * num_kv_heads)](
            qkv, cos_cache, sin_cache, positions, q, k_cache, v_cache,
            qkv.stride(0), cos_cache.stride(0), sin_cache.stride(0), q.stride(0),
            k_cache.stride(1), k_cache.stride(2), v_cache.stride(1), v_cache.stride(2),
            num_heads, num_kv_heads, d, min(cos_cache.shape[0], k_cache.shape[2]),
            USE_GDC=gdc, X_KIND=dtype_kind(qkv.dtype), BLOCK_D=next_pow2(d),
            num_warps=1 if d <= 128 else 2, **launch_options(gdc),
        )
    return q


def launch_bytes(kernel_name: str, args) -> int | None:
    """Bytes one ``rope_kv_write_kernel`` launch moves (the performance model's input): the qkv rows, q, the
    cos / sin rows and positions read at each token, and the k / v slots written -- not the whole cache.
    ``args``: the kernel's positional launch arguments. None for another kernel."""
    if kernel_name != "rope_kv_write_kernel":
        return None
    qkv, cos, _sin, pos, q, k_cache = args[:6]
    t, d = qkv.shape[0], k_cache.shape[-1]
    hkv = k_cache.shape[1]
    return (qkv.shape[1] * qkv.element_size() + q[0].numel() * q.element_size() + 2 * d * cos.element_size()
            + pos.element_size() + 2 * hkv * d * k_cache.element_size()) * t
