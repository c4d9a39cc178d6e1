"""Autotuning candidates for one ``nvgemm::nvfp4_linear`` call, and the op that runs one of them.

A candidate is a named way to compute the linear:

* ``backend:<name>[:<config>]`` -- a registered ``nvgemm.dispatch.registry`` kernel backend
  (``cutedsl_sm100``, ``cutedsl_sm90``, ``cutedsl_mma_w4a16``, ``triton_w4a16``, ..., and ``emulated``, the
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
from nvgemm.core.formats import NVFP4, blocked_shape
from nvgemm.core.validation import alpha_of, check_linear_args, linear_spec, misaligned_operands, problem_of
from nvgemm.core.backend import LINEAR, PREQUANT, REQUANT
from nvgemm.dispatch.registry import LinearProblem, backends as registered_backends
from nvgemm.ops.fused import prequant_requant_check
from nvgemm.ops.prepared import PREPARED_BACKENDS, sm90_weight_of
from nvgemm.templates.sm90_w4a16.operand import kind_of, to_modelopt

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


def candidates(problem: LinearProblem, allowed: Optional[set[str]] = None, kind: str = LINEAR) -> list[Candidate]:
    """The policy's choices for ``problem`` on its device, always ending with the emulated op.

    ``allowed`` (or ``NVGEMM_INDUCTOR_CHOICES``) restricts kinds by backend name or ``cublaslt``.
    ``kind`` is the op kind of the registry (``linear``, ``requant``, ``prequant``): each kernel backend
    of that kind that supports the problem contributes one choice per config the policy ranks for it (a
    bounded, shape-aware list ordered by the performance model), or one choice when its ``run`` takes no
    config. cuBLASLt is a ``linear`` choice only.
    """
    allowed = allowed if allowed is not None else _allowed_from_env()
    out: list[Candidate] = []
    for b in registered_backends(kind):
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
    if kind == LINEAR and (allowed is None or CUBLASLT in allowed) and cublaslt_supported(problem) is None:
        out.append(Candidate(CUBLASLT))
    out.append(Candidate(EMULATED))  # always present: the correct fallback
    return out


# --------------------------------------------------------------------------- the choice op


def _find_backend(name: str, kind: str = LINEAR):
    for b in registered_backends(kind):
        if b.name == name:
            return b
    raise RuntimeError(
        f"nvgemm_cutedsl: compiled code asks for {kind} backend {name!r}, which is not registered in this process "
        f"(have {[b.name for b in registered_backends(kind)]}); import the module that provides it or recompile"
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
    # Code compiled for a GPU run on CPU tensors (the emulated backends, a CPU-only replay) and a call
    # whose operands the kernel cannot read in place both go to the eager op, which dispatches (and
    # warns) as an uncompiled call would.
    if (x.device.type != "cuda" or misaligned_operands(x=x, weight=weight, weight_scale=weight_scale, bias=bias,
                                                       residual=residual)) \
            and b.supports(problem_of(*args[:8], spec)) is not None:
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


# --------------------------------------------------------------------------- the other GEMM ops
# Each op nvgemm's lowering autotunes has the same three pieces as nvfp4_linear: a choice op (one named
# candidate; what compiled code calls and what the PDL chain recognises as a GEMM producer), an autotune op
# (the op with its optional tensors packed first, see pack_optionals) and a ChoiceOpDef tying them together.


@dataclass(frozen=True)
class ChoiceOpDef:
    """How one nvgemm op is autotuned: its schema order, where its optional tensors sit, its ops' names."""

    op: str  # the op the lowering replaces (``nvgemm::<op>``)
    arg_names: tuple[str, ...]  # its arguments, schema order
    first_optional: int  # index of the first optional tensor argument
    optional: tuple[str, ...]  # the optional tensor arguments, schema order
    choice_op: str  # ``nvgemm::<choice_op>``: the op with a trailing ``choice``
    autotune_op: str  # ``nvgemm::<autotune_op>``: optionals packed, then ``slots``, then the rest, ``choice``
    kind: str  # the registry's op kind of the backends
    #: the op's schema order when ``arg_names`` reorders it (required tensors must come first there)
    op_arg_names: Optional[tuple[str, ...]] = None

    def op_order(self, args: list) -> list:
        """``arg_names``-ordered arguments -> the op's (and its choice op's) schema order."""
        if self.op_arg_names is None:
            return list(args)
        by = dict(zip(self.arg_names, args))
        return [by[n] for n in self.op_arg_names]

    def def_order(self, args: list) -> list:
        """The op's schema-ordered arguments -> ``arg_names`` order."""
        if self.op_arg_names is None:
            return list(args)
        by = dict(zip(self.op_arg_names, args))
        return [by[n] for n in self.arg_names]

    @property
    def autotune_arg_names(self) -> tuple[str, ...]:
        f, o = self.first_optional, len(self.optional)
        return (*self.arg_names[:f], *(f"t{i}" for i in range(o)), "slots", *self.arg_names[f + o:])

    @property
    def n_tensor_slots(self) -> int:
        """Leading arguments of the autotune op that may be tensors (required ones, then t0..)."""
        return self.first_optional + len(self.optional)

    def pack(self, args: list) -> list:
        """The op's arguments (schema order, all present) -> the autotune op's (see :func:`pack_linear_args`)."""
        f, o = self.first_optional, len(self.optional)
        present = [(n, a) for n, a in zip(self.optional, args[f:f + o]) if a is not None]
        ts = [a for _, a in present] + [None] * (o - len(present))
        return [*args[:f], *ts, ",".join(n for n, _ in present), *args[f + o:]]

    def unpack(self, packed: list) -> list:
        f, o = self.first_optional, len(self.optional)
        slots = packed[f + o]
        names = [n for n in slots.split(",") if n]
        if len(set(names)) != len(names) or not set(names) <= set(self.optional):
            raise ValueError(f"nvgemm_cutedsl: bad slots {slots!r} for {self.op}")
        opt = dict(zip(names, packed[f:f + o]))
        return [*packed[:f], *(opt.get(n) for n in self.optional), *packed[f + o + 1:]]

    def args_from(self, tensors: tuple, kwargs: dict) -> list:
        """The op's arguments from the autotuner's split form (tensors positional, the rest by name)."""
        it = iter(tensors)
        out = [kwargs[name] if name in kwargs else next(it) for name in self.autotune_arg_names]
        rest = list(it)
        if rest:
            raise ValueError(f"nvgemm_cutedsl: {len(rest)} unexpected tensor arguments for {self.op}")
        return self.unpack(out)

    def choice_overload(self):
        return getattr(torch.ops.nvgemm, self.choice_op).default


