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

#: Modules that register kernel backends when imported; missing optional deps are skipped.
_BUILTIN_MODULES: tuple[str, ...] = (
    "nvgemm.runtime.sm100_launch",
    "nvgemm.runtime.sm90_launch",
    "nvgemm.triton_kernels.registry",
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


def select_backend(problem: LinearProblem) -> Backend:
    """The backend the op will run for ``problem`` (deterministic).

    ``NVGEMM_BACKEND=<name>`` forces one backend (an error if it cannot run the problem).
    """
    forced = os.environ.get("NVGEMM_BACKEND", "").strip()
    all_b = backends()
    if forced:
        for b in all_b:
            if b.name == forced:
                reason = b.supports(problem)
                if reason is not None:
                    raise RuntimeError(f"NVGEMM_BACKEND={forced} cannot run {problem}: {reason}")
                return b
        raise RuntimeError(f"NVGEMM_BACKEND={forced!r} is not a registered backend; have {[b.name for b in all_b]}")
    reasons = []
    for b in all_b:
        reason = b.supports(problem)
        if reason is None:
            if b.name == "emulated" and problem.device_type == "cuda":
                warn_once(
                    f"emulated-{problem.capability}-{problem.weight_only}",
                    f"nvgemm_cutedsl: no NVFP4 kernel for this problem on sm_{''.join(map(str, problem.capability or ()))} "
                    f"({'; '.join(reasons) or 'no kernel backends registered'}); using the emulated path "
                    "(dequantize + fp32 matmul), which is correct but slow",
                )
            return b
        reasons.append(f"{b.name}: {reason}")
    raise RuntimeError(f"no nvgemm backend supports {problem}: {reasons}")
