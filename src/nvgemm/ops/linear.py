"""``nvgemm::`` custom ops: the NVFP4 linear and the activation quantizer.

Each op has a fake (meta) implementation and an eager implementation that dispatches to the
best registered backend (``nvgemm.dispatch.registry``); the **emulated** backend, defined here,
runs anywhere (CPU and CUDA tensors) and is the reference every kernel is tested against:

    W4A4 (input_scale given):
        qx, sx = quantize_activation(x, input_scale)        # nvgemm.core.formats convention
        acc    = (E2M1[qx]*sx) @ (E2M1[qw]*sw).T            # fp32 matmul; the operands are
                                                            # exact in fp32 (<= 6 significant bits)
        alpha  = input_scale * weight_scale_2               # fp32
    W4A16 (input_scale None):
        acc    = x.float() @ (E2M1[qw]*sw).T                # fp32 matmul
        alpha  = weight_scale_2
    out = epilogue_ref(acc, spec, alpha, bias, residual)    # nvgemm.epilogues, one rounding

The fp32 matmul's summation order is the only thing a GPU kernel can legitimately do
differently; tests bound that by K * eps_fp32 relative to sum |a*b|.
"""

from __future__ import annotations

from threading import get_ident
from typing import Optional

import torch

from nvgemm.epilogues import epilogue_ref
from nvgemm.core.formats import (
    NVFP4,
    blocked_numel,
    check_input_scale_value,
    dequantize,
    from_blocked,
    quantize_activation,
)
from nvgemm.core.validation import (
    alpha_of,
    call_key,
    call_meta,
    check_linear_args,
    check_scale_values,
    linear_spec,
    problem_of,
)
from nvgemm import settings
from nvgemm.core.backend import LINEAR
from nvgemm.dispatch.registry import (Backend, bind_call, bound_call, call_plan, register_backend, select_backend,
                                      set_selected)
from nvgemm.templates.common.triton_stand_in import stand_in
from nvgemm.templates.triton.fused_ops import quantize_nvfp4_cuda
from nvgemm.templates.triton.reference import quantize_ref


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


# --------------------------------------------------------------------------- emulated backend


def nvfp4_linear_emulated(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype):
    """The reference of a call the op has validated (:func:`~nvgemm.core.validation.check_linear_args`)."""
    spec = linear_spec(x.dtype, weight_scale_2, bias, residual, activation, out_dtype)
    n, k = weight.shape[0], weight.shape[1] * 2
    dev = x.device
    w_scale = from_blocked(weight_scale.to(dev).view(torch.float8_e4m3fn), n, k // NVFP4.block_size)
    w = dequantize(weight.to(dev), w_scale)  # E2M1*sw, fp32 [N, K]; weight_scale_2 goes to alpha
    x2 = x.reshape(-1, k)
    if input_scale is None:
        a = x2.float()
    else:
        qx, sx = quantize_activation(x2, input_scale.to(dev))
        a = dequantize(qx, sx)
    acc = a @ w.t()
    res2 = residual.reshape(-1, residual.shape[-1]) if residual is not None else None
    out = epilogue_ref(acc, spec, alpha_of(weight_scale_2, input_scale, dev), bias, res2)
    return out.reshape(*x.shape[:-1], out.shape[-1])


register_backend(Backend(name="emulated", priority=-1000, supports=lambda p: None, run=nvfp4_linear_emulated))


# --------------------------------------------------------------------------- ops


@torch.library.custom_op("nvgemm::nvfp4_linear", mutates_args=())
def nvfp4_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
    activation: str = "none",
    out_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """NVFP4 linear: ``epilogue(alpha * x @ dequant(weight).T)``; see the module docstring.

    ``weight_scale`` is the 128x4-swizzled e4m3 scales in their tiled shape
    ``nvgemm.core.formats.blocked_shape(N, K // 16)``. A 1-D scale tensor is refused as ambiguous
    (a flattened linear [N, K/16] matrix has the same size whenever N % 128 == 0 and K % 64 == 0);
    say which one you hold: bytes that are already swizzled ->
    ``scale.view(blocked_shape(N, K // 16))``; a flattened linear matrix ->
    ``to_blocked(scale.view(N, K // 16))``. Viewing linear bytes as swizzled is not detectable and
    gives wrong results.
    """
    token = settings.forcing_token()
    bkey = (LINEAR, id(weight), call_meta(x), call_meta(residual), activation, out_dtype, token, get_ident())
    bound = bound_call(bkey, weight, weight_scale, weight_scale_2, input_scale, bias)
    if bound is not None:  # the same layer operands, unchanged, and a call of the same metadata: validated
        set_selected(bound.backend)
        return bound.run(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype)
    key = (LINEAR, call_key(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual), activation,
           out_dtype, token)

    def decide():
        spec = check_linear_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation,
                                 out_dtype)
        problem = problem_of(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, spec)
        return spec, problem, select_backend(problem)

    _spec, problem, backend = call_plan(key, decide)
    check_scale_values(weight_scale_2, input_scale)
    args = (x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype)
    out = backend.run(*args)
    bind_call(bkey, backend, problem, (weight, weight_scale, weight_scale_2, input_scale, bias), args)
    return out


