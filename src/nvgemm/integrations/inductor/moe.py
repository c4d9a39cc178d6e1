"""Autotuned lowering of ``nvgemm::nvfp4_moe`` with M-range dispatch (the MoE twin of :mod:`.lowering`).

A candidate is a registered MoE backend (``nvgemm.dispatch.moe``: ``triton_moe``, ..., and
``emulated``, the always-correct reference every list ends with), keyed ``backend:<name>`` and run
through the opaque ``nvgemm::nvfp4_moe_choice`` op. The lowering (installed by ``nvgemm.enable()``
for ``nvgemm::nvfp4_moe``):

* one candidate (CPU: only the emulated op), not ``max-autotune``, or an unbacked M: the policy's
  first candidate is emitted directly;
* otherwise Inductor's ``register_custom_op_autotuning`` on ``nvgemm::nvfp4_moe_autotune`` (present
  optional tensors packed first, see :func:`pack_moe_args`) with ``dispatch_on`` x's dim 0 and the
  same M split points as ``nvfp4_linear`` (:func:`nvgemm.integrations.inductor.lowering.split_points`): each M
  range is benchmarked at its top with uniform random routing over the layer's experts, and a
  runtime ``torch.cond`` over M serves every batch size from one compiled graph.

Choice and kernel names say ``nvgemm_cutedsl`` so they never read as PyTorch's own NVGEMM.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import logging
import re
from typing import Optional

import torch

from nvgemm.ops import moe as _moe_ops  # noqa: F401  (registers nvgemm::nvfp4_moe)
from nvgemm.core.backend import MOE, MoeProblem
from nvgemm.dispatch.registry import backends
from nvgemm.integrations.inductor import compat
from nvgemm.integrations.inductor.lowering import _gen_like

log = logging.getLogger("nvgemm_cutedsl")

EMULATED = "backend:emulated"
NAME = "nvgemm_cutedsl_nvfp4_moe"
#: ``nvfp4_moe``'s arguments in schema order.
MOE_ARG_NAMES = ("x", "topk_ids", "topk_weights", "w13", "w13_scale", "w13_scale_2", "w13_input_scale", "w2",
                 "w2_scale", "w2_scale_2", "w2_input_scale", "activation", "router_weight_on_input", "expert_map",
                 "shared_out", "residual", "out_dtype")
OPTIONAL_TENSORS = ("w13_input_scale", "w2_input_scale", "expert_map", "shared_out", "residual")
REQUIRED_TENSORS = ("x", "topk_ids", "topk_weights", "w13", "w13_scale", "w13_scale_2", "w2", "w2_scale", "w2_scale_2")
AUTOTUNE_ARG_NAMES = (*REQUIRED_TENSORS, "t0", "t1", "t2", "t3", "t4", "slots", "activation",
                      "router_weight_on_input", "out_dtype")

_CURRENT: contextvars.ContextVar[Optional[dict]] = contextvars.ContextVar("nvgemm_cutedsl_moe_current", default=None)
_LAST: dict = {}
_BENCH_M: dict = {}


def moe_candidates(problem: MoeProblem, allowed: Optional[set[str]] = None) -> list[str]:
    """Candidate keys for ``problem``: every supporting MoE kernel backend, then the emulated op."""
    out = []
    for b in backends(MOE):
        if b.name == "emulated" or (allowed is not None and b.name not in allowed):
            continue
        reason = b.supports(problem)
        if reason is None:
            out.append(f"backend:{b.name}")
        else:
            log.debug("nvgemm_cutedsl: MoE backend %s skipped for %s: %s", b.name, problem, reason)
    return [*out, EMULATED]


# --------------------------------------------------------------------------- ops


def _moe_backend(choice: str):
    kind, _, name = choice.partition(":")
    if kind != "backend" or not name:
        raise ValueError(f"nvgemm_cutedsl: unknown MoE choice {choice!r}")
    for b in backends(MOE):
        if b.name == name:
            return b
    raise RuntimeError(f"nvgemm_cutedsl: compiled code asks for MoE backend {name!r}, which is not registered in "
                       f"this process (have {[b.name for b in backends(MOE)]})")


@torch.library.custom_op("nvgemm::nvfp4_moe_choice", mutates_args=())
def nvfp4_moe_choice(
    x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor,
    w13_scale_2: torch.Tensor, w13_input_scale: Optional[torch.Tensor], w2: torch.Tensor, w2_scale: torch.Tensor,
    w2_scale_2: torch.Tensor, w2_input_scale: Optional[torch.Tensor], activation: str, router_weight_on_input: bool,
    expert_map: Optional[torch.Tensor], shared_out: Optional[torch.Tensor], residual: Optional[torch.Tensor],
    out_dtype: Optional[torch.dtype], choice: str,
) -> torch.Tensor:
    """``nvgemm::nvfp4_moe`` computed by one named MoE backend (what compiled code calls)."""
    args = (x, topk_ids, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale, w2_scale_2,
            w2_input_scale, activation, router_weight_on_input, expert_map, shared_out, residual, out_dtype)
    p = _moe_ops.check_moe_args(*args)
    _moe_ops.check_moe_ids(topk_ids, p, expert_map)
    return _moe_backend(choice).run(*args)


@nvfp4_moe_choice.register_fake
def _(x, topk_ids, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale, w2_scale_2,
      w2_input_scale, activation, router_weight_on_input, expert_map, shared_out, residual, out_dtype, choice):
    # no comparisons on M (the autotuner traces this with a symbolic M); the eager op checks everything
    if x.shape[-1] != w13.shape[2] * 2:
        raise ValueError(f"nvgemm_cutedsl: x H={x.shape[-1]} does not match w13 {tuple(w13.shape)}")
    return x.new_empty((x.shape[0], x.shape[1]), dtype=out_dtype or x.dtype)


def pack_moe_args(args: list) -> list:
    """``nvfp4_moe``'s 17 arguments -> ``nvfp4_moe_autotune``'s (present optional tensors first, named in
    ``slots``), so the autotuner's positional tensor passing never shifts (see ``choices.pack_linear_args``)."""
    d = dict(zip(MOE_ARG_NAMES, args))
    present = [(n, d[n]) for n in OPTIONAL_TENSORS if d[n] is not None]
    ts = [a for _, a in present] + [None] * (len(OPTIONAL_TENSORS) - len(present))
    return [*(d[n] for n in REQUIRED_TENSORS), *ts, ",".join(n for n, _ in present), d["activation"],
            d["router_weight_on_input"], d["out_dtype"]]


