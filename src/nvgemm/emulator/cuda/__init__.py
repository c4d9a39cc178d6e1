"""The fake CUDA runtime (``fake_cudart.c``): build, relink kernel artifacts against it, record launches.

* :func:`fake_runtime` builds ``libnvgemm_emucudart.so`` once (gcc; own soname and symbol version
  node ``NVGEMM_EMU_1``, so it lives next to torch's real ``libcudart.so.13``) under
  ``<NVGEMM_CACHE_DIR or tmp>/emulator/<source sha>/`` and loads it.
* :func:`relink` links an AOT cache entry's ``kernel.o`` + ``shim.c`` + the DSL static runtime
  against it (the production ``link_shared`` recipe with the runtime library swapped), so the
  production :class:`~nvgemm.aot.artifact.AotKernel` host path runs unchanged on CPU tensors.
* Every launch reaches :class:`FakeCuda`'s callback as a :class:`LaunchRecord` (kernel name, image
  sha256, grid, block, cluster, dynamic smem, attribute ids, PDL / cooperative flags, the kernel's
  max-dynamic-smem attribute, and the parameter bytes -- their sizes come from the PTX ``.entry``
  registered for the image) and is passed to the handler set with :meth:`FakeCuda.handling`
  (the interpreter, or nothing for a pure recorder).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from nvgemm import settings
from nvgemm.aot import trusted_fs
from nvgemm.aot.artifact import dsl_runtime_dir
from nvgemm.emulator.ptx.machine import DEVICES
from nvgemm.emulator.ptx.program import compile_entry, parse_cached

SOURCE = Path(__file__).with_name("fake_cudart.c")
LIB_NAME = "libnvgemm_emucudart.so"
VERSION_NODE = "NVGEMM_EMU_1"
MAX_ATTRS = 32


class LaunchStruct(ctypes.Structure):
    _fields_ = [
        ("kernel_name", ctypes.c_char_p), ("image", ctypes.c_void_p), ("image_size", ctypes.c_ulonglong),
        ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("cluster", ctypes.c_uint * 3),
        ("dyn_smem", ctypes.c_ulonglong), ("stream", ctypes.c_void_p),
        ("pdl", ctypes.c_int), ("cooperative", ctypes.c_int), ("n_attrs", ctypes.c_int),
        ("attr_ids", ctypes.c_int * MAX_ATTRS),
        ("max_dyn_smem_attr", ctypes.c_int), ("nonportable_cluster", ctypes.c_int),
        ("args", ctypes.POINTER(ctypes.c_void_p)),
        ("preferred_cluster", ctypes.c_uint * 3),
    ]


CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(LaunchStruct))


@dataclass
class LaunchRecord:
    kernel_name: str
    image_sha256: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    cluster: tuple[int, int, int]
    dyn_smem: int
    pdl: bool
    cooperative: bool
    attr_ids: tuple[int, ...]
    max_dyn_smem_attr: int
    params: list[bytes] = field(default_factory=list)  # one bytes object per .entry parameter
    preferred_cluster: tuple[int, int, int] | None = None  # cudaLaunchAttributePreferredClusterDimension


def _cache_root() -> Path:
    base = settings.NVGEMM_CACHE_DIR
    return (base if base is not None else Path(tempfile.gettempdir()) / f"nvgemm-{os.getuid()}") / "emulator"


def _trusted_dir(d: Path) -> Path:
    """Create / check ``d`` under the emulator's cache root with the kernel cache's rules
    (:mod:`nvgemm.aot.trusted_fs`: every component owned by you or root, not writable by group or
    others, no symlinks; created 0700): the libraries built here are loaded into the process."""
    root = _cache_root()
    parts = d.relative_to(root).parts if d.is_relative_to(root) else None
    if parts is None:  # an explicit out_dir: the directory itself must be trusted
        root, parts = d, ()
    fd = trusted_fs.open_root(root, create=True)
    try:
        path = root
        for part in parts:
            path = path / part
            nfd = trusted_fs.open_dir(fd, part, path, create=True)
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)
    return d


def _trusted_file(so: Path) -> bool:
    """True when ``so`` exists and may be used (regular file of yours or root's, not group/other
    writable, not a link); raises UntrustedCacheError naming it otherwise."""
    try:
        st = os.lstat(so)
    except FileNotFoundError:
        return False
    trusted_fs.check_trusted(st, so, want_dir=False)
    return True


def _cc() -> str:
    cc = os.environ.get("CC", "gcc")
    if shutil.which(cc) is None:
        raise RuntimeError(f"nvgemm emulator: C compiler {cc!r} not found (set CC); it builds the fake CUDA runtime")
    return cc


def build_fake_runtime(out_dir: Path | None = None) -> Path:
    """Build (once per source version) and return the path of ``libnvgemm_emucudart.so``."""
    src = SOURCE.read_bytes()
    d = out_dir or _cache_root() / hashlib.sha256(src).hexdigest()[:16]
    so = d / LIB_NAME
    _trusted_dir(d)
    if _trusted_file(so):
        return so
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=d))
    try:
        (tmp / "vers.map").write_text(f"{VERSION_NODE} {{ global: cuda*; nvemu_*; local: *; }};\n")
        cmd = [_cc(), "-shared", "-fPIC", "-O2", "-Wall", f"-Wl,-soname,{LIB_NAME}",
               f"-Wl,--version-script={tmp / 'vers.map'}", "-o", str(tmp / LIB_NAME), str(SOURCE)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"nvgemm emulator: building the fake CUDA runtime failed ({' '.join(cmd)}):\n{r.stderr}")
        os.chmod(tmp / LIB_NAME, 0o700)  # the linker's mode follows the umask
        os.replace(tmp / LIB_NAME, so)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return so


def relink(entry_dir: Path, out_dir: Path | None = None) -> Path:
    """``kernel.so`` of an AOT cache entry relinked against the fake runtime (cached next to it in the
    emulator's cache, keyed by the entry's kernel.o sha256)."""
    entry_dir = Path(entry_dir)
    fake = build_fake_runtime()
    obj = entry_dir / "kernel.o"
    key = hashlib.sha256(obj.read_bytes() + (entry_dir / "shim.c").read_bytes() + fake.read_bytes()).hexdigest()[:24]
    d = out_dir or _cache_root() / "relinked" / key
    so = d / "kernel_emu.so"
    _trusted_dir(d)
    if _trusted_file(so):
        return so
    static_rt = dsl_runtime_dir() / "libcuda_dialect_runtime_static.a"
    tmp = d / f".kernel_emu.{os.getpid()}.{threading.get_ident()}.so"
    extra = _missing_stubs(d, [obj, static_rt], fake)
    cmd = [_cc(), "-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-o", str(tmp), str(entry_dir / "shim.c"), str(obj),
           str(static_rt), *extra, f"-L{fake.parent}", f"-l:{LIB_NAME}", f"-Wl,-rpath,{fake.parent}",
           "-Wl,--exclude-libs,ALL", "-Wl,-z,defs", "-Wl,--as-needed"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"nvgemm emulator: relinking {entry_dir} failed ({' '.join(cmd)}):\n{r.stderr}")
    os.chmod(tmp, 0o700)  # the linker's mode follows the umask
    os.replace(tmp, so)
    return so


def _symbols(path: Path, *flags: str) -> set[str]:
    r = subprocess.run(["nm", *flags, str(path)], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"nvgemm emulator: nm {' '.join(flags)} {path} failed: {r.stderr.strip()}")
    return {ln.split()[-1].split("@")[0] for ln in r.stdout.splitlines() if ln.strip() and not ln.endswith(":")}


def _missing_stubs(d: Path, objects: list[Path], fake: Path) -> list[str]:
    """A C file of failing stubs for the ``cuda*`` symbols the objects import that the fake runtime does
    not define (another cutlass-dsl version's static runtime may import more): they return
    cudaErrorNotSupported and say so when called, instead of the link failing."""
    need: set[str] = set()
    defined: set[str] = set()
    for o in objects:
        need |= _symbols(o, "--undefined-only")
        defined |= _symbols(o, "--defined-only")
    missing = sorted(s for s in need - defined - _symbols(fake, "-D", "--defined-only") if s.startswith("cuda"))
    if not missing:
        return []
    src = d / "missing_stubs.c"
    body = "".join(f'int {m}(void) {{ fprintf(stderr, "nvgemm emulator fake CUDA runtime: {m} is not emulated\\n"); '
                   f"return 801; }}\n" for m in missing)
    src.write_text("#include <stdio.h>\n" + body)
    return [str(src)]


class FakeCuda:
    """The loaded fake runtime plus the registry of PTX per (image sha256, kernel name)."""

    def __init__(self):
        self.path = build_fake_runtime()
        self.lib = ctypes.CDLL(str(self.path))
        self.lib.nvemu_set_device.argtypes = [ctypes.c_int] * 4
        self._cb = CALLBACK(self._callback)
        self.lib.nvemu_set_callback(self._cb)
        self.ptx: dict[tuple[str, str], str] = {}
        self.records: list[LaunchRecord] = []
        self._tls = threading.local()
        self.set_device("H200")

    def set_device(self, name: str) -> None:
        if name not in DEVICES:
            raise ValueError(f"unknown device profile {name!r}; have {sorted(DEVICES)}")
        p = DEVICES[name]
        self.device = p
        self.lib.nvemu_set_device(p.sm_count, p.cc[0], p.cc[1], p.max_smem_optin)

    def register_ptx(self, image_sha256: str, kernel_name: str, ptx: str) -> None:
        self.ptx[(image_sha256, kernel_name)] = ptx

    @contextlib.contextmanager
    def handling(self, handler: Callable[[LaunchRecord, "object"], None] | None):
        """Launches inside the block go to ``handler(record, load_program)`` (None: record only);
        ``load_program()`` compiles the launched entry (an unknown opcode raises there)."""
        prev = getattr(self._tls, "handler", None)
        self._tls.handler = handler
        self._tls.error = None
        try:
            yield
        finally:
            err = self._tls.error
            self._tls.handler = prev
            self._tls.error = None
            if err is not None:
                raise err

    def _callback(self, lp) -> int:
        try:
            L = lp.contents
            image = ctypes.string_at(L.image, L.image_size)
            sha = hashlib.sha256(image).hexdigest()
            name = L.kernel_name.decode()
            ptx = self.ptx.get((sha, name))
            if ptx is None:
                raise LookupError(f"nvgemm emulator: no PTX registered for kernel {name[:80]}... with image sha256 "
                                  f"{sha[:16]} (compile the same spec with keep_ptx and register it)")

            entry = parse_cached(ptx).entries.get(name)
            if entry is None:
                raise LookupError(f"nvgemm emulator: the registered PTX has no entry {name[:80]}")
            params = [ctypes.string_at(L.args[i], p.size) for i, p in enumerate(entry.params)]
            rec = LaunchRecord(name, sha, tuple(L.grid), tuple(L.block), tuple(L.cluster), int(L.dyn_smem),
                               bool(L.pdl), bool(L.cooperative), tuple(L.attr_ids[:L.n_attrs]),
                               int(L.max_dyn_smem_attr), params,
                               tuple(L.preferred_cluster) if any(L.preferred_cluster) else None)
            self.records.append(rec)
            handler = getattr(self._tls, "handler", None)
            if handler is not None:
                handler(rec, lambda: compile_entry(ptx, name))
            return 0
        except BaseException as e:  # never let an exception cross the C boundary: report it after
            self._tls.error = e
            return 719  # cudaErrorLaunchFailure


_FAKE: FakeCuda | None = None
_FAKE_LOCK = threading.Lock()


def fake_cuda() -> FakeCuda:
    global _FAKE
    with _FAKE_LOCK:
        if _FAKE is None:
            _FAKE = FakeCuda()
        return _FAKE


__all__ = ["FakeCuda", "LaunchRecord", "build_fake_runtime", "fake_cuda", "relink"]
