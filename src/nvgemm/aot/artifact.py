"""Ahead-of-time kernel artifacts: export a compiled CuTeDSL function, link it, load it with ctypes.

Build side (needs cutlass, never a GPU): :func:`build_artifacts` compiles a CompileSpec through its
registered template, ``export_to_c``'s it (object + header), checks the generated header against
the template's declared C ABI, writes a small C shim with stable entry points and links

    gcc -shared shim.c kernel.o libcuda_dialect_runtime_static.a -l:libcudart.so.13  ->  kernel.so

Load side (no cutlass import, ever): :class:`AotKernel` opens ``kernel.so`` with ctypes, loads the
embedded cubin once per process (``nvgemm_aot_load``) and launches via ``nvgemm_aot_launch`` with
argument slots packed from torch tensors per the ABI. The calling convention is documented in
``nvgemm.aot.abi``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from nvgemm.aot.abi import (
    COMPILE_LOCK,
    AbiArg,
    CompileSpec,
    PointerArg,
    ScalarArg,
    StreamArg,
    TensorArg,
    abi_to_json,
    check_spec,
    get_template,
    validate_abi,
)

from nvgemm.aot.trusted_fs import write_all
from nvgemm.aot.compile_spec import capture_codegen_env

AOT_ABI_VERSION = 1
ENTRY_SYMBOLS = ("nvgemm_aot_abi_version", "nvgemm_aot_load", "nvgemm_aot_launch")


class AotBuildError(RuntimeError):
    """A kernel could not be compiled, exported or linked; the message names the step."""


# --------------------------------------------------------------------------------------------
# Locating the CUDA runtime and the DSL's static runtime archive
# --------------------------------------------------------------------------------------------


def _nvidia_lib_dirs() -> list[Path]:
    dirs: list[Path] = []
    spec = importlib.util.find_spec("nvidia")
    for base in list(spec.submodule_search_locations or []) if spec else []:
        for sub in ("cu13/lib", "cuda_runtime/lib"):
            p = Path(base) / sub
            if p.is_dir():
                dirs.append(p)
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            dirs += [Path(os.environ[env]) / "lib64", Path(os.environ[env]) / "lib"]
    dirs += [Path("/usr/local/cuda/lib64"), Path("/usr/local/cuda/lib")]
    return [d for d in dirs if d.is_dir()]


def find_cudart() -> Path | None:
    """Path of libcudart.so.13 (pip nvidia-cuda-runtime first, then CUDA_HOME, /usr/local/cuda)."""
    for d in _nvidia_lib_dirs():
        p = d / "libcudart.so.13"
        if p.exists():
            return p
    return None


_CUDART_LOCK = threading.Lock()
_CUDART_HANDLE: ctypes.CDLL | None = None


def preload_cudart() -> None:
    """Make ``libcudart.so.13`` resolvable for kernel libraries (no rpath is baked into them).

    If torch (or anything) already loaded it, the loader reuses that copy by soname, so kernels and
    torch share one CUDA runtime and stream handles are interchangeable.
    """
    global _CUDART_HANDLE
    with _CUDART_LOCK:
        if _CUDART_HANDLE is not None:
            return
        try:
            _CUDART_HANDLE = ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)
            return
        except OSError:
            pass
        p = find_cudart()
        if p is None:
            raise OSError(
                "nvgemm_cutedsl: libcudart.so.13 not found (install nvidia-cuda-runtime or set CUDA_HOME); "
                "AOT kernels need the CUDA 13 runtime"
            )
        _CUDART_HANDLE = ctypes.CDLL(str(p), mode=ctypes.RTLD_GLOBAL)


def dsl_runtime_dir() -> Path:
    """Directory of the DSL's runtime libs (holds libcuda_dialect_runtime_static.a). Imports cutlass."""
    from cutlass.runtime import find_runtime_libraries

    libs = find_runtime_libraries(enable_tvm_ffi=False)
    if not libs:
        raise AotBuildError("cutlass-dsl runtime library (libcute_dsl_runtime.so) not found")
    return Path(libs[0]).parent


