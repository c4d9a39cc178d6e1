"""nvgemm's Triton kernels from their real sm_90a / sm_100a / sm_120a PTX, executed on the PTX emulator.

:class:`EmuTritonKernel` stands in for a ``@triton.jit`` kernel in nvgemm's host functions (they all
take ``kernel=``): ``kernel[grid](*args, **kwargs)`` does what Triton's own launch does on a GPU of
that arch, without one:

* **bind and specialise** with Triton's own binder (``create_function_from_signature`` of the
  installed Triton, run against the target's backend): constexprs, integer arguments specialised
  to a constant (``1``) or tagged divisible by 16, pointer alignment -- the same signature, constants
  and attributes, hence the same compile key and the same PTX a GPU launch would produce;
* **compile** with ``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90 | 100, 32))`` and the
  launch's options (``num_warps``, ``num_stages``, ``launch_pdl``, ``enable_fp_fusion``); the target
  arch is explicit, so no GPU is needed; Triton's on-disk cache (``TRITON_CACHE_DIR``) keeps the PTX;
* **pack** the parameters as Triton's CUDA launcher does: every non-constexpr argument in
  declaration order (tensors as their data pointer, ints at the signature's width, floats as f32),
  then the trailing ``global_scratch`` and ``profile_scratch`` pointers of this Triton version (a
  scratch buffer of ``grid * size`` bytes when the kernel's metadata asks for one, else null). The
  packed list is checked against the PTX entry's ``.param`` list (count and width) before running;
* **launch** ``grid`` CTAs of ``num_warps * 32`` threads with ``metadata.shared`` bytes of dynamic
  shared memory, every tensor argument registered as a bounds-checked allocation.

A record of each launch (kernel, arch, grid, warps, seconds) is kept in :data:`LAUNCHES` so callers
(the demo, the sweep) can report which kernels ran from PTX.
"""

from __future__ import annotations

import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from nvgemm.emulator.ptx.errors import EmulationError
from nvgemm.emulator.ptx.interp import run_launch
from nvgemm.emulator.ptx.machine import DEVICES, GlobalMemory, Launch
from nvgemm.emulator.ptx.pdl import StreamGrid
from nvgemm.emulator.ptx.program import compile_entry
from nvgemm.emulator.stream import capturing

#: arch -> (GPUTarget arch number, device profile)
ARCHS = {"sm_90a": (90, "H200"), "sm_100a": (100, "B200"), "sm_120a": (120, "RTX5090")}
_INT_BITS = {"i1": 8, "i8": 8, "u8": 8, "i16": 16, "u16": 16, "i32": 32, "u32": 32, "i64": 64, "u64": 64}
_FLOAT_FMT = {"fp32": "<f", "f32": "<f", "fp64": "<d", "f64": "<d"}


@dataclass
class TritonLaunchRecord:
    kernel: str
    arch: str
    grid: tuple
    num_warps: int
    seconds: float
    warp_instructions: int


#: every emulated Triton launch of this process, in order
LAUNCHES: list[TritonLaunchRecord] = []
_LOCK = threading.Lock()
_COMPILED: dict[Any, Any] = {}
_PROGRAMS: dict[Any, Any] = {}


def _fn(kernel):
    """The JITFunction behind ``kernel`` (an autotuner / heuristics wrapper has ``.fn``)."""
    while not hasattr(kernel, "params") and hasattr(kernel, "fn"):
        kernel = kernel.fn
    return kernel


