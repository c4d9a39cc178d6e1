"""Autotuned lowering of ``nvgemm::nvfp4_linear`` with M-range dispatch.

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
import logging
import re
from typing import Any, Optional

import torch

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


def _gen_like(fake: torch.Tensor) -> torch.Tensor:
    """A real benchmark input for any of the op's operands, chosen by dtype (never NaN/Inf)."""
    shape, dev = tuple(fake.shape), fake.device
    if fake.dtype == torch.uint8:
        return torch.randint(0, 256, shape, dtype=torch.uint8, device=dev)
    if fake.dtype == torch.float8_e4m3fn:
        return (torch.rand(shape, device=dev) * 2 + 0.25).to(torch.float8_e4m3fn)
    if fake.dtype == torch.float32 and fake.numel() <= max(fake.shape, default=1):
        return torch.rand(shape, device=dev) * 1e-2 + 1e-3  # scales
    return torch.randn(shape, dtype=fake.dtype, device=dev)


INPUT_GEN_FNS = {name: _gen_like for name in _choices.AUTOTUNE_ARG_NAMES[:7]}


# --------------------------------------------------------------------------- problem from IR


def _ir_meta(node) -> tuple[Any, torch.dtype, list]:
    return node.get_device(), node.get_dtype(), list(node.get_size())


def problem_from_ir(args: list) -> LinearProblem:
    """A ``LinearProblem`` for the candidate policy from the lowering's IR arguments (M = hint)."""
    from torch._inductor.virtualized import V

    x, weight, _ws, ws2, input_scale, bias, residual, activation, out_dtype = args
    dev, x_dtype, xsize = _ir_meta(x)
    _, _, wsize = _ir_meta(weight)
    m = 1
    for s in xsize[:-1]:
        m *= V.graph.sizevars.optimization_hint(s, fallback=1)
    cap = None
    if dev is not None and dev.type == "cuda":
        cap = torch.cuda.get_device_capability(dev)
    ws2_rank = len(ws2.get_size())
    # The weight's N and K pick and compile the kernel, so they are specialised (with a guard: a
    # weight of another shape recompiles) when torch.compile(dynamic=True) made them symbolic.
    sv = V.graph.sizevars
    guard_int = getattr(sv, "guard_int", None) or sv.evaluate_static_shape  # renamed in torch 2.8
    n, k_half = guard_int(wsize[0]), guard_int(wsize[1])
    return LinearProblem(
        m=int(m), n=int(n), k=int(k_half) * 2, device_type=dev.type if dev is not None else "cpu",
        capability=cap, weight_only=input_scale is None, x_dtype=x_dtype, out_dtype=out_dtype or x_dtype,
        alpha="vector" if ws2_rank == 1 else "scalar", bias=bias is not None, activation=activation,
        residual=residual is not None,
    )


def _has_unbacked(expr) -> bool:
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return not isinstance(expr, int) and bool(free_unbacked_symbols(expr))


def _decomposition(tensor_names: Optional[tuple[str, ...]], choice: str):
    """One candidate's decomposition: a single ``nvfp4_linear_choice(..., choice)`` call.

    The choice is baked into the function (not a config parameter): torch 2.11-2.14 build the
    op's eager fallback choice with the first candidate's parameters, and 2.11 puts parameter
    values into generated variable names. The name is a plain identifier for the same reason.
    Every release passes the present tensor arguments positionally and the rest by name; torch
    2.11 maps ``input_gen_fns`` (keyed by argument name) to input positions through the
    decomposition's signature (2.12+ uses the op schema), so the signature names those tensors.
    """
    import inspect

    def nvgemm_cutedsl_linear(*tensors, **kwargs):
        return _choices.nvgemm_cutedsl_linear(*tensors, choice=choice, **kwargs)

    name = "nvgemm_cutedsl_linear_" + re.sub(r"\W", "_", choice)
    nvgemm_cutedsl_linear.__name__ = nvgemm_cutedsl_linear.__qualname__ = name
    P = inspect.Parameter
    names = tensor_names if tensor_names is not None else _choices.AUTOTUNE_ARG_NAMES[:4]
    nvgemm_cutedsl_linear.__signature__ = inspect.Signature(
        [P(n, P.POSITIONAL_ONLY) for n in names] + [P("kwargs", P.VAR_KEYWORD)]
    )
    return nvgemm_cutedsl_linear


def _config_generator(_fake_tensors: dict) -> list:
    from torch._inductor.kernel.custom_op import CustomOpConfig

    cur = _CURRENT.get()
    if cur is None:  # not called through our wrapper: only the reference
        return [CustomOpConfig(_decomposition(None, _choices.EMULATED))]
    return [CustomOpConfig(_decomposition(cur["tensor_names"], c.key)) for c in cur["candidates"]]


# --------------------------------------------------------------------------- GPU benchmark policy


