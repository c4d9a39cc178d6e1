"""Machine state of the PTX emulator: the API opcode modules are written against.

Execution model
---------------
A launch (:class:`Launch`) runs its CTAs one cluster at a time, in an order the caller chooses
(forward, reverse or shuffled: every serial order is a legal execution of kernels that never spin on
global memory), or several clusters at once (:class:`~.schedule.Schedule`, for cluster launch control). Inside a CTA (:class:`Cta`) every warp (:class:`Warp`) is a coroutine (a Python
generator, :func:`nvgemm.emulator.ptx.interp.run_warp`) that executes instructions until one of them
*blocks* (returns a :class:`Wait`): ``bar.sync``, an ``mbarrier`` wait, a warpgroup join, ... The CTA
scheduler resumes the warps round-robin whose wait condition holds; when no live warp can move it
raises :class:`~.errors.DeadlockError` naming each warp, its PC and what it waits on.

Lanes are vectorised: one numpy operation executes an instruction for all 32 lanes of a warp.
Divergence: each lane has its own PC (``Warp.pc``); the warp executes the instruction at the
smallest PC among its live lanes with the mask of the lanes standing there ("min-PC" scheduling,
which reconverges at the first common instruction after a branch). Collective ``.sync.aligned``
instructions (``mma.sync``, ``shfl.sync``, ``bar.sync``, ``wgmma.*``, ``tcgen05.*.sync.aligned``) require
the lanes their member mask names to execute them together, or raise.

Registers (per warp, raw bits; PTX registers are untyped containers)
--------------------------------------------------------------------
``Warp.bank[b]`` for ``b`` in ``"pred"`` (bool), ``"b16"`` (uint16; also .b8 registers), ``"b32"``
(uint32), ``"b64"`` (uint64): a 2-D array ``[register index, lane]``; the compile step resolves every
register operand to ``(bank, index)`` once (:class:`~.program.CompileContext`). An opcode module
reads an operand with ``ctx.src(op, dtype)`` -> ``getter(warp) -> ndarray[32] of dtype`` (a view of
the raw bits, or a broadcast immediate) and writes with ``ctx.dst(op, dtype)`` ->
``setter(warp, mask, values)``; writes are masked by the executing lanes.

Memory spaces
-------------
* global: :class:`GlobalMemory` -- host memory (the fake CUDA runtime makes device pointers host
  pointers) behind a registry of allocations; every access is bounds-checked per allocation and
  alignment-checked; an access outside every registered allocation is an error naming the
  instruction, CTA and lane.
* shared: :class:`SharedMemory` per CTA -- static variables then the dynamic window (1024-aligned);
  it starts *poisoned* (reading a byte nobody wrote is an error) and bytes an asynchronous copy
  will write are *in flight* (reading them before the copy completes -- ``cp.async.wait_group``,
  an mbarrier phase, ... -- is an error). Shared addresses are offsets into the CTA's window; a
  generic address ``SHARED_WINDOW + offset`` (``cvta.shared``) refers to the same byte.
  ``SharedMemory.write_async(offsets, data)`` returns a token for async-proxy writers (TMA, cp.async)
  that ``complete()`` makes visible.
* param: ``Launch.params`` (bytes) and ``Entry.params`` offsets; ``cvta.param`` gives generic
  ``PARAM_WINDOW + offset``.
* local: not used by nvgemm's kernels (an error).
* cluster / DSMEM: ``Cta.cluster`` (:class:`Cluster`) lists the CTAs of the cluster by rank;
  ``Cluster.shared_of(rank)`` is that CTA's :class:`SharedMemory`. Every shared address of CTA ``rank``
  is ``(rank << CLUSTER_RANK_SHIFT) | offset`` (``Cta.shared_base``; its shared variables' addresses
  carry it): the shared::cta window sits inside the shared::cluster window, as on hardware, where CuTe
  reaches the CTA pair leader's mbarrier by clearing bit 24 of a local address. ``mapa`` replaces the
  rank bits; ``.shared::cta`` accesses must name the executing CTA
  (:func:`nvgemm.emulator.ptx.ops.memory.shared_target` / ``cluster_target`` resolve them).

Extension slots for opcode modules (wgmma, TMA, mbarrier, tcgen05 from ``nvgemm.emulator.isa``)
---------------------------------------------------------------------------------------------------
* ``Warp.ext`` / ``Cta.ext`` / ``Launch.ext``: dicts an opcode family keeps its state in, keyed by
  family name (e.g. ``Cta.ext["mbarrier"]`` objects by shared offset; ``Warp.ext["wgmma"]`` the
  warp's pending accumulator groups). Core keys: ``Warp.ext["cp.async"]`` (groups),
  ``Warp.ext["griddepcontrol.wait"]`` (the warp passed its PDL wait), ``Cta.ext["bar"]`` (named
  barriers), ``Launch.ext["pdl_pre_wait_reads" / "pdl_pre_wait_writes" / "pdl_pre_wait_prefetches"]`` (allocation
  names touched before the PDL wait, TMA included), ``Launch.ext["pdl_wait_ready"]`` (in a PDL stream,
  :mod:`.pdl`: whether the prerequisite grids completed; ``Cta.ext["pdl_triggered"]``: the CTA executed
  ``launch_dependents``), ``Launch.ext["cta_exit_hooks"]`` (callables run on each CTA after it exits).
* ``Cta.tmem``: the tensor-memory slot (None until ``tcgen05.alloc``; an opcode module puts its
  object there).
* ``Cta.async_queues``: named async-proxy queues (list of pending operations) an opcode module
  drains at its completion points.
* Blocking: an executor returns ``Wait(ready, what, then)``; the warp's PC already points past the
  instruction, ``then(warp)`` runs when ``ready()`` first holds (e.g. sets a try_wait predicate).
* Collectives over several warps (a warpgroup's ``wgmma``) keep their join state in ``Cta.ext`` and
  return a ``Wait`` until every participant arrived.
* An opcode module registers compile functions with :func:`nvgemm.emulator.ptx.ops.opcode`; a compile
  function gets the parsed :class:`~.parser.Instruction` and a :class:`~.program.CompileContext`
  and returns an executor ``fn(warp, mask) -> None | Wait | JUMPED``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from nvgemm.emulator.ptx.errors import EmulationError

LANES = 32
SHARED_WINDOW = 0xFFFF_8000_0000_0000  # generic addresses of the CTA's shared window (never a host pointer)
PARAM_WINDOW = 0xFFFF_4000_0000_0000  # generic addresses of the kernel parameters
CLUSTER_RANK_SHIFT = 24  # shared::cluster addresses: (rank << 24) | offset
LANE_IDS = np.arange(LANES, dtype=np.uint32)
FULL = np.ones(LANES, dtype=bool)  # the mask object of a converged full warp (read-only; test with `is`)
FULL.setflags(write=False)
POISON_BYTE = 0xA5


class JumpedType:
    """Returned by an executor that set the PCs of its lanes itself (branches)."""

    def __repr__(self) -> str:
        return "JUMPED"


JUMPED = JumpedType()


@dataclass
class Wait:
    """A blocking point: the warp resumes when ``ready()`` holds; ``then(warp)`` runs on resume (e.g.
    to write a try_wait's predicate); ``what`` is shown in deadlock reports."""

    ready: Callable[[], bool]
    what: "str | Callable[[], str]"
    then: Callable[["Warp"], None] | None = None


# --------------------------------------------------------------------------------------- global


@dataclass
class Allocation:
    base: int
    size: int
    name: str
    view: np.ndarray  # uint8 over the host bytes


class GlobalMemory:
    """Registered device (= host) allocations, bounds-checked."""

    def __init__(self):
        self.allocs: list[Allocation] = []
        self._bases = np.zeros(0, dtype=np.uint64)
        self.current_warp: "Warp | None" = None  # the warp the scheduler resumed last (set by ptx/schedule.py)

    def register(self, base: int, size: int, name: str) -> None:
        if size <= 0:
            return
        for a in list(self.allocs):
            if a.base == base and a.size == size:
                return
            if base < a.base + a.size and a.base < base + size:  # overlapping views: one allocation
                self.allocs.remove(a)
                lo, hi = min(base, a.base), max(base + size, a.base + a.size)
                base, size, name = lo, hi - lo, f"{a.name}|{name}"
        view = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(base))
        self.allocs.append(Allocation(base, size, name, view))
        self.allocs.sort(key=lambda a: a.base)
        self._bases = np.array([a.base for a in self.allocs], dtype=np.uint64)

    def register_tensor(self, t: Any, name: str) -> None:
        """A torch tensor's extent (from its first to its last element)."""
        if t.numel() == 0:
            return
        span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
        self.register(t.data_ptr(), span * t.element_size(), name)

    def _locate(self, addrs: np.ndarray, width: int, where: Callable[[int], str]) -> tuple[Allocation, np.ndarray]:
        a64 = addrs.astype(np.uint64, copy=False)
        if not len(self.allocs):
            raise EmulationError(f"global access at {int(a64[0]):#x} with no registered allocation ({where(0)})")
        idx = np.searchsorted(self._bases, a64, side="right") - 1
        i0 = int(idx[0])
        if i0 < 0 or not (idx == i0).all():
            bad = int(np.argmax(idx != i0)) if i0 >= 0 else 0
            return self._oob(a64, width, idx, bad, where)
        al = self.allocs[i0]
        off = (a64 - np.uint64(al.base)).astype(np.int64)
        if (off + width > al.size).any():
            bad = int(np.argmax(off + width > al.size))
            return self._oob(a64, width, idx, bad, where)
        return al, off

    def _oob(self, a64, width, idx, bad, where):
        addr = int(a64[bad])
        near = min(self.allocs, key=lambda a: min(abs(addr - a.base), abs(addr - a.base - a.size)))
        raise EmulationError(
            f"out-of-bounds global access: {width} bytes at {addr:#x}, {where(bad)}; nearest allocation "
            f"{near.name} [{near.base:#x}, {near.base + near.size:#x}) (offset {addr - near.base})")

    def names_of(self, addrs: np.ndarray) -> set[str]:
        """Names of the allocations holding ``addrs`` (for the PDL-hazard record)."""
        if not len(self.allocs) or not len(addrs):
            return set()
        idx = np.searchsorted(self._bases, addrs.astype(np.uint64), side="right") - 1
        return {self.allocs[i].name for i in np.unique(idx) if i >= 0}

    def read(self, addrs: np.ndarray, width: int, where: Callable[[int], str]) -> np.ndarray:
        """Bytes ``[n, width]`` at ``addrs`` (one allocation per access; grouped if several)."""
        if not len(addrs):
            return np.zeros((0, width), np.uint8)
        _check_align(addrs, width, where)
        try:
            al, off = self._locate(addrs, width, where)
            return al.view[off[:, None] + np.arange(width)]
        except EmulationError:
            if len(addrs) == 1:
                raise
        out = np.empty((len(addrs), width), np.uint8)  # accesses spanning several allocations
        for j in range(len(addrs)):
            out[j] = self.read(addrs[j:j + 1], width, lambda _i, j=j: where(j))[0]
        return out

    def write(self, addrs: np.ndarray, data: np.ndarray, where: Callable[[int], str]) -> None:
        """Write ``data`` ``[n, width]`` bytes; lanes in order (a later lane wins on overlap)."""
        if not len(addrs):
            return
        width = data.shape[1]
        _check_align(addrs, width, where)
        try:
            al, off = self._locate(addrs, width, where)
            al.view[off[:, None] + np.arange(width)] = data
            return
        except EmulationError:
            if len(addrs) == 1:
                raise
        for j in range(len(addrs)):
            self.write(addrs[j:j + 1], data[j:j + 1], lambda _i, j=j: where(j))


