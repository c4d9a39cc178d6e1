"""Where nvgemm's Triton kernels run for CPU tensors.

By default nowhere: every host path that launches a Triton kernel on CUDA serves CPU tensors with its torch
reference (the same bytes). The PTX emulator (opt-in, beside the stack) installs a *stand-in factory* when it
is enabled (``nvgemm.emulator.enable``, ``NVGEMM_BACKEND=emu_sm100`` / ``emu_sm90``, ``nvgemm demo
--emulate-kernels``): then those host paths launch the real kernel on CPU tensors through the stand-in, which
compiles it for the emulated arch and runs its PTX on the emulator. Importing this module imports nothing
(no Triton, no emulator); the call sites ask :func:`stand_in` and fall back to the reference when it says None.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Optional

_FACTORY: Optional[Callable[[Any], Any]] = None
_ARCH: Optional[Callable[[], Optional[str]]] = None


def install(factory: Optional[Callable[[Any], Any]], arch: Optional[Callable[[], Optional[str]]] = None) -> None:
    """Set (or with None, remove) the stand-in factory: ``factory(jit_kernel, arch) -> kernel-like`` whose
    ``kernel[grid](...)`` runs on CPU tensors. ``arch()`` says, at each call, which arch it emulates; None
    means the stand-in is inactive right now (e.g. it follows a setting that is no longer forced)."""
    global _FACTORY, _ARCH
    _FACTORY, _ARCH = factory, (arch if factory is not None else None)


def installed_arch() -> Optional[str]:
    """The arch the stand-in emulates at this moment, or None (none installed, or inactive)."""
    return _ARCH() if _ARCH is not None else None


def stand_in(module: str, name: str, device) -> Any:
    """The stand-in of the Triton kernel ``module.name`` for tensors on ``device``, or None (not a CPU tensor,
    or no active stand-in: use the torch reference)."""
    if _FACTORY is None or getattr(device, "type", device) != "cpu":
        return None
    arch = installed_arch()
    if arch is None:
        return None
    return _FACTORY(getattr(importlib.import_module(module), name), arch)


__all__ = ["install", "installed_arch", "stand_in"]
