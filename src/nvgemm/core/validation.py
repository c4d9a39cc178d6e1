"""One ``nvfp4_linear`` call, checked once: argument validation, the problem descriptor the
dispatcher decides on, operand alignment, and the definition of ``alpha``.

* :func:`check_linear_args` validates shapes, dtypes and devices and returns the call's
  :class:`~nvgemm.core.epilogue.EpilogueSpec`; the op runs it once per call and hands the spec
  and the :class:`LinearProblem` (:func:`problem_of`) down, so nothing below validates again.
* :func:`check_scale_values` refuses non-finite / negative scales (host tensors per call).
* :func:`misaligned_operands` names the operands whose bytes a kernel cannot read in place
  (data pointer or row stride not a multiple of :data:`OPERAND_ALIGN` bytes); the problem carries
  those names, so a kernel backend's ``supports`` refuses them (:func:`alignment_reason`) and the
  cached decision of an aligned call is never reused for a misaligned one.
* :func:`alpha_of` is the one definition of the epilogue's dequant factor,
  ``alpha = input_scale * weight_scale_2`` in fp32 (``weight_scale_2`` alone for W4A16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from nvgemm.core.formats import NVFP4, blocked_numel, blocked_shape, check_input_scale_value
from nvgemm.core.epilogue import ACTIVATIONS, EpilogueSpec

X_DTYPES = (torch.bfloat16, torch.float16)
EPILOGUE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # bias / residual

#: bytes every operand a kernel reads in place must be aligned to: the data pointer and, for a
#: matrix, its row stride (TMA and 16-byte vector loads; the kernels' ABI ``assumed_align``)
OPERAND_ALIGN = 16


@dataclass(frozen=True)
class LinearProblem:
    """What a backend needs to decide whether it can run one ``nvfp4_linear`` call."""

    m: int
    n: int
    k: int
    device_type: str
    capability: tuple[int, int] | None  # (major, minor) of the CUDA device, None on CPU
    weight_only: bool  # input_scale is None (W4A16)
    x_dtype: torch.dtype
    out_dtype: torch.dtype
    alpha: str  # "scalar" | "vector"
    bias: bool
    activation: str
    residual: bool
    #: operands not :data:`OPERAND_ALIGN`-byte aligned (:func:`misaligned_operands`), e.g. ("weight",)
    misaligned: tuple[str, ...] = ()
    #: the residual's dtype differs from the output dtype (a kernel that adds the residual in the output
    #: dtype refuses such a call in ``supports``; the emulated op adds it in fp32)
    residual_cast: bool = False


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
    spec = linear_spec(x.dtype, weight_scale_2, bias, residual, activation, out_dtype)
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


def linear_spec(x_dtype: torch.dtype, weight_scale_2: torch.Tensor, bias: Optional[torch.Tensor],
                residual: Optional[torch.Tensor], activation: str, out_dtype: Optional[torch.dtype]) -> EpilogueSpec:
    """The epilogue spec of a call :func:`check_linear_args` has already accepted (no checks: a
    backend's ``run`` derives it from the arguments the op validated)."""
    return EpilogueSpec(
        alpha="vector" if weight_scale_2.dim() == 1 else "scalar",
        bias=bias is not None,
        activation=activation,
        residual=residual is not None,
        out_dtype=out_dtype or x_dtype,
    )


def check_scale_values(weight_scale_2: torch.Tensor, input_scale: Optional[torch.Tensor],
                       where: str = "nvgemm.nvfp4_linear") -> None:
    """Refuse NaN / Inf / negative ``weight_scale_2`` and NaN / Inf / non-positive ``input_scale``.

    Reading a value forces a device sync, so per call only host (CPU) tensors are checked; CUDA
    scalars are checked where they are built (``NVFP4Linear``, the checkpoint and vLLM loaders).
    ``weight_scale_2 == 0`` is allowed: it is the global scale of an all-zero weight
    (``formats.quantize_weight``); ``NVFP4Linear`` checks that such rows hold only zero codes.
    """
    if weight_scale_2.device.type == "cpu" and weight_scale_2.numel() == 1:
        v = weight_scale_2.item()  # a host scalar: one read, no tensor ops
        if not (0 <= v < float("inf")):
            raise ValueError(f"{where}: weight_scale_2 holds {v}; it must be finite and >= 0")
    elif weight_scale_2.device.type == "cpu":
        bad = ~torch.isfinite(weight_scale_2) | (weight_scale_2 < 0)
        if bool(bad.any()):
            v = weight_scale_2.reshape(-1)[bad.reshape(-1)][0].item()
            raise ValueError(f"{where}: weight_scale_2 holds {v}; it must be finite and >= 0")
    if input_scale is not None:
        check_input_scale_value(input_scale, where)


# --------------------------------------------------------------------------- per-call key


def _meta(t: Optional[torch.Tensor]):
    if t is None:
        return None
    # get_device(): -1 on the host, the index on a GPU (an eager call never sees meta or fake tensors)
    return t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() % OPERAND_ALIGN


#: one tensor's part of :func:`call_key` (None for an absent operand)
call_meta = _meta


def call_key(*tensors: Optional[torch.Tensor]) -> tuple:
    """Everything :func:`check_linear_args`, :func:`problem_of` and :func:`misaligned_operands` read from
    the call's tensors: shape, strides, dtype, device (host or GPU index) and the data pointer's offset from a
    :data:`OPERAND_ALIGN` boundary of each (None for an absent operand). Two calls with equal keys get
    the same validation verdict, epilogue spec and problem, so an op validates completely on the first
    call of a key and re-checks only the key (plus the host scale values) afterwards."""
    return tuple(map(_meta, tensors))


# --------------------------------------------------------------------------- alignment


def misalignment(t: torch.Tensor) -> Optional[str]:
    """Why a kernel cannot read ``t`` in place, or None: its data pointer is not a multiple of
    :data:`OPERAND_ALIGN` bytes, or it is a strided view (rows of unit-stride elements) whose row
    stride is not. A contiguous tensor's row length is a shape rule each template checks itself
    (e.g. K % 32). Meta and empty tensors have no address."""
    if t.is_meta or t.numel() == 0:
        return None
    off = t.data_ptr() % OPERAND_ALIGN
    if off:
        return f"its data pointer is {off} bytes past a {OPERAND_ALIGN}-byte boundary"
    if (not t.is_contiguous() and t.dim() >= 2 and t.stride(-1) == 1 and t.shape[-2] > 1
            and (t.stride(-2) * t.element_size()) % OPERAND_ALIGN):
        return f"its row stride of {t.stride(-2) * t.element_size()} bytes is not a multiple of {OPERAND_ALIGN}"
    return None


def misaligned_operands(**operands: Optional[torch.Tensor]) -> tuple[str, ...]:
    """The names (in argument order) of the given operands :func:`misalignment` refuses."""
    return tuple(name for name, t in operands.items() if t is not None and misalignment(t) is not None)


def alignment_reason(problem: LinearProblem, operands: tuple[str, ...]) -> Optional[str]:
    """A kernel backend's ``supports`` rule for the ``operands`` it reads in place: None when all are
    aligned, else a reason naming them."""
    bad = [name for name in operands if name in problem.misaligned]
    if not bad:
        return None
    one = len(bad) == 1
    return (f"{', '.join(bad)} {'is' if one else 'are'} not {OPERAND_ALIGN}-byte aligned (data pointer, row stride) "
            f"and the kernel reads {'it' if one else 'them'} in place")


def aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous in a buffer a kernel can read in place: ``t`` itself when it already is, else a
    copy (e.g. a tensor viewing a safetensors file buffer at an unaligned offset)."""
    t = t.contiguous()
    return t if misalignment(t) is None else t.clone()


# --------------------------------------------------------------------------- problem, alpha


def problem_of(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation,
               spec: EpilogueSpec) -> LinearProblem:
    """The :class:`LinearProblem` of a validated call (``spec`` from :func:`check_linear_args`)."""
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
        misaligned=misaligned_operands(x=x, weight=weight, weight_scale=weight_scale, bias=bias, residual=residual),
        residual_cast=residual is not None and residual.dtype != spec.out_dtype,
    )


def alpha_of(weight_scale_2: torch.Tensor, input_scale: Optional[torch.Tensor],
             device: Optional[torch.device] = None) -> torch.Tensor:
    """The dequant factor folded into the epilogue, in fp32: ``input_scale * weight_scale_2`` (W4A4) or
    ``weight_scale_2`` (W4A16, ``input_scale`` None), with ``weight_scale_2``'s shape (scalar, per-N,
    per-expert ...). A one-element ``input_scale`` is a scalar; a larger one broadcasts against
    ``weight_scale_2`` (per-expert scales). ``device``: where the result lives (default: where
    ``weight_scale_2`` is)."""
    a = weight_scale_2.to(device=device, dtype=torch.float32)
    if input_scale is not None:
        s = input_scale.to(device=a.device, dtype=torch.float32)
        a = (s.reshape(()) if s.numel() == 1 else s) * a
    return a


__all__ = ["EPILOGUE_DTYPES", "OPERAND_ALIGN", "X_DTYPES", "LinearProblem", "aligned", "alignment_reason",
           "alpha_of", "call_key", "check_linear_args", "check_scale_values", "linear_spec", "misaligned_operands",
           "misalignment", "problem_of"]