class EmuTritonKernel:
    """``kernel[grid](...)`` on the emulator for ``arch`` ("sm_90a", "sm_100a" or "sm_120a"); see the module doc.

    The nvgemm host functions recognise it by :attr:`runs_on_cpu` (CPU tensors accepted) and
    :attr:`capability` (what ``use_gdc`` asks the GPU for: PDL is compiled in on sm_90+ as on a GPU)."""

    runs_on_cpu = True

    def __init__(self, kernel, arch: str = "sm_100a", order="forward"):
        if arch not in ARCHS:
            raise ValueError(f"nvgemm emulator (triton): arch must be one of {sorted(ARCHS)}, got {arch!r}")
        self.fn = _fn(kernel)
        if not hasattr(self.fn, "params"):
            raise TypeError(f"nvgemm emulator (triton): {kernel!r} is not a @triton.jit kernel (interpreted? "
                            "TRITON_INTERPRET=1 replaces the compiler)")
        self.arch = arch
        self.capability = divmod(ARCHS[arch][0], 10)
        self.order = order
        self.last: Launch | None = None
        self.last_compiled = None

    @property
    def __name__(self) -> str:  # noqa: A003 - reads like the kernel it stands for
        return self.fn.__name__

    def __repr__(self) -> str:
        return f"EmuTritonKernel({self.fn.__name__}, {self.arch})"

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(grid, args, kwargs)

    # ------------------------------------------------------------------ compile

    def compile(self, args: tuple, kwargs: dict):
        """(compiled kernel, bound arguments, signature) of one call, through Triton's own binder."""
        # lazy: triton is imported only when a Triton kernel is emulated
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, compile as triton_compile, make_backend
        from triton.runtime.jit import create_function_from_signature

        target = GPUTarget("cuda", ARCHS[self.arch][0], 32)
        backend = make_backend(target)
        binder = create_function_from_signature(self.fn.signature, self.fn.params, backend)
        bound, specialization, opts = binder(*args, **kwargs)
        options, signature, constexprs, attrs = self.fn._pack_args(backend, kwargs, bound, specialization, opts)
        key = (self.fn.__module__, self.fn.__name__, self.arch, str(signature), str(sorted(constexprs.items())),
               str(sorted(attrs.items())), str(sorted(options.__dict__.items())))
        with _LOCK:
            compiled = _COMPILED.get(key)
        if compiled is None:
            src = ASTSource(self.fn, signature, constexprs, attrs)
            compiled = triton_compile(src, target=target, options=options.__dict__)
            with _LOCK:
                compiled = _COMPILED.setdefault(key, compiled)
        return compiled, bound, signature

    # ------------------------------------------------------------------ launch

    def run(self, grid, args: tuple, kwargs: dict) -> Launch:
        compiled, bound, signature = self.compile(args, kwargs)
        if callable(grid):
            grid = grid(bound)
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        md = compiled.metadata
        ptx = compiled.asm["ptx"]
        with _LOCK:
            prog = _PROGRAMS.get(md.hash)
        if prog is None:
            prog = compile_entry(ptx, md.name)
            with _LOCK:
                prog = _PROGRAMS.setdefault(md.hash, prog)
        values: list = []
        tensors: list = []
        for (name, ty), v in zip(signature.items(), bound.values()):
            if ty == "constexpr":
                continue  # not a kernel parameter (constexprs and specialised ints are compiled in)
            if ty.startswith("*"):
                if v is None:
                    values.append(("ptr", 0, name))
                    continue
                if not hasattr(v, "data_ptr"):
                    raise TypeError(f"{md.name}: argument {name} ({ty}) must be a tensor, got {type(v).__name__}")
                if v.device.type != "cpu":
                    raise ValueError(f"{md.name}: the emulator runs CPU tensors, {name} is on {v.device}")
                tensors.append((v, name))
                values.append(("ptr", v.data_ptr(), name))
            elif ty in _INT_BITS:
                values.append(("int", int(v), name, _INT_BITS[ty]))
            elif ty in _FLOAT_FMT:
                values.append(("float", float(v), name, _FLOAT_FMT[ty]))
            else:
                raise EmulationError(f"{md.name}: argument {name} of type {ty!r} has no packing rule")
        n_grid = grid[0] * grid[1] * grid[2]
        scratch = []
        for what in ("global_scratch", "profile_scratch"):
            size = int(getattr(md, f"{what}_size", 0) or 0)
            if size > 0:
                buf = torch.zeros(n_grid * getattr(md, "num_ctas", 1) * size, dtype=torch.uint8)
                scratch.append(buf)
                tensors.append((buf, what))
                values.append(("ptr", buf.data_ptr(), what))
            else:
                values.append(("ptr", 0, what))
        params = prog.entry.params
        if len(params) != len(values):
            raise EmulationError(
                f"{md.name}: Triton {_triton_version()}'s launcher packs {len(values)} parameters "
                f"({[v[2] for v in values]}), the PTX entry declares {len(params)}")
        buf = bytearray(prog.entry.param_bytes)
        for p, v in zip(params, values):
            if v[0] == "ptr":
                b, want = v[1].to_bytes(8, "little"), 8
            elif v[0] == "int":
                want = v[3] // 8 if v[3] > 8 else 1
                b = (v[1] & ((1 << (8 * want)) - 1)).to_bytes(want, "little")
            else:
                b = struct.pack(v[3], v[1])
                want = len(b)
            if p.size != want:
                raise EmulationError(f"{md.name}: parameter {v[2]} packs {want} bytes, the PTX's "
                                     f"{p.name} is {p.size}")
            buf[p.offset:p.offset + p.size] = b
        gmem = GlobalMemory()
        for t, name in tensors:
            gmem.register_tensor(t, name)
        block = (md.num_warps * 32, 1, 1)
        cluster = tuple(getattr(md, "cluster_dims", (1, 1, 1)) or (1, 1, 1))
        if getattr(md, "num_ctas", 1) != 1:
            raise EmulationError(f"{md.name}: num_ctas={md.num_ctas} (cluster launches of Triton kernels) "
                                 "is not modelled")
        launch = Launch(prog, grid, block, (1, 1, 1) if len(cluster) != 3 else cluster, int(md.shared),
                        bytes(buf), gmem, DEVICES[ARCHS[self.arch][1]])
        stream = capturing()
        if stream is not None:  # a PDL stream capture: run later, with the launch's PDL attribute
            launch.ext["keep_alive"] = (list(bound.values()), scratch)
            launch.ext["ptx"] = ptx
            stream.append(StreamGrid(launch, bool(kwargs.get("launch_pdl")), md.name))
            self.last, self.last_compiled = launch, compiled
            return launch
        t0 = time.perf_counter()
        run_launch(launch, self.order)
        dt = time.perf_counter() - t0
        del scratch
        self.last, self.last_compiled = launch, compiled
        rec = TritonLaunchRecord(md.name, self.arch, grid, md.num_warps, dt,
                                 int(launch.stats.get("warp_instructions", 0)))
        with _LOCK:
            LAUNCHES.append(rec)
        return launch