_EXPORT_READY = False


def _prepare_export() -> None:
    """``dump_object_file_pic`` resolves the launcher's runtime symbols (``_cudaLaunchKernelEx``, ...)
    against the process; on a GPU-less host nothing has loaded them yet, so load the DSL runtime
    library globally first (otherwise export fails with "JIT session error: Symbols not found")."""
    global _EXPORT_READY
    if not _EXPORT_READY:
        ctypes.CDLL(str(dsl_runtime_dir() / "libcute_dsl_runtime.so"), mode=ctypes.RTLD_GLOBAL)
        _EXPORT_READY = True


# --------------------------------------------------------------------------------------------
# Header check
# --------------------------------------------------------------------------------------------

_SCALAR_C = {"int32": "int32_t", "int64": "int64_t", "float32": "float"}


def parse_header(header: str, prefix: str) -> dict[str, Any]:
    """The launcher symbol, wrapper parameters and tensor descriptor structs of an exported header."""
    m = re.search(rf"void (_mlir_{re.escape(prefix)}__mlir_ciface_\w+)\(void \*\*args, int32_t num_args\);", header)
    if not m:
        raise AotBuildError(f"exported header has no launcher symbol for prefix {prefix!r}")
    ciface = m.group(1)
    w = re.search(rf"static inline \w+ cute_dsl_{re.escape(prefix)}_wrapper\(([^)]*)\)", header)
    if not w:
        raise AotBuildError("exported header has no wrapper function")
    params = [p.strip() for p in w.group(1).split(",")][1:]  # drop the module pointer
    structs = {}
    for sm in re.finditer(r"typedef struct \{\s*void \*data;([^}]*)\}\s*(\w+)_Tensor_(\w+)_t;", header):
        body, name = sm.group(1), sm.group(3)
        shp = re.search(r"(int32_t|int64_t) dynamic_shapes\[(\d+)\];", body)
        std = re.search(r"(int32_t|int64_t) dynamic_strides\[(\d+)\];", body)
        structs[name] = {
            "shape": (shp.group(1), int(shp.group(2))) if shp else None,
            "stride": (std.group(1), int(std.group(2))) if std else None,
        }
    return {"ciface": ciface, "params": params, "structs": structs}


def check_header_abi(parsed: dict[str, Any], abi: tuple[AbiArg, ...], prefix: str) -> None:
    """Raise AotBuildError unless the exported header matches the declared ABI exactly."""
    params = parsed["params"]
    if len(params) != len(abi):
        raise AotBuildError(
            f"declared ABI has {len(abi)} arguments {[a.name for a in abi]}, the compiled function has "
            f"{len(params)}: {params}"
        )
    for a, p in zip(abi, params):
        if isinstance(a, TensorArg):
            want = f"{prefix}_Tensor_{a.name}_t *{a.name}"
            if p != want:
                raise AotBuildError(f"ABI argument {a.name}: expected tensor parameter {want!r}, header has {p!r}")
            st = parsed["structs"].get(a.name)
            ns, nt = len(a.dyn_shape_modes), len(a.dyn_stride_modes)
            got_s = st["shape"] if st else None
            got_t = st["stride"] if st else None
            want_s = (f"int{a.shape_bits}_t", ns) if ns else None
            want_t = ("int64_t", nt) if nt else None
            if got_s != want_s or got_t != want_t:
                raise AotBuildError(
                    f"ABI tensor {a.name}: declared dynamic shape/stride {want_s}/{want_t}, header has {got_s}/{got_t}"
                )
        elif isinstance(a, ScalarArg):
            want = f"{_SCALAR_C[a.ctype]} {a.name}"
            if p != want:
                raise AotBuildError(f"ABI scalar {a.name}: expected {want!r}, header has {p!r}")
        elif isinstance(a, PointerArg):
            if p != f"void *{a.name}":
                raise AotBuildError(f"ABI pointer {a.name}: expected 'void *{a.name}', header has {p!r}")
        elif isinstance(a, StreamArg):
            if p != f"cudaStream_t {a.name}":
                raise AotBuildError(f"ABI stream {a.name}: expected 'cudaStream_t {a.name}', header has {p!r}")


