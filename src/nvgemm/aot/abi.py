"""Kernel-template registry: the contract between CuTeDSL kernel templates and the kernel cache.

A kernel template turns one frozen :class:`CompileSpec` into one compiled CuTeDSL function, for an
explicit target arch, **without touching a GPU**. The cache (``nvgemm.aot.cache``) exports that
function with ``export_to_c``, links it into a small shared library that needs only ``libcudart``,
and later launches it through ``ctypes`` in processes that never import ``cutlass``. For that to
work the template declares its **C-ABI argument list** (:class:`TensorArg`, :class:`ScalarArg`,
:class:`PointerArg`, :class:`StreamArg`), in the order of its ``@cute.jit`` host function's
parameters, and compiles from fake arguments built from exactly that list (:func:`fake_args`).

Writing a template (kernel helpers)
-----------------------------------
::

    class Sm100Nvfp4GemmTemplate:                       # satisfies KernelTemplate
        template_id = "sm100_nvfp4_gemm"
        config_type = Sm100Nvfp4GemmConfig
        archs = SM100_ARCHS

        def can_implement(self, spec) -> Status: ...    # problem-independent checks of the spec

        def abi(self, spec) -> tuple[AbiArg, ...]:
            m = SymDim()                                 # dynamic M (int32 at the C ABI)
            return (
                TensorArg("mA", "Float4E2M1FN", shape=(m, SymDim(32), 1), stride=(SymDim(64, 64), 1, SymDim(64, 64))),
                ...,
                ScalarArg("alpha", "float32"),
                StreamArg("stream"),
            )

        def compile(self, spec):
            import cutlass.cute as cute                  # heavy imports inside compile()
            kernel = Sm100Nvfp4GemmKernel(spec.config, spec.epilogue, ...)
            return compile_for_target(kernel, fake_args(self.abi(spec)), spec)

    register_template(Sm100Nvfp4GemmTemplate())        # at import of the template module

and name ``("<template_id>", "<module>")`` in the family's registration (``kernels=`` of
:func:`nvgemm.core.family.register_family`) so the cache can import the module on demand (only when
it must compile; warm loads never import templates).

The ``@cute.jit`` host function must annotate every parameter so ``export_to_c`` can write the C
header: tensors ``cute.Tensor``, pointers ``cute.Pointer``, scalars ``cutlass.Int32`` /
``cutlass.Int64`` / ``cutlass.Float32``, and the stream ``cuda.CUstream`` (``import
cuda.bindings.driver as cuda``); an unannotated stream fails at export with "Unsupported argument".
CuTeDSL evaluates those annotations when the kernel is defined, in the defining module's globals: a
module with ``from __future__ import annotations`` must import ``cutlass``/``cute`` at module level
(keep such modules out of the warm path), or define the kernels inside ``compile()`` in a module
without that future import (see ``nvgemm/aot/selftest.py``).

Rules: read hardware numbers (``spec.hw.sm_count``, ``spec.hw.max_active_clusters``) and the arch
from the spec, never from the device; read nvgemm codegen switches with ``spec.env("NVGEMM_...")``,
never ``os.environ`` (the spec snapshot is what is hashed into the cache key); keep shapes that vary
per call (M, N, K, strides) dynamic (:class:`SymDim`), so one entry serves every M in a bucket.

Calling convention of an exported kernel (what the AOT loader does)
-------------------------------------------------------------------
``export_to_c(dir, name, function_prefix=P)`` writes ``name.h`` and ``name.o``. The object defines

* ``void _mlir_P_cuda_init(void **args)`` with ``args -> {cudaLibrary_t **lib; cudaError_t *ret}``,
* ``void _mlir_P_cuda_load_to_device(void **args)`` with
  ``args -> {cudaLibrary_t **lib; int32_t *device_id; cudaError_t *ret}`` (once per device),
* ``void _mlir_P__mlir_ciface_<function_name>(void **args, int32_t num_args)``: the host launcher.

nvgemm links ``name.o`` + a generated C shim + the DSL wheel's ``libcuda_dialect_runtime_static.a``
+ ``libcudart.so.13`` (``gcc -shared``) into ``kernel.so``, whose only exported symbols are

* ``int32_t nvgemm_aot_abi_version(void)`` -> 1,
* ``int32_t nvgemm_aot_load(void)``: init + load the embedded cubin on every visible device; returns a
  ``cudaError_t`` (0 = success). Must run once per process before the first launch.
* ``int32_t nvgemm_aot_launch(void **args, int32_t num_args)``: zeroes the result slot, calls the
  launcher, returns the ``int32`` it left there (0 = success; nvgemm raises on anything else). It
  returns -1 without launching when ``num_args`` is not ``len(abi) + 1``. (Launching has not been run
  on a GPU yet: the selftest in tests/compile/test_aot.py does so when a GPU is present.)

ABI argument names must equal the ``@cute.jit`` parameter names (the build checks names, order and
C types against the exported header; names are the only guard against two same-typed pointers or
scalars declared in swapped order).

``args`` has one slot per ABI argument, in ABI order, plus a final slot pointing at an ``int32_t``
that receives the result (``num_args = len(abi) + 1``). Slot contents by argument kind:

* :class:`TensorArg`: a pointer to the descriptor struct
  ``{void *data; S dynamic_shapes[ns]; T dynamic_strides[nt];}`` (C layout and padding), where
  ``dynamic_shapes`` are the **dynamic** modes of ``shape`` in mode order (``S`` = int32 or int64 by
  :attr:`SymDim.bits`; all dynamic shape modes of one tensor must share one width) and
  ``dynamic_strides`` the dynamic modes of ``stride`` (``T`` = int64; nvgemm does not use 32-bit
  strides). A struct member is omitted when its count is 0. Shapes and strides are in elements of
  the ABI dtype (e.g. FP4 elements, not bytes).
* :class:`ScalarArg`: a pointer to the value (``int32_t``, ``int64_t`` or ``float``).
* :class:`PointerArg`: a pointer to a ``void *`` holding the device address.
* :class:`StreamArg`: a pointer to a ``cudaStream_t`` (``torch.cuda.current_stream().cuda_stream``).

The loader binds torch tensors to :class:`TensorArg` slots by dimension: the torch tensor must have
``len(shape)`` dims; static modes must match; a dynamic mode takes the torch size/stride. When the
torch element is wider than the ABI element (uint8 holding two FP4 values), the stride-1 mode's size
is multiplied by the ratio and every other stride too, so packed ``uint8[N, K/2]`` binds to an FP4
``(N, K)`` tensor. The cache cross-checks the declared ABI against the generated header's structs
and the launcher's argument list at build time, so a template whose :meth:`KernelTemplate.abi` and
``@cute.jit`` signature disagree fails to build with a reason, instead of launching garbage.

Nothing here imports cutlass at module import; :func:`fake_args` and :func:`compile_for_target`
import it lazily. ``cute.compile`` is serialized by the process-wide :data:`COMPILE_LOCK` because
CuTeDSL's preprocessor is not thread-safe.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Protocol, Union, runtime_checkable

from nvgemm.core.family import families, family_of_config
from nvgemm.core.epilogue import EpilogueSpec

from nvgemm.core.status import Status

# Target arches nvgemm compiles for (explicit; never probed from a device).
TARGET_ARCHS = ("sm_90a", "sm_100a", "sm_100f", "sm_103a", "sm_110a", "sm_80", "sm_86", "sm_89", "sm_120a", "sm_121a")

# Operand formats named in a CompileSpec.
OPERAND_FORMATS = ("nvfp4", "bf16", "fp16", "fp8_e4m3", "fp32")
MAJORS = ("k", "m", "n")

def builtin_template_modules() -> dict[str, str]:
    """template id -> the kernel module that registers it on import (imported only when compiling),
    from the registered kernel families (:attr:`nvgemm.core.family.KernelFamily.kernels`)."""
    return {tid: module for fam in families() for tid, module in fam.kernels}


def template_id_for_config(config: Any) -> str:
    """The template id that compiles ``config`` (KeyError naming the config type when none does): the
    template of the kernel family whose config space holds it."""
    fam = family_of_config(config)
    if fam is None or not fam.kernels:
        raise KeyError(f"no kernel template is declared for config type {type(config).__name__}")
    return fam.template_id_for(config)


COMPILE_LOCK = threading.RLock()
"""Held around every ``cute.compile``: CuTeDSL's AST preprocessor is not thread-safe."""


