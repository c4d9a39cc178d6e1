"""CuTeDSL apply functors for the parts of an :class:`~nvgemm.epilogues.EpilogueSpec`.

Each functor is a frozen host object (its fields are the cache identity, all compile-time
constants) with a device ``apply`` that works on one fp32 accumulator element, and a torch
``reference`` that is the matching slice of :func:`nvgemm.epilogues.epilogue_ref`. The kernel
calls them in the one fixed order of the spec, **all in fp32, one rounding at the cast**:

    y = acc * alpha      AlphaFold   (scalar loaded once per CTA, or alpha[feature])
    y = y + bias         BiasAdd     (bias[feature] upcast to fp32)
    y = act(y)           Activation  (silu | gelu_tanh; silu_mul is a two-operand apply)
    y = y + residual     ResidualAdd (residual[row, col] upcast to fp32)
    out = cvt(y)         OutputCast  (round to nearest even, once)

``feature`` is the output-column index of the layer; in a swap-AB kernel that is the MMA's
row index, which is why the functors take the feature index, never "the column".

Transcendentals use the accurate (non-fast-math) CuTeDSL ``cute.math`` lowerings; the GPU
tests bound their difference to torch by the output dtype's half-ulp plus the fp32 error of
``exp``/``tanh`` (a few fp32 ulps).

This module imports cutlass; import it only from kernel code (never at ``import nvgemm``).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch

from nvgemm.core.epilogue import EpilogueSpec, apply_activation_ref

_SQRT_2_OVER_PI = 0.7978845608028654
_GELU_C = 0.044715


def _cute_dtype(dt: torch.dtype):
    return {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16, torch.float32: cutlass.Float32}[dt]


@dataclass(frozen=True)
class AlphaFold:
    kind: str  # "none" | "scalar" | "vector"

    @cute.jit
    def apply(self, y: cutlass.Float32, alpha: cutlass.Float32) -> cutlass.Float32:
        # alpha is the scalar (loaded once) or the gathered alpha[feature]
        return y * alpha

    def reference(self, y: torch.Tensor, alpha) -> torch.Tensor:
        if self.kind == "none":
            return y
        a = torch.as_tensor(alpha, dtype=torch.float32, device=y.device)
        return y * (a.reshape(()) if self.kind == "scalar" else a)


@dataclass(frozen=True)
class BiasAdd:
    @cute.jit
    def apply(self, y: cutlass.Float32, b: cutlass.Float32) -> cutlass.Float32:
        return y + b

    def reference(self, y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return y + bias.float()


@dataclass(frozen=True)
class Activation:
    name: str  # "none" | "silu" | "gelu_tanh" | "silu_mul"

    @cute.jit
    def apply(self, y: cutlass.Float32) -> cutlass.Float32:
        """Unary activations (``silu_mul`` uses :meth:`apply_gated`)."""
        r = y
        if cutlass.const_expr(self.name == "silu"):
            r = y / (cutlass.Float32(1.0) + cute.math.exp(-y))
        if cutlass.const_expr(self.name == "gelu_tanh"):
            inner = cutlass.Float32(_SQRT_2_OVER_PI) * (y + cutlass.Float32(_GELU_C) * y * y * y)
            r = cutlass.Float32(0.5) * y * (cutlass.Float32(1.0) + cute.math.tanh(inner))
        return r

    @cute.jit
    def apply_gated(self, gate: cutlass.Float32, up: cutlass.Float32) -> cutlass.Float32:
        return gate / (cutlass.Float32(1.0) + cute.math.exp(-gate)) * up

    def reference(self, y: torch.Tensor) -> torch.Tensor:
        return apply_activation_ref(y, self.name)


@dataclass(frozen=True)
class ResidualAdd:
    @cute.jit
    def apply(self, y: cutlass.Float32, r: cutlass.Float32) -> cutlass.Float32:
        return y + r

    def reference(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return y + residual.float()


@dataclass(frozen=True)
class OutputCast:
    out_dtype: torch.dtype

    @property
    def cute_dtype(self):
        return _cute_dtype(self.out_dtype)

    def reference(self, y: torch.Tensor) -> torch.Tensor:
        return y.to(self.out_dtype)


@dataclass(frozen=True)
class CuteEpilogue:
    """The device side of one :class:`EpilogueSpec`: the five functors in their fixed order."""

    spec: EpilogueSpec

    @property
    def alpha(self) -> AlphaFold:
        return AlphaFold(self.spec.alpha)

    @property
    def activation(self) -> Activation:
        return Activation(self.spec.activation)

    @property
    def cast(self) -> OutputCast:
        return OutputCast(self.spec.out_dtype)

    @cute.jit
    def apply(
        self,
        acc: cutlass.Float32,
        alpha: cutlass.Float32,
        bias: cutlass.Float32,
        residual: cutlass.Float32,
    ) -> cutlass.Float32:
        """fp32 in, fp32 out (the caller casts once). Unused operands are ignored at trace time."""
        y = acc
        if cutlass.const_expr(self.spec.alpha != "none"):
            y = AlphaFold(self.spec.alpha).apply(y, alpha)
        if cutlass.const_expr(self.spec.bias):
            y = BiasAdd().apply(y, bias)
        if cutlass.const_expr(self.spec.activation in ("silu", "gelu_tanh")):
            y = Activation(self.spec.activation).apply(y)
        if cutlass.const_expr(self.spec.residual):
            y = ResidualAdd().apply(y, residual)
        return y

    @cute.jit
    def apply_pre(self, acc: cutlass.Float32, alpha: cutlass.Float32, bias: cutlass.Float32) -> cutlass.Float32:
        """The part before the activation (alpha, bias): what a gated epilogue applies to the gate
        and the up value separately before :meth:`Activation.apply_gated` combines them."""
        y = acc
        if cutlass.const_expr(self.spec.alpha != "none"):
            y = AlphaFold(self.spec.alpha).apply(y, alpha)
        if cutlass.const_expr(self.spec.bias):
            y = BiasAdd().apply(y, bias)
        return y

    @cute.jit
    def apply_post(self, y: cutlass.Float32, residual: cutlass.Float32) -> cutlass.Float32:
        """The part after the activation (residual); the caller casts once."""
        r = y
        if cutlass.const_expr(self.spec.residual):
            r = ResidualAdd().apply(y, residual)
        return r

    def reference(self, acc: torch.Tensor, alpha=None, bias=None, residual=None) -> torch.Tensor:
        """Composition of the functors' references; equals ``epilogue_ref`` (tested)."""
        y = acc.float()
        if self.spec.alpha != "none":
            y = self.alpha.reference(y, alpha)
        if self.spec.bias:
            y = BiasAdd().reference(y, bias)
        if self.spec.activation != "none":
            y = self.activation.reference(y)
        if self.spec.residual:
            y = ResidualAdd().reference(y, residual)
        return self.cast.reference(y)