# --------------------------------------------------------------------------------------------
# Shim + link
# --------------------------------------------------------------------------------------------

_SHIM = r"""/* generated by nvgemm.aot.artifact: stable entry points around one exported CuTeDSL kernel */
#include <stdint.h>
#define EXPORT __attribute__((visibility("default")))
extern int cudaGetDeviceCount(int *count);
void _mlir_@P@_cuda_init(void **);
void _mlir_@P@_cuda_load_to_device(void **);
void @CIFACE@(void **args, int32_t num_args);
static void *g_library = 0;
EXPORT int32_t nvgemm_aot_abi_version(void) { return @ABI@; }
EXPORT int32_t nvgemm_aot_load(void) {
  void **library_ptr = &g_library;
  int ret = 0;
  struct { void ***library_ptr; int *ret; } init_args = {&library_ptr, &ret};
  _mlir_@P@_cuda_init((void **)&init_args);
  if (ret) return ret;
  int n = 0;
  int err = cudaGetDeviceCount(&n);
  if (err) return err;
  int32_t device_id = 0;
  struct { void ***library_ptr; int32_t *device_id; int *ret; } load_args = {&library_ptr, &device_id, &ret};
  for (int i = 0; i < n; ++i) {
    device_id = i;
    _mlir_@P@_cuda_load_to_device((void **)&load_args);
    if (ret) return ret;
  }
  return 0;
}
EXPORT int32_t nvgemm_aot_launch(void **args, int32_t num_args) {
  if (num_args != @NARGS@) return -1;
  *(int32_t *)args[num_args - 1] = 0;
  @CIFACE@(args, num_args);
  return *(int32_t *)args[num_args - 1];
}
"""


def write_shim(path: Path, prefix: str, ciface: str, num_args: int) -> None:
    src = _SHIM.replace("@P@", prefix).replace("@CIFACE@", ciface).replace("@ABI@", str(AOT_ABI_VERSION))
    path.write_text(src.replace("@NARGS@", str(num_args)))


def link_shared(out_so: Path, shim_c: Path, obj: Path, runtime_dir: Path) -> list[str]:
    """gcc -shared the shim + exported object + DSL static runtime + libcudart into ``out_so``."""
    cc = os.environ.get("CC", "gcc")
    if shutil.which(cc) is None:
        raise AotBuildError(f"C compiler {cc!r} not found (set CC); needed to link AOT kernels")
    static_rt = runtime_dir / "libcuda_dialect_runtime_static.a"
    if not static_rt.exists():
        raise AotBuildError(f"{static_rt} missing: this cutlass-dsl wheel has no static runtime archive")
    cudart = find_cudart()
    if cudart is None:
        raise AotBuildError("libcudart.so.13 not found at link time (install nvidia-cuda-runtime or set CUDA_HOME)")
    cmd = [
        cc, "-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-o", str(out_so), str(shim_c), str(obj),
        str(static_rt), f"-L{cudart.parent}", "-l:libcudart.so.13",
        "-Wl,--exclude-libs,ALL", "-Wl,-z,defs", "-Wl,--as-needed",
    ]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise AotBuildError(f"link failed ({' '.join(cmd)}):\n{r.stderr.strip()}")
    return cmd


def symbol_prefix(key: str) -> str:
    return f"nvgemm_{key[:24]}"