# --------------------------------------------------------------------------------------------
# Compile spec (the cache identity of a kernel)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HardwareSpec:
    """Hardware numbers a kernel may bake in; passed explicitly, never probed at compile time."""

    sm_count: int
    max_active_clusters: int = 0  # 0 = the template derives it (or does not need it)

    def __post_init__(self):
        if self.sm_count <= 0:
            raise ValueError(f"sm_count must be positive, got {self.sm_count}")
        if self.max_active_clusters < 0:
            raise ValueError(f"max_active_clusters must be >= 0, got {self.max_active_clusters}")


# Published SM counts of the parts nvgemm targets; a default when compiling for an arch
# without its GPU (override with the spec's `hw`).
DEFAULT_HW = {
    "sm_90a": HardwareSpec(sm_count=132),  # H100 SXM / H200
    "sm_100a": HardwareSpec(sm_count=148),  # B200
    "sm_100f": HardwareSpec(sm_count=148),
    "sm_103a": HardwareSpec(sm_count=148),  # B300
    "sm_110a": HardwareSpec(sm_count=20),  # Thor
    "sm_120a": HardwareSpec(sm_count=170),  # RTX 5090 (RTX PRO 6000 Blackwell: 188)
    "sm_121a": HardwareSpec(sm_count=48),  # DGX Spark GB10
    "sm_89": HardwareSpec(sm_count=142),  # L40S
    "sm_86": HardwareSpec(sm_count=72),  # A10
    "sm_80": HardwareSpec(sm_count=108),  # A100
}


