"""Cluster scheduling of a launch: the pending launch queue and the clusters resident at once.

A launch's clusters wait in a :class:`LaunchQueue` (cluster origins in the order of
:class:`Schedule.order`: ``"forward"``, ``"reverse"`` or an int seed for a shuffled order). Up to
:class:`Schedule.resident` clusters run at once: the warps of every resident cluster are interleaved
at their blocking points, and when a cluster exits the head of the queue launches in its place.
``resident=1`` (the default) runs the clusters serially, one after the other.

Cluster launch control (``clusterlaunchcontrol.try_cancel``, :mod:`nvgemm.emulator.isa.ops_clc`)
takes the head of the queue with :meth:`LaunchQueue.cancel`: that cluster never launches, and the
requesting kernel receives its first ctaid; with nothing pending the request fails. Every
combination of order and residency is a legal execution, so the strict use is to run a kernel under
several: serially a persistent CTA steals every pending cluster; with ``resident`` at least the number
of clusters every request fails and each cluster computes its own work, as on a GPU with room for the
whole grid.

A launch with a preferred cluster shape (``cudaLaunchAttributePreferredClusterDimension``; the launch's
cluster shape is then the fallback) is cut into preferred-shape regions, each launched as one cluster of
the preferred shape or as fallback clusters, as :attr:`Schedule.preferred` says: ``"all"``, ``"none"``, or
an int seed choosing per region (a GPU mixes both shapes in one grid). Each CTA's cluster registers
(``%cluster_nctaid``, ``%cluster_ctarank``, ...) describe its own cluster. A try_cancel cancels the first
pending cluster *of the requesting cluster's shape*: the PTX ISA does not say which shapes a request may
cancel, and a scheduler that derives its work from the first ctaid alone (CUTLASS's and NVIDIA's
tutorials') needs this; not verified on hardware.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from dataclasses import dataclass

from nvgemm.emulator.ptx.errors import DeadlockError, EmulationError
from nvgemm.emulator.ptx.machine import LANES, Cluster, Cta, Warp


@dataclass(frozen=True)
class Schedule:
    """``order``: order of the launch queue; ``resident``: clusters running at once (>= 1); ``preferred``:
    which preferred-shape regions launch as one preferred cluster ("all", "none", an int seed)."""

    order: "str | int" = "forward"
    resident: int = 1
    preferred: "str | int" = "all"

    def __post_init__(self):
        if not (self.order in ("forward", "reverse") or (isinstance(self.order, int)
                                                          and not isinstance(self.order, bool))):
            raise ValueError(f"CTA order must be 'forward', 'reverse' or an int seed, got {self.order!r}")
        if not isinstance(self.resident, int) or self.resident < 1:
            raise ValueError(f"resident clusters must be an int >= 1, got {self.resident!r}")
        if not (self.preferred in ("all", "none") or (isinstance(self.preferred, int)
                                                      and not isinstance(self.preferred, bool))):
            raise ValueError(f"preferred must be 'all', 'none' or an int seed, got {self.preferred!r}")


def as_schedule(order) -> Schedule:
    """``order`` as a :class:`Schedule` (a bare order means one resident cluster)."""
    return order if isinstance(order, Schedule) else Schedule(order)


def _ordered(items: list, order) -> list:
    if order == "forward":
        return items
    if order == "reverse":
        return items[::-1]
    Schedule(order)  # validates
    random.Random(order).shuffle(items)
    return items


def _origins(grid, cluster) -> list[tuple[int, int, int]]:
    return [(x, y, z) for z in range(0, grid[2], cluster[2]) for y in range(0, grid[1], cluster[1])
            for x in range(0, grid[0], cluster[0])]


def cluster_origins(grid: tuple[int, int, int], cluster: tuple[int, int, int], order) -> list[tuple[int, int, int]]:
    """Cluster origins (first ctaid of each cluster) in launch order."""
    return _ordered(_origins(grid, cluster), order)


def launch_units(grid, fallback, preferred, schedule: Schedule) -> list[tuple[tuple[int, int, int], tuple]]:
    """(origin, cluster shape) of every cluster of a launch, in launch order (see the module docstring)."""
    if not preferred:
        return [(o, fallback) for o in cluster_origins(grid, fallback, schedule.order)]
    if any(g % p for g, p in zip(grid, preferred)) or any(p % f for p, f in zip(preferred, fallback)):
        raise EmulationError(f"preferred cluster shape {preferred}: the grid {grid} must be a multiple of it and it "
                             f"a multiple of the fallback shape {fallback}")
    rnd = random.Random(schedule.preferred) if isinstance(schedule.preferred, int) else None
    units = []
    for o in _origins(grid, preferred):
        if schedule.preferred == "all" or (rnd is not None and rnd.random() < 0.5):
            units.append((o, tuple(preferred)))
        else:
            units += [((o[0] + x, o[1] + y, o[2] + z), fallback) for x, y, z in _origins(preferred, fallback)]
    return _ordered(units, schedule.order)


class LaunchQueue:
    """Clusters not launched yet, as (origin, shape); :meth:`cancel` is the ISA's atomic try_cancel."""

    def __init__(self, units: list):
        self.pending = deque(units)
        self.launched: list = []
        self.canceled: list = []

    def launch_next(self):
        unit = self.pending.popleft()
        self.launched.append(unit)
        return unit

    def cancel(self, shape=None) -> tuple[int, int, int] | None:
        """Atomically cancel the launch of the next pending cluster (of ``shape`` if given): its origin, or
        None if none is pending."""
        for i, unit in enumerate(self.pending):
            if shape is None or unit[1] == shape:
                del self.pending[i]
                self.canceled.append(unit)
                return unit[0]
        return None


