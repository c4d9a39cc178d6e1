"""A pre-bound Triton launch: ``kernel[grid](*args, **kwargs)`` with everything but a few argument values fixed.

``kernel[grid](...)`` goes through ``JITFunction.run`` on every call: it binds the arguments, computes the
specialization of each one, builds the compile-cache key from it and the options, looks the compiled kernel
up, checks the kernel's globals, builds the launch metadata and calls the compiled kernel's launcher.
:class:`PreboundLaunch` keeps all of that that does not change between the calls of one problem:

* the **first call** is ``kernel.run(*args, grid=grid, warmup=False, **kwargs)`` itself (compile or cache hit,
  launch), and keeps the :class:`~triton.compiler.CompiledKernel` it returns, the argument list ``run`` passed
  to the launcher (its own binder's, in the kernel's parameter order, constexprs included, as ``run`` passes
  them), the specialization of each per-call argument (by the binder's own ``specialize_impl``), the device,
  the driver and the knobs that enter the cache key;
* a **repeat call** takes only the per-call values (pointers; any argument the caller declares as changing),
  checks that their specialization is the captured one -- for a plain tensor its dtype and whether its data
  pointer is 16-byte aligned (what Triton's ``specialize_impl`` reads of it), for anything else, or when those
  differ, Triton's ``specialize_impl`` itself -- checks the
  device, driver, knobs and globals ``run`` would check, writes the values into a copy of the captured
  argument list and launches the captured kernel exactly as ``run`` does after its cache hit: the same
  launcher (``CompiledKernel.run``: the compiled function, ``launch_pdl`` / cooperative-grid attributes and
  scratch sizes are baked into it from the kernel's metadata), the same grid, the current stream of the
  current device (``driver.active.get_current_stream``), ``CompiledKernel.launch_metadata`` and the runtime's
  launch enter / exit hooks;
* anything that differs -- a pointer with other 16-byte alignment, another dtype, an int that turns ``== 1``
  or crosses a width, another current device, a changed knob or global, pre-run hooks, a stages-inspection
  hook -- goes back to ``kernel.run`` for that call (which compiles / picks the kernel Triton would).

Nothing is captured when ``run`` returns something other than a compiled kernel (a ``jit_cache_hook`` that
skips the launch, an asynchronous compile, a test double): every call then stays on ``run``.
Only a plain ``JITFunction`` is pre-bound (:func:`prebindable`); the interpreter (``TRITON_INTERPRET=1``) and
kernel stand-ins (the PTX emulator's) keep ``kernel[grid](...)``.

What is captured and re-checked is Triton's private launch path (the binder's cache layout, the knobs folded
into the cache key, ``CompiledKernel.run``'s arguments). It was checked against the Triton releases in
:data:`CHECKED_TRITON`; with any other Triton nothing is pre-bound and every launch goes through the public
``kernel[grid](...)`` (``run``), as before: slower on the host, never different on the device.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import torch
import triton
from triton import knobs
from triton.compiler import CompiledKernel
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

__all__ = ["CHECKED_TRITON", "PreboundLaunch", "prebindable", "triton_checked"]

#: Triton releases (major.minor) whose ``JITFunction.run`` internals this module was checked against.
CHECKED_TRITON = ("3.9",)


def triton_checked(version: str = triton.__version__) -> bool:
    """Whether ``version`` is a Triton release :class:`PreboundLaunch` was checked against."""
    return ".".join(version.split(".")[:2]) in CHECKED_TRITON


_CHECKED = triton_checked()


_MISSING = object()
_TENSOR = torch.Tensor


def prebindable(kernel) -> bool:
    """True for a plain ``@triton.jit`` kernel (``JITFunction``) of a compiled-mode Triton; False for the
    interpreter's ``InterpretedFunction``, autotuner / heuristics wrappers and kernel stand-ins -- and for every
    kernel under a Triton release this module was not checked against (:data:`CHECKED_TRITON`)."""
    return _CHECKED and type(kernel) is JITFunction


class _Captured:
    """What the first ``run`` of a :class:`PreboundLaunch` fixed (see the module doc)."""

    __slots__ = ("compiled", "args", "driver", "device", "backend", "spec_impl", "flags", "specs", "quick", "knobs")

    def __init__(self, compiled, args, drv, device, backend, spec_impl, flags, specs, quick, knobs_key):
        self.compiled, self.args, self.driver, self.device = compiled, args, drv, device
        self.backend, self.spec_impl, self.flags, self.specs = backend, spec_impl, flags, specs
        self.quick, self.knobs = quick, knobs_key


def _quick_key(value, spec):
    """A cheaper stand-in for Triton's specialization of a tensor argument: (dtype, 16-byte aligned data pointer)
    -- what Triton's ``specialize_impl`` reads of a plain tensor (``("*<dtype>", "D" | "")``; ``None`` for
    alignment when the parameter is not specialized). None (no quick key: every call asks ``specialize_impl``)
    for anything else or a specialization of another form."""
    if type(value) is not torch.Tensor or not isinstance(spec, tuple) or len(spec) != 2:
        return None
    if not (isinstance(spec[0], str) and spec[0].startswith("*")) or spec[1] not in ("D", "", None):
        return None
    return (value.dtype, (value.data_ptr() & 15) == 0 if spec[1] is not None else None)


def _knobs_key(debug) -> tuple:
    """The knob values ``JITFunction.run`` folds into the options (hence the cache key) on every call;
    ``debug``: the launch's own (its ``debug=`` keyword, else the kernel's)."""
    return (debug or knobs.runtime.debug, knobs.compilation.instrumentation_mode,
            knobs.compilation.fpsan_homomorphic_casts)


class PreboundLaunch:
    """``kernel[grid](*args, **kwargs)`` for one problem, with the values at positions ``varying`` (indices into
    ``args``, the kernel's leading positional parameters) given per call: ``launch(*values)``.

    ``args`` holds every positional argument (a placeholder, e.g. ``None``, at the varying positions); the
    others are fixed for the launch's lifetime and must not be tensors (a tensor's pointer is per-call state).
    ``kwargs``: constexprs by name and launch options (``num_warps``, ``launch_pdl``, ``enable_fp_fusion``...),
    passed to ``run`` unchanged. ``grid``: a tuple of 1-3 ints (fixed: it is part of the problem).
    """

    def __init__(self, kernel, grid: Sequence[int], args: Sequence[Any], varying: Sequence[int], kwargs: dict):
        if not prebindable(kernel):
            raise TypeError(f"nvgemm PreboundLaunch: {kernel!r} is not a plain @triton.jit kernel")
        if not isinstance(grid, tuple) or not 1 <= len(grid) <= 3 or not all(isinstance(g, int) for g in grid):
            raise TypeError(f"nvgemm PreboundLaunch: grid must be a tuple of 1-3 ints, got {grid!r}")
        varying = tuple(varying)
        if not varying or len(set(varying)) != len(varying) or not all(0 <= i < len(args) for i in varying):
            raise ValueError(f"nvgemm PreboundLaunch: varying must be distinct positions in args, got {varying}")
        for i, a in enumerate(args):
            if i not in varying and isinstance(a, torch.Tensor):
                raise ValueError(f"nvgemm PreboundLaunch: fixed argument {i} is a tensor; declare it varying")
        self.kernel = kernel
        self.grid = grid
        self._grid3 = (grid + (1, 1))[:3]
        self._args = tuple(args)
        self._varying = varying
        self._kwargs = dict(kwargs)
        self._debug = self._kwargs.get("debug", kernel.debug)
        self._captured: _Captured | None = None
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- run (first call, fallback)

    def run(self, *values):
        """``kernel[grid](...)`` through ``JITFunction.run``; returns what ``run`` returns."""
        args = list(self._args)
        for i, v in zip(self._varying, values):
            args[i] = v
        return self.kernel.run(*args, grid=self.grid, warmup=False, **dict(self._kwargs))

    def _capture(self, compiled, values) -> None:
        if not isinstance(compiled, CompiledKernel):
            return  # a skipped launch, an async compile or a test double: stay on run
        drv = driver.active
        device = drv.get_current_device()
        caches = self.kernel.device_caches.get(device)
        if caches is None:
            return
        binder = caches[4]
        spec_impl = binder.__globals__.get("specialize_impl")
        backend = binder.__globals__.get("backend")
        if spec_impl is None or backend is None:
            return  # another Triton's binder: stay on run
        args = list(self._args)
        for i, v in zip(self._varying, values):
            args[i] = v
        kwargs = dict(self._kwargs)
        bound, _specialization, _options = binder(*args, **kwargs)
        params = self.kernel.params
        flags, specs, quick = [], [], []
        for i, v in zip(self._varying, values):
            kp = params[i]
            if kp.is_constexpr:
                return  # a constexpr is part of the kernel, not a per-call value
            f = (kp.is_const, not kp.do_not_specialize, not kp.do_not_specialize_on_alignment)
            flags.append(f)
            specs.append(spec_impl(backend, v, *f))
            quick.append(_quick_key(v, specs[-1]))
        captured_args = list(bound.values())
        for i in self._varying:
            captured_args[i] = None  # written per call; the first call's tensors are not kept alive
        with self._lock:
            if self._captured is None:
                self._captured = _Captured(
                    compiled, tuple(captured_args), drv, device, backend, spec_impl, tuple(flags), tuple(specs),
                    tuple(quick), _knobs_key(self._debug))

    # ----------------------------------------------------------------- the per-call path

    def __call__(self, *values):
        """Launch with ``values`` at the varying positions (in their order)."""
        c = self._captured
        if c is None:
            compiled = self.run(*values)
            self._capture(compiled, values)
            return compiled
        return self._launch(c, values)

    def _launch(self, c: _Captured, values):
        drv = driver.active
        if drv is not c.driver or self.kernel.pre_run_hooks or knobs.runtime.add_stages_inspection_hook is not None:
            return self.run(*values)
        device = drv.get_current_device()
        if device != c.device or _knobs_key(self._debug) != c.knobs:
            return self.run(*values)
        for v, q, f, want in zip(values, c.quick, c.flags, c.specs):
            if q is not None and type(v) is _TENSOR and v.dtype is q[0] and (
                    q[1] is None or ((v.data_ptr() & 15) == 0) is q[1]):
                continue  # the captured dtype and alignment: the captured specialization
            if c.spec_impl(c.backend, v, *f) != want:
                return self.run(*values)  # another specialization: Triton picks (or compiles) its kernel
        used = self.kernel.used_global_vals
        if used:
            for (name, _), (val, globals_dict) in used.items():
                if globals_dict.get(name, _MISSING) != val:
                    return self.run(*values)  # run raises its own error for a changed global
        stream = drv.get_current_stream(device)
        args = list(c.args)
        for i, v in zip(self._varying, values):
            args[i] = v
        ck, (g0, g1, g2) = c.compiled, self._grid3
        launch_metadata = ck.launch_metadata(self.grid, stream, *args)
        ck.run(g0, g1, g2, stream, ck.function, ck.packed_metadata, launch_metadata,
               knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *args)
        return ck
