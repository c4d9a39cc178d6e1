"""Control flow and warp / CTA synchronisation: ``bra``, ``ret``, ``exit``, ``bar.sync`` /
``barrier.sync`` / ``bar.arrive``, ``shfl.sync``, ``vote.sync``, ``elect.sync``, ``activemask``,
``griddepcontrol``, ``nanosleep`` (PTX ISA "Control Flow Instructions", "Parallel Synchronization and
Communication Instructions").

* ``bra`` with a divergent guard splits the warp (per-lane PCs); the min-PC scheduler reconverges it.
* ``bar.sync a{, b}`` (= ``barrier.sync.aligned``): every live lane of the warp must execute it
  together (``.aligned``), else an error; it completes when ``b`` (default: every thread of the CTA)
  threads arrived; a warp that exits before a barrier the others wait on is reported as a deadlock.
  ``barrier.sync`` without ``.aligned`` counts arriving threads even from a divergent warp.
* ``shfl.sync`` (ISA pseudocode): ``segmask = c[12:8]``, ``maxLane = (lane & segmask) | (c[4:0] &
  ~segmask)``, ``minLane = lane & segmask``; idx ``j = minLane | (b[4:0] & ~segmask)``, up ``j = lane -
  b``, down ``j = lane + b``, bfly ``j = lane ^ b``; out-of-range ``j`` reads the lane's own value and
  clears ``p``. Every lane of ``membermask`` must execute it, and reading a lane that does not is an
  error (undefined on hardware).
* ``griddepcontrol.wait`` / ``launch_dependents`` (PDL): a single launch runs alone, so both only record
  that they ran (``Launch.stats``); in a PDL stream (:mod:`nvgemm.emulator.ptx.pdl`) ``launch_dependents``
  marks the CTA as triggered and ``wait`` blocks until the prerequisite grids completed. Global accesses a
  warp makes before its ``wait`` are collected per allocation in ``Launch.ext["pdl_pre_wait_reads" / "pdl_pre_wait_writes"]`` (what a
  PDL kernel may touch while its predecessor still runs), bulk tensor (TMA) loads and stores included,
  and its TMA L2 prefetches in ``Launch.ext["pdl_pre_wait_prefetches"]``
  (:func:`nvgemm.emulator.ptx.ops.memory.note_pdl`). ``Launch.ext["pdl_signals_before_wait"]`` counts the
  ``launch_dependents`` a warp executes before its own ``wait`` and ``Launch.ext["pdl_ctas_without_wait"]``
  the CTAs that exit with no thread past a ``wait`` (:func:`nvgemm.emulator.ptx.interp.finish_cta`): with
  both 0 every CTA counts for its dependents only after its wait returned, i.e. after the grid's
  prerequisite completed -- what lets a dependent read that prerequisite's output before its own wait.
* ``setmaxnreg.{inc,dec}.sync.aligned.u32 n`` changes the warp's per-thread register budget (a resource
  hint): the emulator's register file is unbounded, so it checks what the ISA requires of the operand (an
  immediate in 24..256, a multiple of 8) and that the whole warp executes it, and counts it in
  ``Launch.stats``.
"""

from __future__ import annotations

import numpy as np

from nvgemm.emulator.ptx.errors import EmulationError
from nvgemm.emulator.ptx.interp import branch, exit_lanes
from nvgemm.emulator.ptx.machine import FULL, JUMPED, LANE_IDS, LANES, Wait
from nvgemm.emulator.ptx.ops import opcode


@opcode("bra", "brx")
def _bra(ins, ctx):
    if ins.parts[0] == "brx" or any(p not in ("uni",) for p in ins.parts[1:]):
        raise ctx.unsupported(ins)
    target = ctx.label(ins.operands[0])
    guard = None
    if ins.pred:
        bank, i = ctx.program.reg_index[ins.pred]
        guard = (bank, i, ins.pred_neg)
    pc = ins.pc
    uni = "uni" in ins.parts

    def ex(w, m):
        if guard is None:
            taken = m
        else:
            row = w.bank[guard[0]][guard[1]]
            taken = m & (~row if guard[2] else row)
            if uni and taken[m].any() and not taken[m].all():
                raise EmulationError(f"bra.uni with a non-uniform guard, {w.where(ins)}")
        branch(w, m, taken, target, pc)
        return JUMPED

    ex.handles_guard = True
    return ex


