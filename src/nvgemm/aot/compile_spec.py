"""Cache keys of compiled kernels: the frozen CompileSpec, codegen env switches, source fingerprint.

``compile_key(spec)`` is the sha256 of three things:

1. the canonical JSON of the frozen :class:`~nvgemm.aot.abi.CompileSpec` (template id,
   config fields, epilogue, operand formats and majors, target arch, hardware numbers,
   ``codegen_env``);
2. the environment switches that change code generation, captured into ``spec.codegen_env`` by
   :func:`capture_codegen_env`: nvgemm's settings tagged ``codegen`` in :mod:`nvgemm.settings`
   (exactly those: a ``runtime`` setting never misses a precompiled kernel), and cutlass-dsl's own
   switches: **every** variable starting with one of :data:`DSL_ENV_PREFIXES`, minus
   :data:`DSL_NON_CODEGEN_ENV`, the ones cutlass-dsl declares do not change generated code (logging,
   dump and cache paths). An unknown new DSL switch is therefore keyed (a spurious miss at worst),
   never silently ignored (a stale hit);
3. the :func:`fingerprint`: a hash of nvgemm's kernel sources, every file under
   ``nvgemm/templates`` and ``nvgemm/epilogues`` plus the AOT shim generator (found by walking the
   directories, not a hand-listed set), and the cutlass-dsl / CUDA / Python versions.

Nothing here imports cutlass: the warm path (key -> load) must work where the DSL is absent.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from nvgemm import settings
from nvgemm.aot.abi import CompileSpec, HardwareSpec, DEFAULT_HW
from nvgemm.core.epilogue import EpilogueSpec

KEY_VERSION = 2  # bump when the key derivation or the entry layout changes (2: config classes moved modules)

DSL_ENV_PREFIXES = ("CUTE_DSL_", "CUTE_EXPERIMENTAL_DSL_")

# cutlass-dsl switches that do not change generated code: the settings cutlass-dsl itself declares
# `affects_compile=False` (checked by a compile test), plus CUTE_DSL_ARCH because nvgemm always passes
# the arch explicitly (`--gpu-arch spec.arch`, which is keyed) and CUTE_DSL_LIBS (runtime library paths).
DSL_NON_CODEGEN_ENV = frozenset(
    {
        # diagnostics, paths, caches
        "CUTE_DSL_ARCH",
        "CUTE_DSL_LIBS",
        "CUTE_DSL_CACHE_DIR",
        "CUTE_DSL_DUMP_DIR",
        "CUTE_DSL_DISABLE_FILE_CACHING",
        "CUTE_DSL_NO_CACHE",
        "CUTE_DSL_JIT_CACHE_MAX_ELEMS",
        "CUTE_DSL_JIT_TIME_PROFILING",
        "CUTE_DSL_LOG_LEVEL",
        "CUTE_DSL_LOG_TO_CONSOLE",
        "CUTE_DSL_LOG_TO_FILE",
        "CUTE_DSL_PRINT_AFTER_PREPROCESSOR",
        "CUTE_DSL_PRINT_IR",
        "CUTE_DSL_SHOW_STACKTRACE",
        "CUTE_DSL_FILTER_STACKTRACE",
        "CUTE_DSL_WARNINGS_IGNORE",
        "CUTE_DSL_ENABLE_OPTIMIZATION_WARNINGS",
        "CUTE_DSL_KEEP",
        "CUTE_DSL_KEEP_IR",
        "CUTE_DSL_KEEP_PTX",
        "CUTE_DSL_KEEP_CUBIN",
        "CUTE_DSL_KEEP_SASS",
    }
)

_PKG_ROOT = Path(__file__).resolve().parent.parent  # src/nvgemm
KERNEL_SOURCE_DIRS = ("templates", "epilogues")
KERNEL_SOURCE_FILES = ("aot/artifact.py", "aot/selftest.py", "core/epilogue.py")  # shim + link recipe; selftest kernel; the epilogue spec the kernels read
_SOURCE_SUFFIXES = (".py", ".h", ".cu", ".c", ".cuh", ".json", ".txt")


def capture_codegen_env(environ: dict[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """Sorted ``(name, value)`` pairs of the env switches that change code generation: cutlass-dsl's
    (as set) and nvgemm's ``codegen`` settings (canonical text; a bad value is an error)."""
    env = os.environ if environ is None else environ
    dsl = [(k, v) for k, v in env.items() if k.startswith(DSL_ENV_PREFIXES) and k not in DSL_NON_CODEGEN_ENV]
    return tuple(sorted([*dsl, *settings.codegen_env(env)]))


