"""Run any compiled CuTeDSL host function on the emulator (not only nvgemm's own templates).

:class:`EmulatedHostFunction` takes the result of ``cute.compile(fn, *args, options="--gpu-arch <arch>
--keep-ptx")`` (compiled on a machine without a GPU) and executes what calling it would do on a GPU:

1. the module is exported with ``export_to_c`` -- the public AOT route nvgemm's own kernels take
   (:mod:`nvgemm.aot.artifact`) -- and the export gets the same stable shim; the object is linked against
   the fake CUDA runtime (:func:`nvgemm.emulator.cuda.relink`), so the DSL's own host code runs: grid,
   block, cluster, dynamic shared memory, attributes and the kernel parameter bytes (TMA descriptors
   included, which the DSL encodes inline) are what a GPU launch would receive;
2. the module's PTX (``__ptx__``, kept by ``--keep-ptx``) is registered for the embedded image's sha256
   and every ``.entry`` it holds, so each launch the host code makes is interpreted;
3. the call's arguments are packed by CuTeDSL's own JIT argument marshalling
   (``compiled.generate_execution_args``, the pointers ``compiled(*args)`` would hand its launcher; the
   exported launcher takes the same array plus a return slot). That method is the one private name
   here: it was checked against nvidia-cutlass-dsl :data:`CHECKED_DSL_VERSIONS`; another version is
   refused with an error naming it (set ``NVGEMM_EMU_ANY_DSL=1`` to try anyway), and a pointer count
   that differs from the exported header's parameters is an error, never a launch.

Device memory is host memory: the arguments are CuTe tensors over CPU torch tensors; the torch tensors are
passed as ``memory=`` and become the launch's bounds-checked global allocations. ``from_dlpack(cpu_tensor)``
types a tensor as ``generic`` memory, which CuTe's global-memory atoms (``cp.async``, TMA) refuse at compile
time; :func:`device_view` presents a CPU tensor to ``from_dlpack`` as CUDA device memory (``gmem``) instead,
as a GPU tensor would be.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nvgemm import settings
from nvgemm.emulator.cuda import _cache_root, _trusted_dir, fake_cuda, relink
from nvgemm.emulator.ptx.errors import EmulationError
from nvgemm.emulator.ptx.machine import DEVICES, GlobalMemory, Launch
from nvgemm.emulator.runner import execute_record
from nvgemm.aot.abi import COMPILE_LOCK
from nvgemm.aot.artifact import _prepare_export, load_image, parse_header, write_shim

CHECKED_DSL_VERSIONS = ("4.8.1",)


def _check_dsl_version() -> str:
    from importlib.metadata import version

    v = version("nvidia-cutlass-dsl")
    if v not in CHECKED_DSL_VERSIONS and not settings.NVGEMM_EMU_ANY_DSL:
        raise RuntimeError(f"nvgemm emulator: running a compiled CuTeDSL host function uses the DSL's argument "
                           f"marshalling (generate_execution_args), checked against nvidia-cutlass-dsl "
                           f"{', '.join(CHECKED_DSL_VERSIONS)}; this is {v} (NVGEMM_EMU_ANY_DSL=1 to try anyway)")
    return v


def ptx_entries(ptx: str) -> list[str]:
    """The ``.entry`` names of a PTX module, in order."""
    return re.findall(r"\.entry\s+([\w$]+)\s*\(", ptx)


KDL_CUDA = 2  # DLDeviceType kDLCUDA (dlpack.h)


class DeviceView:
    """A CPU torch tensor seen through DLPack as memory of CUDA device 0 (see :func:`device_view`)."""

    def __init__(self, t):
        if t.device.type != "cpu":
            raise ValueError(f"device_view: expected a CPU tensor (the emulator's device memory), got {t.device}")
        self.tensor = t
        self._cap = t.__dlpack__()  # unversioned DLManagedTensor: {DLTensor{void *data; DLDevice device; ...}, ...}
        get_name = ctypes.pythonapi.PyCapsule_GetName
        get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
        if get_name(self._cap) != b"dltensor":
            raise RuntimeError(f"device_view: torch returned a {get_name(self._cap)!r} capsule, expected b'dltensor'")
        get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
        get_ptr.restype, get_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        p = get_ptr(self._cap, b"dltensor")
        data = ctypes.c_void_p.from_address(p).value
        if data not in (t.data_ptr(), t.data_ptr() - t.storage_offset() * t.element_size()):
            raise RuntimeError("device_view: unexpected DLTensor layout (data pointer mismatch)")
        dev = (ctypes.c_int32 * 2).from_address(p + ctypes.sizeof(ctypes.c_void_p))  # DLDevice {type, id}
        dev[0], dev[1] = KDL_CUDA, 0

    def __dlpack_device__(self):
        return (KDL_CUDA, 0)

    def __dlpack__(self, stream=None, **kwargs):
        cap, self._cap = self._cap, None
        if cap is None:
            raise RuntimeError("device_view: a view can be consumed once (make another)")
        return cap


def device_view(t) -> DeviceView:
    """``from_dlpack(device_view(t))``: CuTe tensor over CPU tensor ``t`` typed as global (device) memory."""
    return DeviceView(t)


def _launcher_slots(header) -> int:
    """Argument pointers the exported launcher takes (its wrapper's ``void *args[N]`` less the return slot;
    a list of tensors is one wrapper parameter but one slot per element)."""
    m = re.findall(r"void \*args\[(\d+)\]", header.read_text())
    if len(m) != 1:
        raise EmulationError(f"{header}: expected one launcher wrapper with 'void *args[N]', found {len(m)}")
    return int(m[0]) - 1


@dataclass
class EmulatedHostFunction:
    """A compiled CuTeDSL host function bound to the fake runtime; call it like the compiled function."""

    compiled: Any
    device: str = "H200"
    launches: list[Launch] = field(default_factory=list)

    def __post_init__(self):
        # lazy: cutlass import cost
        from nvgemm.templates.sm90_w4a16.common import embedded_cubin  # generic: any compiled CuTeDSL module

        _check_dsl_version()
        if self.device not in DEVICES:
            raise ValueError(f"unknown device profile {self.device!r}; have {sorted(DEVICES)}")
        self.ptx = getattr(self.compiled, "__ptx__", None)
        if not self.ptx:
            raise EmulationError("the compiled function carries no PTX: compile with options '--keep-ptx' (and "
                                 "CUTE_DSL_DUMP_DIR writable)")
        self.entries = ptx_entries(self.ptx)
        if not self.entries:
            raise EmulationError("the compiled function's PTX has no .entry")
        self.image_sha256 = hashlib.sha256(embedded_cubin(self.compiled)).hexdigest()
        so, self.n_params = self._build()
        self._lib = load_image(so.read_bytes(), f"cute-host-{self.image_sha256[:12]}")
        self._lib.nvgemm_aot_load.restype = ctypes.c_int32
        self._launch = self._lib.nvgemm_aot_launch
        self._launch.restype = ctypes.c_int32
        self._launch.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int32]
        self._loaded = False

    def _build(self):
        """export_to_c + shim into a fresh directory, relinked against the fake runtime (the relinked library is
        cached by the object's and shim's bytes). The export itself is not cached: two host functions around the
        same kernel share its image and PTX but not their host code."""
        import shutil
        import tempfile

        root = _trusted_dir(_cache_root() / "cute_host")
        d = Path(tempfile.mkdtemp(prefix="export-", dir=root))  # 0700, ours
        try:
            prefix = f"nvemu_{self.image_sha256[:16]}"
            _prepare_export()
            with COMPILE_LOCK:  # the MLIR execution engine behind export is not known to be thread-safe
                self.compiled.export_to_c(str(d), "kernel", function_prefix=prefix)
            parsed = parse_header((d / "kernel.h").read_text(), prefix)
            slots = _launcher_slots(d / "kernel.h")
            write_shim(d / "shim.c", prefix, parsed["ciface"], slots + 1)
            return relink(d), slots
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def __call__(self, *args: Any, memory=(), order: str = "forward", **kwargs: Any) -> list[Launch]:
        """Run the host function with ``args`` (as for the compiled function); ``memory``: the torch CPU
        tensors behind them (global allocations, bounds-checked). Returns the launches it made."""
        gmem = GlobalMemory()
        for i, t in enumerate(memory):
            gmem.register_tensor(t, f"memory[{i}] {tuple(t.shape)} {t.dtype}")
        exe_args, keep = self.compiled.generate_execution_args(*args, **kwargs)
        if len(exe_args) != self.n_params:
            raise EmulationError(f"CuTeDSL packed {len(exe_args)} argument pointers, the exported launcher takes "
                                 f"{self.n_params}: this DSL version marshals differently from the export")
        ret = ctypes.c_int32(0)
        ptrs = [a.value if isinstance(a, ctypes.c_void_p) else ctypes.c_void_p(a).value for a in exe_args]
        slots = (ctypes.c_void_p * (len(ptrs) + 1))(*ptrs, ctypes.addressof(ret))
        fake = fake_cuda()
        fake.set_device(self.device)
        for e in self.entries:
            fake.register_ptx(self.image_sha256, e, self.ptx)
        made: list[Launch] = []

        def handler(rec, load_program) -> None:
            made.append(execute_record(rec, load_program, gmem, self.device, order))

        with fake.handling(handler):
            if not self._loaded:
                rc = self._lib.nvgemm_aot_load()
                if rc:
                    raise RuntimeError(f"nvgemm emulator: loading the module returned cudaError {rc}")
                self._loaded = True
            rc = self._launch(slots, len(ptrs) + 1)
        del keep
        if rc:
            raise RuntimeError(f"nvgemm emulator: the host function returned cudaError {rc}")
        self.launches += made
        return made


__all__ = ["CHECKED_DSL_VERSIONS", "DeviceView", "EmulatedHostFunction", "device_view", "ptx_entries"]
