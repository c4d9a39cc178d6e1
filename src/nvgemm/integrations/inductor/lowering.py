"""Autotuned lowerings of nvgemm's GEMM ops with M-range dispatch: ``nvgemm::nvfp4_linear``,
``nvgemm::nvfp4_linear_sm90_prepared`` (Hopper weights held in the sm90 layout), ``nvgemm::nvfp4_linear_requant``,
``nvgemm::nvfp4_linear_prequant`` and ``nvgemm::nvfp4_linear_prequant_requant`` (:data:`LOWERINGS`; each op's
choice / autotune ops and candidates in :mod:`nvgemm.integrations.inductor.choices`). Described below for
``nvfp4_linear``; the others differ only where :func:`build_op_lowering` says so (requant, prequant and
prequant-requant are timed per range by :func:`_autotune_to_key`).

Built on ``torch._inductor.kernel.custom_op.register_custom_op_autotuning`` (torch >= 2.13; the
pieces used are probed in :mod:`nvgemm.integrations.inductor.compat`):

* every candidate from :func:`nvgemm.integrations.inductor.choices.candidates` becomes a ``CustomOpConfig``
  whose decomposition is one call of ``nvgemm::nvfp4_linear_choice(..., choice=<key>)``;
* ``dispatch_on={"tensor_name": "x", "dim": 0}`` with :func:`split_points` autotunes each M
  range separately (benchmarking at the top of the range) and emits a runtime ``torch.cond``
  over M, so one compiled graph with a dynamic M serves every decode batch size (no recompile,
  no re-autotune). When every range picks the same candidate the winner is inlined directly;
* Inductor's autotune cache (``autotune_local_cache``, on disk under the Inductor cache dir)
  stores each range's timings keyed by the range name, the input layouts and the candidate's
  traced graph (which includes its choice key), so a second process does not re-benchmark;
* on CUDA the candidates are benchmarked the way decode runs: inside a CUDA graph, 16 calls per
  graph, with the weight and weight-scale inputs rotated through copies larger than L2 (cold
  weights), as PyTorch does for its own NVFP4 NVGEMM (``cudagraph_unroll`` and
  ``cudagraph_cold_cache_input_indices`` on the benchmark request; torch >= 2.15, Inductor's
  default benchmarking before that).

Shortcuts: with one candidate (e.g. on CPU, where only the emulated reference runs) or outside
``max-autotune`` (policy's first pick, like Inductor's own GEMMs), the choice op is emitted
directly with no tracing or benchmarking. Inductor's subgraph autotuning cannot take *unbacked*
sizes, so an unbacked M also gets the policy's first pick (mark the batch with
``torch._dynamo.mark_dynamic`` to autotune per range).

This module imports ``torch._inductor``; only :mod:`nvgemm.integrations.inductor.registration` imports it,
from ``nvgemm.enable()``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import re
from typing import Any, Callable, Optional

import torch

from nvgemm.core.backend import PREQUANT, REQUANT
from nvgemm.core.formats import NVFP4, blocked_numel
from nvgemm.dispatch.registry import LinearProblem
from nvgemm.integrations.inductor import choices as _choices, compat

log = logging.getLogger("nvgemm_cutedsl")

#: M split points used when ``nvgemm.heuristics`` has no ``m_buckets``: the decode bands of the
#: NVFP4 policy (narrow-N swap-AB tiles up to 8 and 32 tokens, the 33-64 band, up to 256), then
#: everything above 256 (prefill) in one range.
DEFAULT_SPLIT_POINTS = (8, 32, 64, 256)
#: Benchmark M for the unbounded last range (prefill-sized).
RANGE_UPPER_BOUND = 1024
#: Calls per captured CUDA graph when benchmarking (PyTorch's NVFP4 policy uses 16 too).
CUDAGRAPH_UNROLL = 16
#: Input indices of the operands kept cold in L2 while benchmarking (weight, weight_scale).
COLD_INPUT_INDICES = (1, 2)
NAME = "nvgemm_cutedsl_nvfp4_linear"

_CURRENT: contextvars.ContextVar[Optional[dict]] = contextvars.ContextVar("nvgemm_cutedsl_current", default=None)


def split_points() -> list[int]:
    """M split points: ``nvgemm.heuristics.m_buckets`` when it exists, else the defaults.

    ``m_buckets`` may be a sequence of inclusive upper bounds (ints) or of ``(lo, hi)`` pairs;
    an unbounded last bucket (None / inf) is implied.
    """
    try:
        # lazy: optional here (the except ImportError below falls back)
        from nvgemm import heuristics
    except ImportError:  # pragma: no cover
        heuristics = None
    raw = getattr(heuristics, "m_buckets", None) if heuristics is not None else None
    if callable(raw):
        raw = raw()
    pts: list[int] = []
    for b in raw or ():
        hi = b[1] if isinstance(b, (tuple, list)) else b
        if hi is None or hi == float("inf"):
            continue
        pts.append(int(hi))
    pts = sorted(set(p for p in pts if p >= 1))
    return pts or list(DEFAULT_SPLIT_POINTS)


# --------------------------------------------------------------------------- benchmark inputs


def _gen_like(fake: torch.Tensor, device=None) -> torch.Tensor:
    """A real benchmark input for any of the op's operands, chosen by dtype (never NaN/Inf), on ``device``
    (default: the fake's)."""
    shape, dev = tuple(fake.shape), device or fake.device
    if fake.dtype == torch.uint8:
        return torch.randint(0, 256, shape, dtype=torch.uint8, device=dev)
    if fake.dtype == torch.float8_e4m3fn:
        return (torch.rand(shape, device=dev) * 2 + 0.25).to(torch.float8_e4m3fn)
    if fake.dtype == torch.float32 and fake.numel() <= max(fake.shape, default=1):
        return torch.rand(shape, device=dev) * 1e-2 + 1e-3  # scales
    return torch.randn(shape, dtype=fake.dtype, device=dev)




# --------------------------------------------------------------------------- problem from IR


def _ir_meta(node) -> tuple[Any, torch.dtype, list]:
    return node.get_device(), node.get_dtype(), list(node.get_size())


def _guard_int(expr) -> int:
    from torch._inductor.virtualized import V

    if isinstance(expr, int):
        return expr
    sv = V.graph.sizevars
    guard_int = getattr(sv, "guard_int", None) or sv.evaluate_static_shape  # renamed in torch 2.8
    return int(guard_int(expr))


def _problem(x, n, k: int, ws2, input_scale, bias, residual, activation: str, out_dtype, x_dtype=None,
             rows=None) -> LinearProblem:
    """A ``LinearProblem`` for the candidate policy from IR nodes (M = the hint of ``x``'s leading dims, or of
    ``rows`` when given)."""
    from torch._inductor.virtualized import V

    dev, xd, xsize = _ir_meta(x)
    x_dtype = x_dtype or xd
    m = 1
    for s in (xsize[:-1] if rows is None else rows):
        m *= V.graph.sizevars.optimization_hint(s, fallback=1)
    cap = None
    if dev is not None and dev.type == "cuda":
        cap = torch.cuda.get_device_capability(dev)
    return LinearProblem(
        m=int(m), n=int(n), k=int(k), device_type=dev.type if dev is not None else "cpu",
        capability=cap, weight_only=input_scale is None, x_dtype=x_dtype, out_dtype=out_dtype or x_dtype,
        alpha="vector" if len(ws2.get_size()) == 1 else "scalar", bias=bias is not None, activation=activation,
        residual=residual is not None,
    )


def problem_from_ir(args: list) -> LinearProblem:
    """A ``LinearProblem`` for the candidate policy from ``nvfp4_linear``'s IR arguments (M = hint)."""
    x, weight, _ws, ws2, input_scale, bias, residual, activation, out_dtype = args
    wsize = list(weight.get_size())
    # The weight's N and K pick and compile the kernel, so they are specialised (with a guard: a
    # weight of another shape recompiles) when torch.compile(dynamic=True) made them symbolic.
    n, k_half = _guard_int(wsize[0]), _guard_int(wsize[1])
    return _problem(x, n, k_half * 2, ws2, input_scale, bias, residual, activation, out_dtype)


def prepared_problem_from_ir(args: list) -> LinearProblem:
    """The same for ``nvfp4_linear_sm90_prepared`` (N and K are the op's integer arguments)."""
    x, _pw, _ps, ws2, input_scale, bias, residual, activation, out_dtype, n, k, _kind = args
    return _problem(x, n, k, ws2, input_scale, bias, residual, activation, out_dtype)


def prequant_problem_from_ir(args: list) -> LinearProblem:
    """The same for ``nvfp4_linear_prequant`` (``ChoiceOpDef`` order): M and K from the packed activation."""
    packed, _scales, weight, _ws, ws2, input_scale, bias, residual, out_dtype = args
    psize = list(packed.get_size())
    return _problem(packed, _guard_int(list(weight.get_size())[0]), _guard_int(psize[1]) * 2, ws2, input_scale, bias,
                    residual, "none", out_dtype, x_dtype=out_dtype, rows=psize[:1])


def requant_problem_from_ir(args: list) -> LinearProblem:
    """The same for ``nvfp4_linear_requant`` (``ChoiceOpDef`` order: out_input_scale before bias)."""
    x, weight, _ws, ws2, input_scale, _ois, bias, out_dtype = args
    wsize = list(weight.get_size())
    return _problem(x, _guard_int(wsize[0]), _guard_int(wsize[1]) * 2, ws2, input_scale, bias, None, "silu_mul",
                    out_dtype)


def prequant_requant_problem_from_ir(args: list) -> LinearProblem:
    """The same for ``nvfp4_linear_prequant_requant`` (``ChoiceOpDef`` order: out_input_scale before bias): M and K
    from the packed activation, the rounding dtype ``out_dtype``."""
    packed, _scales, weight, _ws, ws2, input_scale, _ois, bias, out_dtype = args
    psize = list(packed.get_size())
    return _problem(packed, _guard_int(list(weight.get_size())[0]), _guard_int(psize[1]) * 2, ws2, input_scale, bias,
                    None, "silu_mul", out_dtype, x_dtype=out_dtype, rows=psize[:1])


def _has_unbacked(expr) -> bool:
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return not isinstance(expr, int) and bool(free_unbacked_symbols(expr))


def _decomposition(opdef: _choices.ChoiceOpDef, tensor_names: Optional[tuple[str, ...]], choice: str):
    """One candidate's decomposition: a single call of ``opdef``'s choice op with ``choice``.

    The choice is baked into the function (not a config parameter): torch 2.11-2.14 build the
    op's eager fallback choice with the first candidate's parameters, and 2.11 puts parameter
    values into generated variable names. The name is a plain identifier for the same reason.
    Every release passes the present tensor arguments positionally and the rest by name; torch
    2.11 maps ``input_gen_fns`` (keyed by argument name) to input positions through the
    decomposition's signature (2.12+ uses the op schema), so the signature names those tensors.
    A multi-output choice op (requant) is timed through its first output.
    """
    import inspect

    choice_op = opdef.choice_overload()

    def nvgemm_cutedsl_choice(*tensors, **kwargs):
        out = choice_op(*opdef.op_order(opdef.args_from(tensors, kwargs)), choice)
        return out[0] if isinstance(out, (tuple, list)) else out

    stem = "linear" if opdef is _choices.LINEAR_DEF else opdef.op.replace("nvfp4_linear_", "")
    name = f"nvgemm_cutedsl_{stem}_" + re.sub(r"\W", "_", choice)
    nvgemm_cutedsl_choice.__name__ = nvgemm_cutedsl_choice.__qualname__ = name
    nvgemm_cutedsl_choice.nvgemm_choice = choice  # type: ignore[attr-defined]
    P = inspect.Parameter
    names = tensor_names if tensor_names is not None else opdef.autotune_arg_names[:opdef.first_optional]
    nvgemm_cutedsl_choice.__signature__ = inspect.Signature(
        [P(n, P.POSITIONAL_ONLY) for n in names] + [P("kwargs", P.VAR_KEYWORD)]
    )
    return nvgemm_cutedsl_choice


def _config_generator_for(opdef: _choices.ChoiceOpDef):
    def config_generator(_fake_tensors: dict) -> list:
        from torch._inductor.kernel.custom_op import CustomOpConfig

        cur = _CURRENT.get()
        if cur is None or cur["opdef"] is not opdef:  # not called through our wrapper: only the reference
            return [CustomOpConfig(_decomposition(opdef, None, _choices.EMULATED))]
        return [CustomOpConfig(_decomposition(opdef, cur["tensor_names"], c.key)) for c in cur["candidates"]]

    return config_generator


_config_generator = _config_generator_for(_choices.LINEAR_DEF)


# --------------------------------------------------------------------------- GPU benchmark policy


@contextlib.contextmanager
def _decode_benchmark_policy(cold_indices: tuple[int, ...] = COLD_INPUT_INDICES):
    """CUDA-graph benchmarking with ``CUDAGRAPH_UNROLL`` calls and cold weights, for our choices only."""
    from torch._inductor import config
    from torch._inductor.codegen.subgraph import SubgraphChoiceCaller

    orig = SubgraphChoiceCaller._create_benchmark_request

    def create(self):
        req = orig(self)
        if self.name.startswith(NAME):
            req.cudagraph_unroll = CUDAGRAPH_UNROLL
            req.cudagraph_cold_cache_input_indices = cold_indices
        return req

    SubgraphChoiceCaller._create_benchmark_request = create
    try:
        with config.patch(autotune_cudagraph_benchmarking_iters=CUDAGRAPH_UNROLL):
            yield
    finally:
        SubgraphChoiceCaller._create_benchmark_request = orig


# --------------------------------------------------------------------------- registration


def normalise_call(args: tuple, kwargs: dict, opdef: _choices.ChoiceOpDef = _choices.LINEAR_DEF) -> list:
    """The call's arguments, every one present, in ``opdef.arg_names`` order."""
    schema = getattr(torch.ops.nvgemm, opdef.op).default._schema
    bound = {schema.arguments[i].name: a for i, a in enumerate(args)}
    bound.update(kwargs)
    for a in schema.arguments:
        bound.setdefault(a.name, a.default_value)
    return [bound[n] for n in opdef.arg_names]


def register_range_autotuning(custom_op_def, op, config_generator, name: str, input_gen_fns: dict, pts,
                              tensor_name: str = "x") -> dict:
    """Inductor's autotuned lowerings of ``custom_op_def`` keyed ``(device kind, dynamic M)``, built with
    ``register_custom_op_autotuning`` and taken back out of the lowering table (the caller installs its
    own wrapper; ``op`` is ``custom_op_def``'s OpOverload). Static M: one autotune at that M; dynamic M: one
    per range of ``pts`` (over dim 0 of ``tensor_name``) + ``torch.cond``."""
    from torch._inductor.kernel.custom_op import register_custom_op_autotuning

    user_lowerings = compat.lowering_table()
    previous = user_lowerings.get(op)
    inner = {}
    # the emulated candidate is the explicit fallback; before 2.15 the eager op is one more choice
    extra = {"include_fallback": False} if compat.available("include_fallback") else {}
    graphs = compat.available("cudagraph_benchmarking")
    try:
        for device_kind, cudagraphs in (("cpu", False), ("cuda", True)):
            for dynamic in (True, False):
                register_custom_op_autotuning(
                    custom_op_def,  # the CustomOpDef: every release takes it (2.11 nothing else)
                    config_generator=config_generator,
                    name=name,
                    input_gen_fns=input_gen_fns,
                    dispatch_on=({"tensor_name": tensor_name, "dim": 0, "range_upper_bound": RANGE_UPPER_BOUND}
                                 if dynamic else None),
                    split_points=list(pts) if dynamic else None,
                    **({"benchmark_with_cudagraphs": cudagraphs} if graphs else {}),
                    **extra,
                )
                inner[device_kind, dynamic] = user_lowerings[op]
    finally:
        if previous is None:
            user_lowerings.pop(op, None)
        else:
            user_lowerings[op] = previous
    return inner


def _gen_e4m3_bytes(fake: torch.Tensor, device=None) -> torch.Tensor:
    """Finite e4m3 scale bytes held as uint8 (the sm90 layout's block scales)."""
    dev = device or fake.device
    return (torch.rand(tuple(fake.shape), device=dev) * 2 + 0.25).to(torch.float8_e4m3fn).view(torch.uint8)


def _gen_for(opdef: _choices.ChoiceOpDef, name: str):
    return _gen_e4m3_bytes if (opdef is _choices.PREPARED_DEF and name == "pscale") else _gen_like


def _input_gen_fns(opdef: _choices.ChoiceOpDef) -> dict:
    return {name: _gen_for(opdef, name) for name in opdef.autotune_arg_names[:opdef.n_tensor_slots]}


def _range_input_gen_fns(spec, packed: list, problem: LinearProblem, target: Optional[int]) -> dict:
    """Benchmark-input generators of the autotune op's tensors; with ``target``, every tensor with a row per
    token is made ``target`` rows long (the activation, a residual, prequant's swizzled activation scales)."""
    opdef = spec.opdef
    names = opdef.autotune_arg_names
    f, o = opdef.first_optional, len(opdef.optional)
    slot_names = [n for n in packed[f + o].split(",") if n]
    per_token = {names[0]} | {names[f + i] for i, n in enumerate(slot_names) if n == "residual"}
    fns = _input_gen_fns(opdef)
    if target is None:
        return fns

    def sized(name, base):
        def gen(fake: torch.Tensor) -> torch.Tensor:
            shape = list(fake.shape)
            if name in per_token:
                shape[0] = target
            elif opdef in (_choices.PREQUANT_DEF, _choices.PREQUANT_REQUANT_DEF) and name == "scales":
                shape = [blocked_numel(target, problem.k // NVFP4.block_size)]
            return base(torch.empty(shape, dtype=fake.dtype, device="meta"), fake.device)
        return gen

    return {name: sized(name, _gen_for(opdef, name)) for name in fns}


def _autotune_to_key(spec, packed: list, names: tuple[str, ...], problem: LinearProblem, cands: list,
                     dynamic: bool, decode_policy: bool) -> str:
    """Autotune ``spec``'s op through its autotune op (a multi-output op's returns its first output) and
    return the winning choice key; with a dynamic M, one autotune per M range (benchmarked at the top of the
    range, :data:`RANGE_UPPER_BOUND` for the last) and a range-table key
    (:func:`nvgemm.integrations.inductor.choices.range_choice`) when the ranges pick different winners. The
    compiled code calls the op's choice op once with that key; the choice op picks the range's candidate
    from M on the host. Inductor inlines each range's winning graph as well; nothing reads it, so the
    scheduler drops it (the tests check the generated code calls the op once)."""
    from torch._inductor import ir
    from torch._inductor.kernel import custom_op as co

    opdef = spec.opdef
    op = getattr(torch.ops.nvgemm, opdef.autotune_op).default
    decomps = [_decomposition(opdef, names, c.key) for c in cands]
    inputs, kwargs = [], {}
    for name, a in zip(opdef.autotune_arg_names, packed):
        if isinstance(a, ir.IRNode):
            inputs.append(a)
        else:
            kwargs[name] = a
    extra = {"include_fallback": False} if compat.available("include_fallback") else {}
    cuda = problem.device_type == "cuda"
    if compat.available("cudagraph_benchmarking"):
        extra["benchmark_with_cudagraphs"] = cuda
    if dynamic:
        pts = split_points()
        ranges = [(lo, hi) for lo, hi in zip([1] + [p + 1 for p in pts], [*pts, None])]
    else:
        ranges = [(None, None)]
    winners = []
    with (_decode_benchmark_policy(spec.cold) if cuda and decode_policy else contextlib.nullcontext()):
        for lo, hi in ranges:
            name = spec.name if lo is None else f"{spec.name}_range_{lo}_{'inf' if hi is None else hi}"
            target = None if lo is None else (RANGE_UPPER_BOUND if hi is None else hi)
            _result, win = co.autotune_custom_op(
                name=name, decompositions=decomps, inputs=inputs, non_tensor_args=[dict(kwargs) for _ in decomps],
                op_overload=op, user_input_gen_fns=_range_input_gen_fns(spec, packed, problem, target), **extra)
            dec = getattr(win, "decomposition", None)
            winners.append((hi, getattr(dec, "nvgemm_choice", _choices.EMULATED)))  # no decomposition: the eager op
    if len({k for _, k in winners}) == 1:
        return winners[0][1]
    return _choices.range_choice(winners)


@dataclasses.dataclass(frozen=True)
class _OpLowering:
    """One op nvgemm's lowering autotunes (see :func:`build_op_lowering`)."""

    opdef: _choices.ChoiceOpDef
    name: str  # autotuning choice-name prefix (starts with NAME: the benchmark policy keys on it)
    problem: Callable[[list], LinearProblem]
    candidates: Callable[[LinearProblem, Optional[set[str]]], list]
    cold: tuple[int, ...]  # autotune-op input indices of the weight and its scales
    #: autotuned per range by :func:`_autotune_to_key` and called once with a (range-table) choice, not through
    #: Inductor's torch.cond range dispatch: multi-output ops (requant), and ops whose activation is not a
    #: float tensor that Inductor's range input generator can resize (prequant's packed codes and scales)
    by_key: bool = False


LOWERINGS = {
    # candidate functions are looked up at call time (codegen.policy_pick_only and tests patch the module's)
    "nvfp4_linear": _OpLowering(_choices.LINEAR_DEF, NAME, problem_from_ir,
                                lambda p, allowed: _choices.candidates(p, allowed), COLD_INPUT_INDICES),
    "nvfp4_linear_sm90_prepared": _OpLowering(_choices.PREPARED_DEF, NAME + "_sm90_prepared", prepared_problem_from_ir,
                                              lambda p, allowed: _choices.prepared_candidates(p, allowed), (1, 2)),
    "nvfp4_linear_prequant": _OpLowering(_choices.PREQUANT_DEF, NAME + "_prequant", prequant_problem_from_ir,
                                         lambda p, allowed: _choices.candidates(p, allowed, PREQUANT), (2, 3),
                                         by_key=True),
    "nvfp4_linear_requant": _OpLowering(_choices.REQUANT_DEF, NAME + "_requant", requant_problem_from_ir,
                                        lambda p, allowed: _choices.candidates(p, allowed, REQUANT), (1, 2),
                                        by_key=True),
    "nvfp4_linear_prequant_requant": _OpLowering(_choices.PREQUANT_REQUANT_DEF, NAME + "_prequant_requant",
                                                 prequant_requant_problem_from_ir,
                                                 lambda p, allowed: _choices.prequant_requant_candidates(p, allowed),
                                                 (2, 3), by_key=True),
}


def build_lowering(allowed: Optional[set[str]] = None):
    """Return the lowering-table entry for ``nvgemm::nvfp4_linear`` (without installing it)."""
    return build_op_lowering("nvfp4_linear", allowed)


def build_op_lowering(op_name: str, allowed: Optional[set[str]] = None):
    """Return the lowering-table entry for ``nvgemm::<op_name>`` (one of :data:`LOWERINGS`), not installed.

    The call's candidates (the policy's configs of each kernel backend that supports the problem, ranked by
    the performance model, then the emulated reference) are autotuned per M range under max-autotune, and the
    winner is one call of the op's choice op; outside max-autotune, with one candidate, or with an unbacked
    M, the policy's first pick is called directly. Autotuning is registered on the op's autotune op (packed
    optionals, see :class:`~nvgemm.integrations.inductor.choices.ChoiceOpDef`); this lowering packs and calls
    it. A multi-output op (requant) is timed through its first output, then the winner is called for all
    outputs.
    """
    spec = LOWERINGS[op_name]
    opdef = spec.opdef
    pts = split_points()
    custom_def = getattr(_choices, opdef.autotune_op)
    inner = {} if spec.by_key else register_range_autotuning(
        custom_def, getattr(torch.ops.nvgemm, opdef.autotune_op).default, _config_generator_for(opdef), spec.name,
        _input_gen_fns(opdef), pts, tensor_name=opdef.arg_names[0])
    decode_policy = compat.available("decode_benchmark_policy")
    n_tensors = opdef.n_tensor_slots

    def nvgemm_cutedsl_lowering(*args, **kwargs):
        from torch._inductor import config as inductor_config, ir
        from torch._inductor.lowering import fallback_handler

        compat.nvgemm_counters()["lowered"] += 1
        compat.nvgemm_counters()[f"lowered_{op_name}"] += 1
        full = normalise_call(args, kwargs, opdef)
        # Kernels read the activation row-major; the autotuner needs every input as a buffer with a layout.
        full[0] = ir.ExternKernel.require_contiguous(full[0])
        for i in range(1, n_tensors):
            if full[i] is not None:
                full[i] = ir.ExternKernel.realize_input(full[i])
                # Inductor's custom-op autotuning takes only TensorBox / Buffer (2.11: not StorageBox) as tensors;
                # anything else -- a ReinterpretView of a buffer, e.g. a residual folded in as a row view -- would
                # be passed as a non-tensor argument
                if not isinstance(full[i], (ir.TensorBox, ir.Buffer)) or isinstance(full[i], ir.StorageBox):
                    full[i] = ir.TensorBox(full[i])
        problem = spec.problem(full)
        cands = spec.candidates(problem, allowed)
        log.info(
            "nvgemm_cutedsl: autotuning %s N=%d K=%d (%s) over %d candidates, M splits %s: %s", op_name,
            problem.n, problem.k, "W4A16" if problem.weight_only else "W4A4", len(cands), pts,
            [c.key for c in cands],
        )
        m_expr = full[0].get_size()[0]
        if len(cands) > 1 and not (inductor_config.max_autotune or inductor_config.max_autotune_gemm):
            # Like Inductor's own GEMMs: benchmark only under max-autotune; otherwise the policy's pick.
            cands = cands[:1]
        if len(cands) > 1 and _has_unbacked(m_expr):
            # Inductor's subgraph autotuning cannot take unbacked sizes (SubgraphChoiceCaller
            # asserts). Use the policy's first kernel candidate for every M, untimed.
            log.warning(
                "nvgemm_cutedsl: M is unbacked (%s); Inductor cannot autotune subgraphs over unbacked "
                "sizes, using the policy's first candidate %s untimed. Mark the batch dim with "
                "torch._dynamo.mark_dynamic (backed) to autotune per M range.", m_expr, cands[0].key,
            )
            cands = cands[:1]
        choice_op = opdef.choice_overload()
        if len(cands) == 1:
            # Nothing to tune (e.g. CPU: only the emulated reference): call it directly, no
            # per-range tracing.
            return fallback_handler(choice_op, add_to_fallback_set=False)(*opdef.op_order(full), cands[0].key)
        compat.nvgemm_counters()[f"autotuned_{op_name}"] += 1
        packed = opdef.pack(full)
        names = tuple(n for n, a in zip(opdef.autotune_arg_names[:n_tensors], packed[:n_tensors]) if a is not None)
        dynamic = not isinstance(m_expr, int) and not m_expr.is_number
        if spec.by_key:
            key = _autotune_to_key(spec, packed, names, problem, cands, dynamic, decode_policy)
            return fallback_handler(choice_op, add_to_fallback_set=False)(*opdef.op_order(full), key)
        tok = _CURRENT.set({"opdef": opdef, "problem": problem, "candidates": cands, "tensor_names": names})
        try:
            if problem.device_type == "cuda" and decode_policy:
                with _decode_benchmark_policy(spec.cold):
                    return inner["cuda", dynamic](*packed)
            return inner["cpu", dynamic](*packed)
        finally:
            _CURRENT.reset(tok)

    nvgemm_cutedsl_lowering.split_points = pts  # type: ignore[attr-defined]
    return nvgemm_cutedsl_lowering
