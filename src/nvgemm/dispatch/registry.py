"""The one backend registry every op kind selects from, and the ``nvfp4_linear`` selection.

A backend (:class:`~nvgemm.core.backend.Backend`) is a named implementation of one op kind (a CuTeDSL
kernel family, a Triton kernel, the emulated reference) with a ``supports(problem) -> reason | None``
predicate. The registry holds the backends of every op kind (:data:`~nvgemm.core.backend.OP_KINDS`:
``linear``, ``moe``, and the fused ``requant`` / ``prequant``); each op takes the highest-priority backend
of its kind that supports the problem. The emulated backends support everything and are always last,
so every problem has a correct path. Selection for ``nvfp4_linear`` is below; the MoE op's and the fused
ops' rules (which env var forces them, their first-use checks) are :mod:`nvgemm.dispatch.moe` and
:mod:`nvgemm.dispatch.fused`, all through :func:`choose_backend` and :func:`checked_verdict`.

Where backends come from:

* kernel families name theirs in their registration (:func:`nvgemm.core.family.register_family`);
  :func:`load_builtin_backends` imports and registers them on first dispatch (never at ``import nvgemm``);
* the ops register their emulated (and unfused) reference backends when they are defined;
* the PTX emulator's backends (``emu_*``) are registered only when asked for: an ``NVGEMM_BACKEND`` /
  ``NVGEMM_MOE_BACKEND`` / ``NVGEMM_FUSED_BACKEND`` naming one (see :func:`backends`), ``nvgemm demo
  --emulate-kernels``, or :func:`nvgemm.emulator.enable`. A process that asks for none never imports
  ``nvgemm.emulator``.
"""

from __future__ import annotations

import importlib
import logging
import threading
import weakref
from dataclasses import replace

import torch

from nvgemm import settings
from nvgemm.core.backend import LINEAR, OP_KINDS, Backend, LinearProblem, warn_once
from nvgemm.core.family import families, resolve
from nvgemm.core.validation import alpha_of
from nvgemm.core.formats import NVFP4, dequantize, from_blocked, quantize_activation, quantize_weight, to_blocked

log = logging.getLogger("nvgemm_cutedsl")

_REGISTRY: dict[str, dict[str, Backend]] = {kind: {} for kind in OP_KINDS}
_LOCK = threading.RLock()
_BUILTINS_LOADED = False
_LAST = threading.local()  # the backend select_backend chose most recently, per thread
#: (problem, forced backend, first-use check on) -> the backend ``select_backend`` chose; cleared when a
#: backend is (un)registered. The problem holds everything a decision depends on, the operands'
#: alignment included (``LinearProblem.misaligned``, computed per call from the tensors), so a new or
#: re-pointed weight of the same shape takes the decision of its own alignment; the weight's values
#: never enter a decision (the first-use check runs on its own data).
class BoundedCache(dict):
    """A dict that holds at most ``maxsize`` entries: storing a new key into a full one drops the least
    recently stored entry first (a decision cache must not grow with every shape a long-running server
    ever sees). Reads are plain dict reads."""

    def __init__(self, maxsize: int):
        super().__init__()
        self.maxsize = maxsize
        self._lock = threading.Lock()  # stores only (eviction iterates the dict)

    def __setitem__(self, key, value) -> None:
        with self._lock:
            if key not in self and len(self) >= self.maxsize:
                self.pop(next(iter(self)))  # dicts keep insertion order: the oldest entry
            super().__setitem__(key, value)


#: entries each decision cache holds at most (problems: shapes x epilogues x devices)
DECISION_CACHE_SIZE = 4096
_DECISIONS = BoundedCache(DECISION_CACHE_SIZE)
#: an op's per-call plans (:func:`call_plan`): the call's metadata (shapes, strides, dtypes, devices,
#: operand alignment, forcing settings) -> (epilogue spec, problem, backend), cleared with the decisions
_PLANS = BoundedCache(DECISION_CACHE_SIZE)
#: an op's bound calls (:func:`bind_call`): (op kind, the weight's id, the per-call tensors' metadata, the
#: other arguments, forcing settings, thread) -> :class:`Binding`, cleared with the plans
_BINDINGS = BoundedCache(DECISION_CACHE_SIZE)

#: backends whose name starts with this are the PTX emulator's: forcing one enables the emulator
EMULATOR_PREFIX = "emu_"


def _kind(kind: str) -> dict[str, Backend]:
    try:
        return _REGISTRY[kind]
    except KeyError:
        raise ValueError(f"nvgemm backends: op kind must be one of {OP_KINDS}, got {kind!r}") from None