LINEAR_DEF = ChoiceOpDef("nvfp4_linear", LINEAR_ARG_NAMES, 4, OPTIONAL_TENSORS, "nvfp4_linear_choice",
                         "nvfp4_linear_autotune", LINEAR)
PREPARED_DEF = ChoiceOpDef(
    "nvfp4_linear_sm90_prepared",
    ("x", "pweight", "pscale", "weight_scale_2", "input_scale", "bias", "residual", "activation", "out_dtype", "n",
     "k", "kind"),
    4, OPTIONAL_TENSORS, "nvfp4_linear_sm90_prepared_choice", "nvfp4_linear_sm90_prepared_autotune", LINEAR)
PREQUANT_DEF = ChoiceOpDef(
    "nvfp4_linear_prequant",
    ("packed", "scales", "weight", "weight_scale", "weight_scale_2", "input_scale", "bias", "residual", "out_dtype"),
    6, ("bias", "residual"), "nvfp4_linear_prequant_choice", "nvfp4_linear_prequant_autotune", PREQUANT)
REQUANT_DEF = ChoiceOpDef(
    "nvfp4_linear_requant",
    ("x", "weight", "weight_scale", "weight_scale_2", "input_scale", "out_input_scale", "bias", "out_dtype"),
    6, ("bias",), "nvfp4_linear_requant_choice", "nvfp4_linear_requant_autotune", REQUANT,
    op_arg_names=("x", "weight", "weight_scale", "weight_scale_2", "input_scale", "bias", "out_input_scale",
                  "out_dtype"))
