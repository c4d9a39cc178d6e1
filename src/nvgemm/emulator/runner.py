"""Run nvgemm's real AOT kernels on the emulator: artifact + PTX + relinked library, one launch.

:func:`prepare` takes a :class:`~nvgemm.aot.abi.CompileSpec` to an :class:`EmuKernel`:
the production AOT cache entry (``KernelCache.ensure``), the PTX of the same spec compiled with
``keep_ptx`` (stored under the emulator cache, keyed by the entry key; registered with the fake
runtime by the fatbin's sha256 + entry name, so a launch whose image differs finds no PTX and
fails), and ``kernel.so`` relinked against the fake CUDA runtime, opened with the production
:class:`~nvgemm.aot.artifact.AotKernel`. :meth:`EmuKernel.launch` packs arguments exactly like
production (``check_device=False`` is the only difference), registers every tensor argument as a
bounds-checked global allocation and executes the launch the host code makes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any

from nvgemm.emulator.cuda import LaunchRecord, _cache_root, _trusted_dir, _trusted_file, fake_cuda, relink
from nvgemm.emulator.ptx.errors import EmulationError
from nvgemm.emulator.ptx.interp import run_launch
from nvgemm.emulator.ptx.machine import DEVICES, GlobalMemory, Launch
from nvgemm.emulator.ptx.pdl import StreamGrid
from nvgemm.emulator.stream import capturing
from nvgemm.aot.abi import PointerArg, TensorArg, abi_from_json
from nvgemm.aot.cache import default_cache
from nvgemm.emulator.ptx.program import compile_entry

_LOCK = threading.Lock()
_KERNELS: dict[Any, "EmuKernel"] = {}


def _ensure_dump_dir() -> None:
    # CuTeDSL reads CUTE_DSL_DUMP_DIR once; keep_ptx writes there (never the working directory)
    if "CUTE_DSL_DUMP_DIR" not in os.environ:
        os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="nvgemm_emu_dump_")


_ENTRY_RE = re.compile(r"\.entry\s+([\w$]+)\s*\(")


def ptx_for(spec, key: str) -> tuple[str, str, str]:
    """(ptx, fatbin sha256, first entry name) of ``spec``, compiled with keep_ptx once and cached on disk (a
    host function may launch several kernels of one module, e.g. a producer before the GEMM it feeds under
    PDL: :meth:`EmuKernel.launch` registers every entry)."""
    d = _cache_root() / "ptx" / key
    meta = d / "meta.json"
    _trusted_dir(d)  # the kernel cache's rules: what the emulator runs comes from here
    if _trusted_file(meta) and _trusted_file(d / "kernel.ptx"):
        m = json.loads(meta.read_text())
        return (d / "kernel.ptx").read_text(), m["image_sha256"], m["entry"]
    _ensure_dump_dir()
    # lazy: looked up at call time (tests patch abi.get_template)
    from nvgemm.aot.abi import get_template
    # lazy: cutlass import cost
    from nvgemm.templates.sm90_w4a16.common import embedded_cubin  # generic: any compiled CuTeDSL module

    # compile_for_target gives every keep_ptx compile a private dump dir: no other process's PTX
    # can be read for this spec (kernel names do not depend on the config). The launch's block must
    # still equal the PTX's .reqntid (checked by the interpreter).
    compiled = get_template(spec.template_id).compile(spec, keep_ptx=True)
    ptx = compiled.__ptx__
    if not ptx:
        raise EmulationError(f"{spec.name()}: keep_ptx compile returned no PTX (is CUTE_DSL_DUMP_DIR writable?)")
    sha = hashlib.sha256(embedded_cubin(compiled)).hexdigest()
    entries = _ENTRY_RE.findall(ptx)
    if not entries:
        raise EmulationError(f"{spec.name()}: no .entry in the PTX")
    tmp = d / f".kernel.ptx.{os.getpid()}"
    tmp.write_text(ptx)
    os.chmod(tmp, 0o600)  # write_text's mode follows the umask
    os.replace(tmp, d / "kernel.ptx")
    tmpm = d / f".meta.{os.getpid()}"
    tmpm.write_text(json.dumps({"image_sha256": sha, "entry": entries[0], "spec": spec.name()}))
    os.chmod(tmpm, 0o600)
    os.replace(tmpm, meta)
    return ptx, sha, entries[0]


@dataclass
class EmuKernel:
    spec: Any
    key: str
    kernel: Any  # AotKernel over the relinked library
    ptx: str
    image_sha256: str
    entry: str
    device: str = "H200"
    last: Launch | None = None
    records: list[LaunchRecord] = field(default_factory=list)

    def launch(self, *values, order="forward", record_only: bool = False) -> Launch | None:
        """Launch with ``values`` in ABI order (torch CPU tensors, scalars, a stream int); ``order``: the
        cluster order, or a :class:`~.ptx.schedule.Schedule` (order + clusters resident at once)."""
        gmem = GlobalMemory()
        for a, v in zip(self.kernel.abi, values):
            if isinstance(a, TensorArg) or (isinstance(a, PointerArg) and hasattr(v, "data_ptr")):
                gmem.register_tensor(v, a.name)  # a PointerArg's extent is the tensor passed for it
        fake = fake_cuda()
        fake.set_device(self.device)
        for name in _ENTRY_RE.findall(self.ptx):
            fake.register_ptx(self.image_sha256, name, self.ptx)
        self.last = None

        def handler(rec: LaunchRecord, load_program) -> None:
            self.records.append(rec)
            if record_only:
                return
            stream = capturing()
            if stream is not None:  # a PDL stream capture: build the launch, run it later with the others
                launch = record_launch(rec, load_program, gmem, self.device)
                launch.ext["keep_alive"] = values  # the tensors its addresses point into
                launch.ext["ptx"] = self.ptx
                stream.append(StreamGrid(launch, bool(rec.pdl), self.spec.name()))
                return
            self.last = execute_record(rec, load_program, gmem, self.device, order)

        with fake.handling(handler):
            self.kernel.ensure_loaded()
            slots, keep = self.kernel.pack(*values, check_device=False)
            rc = self.kernel._launch(slots, len(self.kernel.abi) + 1)
            del keep
        if rc != 0:
            raise RuntimeError(f"nvgemm emulator: launch of {self.spec.name()} returned cudaError {rc}")
        return self.last


def execute_record(rec: LaunchRecord, load_program, gmem: GlobalMemory, device: str, order="forward") -> Launch:
    """Run one launch the fake runtime recorded: its PTX entry (``load_program()``), grid / block /
    cluster / dynamic smem and parameter bytes, over the global allocations in ``gmem``."""
    return run_launch(record_launch(rec, load_program, gmem, device), order)


def record_launch(rec: LaunchRecord, load_program, gmem: GlobalMemory, device: str) -> Launch:
    """The :class:`Launch` of a recorded launch (see :func:`execute_record`), not run."""
    prog = load_program()
    if prog.static_size:
        raise EmulationError(f"{rec.kernel_name[:60]}: {prog.static_size} bytes of static shared memory; the fake "
                             "runtime reports 0 to the host code")
    params = bytearray(prog.entry.param_bytes)
    for p, b in zip(prog.entry.params, rec.params):
        params[p.offset:p.offset + p.size] = b
    launch = Launch(prog, rec.grid, rec.block, rec.cluster, rec.dyn_smem, bytes(params), gmem, DEVICES[device])
    if rec.preferred_cluster:
        launch.ext["preferred_cluster"] = rec.preferred_cluster  # see ptx/schedule.py
    return launch


def prepare(spec, cache=None, device: str = "H200") -> EmuKernel:
    """The emulated kernel of ``spec`` (built, PTX'd and relinked once per process)."""
    # lazy: looked up at call time (tests patch artifact.AotKernel)
    from nvgemm.aot.artifact import AotKernel

    with _LOCK:
        k = _KERNELS.get((spec, device))
        if k is not None:
            return k
    kc = cache or default_cache()
    r = kc.ensure(spec)
    if r.status == "failed":
        raise RuntimeError(f"nvgemm emulator: no kernel for {spec.name()}: {r.error}")
    ptx, sha, entry = ptx_for(spec, r.key)
    so = relink(r.path)
    kern = AotKernel(so, abi_from_json(r.meta["abi"]), name=f"emu:{spec.name()}")
    k = EmuKernel(spec, r.key, kern, ptx, sha, entry, device)
    with _LOCK:
        k = _KERNELS.setdefault((spec, device), k)
    return k




def launch_ptx(ptx: str, grid, block, params: list, tensors: list = (), *, entry: str | None = None, dyn_smem: int = 0,
               cluster=(1, 1, 1), order="forward", device: str = "H200", preferred_cluster=None) -> Launch:
    """Run PTX text directly (no artifact): ``params`` are the entry's parameters in order (ints are
    packed at the parameter's size, torch tensors as their data pointer, bytes as is); ``tensors``
    (and tensor params) are the global allocations."""
    return run_launch(make_launch(ptx, grid, block, params, tensors, entry=entry, dyn_smem=dyn_smem, cluster=cluster,
                                  device=device, preferred_cluster=preferred_cluster), order)


def make_launch(ptx: str, grid, block, params: list, tensors: list = (), *, entry: str | None = None, dyn_smem: int = 0,
                cluster=(1, 1, 1), device: str = "H200", preferred_cluster=None) -> Launch:
    """The :class:`Launch` :func:`launch_ptx` runs, not run (e.g. for a PDL stream, :mod:`.ptx.pdl`)."""
    import struct

    prog = compile_entry(ptx, entry)
    gmem = GlobalMemory()
    for t in list(tensors) + [p for p in params if hasattr(p, "data_ptr")]:
        gmem.register_tensor(t, f"tensor@{t.data_ptr():#x}")
    buf = bytearray(prog.entry.param_bytes)
    if len(params) != len(prog.entry.params):
        raise ValueError(f"{len(params)} parameters given, the entry has {len(prog.entry.params)}")
    for p, v in zip(prog.entry.params, params):
        if hasattr(v, "data_ptr"):
            v = v.data_ptr()
        if isinstance(v, int):
            v = (v & ((1 << (8 * p.size)) - 1)).to_bytes(p.size, "little")
        elif isinstance(v, float):
            v = struct.pack("<f" if p.size == 4 else "<d", v)
        if len(v) != p.size:
            raise ValueError(f"parameter {p.name}: {len(v)} bytes for a {p.size}-byte parameter")
        buf[p.offset:p.offset + p.size] = v
    launch = Launch(prog, tuple(grid), tuple(block), tuple(cluster), dyn_smem, bytes(buf), gmem, DEVICES[device])
    if preferred_cluster:
        launch.ext["preferred_cluster"] = tuple(preferred_cluster)
    return launch


__all__ = ["EmuKernel", "execute_record", "launch_ptx", "make_launch", "record_launch", "prepare", "ptx_for"]