def make_spec(
    template_id: str,
    config: Any,
    arch: str,
    *,
    epilogue: EpilogueSpec | None = None,
    hw: HardwareSpec | None = None,
    a_format: str = "nvfp4",
    b_format: str = "nvfp4",
    a_major: str = "k",
    b_major: str = "k",
    environ: dict[str, str] | None = None,
) -> CompileSpec:
    """A CompileSpec with the current codegen env captured and default hardware numbers for ``arch``."""
    if hw is None:
        if arch not in DEFAULT_HW:
            raise ValueError(f"no default hardware numbers for arch {arch!r}; pass hw=HardwareSpec(...)")
        hw = DEFAULT_HW[arch]
    return CompileSpec(
        template_id=template_id,
        config=config,
        epilogue=epilogue if epilogue is not None else EpilogueSpec(),
        arch=arch,
        hw=hw,
        a_format=a_format,
        b_format=b_format,
        a_major=a_major,
        b_major=b_major,
        codegen_env=capture_codegen_env(environ),
    )


def _canon(v: Any) -> Any:
    """JSON-stable form of spec values (dataclasses with their type name, torch dtypes, enums)."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {
            "__type__": f"{type(v).__module__}.{type(v).__qualname__}",
            **{f.name: _canon(getattr(v, f.name)) for f in dataclasses.fields(v)},
        }
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, enum.Enum):
        return f"{type(v).__qualname__}.{v.name}"
    if isinstance(v, (list, tuple)):
        return [_canon(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _canon(x) for k, x in sorted(v.items())}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError(f"cannot key a value of type {type(v).__name__}: {v!r}")


def spec_json(spec: CompileSpec) -> str:
    return json.dumps(_canon(spec), sort_keys=True, separators=(",", ":"))


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _hash_tree(h: "hashlib._Hash", root: Path, rel_to: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.suffix in _SOURCE_SUFFIXES and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(rel_to)).encode())
            h.update(b"\0")
            h.update(p.read_bytes())
            h.update(b"\0")


@functools.lru_cache(maxsize=None)
def kernel_source_hash(pkg_root: Path = _PKG_ROOT) -> str:
    """sha256 over every kernel-source file (templates/, epilogues/, the AOT shim generator)."""
    h = hashlib.sha256()
    for d in KERNEL_SOURCE_DIRS:
        _hash_tree(h, pkg_root / d, pkg_root)
    for f in KERNEL_SOURCE_FILES:
        p = pkg_root / f
        h.update(f.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def toolchain_versions() -> dict[str, str | None]:
    """Versions that change compiled code: cutlass-dsl (and its CUDA-flavoured libs), CUDA, Python."""
    return {
        "cutlass_dsl": _dist_version("nvidia-cutlass-dsl"),
        "cutlass_dsl_libs_base": _dist_version("nvidia-cutlass-dsl-libs-base"),
        "cutlass_dsl_libs_cu13": _dist_version("nvidia-cutlass-dsl-libs-cu13"),
        "cutlass_dsl_libs_cu12": _dist_version("nvidia-cutlass-dsl-libs-cu12"),
        "cuda_runtime": _dist_version("nvidia-cuda-runtime") or _dist_version("nvidia-cuda-runtime-cu12"),
        "torch_cuda": torch.version.cuda,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "host": f"{sys.platform}-{platform.machine()}",
    }


@functools.lru_cache(maxsize=None)
def _fingerprint_cached(src: str, versions_json: str) -> tuple[str, str]:
    info = {"key_version": KEY_VERSION, "kernel_sources": src, **json.loads(versions_json)}
    blob = json.dumps(info, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16], blob


def fingerprint() -> tuple[str, dict]:
    """(short id, full info dict) of the compile environment; the cache's top-level directory name."""
    fid, blob = _fingerprint_cached(kernel_source_hash(), json.dumps(toolchain_versions(), sort_keys=True))
    return fid, json.loads(blob)


def compile_key(spec: CompileSpec, fingerprint_id: str | None = None) -> str:
    """sha256 hex of (spec incl. codegen env, fingerprint id)."""
    if not isinstance(spec, CompileSpec):
        raise TypeError(f"compile_key needs a CompileSpec, got {type(spec).__name__}")
    fid = fingerprint()[0] if fingerprint_id is None else fingerprint_id
    h = hashlib.sha256()
    h.update(f"nvgemm-key-v{KEY_VERSION}\0{fid}\0".encode())
    h.update(spec_json(spec).encode())
    return h.hexdigest()


__all__ = [
    "DSL_ENV_PREFIXES",
    "DSL_NON_CODEGEN_ENV",
    "KEY_VERSION",
    "capture_codegen_env",
    "compile_key",
    "fingerprint",
    "kernel_source_hash",
    "make_spec",
    "spec_json",
    "toolchain_versions",
]