def register_backend(backend: Backend, kind: str = LINEAR) -> None:
    """Add (or replace, by name) ``backend`` for op ``kind``."""
    with _LOCK:
        _kind(kind)[backend.name] = backend
        _DECISIONS.clear()
        _PLANS.clear()
        _BINDINGS.clear()


def unregister_backend(name: str, kind: str = LINEAR) -> None:
    with _LOCK:
        _kind(kind).pop(name, None)
        _DECISIONS.clear()
        _PLANS.clear()
        _BINDINGS.clear()


def load_builtin_backends() -> None:
    """Register every backend the kernel families name (once; a family whose optional dependency is
    missing simply has no backend)."""
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    with _LOCK:
        if _BUILTINS_LOADED:
            return
        for fam in families():
            for kind, ref in fam.backends:
                try:
                    register_backend(resolve(ref), kind)
                except ImportError as e:  # optional dependency missing: that backend is simply absent
                    log.info("nvgemm_cutedsl: backend %s of family %s not available: %s", ref, fam.name, e)
        _BUILTINS_LOADED = True


def _emulator_requested() -> None:
    """Enable the PTX emulator's backends when a forcing env var names one of them."""
    forced = (settings.NVGEMM_BACKEND, settings.NVGEMM_MOE_BACKEND, settings.NVGEMM_FUSED_BACKEND)
    if any(name.startswith(EMULATOR_PREFIX) for name in forced):
        importlib.import_module("nvgemm.emulator").enable()  # lazy: the emulator is opt-in (beside the stack)


def backends(kind: str = LINEAR) -> list[Backend]:
    """The backends of op ``kind``, highest priority first."""
    load_builtin_backends()
    _emulator_requested()
    with _LOCK:
        return sorted(_kind(kind).values(), key=lambda b: (-b.priority, b.name))


def registered(kind: str, name: str) -> Backend:
    """The backend ``name`` of op ``kind`` (KeyError naming those registered)."""
    with _LOCK:
        table = _kind(kind)
        if name not in table:
            raise KeyError(f"no {kind} backend {name!r}; registered: {sorted(table)}")
        return table[name]


# ---------------------------------------------------------------------------- first-use check
#
# nvgemm ships kernels that could only be compiled, not run, where they were written (sm_100a
# above all). Before a kernel backend serves a problem for the first time on a device, it runs
# that problem once on adversarial data and every output element is compared with the emulated
# op; a backend that disagrees anywhere (or raises) is disabled for that problem with one
# warning, and the next backend (ultimately the emulated one) serves it. A wrong kernel therefore
# costs speed, never silent garbage. ``NVGEMM_SELFCHECK=0`` turns the check off. It is skipped
# while a CUDA graph is being captured (warm-up before capture runs it).

_CHECKED: dict[tuple, str | None] = {}
#: Element-wise bound (as the GPU kernel tests): kernel and emulated op decode identical operands
#: (exact in fp32) and differ by the fp32 summation order, <= K * 2^-24 * |alpha| * sum_k |a*b|;
#: SELFCHECK_ACC_SLACK covers the tensor core's accumulation and activation slopes <= 1.13; plus
#: one rounding of the output dtype each side. One wrong element or column is off by O(1).
SELFCHECK_ACC_SLACK = 4.0
_OUT_ULP = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-23}


