"""Pure-torch references of nvgemm's fused NVFP4 quantizers (CPU and CUDA; no triton import).

Each fused kernel computes exactly what the *unfused* decode chain materialises, then quantizes
it with :func:`nvgemm.core.formats.quantize_activation`:

* ``rmsnorm_ref`` — Llama/Qwen RMSNorm as Hugging Face computes it:
  ``h = bf16(x * rsqrt(mean(x**2) + eps))`` (fp32 math, one rounding to x's dtype), then
  ``y = weight * h`` with torch promotion (weight in x's dtype: the fp32 product rounded once to
  that dtype; fp32 weight: an fp32 output). Gemma's ``(1 + w)`` variant is not covered.
* ``add_rmsnorm_ref`` — ``r = x + residual`` (fp32 add, rounded to the dtype: the new residual
  stream) followed by ``rmsnorm_ref(r)``.
* ``silu_mul_ref`` — ``y = dtype(silu(gate) * up)`` with gate = x[:, :I], up = x[:, I:]; fp32
  math, one rounding (vLLM's ``silu_and_mul``).
* ``rope_kv_write_ref`` — the rotary embedding of q and k from a fused qkv row (Llama / NeoX
  ``rotate_half`` form, cos / sin taken from tables at each token's position) and the write of k and
  v into a static KV cache: ``x * cos + rotate_half(x) * sin`` in fp32, op by op, one rounding to
  x's dtype (what ``nvgemm::rope_kv_write``'s kernel computes, bit for bit).

The quantizer input ``y`` is what a fused kernel rounds once to the output dtype; the only
thing a kernel may compute differently is the fp32 reduction order of ``mean(x**2)`` and the
ulp-level accuracy of ``rsqrt``/``exp`` — tests bound that separately and then require the
codes/scales to be byte-identical to quantizing the kernel's own ``y``.
"""

from __future__ import annotations

import torch

from nvgemm.core.formats import quantize_activation, to_blocked

__all__ = [
    "quantize_ref",
    "rmsnorm_ref",
    "add_rmsnorm_ref",
    "silu_mul_ref",
    "rmsnorm_quantize_ref",
    "add_rmsnorm_quantize_ref",
    "silu_mul_quantize_ref",
    "check_fused_args",
    "check_rope_args",
    "rope_ref",
    "rope_kv_write_ref",
]

X_DTYPES = (torch.bfloat16, torch.float16)


def _name(op: str) -> str:
    return f"nvgemm.{op}"


def check_fused_args(op: str, x: torch.Tensor, input_scale: torch.Tensor, *, weight=None, residual=None,
                     gated: bool = False) -> None:
    """Validate a fused-quantizer call; raise naming the problem."""
    if x.dtype not in X_DTYPES:
        raise TypeError(f"{_name(op)}: x must be bfloat16 or float16, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{_name(op)}: x must be 2-D [M, K], got shape {tuple(x.shape)}")
    k = x.shape[1]
    if gated:
        if k % 32:
            raise ValueError(
                f"{_name(op)}: x is [M, 2*I] (gate | up) and I must be a multiple of 16, got 2*I={k}"
            )
    elif k % 16:
        raise ValueError(f"{_name(op)}: K must be a multiple of 16, got K={k}")
    if input_scale.dtype != torch.float32 or input_scale.numel() != 1:
        raise ValueError(
            f"{_name(op)}: input_scale must be a float32 scalar tensor, got {input_scale.dtype} "
            f"{tuple(input_scale.shape)}"
        )
    if weight is not None:
        if tuple(weight.shape) != (k,):
            raise ValueError(f"{_name(op)}: weight must have shape ({k},), got {tuple(weight.shape)}")
        if weight.dtype not in (x.dtype, torch.float32):
            raise TypeError(f"{_name(op)}: weight must be {x.dtype} or float32, got {weight.dtype}")
        if weight.device != x.device:
            raise ValueError(f"{_name(op)}: weight is on {weight.device} but x is on {x.device}")
    if residual is not None:
        if tuple(residual.shape) != tuple(x.shape) or residual.dtype != x.dtype:
            raise ValueError(
                f"{_name(op)}: residual must match x ({x.dtype} {tuple(x.shape)}), got "
                f"{residual.dtype} {tuple(residual.shape)}"
            )
        if residual.device != x.device:
            raise ValueError(f"{_name(op)}: residual is on {residual.device} but x is on {x.device}")


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face LlamaRMSNorm: ``weight * (x * rsqrt(mean(x**2) + eps)).to(x.dtype)``."""
    xf = x.float()
    var = xf.pow(2).mean(-1, keepdim=True)
    h = (xf * torch.rsqrt(var + eps)).to(x.dtype)
    return weight * h


def add_rmsnorm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """(rmsnorm_ref(r), r) with the new residual stream ``r = x + residual`` in x's dtype."""
    r = (x.float() + residual.float()).to(x.dtype)
    return rmsnorm_ref(r, weight, eps), r


