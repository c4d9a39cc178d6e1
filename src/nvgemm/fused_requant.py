"""Gate/up GEMM with the fused SwiGLU + NVFP4 requant epilogue, and the W4A4 gated-MLP chain.

* ``torch.ops.nvgemm.nvfp4_linear_requant(x, weight, weight_scale, weight_scale_2, input_scale, bias,
  out_input_scale, out_dtype=None) -> (packed uint8 [M, I/2], swizzled e4m3 scales)``: the gate_up
  GEMM (checkpoint order ``[gate; up]``, N = 2I) whose epilogue quantizes its SwiGLU output for the
  next W4A4 layer. Bit-exact contract::

      packed, scales == quantize_nvfp4(nvfp4_linear(x, ..., activation="silu_mul", out_dtype=d), out_input_scale)

  (epilogue order acc*alpha -> +bias -> silu_mul -> one rounding to ``d`` -> quantize).
* ``torch.ops.nvgemm.nvfp4_linear_prequant(packed, scales, weight, weight_scale, weight_scale_2,
  input_scale, bias, residual, out_dtype)``: a W4A4 linear on an already-quantized activation (the
  down projection fed by the op above); same result as ``nvfp4_linear`` on the dequantized input.
* :func:`gated_mlp`: ``down(silu_mul(gate_up(x)))`` for two :class:`~nvgemm.NVFP4Linear` layers, through
  the two ops above when both are W4A4 (one activation round trip less), else the plain chain.

Backends: the emulated one (CPU/CUDA, torch), and with ``NVGEMM_BACKEND=emu_sm100`` on CPU tensors the
sm_100a kernel's fused requant epilogue (``EpilogueSpec(out_quant=True)``, modelled lane by lane in
:mod:`nvgemm.epilogues.requant`) executed by the PTX emulator. Not yet dispatched to the kernel on a GPU
(see README, Blackwell section).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import torch

from .epilogues import epilogue_ref
from .epilogues.requant import fused_requant_reference
from .formats import NVFP4, blocked_numel, dequantize, from_blocked
from .ops import X_DTYPES, alpha_of, check_linear_args

__all__ = ["nvfp4_linear_requant", "nvfp4_linear_prequant", "gated_mlp"]


def _acc(a: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """fp32 [M, N] = a @ (E2M1*sw).T (weight_scale_2 goes to alpha, like nvfp4_linear_emulated)."""
    n, k = weight.shape[0], weight.shape[1] * 2
    w_scale = from_blocked(weight_scale.to(a.device).view(torch.float8_e4m3fn), n, k // NVFP4.block_size)
    return a @ dequantize(weight.to(a.device), w_scale).t()


def _check_requant(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype):
    if input_scale is None:
        raise ValueError("nvgemm.nvfp4_linear_requant: input_scale is required (W4A4 gate_up); "
                         "weight-only layers use nvfp4_linear + quantize_nvfp4")
    if out_input_scale.dtype != torch.float32 or out_input_scale.numel() != 1:
        raise ValueError("nvgemm.nvfp4_linear_requant: out_input_scale (the next layer's input_scale) must be a "
                         f"float32 scalar tensor, got {out_input_scale.dtype} {tuple(out_input_scale.shape)}")
    if x.dim() != 2:
        raise ValueError(f"nvgemm.nvfp4_linear_requant: x must be 2-D [M, K], got shape {tuple(x.shape)}")
    if out_dtype is not None and out_dtype not in X_DTYPES:
        raise ValueError(f"nvgemm.nvfp4_linear_requant: out_dtype (the rounding before requant) must be bf16 "
                         f"or fp16, got {out_dtype}")
    spec = check_linear_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, None, "silu_mul", out_dtype)
    i = weight.shape[0] // 2
    if i % NVFP4.block_size:
        raise ValueError(f"nvgemm.nvfp4_linear_requant: the gated width I = N/2 = {i} must be a multiple of 16 "
                         "(one NVFP4 block of the next layer's input)")
    return spec, i


@torch.library.custom_op("nvgemm::nvfp4_linear_requant", mutates_args=())
def nvfp4_linear_requant(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    out_input_scale: torch.Tensor,
    out_dtype: Optional[torch.dtype] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Emulated fused gate_up GEMM + SwiGLU + NVFP4 requant (see the module docstring)."""
    spec, _i = _check_requant(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype)
    if os.environ.get("NVGEMM_BACKEND", "").strip() == "emu_sm100" and x.device.type == "cpu":
        # the real sm_100a kernel (fused requant epilogue) on the PTX emulator; a correctness tool
        from .emulator.backend import run_emu_sm100_requant

        return run_emu_sm100_requant(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale,
                                     dataclasses.replace(spec, out_quant=True))
    from .formats import quantize_activation

    qx, sx = quantize_activation(x, input_scale.to(x.device))
    acc = _acc(dequantize(qx, sx), weight, weight_scale)
    # alpha and bias (the "pre" part of the epilogue), fp32; activation + rounding + quantize follow
    pre = epilogue_ref(acc, type(spec)(alpha=spec.alpha, bias=spec.bias, out_dtype=torch.float32),
                       alpha_of(weight_scale_2.to(x.device), input_scale.to(x.device)), bias)
    return fused_requant_reference(pre, out_input_scale.to(x.device), spec.out_dtype)


