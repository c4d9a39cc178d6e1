"""A checkpoint's dequantize-and-matmul reference model (what the exported numbers mean).

Every quantized MoE experts module becomes :class:`DequantExperts`; every quantized linear becomes :class:`DequantLinear`: the weight is dequantized once to fp32,
W4A4 activations are quantize-dequantized with the static ``input_scale`` (nvgemm.core.formats'
convention), the product is an fp32 matmul times alpha plus bias, rounded to the activation dtype. It shares only nvgemm.core.formats (validated byte-exact against
ModelOpt) with the nvgemm model; it does not use NVFP4Linear, the op, the swizzle or any kernel.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from nvgemm.core.formats import NVFP4, dequantize, from_blocked, quantize_activation
from nvgemm.core.validation import alpha_of
from nvgemm.epilogues import apply_activation_ref
from nvgemm.integrations.modelopt.checkpoint import load_modelopt_checkpoint
from nvgemm.nn.experts import NVFP4Experts
from nvgemm.nn.linear import NVFP4Linear


class DequantLinear(nn.Module):
    """``(deq(x) @ deq(W).T) * alpha + bias`` in fp32, rounded once to x's dtype.

    ``deq(W) = E2M1 * block scale`` (exact), ``deq(x)`` likewise for W4A4 (quantized with the
    static input_scale) or x itself for W4A16, and ``alpha = input_scale * weight_scale_2``.
    """

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
                 input_scale: torch.Tensor | None, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("w", dequantize(weight, weight_scale))
        self.register_buffer("alpha", alpha_of(weight_scale_2, input_scale))
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


class DequantExperts(nn.Module):
    """Routed experts in fp32 from dequantized weights (the MoE numerics contract, written out):

    per (token, slot) with local expert e: ``xin`` (times the weight first, rounded, when the weight
    is on the input) is fake-quantized with the expert's input scale (W4A4), ``h = act(xin @ W13[e].T *
    in13[e])`` rounded to x's dtype, fake-quantized with ``in2[e]``, ``y = h @ W2[e].T * in2[e]`` in fp32,
    ``out = sum_slots w * y (+ shared_out) (+ residual)`` in fp32, rounded once. ``W = E2M1 * block
    scale * weight_scale_2`` is dequantized once; no op, swizzle-free weights, no kernel.
    """

    def __init__(self, mod):
        super().__init__()
        w13, w2 = mod.dequantized()
        self.register_buffer("w13", w13)
        self.register_buffer("w2", w2)
        self.register_buffer("in13", mod.w13_input_scale)
        self.register_buffer("in2", mod.w2_input_scale)
        self.register_buffer("expert_map", mod.expert_map)
        self.activation, self.router_weight_on_input = mod.activation, mod.router_weight_on_input

    @staticmethod
    def _fq(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        return x.float() if scale is None else dequantize(*quantize_activation(x, scale))

    def forward(self, x, topk_ids, topk_weights, shared_out=None, residual=None):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        k = topk_ids.shape[-1]
        ids, wts = topk_ids.reshape(-1, k).long(), topk_weights.reshape(-1, k).float()
        if self.expert_map is not None:
            ids = torch.where(ids < 0, ids, self.expert_map.long()[ids.clamp_min(0)])
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for s in range(k):
            for e in ids[:, s].unique().tolist():
                if e < 0:
                    continue
                rows = (ids[:, s] == e).nonzero().squeeze(1)
                xin, w = x[rows], wts[rows, s : s + 1]
                if self.router_weight_on_input:
                    xin, w = (xin.float() * w).to(x.dtype), torch.ones_like(w)
                a = self._fq(xin, None if self.in13 is None else self.in13[e]) @ self.w13[e].t()
                a = a * (1.0 if self.in13 is None else self.in13[e])
                h = (torch.relu(a).square() if self.activation == "relu2" else
                     apply_activation_ref(a, self.activation)).to(x.dtype)
                y = (self._fq(h, None if self.in2 is None else self.in2[e]) @ self.w2[e].t())
                y = y * (1.0 if self.in2 is None else self.in2[e])
                out[rows] += w * y
        for extra in (shared_out, residual):
            if extra is not None:
                out = out + extra.reshape(out.shape).float()
        return out.to(x.dtype).reshape(shape)


def dequant_linear_of(mod) -> DequantLinear:
    weight, blocked = mod.checkpoint_layout()  # re-encoded when the layer is held in the sm90 layout
    scale = from_blocked(blocked, mod.out_features, mod.in_features // NVFP4.block_size)
    return DequantLinear(weight, scale, mod.weight_scale_2, mod.input_scale, mod.bias)


def build_reference_model(model_with_nvfp4: nn.Module) -> nn.Module:
    """Copy of a loaded nvgemm model with every NVFP4Linear replaced by a DequantLinear."""
    import copy

    ref = copy.deepcopy(model_with_nvfp4)
    for name, mod in list(ref.named_modules()):
        if isinstance(mod, (NVFP4Linear, NVFP4Experts)):
            parent, _, child = name.rpartition(".")
            new = dequant_linear_of(mod) if isinstance(mod, NVFP4Linear) else DequantExperts(mod)
            setattr(ref.get_submodule(parent) if parent else ref, child, new)
    return ref


def load_reference_model(ckpt: str | Path, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    return build_reference_model(load_modelopt_checkpoint(ckpt, dtype=dtype))