def silu_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """``(silu(gate) * up).to(x.dtype)`` with fp32 math; x = [gate | up] along the last dim."""
    i = x.shape[-1] // 2
    g, u = x[..., :i].float(), x[..., i:].float()
    return (torch.nn.functional.silu(g) * u).to(x.dtype)


def quantize_ref(y: torch.Tensor, input_scale: torch.Tensor, swizzle: bool = True):
    """``nvgemm::quantize_nvfp4``'s reference: (packed codes [M, K/2], e4m3 scales: the flat 128x4
    swizzled bytes when ``swizzle``, else linear [M, K/16])."""
    packed, scale = quantize_activation(y, input_scale.to(y.device))
    return packed, (to_blocked(scale).reshape(-1) if swizzle else scale)


def rmsnorm_quantize_ref(x, weight, input_scale, eps: float = 1e-6, swizzle: bool = True):
    check_fused_args("rmsnorm_quantize_nvfp4", x, input_scale, weight=weight)
    return quantize_ref(rmsnorm_ref(x, weight, eps), input_scale, swizzle)


def add_rmsnorm_quantize_ref(x, residual, weight, input_scale, eps: float = 1e-6, swizzle: bool = True):
    check_fused_args("add_rmsnorm_quantize_nvfp4", x, input_scale, weight=weight, residual=residual)
    y, r = add_rmsnorm_ref(x, residual, weight, eps)
    packed, scale = quantize_ref(y, input_scale, swizzle)
    return packed, scale, r


def silu_mul_quantize_ref(x, input_scale, swizzle: bool = True):
    check_fused_args("silu_mul_quantize_nvfp4", x, input_scale, gated=True)
    return quantize_ref(silu_mul_ref(x), input_scale, swizzle)


