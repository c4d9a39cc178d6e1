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

from typing import Optional

import torch

from nvgemm.epilogues import ACTIVATIONS, EpilogueSpec, epilogue_ref
from nvgemm.core.formats import (
    NVFP4,
    blocked_numel,
    blocked_shape,
    check_input_scale_value,
    dequantize,
    from_blocked,
    quantize_activation,
    to_blocked,
)
from nvgemm.dispatch.registry import Backend, LinearProblem, register_backend, select_backend

X_DTYPES = (torch.bfloat16, torch.float16)
EPILOGUE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # bias / residual


# --------------------------------------------------------------------------- validation


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def check_linear_args(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
    activation: str,
    out_dtype: Optional[torch.dtype],
) -> EpilogueSpec:
    """Validate one ``nvfp4_linear`` call; return its epilogue spec. Raises with a named cause."""
    if x.dtype not in X_DTYPES:
        raise TypeError(f"nvgemm.nvfp4_linear: x must be bfloat16 or float16, got {x.dtype}")
    if x.dim() < 1:
        raise ValueError("nvgemm.nvfp4_linear: x must have shape [..., K]")
    if weight.dtype != torch.uint8:
        raise TypeError(f"nvgemm.nvfp4_linear: weight must be packed uint8 [N, K/2], got dtype {weight.dtype}")
    if weight.dim() != 2:
        raise ValueError(f"nvgemm.nvfp4_linear: weight must be 2-D [N, K/2], got shape {_shape(weight)}")
    n, k = weight.shape[0], weight.shape[1] * 2
    if x.shape[-1] != k:
        raise ValueError(
            f"nvgemm.nvfp4_linear: x has K={x.shape[-1]} but the packed weight {_shape(weight)} holds K={k}"
        )
    if k % NVFP4.block_size:
        raise ValueError(f"nvgemm.nvfp4_linear: K must be a multiple of 16, got K={k}")
    if weight_scale.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise TypeError(
            f"nvgemm.nvfp4_linear: weight_scale must be float8_e4m3fn (or its raw bytes as uint8), "
            f"got {weight_scale.dtype}"
        )
    kb = k // NVFP4.block_size
    want = blocked_shape(n, kb)
    if _shape(weight_scale) != want:
        if _shape(weight_scale) == (n, kb):
            hint = "these are linear [N, K/16] scales: swizzle them once with nvgemm.core.formats.to_blocked"
        elif weight_scale.dim() == 1 and weight_scale.numel() == blocked_numel(n, kb):
            hint = (f"1-D scales are ambiguous (a flattened linear [N, K/16] = [{n}, {kb}] matrix has the same "
                    f"size); say which you hold: bytes already 128x4-swizzled -> weight_scale.view{want}; a "
                    f"flattened linear [{n}, {kb}] matrix -> nvgemm.core.formats.to_blocked(weight_scale.view({n}, "
                    f"{kb})) (viewing linear bytes as swizzled gives wrong results)")
        elif weight_scale.dim() == 1 and weight_scale.numel() == n * kb:
            hint = (f"these are a flattened linear [N, K/16] = [{n}, {kb}] matrix: swizzle them once with "
                    f"nvgemm.core.formats.to_blocked(weight_scale.view({n}, {kb}))")
        else:
            hint = "wrong size for this weight"
        raise ValueError(
            f"nvgemm.nvfp4_linear: weight_scale must be the 128x4-swizzled scales of a [{n}, {kb}] matrix in "
            f"their tiled shape {want} (nvgemm.core.formats.blocked_shape), got shape {_shape(weight_scale)}: {hint}"
        )
    if weight_scale_2.dtype != torch.float32 or _shape(weight_scale_2) not in ((), (n,)):
        raise ValueError(
            f"nvgemm.nvfp4_linear: weight_scale_2 must be float32 of shape () or ({n},), "
            f"got {weight_scale_2.dtype} {_shape(weight_scale_2)}"
        )
    if input_scale is not None and (input_scale.dtype != torch.float32 or input_scale.numel() != 1):
        raise ValueError(
            f"nvgemm.nvfp4_linear: input_scale must be a float32 scalar tensor, got "
            f"{input_scale.dtype} {_shape(input_scale)}"
        )
    if bias is not None and _shape(bias) != (n,):
        raise ValueError(f"nvgemm.nvfp4_linear: bias must have shape ({n},), got {_shape(bias)}")
    for name, t in (("bias", bias), ("residual", residual)):
        if t is not None and t.dtype not in EPILOGUE_DTYPES:
            raise TypeError(f"nvgemm.nvfp4_linear: {name} must be bfloat16, float16 or float32, got {t.dtype}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"nvgemm.nvfp4_linear: activation must be one of {ACTIVATIONS}, got {activation!r}")
    spec = EpilogueSpec(
        alpha="vector" if weight_scale_2.dim() == 1 else "scalar",
        bias=bias is not None,
        activation=activation,
        residual=residual is not None,
        out_dtype=out_dtype or x.dtype,
    )
    n_out = spec.out_features(n)
    if residual is not None and _shape(residual) != (*x.shape[:-1], n_out):
        raise ValueError(
            f"nvgemm.nvfp4_linear: residual must have shape {(*x.shape[:-1], n_out)}, got {_shape(residual)}"
        )
    for name, t in (("weight", weight), ("weight_scale", weight_scale), ("weight_scale_2", weight_scale_2),
                    ("input_scale", input_scale), ("bias", bias), ("residual", residual)):
        if t is not None and t.device != x.device and not (t.dim() == 0 and t.device.type == "cpu"):
            raise ValueError(f"nvgemm.nvfp4_linear: {name} is on {t.device} but x is on {x.device}")
    return spec


def check_scale_values(weight_scale_2: torch.Tensor, input_scale: Optional[torch.Tensor],
                       where: str = "nvgemm.nvfp4_linear") -> None:
    """Refuse NaN / Inf / negative ``weight_scale_2`` and NaN / Inf / non-positive ``input_scale``.

    Reading a value forces a device sync, so per call only host (CPU) tensors are checked; CUDA
    scalars are checked where they are built (``NVFP4Linear``, the checkpoint and vLLM loaders).
    ``weight_scale_2 == 0`` is allowed: it is the global scale of an all-zero weight
    (``formats.quantize_weight``); ``NVFP4Linear`` checks that such rows hold only zero codes.
    """
    if weight_scale_2.device.type == "cpu":
        bad = ~torch.isfinite(weight_scale_2) | (weight_scale_2 < 0)
        if bool(bad.any()):
            v = weight_scale_2.reshape(-1)[bad.reshape(-1)][0].item()
            raise ValueError(f"{where}: weight_scale_2 holds {v}; it must be finite and >= 0")
    if input_scale is not None:
        check_input_scale_value(input_scale, where)


def problem_of(x, weight, weight_scale_2, input_scale, bias, residual, activation, spec: EpilogueSpec) -> LinearProblem:
    cap = torch.cuda.get_device_capability(x.device) if x.device.type == "cuda" else None
    return LinearProblem(
        m=x.numel() // max(x.shape[-1], 1),
        n=weight.shape[0],
        k=weight.shape[1] * 2,
        device_type=x.device.type,
        capability=cap,
        weight_only=input_scale is None,
        x_dtype=x.dtype,
        out_dtype=spec.out_dtype,
        alpha=spec.alpha,
        bias=bias is not None,
        activation=activation,
        residual=residual is not None,
    )


# --------------------------------------------------------------------------- emulated backend


def alpha_of(weight_scale_2: torch.Tensor, input_scale: Optional[torch.Tensor]) -> torch.Tensor:
    """The scalar (or per-N) dequant factor folded into the epilogue, in fp32."""
    a = weight_scale_2.float()
    if input_scale is not None:
        a = input_scale.float().reshape(()) * a
    return a


def nvfp4_linear_emulated(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype):
    spec = check_linear_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype)
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
    out = epilogue_ref(acc, spec, alpha_of(weight_scale_2.to(dev), input_scale.to(dev) if input_scale is not None else None),
                       bias, res2)
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
    spec = check_linear_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype)
    check_scale_values(weight_scale_2, input_scale)
    backend = select_backend(problem_of(x, weight, weight_scale_2, input_scale, bias, residual, activation, spec))
    return backend.run(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype)


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
    packed, scale = quantize_activation(x, input_scale.to(x.device))
    return packed, (to_blocked(scale).reshape(-1) if swizzle else scale)


