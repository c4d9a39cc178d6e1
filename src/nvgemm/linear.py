"""``NVFP4Linear``: an inference ``nn.Module`` holding one NVFP4 weight, calling ``nvgemm::nvfp4_linear``."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from .formats import NVFP4, blocked_shape, dequantize, from_blocked, is_blocked, quantize_weight, to_blocked
from .ops import check_linear_args, check_scale_values
from .runtime.backends import last_selected


class NVFP4Linear(nn.Module):
    """``y = epilogue(alpha * x @ dequant(W).T)`` with W stored as NVFP4.

    Buffers (what a ModelOpt export holds, with the block scales swizzled once at load):
      weight          uint8 [N, K/2]     packed E2M1, even K in the low nibble
      weight_scale    float8_e4m3fn      128x4 swizzled block scales (padding zero), tiled shape
                                         ``nvgemm.formats.blocked_shape(N, K/16)``
      weight_scale_2  float32 () or (N,) per-tensor global scale (a vector after ``fuse``)
      input_scale     float32 () or None static activation scale; None = weight-only (W4A16)
      bias            [N] or None

    ``activation`` ("none", "silu", "gelu_tanh", "silu_mul") is applied in the GEMM epilogue.
    ``last_path`` names the backend the most recent eager forward ran on.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        weight_only: bool = False,
        activation: str = "none",
        bias_dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        if in_features % NVFP4.block_size:
            raise ValueError(f"NVFP4Linear: in_features must be a multiple of 16, got {in_features}")
        self.in_features = in_features
        self.out_features = out_features
        self.activation = activation
        kb = in_features // NVFP4.block_size
        self.register_buffer("weight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device))
        self.register_buffer(
            "weight_scale", torch.zeros(blocked_shape(out_features, kb), dtype=torch.float8_e4m3fn, device=device)
        )
        self.register_buffer("weight_scale_2", torch.ones((), dtype=torch.float32, device=device))
        self.register_buffer(
            "input_scale", None if weight_only else torch.ones((), dtype=torch.float32, device=device)
        )
        self.register_buffer("bias", torch.zeros(out_features, dtype=bias_dtype, device=device) if bias else None)
        self.last_path: str | None = None

    # ------------------------------------------------------------------ construction

    @property
    def weight_only(self) -> bool:
        return self.input_scale is None

    @classmethod
    def from_tensors(
        cls,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        weight_scale_2: torch.Tensor,
        input_scale: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        activation: str = "none",
    ) -> "NVFP4Linear":
        """Build from checkpoint tensors.

        ``weight_scale`` is either the checkpoint's linear [N, K/16] matrix (swizzled here) or
        already-swizzled scales in their tiled shape ``nvgemm.formats.blocked_shape(N, K/16)``.
        1-D scales are refused: a flattened linear matrix has the swizzled size whenever
        N % 128 == 0 and K % 64 == 0, so the layout cannot be told from the tensor.
        """
        if weight.dtype != torch.uint8 or weight.dim() != 2:
            raise ValueError(f"NVFP4Linear: weight must be uint8 [N, K/2], got {weight.dtype} {tuple(weight.shape)}")
        n, k = weight.shape[0], weight.shape[1] * 2
        kb = k // NVFP4.block_size
        if weight_scale.dim() == 2:
            if tuple(weight_scale.shape) != (n, kb):
                raise ValueError(
                    f"NVFP4Linear: weight_scale shape {tuple(weight_scale.shape)} does not match weight "
                    f"{tuple(weight.shape)}: expected ({n}, {kb})"
                )
            weight_scale = to_blocked(weight_scale)
        elif not is_blocked(weight_scale, n, kb):
            raise ValueError(
                f"NVFP4Linear: weight_scale shape {tuple(weight_scale.shape)} is neither the linear ({n}, {kb}) "
                f"matrix nor the swizzled tiled shape {blocked_shape(n, kb)}; 1-D scales are ambiguous (a "
                f"flattened linear matrix can have the swizzled size): reshape genuinely swizzled bytes with "
                f".view{blocked_shape(n, kb)}, linear ones to ({n}, {kb})"
            )
        mod = cls(k, n, bias=bias is not None, weight_only=input_scale is None, activation=activation,
                  bias_dtype=bias.dtype if bias is not None else torch.bfloat16, device="meta")
        mod.weight = weight.contiguous()
        mod.weight_scale = weight_scale.contiguous()
        mod.weight_scale_2 = weight_scale_2.float().reshape(weight_scale_2.shape if weight_scale_2.dim() == 1 else ())
        mod.input_scale = None if input_scale is None else input_scale.float().reshape(())
        mod.bias = None if bias is None else bias.contiguous()
        mod._validate()
        return mod

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, input_scale: torch.Tensor | float | None = None, activation: str = "none"
    ) -> "NVFP4Linear":
        """Quantize an ``nn.Linear`` with nvgemm's ModelOpt-exact recipe (input_scale None = W4A16)."""
        q = quantize_weight(linear.weight.detach())
        ins = None if input_scale is None else torch.as_tensor(input_scale, dtype=torch.float32).reshape(())
        bias = None if linear.bias is None else linear.bias.detach()
        return cls.from_tensors(q.packed, q.scale, q.global_scale, ins, bias, activation)

    @classmethod
    def fuse(cls, layers: Sequence["NVFP4Linear"]) -> "NVFP4Linear":
        """Concatenate shards (q/k/v, gate/up) along N into one GEMM, exactly.

        Unequal ``weight_scale_2`` become a per-output-column alpha vector (no re-quantization).
        W4A4 shards must share ``input_scale``: the activation is quantized once for the fused
        GEMM, so unequal input scales cannot be fused exactly and raise instead.
        """
        if not layers:
            raise ValueError("NVFP4Linear.fuse needs at least one layer")
        k = layers[0].in_features
        for i, l in enumerate(layers):
            if l.in_features != k:
                raise ValueError(f"NVFP4Linear.fuse: shard {i} has in_features={l.in_features}, expected {k}")
            if l.weight_only != layers[0].weight_only:
                raise ValueError("NVFP4Linear.fuse: cannot fuse weight-only and W4A4 shards")
            if l.activation != "none":
                raise ValueError("NVFP4Linear.fuse: shards must not carry an activation")
            if (l.bias is None) != (layers[0].bias is None):
                raise ValueError("NVFP4Linear.fuse: either all shards have a bias or none")
        if not layers[0].weight_only:
            scales = torch.stack([l.input_scale.reshape(()) for l in layers])
            if not bool((scales == scales[0]).all()):
                raise ValueError(
                    f"NVFP4Linear.fuse: shards have unequal input_scale {scales.tolist()}; one activation "
                    "quantization cannot serve them exactly, keep them as separate GEMMs"
                )
        kb = k // NVFP4.block_size
        weight = torch.cat([l.weight for l in layers])
        scale = torch.cat([from_blocked(l.weight_scale, l.out_features, kb) for l in layers])
        ws2 = [l.weight_scale_2.expand(l.out_features) for l in layers]
        ws2 = torch.cat(ws2)
        if bool((ws2 == ws2[0]).all()) and all(l.weight_scale_2.dim() == 0 for l in layers):
            ws2 = ws2[0].clone().reshape(())
        bias = torch.cat([l.bias for l in layers]) if layers[0].bias is not None else None
        ins = None if layers[0].weight_only else layers[0].input_scale.clone()
        return cls.from_tensors(weight, scale, ws2, ins, bias)

    def _validate(self) -> None:
        """Shapes and dtypes, and (once, at construction: a device sync is fine here) the scale values
        the op checks per call only for host tensors."""
        x = torch.empty((1, self.in_features), dtype=torch.bfloat16, device="meta")
        check_linear_args(
            x, self.weight.to("meta"), self.weight_scale.to("meta"), self.weight_scale_2.to("meta"),
            None if self.input_scale is None else self.input_scale.to("meta"),
            None if self.bias is None else self.bias.to("meta"), None, self.activation, None,
        )
        if self.weight_scale_2.is_meta or self.weight.is_meta:
            return
        ws2 = self.weight_scale_2.detach().float().cpu()
        check_scale_values(ws2, None if self.input_scale is None else self.input_scale.detach().cpu(), "NVFP4Linear")
        zero = (ws2.expand(self.out_features) == 0).to(self.weight.device)
        if bool(zero.any()) and bool(self.weight[zero].any()):
            raise ValueError("NVFP4Linear: weight_scale_2 is 0 for rows whose codes are not all zero; their "
                             "output would be 0 (a zero global scale belongs only to an all-zero weight)")

    # ------------------------------------------------------------------ compute

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        out = torch.ops.nvgemm.nvfp4_linear(x, self.weight, self.weight_scale, self.weight_scale_2,
                                            self.input_scale, self.bias, residual, self.activation, None)
        if not torch.compiler.is_compiling():
            self.last_path = last_selected()
        return out

    def dequantized_weight(self) -> torch.Tensor:
        """fp32 [N, K] = E2M1 * block scale * weight_scale_2 (the reference weight)."""
        kb = self.in_features // NVFP4.block_size
        return dequantize(self.weight, from_blocked(self.weight_scale, self.out_features, kb), self.weight_scale_2)

    def extra_repr(self) -> str:
        mode = "W4A16" if self.weight_only else "W4A4"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"{mode}, activation={self.activation}")