@dataclass(frozen=True)
class CompileSpec:
    """Everything that determines the generated code of one kernel; hashed into the cache key.

    Shapes (M, N, K) and strides are NOT part of it: templates compile with dynamic dims.
    ``codegen_env`` is a sorted snapshot ``((name, value), ...)`` of the environment switches that
    change code generation (``nvgemm.aot.compile_spec.capture_codegen_env``).
    """

    template_id: str
    config: Any  # a frozen dataclass, e.g. Sm100Nvfp4GemmConfig / Sm90W4A16Config
    epilogue: EpilogueSpec
    arch: str
    hw: HardwareSpec
    a_format: str = "nvfp4"
    b_format: str = "nvfp4"
    a_major: str = "k"
    b_major: str = "k"
    codegen_env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        if not self.template_id:
            raise ValueError("template_id must be a non-empty string")
        if not dataclasses.is_dataclass(self.config) or not self.config.__dataclass_params__.frozen:
            raise TypeError(f"config must be a frozen dataclass instance, got {type(self.config).__name__}")
        if not isinstance(self.epilogue, EpilogueSpec):
            raise TypeError(f"epilogue must be an EpilogueSpec, got {type(self.epilogue).__name__}")
        if self.arch not in TARGET_ARCHS:
            raise ValueError(f"arch must be one of {TARGET_ARCHS}, got {self.arch!r}")
        if not isinstance(self.hw, HardwareSpec):
            raise TypeError(f"hw must be a HardwareSpec, got {type(self.hw).__name__}")
        for nm in ("a_format", "b_format"):
            if getattr(self, nm) not in OPERAND_FORMATS:
                raise ValueError(f"{nm} must be one of {OPERAND_FORMATS}, got {getattr(self, nm)!r}")
        for nm in ("a_major", "b_major"):
            if getattr(self, nm) not in MAJORS:
                raise ValueError(f"{nm} must be one of {MAJORS}, got {getattr(self, nm)!r}")
        env = tuple((str(k), str(v)) for k, v in self.codegen_env)
        if list(env) != sorted(env) or len({k for k, _ in env}) != len(env):
            raise ValueError("codegen_env must be sorted (name, value) pairs with unique names")
        object.__setattr__(self, "codegen_env", env)

    @property
    def sm(self) -> int:
        """Numeric SM version of the target (``sm_100a`` -> 100)."""
        return int(self.arch[3:].rstrip("af"))

    def env(self, name: str, default: str | None = None) -> str | None:
        """A codegen switch as captured in the spec (templates must not read os.environ)."""
        return dict(self.codegen_env).get(name, default)

    def name(self) -> str:
        cfg = self.config.name() if hasattr(self.config, "name") else type(self.config).__name__
        return f"{cfg}_{self.epilogue.key()}_{self.arch}"