@nvfp4_linear.register_fake
def _(x, weight, weight_scale, weight_scale_2, input_scale=None, bias=None, residual=None, activation="none", out_dtype=None):
    spec = check_linear_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype)
    return x.new_empty((*x.shape[:-1], spec.out_features(weight.shape[0])), dtype=spec.out_dtype)


def _check_quant_args(x: torch.Tensor, input_scale: torch.Tensor) -> None:
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"nvgemm.quantize_nvfp4: x must be bfloat16, float16 or float32, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"nvgemm.quantize_nvfp4: x must be 2-D [M, K], got shape {_shape(x)}")
    if x.shape[1] % NVFP4.block_size:
        raise ValueError(f"nvgemm.quantize_nvfp4: K must be a multiple of 16, got K={x.shape[1]}")
    if input_scale.dtype != torch.float32 or input_scale.numel() != 1:
        raise ValueError(
            f"nvgemm.quantize_nvfp4: input_scale must be a float32 scalar tensor, got {input_scale.dtype} "
            f"{_shape(input_scale)}"
        )


def quantize_nvfp4_emulated(x: torch.Tensor, input_scale: torch.Tensor, swizzle: bool = True):
    _check_quant_args(x, input_scale)
    return quantize_ref(x, input_scale, swizzle)


@torch.library.custom_op("nvgemm::quantize_nvfp4", mutates_args=())
def quantize_nvfp4(x: torch.Tensor, input_scale: torch.Tensor, swizzle: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16/fp16/fp32 [M, K] -> (packed uint8 [M, K/2], e4m3 scales).

    Scales are the flat 1-D bytes of the 128x4 swizzled layout (rows padded to 128, K/16 padded
    to 4, padding zero; what the kernels read) when ``swizzle``, else the linear [M, K/16] layout.
    CUDA tensors run the Triton kernel where it can serve the device, everything else the torch
    reference (:func:`nvgemm.templates.triton.fused_ops.quantize_nvfp4_cuda`).
    ``input_scale`` must be finite and > 0 (checked when it is a host tensor).
    """
    _check_quant_args(x, input_scale)
    check_input_scale_value(input_scale, "nvgemm.quantize_nvfp4")
    if x.device.type == "cuda":
        return quantize_nvfp4_cuda(x, input_scale, swizzle)
    kernel = stand_in("nvgemm.templates.triton.quantize", "quantize_nvfp4_kernel", x.device)
    if kernel is not None:  # the PTX emulator's stand-in (opt-in): the Triton kernel's PTX on the CPU
        from nvgemm.templates.triton.quantize import quantize_nvfp4_triton  # lazy: triton import cost

        return quantize_nvfp4_triton(x, input_scale, swizzle, kernel=kernel)
    return quantize_nvfp4_emulated(x, input_scale, swizzle)


@quantize_nvfp4.register_fake
def _(x, input_scale, swizzle=True):
    _check_quant_args(x, input_scale)
    m, k = x.shape
    packed = x.new_empty((m, k // 2), dtype=torch.uint8)
    if swizzle:
        scale = x.new_empty((blocked_numel(m, k // 16),), dtype=torch.float8_e4m3fn)
    else:
        scale = x.new_empty((m, k // 16), dtype=torch.float8_e4m3fn)
    return packed, scale
