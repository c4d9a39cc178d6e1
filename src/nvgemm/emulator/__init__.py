"""PTX functional emulator: nvgemm's real AOT kernels run on the CPU (fake CUDA runtime + numpy PTX interpreter).

It sits beside the stack and is opt-in: nothing in a normal dispatch imports it. :func:`enable` registers
its backends (``emu_sm90`` for ``nvfp4_linear``, ``emu_sm100`` / ``emu_sm120`` for ``nvfp4_linear`` and the
fused ops, ``emu_sm100_moe`` / ``emu_sm120_moe`` for ``nvfp4_moe``) with the dispatch registry, and installs the Triton stand-in
(:mod:`nvgemm.emulator.triton_ptx`): while an ``emu_*`` backend is forced (or after
``enable(triton_arch=...)``) the Triton kernels on the op path (activation quantizer, fused RMSNorm / SiLU-mul
quantizers, W4A4 qdq, MoE prep / finalize) run on CPU tensors from their PTX for the emulated arch instead
of the torch references. Dispatch calls it when
``NVGEMM_BACKEND`` / ``NVGEMM_MOE_BACKEND`` / ``NVGEMM_FUSED_BACKEND`` names an ``emu_*`` backend, ``nvgemm demo
--emulate-kernels`` forces one, and tests call it directly.
"""

from __future__ import annotations

import importlib.util

_ENABLED = False


TRITON_ARCHS = ("sm_90a", "sm_100a", "sm_120a")


def triton_arch_from_settings() -> str | None:
    """The arch whose Triton PTX the stand-in runs while an emulator backend is forced: sm_100a when an
    ``emu_sm100*`` backend is forced, sm_120a when an ``emu_sm120*`` one is, sm_90a when only ``emu_sm90`` is, None
    when none is (read at each call)."""
    from nvgemm import settings  # lazy: this package imports nothing until used

    forced = (settings.NVGEMM_BACKEND, settings.NVGEMM_MOE_BACKEND, settings.NVGEMM_FUSED_BACKEND)
    if any(f.startswith("emu_sm100") for f in forced):
        return "sm_100a"
    if any(f.startswith("emu_sm120") for f in forced):
        return "sm_120a"
    if any(f.startswith("emu_sm90") for f in forced):
        return "sm_90a"
    return None


def enable(triton_arch: str | None = None) -> None:
    """Register the emulator's backends (idempotent; never chosen automatically: priority below the emulated
    reference, so a call runs on one only when forced by name) and install the Triton stand-in.

    ``triton_arch`` ("sm_90a" / "sm_100a" / "sm_120a"): the Triton kernels on the op path run on CPU tensors
    from that arch's PTX until :func:`disable_triton`. Without it the stand-in follows the settings: active while an
    ``emu_*`` backend is forced (:func:`triton_arch_from_settings`, read at each call), so a plain
    ``enable()`` changes no CPU result path and an ``NVGEMM_BACKEND=emu_sm100`` run gets the sm_100a PTX.
    Without Triton installed nothing is installed and the torch references keep serving CPU tensors."""
    global _ENABLED
    if triton_arch is not None and triton_arch not in TRITON_ARCHS:
        raise ValueError(f"nvgemm.emulator.enable: triton_arch must be one of {TRITON_ARCHS}, got {triton_arch!r}")
    # lazy: importing the emulator package registers nothing; its backends load only when enabled
    from nvgemm.templates.common import triton_stand_in

    if importlib.util.find_spec("triton") is not None:
        # lazy: only with Triton installed (the stand-in compiles Triton kernels)
        from nvgemm.emulator.triton_ptx import stand_in_factory

        if triton_arch is not None:
            triton_stand_in.install(stand_in_factory(), lambda: triton_arch)
        elif triton_stand_in.installed_arch() is None:
            triton_stand_in.install(stand_in_factory(), triton_arch_from_settings)
    if _ENABLED:
        return
    # lazy: importing the emulator package registers nothing; its backends load only when enabled
    from nvgemm.dispatch.registry import register_backend
    from nvgemm.emulator.backend import BACKENDS  # lazy: as above

    for kind, backend in BACKENDS:
        register_backend(backend, kind)
    _ENABLED = True


def disable_triton() -> None:
    """Remove the Triton stand-in (CPU tensors go back to the torch references; a later :func:`enable` or a
    forced ``emu_*`` backend installs it again)."""
    from nvgemm.templates.common import triton_stand_in  # lazy: as in enable

    triton_stand_in.install(None)


__all__ = ["TRITON_ARCHS", "disable_triton", "enable", "triton_arch_from_settings"]