PREQUANT_REQUANT_DEF = ChoiceOpDef(
    "nvfp4_linear_prequant_requant",
    ("packed", "scales", "weight", "weight_scale", "weight_scale_2", "input_scale", "out_input_scale", "bias",
     "out_dtype"),
    7, ("bias",), "nvfp4_linear_prequant_requant_choice", "nvfp4_linear_prequant_requant_autotune", REQUANT,
    op_arg_names=("packed", "scales", "weight", "weight_scale", "weight_scale_2", "input_scale", "bias",
                  "out_input_scale", "out_dtype"))
#: every op whose compiled calls are choice ops, by the choice op's name
CHOICE_DEFS = {d.choice_op: d for d in (LINEAR_DEF, PREPARED_DEF, PREQUANT_DEF, REQUANT_DEF, PREQUANT_REQUANT_DEF)}


RANGES = "ranges"


def range_choice(table: list[tuple[Optional[int], str]]) -> str:
    """One choice string for per-M-range winners: ``ranges:8=<key>;32=<key>;inf=<key>`` (inclusive upper
    bounds, ascending; None = unbounded)."""
    return RANGES + ":" + ";".join(f"{'inf' if hi is None else hi}={key}" for hi, key in table)


def choice_for_m(choice: str, m: int) -> str:
    """The candidate key a (possibly range-table) choice string names for ``m`` tokens."""
    if not choice.startswith(RANGES + ":"):
        return choice
    for part in choice[len(RANGES) + 1:].split(";"):
        hi, _, key = part.partition("=")
        if hi == "inf" or m <= int(hi):
            return key
    raise ValueError(f"nvgemm_cutedsl: range choice {choice!r} has no range for M={m}")


def choice_keys(choice: str) -> list[str]:
    """Every candidate key in a (possibly range-table) choice string."""
    if not choice.startswith(RANGES + ":"):
        return [choice]
    return [part.partition("=")[2] for part in choice[len(RANGES) + 1:].split(";")]


def _run_candidate(cand: Candidate, kind: str, problem: LinearProblem, args: tuple, fallback):
    """Run kernel backend candidate ``cand`` on ``args``; ``fallback()`` (the op itself, which selects a
    backend that can) when the backend refuses this call's problem -- a range of M compiled to one candidate
    may hold sizes that candidate's kernel does not take."""
    if cand.kind != "backend" or not cand.backend:
        raise ValueError(f"nvgemm_cutedsl: unknown choice {cand.key!r}")
    b = _find_backend(cand.backend, kind)
    if b.supports(problem) is not None:
        return fallback()
    if cand.config is not None:
        return b.run(*args, config=cand.config)
    return b.run(*args)


# ---- Hopper weights held in the sm90 layout (nvgemm::nvfp4_linear_sm90_prepared)