@opcode("ret", "exit")
def _ret(ins, ctx):
    if len(ins.parts) > 1 and ins.parts[1:] != ["uni"]:
        raise ctx.unsupported(ins)

    def ex(w, m):
        exit_lanes(w, m)
        return JUMPED

    return ex


def _barrier_state(cta, bid: int, expected: int, w, ins):
    st = cta.ext.setdefault("bar", {})
    s = st.get(bid)
    if s is None:
        s = st[bid] = {"count": 0, "gen": 0, "expected": expected, "warps": set()}
    if s["count"] and s["expected"] != expected:
        raise EmulationError(f"barrier {bid}: thread count {expected} differs from {s['expected']} of the warps "
                             f"already waiting, {w.where(ins)}")
    s["expected"] = expected
    return s


@opcode("bar", "barrier")
def _bar(ins, ctx):
    parts = ins.parts[1:]
    kind = next((p for p in parts if p in ("sync", "arrive", "red")), None)
    extra = [p for p in parts if p not in ("sync", "arrive", "cta", "aligned")]
    if kind in (None, "red") or extra:
        raise ctx.unsupported(ins)
    aligned = ins.parts[0] == "bar" or "aligned" in parts
    ga = ctx.src(ins.operands[0], np.uint32)
    gb = ctx.src(ins.operands[1], np.uint32) if len(ins.operands) > 1 else None
    arrive_only = kind == "arrive"
    if arrive_only and gb is None:
        raise ctx.unsupported(ins, "bar.arrive needs a thread count")

    def ex(w, m):
        if aligned and not (m == w.live).all():
            raise EmulationError(f"divergent {ins.opcode}: lanes {np.nonzero(w.live & ~m)[0].tolist()} of the warp "
                                 f"are elsewhere (.aligned needs the whole warp), {w.where(ins)}")
        ids = ga(w)[m]
        if (ids != ids[0]).any():
            raise EmulationError(f"{ins.opcode} with a non-uniform barrier id, {w.where(ins)}")
        bid = int(ids[0])
        nthreads = int(np.prod(w.cta.launch.block))
        expected = int(gb(w)[m][0]) if gb is not None else nthreads
        if expected % 32 or expected > nthreads or expected <= 0:
            raise EmulationError(f"{ins.opcode}: thread count {expected} must be a positive multiple of 32 and at "
                                 f"most the CTA size {nthreads}, {w.where(ins)}")
        s = _barrier_state(w.cta, bid, expected, w, ins)
        s["count"] += int(m.sum())
        gen = s["gen"]
        if s["count"] > expected:
            raise EmulationError(f"barrier {bid}: {s['count']} threads arrived for a count of {expected}, "
                                 f"{w.where(ins)}")
        if s["count"] == expected:
            s["count"] = 0
            s["gen"] += 1
            return None
        if arrive_only:
            return None
        return Wait(lambda: s["gen"] > gen,
                    lambda: f"barrier {bid} ({s['count']}/{s['expected']} threads arrived)")

    return ex


def _check_members(w, ins, m, members: np.ndarray):
    if (members & ~m).any():
        missing = np.nonzero(members & ~m)[0].tolist()
        raise EmulationError(f"{ins.opcode}: lanes {missing} of membermask do not execute it together, "
                             f"{w.where(ins)}")


@opcode("shfl")
def _shfl(ins, ctx):
    parts = ins.parts[1:]
    if parts[0] != "sync" or len(parts) != 3 or parts[2] != "b32" or parts[1] not in ("idx", "up", "down", "bfly"):
        raise ctx.unsupported(ins)
    mode = parts[1]
    d, a, b, c, mm = ins.operands
    if d.kind == "dual":
        sd, sp = ctx.dst(d.items[0], np.uint32), ctx.dst(d.items[1], np.bool_)
    else:
        sd, sp = ctx.dst(d, np.uint32), None
    ga, gb, gc, gm = (ctx.src(x, np.uint32) for x in (a, b, c, mm))

    def ex(w, m):
        mask = gm(w)[m]
        if (mask != mask[0]).any():
            raise EmulationError(f"shfl.sync: lanes disagree on membermask, {w.where(ins)}")
        mem = _member_lanes(int(mask[0]))
        _check_members(w, ins, m, mem)
        lane = LANE_IDS.astype(np.int64)
        bv = (gb(w) & np.uint32(31)).astype(np.int64)
        cv = gc(w).astype(np.int64)
        seg = (cv >> 8) & 31
        clamp = cv & 31
        max_lane = (lane & seg) | (clamp & ~seg)
        min_lane = lane & seg
        if mode == "idx":
            j = min_lane | (bv & ~seg)
            ok = j <= max_lane
        elif mode == "up":
            j = lane - bv
            ok = j >= max_lane
        elif mode == "down":
            j = lane + bv
            ok = j <= max_lane
        else:
            j = lane ^ bv
            ok = j <= max_lane
        j = np.where(ok, j, lane)
        src = ga(w)
        jj = j[m]
        if not m[jj].all():
            bad = int(np.nonzero(m)[0][np.argmax(~m[jj])])
            raise EmulationError(f"shfl.sync reads lane {int(j[bad])}, which does not execute it (undefined), "
                                 f"{w.where(ins, bad)}")
        sd(w, m, src[j])
        if sp is not None:
            sp(w, m, ok)

    return ex


