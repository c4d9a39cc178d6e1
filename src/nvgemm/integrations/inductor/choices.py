"""Autotuning candidates for one ``nvgemm::nvfp4_linear`` call, and the op that runs one of them.

A candidate is a named way to compute the linear:

* ``backend:<name>[:<config>]`` -- a registered ``nvgemm.dispatch.registry`` kernel backend
  (``cutedsl_sm100``, ``cutedsl_sm90``, ``triton_w4a16``, ..., and ``emulated``, the
  always-correct reference that every list ends with), run through
  ``nvgemm::nvfp4_linear_choice``. ``<config>`` is a kernel config name from
  ``nvgemm.heuristics.candidates`` when that module provides it and the backend's ``run``
  accepts a ``config=`` keyword; otherwise the backend picks its own config.
* ``cublaslt`` -- ``torch._scaled_mm`` (cuBLASLt block-scaled NVFP4) + the nvgemm epilogue in
  fp32, on Blackwell (sm_100/103) W4A4 only. This is the baseline PyTorch itself uses.

Choice names, kernel names and log lines say ``nvgemm_cutedsl`` so they never read as PyTorch's
own NVGEMM. Nothing here imports ``torch._inductor``.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Optional

import torch

from nvgemm import settings
from nvgemm.epilogues import EpilogueSpec, epilogue_ref
from nvgemm.core.formats import NVFP4
from nvgemm.core.validation import alpha_of, check_linear_args, linear_spec, misaligned_operands, problem_of
from nvgemm.dispatch.registry import LinearProblem, backends as registered_backends

log = logging.getLogger("nvgemm_cutedsl")

#: Order of ``nvgemm::nvfp4_linear``'s arguments (the capture pass writes every call this way).
LINEAR_ARG_NAMES = (
    "x", "weight", "weight_scale", "weight_scale_2", "input_scale", "bias", "residual", "activation", "out_dtype",
)
EMULATED = "backend:emulated"
CUBLASLT = "cublaslt"


@dataclass(frozen=True)
class Candidate:
    """One autotuning choice: ``key`` is what the generated code passes to the choice op."""

    key: str

    @property
    def kind(self) -> str:
        return self.key.split(":", 1)[0]

    @property
    def backend(self) -> Optional[str]:
        parts = self.key.split(":")
        return parts[1] if parts[0] == "backend" else None

    @property
    def config(self) -> Optional[str]:
        parts = self.key.split(":")
        return parts[2] if parts[0] == "backend" and len(parts) > 2 else None


def _allowed_from_env() -> Optional[set[str]]:
    """``NVGEMM_INDUCTOR_CHOICES=emulated,cutedsl_sm100,cublaslt`` restricts the candidate kinds."""
    names = settings.NVGEMM_INDUCTOR_CHOICES
    return set(names) if names else None


def _heuristic_configs(problem: LinearProblem, backend: str) -> list[str]:
    """Config names the heuristics module ranks for ``backend`` (empty when it has none)."""
    try:
        # lazy: optional here (the except ImportError below falls back)
        from nvgemm import heuristics
    except ImportError:  # pragma: no cover - the package always has it
        return []
    fn = getattr(heuristics, "candidates", None)
    if fn is None:
        return []
    try:
        cfgs = fn(problem)
    except Exception as e:  # the policy must never break compilation; log and use the backend default
        log.warning("nvgemm_cutedsl: heuristics.candidates(%s) failed: %s", problem, e)
        return []
    names = []
    for c in cfgs or ():
        b = getattr(c, "backend", None)
        if b is not None and b != backend:
            continue
        name = c.name() if callable(getattr(c, "name", None)) else getattr(c, "name", None)
        if isinstance(name, str) and ":" not in name:
            names.append(name)
    return names


def _backend_takes_config(backend) -> bool:
    try:
        return "config" in inspect.signature(backend.run).parameters
    except (TypeError, ValueError):
        return False


def cublaslt_supported(problem: LinearProblem) -> Optional[str]:
    """None when ``torch._scaled_mm`` can run this NVFP4 problem, else the reason."""
    if problem.device_type != "cuda" or problem.capability is None:
        return "cuBLASLt NVFP4 needs a CUDA device"
    if problem.capability[0] != 10:
        return f"cuBLASLt NVFP4 needs sm_100/sm_103, got sm_{problem.capability[0]}{problem.capability[1]}"
    if problem.weight_only:
        return "cuBLASLt NVFP4 needs an FP4 activation (W4A4); this layer is weight-only"
    if problem.k % 32:
        return f"cuBLASLt NVFP4 needs K % 32 == 0, got K={problem.k}"
    return None


def candidates(problem: LinearProblem, allowed: Optional[set[str]] = None) -> list[Candidate]:
    """The policy's choices for ``problem`` on its device, always ending with the emulated op.

    ``allowed`` (or ``NVGEMM_INDUCTOR_CHOICES``) restricts kinds by backend name or ``cublaslt``.
    """
    allowed = allowed if allowed is not None else _allowed_from_env()
    out: list[Candidate] = []
    for b in registered_backends():
        if b.name == "emulated" or (allowed is not None and b.name not in allowed):
            continue
        if allowed is None and not b.autotune:
            continue  # forced-only tools (the PTX emulator's backends), unless named in ``allowed``
        reason = b.supports(problem)
        if reason is not None:
            log.debug("nvgemm_cutedsl: backend %s skipped for %s: %s", b.name, problem, reason)
            continue
        cfgs = _heuristic_configs(problem, b.name) if _backend_takes_config(b) else []
        if cfgs:
            out.extend(Candidate(f"backend:{b.name}:{c}") for c in cfgs)
        else:
            out.append(Candidate(f"backend:{b.name}"))
    if (allowed is None or CUBLASLT in allowed) and cublaslt_supported(problem) is None:
        out.append(Candidate(CUBLASLT))
    out.append(Candidate(EMULATED))  # always present: the correct fallback
    return out


# --------------------------------------------------------------------------- the choice op


def _find_backend(name: str):
    for b in registered_backends():
        if b.name == name:
            return b
    raise RuntimeError(
        f"nvgemm_cutedsl: compiled code asks for backend {name!r}, which is not registered in this process "
        f"(have {[b.name for b in registered_backends()]}); import the module that provides it or recompile"
    )


def _cublaslt_linear(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype):
    """The call (validated by the choice op) on ``torch._scaled_mm``."""
    spec = linear_spec(x.dtype, weight_scale_2, bias, residual, activation, out_dtype)
    k = weight.shape[1] * 2
    x2 = x.reshape(-1, k)
    qx, sx = torch.ops.nvgemm.quantize_nvfp4(x2, input_scale, True)
    fp4 = torch.float4_e2m1fn_x2
    acc = torch._scaled_mm(
        qx.view(fp4), weight.view(fp4).t(), sx.view(torch.float8_e4m3fn), weight_scale.view(torch.float8_e4m3fn).reshape(-1),
        out_dtype=torch.float32,
    )
    res2 = residual.reshape(-1, residual.shape[-1]) if residual is not None else None
    out = epilogue_ref(acc, spec, alpha_of(weight_scale_2, input_scale), bias, res2)
    return out.reshape(*x.shape[:-1], out.shape[-1])


@torch.library.custom_op("nvgemm::nvfp4_linear_choice", mutates_args=())
def nvfp4_linear_choice(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
    activation: str,
    out_dtype: Optional[torch.dtype],
    choice: str,
) -> torch.Tensor:
    """``nvgemm::nvfp4_linear`` computed by one named candidate (what autotuned code calls); validated here,
    once. A call whose operands the chosen kernel cannot read in place (not 16-byte aligned) runs the eager
    op instead, which falls back with one warning naming the tensor."""
    args = (x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype)
    spec = check_linear_args(*args)
    cand = Candidate(choice)
    if cand.kind == CUBLASLT:
        return _cublaslt_linear(*args)
    if cand.kind != "backend" or not cand.backend:
        raise ValueError(f"nvgemm_cutedsl: unknown choice {choice!r}")
    b = _find_backend(cand.backend)
    if misaligned_operands(x=x, weight=weight, weight_scale=weight_scale, bias=bias, residual=residual) and \
            b.supports(problem_of(*args[:8], spec)) is not None:
        return torch.ops.nvgemm.nvfp4_linear(*args)
    if cand.config is not None:
        return b.run(*args, config=cand.config)
    return b.run(*args)


@nvfp4_linear_choice.register_fake
def _(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype, choice):
    # No comparisons involving x's leading (token) dims: the autotuner traces this with a
    # symbolic M under error_on_new_guards. The real checks run in the eager op.
    n = weight.shape[0]
    spec = EpilogueSpec(
        alpha="vector" if weight_scale_2.dim() == 1 else "scalar", bias=bias is not None, activation=activation,
        residual=residual is not None, out_dtype=out_dtype or x.dtype,
    )
    if x.shape[-1] != weight.shape[1] * 2 or x.shape[-1] % NVFP4.block_size:
        raise ValueError(f"nvgemm_cutedsl: x K={x.shape[-1]} does not match packed weight {tuple(weight.shape)}")
    return x.new_empty((*x.shape[:-1], spec.out_features(n)), dtype=spec.out_dtype)


#: Optional tensor arguments of ``nvfp4_linear``, in schema order (packed by :func:`pack_linear_args`).
OPTIONAL_TENSORS = ("input_scale", "bias", "residual")


def pack_linear_args(args: list) -> list:
    """``nvfp4_linear``'s nine arguments -> ``nvfp4_linear_autotune``'s (present optionals first).

    Inductor's custom-op autotuning (torch 2.11-2.14) calls the op's eager fallback with the tensor
    inputs *positionally* and every ``None`` by name; an absent optional tensor before a present one
    (W4A16 with a bias, a residual without a bias) would shift the positions. The autotuned op
    therefore takes the present optional tensors packed into ``t0..t2`` and names them in ``slots``.
    """
    present = [(n, a) for n, a in zip(OPTIONAL_TENSORS, args[4:7]) if a is not None]
    ts = [a for _, a in present] + [None] * (3 - len(present))
    return [*args[:4], *ts, ",".join(n for n, _ in present), args[7], args[8]]


def unpack_linear_args(x, weight, weight_scale, weight_scale_2, t0, t1, t2, slots: str, activation, out_dtype) -> list:
    """Inverse of :func:`pack_linear_args`."""
    names = [n for n in slots.split(",") if n]
    if len(set(names)) != len(names) or not set(names) <= set(OPTIONAL_TENSORS):
        raise ValueError(f"nvgemm_cutedsl: bad slots {slots!r}")
    opt = dict(zip(names, (t0, t1, t2)))
    return [x, weight, weight_scale, weight_scale_2, *(opt.get(n) for n in OPTIONAL_TENSORS), activation, out_dtype]


AUTOTUNE_ARG_NAMES = ("x", "weight", "weight_scale", "weight_scale_2", "t0", "t1", "t2", "slots", "activation",
                      "out_dtype")


def linear_args_from(tensors: tuple, kwargs: dict) -> list:
    """Rebuild ``nvfp4_linear``'s positional arguments from the autotuner's split form.

    Inductor's custom-op autotuning passes the tensor arguments positionally (in schema order,
    the capture pass writes every call fully positional) and every non-tensor argument (None,
    strings, dtypes) by name.
    """
    it = iter(tensors)
    out = []
    for name in AUTOTUNE_ARG_NAMES:
        out.append(kwargs[name] if name in kwargs else next(it))
    rest = list(it)
    if rest:
        raise ValueError(f"nvgemm_cutedsl: {len(rest)} unexpected tensor arguments")
    return unpack_linear_args(*out)


def nvgemm_cutedsl_linear(*tensors, choice: str, **kwargs):
    """Decomposition used for every candidate: one call of the choice op (an opaque kernel)."""
    args = linear_args_from(tensors, kwargs)
    return torch.ops.nvgemm.nvfp4_linear_choice(*args, choice)


@torch.library.custom_op("nvgemm::nvfp4_linear_autotune", mutates_args=())
def nvfp4_linear_autotune(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    t0: Optional[torch.Tensor] = None,
    t1: Optional[torch.Tensor] = None,
    t2: Optional[torch.Tensor] = None,
    slots: str = "",
    activation: str = "none",
    out_dtype: Optional[torch.dtype] = None,
    choice: str = EMULATED,
) -> torch.Tensor:
    """The op nvgemm's lowering autotunes: ``nvfp4_linear`` with packed optionals (:func:`pack_linear_args`).

    Every autotuning candidate decomposes into one ``nvfp4_linear_choice`` call. The eager body
    is Inductor's extra "fallback" choice on torch < 2.15 (no ``include_fallback=False``); it runs
    candidate ``choice`` (default: the emulated reference) through the opaque choice op -- never
    ``nvgemm::nvfp4_linear`` itself, which torch 2.11 would lower (and autotune) again when it
    inlines a winning fallback.
    """
    args = unpack_linear_args(x, weight, weight_scale, weight_scale_2, t0, t1, t2, slots, activation, out_dtype)
    return nvfp4_linear_choice(*args, choice)


@nvfp4_linear_autotune.register_fake
def _(x, weight, weight_scale, weight_scale_2, t0=None, t1=None, t2=None, slots="", activation="none",
      out_dtype=None, choice=EMULATED):
    args = unpack_linear_args(x, weight, weight_scale, weight_scale_2, t0, t1, t2, slots, activation, out_dtype)
    return torch.ops.nvgemm.nvfp4_linear_choice(*args, choice)