def build_artifacts(spec: CompileSpec, out_dir: Path, key: str) -> dict[str, Any]:
    """Compile ``spec`` and write ``kernel.o``, ``kernel.h``, ``kernel.so`` into ``out_dir``.

    Returns the metadata the loader needs (ABI, symbol names) plus timings. Needs cutlass; no GPU.
    """
    # cutlass-dsl reads its CUTE_DSL_* switches from this process's environment, not from the spec:
    # refuse to build an entry whose key claims switches the compiler will not see (or vice versa).
    here = {k: v for k, v in capture_codegen_env() if not k.startswith("NVGEMM_")}
    keyed = {k: v for k, v in spec.codegen_env if not k.startswith("NVGEMM_")}
    if here != keyed:
        raise AotBuildError(
            f"{spec.name()}: the spec was captured with DSL switches {keyed} but this process has {here}; "
            "compile where the environment matches (nvgemm precompile workers inherit the parent's)"
        )
    st = check_spec(spec)
    if not st:
        raise AotBuildError(f"{spec.template_id}: cannot compile {spec.name()}: {st.reason}")
    template = get_template(spec.template_id)
    abi = tuple(template.abi(spec))
    validate_abi(abi)
    prefix = symbol_prefix(key)
    out_dir = Path(out_dir)
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        compiled = template.compile(spec)
    except Exception as e:  # the template's compile raised: report it with the spec
        raise AotBuildError(f"compile of {spec.name()} failed: {type(e).__name__}: {e}") from e
    t1, c1 = time.perf_counter(), time.process_time()
    _prepare_export()
    try:
        with COMPILE_LOCK:  # the MLIR execution engine behind export is not known to be thread-safe
            compiled.export_to_c(str(out_dir), "kernel", function_prefix=prefix)
    except Exception as e:
        raise AotBuildError(f"export_to_c of {spec.name()} failed: {type(e).__name__}: {e}") from e
    header = (out_dir / "kernel.h").read_text()
    parsed = parse_header(header, prefix)
    check_header_abi(parsed, abi, prefix)
    write_shim(out_dir / "shim.c", prefix, parsed["ciface"], len(abi) + 1)
    t2, c2 = time.perf_counter(), time.process_time()
    link_shared(out_dir / "kernel.so", out_dir / "shim.c", out_dir / "kernel.o", dsl_runtime_dir())
    t3, c3 = time.perf_counter(), time.process_time()
    return {
        "abi_version": AOT_ABI_VERSION,
        "abi": abi_to_json(abi),
        "prefix": prefix,
        "launcher_symbol": parsed["ciface"],
        "kernel_name": spec.name(),
        "timings_s": {"compile": t1 - t0, "export": t2 - t1, "link": t3 - t2},
        # CPU seconds of this process (the linker runs in a child and is not counted): on a busy
        # shared machine wall time overstates the cost, CPU time does not.
        "cpu_s": {"compile": c1 - c0, "export": c2 - c1},
    }


# --------------------------------------------------------------------------------------------
# Loader (never imports cutlass)
# --------------------------------------------------------------------------------------------

_CT_SCALAR = {"int32": ctypes.c_int32, "int64": ctypes.c_int64, "float32": ctypes.c_float}


def tensor_struct_type(arg: TensorArg) -> type[ctypes.Structure]:
    """ctypes twin of the exported header's ``<prefix>_Tensor_<name>_t`` descriptor."""
    fields: list[tuple[str, Any]] = [("data", ctypes.c_void_p)]
    ns, nt = len(arg.dyn_shape_modes), len(arg.dyn_stride_modes)
    if ns:
        fields.append(("dynamic_shapes", (ctypes.c_int64 if arg.shape_bits == 64 else ctypes.c_int32) * ns))
    if nt:
        fields.append(("dynamic_strides", ctypes.c_int64 * nt))
    return type(f"Tensor_{arg.name}_t", (ctypes.Structure,), {"_fields_": fields})