def _check_align(addrs: np.ndarray, width: int, where) -> None:
    if width > 1:
        mis = (addrs.astype(np.uint64, copy=False) % np.uint64(width)) != 0
        if mis.any():
            bad = int(np.argmax(mis))
            raise EmulationError(f"misaligned {width}-byte access at {int(addrs[bad]):#x}, {where(bad)}")


# --------------------------------------------------------------------------------------- shared


class SharedMemory:
    """One CTA's shared memory: bytes, a written-ever mask (poison) and an in-flight counter per byte."""

    def __init__(self, size: int, name: str = "shared"):
        self.size = size
        self.name = name
        self.data = np.full(size, POISON_BYTE, dtype=np.uint8)
        self.valid = np.zeros(size, dtype=bool)
        self.inflight = np.zeros(size, dtype=np.int16)

    def _idx(self, offs: np.ndarray, width: int, where) -> np.ndarray:
        o = offs.astype(np.int64, copy=False)
        if width > 1:
            mis = o % width != 0
            if mis.any():
                bad = int(np.argmax(mis))
                raise EmulationError(f"misaligned {width}-byte shared access at offset {int(o[bad])}, {where(bad)}")
        bad_m = (o < 0) | (o + width > self.size)
        if bad_m.any():
            bad = int(np.argmax(bad_m))
            raise EmulationError(f"out-of-bounds shared access: {width} bytes at offset {int(o[bad])} "
                                 f"(shared size {self.size}), {where(bad)}")
        return o[:, None] + np.arange(width)

    def read(self, offs: np.ndarray, width: int, where) -> np.ndarray:
        ix = self._idx(offs, width, where)
        if self.inflight[ix].any():
            bad = int(np.argmax(self.inflight[ix].any(axis=1)))
            raise EmulationError(f"read of shared bytes [{int(offs[bad])}, +{width}) while an asynchronous copy "
                                 f"into them is still in flight (no wait/phase completed it), {where(bad)}")
        if not self.valid[ix].all():
            bad = int(np.argmax(~self.valid[ix].all(axis=1)))
            raise EmulationError(f"read of uninitialised (poisoned) shared bytes [{int(offs[bad])}, +{width}), "
                                 f"{where(bad)}")
        return self.data[ix]

    def write(self, offs: np.ndarray, data: np.ndarray, where) -> None:
        ix = self._idx(offs, data.shape[1], where)
        if self.inflight[ix].any():
            bad = int(np.argmax(self.inflight[ix].any(axis=1)))
            raise EmulationError(f"write to shared bytes [{int(offs[bad])}, +{data.shape[1]}) that an asynchronous "
                                 f"copy is still writing, {where(bad)}")
        self.data[ix] = data
        self.valid[ix] = True

    def write_async(self, offs: np.ndarray, data: np.ndarray, where) -> "AsyncWrite":
        """Start an async-proxy write: the bytes are in flight until the token's ``complete()``."""
        ix = self._idx(offs, data.shape[1], where)
        np.add.at(self.inflight, ix.ravel(), 1)
        return AsyncWrite(self, ix, data.copy())