class _Resident:
    """One running cluster: its warps and their coroutines."""

    def __init__(self, cluster: Cluster, prog, budget, run_warp):
        self.cluster = cluster
        self.warps = [w for c in cluster.ctas for w in c.warps]
        self.gens = {id(w): run_warp(w, prog, budget) for w in self.warps}
        self.active = list(self.warps)

    def step(self) -> bool:
        """Resume every runnable warp once; True if any moved."""
        progressed = False
        for w in list(self.active):
            w.cta.launch.gmem.current_warp = w  # whose access it is (the PDL stream's race checks)
            if w.wait is not None:
                if not w.wait.ready():
                    continue
                then = w.wait.then
                w.wait = None
                if then is not None:
                    then(w)
            try:
                w.wait = next(self.gens[id(w)])
            except StopIteration:
                self.active.remove(w)
            progressed = True
        return progressed


def make_cluster(launch, prog, org: tuple[int, int, int], cl: tuple[int, int, int]) -> Cluster:
    block = launch.block
    nthreads = block[0] * block[1] * block[2]
    nwarps = -(-nthreads // LANES)
    cluster = Cluster(cl)
    for rank, (dz, dy, dx) in enumerate(itertools.product(range(cl[2]), range(cl[1]), range(cl[0]))):
        cta = Cta(launch, (org[0] + dx, org[1] + dy, org[2] + dz), rank, cluster)
        cta.warps = [Warp(cta, i, min(LANES, nthreads - i * LANES), prog.bank_sizes) for i in range(nwarps)]
        cluster.ctas.append(cta)
    return cluster


class GridRun:
    """The clusters of one launch, stepped from outside: :func:`run_clusters` runs one grid to its end; the PDL
    stream scheduler (:mod:`.pdl`) steps several grids in turn. ``finish_cta(cta)`` runs after a cluster exits."""

    def __init__(self, launch, prog, budget: list[int], schedule: Schedule, run_warp, describe, finish_cta):
        self.launch, self.prog, self.budget, self.schedule = launch, prog, budget, schedule
        self.run_warp, self.describe, self.finish_cta = run_warp, describe, finish_cta
        self.queue = LaunchQueue(launch_units(launch.grid, launch.cluster, launch.ext.get("preferred_cluster"),
                                              schedule))
        launch.ext["launch_queue"] = self.queue
        self.resident: list[_Resident] = []

    @property
    def done(self) -> bool:
        return not self.queue.pending and not self.resident

    def running_ctas(self) -> list[Cta]:
        return [c for r in self.resident for c in r.cluster.ctas]

    def step(self) -> bool:
        """Launch clusters up to the residency, resume every runnable warp once; True if anything moved."""
        while len(self.resident) < self.schedule.resident and self.queue.pending:
            self.resident.append(_Resident(make_cluster(self.launch, self.prog, *self.queue.launch_next()), self.prog,
                                           self.budget, self.run_warp))
        progressed = False
        for r in list(self.resident):
            progressed |= r.step()
            if not r.active:
                self.resident.remove(r)
                for c in r.cluster.ctas:
                    self.finish_cta(c)
                progressed = True
        if self.done:
            self.launch.stats["clusters_launched"] = len(self.queue.launched)
            self.launch.stats["clusters_canceled"] = len(self.queue.canceled)
        return progressed

    def blocked(self) -> str:
        """Each resident warp and what it waits on (a deadlock report)."""
        return "\n  ".join(self.describe(w, self.prog) for r in self.resident for w in r.warps)


def run_clusters(launch, prog, budget: list[int], schedule: Schedule, run_warp, describe, finish_cta) -> None:
    """Run every cluster of ``launch`` (see the module docstring); ``finish_cta(cta)`` after a cluster exits."""
    run = GridRun(launch, prog, budget, schedule, run_warp, describe, finish_cta)
    while not run.done:
        if not run.step():
            ctas = [c.ctaid for c in run.running_ctas()]
            raise DeadlockError(f"deadlock: no warp of CTA(s) {ctas} can proceed:\n  {run.blocked()}")


__all__ = ["GridRun", "LaunchQueue", "Schedule", "as_schedule", "cluster_origins", "launch_units", "make_cluster",
           "run_clusters"]
