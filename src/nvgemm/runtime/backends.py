"""Run-time GEMM backends behind ``nvgemm::nvfp4_linear``.

A backend is a named implementation of the op (a CuTeDSL kernel family, a Triton kernel, the
emulated reference) with a ``supports(problem) -> reason | None`` predicate. The op's eager
implementation takes the highest-priority backend that supports the problem; the emulated
backend supports everything and is always last, so every problem has a correct path.

Kernel modules register themselves with :func:`register_backend` when they are imported by
:func:`load_builtin_backends` (lazily, on first dispatch; never at ``import nvgemm``).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch

log = logging.getLogger("nvgemm_cutedsl")


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


@dataclass(frozen=True)
class Backend:
    name: str
    priority: int  # higher wins
    supports: Callable[[LinearProblem], str | None]
    run: Callable[..., torch.Tensor] = field(repr=False)


_REGISTRY: dict[str, Backend] = {}
_LOCK = threading.Lock()
_BUILTINS_LOADED = False
_WARNED: set[str] = set()
_LAST = threading.local()  # the backend select_backend chose most recently, per thread

#: Modules that register kernel backends when imported; missing optional deps are skipped.
_BUILTIN_MODULES: tuple[str, ...] = (
    "nvgemm.runtime.sm100_backend",
    "nvgemm.runtime.sm90_backend",
    "nvgemm.triton_kernels.registry",
    "nvgemm.emulator.backend",  # emu_sm90 / emu_sm100: only when forced (NVGEMM_BACKEND=...)
)


def register_backend(backend: Backend) -> None:
    with _LOCK:
        _REGISTRY[backend.name] = backend


def unregister_backend(name: str) -> None:
    with _LOCK:
        _REGISTRY.pop(name, None)


def add_builtin_module(module: str) -> None:
    """Add a module that registers backends on import (used by kernel packages)."""
    global _BUILTIN_MODULES
    if module not in _BUILTIN_MODULES:
        _BUILTIN_MODULES = _BUILTIN_MODULES + (module,)


def load_builtin_backends() -> None:
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    import importlib

    for mod in _BUILTIN_MODULES:
        try:
            importlib.import_module(mod)
        except ImportError as e:  # optional dependency missing: that backend is simply absent
            log.info("nvgemm_cutedsl: backend module %s not available: %s", mod, e)
    _BUILTINS_LOADED = True


def backends() -> list[Backend]:
    load_builtin_backends()
    with _LOCK:
        return sorted(_REGISTRY.values(), key=lambda b: (-b.priority, b.name))


def warn_once(key: str, msg: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning(msg)
        import warnings

        warnings.warn(msg, RuntimeWarning, stacklevel=3)


# ---------------------------------------------------------------------------- first-use check
#
# nvgemm ships kernels that could only be compiled, not run, where they were written (sm_100a
# above all). Before a kernel backend serves a problem for the first time on a device, it runs
# that problem once on random data and is compared with the emulated op; a backend that
# disagrees (or raises) is disabled for that problem with one warning, and the next backend
# (ultimately the emulated one) serves it. A wrong kernel therefore costs speed, never silent
# garbage. ``NVGEMM_SELFCHECK=0`` turns the check off. It is skipped while a CUDA graph is
# being captured (warm-up before capture runs it).

_CHECKED: dict[tuple, str | None] = {}
#: ||kernel - emulated|| / ||emulated|| allowed: both use identical quantized operands, so they
#: differ by fp32 summation order and one output rounding (<= 2^-8 relative per element in
#: bf16); a wrong kernel is off by O(1).
SELFCHECK_RTOL = 2.0**-6


def _selfcheck_inputs(problem: LinearProblem, device: torch.device):
    from ..formats import quantize_weight, to_blocked

    gen = torch.Generator(device="cpu").manual_seed(1234)
    w = torch.randn(problem.n, problem.k, generator=gen)
    q = quantize_weight(w)
    x = torch.randn(problem.m, problem.k, generator=gen)
    ws2 = q.global_scale.reshape(())
    if problem.alpha == "vector":
        ws2 = ws2 * torch.linspace(0.5, 2.0, problem.n)
    ins = None if problem.weight_only else (x.abs().amax() / 2688).reshape(())
    n_out = problem.n // 2 if problem.activation == "silu_mul" else problem.n
    bias = torch.randn(problem.n, generator=gen) if problem.bias else None
    res = torch.randn(problem.m, n_out, generator=gen) if problem.residual else None
    xd = problem.x_dtype

    def to(t, dtype=None):
        return None if t is None else t.to(device=device, dtype=dtype or t.dtype)

    return (to(x, xd), to(q.packed), to(to_blocked(q.scale)), to(ws2), to(ins), to(bias, xd), to(res, xd),
            problem.activation, problem.out_dtype)


def selfcheck_device(device_type: str) -> torch.device | None:
    """The device a first-use check runs on; None = skip it (``NVGEMM_SELFCHECK=0``, a hypothetical
    CUDA problem planned on a GPU-less host, or a CUDA graph being captured)."""
    if os.environ.get("NVGEMM_SELFCHECK", "1") == "0":
        return None
    if device_type == "cuda":
        if not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing():
            return None
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device_type)


def checked_verdict(checked: dict, backend, problem, make_args, reference, rtol: float, label: str) -> str | None:
    """The first-use check shared by the ops' registries: ``backend.run`` vs ``reference`` on
    ``make_args(problem, device)``, cached in ``checked``; None if they agree within ``rtol`` (relative
    Frobenius norm), else the reason, warned once (``label``: "backend" / "MoE backend")."""
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
        err = float((got - want).norm() / want.norm().clamp_min(1e-30))
        bad = not bool(torch.isfinite(got).all()) or err > rtol
        what = "op" if label == "backend" else label.replace("backend", "op")
        verdict = f"disagrees with the emulated {what} (relative error {err:.3g})" if bad else None
    except Exception as e:  # a kernel failing to launch must not take the op down with it
        verdict = f"raised {type(e).__name__}: {e}"
    checked[key] = verdict
    if verdict is not None:
        warn_once(f"selfcheck-{label}-{backend.name}-{problem}",
                  f"nvgemm_cutedsl: {label} {backend.name} {verdict} on {problem}; disabled for this problem")
    return verdict


def _selfcheck(backend: Backend, problem: LinearProblem) -> str | None:
    """None if ``backend`` agrees with the emulated op on ``problem``'s shape and kind."""
    return checked_verdict(_CHECKED, backend, problem, _selfcheck_inputs, _REGISTRY["emulated"].run, SELFCHECK_RTOL,
                           "backend")


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


def last_selected() -> str | None:
    """Name of the backend the most recent eager ``nvfp4_linear`` in this thread ran on."""
    return getattr(_LAST, "name", None)


def select_backend(problem: LinearProblem, check: bool = True) -> Backend:
    b = _select_backend(problem, check)
    _LAST.name = b.name
    return b


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

    return choose_backend(backends(), problem, os.environ.get("NVGEMM_BACKEND", "").strip(), "NVGEMM_BACKEND",
                          _selfcheck if check else None, "backend", on_emulated)