def _member_lanes(mask: int) -> np.ndarray:
    return ((mask >> np.arange(LANES)) & 1).astype(bool)


@opcode("vote")
def _vote(ins, ctx):
    parts = ins.parts[1:]
    if parts[:1] != ["sync"] or len(parts) != 3:
        raise ctx.unsupported(ins)
    mode, t = parts[1], parts[2]
    d, a, mm = ins.operands
    ga, gm = ctx.src(a, np.bool_), ctx.src(mm, np.uint32)
    if mode == "ballot" and t == "b32":
        sd = ctx.dst(d, np.uint32)
    elif mode in ("all", "any", "uni") and t == "pred":
        sd = ctx.dst(d, np.bool_)
    else:
        raise ctx.unsupported(ins)

    def ex(w, m):
        mem = _member_lanes(int(gm(w)[m][0]))
        _check_members(w, ins, m, mem)
        p = ga(w) & mem
        if mode == "ballot":
            v = np.uint32(int((p.astype(np.uint64) << np.arange(LANES, dtype=np.uint64)).sum()))
            sd(w, m, np.full(LANES, v, np.uint32))
        elif mode == "all":
            sd(w, m, np.full(LANES, bool(p[mem].all())))
        elif mode == "any":
            sd(w, m, np.full(LANES, bool(p[mem].any())))
        else:
            sd(w, m, np.full(LANES, bool(p[mem].all() or not p[mem].any())))

    return ex


@opcode("redux")
def _redux(ins, ctx):
    """``redux.sync.op.type d, a, membermask`` (PTX ISA "redux.sync"): the reduction of ``a`` over the member
    lanes, given to each of them. Integer: ``.add`` (wrapping) / ``.min`` / ``.max`` on ``.u32`` / ``.s32``,
    ``.and`` / ``.or`` / ``.xor`` on ``.b32``. ``.f32`` (sm_100a): ``.min`` / ``.max`` with optional ``.abs``
    (of every input) and ``.NaN`` (a NaN input makes the result the canonical NaN; without it NaN inputs are
    ignored, and the result is NaN only when every input is), ``-0.0`` below ``+0.0``."""
    from nvgemm.emulator.ptx.ops.fp import fminmax, to_bits  # lazy: fp imports this module's registry peers

    parts = ins.parts[1:]
    if parts[:1] != ["sync"] or len(parts) < 3:
        raise ctx.unsupported(ins)
    op, t, mods = parts[1], parts[-1], parts[2:-1]
    if t == "f32":
        if op not in ("min", "max") or any(x not in ("abs", "NaN") for x in mods):
            raise ctx.unsupported(ins)
    elif mods or not ((op in ("add", "min", "max") and t in ("u32", "s32")) or
                      (op in ("and", "or", "xor") and t == "b32")):
        raise ctx.unsupported(ins)
    dt = {"u32": np.uint32, "s32": np.int32, "b32": np.uint32, "f32": np.float32}[t]
    d, a, mm = ins.operands
    ga, gm, sd = ctx.src(a, dt), ctx.src(mm, np.uint32), ctx.dst(d, dt)

    def ex(w, m):
        mask = gm(w)[m]
        if (mask != mask[0]).any():
            raise EmulationError(f"redux.sync: lanes disagree on membermask, {w.where(ins)}")
        mem = _member_lanes(int(mask[0]))
        _check_members(w, ins, m, mem)
        v = ga(w)[mem]
        if t == "f32":
            x = v.astype(np.float64)
            if "abs" in mods:
                x = np.abs(x)
            r = x[0]
            for y in x[1:]:
                r = fminmax(op, np.array([r]), np.array([y]), "NaN" in mods)[0]
            out = to_bits(np.array([r]), "f32").view(np.float32)[0]
        elif op == "add":
            out = np.array(int(v.astype(np.int64).sum()) & 0xFFFFFFFF, np.uint32).view(dt)
        elif op in ("min", "max"):
            out = v.min() if op == "min" else v.max()
        else:
            f = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[op]
            out = f.reduce(v)
        sd(w, m, np.full(LANES, out, dt))

    return ex