@dataclass
class AsyncWrite:
    shared: SharedMemory
    ix: np.ndarray
    data: np.ndarray
    done: bool = False

    def complete(self) -> None:
        if self.done:
            return
        self.done = True
        np.add.at(self.shared.inflight, self.ix.ravel(), -1)
        self.shared.data[self.ix] = self.data
        self.shared.valid[self.ix] = True


# --------------------------------------------------------------------------------------- warps / CTAs


class Warp:
    """One warp: register banks, per-lane PCs, live lanes, per-warp extension state."""

    def __init__(self, cta: "Cta", wid: int, nlanes: int, bank_sizes: dict[str, int]):
        self.cta = cta
        self.wid = wid
        self.bank = {
            "pred": np.zeros((bank_sizes.get("pred", 0), LANES), dtype=bool),
            "b16": np.zeros((bank_sizes.get("b16", 0), LANES), dtype=np.uint16),
            "b32": np.zeros((bank_sizes.get("b32", 0), LANES), dtype=np.uint32),
            "b64": np.zeros((bank_sizes.get("b64", 0), LANES), dtype=np.uint64),
            # .b128 registers: [register index, lane, (low, high) 64-bit halves] (isa/ops_clc.py's mov.b128)
            "b128": np.zeros((bank_sizes.get("b128", 0), LANES, 2), dtype=np.uint64),
        }
        self.pc = np.zeros(LANES, dtype=np.int64)
        self.live = LANE_IDS < nlanes  # lanes that exist and have not exited
        self.alive = nlanes > 0
        self.tid = (wid * LANES + LANE_IDS).astype(np.uint32)  # linear thread index in the CTA
        self.ext: dict[str, Any] = {}
        self.wait: Wait | None = None
        self.done = False
        self.executed = 0

    @property
    def name(self) -> str:
        return f"CTA {self.cta.ctaid} warp {self.wid}"

    def where(self, ins, lane: int | None = None) -> str:
        s = f"{self.name}"
        if lane is not None:
            s += f" lane {lane} (thread {self.wid * LANES + lane})"
        return f"{s}, {ins.opcode} at {ins.where()}"