# --------------------------------------------------------------------------------------------
# C-ABI argument declarations
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SymDim:
    """A dynamic (runtime) mode of a tensor's shape or stride; ``divisibility`` is a hard contract."""

    divisibility: int = 1
    bits: int = 32  # width at the C ABI; strides must use 64

    def __post_init__(self):
        if self.divisibility < 1:
            raise ValueError(f"divisibility must be >= 1, got {self.divisibility}")
        if self.bits not in (32, 64):
            raise ValueError(f"bits must be 32 or 64, got {self.bits}")


Dim = Union[int, SymDim]

# ABI dtype name (cutlass numeric class name) -> bits per element.
ABI_DTYPE_BITS = {
    "Float4E2M1FN": 4,
    "Float8E4M3FN": 8,
    "Float8E8M0FNU": 8,
    "Uint8": 8,
    "Int8": 8,
    "BFloat16": 16,
    "Float16": 16,
    "Float32": 32,
    "Int32": 32,
    "Int64": 64,
}

SCALAR_CTYPES = ("int32", "int64", "float32")


@dataclass(frozen=True)
class TensorArg:
    name: str
    dtype: str  # key of ABI_DTYPE_BITS
    shape: tuple[Dim, ...]
    stride: tuple[Dim, ...]
    assumed_align: int = 16  # bytes; checked against the data pointer at launch

    def __post_init__(self):
        if self.dtype not in ABI_DTYPE_BITS:
            raise ValueError(f"TensorArg {self.name}: dtype must be one of {sorted(ABI_DTYPE_BITS)}, got {self.dtype!r}")
        if len(self.shape) != len(self.stride):
            raise ValueError(f"TensorArg {self.name}: shape rank {len(self.shape)} != stride rank {len(self.stride)}")
        widths = {d.bits for d in self.shape if isinstance(d, SymDim)}
        if len(widths) > 1:
            raise ValueError(f"TensorArg {self.name}: dynamic shape modes must share one width, got {sorted(widths)}")
        if any(isinstance(s, SymDim) and s.bits != 64 for s in self.stride):
            raise ValueError(f"TensorArg {self.name}: dynamic strides must be 64-bit")
        if self.assumed_align < 1 or self.assumed_align & (self.assumed_align - 1):
            raise ValueError(f"TensorArg {self.name}: assumed_align must be a power of two")

    @property
    def elem_bits(self) -> int:
        return ABI_DTYPE_BITS[self.dtype]

    @property
    def dyn_shape_modes(self) -> tuple[int, ...]:
        return tuple(i for i, d in enumerate(self.shape) if isinstance(d, SymDim))

    @property
    def dyn_stride_modes(self) -> tuple[int, ...]:
        return tuple(i for i, d in enumerate(self.stride) if isinstance(d, SymDim))

    @property
    def shape_bits(self) -> int:
        return next((d.bits for d in self.shape if isinstance(d, SymDim)), 32)


@dataclass(frozen=True)
class ScalarArg:
    name: str
    ctype: str  # "int32" | "int64" | "float32"

    def __post_init__(self):
        if self.ctype not in SCALAR_CTYPES:
            raise ValueError(f"ScalarArg {self.name}: ctype must be one of {SCALAR_CTYPES}, got {self.ctype!r}")


@dataclass(frozen=True)
class PointerArg:
    name: str
    dtype: str
    assumed_align: int = 16

    def __post_init__(self):
        if self.dtype not in ABI_DTYPE_BITS:
            raise ValueError(f"PointerArg {self.name}: dtype must be one of {sorted(ABI_DTYPE_BITS)}")


@dataclass(frozen=True)
class StreamArg:
    name: str = "stream"


AbiArg = Union[TensorArg, ScalarArg, PointerArg, StreamArg]


def abi_to_json(abi: tuple[AbiArg, ...]) -> list[dict]:
    """Serializable form stored in a cache entry's metadata (read by the cutlass-free loader)."""
    out = []
    for a in abi:
        d: dict[str, Any] = {"kind": type(a).__name__}
        for f in dataclasses.fields(a):
            v = getattr(a, f.name)
            if f.name in ("shape", "stride"):
                v = [{"sym": True, "div": x.divisibility, "bits": x.bits} if isinstance(x, SymDim) else x for x in v]
            d[f.name] = v
        out.append(d)
    return out