def check_rope_args(qkv: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor, positions: torch.Tensor,
                    k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int, num_kv_heads: int) -> int:
    """Validate a ``rope_kv_write`` call (shapes, dtypes, devices; not the position values); returns head_dim.

    qkv [T, (Hq + 2 Hkv) * D] bf16/fp16 (last dim contiguous); cos / sin tables [P, D] (fp32 or x's dtype, last
    dim contiguous); positions [T] int32/int64; caches [1, Hkv, S, D] of x's dtype (last dim contiguous)."""
    op = _name("rope_kv_write")
    if qkv.dtype not in X_DTYPES:
        raise TypeError(f"{op}: qkv must be bfloat16 or float16, got {qkv.dtype}")
    if qkv.dim() != 2:
        raise ValueError(f"{op}: qkv must be 2-D [tokens, (heads + 2 * kv_heads) * head_dim], got shape "
                         f"{tuple(qkv.shape)}")
    if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"{op}: num_heads ({num_heads}) must be a positive multiple of num_kv_heads "
                         f"({num_kv_heads})")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.dim() != 4 or c.shape[0] != 1 or c.shape[1] != num_kv_heads:
            raise ValueError(f"{op}: {name} must be [1, num_kv_heads={num_kv_heads}, cache_len, head_dim], got "
                             f"shape {tuple(c.shape)}")
        if c.dtype != qkv.dtype:
            raise TypeError(f"{op}: {name} must have qkv's dtype {qkv.dtype}, got {c.dtype}")
        if c.stride(-1) != 1:
            raise ValueError(f"{op}: {name}'s last dim must be contiguous, got strides {tuple(c.stride())}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"{op}: k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in shape")
    d = k_cache.shape[-1]
    if d % 2 or d < 2:
        raise ValueError(f"{op}: head_dim must be even (rotate_half pairs its halves), got {d}")
    width = (num_heads + 2 * num_kv_heads) * d
    if qkv.shape[1] != width:
        raise ValueError(f"{op}: qkv has {qkv.shape[1]} columns but (num_heads + 2 * num_kv_heads) * head_dim = "
                         f"({num_heads} + 2 * {num_kv_heads}) * {d} = {width}")
    if qkv.stride(-1) != 1:
        raise ValueError(f"{op}: qkv's last dim must be contiguous, got strides {tuple(qkv.stride())}")
    for name, t in (("cos_cache", cos_cache), ("sin_cache", sin_cache)):
        if t.dim() != 2 or t.shape[1] != d:
            raise ValueError(f"{op}: {name} must be [max_positions, head_dim={d}], got shape {tuple(t.shape)}")
        if t.dtype not in (torch.float32, qkv.dtype):
            raise TypeError(f"{op}: {name} must be float32 or qkv's dtype {qkv.dtype}, got {t.dtype}")
        if t.stride(-1) != 1:
            raise ValueError(f"{op}: {name}'s last dim must be contiguous, got strides {tuple(t.stride())}")
    if cos_cache.shape != sin_cache.shape:
        raise ValueError(f"{op}: cos_cache {tuple(cos_cache.shape)} and sin_cache {tuple(sin_cache.shape)} differ")
    if positions.dim() != 1 or positions.shape[0] != qkv.shape[0]:
        raise ValueError(f"{op}: positions must be 1-D with one entry per token ({qkv.shape[0]}), got shape "
                         f"{tuple(positions.shape)}")
    if positions.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: positions must be int32 or int64, got {positions.dtype}")
    for name, t in (("cos_cache", cos_cache), ("sin_cache", sin_cache), ("positions", positions),
                    ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.device != qkv.device:
            raise ValueError(f"{op}: {name} is on {t.device} but qkv is on {qkv.device}")
    return d


def check_rope_positions(positions: torch.Tensor, cos_cache: torch.Tensor, k_cache: torch.Tensor) -> None:
    """Every position must index a row of the tables and a slot of the cache, each slot once. Reads the values: a host sync on
    CUDA, so the caller skips it while a CUDA graph is captured (the kernel then masks an out-of-range token:
    no write, no read outside the tensors)."""
    if not positions.numel():
        return
    lo, hi = int(positions.min()), int(positions.max())
    limit = min(cos_cache.shape[0], k_cache.shape[2])
    if lo < 0 or hi >= limit:
        raise ValueError(f"nvgemm.rope_kv_write: positions out of range: values in [{lo}, {hi}] but the cos/sin "
                         f"tables hold {cos_cache.shape[0]} positions and the KV cache {k_cache.shape[2]} slots "
                         f"(valid: 0..{limit - 1})")
    srt = positions.sort().values
    if bool((srt[1:] == srt[:-1]).any()):
        raise ValueError("nvgemm.rope_kv_write: positions must be distinct (two tokens would write one cache slot)")


def rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` in fp32 (each op rounded in fp32), rounded once to x's dtype;
    ``rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])``; cos / sin broadcast against x."""
    xf, h = x.float(), x.shape[-1] // 2
    rot = torch.cat((-xf[..., h:], xf[..., :h]), -1)
    return (xf * cos.float() + rot * sin.float()).to(x.dtype)


def rope_kv_write_ref(qkv, cos_cache, sin_cache, positions, k_cache, v_cache, num_heads: int,
                      num_kv_heads: int) -> torch.Tensor:
    """``nvgemm::rope_kv_write``'s reference: writes roped k and v at ``positions`` into the caches (in place),
    returns roped q [T, num_heads, D]."""
    d = check_rope_args(qkv, cos_cache, sin_cache, positions, k_cache, v_cache, num_heads, num_kv_heads)
    check_rope_positions(positions, cos_cache, k_cache)
    t = qkv.shape[0]
    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], -1)
    pos = positions.long()
    cos, sin = cos_cache[pos][:, None, :], sin_cache[pos][:, None, :]  # [T, 1, D]
    q = rope_ref(q.reshape(t, num_heads, d), cos, sin)
    k = rope_ref(k.reshape(t, num_kv_heads, d), cos, sin)
    k_cache[0, :, pos] = k.transpose(0, 1)
    v_cache[0, :, pos] = v.reshape(t, num_kv_heads, d).transpose(0, 1)
    return q.contiguous()