SM90 = "cutedsl_sm90"
_PREPARED_STANDINS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _prepared_standins(n: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Checkpoint-layout-shaped weight / scale stand-ins on ``device`` (expanded, no memory, never read)."""
    key = (n, k, str(device))
    hit = _PREPARED_STANDINS.get(key)
    if hit is None:
        w = torch.empty((), dtype=torch.uint8, device=device)
        hit = _PREPARED_STANDINS.setdefault(key, (w.expand(n, k // 2), w.view(torch.float8_e4m3fn).expand(
            blocked_shape(n, k // NVFP4.block_size))))
    return hit


def prepared_candidates(problem: LinearProblem, allowed: Optional[set[str]] = None) -> list[Candidate]:
    """The choices for a layer held in the sm90 layout: the policy's configs of the kernel that reads the
    prepared weight in place (``cutedsl_sm90`` on Hopper, ``cutedsl_mma_w4a16`` on sm_80 / sm_86 / sm_89 /
    sm_120a / sm_121a; :data:`~nvgemm.ops.prepared.PREPARED_BACKENDS`) and the emulated reference, last. Any other backend would rebuild the checkpoint
    layout on every call, so it is a choice only when ``allowed`` (or ``NVGEMM_INDUCTOR_CHOICES``) names it."""
    named = allowed if allowed is not None else _allowed_from_env()
    return [c for c in candidates(problem, allowed)
            if c.backend in PREPARED_BACKENDS or c.key == EMULATED or (named is not None and c.backend in named)]


@torch.library.custom_op("nvgemm::nvfp4_linear_sm90_prepared_choice", mutates_args=())
def nvfp4_linear_sm90_prepared_choice(
    x: torch.Tensor,
    pweight: torch.Tensor,
    pscale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
    activation: str,
    out_dtype: Optional[torch.dtype],
    n: int,
    k: int,
    kind: str,
    choice: str,
) -> torch.Tensor:
    """``nvgemm::nvfp4_linear_sm90_prepared`` computed by one named candidate. ``cutedsl_sm90`` /
    ``cutedsl_mma_w4a16`` run the kernel config on the prepared weight; another backend gets the checkpoint layout rebuilt (value-exact) and runs
    through ``nvfp4_linear_choice``; a call the sm90 kernel cannot take runs the op itself."""
    cand = Candidate(choice)
    args = (x, pweight, pscale, weight_scale_2, input_scale, bias, residual, activation, out_dtype, n, k, kind)
    if cand.kind != "backend" or not cand.backend:
        raise ValueError(f"nvgemm_cutedsl: unknown choice {choice!r}")
    p = sm90_weight_of(pweight, pscale, weight_scale_2, n, k, kind)
    if cand.backend not in PREPARED_BACKENDS:
        w, s = to_modelopt(p)
        return nvfp4_linear_choice(x, w, s, weight_scale_2, input_scale, bias, residual, activation, out_dtype,
                                   choice)
    w0, s0 = _prepared_standins(n, k, x.device)
    spec = check_linear_args(x, w0, s0, weight_scale_2, input_scale, bias, residual, activation, out_dtype)
    same_kind = x.dtype in (torch.bfloat16, torch.float16) and kind_of(x.dtype) == kind
    b = _find_backend(cand.backend)
    if not same_kind or b.supports(problem_of(x, w0, s0, weight_scale_2, input_scale, bias, residual, activation,
                                              spec)) is not None:
        return torch.ops.nvgemm.nvfp4_linear_sm90_prepared(*args)
    # lazy: keeps templates.sm90_w4a16.backend out of `import nvgemm`
    from nvgemm.templates.sm90_w4a16 import backend as sm90_backend

    return sm90_backend.run_prepared(x, p, input_scale, bias, residual, activation, out_dtype, cand.config)


@nvfp4_linear_sm90_prepared_choice.register_fake
def _(x, pweight, pscale, weight_scale_2, input_scale, bias, residual, activation, out_dtype, n, k, kind, choice):
    n_out = n // 2 if activation == "silu_mul" else n
    return x.new_empty((*x.shape[:-1], n_out), dtype=out_dtype or x.dtype)


@torch.library.custom_op("nvgemm::nvfp4_linear_sm90_prepared_autotune", mutates_args=())
def nvfp4_linear_sm90_prepared_autotune(
    x: torch.Tensor,
    pweight: torch.Tensor,
    pscale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    t0: Optional[torch.Tensor] = None,
    t1: Optional[torch.Tensor] = None,
    t2: Optional[torch.Tensor] = None,
    slots: str = "",
    activation: str = "none",
    out_dtype: Optional[torch.dtype] = None,
    n: int = 0,
    k: int = 0,
    kind: str = "bf16",
    choice: str = EMULATED,
) -> torch.Tensor:
    """The op nvgemm's lowering autotunes for a prepared layer (optionals packed, see ChoiceOpDef.pack)."""
    args = PREPARED_DEF.unpack([x, pweight, pscale, weight_scale_2, t0, t1, t2, slots, activation, out_dtype, n, k,
                                kind])
    return nvfp4_linear_sm90_prepared_choice(*args, choice)


@nvfp4_linear_sm90_prepared_autotune.register_fake
def _(x, pweight, pscale, weight_scale_2, t0=None, t1=None, t2=None, slots="", activation="none", out_dtype=None,
      n=0, k=0, kind="bf16", choice=EMULATED):
    args = PREPARED_DEF.unpack([x, pweight, pscale, weight_scale_2, t0, t1, t2, slots, activation, out_dtype, n, k,
                                kind])
    return torch.ops.nvgemm.nvfp4_linear_sm90_prepared_choice(*args, choice)


# ---- the fused gated-MLP chain (nvgemm::nvfp4_linear_requant -> nvgemm::nvfp4_linear_prequant)


def _prequant_problem(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, residual, out_dtype):
    """Validate a prequant call as the op does; its LinearProblem."""
    if packed.dtype != torch.uint8 or packed.dim() != 2 or weight.dim() != 2 or weight.shape[1] != packed.shape[1]:
        raise ValueError(f"nvgemm.nvfp4_linear_prequant: packed must be uint8 [M, K/2] matching weight "
                         f"{tuple(weight.shape)}, got {packed.dtype} {tuple(packed.shape)}")
    m, k = packed.shape[0], packed.shape[1] * 2
    x_meta = torch.empty((m, k), dtype=out_dtype, device="meta")
    meta = [None if t is None else t.to("meta") for t in (weight, weight_scale, weight_scale_2, input_scale, bias,
                                                         residual)]
    spec = check_linear_args(x_meta, *meta, "none", out_dtype)
    dev = packed.device
    return LinearProblem(m=m, n=weight.shape[0], k=k, device_type=dev.type,
                         capability=torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None,
                         weight_only=False, x_dtype=out_dtype, out_dtype=out_dtype, alpha=spec.alpha,
                         bias=bias is not None, activation="none", residual=residual is not None,
                         misaligned=misaligned_operands(packed=packed, scales=scales, weight=weight,
                                                        weight_scale=weight_scale, bias=bias, residual=residual),
                         residual_cast=residual is not None and residual.dtype != out_dtype)


@torch.library.custom_op("nvgemm::nvfp4_linear_prequant_choice", mutates_args=())
def nvfp4_linear_prequant_choice(
    packed: torch.Tensor,
    scales: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
    out_dtype: torch.dtype,
    choice: str,
) -> torch.Tensor:
    """``nvgemm::nvfp4_linear_prequant`` computed by one named candidate (the op itself where that candidate's
    backend does not take the call)."""
    args = (packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, residual, out_dtype)
    problem = _prequant_problem(*args)
    if (bias is not None and bias.dtype != out_dtype) or (residual is not None and residual.dtype != out_dtype) \
            or problem.misaligned:
        return torch.ops.nvgemm.nvfp4_linear_prequant(*args)
    return _run_candidate(Candidate(choice_for_m(choice, problem.m)), PREQUANT, problem, args,
                          lambda: torch.ops.nvgemm.nvfp4_linear_prequant(*args))


@nvfp4_linear_prequant_choice.register_fake
def _(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, residual, out_dtype, choice):
    return packed.new_empty((packed.shape[0], weight.shape[0]), dtype=out_dtype)


@torch.library.custom_op("nvgemm::nvfp4_linear_prequant_autotune", mutates_args=())
def nvfp4_linear_prequant_autotune(
    packed: torch.Tensor,
    scales: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: torch.Tensor,
    t0: Optional[torch.Tensor] = None,
    t1: Optional[torch.Tensor] = None,
    slots: str = "",
    out_dtype: torch.dtype = torch.bfloat16,
    choice: str = EMULATED,
) -> torch.Tensor:
    """The op nvgemm's lowering autotunes for ``nvfp4_linear_prequant`` (optionals packed)."""
    args = PREQUANT_DEF.unpack([packed, scales, weight, weight_scale, weight_scale_2, input_scale, t0, t1, slots,
                                out_dtype])
    return nvfp4_linear_prequant_choice(*args, choice)


@nvfp4_linear_prequant_autotune.register_fake
def _(packed, scales, weight, weight_scale, weight_scale_2, input_scale, t0=None, t1=None, slots="",
      out_dtype=torch.bfloat16, choice=EMULATED):
    args = PREQUANT_DEF.unpack([packed, scales, weight, weight_scale, weight_scale_2, input_scale, t0, t1, slots,
                                out_dtype])
    return torch.ops.nvgemm.nvfp4_linear_prequant_choice(*args, choice)


def _requant_problem(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype):
    """Validate a requant call as the op does (shapes and dtypes); its LinearProblem."""
    if input_scale is None or x.dim() != 2:
        raise ValueError("nvgemm.nvfp4_linear_requant: needs an input_scale (W4A4 gate_up) and a 2-D x [M, K], got "
                         f"input_scale={input_scale is not None}, x {tuple(x.shape)}")
    if out_input_scale.dtype != torch.float32 or out_input_scale.numel() != 1:
        raise ValueError("nvgemm.nvfp4_linear_requant: out_input_scale must be a float32 scalar tensor, got "
                         f"{out_input_scale.dtype} {tuple(out_input_scale.shape)}")
    spec = check_linear_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, None, "silu_mul", out_dtype)
    return problem_of(x, weight, weight_scale, weight_scale_2, input_scale, bias, None, "silu_mul", spec), spec


