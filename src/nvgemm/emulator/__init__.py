"""PTX functional emulator: nvgemm's real AOT kernels run on the CPU (fake CUDA runtime + numpy PTX interpreter).

It sits beside the stack and is opt-in: nothing in a normal dispatch imports it. :func:`enable` registers
its backends (``emu_sm90``, ``emu_sm100`` for ``nvfp4_linear`` and the fused ops, ``emu_sm100_moe``) with the
dispatch registry; dispatch calls it when ``NVGEMM_BACKEND`` / ``NVGEMM_MOE_BACKEND`` /
``NVGEMM_FUSED_BACKEND`` names an ``emu_*`` backend, ``nvgemm demo --emulate-kernels`` forces one, and
tests call it directly.
"""

from __future__ import annotations

_ENABLED = False


def enable() -> None:
    """Register the emulator's backends (idempotent). They are never chosen automatically (priority below
    the emulated reference): a call runs on one only when it is forced by name."""
    global _ENABLED
    if _ENABLED:
        return
    # lazy: importing the emulator package registers nothing; its backends load only when enabled
    from nvgemm.dispatch.registry import register_backend
    from nvgemm.emulator.backend import BACKENDS

    for kind, backend in BACKENDS:
        register_backend(backend, kind)
    _ENABLED = True


__all__ = ["enable"]