def _triton_version() -> str:
    import triton  # lazy: only on an error path

    return triton.__version__


def emulated(kernel, arch: str = "sm_100a", order="forward") -> EmuTritonKernel:
    """``kernel`` (a ``@triton.jit`` function) as an :class:`EmuTritonKernel` for ``arch``."""
    return EmuTritonKernel(kernel, arch, order)


def stand_in_factory():
    """The factory :func:`nvgemm.emulator.enable` installs in
    :mod:`nvgemm.templates.common.triton_stand_in`: one :class:`EmuTritonKernel` per (kernel, arch)."""
    made: dict[tuple[int, str], EmuTritonKernel] = {}

    def factory(kernel, arch: str) -> EmuTritonKernel:
        k = made.get((id(kernel), arch))
        if k is None:
            k = made.setdefault((id(kernel), arch), EmuTritonKernel(kernel, arch))
        return k

    return factory


def summary(records: list[TritonLaunchRecord] | None = None) -> str:
    """One line: which Triton kernels ran from PTX on the emulator (launches, arch, seconds)."""
    recs = LAUNCHES if records is None else records
    if not recs:
        return "Triton kernels run from PTX on the emulator: none launched"
    per: dict[tuple[str, str], list] = {}
    for r in recs:
        a = per.setdefault((r.kernel, r.arch), [0, 0.0])
        a[0] += 1
        a[1] += r.seconds
    parts = [f"{k} x{n} ({arch}, {s:.1f} s)" for (k, arch), (n, s) in per.items()]
    return "Triton kernels run from PTX on the emulator: " + ", ".join(parts)


__all__ = ["ARCHS", "EmuTritonKernel", "LAUNCHES", "TritonLaunchRecord", "emulated", "stand_in_factory", "summary"]