@nvfp4_linear_requant.register_fake
def _(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype=None):
    _spec, i = _check_requant(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype)
    m = x.shape[0]
    return (x.new_empty((m, i // 2), dtype=torch.uint8),
            x.new_empty((blocked_numel(m, i // NVFP4.block_size),), dtype=torch.float8_e4m3fn))


def _check_prequant(packed, scales, weight, out_dtype):
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(f"nvgemm.nvfp4_linear_prequant: packed must be uint8 [M, K/2], got {packed.dtype} "
                         f"{tuple(packed.shape)}")
    m, k = packed.shape[0], packed.shape[1] * 2
    if weight.dim() != 2 or weight.shape[1] * 2 != k:
        raise ValueError(f"nvgemm.nvfp4_linear_prequant: activation K={k} does not match weight {tuple(weight.shape)}")
    want = blocked_numel(m, k // NVFP4.block_size)
    if scales.dtype not in (torch.float8_e4m3fn, torch.uint8) or scales.dim() != 1 or scales.numel() != want:
        raise ValueError(f"nvgemm.nvfp4_linear_prequant: scales must be the 1-D swizzled e4m3 scales of a "
                         f"[{m}, {k // 16}] matrix ({want} elements), got {scales.dtype} {tuple(scales.shape)}")
    if out_dtype not in X_DTYPES:
        raise ValueError(f"nvgemm.nvfp4_linear_prequant: out_dtype must be bf16 or fp16, got {out_dtype}")


@torch.library.custom_op("nvgemm::nvfp4_linear_prequant", mutates_args=())
def nvfp4_linear_prequant(
    packed: torch.Tensor,
    scales: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """W4A4 linear whose activation arrives quantized (packed codes + swizzled scales)."""
    _check_prequant(packed, scales, weight, out_dtype)
    m, k = packed.shape[0], packed.shape[1] * 2
    x_meta = torch.empty((m, k), dtype=out_dtype, device="meta")
    spec = check_linear_args(x_meta, weight.to("meta"), weight_scale.to("meta"), weight_scale_2.to("meta"),
                             input_scale.to("meta"), None if bias is None else bias.to("meta"),
                             None if residual is None else residual.to("meta"), "none", out_dtype)
    sx = from_blocked(scales.view(torch.float8_e4m3fn), m, k // NVFP4.block_size)
    acc = _acc(dequantize(packed, sx), weight, weight_scale)
    return epilogue_ref(acc, spec, alpha_of(weight_scale_2.to(packed.device), input_scale.to(packed.device)), bias,
                        residual)


@nvfp4_linear_prequant.register_fake
def _(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, residual, out_dtype):
    _check_prequant(packed, scales, weight, out_dtype)
    return packed.new_empty((packed.shape[0], weight.shape[0]), dtype=out_dtype)


def gated_mlp(gate_up, down, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``down(silu_mul(gate_up(x)))`` for two :class:`~nvgemm.NVFP4Linear` (``gate_up`` with
    ``activation="silu_mul"``, checkpoint ``[gate; up]`` order). When both are W4A4 the gate_up GEMM
    emits down's NVFP4 input directly (fused requant); the result equals the unfused chain bit for bit."""
    if gate_up.activation != "silu_mul":
        raise ValueError(f"gated_mlp: gate_up must have activation='silu_mul', got {gate_up.activation!r}")
    if down.in_features * 2 != gate_up.out_features:
        raise ValueError(f"gated_mlp: down.in_features={down.in_features} is not gate_up.out_features/2 "
                         f"= {gate_up.out_features // 2}")
    fusable = (not gate_up.weight_only and not down.weight_only and gate_up.sm90_kind is None
               and down.sm90_kind is None and down.activation == "none" and x.dim() == 2
               and down.in_features % NVFP4.block_size == 0)
    if not fusable:
        return down(gate_up(x), residual=residual)
    packed, scales = torch.ops.nvgemm.nvfp4_linear_requant(
        x, gate_up.weight, gate_up.weight_scale, gate_up.weight_scale_2, gate_up.input_scale, gate_up.bias,
        down.input_scale, x.dtype)
    return torch.ops.nvgemm.nvfp4_linear_prequant(
        packed, scales, down.weight, down.weight_scale, down.weight_scale_2, down.input_scale, down.bias, residual,
        x.dtype)
