"""Programmatic dependent launch between grids: a stream of launches, each launched with or without the
programmatic-stream-serialization attribute, executed together under a chosen schedule, with every access a
dependent grid makes before its ``griddepcontrol.wait`` to memory a prerequisite grid writes reported as a race.

Rules (PTX ISA, ``griddepcontrol``; CUDA programming guide, "Programmatic Dependent Launch"):

* a grid launched with the attribute (``pdl=True``) may start once every CTA of the grid before it has executed
  ``griddepcontrol.launch_dependents`` or exited (a CTA counts from the first thread that executes it; a CTA
  not launched yet has done neither); a grid launched without it starts when the grid before it completed;
* ``griddepcontrol.wait`` blocks until the prerequisite grid completed and its memory operations are visible.
  A grid completes when its CTAs exited and, if it was launched with the attribute, its own prerequisite
  completed (so a wait orders a grid after every earlier grid of the stream);
* nothing else orders a dependent grid's memory accesses after its prerequisites': the *unordered* grids of
  grid ``j`` are ``j-1`` if ``j`` has the attribute, ``j-2`` too if ``j-1`` has it, and so on (``j`` may start
  before ``j-1`` passed its own wait). An access of grid ``j`` by a warp that has not passed its wait
  conflicts with an access of an unordered grid to the same byte, one of the two a write, *whatever the
  interleaving*: the ISA guarantees visibility only through the wait, so a run where the producer happened to
  finish first is still a race. Reported races (:class:`PdlRace`) name both kernels, the instruction (CTA,
  warp, lane, PTX line) and the address with its allocation.

Schedules (:data:`SCHEDULES`; every one a legal execution of a race-free stream, so a race-free stream gives
the same bits under each):

* ``"serial"``: each grid starts when the one before it completed (the baseline);
* ``"early"``: each grid starts as soon as the rules allow, its warps interleaved round-robin with the
  predecessor's tail (a warp runs until it blocks; ``launch_dependents`` and ``wait`` are scheduling points;
  in each round the newest grid's warps move first); stores are visible at once;
* ``"late_stores"``: as ``"early"``, but every grid's global stores stay in a per-grid buffer that only that
  grid's own accesses see, made visible when the grid completes (the last moment the ISA allows), so a
  dependent that reads early sees the old bytes.

By default every cluster of a grid is resident at once (a GPU with room for the whole grid; decode grids are
small), ``resident`` lowers that. The race record keeps the last access of each kind per byte (writer, reader,
early writer, early reader): a conflict hidden behind a later access of a third grid to the same byte is not
reported; for two grids (a producer and its consumer) it is exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from nvgemm.emulator.ptx.errors import DeadlockError, EmulationError
from nvgemm.emulator.ptx.interp import DEFAULT_MAX_INSTRUCTIONS, _describe, check_launch, finish_cta, run_warp
from nvgemm.emulator.ptx.machine import Allocation, GlobalMemory, Launch, _check_align
from nvgemm.emulator.ptx.schedule import GridRun, Schedule, launch_units

SCHEDULES = ("serial", "early", "late_stores")


class PdlRaceError(EmulationError):
    """A dependent grid's access before its ``griddepcontrol.wait`` conflicts with a prerequisite grid's."""


@dataclass(frozen=True)
class PdlRace:
    kind: str  # "read-after-write", "write-after-read", "write-after-write"
    kernel: str  # the grid whose access was found racing (the later of the two in execution)
    other: str  # the grid its access conflicts with
    address: int
    allocation: str
    offset: int
    where: str  # the instruction: CTA, warp, lane, opcode, PTX line
    detail: str

    def __str__(self) -> str:
        return (f"PDL race ({self.kind}): {self.kernel}: {self.detail} at {self.address:#x} ({self.allocation} + "
                f"{self.offset}), {self.where}; conflicting grid: {self.other}")


@dataclass
class StreamGrid:
    """One launch of the stream: ``pdl`` = launched with the programmatic-stream-serialization attribute."""

    launch: Launch
    pdl: bool
    name: str = ""

    def __post_init__(self):
        if not self.name:
            self.name = self.launch.program.entry.name


@dataclass
class StreamResult:
    grids: list[StreamGrid]
    races: list[PdlRace] = field(default_factory=list)
    started_before_predecessor_completed: list[bool] = field(default_factory=list)


class _Shadow:
    """Per byte of one allocation: the last grid that wrote / read it, and the last that did so before its wait."""

    def __init__(self, size: int):
        self.writer = np.full(size, -1, np.int32)
        self.reader = np.full(size, -1, np.int32)
        self.early_writer = np.full(size, -1, np.int32)
        self.early_reader = np.full(size, -1, np.int32)
        # where the early access was: an index into _Stream.sites (the instruction's ``where``) and the lane
        self.early_write_site = np.full(size, -1, np.int32)
        self.early_read_site = np.full(size, -1, np.int32)
        self.early_write_lane = np.zeros(size, np.int8)
        self.early_read_lane = np.zeros(size, np.int8)


class GridView:
    """One grid's global memory in a stream: the stream's allocations, this grid's store buffer (``late_stores``),
    and the race checks; the interface of :class:`~.machine.GlobalMemory` the opcode modules use."""

    def __init__(self, stream: "_Stream", index: int):
        self.stream, self.index = stream, index
        self.mem: GlobalMemory = stream.mem
        self.current_warp = None
        self.pending: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # allocation base -> (mask, bytes)

    @property
    def allocs(self) -> list[Allocation]:
        return self.mem.allocs

    def register(self, base: int, size: int, name: str) -> None:
        self.mem.register(base, size, name)

    def register_tensor(self, t: Any, name: str) -> None:
        self.mem.register_tensor(t, name)

    def names_of(self, addrs: np.ndarray) -> set[str]:
        return self.mem.names_of(addrs)

    # the stream's allocation table as :func:`~.ops.memory.note_prefetch` reads it (an L2 prefetch is no access:
    # no race check, no store buffer)
    @property
    def _bases(self) -> np.ndarray:
        return self.mem._bases

    def _locate(self, addrs: np.ndarray, width: int, where: Callable[[int], str]):
        return self.mem._locate(addrs, width, where)

    def _split(self, addrs, width, where) -> "tuple[Allocation, np.ndarray] | None":
        """(allocation, byte indices [n, width]) or None when the lanes span several allocations."""
        try:
            al, off = self.mem._locate(addrs, width, where)
        except EmulationError:
            if len(addrs) == 1:
                raise
            return None
        return al, off[:, None] + np.arange(width)

    def read(self, addrs: np.ndarray, width: int, where: Callable[[int], str]) -> np.ndarray:
        if not len(addrs):
            return np.zeros((0, width), np.uint8)
        _check_align(addrs, width, where)
        hit = self._split(addrs, width, where)
        if hit is None:
            return np.concatenate([self.read(addrs[j:j + 1], width, lambda _i, j=j: where(j))
                                   for j in range(len(addrs))])
        al, ix = hit
        self.stream.check(self, "read", al, ix, where)
        data = al.view[ix]
        buf = self.pending.get(al.base)
        if buf is not None:
            m = buf[0][ix]
            if m.any():
                data = np.where(m, buf[1][ix], data)
        return data

    def write(self, addrs: np.ndarray, data: np.ndarray, where: Callable[[int], str]) -> None:
        if not len(addrs):
            return
        width = data.shape[1]
        _check_align(addrs, width, where)
        hit = self._split(addrs, width, where)
        if hit is None:
            for j in range(len(addrs)):
                self.write(addrs[j:j + 1], data[j:j + 1], lambda _i, j=j: where(j))
            return
        al, ix = hit
        self.stream.check(self, "write", al, ix, where)
        if self.stream.delay_stores:
            buf = self.pending.get(al.base)
            if buf is None:
                buf = self.pending[al.base] = (np.zeros(al.size, bool), np.zeros(al.size, np.uint8))
            buf[0][ix] = True
            buf[1][ix] = data
        else:
            al.view[ix] = data

    def flush(self) -> None:
        """Make the buffered stores visible (the grid completed)."""
        for base, (m, d) in self.pending.items():
            al = next(a for a in self.mem.allocs if a.base == base)
            al.view[m] = d[m]
        self.pending.clear()


class _Stream:
    def __init__(self, grids: list[StreamGrid], schedule: str, strict: bool):
        self.grids, self.schedule, self.strict = grids, schedule, strict
        self.delay_stores = schedule == "late_stores"
        self.mem = GlobalMemory()
        for g in grids:
            for a in g.launch.gmem.allocs:
                self.mem.register(a.base, a.size, a.name)
        # lo[j]: the first grid unordered with j (lo[j] == j: none)
        self.lo = np.zeros(len(grids) + 1, np.int64)
        for j, g in enumerate(grids):
            self.lo[j] = self.lo[j - 1] if j and g.pdl else j
        self.lo[len(grids)] = len(grids)  # index -1 (no grid) maps here: never unordered
        self.shadows: dict[int, _Shadow] = {}
        self.races: list[PdlRace] = []
        self.sites: list[Callable[[int], str]] = []  # the ``where`` of each early access

    def _shadow(self, al: Allocation) -> _Shadow:
        sh = self.shadows.get(al.base)
        if sh is None:
            sh = self.shadows[al.base] = _Shadow(al.size)
        return sh

    def _unordered_with(self, later: np.ndarray, j: int) -> np.ndarray:
        """Mask: grid j is unordered with grid ``later`` (> j) from ``later``'s side."""
        return (later > j) & (self.lo[later] <= j)

    def _report(self, kind, kernel, other, al, byte, where, detail) -> None:
        race = PdlRace(kind, self.grids[kernel].name, self.grids[other].name, al.base + byte, al.name, byte, where,
                       detail)
        self.races.append(race)
        if self.strict:
            raise PdlRaceError(str(race))

    def check(self, view: GridView, kind: str, al: Allocation, ix: np.ndarray, where) -> None:
        """The race rules of the module docstring for one access of grid ``view.index``. A conflict found at the
        prerequisite's access (the dependent accessed first) is reported at the dependent's early access."""
        j = view.index
        lo = int(self.lo[j])
        w = view.current_warp
        early = lo < j and not (w is not None and w.ext.get("griddepcontrol.wait"))
        sh = self._shadow(al)
        flat = ix.ravel()
        width = ix.shape[1]

        def first(bad):
            b = int(np.argmax(bad))
            return b, int(flat[b])

        if early:  # this access races with what an unordered prerequisite did before
            wr = sh.writer[flat]
            bad = (wr >= lo) & (wr < j)
            if bad.any():
                b, byte = first(bad)
                verb = "read" if kind == "read" else "write"
                self._report("read-after-write" if kind == "read" else "write-after-write", j, int(wr[b]), al, byte,
                             where(b // width), f"{verb} before griddepcontrol.wait of bytes a prerequisite grid "
                             "wrote")
            if kind == "write":
                rd = sh.reader[flat]
                bad = (rd >= lo) & (rd < j)
                if bad.any():
                    b, byte = first(bad)
                    self._report("write-after-read", j, int(rd[b]), al, byte, where(b // width),
                                 "write before griddepcontrol.wait of bytes a prerequisite grid reads")
        # a dependent (unordered with this grid) accessed these bytes early, before this access
        checks = [(sh.early_writer, sh.early_write_site, sh.early_write_lane, "write",
                   "write-after-read" if kind == "read" else "write-after-write")]
        if kind == "write":
            checks.append((sh.early_reader, sh.early_read_site, sh.early_read_lane, "read", "read-after-write"))
        for who, site, lane, verb, what in checks:
            later = who[flat]
            bad = self._unordered_with(later, j)
            if bad.any():
                b, byte = first(bad)
                mine = "writes" if kind == "write" else "reads"
                self._report(what, int(later[b]), j, al, byte, self.sites[site[byte]](int(lane[byte])),
                             f"{verb} before griddepcontrol.wait of bytes a prerequisite grid {mine} afterwards "
                             f"({where(b // width)})")
        if kind == "read":
            sh.reader[flat] = j
        else:
            sh.writer[flat] = j
        if early:
            self.sites.append(where)
            lanes = np.repeat(np.arange(ix.shape[0], dtype=np.int8), width)
            site = len(self.sites) - 1
            if kind == "read":
                sh.early_reader[flat], sh.early_read_site[flat], sh.early_read_lane[flat] = j, site, lanes
            else:
                sh.early_writer[flat], sh.early_write_site[flat], sh.early_write_lane[flat] = j, site, lanes


def run_stream(grids: list[StreamGrid], schedule: str = "early", order="forward", resident: int | None = None,
               strict: bool = True, max_instructions: int | None = None) -> StreamResult:
    """Execute ``grids`` in stream order under ``schedule`` (see the module docstring). ``order``: each grid's
    cluster order; ``resident``: clusters of one grid running at once (default: all). ``strict``: raise
    :class:`PdlRaceError` at the first race, else collect every race in the result."""
    if schedule not in SCHEDULES:
        raise ValueError(f"PDL schedule must be one of {SCHEDULES}, got {schedule!r}")
    if not grids:
        raise ValueError("a PDL stream needs at least one grid")
    st = _Stream(grids, schedule, strict)
    n = len(grids)
    runs: list[GridRun | None] = [None] * n
    complete = [False] * n
    early_start = [False] * n
    budget = [max_instructions or DEFAULT_MAX_INSTRUCTIONS]
    views = []
    for j, g in enumerate(grids):
        check_launch(g.launch)
        view = GridView(st, j)
        views.append(view)
        g.launch.gmem = view
        g.launch.ext["pdl_wait_ready"] = (lambda j=j: j == 0 or complete[j - 1])
        g.launch.stats["warp_instructions"] = 0

    def may_start(j: int) -> bool:
        if j == 0:
            return True
        if schedule == "serial" or not grids[j].pdl:
            return complete[j - 1]
        prev = runs[j - 1]
        return prev is not None and not prev.queue.pending and all(
            c.ext.get("pdl_triggered") for c in prev.running_ctas())

    with np.errstate(all="ignore"):
        while not all(complete):
            moved = False
            for j in range(n):
                if runs[j] is None and may_start(j):
                    launch = grids[j].launch
                    units = len(launch_units(launch.grid, launch.cluster, launch.ext.get("preferred_cluster"),
                                             Schedule(order)))
                    sched = Schedule(order, resident=resident or max(1, units))
                    runs[j] = GridRun(launch, launch.program, budget, sched, run_warp, _describe,
                                      lambda c, launch=launch: finish_cta(launch, c))
                    early_start[j] = j > 0 and not complete[j - 1]
                    moved = True
            # the newest grid first: a dependent's accesses go as early as the rules allow
            for r in (runs if schedule == "serial" else runs[::-1]):
                if r is not None and not r.done:
                    moved |= r.step()
            for j in range(n):
                if not complete[j] and runs[j] is not None and runs[j].done and (j == 0 or complete[j - 1]):
                    complete[j] = True
                    views[j].flush()
                    moved = True
            if not moved:
                lines = "\n  ".join(f"[{grids[j].name}] {r.blocked()}" for j, r in enumerate(runs)
                                    if r is not None and not r.done)
                raise DeadlockError(f"deadlock in a PDL stream: no warp of any running grid can proceed:\n  {lines}")
    return StreamResult(grids, st.races, early_start)


__all__ = ["GridView", "PdlRace", "PdlRaceError", "SCHEDULES", "StreamGrid", "StreamResult", "run_stream"]
