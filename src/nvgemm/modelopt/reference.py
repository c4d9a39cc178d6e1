"""A checkpoint's dequantize-and-matmul reference model (what the exported numbers mean).

Every quantized linear becomes :class:`DequantLinear`: the weight is dequantized once to fp32,
W4A4 activations are quantize-dequantized with the static ``input_scale`` (nvgemm.formats'
convention), the product is an fp32 matmul times alpha plus bias, rounded to the activation dtype. It shares only nvgemm.formats (validated byte-exact against
ModelOpt) with the nvgemm model; it does not use NVFP4Linear, the op, the swizzle or any kernel.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..formats import dequantize, quantize_activation


class DequantLinear(nn.Module):
    """``(deq(x) @ deq(W).T) * alpha + bias`` in fp32, rounded once to x's dtype.

    ``deq(W) = E2M1 * block scale`` (exact), ``deq(x)`` likewise for W4A4 (quantized with the
    static input_scale) or x itself for W4A16, and ``alpha = input_scale * weight_scale_2``.
    """

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
                 input_scale: torch.Tensor | None, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("w", dequantize(weight, weight_scale))
        self.register_buffer("alpha", weight_scale_2.float() * (1.0 if input_scale is None else input_scale.float()))
        self.register_buffer("input_scale", input_scale)
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.input_scale is None:
            xf = x2.float()
        else:
            xf = dequantize(*quantize_activation(x2, self.input_scale))
        y = (xf @ self.w.t()) * self.alpha
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).reshape(*shape[:-1], y.shape[-1])


def dequant_linear_of(mod) -> DequantLinear:
    from ..formats import NVFP4, from_blocked

    weight, blocked = mod.checkpoint_layout()  # re-encoded when the layer is held in the sm90 layout
    scale = from_blocked(blocked, mod.out_features, mod.in_features // NVFP4.block_size)
    return DequantLinear(weight, scale, mod.weight_scale_2, mod.input_scale, mod.bias)


def build_reference_model(model_with_nvfp4: nn.Module) -> nn.Module:
    """Copy of a loaded nvgemm model with every NVFP4Linear replaced by a DequantLinear."""
    import copy

    from ..linear import NVFP4Linear

    ref = copy.deepcopy(model_with_nvfp4)
    for name, mod in list(ref.named_modules()):
        if isinstance(mod, NVFP4Linear):
            parent, _, child = name.rpartition(".")
            setattr(ref.get_submodule(parent) if parent else ref, child, dequant_linear_of(mod))
    return ref


def load_reference_model(ckpt: str | Path, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    from .checkpoint import load_modelopt_checkpoint

    return build_reference_model(load_modelopt_checkpoint(ckpt, dtype=dtype))