def _adversarial(rows: int, k: int, gen: torch.Generator, amax: float) -> torch.Tensor:
    """[rows, k] fp32 values with max |v| = ``amax`` that exercise every E2M1 code and both signs,
    all-zero 16-blocks (scale 0 / 1), blocks small enough for subnormal e4m3 block scales, and heavy
    tails (outliers that set the global scale)."""
    v = torch.randn(rows, k, generator=gen)
    blocks = v.view(rows, k // 16, 16)
    kind = torch.randint(0, 8, (rows, k // 16), generator=gen)
    kind[torch.arange(rows), torch.arange(rows) % (k // 16)] = 7  # no all-zero row: every output checked
    blocks[kind == 0] = 0.0                                   # zero blocks
    blocks[kind == 1] *= 2.0**-12                             # subnormal block scales (weights:
    blocks[kind == 3] *= 2.0**-6                              # ModelOpt's 2^-9 clamp; activations)
    blocks[kind == 2] *= torch.rand(int((kind == 2).sum()), 16, generator=gen) * 8  # spread codes
    out = torch.rand(rows, k, generator=gen) < 0.002
    v[out] *= 40.0                                            # tails
    if rows and k:
        v.view(-1)[0] = 2000.0                                # at least one outlier
    return v.clamp(-2000.0, 2000.0) * (amax / 2000.0)  # bounded: fp16 outputs stay finite


def _selfcheck_inputs(problem: LinearProblem, device: torch.device):
    gen = torch.Generator(device="cpu").manual_seed(1234)
    q = quantize_weight(_adversarial(problem.n, problem.k, gen, 1.0))
    x = _adversarial(problem.m, problem.k, gen, 8.0)
    ws2 = q.global_scale.reshape(())
    if problem.alpha == "vector":
        ws2 = ws2 * torch.linspace(0.5, 2.0, problem.n)
    ins = None if problem.weight_only else (x.abs().amax() / 2688).clamp_min(2.0**-30).reshape(())
    n_out = problem.n // 2 if problem.activation == "silu_mul" else problem.n
    bias = torch.randn(problem.n, generator=gen) if problem.bias else None
    res = torch.randn(problem.m, n_out, generator=gen) if problem.residual else None
    xd = problem.x_dtype

    def to(t, dtype=None):
        return None if t is None else t.to(device=device, dtype=dtype or t.dtype)

    return (to(x, xd), to(q.packed), to(to_blocked(q.scale)), to(ws2), to(ins), to(bias, xd), to(res, xd),
            problem.activation, problem.out_dtype)


def accumulation_bound(a: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                       alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dequantized weight, element-wise fp32 summation-order bound of ``(a @ w.T) * alpha``) for the
    activation values ``a`` [M, K] and a packed NVFP4 ``weight`` with its swizzled scales."""
    n, k = weight.shape[0], weight.shape[1] * 2
    w = dequantize(weight, from_blocked(weight_scale.view(torch.float8_e4m3fn), n, k // NVFP4.block_size))
    return w, SELFCHECK_ACC_SLACK * k * 2.0**-24 * ((a.abs() @ w.abs().t()) * alpha.abs())


def selfcheck_bound(args, want: torch.Tensor) -> torch.Tensor:
    """Element-wise |kernel - emulated| allowed for the call ``args`` whose emulated output is ``want``."""
    x, weight, weight_scale, ws2, ins, _bias, _res, activation, out_dtype = args
    k = weight.shape[1] * 2
    x2 = x.reshape(-1, k)
    a = x2.float() if ins is None else dequantize(*quantize_activation(x2, ins))
    alpha = alpha_of(ws2, ins)
    w, err = accumulation_bound(a, weight, weight_scale, alpha)
    n = weight.shape[0]
    if activation == "silu_mul":
        # |d(silu(g)*u)| <= 1.1*|u|*dg + (|silu(g)|+1)*du, with g/u the pre-activation values
        pre = (a @ w.t()) * alpha
        h = n // 2
        err = 1.1 * pre[:, h:].abs() * err[:, :h] + (pre[:, :h].abs() + 1) * err[:, h:]
    ulp = _OUT_ULP[out_dtype or x.dtype]
    return err.reshape(want.shape) + 2 * ulp * want.abs() + 2.0**-20


def selfcheck_device(device_type: str) -> torch.device | None:
    """The device a first-use check runs on; None = skip it (``NVGEMM_SELFCHECK=0``, a hypothetical
    CUDA problem planned on a GPU-less host, or a CUDA graph being captured)."""
    if not settings.NVGEMM_SELFCHECK:
        return None
    if device_type == "cuda":
        if not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing():
            return None
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device_type)


def checked_verdict(checked: dict, backend, problem, make_args, reference, bound, label: str) -> str | None:
    """The first-use check shared by the ops' registries: ``backend.run`` vs ``reference`` on
    ``make_args(problem, device)``, cached in ``checked``; None if every output element agrees within
    ``bound(args, want)`` (element-wise, non-finite values must match exactly), else the reason,
    warned once (``label``: "backend" / "MoE backend")."""
    device = selfcheck_device(problem.device_type)
    if device is None:
        return None
    key = (backend.name, problem, str(device))
    if key in checked:
        return checked[key]
    try:
        args = make_args(problem, device)
        got = backend.run(*args).float()
        want = reference(*args).float()
        what = "op" if label == "backend" else label.replace("backend", "op")
        verdict = None
        if got.shape != want.shape:
            verdict = f"returned shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        else:
            excess = (got - want).abs() - bound(args, want)
            bad = (got != want) & (~torch.isfinite(got) | ~torch.isfinite(want) | (excess > 0))
            if bool(bad.any()):
                first = [int(i) for i in bad.nonzero()[0].tolist()]
                verdict = (f"disagrees with the emulated {what} on {int(bad.sum())} of {bad.numel()} output elements "
                           f"(first at {first}: {float(got[tuple(first)]):.6g} vs {float(want[tuple(first)]):.6g})")
    except Exception as e:  # a kernel failing to launch must not take the op down with it
        verdict = f"raised {type(e).__name__}: {e}"
    checked[key] = verdict
    if verdict is not None:
        warn_once(f"selfcheck-{label}-{backend.name}-{problem}",
                  f"nvgemm_cutedsl: {label} {backend.name} {verdict} on {problem}; disabled for this problem")
    return verdict


def _selfcheck(backend: Backend, problem: LinearProblem) -> str | None:
    """None if ``backend`` agrees with the emulated op on ``problem``'s shape and kind."""
    return checked_verdict(_CHECKED, backend, problem, _selfcheck_inputs, registered(LINEAR, "emulated").run,
                           selfcheck_bound, "backend")


def choose_backend(all_b: list, problem, forced: str, var: str, selfcheck, label: str, on_emulated) -> "Backend":
    """Shared selection: ``forced`` (from env var ``var``) if set, else the first backend in ``all_b``
    whose ``supports`` and (kernel backends, when ``selfcheck``) first-use check pass;
    ``on_emulated(reasons)`` runs when the emulated backend serves a CUDA problem."""
    if forced:
        for b in all_b:
            if b.name == forced:
                reason = b.supports(problem)
                if reason is not None:
                    raise RuntimeError(f"{var}={forced} cannot run {problem}: {reason}")
                return b
        raise RuntimeError(f"{var}={forced!r} is not a registered {label}; have {[b.name for b in all_b]}")
    reasons = []
    for b in all_b:
        reason = b.supports(problem)
        if reason is None and selfcheck is not None and b.name != "emulated":
            reason = selfcheck(b, problem)
        if reason is None:
            if b.name == "emulated" and problem.device_type == "cuda":
                on_emulated(reasons)
            return b
        reasons.append(f"{b.name}: {reason}")
    raise RuntimeError(f"no nvgemm {label} supports {problem}: {reasons}")


def set_selected(backend) -> None:
    """Record ``backend`` as the one :func:`last_selected` names (an op's bound call)."""
    _LAST.name = backend.name


def last_selected() -> str | None:
    """Name of the backend the most recent eager ``nvfp4_linear`` in this thread ran on."""
    return getattr(_LAST, "name", None)


def select_backend(problem: LinearProblem, check: bool = True) -> Backend:
    """The backend for ``problem``: decided once per (problem, ``NVGEMM_BACKEND``, first-use check),
    then taken from the decision cache (repeated decode calls walk no backend list)."""
    key = (problem, settings.NVGEMM_BACKEND, check and settings.NVGEMM_SELFCHECK)
    b = _DECISIONS.get(key)
    if b is None:
        b = _select_backend(problem, check)
        if problem.misaligned:
            _warn_misaligned(problem, b)
        # a decision made while a CUDA graph is captured skipped the first-use check: not kept
        if not capturing_cuda(problem):
            _DECISIONS[key] = b
    _LAST.name = b.name
    return b


def capturing_cuda(problem) -> bool:
    """Whether ``problem`` is a CUDA call made while a CUDA graph is being captured."""
    return (problem.device_type == "cuda" and torch.cuda.is_available()
            and torch.cuda.is_current_stream_capturing())


def call_plan(key, decide, selected=None):
    """The per-call plan of an op: ``decide() -> (spec, problem, backend)`` runs the complete validation and
    the selection for the first call with ``key`` (the op's :func:`~nvgemm.core.validation.call_key` plus
    the forcing settings); later calls with the same key take the stored plan, which the validation
    would return unchanged (it reads only what the key holds). Plans made during CUDA-graph capture are
    not kept (their selection skipped the first-use check). ``selected(backend)`` records the backend a
    hit serves (default: :func:`last_selected`'s)."""
    plan = _PLANS.get(key)
    if plan is None:
        plan = decide()
        if not capturing_cuda(plan[1]):
            _PLANS[key] = plan
    if selected is None:
        _LAST.name = plan[2].name
    else:
        selected(plan[2])
    return plan


# ---------------------------------------------------------------------------- bound calls


class Binding:
    """A call path bound to one layer's static operands (weight, scales, bias, ...): the backend that served
    the call, and ``run`` (the backend's :attr:`~nvgemm.core.backend.Backend.bind` result, else its ``run``).

    It serves a later call only when every static operand is the very tensor object it was bound to, at the
    same data pointer and version counter (:meth:`holds`): a weight replaced by another tensor, re-pointed
    (``set_``) or changed in place -- values (``copy_``) or metadata (``resize_``, ``t_``, ``as_strided_``):
    every in-place op moves the version counter -- falls back to the complete path, which re-validates,
    re-derives and binds anew. What bypasses the version counter (writes through ``tensor.data``, a ``.data =``
    assignment keeping the data pointer) is not seen, as by every derived-operand cache
    (:mod:`nvgemm.templates.common.derived`)."""

    __slots__ = ("backend", "run", "_metas", "__weakref__")

    def __init__(self, backend, run, statics: tuple):
        self.backend, self.run = backend, run
        self._metas = tuple(None if t is None else (weakref.ref(t), t._version, t.data_ptr()) for t in statics)

    def holds(self, *statics) -> bool:
        """Whether ``statics`` are the bound operands, unchanged (see the class docstring)."""
        for t, m in zip(statics, self._metas):
            if m is None:
                if t is not None:
                    return False
            elif t is None or m[0]() is not t or t._version != m[1] or t.data_ptr() != m[2]:
                return False
        return True


def bound_call(key, *statics):
    """The :class:`Binding` stored under ``key`` if it :meth:`~Binding.holds` ``statics``, else None."""
    b = _BINDINGS.get(key)
    if b is not None and b.holds(*statics):
        return b
    return None


def bind_call(key, backend, problem, statics: tuple, args: tuple, run=None, bind_kwargs=None) -> None:
    """After ``backend.run(*args)`` served a call whose complete path ran (validation, plan, host scale
    values), bind later calls under ``key`` (the op's cheap per-call key: everything of the call but the
    static operands' metadata, which :meth:`Binding.holds` checks) to ``statics``. Not during CUDA-graph
    capture (the call's selection skipped the first-use check). The entry goes when the first static operand
    (the weight) is freed. Layers holding inference tensors (no version counter) are not bound. ``run``: the bound call, when the op made it (else ``backend.bind(*args, **bind_kwargs)``)."""
    if capturing_cuda(problem):
        return
    if any(t is not None and t.is_inference() for t in statics):
        return  # an inference tensor has no version counter: an in-place write could not be seen
    if run is None and backend.bind is not None:
        try:
            run = backend.bind(*args, **(bind_kwargs or {}))
        except Exception as e:  # the call was served: a launcher that cannot bind costs speed, never the call
            warn_once(f"bind-{backend.name}-{type(e).__name__}",
                      f"nvgemm_cutedsl: {backend.name} could not bind its launch ({type(e).__name__}: {e}); "
                      "its calls take the complete path")
            return
    b = Binding(backend, run or backend.run, statics)
    if b.holds(*statics):  # an operand changed while binding (a derived operand's refill): not kept
        new = key not in _BINDINGS
        _BINDINGS[key] = b
        if new:
            weakref.finalize(statics[0], _BINDINGS.pop, key, None)


def _warn_misaligned(problem: LinearProblem, chosen: Backend) -> None:
    """One warning naming the operands whose alignment made a higher-priority backend refuse ``problem``."""
    aligned = replace(problem, misaligned=())
    refused = []
    for b in backends():
        if b is chosen or b.name == chosen.name:
            break
        why = b.supports(problem)
        if why is not None and b.supports(aligned) is None:
            refused.append(f"{b.name}: {why}")
    if refused:
        names = ", ".join(problem.misaligned)
        warn_once(f"misaligned-{problem.misaligned}-{chosen.name}",
                  f"nvgemm_cutedsl: misaligned operand ({names}) of nvfp4_linear [M={problem.m} N={problem.n} "
                  f"K={problem.k}]: {'; '.join(refused)}; it runs on {chosen.name} instead. Hold the tensor in a "
                  "16-byte aligned buffer (e.g. .clone()) to use the kernel")


def _select_backend(problem: LinearProblem, check: bool = True) -> Backend:
    """The backend the op will run for ``problem`` (deterministic).

    ``NVGEMM_BACKEND=<name>`` forces one backend (an error if it cannot run the problem).
    With ``check`` a kernel backend passes the first-use check above before it is chosen.
    """
    def on_emulated(reasons):
        warn_once(
            f"emulated-{problem.capability}-{problem.weight_only}",
            f"nvgemm_cutedsl: no NVFP4 kernel for this problem on sm_{''.join(map(str, problem.capability or ()))} "
            f"({'; '.join(reasons) or 'no kernel backends registered'}); using the emulated path "
            "(dequantize + fp32 matmul), which is correct but slow",
        )

    return choose_backend(backends(LINEAR), problem, settings.NVGEMM_BACKEND, "NVGEMM_BACKEND",
                          _selfcheck if check else None, "backend", on_emulated)