def tensor_layout(arg: TensorArg, t: Any) -> tuple[list[int], list[int]]:
    """Shape and stride of torch tensor ``t`` in elements of ``arg.dtype`` (validated against ``arg``)."""
    if t.dim() != len(arg.shape):
        raise ValueError(f"{arg.name}: expected a {len(arg.shape)}-D tensor, got shape {tuple(t.shape)}")
    shape, stride = list(t.shape), list(t.stride())
    tbits = t.element_size() * 8
    if tbits % arg.elem_bits:
        raise ValueError(f"{arg.name}: torch dtype {t.dtype} cannot hold {arg.dtype} elements")
    r = tbits // arg.elem_bits
    if r > 1:
        inner = [d for d in range(t.dim()) if stride[d] == 1 and shape[d] > 1] or [
            d for d in range(t.dim()) if stride[d] == 1
        ]
        if not inner:
            raise ValueError(f"{arg.name}: packed {arg.dtype} tensor needs a stride-1 dimension, got strides {stride}")
        d0 = inner[-1]
        shape = [s * r if d == d0 else s for d, s in enumerate(shape)]
        stride = [s if d == d0 else s * r for d, s in enumerate(stride)]
    for d, (want, got) in enumerate(zip(arg.shape, shape)):
        if isinstance(want, int) and want != got:
            raise ValueError(f"{arg.name}: mode {d} must be {want} ({arg.dtype} elements), got {got}")
        if not isinstance(want, int) and got % want.divisibility:
            raise ValueError(f"{arg.name}: mode {d} = {got} must be divisible by {want.divisibility}")
    for d, (want, got) in enumerate(zip(arg.stride, stride)):
        if isinstance(want, int) and want != got and shape[d] > 1:
            raise ValueError(f"{arg.name}: stride of mode {d} must be {want}, got {got} (shape {shape})")
        if not isinstance(want, int) and got % want.divisibility:
            raise ValueError(f"{arg.name}: stride of mode {d} = {got} must be divisible by {want.divisibility}")
    return shape, stride


def _tensor_filler(a: TensorArg):
    """Fast per-call binder of a torch tensor to ``a``'s descriptor (same checks as tensor_layout)."""
    rank, bits, align = len(a.shape), a.elem_bits, a.assumed_align
    static_shape = [(d, w) for d, w in enumerate(a.shape) if isinstance(w, int)]
    dyn_shape = [(j, d, a.shape[d].divisibility) for j, d in enumerate(a.dyn_shape_modes)]
    static_stride = [(d, w) for d, w in enumerate(a.stride) if isinstance(w, int)]
    dyn_stride = [(j, d, a.stride[d].divisibility) for j, d in enumerate(a.dyn_stride_modes)]

    def fill(obj, t, check_device: bool) -> None:
        if check_device and not t.is_cuda:
            raise ValueError(f"{a.name}: expected a CUDA tensor, got device {t.device}")
        if t.dim() != rank or t.element_size() * 8 != bits:
            shape, stride = tensor_layout(a, t)  # packed sub-byte data, or a wrong rank (raises)
        else:
            shape, stride = t.shape, t.stride()
            for d, w in static_shape:
                if shape[d] != w:
                    raise ValueError(f"{a.name}: mode {d} must be {w} ({a.dtype} elements), got {shape[d]}")
            for d, w in static_stride:
                if stride[d] != w and shape[d] > 1:
                    raise ValueError(f"{a.name}: stride of mode {d} must be {w}, got {stride[d]} (shape {tuple(shape)})")
        ptr = t.data_ptr()
        if ptr % align:
            raise ValueError(f"{a.name}: data pointer must be {align}-byte aligned")
        obj.data = ptr
        if dyn_shape:
            ds = obj.dynamic_shapes
            for j, d, div in dyn_shape:
                v = shape[d]
                if v % div:
                    raise ValueError(f"{a.name}: mode {d} = {v} must be divisible by {div}")
                ds[j] = v
        if dyn_stride:
            dt = obj.dynamic_strides
            for j, d, div in dyn_stride:
                v = stride[d]
                if v % div:
                    raise ValueError(f"{a.name}: stride of mode {d} = {v} must be divisible by {div}")
                dt[j] = v

    return fill