def unpack_moe_args(*packed) -> list:
    """Inverse of :func:`pack_moe_args`."""
    d = dict(zip(AUTOTUNE_ARG_NAMES, packed))
    names = [n for n in d["slots"].split(",") if n]
    if len(set(names)) != len(names) or not set(names) <= set(OPTIONAL_TENSORS):
        raise ValueError(f"nvgemm_cutedsl: bad MoE slots {d['slots']!r}")
    d.update({n: None for n in OPTIONAL_TENSORS})
    d.update(zip(names, (d["t0"], d["t1"], d["t2"], d["t3"], d["t4"])))
    return [d[n] for n in MOE_ARG_NAMES]


@torch.library.custom_op("nvgemm::nvfp4_moe_autotune", mutates_args=())
def nvfp4_moe_autotune(
    x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor,
    w13_scale_2: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, w2_scale_2: torch.Tensor,
    t0: Optional[torch.Tensor] = None, t1: Optional[torch.Tensor] = None, t2: Optional[torch.Tensor] = None,
    t3: Optional[torch.Tensor] = None, t4: Optional[torch.Tensor] = None, slots: str = "",
    activation: str = "silu_mul", router_weight_on_input: bool = False, out_dtype: Optional[torch.dtype] = None,
    choice: str = EMULATED,
) -> torch.Tensor:
    """The op the MoE lowering autotunes (packed optionals); its eager body runs candidate ``choice``."""
    args = unpack_moe_args(x, topk_ids, topk_weights, w13, w13_scale, w13_scale_2, w2, w2_scale, w2_scale_2, t0, t1,
                           t2, t3, t4, slots, activation, router_weight_on_input, out_dtype)
    return nvfp4_moe_choice(*args, choice)


@nvfp4_moe_autotune.register_fake
def _(x, topk_ids, topk_weights, w13, w13_scale, w13_scale_2, w2, w2_scale, w2_scale_2, t0=None, t1=None, t2=None,
      t3=None, t4=None, slots="", activation="silu_mul", router_weight_on_input=False, out_dtype=None, choice=EMULATED):
    return x.new_empty((x.shape[0], x.shape[1]), dtype=out_dtype or x.dtype)


def moe_args_from(tensors: tuple, kwargs: dict) -> list:
    """The autotuner passes tensors positionally (schema order) and everything else by name."""
    it = iter(tensors)
    out = [kwargs[n] if n in kwargs else next(it) for n in AUTOTUNE_ARG_NAMES]
    if list(it):
        raise ValueError("nvgemm_cutedsl: unexpected extra MoE tensor arguments")
    return unpack_moe_args(*out)