def abi_from_json(items: list[dict]) -> tuple[AbiArg, ...]:
    kinds = {c.__name__: c for c in (TensorArg, ScalarArg, PointerArg, StreamArg)}
    out = []
    for d in items:
        d = dict(d)
        cls = kinds.get(d.pop("kind", None))
        if cls is None:
            raise ValueError(f"unknown ABI argument kind in {d}")
        for k in ("shape", "stride"):
            if k in d:
                d[k] = tuple(SymDim(x["div"], x["bits"]) if isinstance(x, dict) else int(x) for x in d[k])
        out.append(cls(**d))
    return tuple(out)


def validate_abi(abi: tuple[AbiArg, ...]) -> None:
    names = [a.name for a in abi]
    if len(set(names)) != len(names):
        raise ValueError(f"ABI argument names must be unique, got {names}")
    if sum(isinstance(a, StreamArg) for a in abi) > 1:
        raise ValueError("at most one StreamArg")


# --------------------------------------------------------------------------------------------
# Template protocol and registry
# --------------------------------------------------------------------------------------------


@runtime_checkable
class KernelTemplate(Protocol):
    template_id: str
    config_type: type
    archs: tuple[str, ...]

    def can_implement(self, spec: CompileSpec) -> Status:
        """Problem-independent check of a spec (config, epilogue, formats, arch); reason on failure."""

    def abi(self, spec: CompileSpec) -> tuple[AbiArg, ...]:
        """C-ABI argument list, in the order of the compiled ``@cute.jit`` function's parameters."""

    def compile(self, spec: CompileSpec) -> Any:
        """``cute.compile`` for ``spec.arch`` from :func:`fake_args` (no GPU); returns the compiled function."""


_REGISTRY: dict[str, KernelTemplate] = {}
_REG_LOCK = threading.Lock()


def register_template(template: KernelTemplate, *, replace: bool = False) -> KernelTemplate:
    for attr in ("template_id", "config_type", "archs", "can_implement", "abi", "compile"):
        if not hasattr(template, attr):
            raise TypeError(f"{type(template).__name__} is not a KernelTemplate: missing {attr!r}")
    with _REG_LOCK:
        old = _REGISTRY.get(template.template_id)
        if old is not None and old is not template and not replace:
            raise ValueError(f"template id {template.template_id!r} is already registered by {type(old).__name__}")
        _REGISTRY[template.template_id] = template
    return template


def unregister_template(template_id: str) -> None:
    with _REG_LOCK:
        _REGISTRY.pop(template_id, None)


def get_template(template_id: str) -> KernelTemplate:
    """The registered template, importing its builtin module on first use."""
    t = _REGISTRY.get(template_id)
    builtin = builtin_template_modules() if t is None else {}
    if t is None and template_id in builtin:
        importlib.import_module(builtin[template_id])
        t = _REGISTRY.get(template_id)
    if t is None:
        known = sorted(set(_REGISTRY) | set(builtin))
        raise KeyError(f"no kernel template registered under {template_id!r}; known: {known}")
    return t


def registered_template_ids() -> list[str]:
    return sorted(set(_REGISTRY) | set(builtin_template_modules()))


def check_spec(spec: CompileSpec) -> Status:
    """Can the registered template compile ``spec``? (Type of config, arch, then the template's own check.)"""
    try:
        t = get_template(spec.template_id)
    except (KeyError, ImportError) as e:
        return Status.fail(str(e))
    if not isinstance(spec.config, t.config_type):
        return Status.fail(f"{spec.template_id} expects a {t.config_type.__name__}, got {type(spec.config).__name__}")
    if spec.arch not in t.archs:
        return Status.fail(f"{spec.template_id} does not target {spec.arch} (targets {t.archs})")
    return t.can_implement(spec)


# --------------------------------------------------------------------------------------------
# Compile helpers (lazy cutlass)
# --------------------------------------------------------------------------------------------