@contextlib.contextmanager
def _decode_benchmark_policy():
    """CUDA-graph benchmarking with ``CUDAGRAPH_UNROLL`` calls and cold weights, for our choices only."""
    from torch._inductor import config
    from torch._inductor.codegen.subgraph import SubgraphChoiceCaller

    orig = SubgraphChoiceCaller._create_benchmark_request

    def create(self):
        req = orig(self)
        if self.name.startswith(NAME):
            req.cudagraph_unroll = CUDAGRAPH_UNROLL
            req.cudagraph_cold_cache_input_indices = COLD_INPUT_INDICES
        return req

    SubgraphChoiceCaller._create_benchmark_request = create
    try:
        with config.patch(autotune_cudagraph_benchmarking_iters=CUDAGRAPH_UNROLL):
            yield
    finally:
        SubgraphChoiceCaller._create_benchmark_request = orig


# --------------------------------------------------------------------------- registration


def normalise_call(args: tuple, kwargs: dict) -> list:
    schema = torch.ops.nvgemm.nvfp4_linear.default._schema
    bound = {schema.arguments[i].name: a for i, a in enumerate(args)}
    bound.update(kwargs)
    for a in schema.arguments:
        bound.setdefault(a.name, a.default_value)
    return [bound[n] for n in _choices.LINEAR_ARG_NAMES]


def register_range_autotuning(custom_op_def, op, config_generator, name: str, input_gen_fns: dict, pts) -> dict:
    """Inductor's autotuned lowerings of ``custom_op_def`` keyed ``(device kind, dynamic M)``, built with
    ``register_custom_op_autotuning`` and taken back out of the lowering table (the caller installs its
    own wrapper; ``op`` is ``custom_op_def``'s OpOverload). Static M: one autotune at that M; dynamic M: one per range of ``pts`` + ``torch.cond``."""
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
                    dispatch_on=({"tensor_name": "x", "dim": 0, "range_upper_bound": RANGE_UPPER_BOUND}
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


def build_lowering(allowed: Optional[set[str]] = None):
    """Return the lowering-table entry for ``nvgemm::nvfp4_linear`` (without installing it)."""
    # Autotuning is registered on nvfp4_linear_autotune (packed optionals, see
    # choices.pack_linear_args); nvfp4_linear's own lowering packs and calls it.
    pts = split_points()
    inner = register_range_autotuning(_choices.nvfp4_linear_autotune, torch.ops.nvgemm.nvfp4_linear_autotune.default,
                                      _config_generator, NAME, INPUT_GEN_FNS, pts)
    decode_policy = compat.available("decode_benchmark_policy")

    def nvgemm_cutedsl_lowering(*args, **kwargs):
        from torch._inductor import ir

        compat.nvgemm_counters()["lowered"] += 1
        full = normalise_call(args, kwargs)
        # Kernels read x row-major; the autotuner needs every input as a buffer with a layout.
        full[0] = ir.ExternKernel.require_contiguous(full[0])
        for i in range(1, 7):
            if full[i] is not None:
                full[i] = ir.ExternKernel.realize_input(full[i])
                if isinstance(full[i], ir.StorageBox):  # torch 2.11 takes only TensorBox/Buffer as tensors
                    full[i] = ir.TensorBox(full[i])
        problem = problem_from_ir(full)
        cands = _choices.candidates(problem, allowed)
        log.info(
            "nvgemm_cutedsl: autotuning nvfp4_linear N=%d K=%d (%s) over %d candidates, M splits %s: %s",
            problem.n, problem.k, "W4A16" if problem.weight_only else "W4A4", len(cands), pts,
            [c.key for c in cands],
        )
        m_expr = full[0].get_size()[0]
        from torch._inductor import config as inductor_config

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
        if len(cands) == 1:
            # Nothing to tune (e.g. CPU: only the emulated reference): call it directly, no
            # per-range tracing.
            from torch._inductor.lowering import fallback_handler

            return fallback_handler(torch.ops.nvgemm.nvfp4_linear_choice.default, add_to_fallback_set=False)(
                *full, cands[0].key
            )
        packed = _choices.pack_linear_args(full)
        names = tuple(n for n, a in zip(_choices.AUTOTUNE_ARG_NAMES[:7], packed[:7]) if a is not None)
        tok = _CURRENT.set({"problem": problem, "candidates": cands, "tensor_names": names})
        try:
            dynamic = not isinstance(full[0].get_size()[0], int) and not full[0].get_size()[0].is_number
            if problem.device_type == "cuda" and decode_policy:
                with _decode_benchmark_policy():
                    return inner["cuda", dynamic](*packed)
            return inner["cpu", dynamic](*packed)
        finally:
            _CURRENT.reset(tok)

    nvgemm_cutedsl_lowering.split_points = pts  # type: ignore[attr-defined]
    return nvgemm_cutedsl_lowering