# --------------------------------------------------------------------------- lowering


def _gen(name: str):
    """Benchmark input for argument ``name``: valid routing (uniform over the layer's experts).

    Inductor's range dispatch re-sizes only x's dim 0 to the benchmarked M; the other per-token
    tensors (topk_ids, topk_weights, shared_out, residual) take that M too (recorded by
    :func:`_range_gen_recorder` when x of a range is generated; inputs are generated in argument
    order, x first)."""
    def gen(fake: torch.Tensor) -> torch.Tensor:
        cur = _CURRENT.get() or _LAST  # benchmark inputs may be generated after the lowering call returned
        p: MoeProblem = cur["problem"]
        shape, dev = list(fake.shape), fake.device
        if name == "x":
            return _gen_like(fake)
        per_token = name in ("topk_ids", "topk_weights") or (name == "t" and fake.dim() == 2)
        if per_token:
            shape[0] = _BENCH_M.get("m", shape[0])
        if name == "topk_ids":
            return torch.randint(0, p.num_global_experts, shape, dtype=torch.int32, device=dev)
        if name == "topk_weights":
            return torch.rand(shape, device=dev)
        if name == "t" and fake.dtype == torch.int32:  # expert_map: every global id on some local expert
            return (torch.arange(shape[0], device=dev) % p.num_experts).to(torch.int32)
        if per_token:
            return torch.randn(shape, dtype=fake.dtype, device=dev)
        return _gen_like(fake)
    return gen


INPUT_GEN_FNS = {n: _gen("t" if n.startswith("t") and len(n) == 2 else n) for n in AUTOTUNE_ARG_NAMES[:14]}


@contextlib.contextmanager
def _range_gen_recorder():
    """While Inductor builds the per-range input generators, wrap each so that generating x for a range
    records the range's benchmark M for the other per-token inputs (``torch._inductor.kernel.custom_op.
    _create_range_input_gen_fn``, private: checked on torch 2.15; without it nothing is wrapped and the
    lowering does not autotune ranges)."""
    from torch._inductor.kernel import custom_op

    orig = custom_op._create_range_input_gen_fn

    def create(base_gen_fn, dim_index, range_start, range_end, range_upper_bound):
        fn = orig(base_gen_fn, dim_index, range_start, range_end, range_upper_bound)
        target = range_upper_bound if range_end == float("inf") else int(range_end)

        def gen(fake):
            _BENCH_M["m"] = target
            return fn(fake)

        return gen

    custom_op._create_range_input_gen_fn = create
    try:
        yield
    finally:
        custom_op._create_range_input_gen_fn = orig


def _can_record_ranges() -> bool:
    from torch._inductor.kernel import custom_op

    return callable(getattr(custom_op, "_create_range_input_gen_fn", None))


def problem_from_ir(full: list) -> MoeProblem:
    from torch._inductor.virtualized import V

    d = dict(zip(MOE_ARG_NAMES, full))
    x = d["x"]
    dev, x_dtype, xsize = x.get_device(), x.get_dtype(), list(x.get_size())

    def hint(node, dim: int) -> int:  # sizes may be symbolic under dynamic=True: their hints
        return int(V.graph.sizevars.optimization_hint(node.get_size()[dim], fallback=1))

    m = hint(x, 0)
    e = hint(d["w13"], 0)
    cap = torch.cuda.get_device_capability(dev) if dev is not None and dev.type == "cuda" else None
    return MoeProblem(
        m=m, top_k=hint(d["topk_ids"], 1), num_experts=e,
        num_global_experts=hint(d["expert_map"], 0) if d["expert_map"] is not None else e,
        hidden=hint(x, 1), intermediate=hint(d["w2"], 2) * 2, activation=d["activation"],
        weight_only=d["w13_input_scale"] is None, alpha13="row" if len(d["w13_scale_2"].get_size()) == 2 else "expert",
        x_dtype=x_dtype, out_dtype=d["out_dtype"] or x_dtype, device_type=dev.type if dev is not None else "cpu",
        capability=cap, router_weight_on_input=bool(d["router_weight_on_input"]),
        expert_map=d["expert_map"] is not None, shared_out=d["shared_out"] is not None,
        residual=d["residual"] is not None,
    )


