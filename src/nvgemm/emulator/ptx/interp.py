"""The interpreter loop: warps as generators (min-PC divergence), the CTA / cluster scheduler, launches.

``run_launch(launch, order)`` executes every cluster of CTAs in ``order`` ("forward", "reverse", an int
seed for a shuffled order, or a :class:`~.schedule.Schedule` that also sets how many clusters are
resident at once; the default runs them serially); the warps of the resident clusters' CTAs are
interleaved at their blocking points (:mod:`.schedule`). An instruction budget (``max_instructions``) turns an endless
loop into an error instead of a hang.
"""

from __future__ import annotations

import numpy as np

from nvgemm.emulator.ptx.errors import EmulationError
from nvgemm.emulator.ptx.machine import FULL, JUMPED, LANES, Cta, Launch, Wait, Warp
from nvgemm.emulator.ptx.schedule import as_schedule, cluster_origins, run_clusters
from nvgemm.emulator.ptx.ops.memory import finish_cta_async

DEFAULT_MAX_INSTRUCTIONS = 50_000_000


def branch(w: Warp, m: np.ndarray, taken: np.ndarray, target: int, pc: int) -> None:
    """Lanes ``m & taken`` continue at ``target``, the rest of ``m`` at ``pc + 1``."""
    if w.conv:
        if taken.all() or (taken | ~m).all():
            w.upc = target
            return
        if not (taken & m).any():
            w.upc = pc + 1
            return
        w.pc[:] = w.upc
        w.conv = False
    w.pc[m & taken] = target
    w.pc[m & ~taken] = pc + 1


def exit_lanes(w: Warp, m: np.ndarray) -> None:
    if w.conv and not w.live[~m].any():
        w.live = np.zeros(LANES, bool)
        w.alive = False
        return
    if w.conv:
        w.pc[:] = w.upc
        w.conv = False
    w.live = w.live & ~m
    w.alive = bool(w.live.any())


def run_warp(w: Warp, prog, budget: list[int]):
    """Generator: execute ``w`` until it exits; yields a :class:`Wait` at each blocking point.

    Converged fast path: while every live lane stands at one PC (``w.conv``) the warp keeps a scalar
    PC and executes with the mask :data:`FULL` itself when all 32 lanes live (executors may test
    ``mask is FULL`` to skip masking)."""
    ex, guards, is_branch, instrs = prog.executors, prog.guards, prog.is_branch, prog.instructions
    n = len(ex)
    w.conv, w.upc = True, 0
    executed = 0
    full = bool(w.live.all())
    while True:
        if w.conv:
            if not w.alive:
                break
            p = w.upc
            m = FULL if full else w.live
        else:
            live = w.live
            if not w.alive:
                break
            lp = w.pc[live]
            p = int(lp.min())
            if (lp == p).all():
                w.conv, w.upc = True, p
                full = bool(live.all())
                m = FULL if full else live
            else:
                m = live & (w.pc == p)
        if p >= n:
            raise EmulationError(f"{w.name}: fell off the end of the kernel (pc {p}) without ret/exit")
        executed += 1
        g = guards[p]
        if g is not None and not is_branch[p]:
            row = w.bank[g[0]][g[1]]
            mm = m & (~row if g[2] else row)
            if not mm.any():
                if w.conv:
                    w.upc = p + 1
                else:
                    w.pc[m] = p + 1
                continue
            if mm.all():
                mm = FULL
        else:
            mm = m
        try:
            r = ex[p](w, mm)
        except EmulationError:
            raise
        except Exception as e:  # a bug in an opcode module: say where
            raise EmulationError(f"{w.name}: {type(e).__name__} in {instrs[p].opcode} at {instrs[p].where()}: {e}") \
                from e
        if r is None:
            if w.conv:
                w.upc = p + 1
            else:
                w.pc[m] = p + 1
        elif r is JUMPED:
            if not w.conv:
                full = False
        elif isinstance(r, Wait):
            if w.conv:
                w.upc = p + 1
            else:
                w.pc[m] = p + 1
            w.wait_pc = p
            w.executed += executed
            budget[0] -= executed
            executed = 0
            if budget[0] < 0:
                raise EmulationError(f"{w.name}: instruction budget exhausted (endless loop?) at {instrs[p].where()}")
            yield r
        else:
            raise EmulationError(f"executor of {instrs[p].opcode} returned {r!r}")
    w.executed += executed
    budget[0] -= executed
    w.done = True