class Cluster:
    def __init__(self, dims: tuple[int, int, int]):
        self.dims = dims
        self.ctas: list[Cta] = []
        self.ext: dict[str, Any] = {}

    def shared_of(self, rank: int) -> SharedMemory:
        if not 0 <= rank < len(self.ctas):
            raise EmulationError(f"shared::cluster access to CTA rank {rank} of a cluster of {len(self.ctas)}")
        return self.ctas[rank].shared


class Cta:
    def __init__(self, launch: "Launch", ctaid: tuple[int, int, int], rank: int, cluster: Cluster):
        self.launch = launch
        self.ctaid = ctaid
        self.rank = rank  # %cluster_ctarank
        self.cluster = cluster
        self.shared_base = rank << CLUSTER_RANK_SHIFT  # the CTA's shared::cta window in shared::cluster
        self.shared = SharedMemory(launch.program.shared_size(launch.dyn_smem), f"shared of CTA {ctaid}")
        self.warps: list[Warp] = []
        self.ext: dict[str, Any] = {}
        self.tmem: Any = None
        self.async_queues: dict[str, list] = {}
        self.barrier_arrived: dict[int, set[int]] = {}  # bar.sync id -> warps arrived this generation
        self.barrier_gen: dict[int, int] = {}


@dataclass
class DeviceProfile:
    """One GPU as a launch sees it. ``max_smem_optin``: the most shared memory (static + dynamic) one CTA
    may use after the opt-in (``cudaDevAttrMaxSharedMemoryPerBlockOptin``); ``smem_per_sm``: the shared
    memory one SM has; ``max_cluster``: the most CTAs one cluster may hold (1: no clusters); ``regs_per_sm``
    / ``max_regs_per_thread``: 32-bit registers."""

    name: str
    sm_count: int
    cc: tuple[int, int]
    max_smem_optin: int
    smem_per_sm: int = 0
    max_cluster: int = 1
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255