def _decomposition(tensor_names: tuple[str, ...], choice: str):
    def nvgemm_cutedsl_moe(*tensors, **kwargs):
        return torch.ops.nvgemm.nvfp4_moe_choice(*moe_args_from(tensors, kwargs), choice)

    name = "nvgemm_cutedsl_moe_" + re.sub(r"\W", "_", choice)
    nvgemm_cutedsl_moe.__name__ = nvgemm_cutedsl_moe.__qualname__ = name
    P = inspect.Parameter
    nvgemm_cutedsl_moe.__signature__ = inspect.Signature(
        [P(n, P.POSITIONAL_ONLY) for n in tensor_names] + [P("kwargs", P.VAR_KEYWORD)])
    return nvgemm_cutedsl_moe


def _config_generator(_fake_tensors: dict) -> list:
    from torch._inductor.kernel.custom_op import CustomOpConfig

    cur = _CURRENT.get()
    if cur is None:
        return [CustomOpConfig(_decomposition(REQUIRED_TENSORS, EMULATED))]
    return [CustomOpConfig(_decomposition(cur["tensor_names"], c)) for c in cur["candidates"]]


def normalise_call(args: tuple, kwargs: dict) -> list:
    schema = torch.ops.nvgemm.nvfp4_moe.default._schema
    bound = {schema.arguments[i].name: a for i, a in enumerate(args)}
    bound.update(kwargs)
    for a in schema.arguments:
        bound.setdefault(a.name, a.default_value)
    return [bound[n] for n in MOE_ARG_NAMES]


def build_lowering(allowed: Optional[set[str]] = None):
    """The lowering-table entry for ``nvgemm::nvfp4_moe`` (not installed here)."""
    # lazy: looked up at call time (tests patch lowering.split_points)
    from nvgemm.integrations.inductor.lowering import _has_unbacked, register_range_autotuning, split_points

    pts = split_points()
    inner = register_range_autotuning(nvfp4_moe_autotune, torch.ops.nvgemm.nvfp4_moe_autotune.default,
                                      _config_generator, NAME, INPUT_GEN_FNS, pts)

    def nvgemm_cutedsl_moe_lowering(*args, **kwargs):
        from torch._inductor import config as inductor_config, ir
        from torch._inductor.lowering import fallback_handler

        compat.nvgemm_counters()["moe_lowered"] += 1
        full = normalise_call(args, kwargs)
        full[0] = ir.ExternKernel.require_contiguous(full[0])
        for i, n in enumerate(MOE_ARG_NAMES):
            if i and full[i] is not None and n not in ("activation", "router_weight_on_input", "out_dtype"):
                full[i] = ir.ExternKernel.realize_input(full[i])
                if isinstance(full[i], ir.StorageBox):
                    full[i] = ir.TensorBox(full[i])
        problem = problem_from_ir(full)
        cands = moe_candidates(problem, allowed)
        log.info("nvgemm_cutedsl: autotuning nvfp4_moe E=%d top-%d H=%d I=%d (%s) over %s, M splits %s",
                 problem.num_experts, problem.top_k, problem.hidden, problem.intermediate,
                 "W4A16" if problem.weight_only else "W4A4", cands, pts)
        if len(cands) > 1 and not (inductor_config.max_autotune or inductor_config.max_autotune_gemm):
            cands = cands[:1]
        m_expr = full[0].get_size()[0]
        dynamic = not isinstance(m_expr, int) and not m_expr.is_number
        if len(cands) > 1 and dynamic and not _can_record_ranges():
            log.warning("nvgemm_cutedsl: this torch has no per-range input generator hook; MoE M ranges use the "
                        "policy's first candidate %s untimed", cands[0])
            cands = cands[:1]
        if len(cands) > 1 and _has_unbacked(m_expr):
            log.warning("nvgemm_cutedsl: MoE M is unbacked; using the policy's first candidate %s untimed", cands[0])
            cands = cands[:1]
        if len(cands) == 1:
            return fallback_handler(torch.ops.nvgemm.nvfp4_moe_choice.default, add_to_fallback_set=False)(
                *full, cands[0])
        packed = pack_moe_args(full)
        names = tuple(n for n, a in zip(AUTOTUNE_ARG_NAMES[:14], packed[:14]) if a is not None)
        cur = {"problem": problem, "candidates": cands, "tensor_names": names}
        _LAST.update(cur)
        tok = _CURRENT.set(cur)
        _BENCH_M["m"] = problem.m  # a static M benchmarks at M itself
        try:
            with _range_gen_recorder() if dynamic else contextlib.nullcontext():
                return inner["cuda" if problem.device_type == "cuda" else "cpu", dynamic](*packed)
        finally:
            _CURRENT.reset(tok)

    nvgemm_cutedsl_moe_lowering.split_points = pts  # type: ignore[attr-defined]
    return nvgemm_cutedsl_moe_lowering