_CUDA_QUANTIZER = None  # fn(x, input_scale, swizzle) -> (packed, scale); set by a kernel module


def set_cuda_quantizer(fn) -> None:
    """Install the CUDA implementation of ``nvgemm::quantize_nvfp4`` (e.g. the Triton kernel)."""
    global _CUDA_QUANTIZER
    _CUDA_QUANTIZER = fn


@torch.library.custom_op("nvgemm::quantize_nvfp4", mutates_args=())
def quantize_nvfp4(x: torch.Tensor, input_scale: torch.Tensor, swizzle: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16/fp16/fp32 [M, K] -> (packed uint8 [M, K/2], e4m3 scales).

    Scales are the flat 1-D bytes of the 128x4 swizzled layout (rows padded to 128, K/16 padded
    to 4, padding zero; what the kernels read) when ``swizzle``, else the linear [M, K/16] layout.
    ``input_scale`` must be finite and > 0 (checked when it is a host tensor).
    """
    _check_quant_args(x, input_scale)
    check_input_scale_value(input_scale, "nvgemm.quantize_nvfp4")
    if x.device.type == "cuda":
        from nvgemm.dispatch.registry import load_builtin_backends

        load_builtin_backends()
        if _CUDA_QUANTIZER is not None:
            return _CUDA_QUANTIZER(x, input_scale, swizzle)
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