def fake_args(abi: tuple[AbiArg, ...]) -> list[Any]:
    """CuTeDSL fake arguments matching ``abi`` exactly (dynamic dims become SymInts)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor, make_ptr

    validate_abi(abi)

    def dim(d: Dim):
        return cute.sym_int(d.bits, divisibility=d.divisibility) if isinstance(d, SymDim) else int(d)

    out: list[Any] = []
    for a in abi:
        if isinstance(a, TensorArg):
            out.append(
                make_fake_tensor(
                    getattr(cutlass, a.dtype),
                    tuple(dim(d) for d in a.shape),
                    tuple(dim(d) for d in a.stride),
                    assumed_align=a.assumed_align,
                )
            )
        elif isinstance(a, ScalarArg):
            out.append({"int32": cutlass.Int32, "int64": cutlass.Int64, "float32": cutlass.Float32}[a.ctype](0))
        elif isinstance(a, PointerArg):
            out.append(make_ptr(getattr(cutlass, a.dtype), 0, cute.AddressSpace.gmem, assumed_align=a.assumed_align))
        elif isinstance(a, StreamArg):
            out.append(make_fake_stream())
        else:
            raise TypeError(f"unknown ABI argument {a!r}")
    return out


def cute_compile(fn: Any, *args: Any, arch: str, options: str = "") -> Any:
    """``cute.compile(fn, *args)`` for ``arch`` under :data:`COMPILE_LOCK` (no GPU needed): every
    nvgemm compile and trace goes through here.

    The target is set for this compile only: ``--gpu-arch`` selects the code generation, and the
    DSL's own arch (what CuTe's atoms check while tracing, e.g. a tcgen05 MMA refusing sm_90a) is
    pinned to ``arch`` for the call and reset afterwards. CuTeDSL otherwise reads that arch once,
    from ``CUTE_DSL_ARCH`` when its first module is imported, so in one process the first importer
    (an sm_90a test, say) would fix it for every later sm_100a trace."""
    import cutlass.cute as cute
    from cutlass.cutlass_dsl import CuTeDSL

    if arch not in TARGET_ARCHS:
        raise ValueError(f"cute_compile: arch must be one of {TARGET_ARCHS}, got {arch!r}")
    envar = CuTeDSL._get_dsl().envar
    with COMPILE_LOCK:
        envar.arch = arch
        try:
            return cute.compile(fn, *args, options=f"--gpu-arch {arch} {options}".strip())
        finally:
            del envar.arch  # back to the construction-time state (CUTE_DSL_ARCH, or detection)


def compile_for_target(fn: Any, args: list[Any], spec: CompileSpec, options: str = "") -> Any:
    """:func:`cute_compile` of ``fn(*args)`` for ``spec.arch`` (no GPU needed)."""
    if "--keep-ptx" not in options.split():
        return cute_compile(fn, *args, arch=spec.arch, options=options)
    # keep_ptx writes <dump dir>/<kernel name>.<arch>.ptx and reads it back; kernel names do not
    # depend on the config, so two processes sharing CUTE_DSL_DUMP_DIR could read each other's PTX
    # (seen: another config's PTX registered for an emulator launch). Each such compile gets a private
    # dump dir (CuTeDSL's own --dump-dir option); the PTX text is read during cute.compile, so the
    # directory goes once it returns.
    parent = os.environ.get("CUTE_DSL_DUMP_DIR") or None
    if parent:
        os.makedirs(parent, exist_ok=True)
    private = tempfile.mkdtemp(prefix="nvgemm_keep_ptx_", dir=parent)
    try:
        return cute_compile(fn, *args, arch=spec.arch, options=f"{options} --dump-dir {private}")
    finally:
        shutil.rmtree(private, ignore_errors=True)


__all__ = [
    "ABI_DTYPE_BITS",
    "AbiArg",
    "builtin_template_modules",
    "COMPILE_LOCK",
    "CompileSpec",
    "DEFAULT_HW",
    "HardwareSpec",
    "KernelTemplate",
    "PointerArg",
    "ScalarArg",
    "StreamArg",
    "SymDim",
    "TARGET_ARCHS",
    "TensorArg",
    "abi_from_json",
    "abi_to_json",
    "check_spec",
    "compile_for_target",
    "cute_compile",
    "fake_args",
    "get_template",
    "register_template",
    "registered_template_ids",
    "template_id_for_config",
    "unregister_template",
]