_KB = 1024

# Shared memory, clusters and registers are compute-capability facts: the CUDA C++ Programming Guide,
# "Compute Capabilities" appendix, "Technical Specifications per Compute Capability" table (shared memory
# per SM 164 KB on 8.0, 100 KB on 8.6 / 8.9 / 12.x, 228 KB on 9.0 / 10.0; per thread block at most
# 163 / 99 / 227 KB, 1 KB of each SM's partition being reserved for the system; 64 K 32-bit registers per
# SM and at most 255 per thread on all of them; thread block clusters from 9.0 on, 8 CTAs the portable
# maximum, 16 with cudaFuncAttributeNonPortableClusterSizeAllowed on H100 / B200 (Hopper and Blackwell
# tuning guides, "Thread Block Clusters")). The per-block numbers are also CuTeDSL 4.8.1's
# cutlass.cutlass_dsl.SMEM_CAPACITY_MAP. No non-portable cluster size is documented for 12.x, so those
# profiles allow the portable 8. The SM count is a product fact, from each product's datasheet / whitepaper
# (CUDA cores / 128 per SM on 8.6, 8.9 and 12.x; 64 per SM on 8.0 / 9.0 / 10.0).
DEVICES = {
    # A100 SXM: 108 SMs (NVIDIA A100 Tensor Core GPU Architecture whitepaper), sm_80.
    "A100": DeviceProfile("A100", 108, (8, 0), 163 * _KB, 164 * _KB, 1),
    # A10: 9216 CUDA cores = 72 SMs (NVIDIA A10 datasheet), sm_86.
    "A10": DeviceProfile("A10", 72, (8, 6), 99 * _KB, 100 * _KB, 1),
    # L40S: 18176 CUDA cores = 142 SMs (NVIDIA L40S datasheet), sm_89.
    "L40S": DeviceProfile("L40S", 142, (8, 9), 99 * _KB, 100 * _KB, 1),
    # H100 SXM5: 132 SMs (NVIDIA H100 Tensor Core GPU Architecture whitepaper), sm_90a; H200 the same die.
    "H100": DeviceProfile("H100", 132, (9, 0), 227 * _KB, 228 * _KB, 16),
    "H200": DeviceProfile("H200", 132, (9, 0), 227 * _KB, 228 * _KB, 16),
    # B200: 148 SMs (NVIDIA Blackwell datasheet), sm_100a.
    "B200": DeviceProfile("B200", 148, (10, 0), 227 * _KB, 228 * _KB, 16),
    # GeForce RTX 5090: 21760 CUDA cores = 170 SMs (NVIDIA RTX Blackwell GPU Architecture whitepaper), sm_120a.
    "RTX5090": DeviceProfile("RTX5090", 170, (12, 0), 99 * _KB, 100 * _KB, 8),
    # GB10 (DGX Spark): 6144 CUDA cores = 48 SMs (NVIDIA DGX Spark datasheet), sm_121a.
    "GB10": DeviceProfile("GB10", 48, (12, 1), 99 * _KB, 100 * _KB, 8),
}