def _describe(w: Warp, prog) -> str:
    if w.done:
        return f"{w.name}: exited"
    if w.wait is not None:
        pc = getattr(w, "wait_pc", -1)
        ins = prog.instructions[pc] if 0 <= pc < len(prog.instructions) else None
        what = w.wait.what() if callable(w.wait.what) else w.wait.what
        return f"{w.name}: pc {pc} ({ins.text.strip()[:80] if ins else '?'}) waiting for {what}"
    return f"{w.name}: runnable"


def cta_order(grid: tuple[int, int, int], cluster: tuple[int, int, int], order) -> list[tuple[int, int, int]]:
    """Cluster origins in execution order."""
    return cluster_origins(grid, cluster, order)


def run_launch(launch: Launch, order="forward", max_instructions: int = DEFAULT_MAX_INSTRUCTIONS) -> Launch:
    """Execute ``launch`` (floating-point overflow / invalid results are values, not warnings)."""
    with np.errstate(all="ignore"):
        return _run_launch(launch, order, max_instructions)


def check_launch(launch: Launch) -> None:
    """The launch configuration against the kernel and the device: grid a multiple of the cluster, block =
    ``.reqntid``, the CTA's shared memory (static + dynamic) within the device's opt-in maximum, the cluster
    within the device's maximum cluster size."""
    grid, cl, block = launch.grid, launch.cluster, launch.block
    if any(g % c for g, c in zip(grid, cl)):
        raise EmulationError(f"grid {grid} is not a multiple of the cluster shape {cl}")
    dev = launch.device
    smem = launch.program.shared_size(launch.dyn_smem)
    if smem > dev.max_smem_optin:
        raise EmulationError(f"the kernel needs {smem} bytes of shared memory per CTA (dynamic {launch.dyn_smem}); "
                             f"device profile {dev.name} (sm_{dev.cc[0]}{dev.cc[1]}) allows at most "
                             f"{dev.max_smem_optin}")
    ctas = cl[0] * cl[1] * cl[2]
    if ctas > dev.max_cluster:
        none = " (no thread block clusters)" if dev.max_cluster == 1 else ""
        raise EmulationError(f"cluster shape {cl} ({ctas} CTAs) exceeds device profile {dev.name}'s maximum cluster "
                             f"size {dev.max_cluster}{none}")
    reqntid = launch.program.entry.directives.get("reqntid")
    if reqntid and tuple(reqntid) + (1,) * (3 - len(reqntid)) != tuple(block):
        raise EmulationError(f"launch block {block} does not match the kernel's .reqntid {reqntid}")


def finish_cta(launch: Launch, c: Cta) -> None:
    """After a CTA exited: complete its asynchronous copies, run the exit hooks, count its instructions."""
    finish_cta_async(c)
    if not any(w.ext.get("griddepcontrol.wait") for w in c.warps):  # PDL record (ops/control.py)
        launch.ext["pdl_ctas_without_wait"] = launch.ext.get("pdl_ctas_without_wait", 0) + 1
    for hook in launch.ext.get("cta_exit_hooks", ()):
        hook(c)
    launch.stats["warp_instructions"] = launch.stats.get("warp_instructions", 0) + sum(w.executed for w in c.warps)


def _run_launch(launch: Launch, order, max_instructions: int) -> Launch:
    check_launch(launch)
    launch.stats["warp_instructions"] = 0
    run_clusters(launch, launch.program, [max_instructions], as_schedule(order), run_warp, _describe,
                 lambda c: finish_cta(launch, c))
    return launch


__all__ = ["DEFAULT_MAX_INSTRUCTIONS", "branch", "check_launch", "cta_order", "exit_lanes", "finish_cta", "run_launch",
           "run_warp"]