@opcode("elect")
def _elect(ins, ctx):
    if ins.parts[1:] != ["sync"]:
        raise ctx.unsupported(ins)
    d, mm = ins.operands
    gm = ctx.src(mm, np.uint32)
    if d.kind == "dual":
        sd, sp = ctx.dst(d.items[0], np.uint32), ctx.dst(d.items[1], np.bool_)
    else:
        sd, sp = ctx.dst(d, np.uint32), None

    def ex(w, m):
        mem = _member_lanes(int(gm(w)[m][0]))
        _check_members(w, ins, m, mem)
        act = np.nonzero(mem & m)[0]
        if not len(act):
            raise EmulationError(f"elect.sync with an empty membermask, {w.where(ins)}")
        leader = int(act[0])
        sd(w, m, np.full(LANES, leader, np.uint32))
        if sp is not None:
            sp(w, m, LANE_IDS == leader)

    return ex


@opcode("activemask")
def _activemask(ins, ctx):
    sd = ctx.dst(ins.operands[0], np.uint32)

    def ex(w, m):
        v = int((m.astype(np.uint64) << np.arange(LANES, dtype=np.uint64)).sum())
        sd(w, m, np.full(LANES, v, np.uint32))

    return ex


@opcode("griddepcontrol")
def _gdc(ins, ctx):
    if ins.parts[1:] not in (["wait"], ["launch_dependents"]):
        raise ctx.unsupported(ins)
    key = "griddepcontrol." + ins.parts[1]
    wait = ins.parts[1] == "wait"

    def ex(w, m):
        launch = w.cta.launch
        st = launch.stats
        st[key] = st.get(key, 0) + 1
        if not wait:
            w.ext[key] = True
            if not w.ext.get("griddepcontrol.wait"):  # signalled before this warp's own wait (program order)
                launch.ext["pdl_signals_before_wait"] = launch.ext.get("pdl_signals_before_wait", 0) + 1
            w.cta.ext["pdl_triggered"] = True  # the CTA's first launch_dependents counts; repeats have no effect
            if "pdl_wait_ready" in launch.ext:  # in a PDL stream: a scheduling point (dependents may start)
                return Wait(lambda: True, "griddepcontrol.launch_dependents")
            return None
        ready = launch.ext.get("pdl_wait_ready")  # set by a PDL stream (ptx/pdl.py): the prerequisite grids
        if ready is None or ready():
            w.ext[key] = True
            return None
        return Wait(ready, "griddepcontrol.wait: the prerequisite grid to complete",
                    lambda ww: ww.ext.__setitem__(key, True))

    return ex


@opcode("setmaxnreg")
def _setmaxnreg(ins, ctx):
    p = ins.parts
    if len(p) != 5 or p[1] not in ("inc", "dec") or p[2:] != ["sync", "aligned", "u32"]:
        raise ctx.unsupported(ins, "setmaxnreg.{inc,dec}.sync.aligned.u32")
    op = ins.operands[0] if len(ins.operands) == 1 else None
    if op is None or op.kind != "imm":
        raise ctx.unsupported(ins, "the register count must be an immediate")
    n = int(ctx.imm_array(op, np.uint32)[0])
    if not 24 <= n <= 256 or n % 8:
        raise EmulationError(f"setmaxnreg {n}: the PTX ISA requires 24..256 and a multiple of 8 at {ins.where()}")
    key = "setmaxnreg." + p[1]

    def ex(w, m):
        if m is not FULL and not m.all():
            raise EmulationError(f"setmaxnreg executed by a partial warp, {w.where(ins)}")
        st = w.cta.launch.stats
        st[key] = st.get(key, 0) + 1

    return ex


@opcode("nanosleep")
def _nanosleep(ins, ctx):
    return lambda w, m: None
