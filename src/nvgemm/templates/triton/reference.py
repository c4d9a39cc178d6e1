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
