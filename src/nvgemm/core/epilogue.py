"""Epilogue specs and their torch references.

An epilogue turns the GEMM's fp32 accumulator into the layer's output. nvgemm applies its
parts in one fixed order, **all in fp32, with a single rounding at the final cast**:

    y = acc * alpha             alpha: fp32 scalar (input_scale * weight_scale_2), or a
                                per-output-column fp32 vector (fused shards, unequal scales)
    y = y + bias                bias upcast to fp32
    y = act(y)                  none | silu | gelu_tanh | silu_mul (gated: y[:, :N/2] are the
                                gates, y[:, N/2:] the ups; output has N/2 columns)
    y = y + residual            residual upcast to fp32
    out = y.to(out_dtype)       round to nearest even, once

This deliberately differs from PyTorch 2.15's in-tree fold, which rounds the accumulator to
bf16 first and multiplies by bf16(alpha) (two roundings; up to ~1 bf16 ulp apart from ours).
Every nvgemm kernel (CuTeDSL, Triton) and the emulated op implement exactly this order, and
:func:`epilogue_ref` is the reference they are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ACTIVATIONS = ("none", "silu", "gelu_tanh", "silu_mul")
ALPHA_KINDS = ("none", "scalar", "vector")
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class EpilogueSpec:
    """Frozen host-side description of an epilogue; it is part of every kernel's cache key."""

    alpha: str = "scalar"
    bias: bool = False
    activation: str = "none"
    residual: bool = False
    out_dtype: torch.dtype = torch.bfloat16
    #: fused NVFP4 requant (sm_100a swap-AB only): the rounded silu_mul output is quantized for the
    #: next W4A4 layer in the epilogue (packed codes + swizzled scales); see nvgemm.epilogues.requant
    out_quant: bool = False

    def __post_init__(self):
        if self.alpha not in ALPHA_KINDS:
            raise ValueError(f"alpha must be one of {ALPHA_KINDS}, got {self.alpha!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.out_dtype not in OUT_DTYPES:
            raise ValueError(f"out_dtype must be one of {OUT_DTYPES}, got {self.out_dtype}")
        if self.out_quant and (self.activation != "silu_mul" or self.residual or self.out_dtype == torch.float32):
            raise ValueError("out_quant (fused NVFP4 requant) needs activation='silu_mul', no residual and a "
                             f"bf16/fp16 rounding dtype; got {self.activation!r}, residual={self.residual}, "
                             f"{self.out_dtype}")

    @property
    def gated(self) -> bool:
        return self.activation == "silu_mul"

    def out_features(self, n: int) -> int:
        if self.gated:
            if n % 2:
                raise ValueError(f"silu_mul needs an even number of GEMM output columns, got N={n}")
            return n // 2
        return n

    def key(self) -> str:
        """Stable short string for cache keys and kernel names."""
        dt = str(self.out_dtype).replace("torch.", "")
        return f"a{self.alpha}-b{int(self.bias)}-{self.activation}-r{int(self.residual)}-{dt}" + (
            "-q4" if self.out_quant else "")


def gelu_tanh_ref(y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(y, approximate="tanh")


def silu_ref(y: torch.Tensor) -> torch.Tensor:
    return y * torch.sigmoid(y)


def apply_activation_ref(y: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "none":
        return y
    if activation == "silu":
        return silu_ref(y)
    if activation == "gelu_tanh":
        return gelu_tanh_ref(y)
    if activation == "silu_mul":
        n = y.shape[-1]
        if n % 2:
            raise ValueError(f"silu_mul needs an even number of GEMM output columns, got N={n}")
        return silu_ref(y[..., : n // 2]) * y[..., n // 2 :]
    raise ValueError(f"unknown activation {activation!r}; expected one of {ACTIVATIONS}")


def epilogue_ref(
    acc: torch.Tensor,
    spec: EpilogueSpec,
    alpha: torch.Tensor | float | None = None,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """Torch reference of the epilogue on an fp32 accumulator [..., N]."""
    y = acc.float()
    if spec.alpha != "none":
        if alpha is None:
            raise ValueError(f"epilogue spec has alpha={spec.alpha!r} but no alpha was given")
        a = torch.as_tensor(alpha, dtype=torch.float32, device=y.device)
        if spec.alpha == "scalar" and a.numel() != 1:
            raise ValueError(f"scalar alpha must have one element, got shape {tuple(a.shape)}")
        if spec.alpha == "vector" and tuple(a.shape) != (y.shape[-1],):
            raise ValueError(f"vector alpha must have shape ({y.shape[-1]},), got {tuple(a.shape)}")
        y = y * (a.reshape(()) if spec.alpha == "scalar" else a)
    if spec.bias:
        if bias is None:
            raise ValueError("epilogue spec has bias=True but no bias was given")
        y = y + bias.float()
    y = apply_activation_ref(y, spec.activation)
    if spec.residual:
        if residual is None:
            raise ValueError("epilogue spec has residual=True but no residual was given")
        y = y + residual.float()
    return y.to(spec.out_dtype)
