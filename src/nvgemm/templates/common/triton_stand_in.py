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
_ARCH: Optional[str] = None


def install(factory: Optional[Callable[[Any], Any]], arch: Optional[str] = None) -> None:
    """Set (or with None, remove) the stand-in factory: ``factory(jit_kernel) -> kernel-like`` whose
    ``kernel[grid](...)`` runs on CPU tensors; ``arch`` names what it emulates (for reports)."""
    global _FACTORY, _ARCH
    _FACTORY, _ARCH = factory, (arch if factory is not None else None)


def installed_arch() -> Optional[str]:
    """The arch the installed stand-in emulates, or None."""
    return _ARCH


def stand_in(module: str, name: str, device) -> Any:
    """The stand-in of the Triton kernel ``module.name`` for tensors on ``device``, or None (not a CPU tensor,
    or no stand-in installed: use the torch reference)."""
    if _FACTORY is None or getattr(device, "type", device) != "cpu":
        return None
    return _FACTORY(getattr(importlib.import_module(module), name))


__all__ = ["install", "installed_arch", "stand_in"]
