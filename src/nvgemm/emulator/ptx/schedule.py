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
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from dataclasses import dataclass

from .errors import DeadlockError
from .machine import LANES, Cluster, Cta, Warp


@dataclass(frozen=True)
class Schedule:
    """``order``: order of the launch queue; ``resident``: clusters running at once (>= 1)."""

    order: "str | int" = "forward"
    resident: int = 1

    def __post_init__(self):
        if not (self.order in ("forward", "reverse") or (isinstance(self.order, int)
                                                          and not isinstance(self.order, bool))):
            raise ValueError(f"CTA order must be 'forward', 'reverse' or an int seed, got {self.order!r}")
        if not isinstance(self.resident, int) or self.resident < 1:
            raise ValueError(f"resident clusters must be an int >= 1, got {self.resident!r}")


def as_schedule(order) -> Schedule:
    """``order`` as a :class:`Schedule` (a bare order means one resident cluster)."""
    return order if isinstance(order, Schedule) else Schedule(order)


def cluster_origins(grid: tuple[int, int, int], cluster: tuple[int, int, int], order) -> list[tuple[int, int, int]]:
    """Cluster origins (first ctaid of each cluster) in launch order."""
    origins = [(x, y, z) for z in range(0, grid[2], cluster[2]) for y in range(0, grid[1], cluster[1])
               for x in range(0, grid[0], cluster[0])]
    if order == "forward":
        return origins
    if order == "reverse":
        return origins[::-1]
    Schedule(order)  # validates
    random.Random(order).shuffle(origins)
    return origins


class LaunchQueue:
    """Clusters not launched yet, by origin; :meth:`cancel` is the ISA's atomic try_cancel."""

    def __init__(self, origins: list[tuple[int, int, int]]):
        self.pending = deque(origins)
        self.launched: list[tuple[int, int, int]] = []
        self.canceled: list[tuple[int, int, int]] = []

    def launch_next(self) -> tuple[int, int, int]:
        org = self.pending.popleft()
        self.launched.append(org)
        return org

    def cancel(self) -> tuple[int, int, int] | None:
        """Atomically cancel the launch of the next pending cluster: its origin, or None if none is pending."""
        if not self.pending:
            return None
        org = self.pending.popleft()
        self.canceled.append(org)
        return org


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


def make_cluster(launch, prog, org: tuple[int, int, int]) -> Cluster:
    cl, block = launch.cluster, launch.block
    nthreads = block[0] * block[1] * block[2]
    nwarps = -(-nthreads // LANES)
    cluster = Cluster(cl)
    for rank, (dz, dy, dx) in enumerate(itertools.product(range(cl[2]), range(cl[1]), range(cl[0]))):
        cta = Cta(launch, (org[0] + dx, org[1] + dy, org[2] + dz), rank, cluster)
        cta.warps = [Warp(cta, i, min(LANES, nthreads - i * LANES), prog.bank_sizes) for i in range(nwarps)]
        cluster.ctas.append(cta)
    return cluster


def run_clusters(launch, prog, budget: list[int], schedule: Schedule, run_warp, describe, finish_cta) -> None:
    """Run every cluster of ``launch`` (see the module docstring); ``finish_cta(cta)`` after a cluster exits."""
    queue = LaunchQueue(cluster_origins(launch.grid, launch.cluster, schedule.order))
    launch.ext["launch_queue"] = queue
    resident: list[_Resident] = []
    while queue.pending or resident:
        while len(resident) < schedule.resident and queue.pending:
            resident.append(_Resident(make_cluster(launch, prog, queue.launch_next()), prog, budget, run_warp))
        progressed = False
        for r in list(resident):
            progressed |= r.step()
            if not r.active:
                resident.remove(r)
                for c in r.cluster.ctas:
                    finish_cta(c)
                progressed = True
        if not progressed:
            ctas = [c.ctaid for r in resident for c in r.cluster.ctas]
            lines = "\n  ".join(describe(w, prog) for r in resident for w in r.warps)
            raise DeadlockError(f"deadlock: no warp of CTA(s) {ctas} can proceed:\n  {lines}")
    launch.stats["clusters_launched"] = len(queue.launched)
    launch.stats["clusters_canceled"] = len(queue.canceled)


__all__ = ["LaunchQueue", "Schedule", "as_schedule", "cluster_origins", "make_cluster", "run_clusters"]
