"""PTX functional emulator: nvgemm's real AOT kernels run on the CPU (fake CUDA runtime + numpy PTX interpreter).

It sits beside the stack and is opt-in: nothing in a normal dispatch imports it. :func:`enable` registers
its backends (``emu_sm90``, ``emu_sm100`` for ``nvfp4_linear`` and the fused ops, ``emu_sm100_moe``) with the
dispatch registry, and installs the Triton stand-in (:mod:`nvgemm.emulator.triton_ptx`): the Triton kernels on
the op path (activation quantizer, fused RMSNorm / SiLU-mul quantizers, W4A4 qdq, MoE prep / finalize) then run
on CPU tensors from their PTX for the emulated arch instead of the torch references. Dispatch calls it when
``NVGEMM_BACKEND`` / ``NVGEMM_MOE_BACKEND`` / ``NVGEMM_FUSED_BACKEND`` names an ``emu_*`` backend, ``nvgemm demo
--emulate-kernels`` forces one, and tests call it directly.
"""

from __future__ import annotations

import importlib.util

_ENABLED = False


def triton_arch_from_settings() -> str:
    """The arch whose Triton PTX the stand-in runs: sm_90a when an ``emu_sm90`` backend is forced (and no
    sm100 one), else sm_100a."""
    from nvgemm import settings  # lazy: this package imports nothing until used

    forced = (settings.NVGEMM_BACKEND, settings.NVGEMM_MOE_BACKEND, settings.NVGEMM_FUSED_BACKEND)
    if any(f.startswith("emu_sm90") for f in forced) and not any(f.startswith("emu_sm100") for f in forced):
        return "sm_90a"
    return "sm_100a"


def enable(triton_arch: str | None = None) -> None:
    """Register the emulator's backends (idempotent; never chosen automatically: priority below the emulated
    reference, so a call runs on one only when forced by name) and install the Triton stand-in for
    ``triton_arch`` ("sm_90a" / "sm_100a"; default :func:`triton_arch_from_settings`). Without Triton
    installed the stand-in is not installed and the torch references keep serving CPU tensors."""
    global _ENABLED
    # lazy: importing the emulator package registers nothing; its backends load only when enabled
    from nvgemm.templates.common import triton_stand_in

    if importlib.util.find_spec("triton") is not None:
        # lazy: only with Triton installed (the stand-in compiles Triton kernels)
        from nvgemm.emulator.triton_ptx import stand_in_factory

        arch = triton_arch or triton_arch_from_settings()
        triton_stand_in.install(stand_in_factory(arch), arch)
    if _ENABLED:
        return
    # lazy: importing the emulator package registers nothing; its backends load only when enabled
    from nvgemm.dispatch.registry import register_backend
    from nvgemm.emulator.backend import BACKENDS  # lazy: as above

    for kind, backend in BACKENDS:
        register_backend(backend, kind)
    _ENABLED = True


def disable_triton() -> None:
    """Remove the Triton stand-in (CPU tensors go back to the torch references)."""
    from nvgemm.templates.common import triton_stand_in  # lazy: as in enable

    triton_stand_in.install(None)


__all__ = ["disable_triton", "enable", "triton_arch_from_settings"]