@torch.library.custom_op("nvgemm::nvfp4_linear_requant_choice", mutates_args=())
def nvfp4_linear_requant_choice(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    out_input_scale: torch.Tensor,
    out_dtype: Optional[torch.dtype],
    choice: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``nvgemm::nvfp4_linear_requant`` computed by one named candidate (the op itself where that candidate's
    backend does not take the call, e.g. more tokens than the fused launch holds)."""
    args = (x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype)
    problem, spec = _requant_problem(*args)
    if (bias is not None and bias.dtype != spec.out_dtype) or problem.misaligned:
        return torch.ops.nvgemm.nvfp4_linear_requant(*args)
    return _run_candidate(Candidate(choice_for_m(choice, problem.m)), REQUANT, problem, args,
                          lambda: torch.ops.nvgemm.nvfp4_linear_requant(*args))


@nvfp4_linear_requant_choice.register_fake
def _(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype, choice):
    return torch.ops.nvgemm.nvfp4_linear_requant(x, weight, weight_scale, weight_scale_2, input_scale, bias,
                                                 out_input_scale, out_dtype)


@torch.library.custom_op("nvgemm::nvfp4_linear_requant_autotune", mutates_args=())
def nvfp4_linear_requant_autotune(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: torch.Tensor,
    out_input_scale: torch.Tensor,
    t0: Optional[torch.Tensor] = None,
    slots: str = "",
    out_dtype: Optional[torch.dtype] = None,
    choice: str = EMULATED,
) -> torch.Tensor:
    """What the lowering times for ``nvfp4_linear_requant``: one candidate's whole launch, returning the packed
    codes only (Inductor's custom-op autotuning takes single-output ops). The compiled code then calls the
    winning candidate's ``nvfp4_linear_requant_choice``, which returns both outputs."""
    args = REQUANT_DEF.op_order(REQUANT_DEF.unpack([x, weight, weight_scale, weight_scale_2, input_scale,
                                                    out_input_scale, t0, slots, out_dtype]))
    return nvfp4_linear_requant_choice(*args, choice)[0]


@nvfp4_linear_requant_autotune.register_fake
def _(x, weight, weight_scale, weight_scale_2, input_scale, out_input_scale, t0=None, slots="", out_dtype=None,
      choice=EMULATED):
    return x.new_empty((x.shape[0], weight.shape[0] // 4), dtype=torch.uint8)


# ---- the gate_up GEMM fed by the fused RMSNorm quantizer (nvgemm::nvfp4_linear_prequant_requant)

#: requant backends that cannot take an activation that arrives quantized (their dense GEMM re-quantizes x)
_NEEDS_X = frozenset({"unfused"})


def prequant_requant_candidates(problem: LinearProblem, allowed: Optional[set[str]] = None) -> list[Candidate]:
    """The choices for a fused gate_up GEMM whose activation arrives quantized: the ``requant`` kernel backends
    that take ``quantized=(packed, scales)`` (every one but the unfused chain), then the emulated reference."""
    return [c for c in candidates(problem, allowed, REQUANT) if c.backend not in _NEEDS_X]


def _prequant_requant_problem(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias,
                              out_input_scale, out_dtype):
    """Validate a prequant-requant call as the op does; (its LinearProblem, its epilogue spec)."""
    spec = prequant_requant_check(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias,
                                   out_input_scale, out_dtype)
    dev = packed.device
    return LinearProblem(m=packed.shape[0], n=weight.shape[0], k=packed.shape[1] * 2, device_type=dev.type,
                         capability=torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None,
                         weight_only=False, x_dtype=out_dtype, out_dtype=out_dtype, alpha=spec.alpha,
                         bias=bias is not None, activation="silu_mul", residual=False,
                         misaligned=misaligned_operands(packed=packed, scales=scales, weight=weight,
                                                        weight_scale=weight_scale, bias=bias)), spec


@torch.library.custom_op("nvgemm::nvfp4_linear_prequant_requant_choice", mutates_args=())
def nvfp4_linear_prequant_requant_choice(
    packed: torch.Tensor,
    scales: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    out_input_scale: torch.Tensor,
    out_dtype: torch.dtype,
    choice: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``nvgemm::nvfp4_linear_prequant_requant`` computed by one named candidate (a ``requant`` backend run with
    ``quantized=(packed, scales)``); the op itself where that candidate's backend does not take the call."""
    args = (packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype)
    problem, _spec = _prequant_requant_problem(*args)
    cand = Candidate(choice_for_m(choice, problem.m))
    if cand.kind != "backend" or not cand.backend or cand.backend in _NEEDS_X:
        raise ValueError(f"nvgemm_cutedsl: unknown choice {choice!r} for nvfp4_linear_prequant_requant")
    b = _find_backend(cand.backend, REQUANT)
    if (bias is not None and bias.dtype != out_dtype) or problem.misaligned or b.supports(problem) is not None:
        return torch.ops.nvgemm.nvfp4_linear_prequant_requant(*args)
    run_args = (None, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype)
    if cand.config is not None:
        return b.run(*run_args, quantized=(packed, scales), config=cand.config)
    return b.run(*run_args, quantized=(packed, scales))


@nvfp4_linear_prequant_requant_choice.register_fake
def _(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype, choice):
    return torch.ops.nvgemm.nvfp4_linear_prequant_requant(packed, scales, weight, weight_scale, weight_scale_2,
                                                          input_scale, bias, out_input_scale, out_dtype)


@torch.library.custom_op("nvgemm::nvfp4_linear_prequant_requant_autotune", mutates_args=())
def nvfp4_linear_prequant_requant_autotune(
    packed: torch.Tensor,
    scales: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: torch.Tensor,
    out_input_scale: torch.Tensor,
    t0: Optional[torch.Tensor] = None,
    slots: str = "",
    out_dtype: torch.dtype = torch.bfloat16,
    choice: str = EMULATED,
) -> torch.Tensor:
    """What the lowering times for ``nvfp4_linear_prequant_requant``: one candidate's whole launch, returning the
    packed codes only (as for requant); the compiled code calls the winner's choice op for both outputs."""
    args = PREQUANT_REQUANT_DEF.op_order(PREQUANT_REQUANT_DEF.unpack(
        [packed, scales, weight, weight_scale, weight_scale_2, input_scale, out_input_scale, t0, slots, out_dtype]))
    return nvfp4_linear_prequant_requant_choice(*args, choice)[0]


@nvfp4_linear_prequant_requant_autotune.register_fake
def _(packed, scales, weight, weight_scale, weight_scale_2, input_scale, out_input_scale, t0=None, slots="",
      out_dtype=torch.bfloat16, choice=EMULATED):
    return packed.new_empty((packed.shape[0], weight.shape[0] // 4), dtype=torch.uint8)