_LIB_FDS: list[int] = []  # memfds of loaded kernel libraries, open for the life of the process (see load_image)
_LIB_LOCK = threading.Lock()


def load_image(image: bytes, name: str = "kernel") -> ctypes.CDLL:
    """``dlopen`` exactly the bytes ``image`` (RTLD_LOCAL), never a path someone could change.

    The bytes go into an anonymous sealed memory file (``memfd_create``; sealed against writes,
    growing and shrinking before the load), which is opened as ``/proc/self/fd/N``: what the
    dynamic loader maps -- and whose constructors run -- is the image the caller verified. The
    descriptor stays open for the life of the process: glibc identifies a loaded library by the
    name it was opened with, so a reused ``/proc/self/fd/N`` must never name another library.
    Without memfd (no /proc, seccomp), the bytes are written to a fresh 0700 private directory
    and loaded from there."""
    with _LIB_LOCK:
        try:
            fd = os.memfd_create(f"nvgemm-{name}"[:200], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except (AttributeError, OSError):
            fd = None
        if fd is not None:
            try:
                write_all(fd, image)
                import fcntl

                fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                            fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
                path = f"/proc/self/fd/{fd}"
                if os.path.exists(path):
                    lib = ctypes.CDLL(path)
                    _LIB_FDS.append(fd)
                    return lib
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        import tempfile

        d = tempfile.mkdtemp(prefix="nvgemm-lib-")  # 0700, ours
        p = os.path.join(d, "kernel.so")
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            write_all(fd, image)
        finally:
            os.close(fd)
        try:
            return ctypes.CDLL(p)
        finally:
            shutil.rmtree(d, ignore_errors=True)


class AotKernel:
    """A linked kernel library opened with ctypes; :meth:`launch` packs torch tensors per the ABI.

    ``image`` is the library's bytes as the kernel cache verified them; they are loaded as they are
    (:func:`load_image`). Without it the file at ``so_path`` is read once (not following a link)
    and those bytes are loaded."""

    def __init__(self, so_path: str | os.PathLike, abi: tuple[AbiArg, ...], name: str = "", *,
                 image: bytes | None = None):
        self._init_packing(abi, name or Path(so_path).stem)
        self.path = str(so_path)
        if image is None:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                image = f.read()
        preload_cudart()
        self._lib = load_image(image, self.name)  # RTLD_LOCAL: identical shim symbol names never clash
        for sym in ENTRY_SYMBOLS:
            if not hasattr(self._lib, sym):
                raise OSError(f"{self.path}: missing entry symbol {sym}")
        self._lib.nvgemm_aot_abi_version.restype = ctypes.c_int32
        v = self._lib.nvgemm_aot_abi_version()
        if v != AOT_ABI_VERSION:
            raise OSError(f"{self.path}: AOT ABI version {v}, this nvgemm speaks {AOT_ABI_VERSION}")
        self._lib.nvgemm_aot_load.restype = ctypes.c_int32
        self._launch = self._lib.nvgemm_aot_launch
        self._launch.restype = ctypes.c_int32
        self._launch.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int32]
        self._loaded = False
        self._load_lock = threading.Lock()

    def _init_packing(self, abi: tuple[AbiArg, ...], name: str) -> None:
        self.abi = tuple(abi)
        self.name = name
        self._structs = {a.name: tensor_struct_type(a) for a in self.abi if isinstance(a, TensorArg)}
        self._fillers = [_tensor_filler(a) if isinstance(a, TensorArg) else None for a in self.abi]
        self._tls = threading.local()

    @classmethod
    def packer(cls, abi: tuple[AbiArg, ...], name: str = "packer") -> "AotKernel":
        """An instance that can only :meth:`pack` (no library): for tests and tools."""
        k = cls.__new__(cls)
        k._init_packing(abi, name)
        return k

    def ensure_loaded(self) -> None:
        """Load the embedded cubin on every visible device (once per process)."""
        if self._loaded:
            return
        with self._load_lock:
            if not self._loaded:
                rc = self._lib.nvgemm_aot_load()
                if rc != 0:
                    raise RuntimeError(f"nvgemm_cutedsl: loading {self.name} onto the GPU failed: cudaError {rc}")
                self._loaded = True

    def _new_pack_state(self) -> tuple[Any, list[Any]]:
        objs: list[Any] = []
        for a in self.abi:
            if isinstance(a, TensorArg):
                objs.append(self._structs[a.name]())
            elif isinstance(a, ScalarArg):
                objs.append(_CT_SCALAR[a.ctype]())
            else:  # PointerArg, StreamArg: a void* slot
                objs.append(ctypes.c_void_p())
        objs.append(ctypes.c_int32(0))
        slots = (ctypes.c_void_p * len(objs))(*[ctypes.addressof(o) for o in objs])
        return slots, objs, [None] * len(self.abi)

    def pack(self, *values: Any, check_device: bool = True) -> tuple[Any, list[Any]]:
        """The ``void *args[]`` array for ``values`` (one per ABI argument) plus the objects it points to.

        The array and its targets are preallocated per thread and refilled on each call (a launch
        copies the arguments before returning), so packing allocates nothing. A tensor descriptor is
        rebuilt only when its tensor changed: the same tensor object as in the previous call, at the
        same data pointer, shape and strides (a layer's weight, scales, alpha) keeps the checked
        descriptor it was given then; only the per-call tensors (activations, output) are bound anew.
        """
        if len(values) != len(self.abi):
            raise TypeError(f"{self.name} takes {len(self.abi)} arguments {[a.name for a in self.abi]}, got {len(values)}")
        state = getattr(self._tls, "state", None)
        if state is None:
            state = self._tls.state = self._new_pack_state()
        self._fill(state, values, check_device)
        slots, objs, _bound = state
        objs[-1].value = 0
        return slots, objs

    def _fill(self, state, values, check_device: bool) -> None:
        slots, objs, bound = state
        for i, (a, v, obj, fill) in enumerate(zip(self.abi, values, objs, self._fillers)):
            if fill is not None:
                last = bound[i]
                if (last is not None and last[0]() is v and last[4] == check_device and last[1] == v.data_ptr()
                        and last[2] == v.shape and last[3] == v.stride()):
                    continue
                bound[i] = None
                fill(obj, v, check_device)
                # a weak reference: the descriptor never keeps a call's activations alive
                bound[i] = (weakref.ref(v), v.data_ptr(), v.shape, v.stride(), check_device)
            elif isinstance(a, ScalarArg):
                obj.value = v
            elif isinstance(a, PointerArg):
                addr = 0 if v is None else v if isinstance(v, int) else v.data_ptr()
                if addr % a.assumed_align:
                    raise ValueError(f"{a.name}: pointer must be {a.assumed_align}-byte aligned")
                if check_device and addr and not isinstance(v, int) and not v.is_cuda:
                    raise ValueError(f"{a.name}: expected a CUDA tensor, got device {v.device}")
                obj.value = addr
            else:  # StreamArg
                handle = v if isinstance(v, int) else getattr(v, "cuda_stream", None)
                if handle is None:
                    raise TypeError(f"{a.name}: expected a torch.cuda.Stream or a raw cudaStream_t int, got {v!r}")
                obj.value = handle

    def bind(self, values: tuple, per_call: tuple[int, ...], *, check_device: bool = True,
             launch=None) -> "BoundLaunch":
        """A launcher with ``values`` packed once (every argument checked as :meth:`pack` checks it) whose
        call rewrites only the arguments at positions ``per_call`` (see :class:`BoundLaunch`). ``launch(slots,
        nargs) -> rc`` replaces the library's entry point (tools without a library)."""
        if launch is None:
            self.ensure_loaded()
            launch = self._launch
        return BoundLaunch(self, tuple(values), tuple(per_call), check_device, launch)

    def launch(self, *values: Any) -> None:
        """Enqueue the kernel on the stream given for its StreamArg (e.g. ``torch.cuda.current_stream()``)."""
        self.ensure_loaded()
        slots, keep = self.pack(*values)
        rc = self._launch(slots, len(self.abi) + 1)
        if rc != 0:
            raise RuntimeError(f"nvgemm_cutedsl: launch of {self.name} failed: cudaError {rc}")