# The profile an arch's kernels run on by default.
ARCH_DEVICES = {"sm_80": "A100", "sm_86": "A10", "sm_89": "L40S", "sm_90a": "H200", "sm_100a": "B200",
                "sm_120a": "RTX5090", "sm_121a": "GB10"}


def device_for_arch(arch: str) -> DeviceProfile:
    """The default :class:`DeviceProfile` of ``arch`` ("sm_120a", ...); a clear error for an unknown arch."""
    if arch not in ARCH_DEVICES:
        raise ValueError(f"no emulator device profile for arch {arch!r}; have {sorted(ARCH_DEVICES)}")
    return DEVICES[ARCH_DEVICES[arch]]


@dataclass
class Launch:
    """One kernel launch: configuration, parameter bytes, global memory, program."""

    program: Any  # nvgemm.emulator.ptx.program.Program
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    cluster: tuple[int, int, int] = (1, 1, 1)
    dyn_smem: int = 0
    params: bytes = b""
    gmem: GlobalMemory = field(default_factory=GlobalMemory)
    device: DeviceProfile = field(default_factory=lambda: DEVICES["H200"])
    ext: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)


__all__ = ["ARCH_DEVICES", "AsyncWrite", "CLUSTER_RANK_SHIFT", "Cluster", "Cta", "DEVICES", "DeviceProfile", "GlobalMemory",
           "FULL", "JUMPED", "LANES", "LANE_IDS", "Launch", "PARAM_WINDOW", "SHARED_WINDOW", "SharedMemory", "Wait", "Warp",
           "device_for_arch"]