class BoundLaunch:
    """One kernel's argument array packed once, for a caller that launches it many times with the same static
    operands (a layer's weight, scales, alpha, bias, workspaces).

    Built by :meth:`AotKernel.bind` from a complete set of values, each checked as :meth:`AotKernel.pack`
    checks it (shape, strides, dtype width, alignment, device). A call passes the values of the ``per_call``
    positions only, in order: a tensor's descriptor keeps the shape and strides it was bound with and takes
    the new data pointer (the caller guarantees the same shape, strides and device: its own fresh
    allocations, or tensors whose metadata it keyed the binding on); a pointer slot takes the tensor's
    address; the stream (always per call) a ``cudaStream_t``. Alignment is checked on every call. The buffers
    belong to this object: one thread uses a binding (callers key bindings by thread)."""

    __slots__ = ("name", "_slots", "_objs", "_nargs", "_launch", "_set", "_stream")

    def __init__(self, kernel: AotKernel, values: tuple, per_call: tuple[int, ...], check_device: bool, launch):
        if len(values) != len(kernel.abi):
            raise TypeError(f"{kernel.name} takes {len(kernel.abi)} arguments, got {len(values)}")
        state = kernel._new_pack_state()
        kernel._fill(state, values, check_device)
        self.name = kernel.name
        self._slots, self._objs, _ = state
        self._nargs = len(kernel.abi) + 1
        self._launch = launch
        setters, self._stream = [], None
        for i in per_call:
            a, obj = kernel.abi[i], self._objs[i]
            if isinstance(a, StreamArg):
                self._stream = obj
            elif isinstance(a, (TensorArg, PointerArg)):
                setters.append((obj, "data" if isinstance(a, TensorArg) else "value", a.assumed_align, a.name))
            else:
                raise TypeError(f"{kernel.name}: per-call argument {a.name} must be a tensor, pointer or stream")
        if self._stream is None:
            raise TypeError(f"{kernel.name}: the stream must be a per-call argument")
        self._set = tuple(setters)

    def __call__(self, stream: Any, *tensors: Any) -> None:
        """Launch on ``stream`` (a ``torch.cuda.Stream`` or a raw handle) with ``tensors`` at the per-call
        tensor / pointer positions, in order."""
        self._stream.value = stream if isinstance(stream, int) else stream.cuda_stream
        for (obj, field, align, name), t in zip(self._set, tensors):
            ptr = t.data_ptr()
            if ptr % align:
                raise ValueError(f"{name}: data pointer must be {align}-byte aligned")
            setattr(obj, field, ptr)
        rc = self._launch(self._slots, self._nargs)  # the entry point zeroes the status slot itself
        if rc:
            raise RuntimeError(f"nvgemm_cutedsl: launch of {self.name} failed: cudaError {rc}")

    def pointers(self) -> tuple:
        """The packed argument values (tensor descriptors as their data pointer), for tests and tools."""
        return tuple(o.data if hasattr(o, "data") else o.value for o in self._objs[:-1])


def cutlass_imported() -> bool:
    return "cutlass" in sys.modules


__all__ = [
    "AOT_ABI_VERSION",
    "AotBuildError",
    "AotKernel",
    "BoundLaunch",
    "build_artifacts",
    "check_header_abi",
    "find_cudart",
    "link_shared",
    "load_image",
    "parse_header",
    "preload_cudart",
    "tensor_layout",
    "tensor_struct_type",
]
