"""Opcode module: ``mbarrier.*``, TMA (``cp.async.bulk.*``) and ``tcgen05.*`` on the emulator core, using the pure
semantics of :mod:`.mbarrier`, :mod:`.tma` and :mod:`.tcgen05`.

Timing model (each choice is a legal execution and the strictest one that stays deterministic):

* **TMA loads** read global memory at issue; their shared-memory bytes stay *in flight* (reading them is an
  error) and their ``complete_tx`` is not signalled until a thread waits on that mbarrier (``try_wait`` /
  ``test_wait``): so a consumer that skips the wait reads in-flight bytes and fails. Multicast loads write
  every CTA of the mask at the same offset and signal each CTA's mbarrier at the same offset.
* **TMA stores** (``bulk_group``) read shared memory and write global memory when a
  ``cp.async.bulk.wait_group{.read}`` retires their group (or at CTA exit), the latest legal moment, so a
  kernel that reuses the staging buffer before waiting stores the wrong bytes.
* **tcgen05.mma / tcgen05.cp** are queued per issuing thread and run at its ``tcgen05.commit``, which then
  arrives on the mbarrier (all CTAs of the multicast mask). ``tcgen05.ld`` / ``st`` (``.32x32b``, ``.16x32bx2``)
  move their registers at once; ``mma`` reads A from shared or (``.kind::f16``) tensor memory;
  ``tcgen05.wait::ld/st`` and ``tcgen05.fence::*`` have nothing left to order.
* ``mbarrier.try_wait`` whose phase is incomplete parks the warp until it completes (a legal outcome of the
  suspend-time hint); the core reports a deadlock if it never does.
* ``barrier.cluster.arrive/wait``: every thread of every CTA of the cluster (the core co-schedules them).
* ``.cta_group::2`` (a CTA pair: ranks ``2 i`` and ``2 i + 1`` of the cluster, the even one the leader):
  ``tcgen05.mma .kind::mxf4nvf4`` / ``.kind::f16`` (M = 256) and ``tcgen05.cp`` are issued by the leader and
  read/write both CTAs' shared and tensor memory at the same addresses (:func:`.tcgen05.mma_mxf4nvf4_pair`,
  :func:`.tcgen05.mma_f16_pair`; ``cp`` copies each CTA's shared memory into its own tensor memory);
  ``tcgen05.commit .multicast::cluster`` arrives on every masked CTA's mbarrier; ``alloc`` / ``dealloc`` /
  ``relinquish_alloc_permit`` act on each CTA's own allocator (both CTAs execute them). A ``.cta_group::2`` TMA
  load writes its destination CTA(s) and signals the mbarrier of the destination's pair member with the parity of
  the given barrier's CTA -- CuTe names the leader's mbarrier from both CTAs by clearing bit 24 of a shared
  address (``and.b32 r, r, 0xFEFFFFF8``), which works because the core's shared addresses carry the CTA's cluster
  rank in bits 24+. These forms are checked end to end by nvgemm's 2-CTA sm100 kernel
  (tests/emulator/test_isa_sm100_kernel.py) and the standalone CuTe CTA-pair tile
  (tests/emulator/test_isa_cute_tma_nvfp4.py); kind::f16 pairs by NVIDIA's CuTeDSL tutorial fp16_gemm_1 (run by
  hand, bit-exact; bench/results/emulator_sweep.md). Not modelled (an error): TMA into a peer CTA without
  multicast, ``cta_group::2`` with M = 128 or a non-zero disable-output-lane vector.

At CTA exit: pending TMA stores are performed, pending loads land, every tensor-memory allocation must have
been freed, and tcgen05 operations issued but never committed are an error.
"""

from __future__ import annotations

import re

import numpy as np

from nvgemm.emulator.ptx.errors import EmulationError
from nvgemm.emulator.ptx.machine import PARAM_WINDOW, SHARED_WINDOW, Wait
from nvgemm.emulator.ptx.ops import opcode
from nvgemm.emulator.ptx.ops.memory import L2_LINE, cluster_target, note_pdl, note_prefetch
from nvgemm.emulator.ptx.parser import Operand
from nvgemm.emulator.isa.errors import IsaError
from nvgemm.emulator.isa.mbarrier import Mbarrier
from nvgemm.emulator.isa.tcgen05 import (
    LDST_SHAPES,
    Tcgen05Pipe,
    Tmem,
    TmemAllocator,
    cp_32x128b_warpx4,
    ld,
    mma_f16,
    mma_f16_pair,
    mma_f16_tmem_a,
    mma_mxf4nvf4,
    mma_mxf4nvf4_pair,
    st,
)
from nvgemm.emulator.isa.tma import box_addresses, decode_tensor_map, tile_load, tile_store


def _err(e: Exception, w, ins, lane=None) -> EmulationError:
    return EmulationError(f"{e}, {w.where(ins, lane)}")


def _space(ins) -> str | None:
    for p in ins.parts:
        if p in ("shared", "shared::cta"):
            return "shared"
        if p == "shared::cluster":
            return "shared::cluster"
    return None


def _target(w, space: str | None, addr: int, ins, lane: int):
    """(CTA, shared offset) of an mbarrier / shared address operand (a CTA's shared addresses carry its
    cluster rank in bits 24+, :func:`~nvgemm.emulator.ptx.ops.memory.cluster_target`)."""
    return cluster_target(w, space, addr, lambda j: w.where(ins, lane))


def _barrier(cta, off: int, w, ins, lane, create=False) -> Mbarrier:
    bars = cta.ext.setdefault("mbarrier", {})
    b = bars.get(off)
    if b is None:
        if not create:
            raise EmulationError(f"no mbarrier initialized at shared offset {off:#x} of CTA {cta.ctaid}, "
                                 f"{w.where(ins, lane)}")
        b = bars[off] = Mbarrier(f"mbarrier at shared {off:#x} of CTA {cta.ctaid}")
    return b


def _exit_hook(w) -> None:
    hooks = w.cta.launch.ext.setdefault("cta_exit_hooks", [])
    if _cta_exit not in hooks:
        hooks.append(_cta_exit)


def _land(cta, off: int) -> None:
    """Complete the pending TMA loads signalling the mbarrier at ``off`` of ``cta``."""
    pending = cta.ext.get("tma_loads", {}).pop(off, [])
    bar = cta.ext.get("mbarrier", {}).get(off)
    for tok, nbytes in pending:
        tok.complete()
        if bar is None:
            raise EmulationError(f"TMA load completes on shared {off:#x} of CTA {cta.ctaid}, which holds no mbarrier")
        bar.complete_tx(nbytes)


def _cta_exit(cta) -> None:
    for off in list(cta.ext.get("tma_loads", {})):
        _land(cta, off)
    for grp in cta.ext.get("tma_stores", {}).values():
        for g in grp["groups"] + [grp["open"]]:
            for run in g:
                run()
    st = cta.ext.get("tcgen05")
    if st is not None:
        if any(p.pending for p in st["pipes"].values()):
            raise EmulationError(f"CTA {cta.ctaid} exits with tcgen05.mma/cp issued but never committed")
        st["alloc"].check_exit()


# ------------------------------------------------------------------------------------------------ mbarrier

_MB_MODS = {"shared", "shared::cta", "shared::cluster", "b64", "acquire", "release", "relaxed", "cta", "cluster"}


@opcode("mbarrier")
def _mbarrier(ins, ctx):
    p = ins.parts
    op = p[1]
    space = _space(ins)
    mods = [x for x in p[2:] if x not in _MB_MODS]
    ops = ins.operands
    if op == "init" and not mods:
        ga, gc = ctx.addr(ops[0])[1], ctx.src(ops[1], np.uint32)

        def init(w, m):
            a, c = ga(w), gc(w)
            for ln in np.nonzero(m)[0]:
                cta, off = _target(w, space, a[ln], ins, ln)
                if off % 8:
                    raise EmulationError(f"mbarrier at shared {off:#x} is not 8-byte aligned, {w.where(ins, ln)}")
                try:
                    _barrier(cta, off, w, ins, ln, create=True).init(int(c[ln]))
                except IsaError as e:
                    raise _err(e, w, ins, ln) from None
                cta.shared.write(np.array([off]), np.zeros((1, 8), np.uint8), lambda j: w.where(ins, ln))
        return init
    if op == "inval" and not mods:
        ga = ctx.addr(ops[0])[1]

        def inval(w, m):
            a = ga(w)
            for ln in np.nonzero(m)[0]:
                cta, off = _target(w, space, a[ln], ins, ln)
                _barrier(cta, off, w, ins, ln).inval()
        return inval
    if op in ("arrive", "expect_tx") and mods in ([], ["expect_tx"]):
        expect = op == "expect_tx" or mods == ["expect_tx"]
        arrive = op == "arrive"
        if arrive:
            dst, addr, rest = ops[0], ops[1], ops[2:]
        else:
            dst, addr, rest = None, ops[0], ops[1:]
        if expect and len(rest) != 1:
            raise ctx.unsupported(ins, "expect_tx needs a transaction count")
        gcount = ctx.src(rest[0], np.uint32) if rest else None
        setd = ctx.dst(dst, np.uint64) if dst is not None else None
        if space == "shared::cluster" and dst is not None and dst.kind != "sink":
            raise ctx.unsupported(ins, "a shared::cluster arrive cannot return a state")
        ga = ctx.addr(addr)[1]

        def arrive_ex(w, m):
            a = ga(w)
            cnt = gcount(w) if gcount is not None else None
            tokens = np.zeros(32, np.uint64)
            for ln in np.nonzero(m)[0]:
                cta, off = _target(w, space, a[ln], ins, ln)
                bar = _barrier(cta, off, w, ins, ln)
                try:
                    if expect:
                        bar.expect_tx(int(cnt[ln]))
                    if arrive:
                        tokens[ln] = bar.arrive(1 if (cnt is None or expect) else int(cnt[ln]))
                except IsaError as e:
                    raise _err(e, w, ins, ln) from None
            if setd is not None:
                setd(w, m, tokens)
        return arrive_ex
    if op in ("try_wait", "test_wait") and mods in (["parity"], []):
        parity = mods == ["parity"]
        setp = ctx.dst(ops[0], np.bool_)
        ga = ctx.addr(ops[1])[1]
        gv = ctx.src(ops[2], np.uint64)
        blocking = op == "try_wait"

        def wait_ex(w, m):
            a, v = ga(w), gv(w)
            checks = []
            for ln in np.nonzero(m)[0]:
                cta, off = _target(w, space, a[ln], ins, ln)
                if cta is not w.cta:
                    raise EmulationError(f"{ins.opcode} on a peer CTA's mbarrier, {w.where(ins, ln)}")
                bar = _barrier(cta, off, w, ins, ln)
                checks.append((ln, cta, off, bar, int(v[ln])))

            def done(ck) -> bool:
                ln, cta, off, bar, val = ck
                _land(cta, off)
                try:
                    return bar.try_wait_parity(val & 1) if parity else bar.test_wait(val)
                except IsaError as e:
                    raise _err(e, w, ins, ln) from None

            res = np.zeros(32, bool)
            for ck in checks:
                res[ck[0]] = done(ck)
            if not blocking or all(res[ck[0]] for ck in checks):
                setp(w, m, res)
                return None
            return Wait(lambda: all(done(ck) for ck in checks),
                        lambda: f"{ins.opcode} on {checks[0][3].where} (phase {checks[0][3].phase}, pending "
                                f"{checks[0][3].pending}, tx {checks[0][3].tx})",
                        lambda ww: setp(ww, m, np.ones(32, bool)))
        return wait_ex
    raise ctx.unsupported(ins)


# ------------------------------------------------------------------------------------------------ TMA

_TENSOR_RE = re.compile(r"^\s*([%\w$.#]+)\s*,\s*\{([^}]*)\}\s*$")


def _tensor_operand(ctx, op, ins):
    """(getter of the map's generic address, getters of the int32 coordinates) of ``[map, {c0, ...}]``."""
    if op.kind != "addr" or op.base is None:
        raise ctx.unsupported(ins, f"tensor operand {op.text!r}")
    mt = _TENSOR_RE.match(op.base.text if op.base.kind == "sym" else "")
    if not mt:
        raise ctx.unsupported(ins, f"tensor operand {op.text!r}")
    names = [mt.group(1)] + [c.strip() for c in mt.group(2).split(",")]
    regs = []
    for nm in names:
        if nm not in ctx.program.reg_index:
            raise ctx.unsupported(ins, f"register {nm!r} of the tensor operand is not a plain register")
        regs.append(Operand(kind="reg", name=nm, text=nm))
    return ctx.src(regs[0], np.uint64), [ctx.src(r, np.int32) for r in regs[1:]]


def _read_map(w, addr: int, ins, lane):
    a = int(addr)
    if PARAM_WINDOW <= a < SHARED_WINDOW:
        off = a - PARAM_WINDOW
        raw = w.cta.launch.params[off:off + 128]
        if len(raw) != 128:
            raise EmulationError(f"tensor map at param offset {off} runs past the parameters, {w.where(ins, lane)}")
    else:
        note_pdl(w, "reads", np.array([a], np.uint64))
        raw = bytes(w.cta.launch.gmem.read(np.array([a], np.uint64), 128, lambda j: w.where(ins, lane))[0])
    try:
        return decode_tensor_map(bytes(raw))
    except IsaError as e:
        raise _err(e, w, ins, lane) from None


def _bulk_groups(w):
    st = w.cta.ext.setdefault("tma_stores", {})
    return st.setdefault((w.wid,), {"open": [], "groups": []})


@opcode("cp.async.bulk")
def _bulk(ins, ctx):
    p = ins.parts
    if p[3] == "commit_group" and len(p) == 4:
        def commit(w, m):
            g = _bulk_groups(w)
            g["groups"].append(g["open"])
            g["open"] = []
        return commit
    if p[3] == "wait_group" and len(p) in (4, 5) and (len(p) == 4 or p[4] == "read"):
        n = ins.operands[0].value

        def wait(w, m):
            g = _bulk_groups(w)
            while len(g["groups"]) > n:
                for run in g["groups"].pop(0):
                    run()
        return wait
    if p[3] == "prefetch":
        # cp.async.bulk.prefetch{.tensor}.L2: an L2 hint with no functional effect. Every one is recorded with the
        # bytes it names (``note_prefetch``: Launch.ext["l2_prefetch_lines"]); a tensor prefetch also as its box,
        # (ctaid, global address of the map's tensor, coordinates) in Launch.ext["l2_prefetch_boxes"] (in issue
        # order: a box prefetched twice shows), and one issued before the warp's griddepcontrol.wait for the PDL
        # check
        if len(p) < 5 or p[4] != "tensor":
            if len(ins.operands) != 2:
                raise ctx.unsupported(ins, "cp.async.bulk.prefetch.L2.global takes [address], size")
            _, paddr = ctx.addr(ins.operands[0])
            psize = ctx.src(ins.operands[1], np.uint32)

            def prefetch_bytes(w, m):
                a, n = paddr(w), psize(w)
                for ln in np.nonzero(m)[0]:
                    addrs = np.arange(int(a[ln]), int(a[ln]) + int(n[ln]), L2_LINE, dtype=np.uint64)
                    if int(n[ln]):
                        addrs = np.append(addrs, np.uint64(int(a[ln]) + int(n[ln]) - 1))
                    note_prefetch(w, addrs, lambda _i, ln=ln: w.where(ins, ln))
            return prefetch_bytes
        pmap, pcoords = _tensor_operand(ctx, ins.operands[0], ins)

        def prefetch(w, m):
            mp, cs = pmap(w), [g(w) for g in pcoords]
            for ln in np.nonzero(m)[0]:
                tm = _read_map(w, mp[ln], ins, ln)
                try:
                    addrs = box_addresses(tm, [int(c[ln]) for c in cs])
                except IsaError as e:
                    raise _err(e, w, ins, ln) from None
                if not w.ext.get("griddepcontrol.wait"):
                    note_pdl(w, "prefetches", addrs)
                note_prefetch(w, addrs, lambda _i, ln=ln: w.where(ins, ln))
                w.cta.launch.ext.setdefault("l2_prefetch_boxes", []).append(
                    (tuple(w.cta.ctaid), tm.address, tuple(int(c[ln]) for c in cs)))
        return prefetch
    if p[3] != "tensor":
        raise ctx.unsupported(ins)
    mods = p[4:]
    dims = mods[0]
    if not re.fullmatch(r"[1-5]d", dims) or "tile" not in mods:
        raise ctx.unsupported(ins, "only .tile mode with 1d..5d is modelled")
    pair = "cta_group::2" in mods
    known = {"cta_group::2", dims, "tile", "shared::cta", "shared::cluster", "global", "mbarrier::complete_tx::bytes",
             "multicast::cluster", "L2::cache_hint", "bulk_group"}
    if [x for x in mods if x not in known]:
        raise ctx.unsupported(ins, f"modifiers {[x for x in mods if x not in known]}")
    ops = list(ins.operands)
    if "L2::cache_hint" in mods:
        ops = ops[:-1]
    rank = int(dims[0])
    if mods[1] in ("shared::cta", "shared::cluster") and "global" in mods:  # load
        multicast = "multicast::cluster" in mods
        gdst = ctx.addr(ops[0])[1]
        gmap, gcoords = _tensor_operand(ctx, ops[1], ins)
        gbar = ctx.addr(ops[2])[1]
        gmask = ctx.src(ops[3], np.uint16) if multicast else None
        if len(gcoords) != rank:
            raise ctx.unsupported(ins, f"{rank}d copy with {len(gcoords)} coordinates")
        dspace = "shared::cluster" if mods[1] == "shared::cluster" else "shared"

        def load(w, m):
            _exit_hook(w)
            dst, mp, bar = gdst(w), gmap(w), gbar(w)
            cs = [g(w) for g in gcoords]
            mask = gmask(w) if gmask is not None else None
            for ln in np.nonzero(m)[0]:
                tm = _read_map(w, mp[ln], ins, ln)
                where = lambda j, ln=ln: w.where(ins, ln)  # noqa: E731
                cta0, doff = _target(w, dspace, dst[ln], ins, ln)
                bcta, boff = _target(w, dspace, bar[ln], ins, ln)
                if bcta is not w.cta and not pair:
                    raise EmulationError(f"TMA load signalling a peer CTA's mbarrier needs .cta_group::2, {where(0)}")
                if pair and bcta.rank >> 1 != w.cta.rank >> 1:
                    raise EmulationError(f".cta_group::2 TMA load signalling CTA rank {bcta.rank}, outside the pair "
                                         f"of rank {w.cta.rank}, {where(0)}")
                if cta0 is not w.cta:
                    raise EmulationError(f"TMA load into a peer CTA's shared memory is not modelled, {where(0)}")
                def read_global(a, width, where=where):
                    note_pdl(w, "reads", a.astype(np.uint64))
                    return w.cta.launch.gmem.read(a.astype(np.uint64), width, where)

                try:
                    addrs, data = tile_load(tm, [int(c[ln]) for c in cs], doff, read_global)
                except IsaError as e:
                    raise _err(e, w, ins, ln) from None
                ctas = [w.cta]
                if mask is not None:
                    mk = int(mask[ln])
                    ctas = [c for r, c in enumerate(w.cta.cluster.ctas) if mk >> r & 1]
                for cta in ctas:  # .cta_group::2: each destination signals its pair's CTA of the barrier's parity
                    tok = cta.shared.write_async(addrs, data, where)
                    sig = w.cta.cluster.ctas[(cta.rank & ~1) | (bcta.rank & 1)] if pair else cta
                    sig.ext.setdefault("tma_loads", {}).setdefault(boff, []).append((tok, tm.box_bytes))
        return load
    if mods[1] == "global" and "bulk_group" in mods:  # store
        gmap, gcoords = _tensor_operand(ctx, ops[0], ins)
        gsrc = ctx.addr(ops[1])[1]

        def store(w, m):
            _exit_hook(w)
            mp, src = gmap(w), gsrc(w)
            cs = [g(w) for g in gcoords]
            g = _bulk_groups(w)
            for ln in np.nonzero(m)[0]:
                tm = _read_map(w, mp[ln], ins, ln)
                where = lambda j, ln=ln: w.where(ins, ln)  # noqa: E731
                _, soff = _target(w, "shared", src[ln], ins, ln)
                coords = [int(c[ln]) for c in cs]
                before_wait = not w.ext.get("griddepcontrol.wait")  # the PDL record: at issue

                def run(tm=tm, coords=coords, soff=soff, where=where, ln=ln, before_wait=before_wait):
                    try:
                        ga, data = tile_store(tm, coords, soff, lambda a, width: w.cta.shared.read(a, width, where))
                    except IsaError as e:
                        raise _err(e, w, ins, ln) from None
                    note_pdl(w, "writes", ga.astype(np.uint64), before_wait)
                    gmem = w.cta.launch.gmem
                    gmem.current_warp = w  # the issuing warp's (a PDL stream's race check), whenever it performs
                    gmem.write(ga.astype(np.uint64), data, where)
                g["open"].append(run)
        return store
    raise ctx.unsupported(ins)


# ------------------------------------------------------------------------------------------------ tcgen05


def _tc_state(cta):
    st = cta.ext.get("tcgen05")
    if st is None:
        st = cta.ext["tcgen05"] = {"alloc": TmemAllocator(f"CTA {cta.ctaid}"), "pipes": {}}
        cta.tmem = Tmem(f"CTA {cta.ctaid}")
    return st


def _whole_warp(w, m, ins):
    if not (m == w.live).all():
        raise EmulationError(f"{ins.opcode} needs the whole warp (.sync.aligned), {w.where(ins)}")


@opcode("tcgen05")
def _tcgen05(ins, ctx):
    p = ins.parts
    op = p[1]
    group = "cta_group::2" if "cta_group::2" in p else "cta_group::1"
    ops = ins.operands
    if op in ("wait::ld", "wait::st") or op.startswith("fence::"):
        return lambda w, m: None  # tcgen05.ld/st complete at issue here; nothing is left to order
    if op == "alloc" and p[2:] == [group, "sync", "aligned", "shared::cta", "b32"]:
        gdst, gn = ctx.addr(ops[0])[1], ctx.src(ops[1], np.uint32)

        def alloc(w, m):
            _whole_warp(w, m, ins)
            _exit_hook(w)
            st = _tc_state(w.cta)
            ln = int(np.nonzero(m)[0][0])
            try:
                taddr = st["alloc"].alloc(int(gn(w)[ln]))
            except IsaError as e:
                raise _err(e, w, ins) from None
            if taddr is None:
                raise EmulationError(f"tcgen05.alloc of {int(gn(w)[ln])} columns blocks forever: the CTA holds "
                                     f"{st['alloc'].allocations} and no other CTA shares the SM, {w.where(ins)}")
            _, off = _target(w, "shared", int(gdst(w)[ln]), ins, ln)
            w.cta.shared.write(np.array([off]), np.array([taddr], np.uint32).view(np.uint8).reshape(1, 4),
                               lambda j: w.where(ins))
        return alloc
    if op == "dealloc" and p[2:] == [group, "sync", "aligned", "b32"]:
        ga, gn = ctx.src(ops[0], np.uint32), ctx.src(ops[1], np.uint32)

        def dealloc(w, m):
            _whole_warp(w, m, ins)
            ln = int(np.nonzero(m)[0][0])
            try:
                _tc_state(w.cta)["alloc"].dealloc(int(ga(w)[ln]), int(gn(w)[ln]))
            except IsaError as e:
                raise _err(e, w, ins) from None
        return dealloc
    if op == "relinquish_alloc_permit" and p[2:] == [group, "sync", "aligned"]:
        def relinquish(w, m):
            _whole_warp(w, m, ins)
            _tc_state(w.cta)["alloc"].relinquish_alloc_permit()
        return relinquish
    if op in ("ld", "st") and p[2:4] == ["sync", "aligned"] and len(p) == 7 and p[4] in LDST_SHAPES and \
            p[5][:1] == "x" and p[5][1:].isdigit() and p[6] == "b32":
        return _tcgen05_ld_st(ins, ctx, op, p[4], int(p[5][1:]))
    if op in ("mma", "cp", "commit"):
        return _tcgen05_async(ins, ctx, op)
    raise ctx.unsupported(ins)


def _tcgen05_ld_st(ins, ctx, op, shape, num):
    """``tcgen05.ld.sync.aligned.<shape>.x<num>.b32 {r..}, [taddr]{, immHalfSplitoff}`` and
    ``tcgen05.st.sync.aligned.<shape>.x<num>.b32 [taddr]{, immHalfSplitoff}, {r..}`` (shapes .32x32b and
    .16x32bx2; the whole warp, one uniform address). Both complete at issue here (``tcgen05.wait::ld/st`` then
    have nothing left to wait for)."""
    ops = ins.operands
    split = shape == "16x32bx2"
    if op == "ld":
        vec, at, rest = ops[0], ops[1], ops[2:]
    else:
        vec, at, rest = ops[-1], ops[0], ops[1:-1]
    regs = vec.items if vec.kind == "vec" else ()
    if len(regs) != num:
        raise ctx.unsupported(ins, f".x{num} needs {num} registers")
    if len(rest) != (1 if split else 0) or (split and rest[0].kind != "imm"):
        raise ctx.unsupported(ins, "operands: .16x32bx2 takes one immediate immHalfSplitoff, other shapes none")
    ga = ctx.addr(at)[1]
    half = int(rest[0].value) if split else None
    if op == "ld":
        sets = [ctx.dst(d, np.uint32) for d in regs]
    else:
        gets = [ctx.src(r, np.uint32) for r in regs]

    def run(w, m):
        _whole_warp(w, m, ins)
        a = ga(w)[m]
        if (a != a[0]).any():
            raise EmulationError(f"tcgen05.{op} with a non-uniform address, {w.where(ins)}")
        if w.cta.tmem is None:
            raise EmulationError(f"tcgen05.{op} before any tcgen05.alloc, {w.where(ins)}")
        try:
            if op == "ld":
                vals = ld(w.cta.tmem, shape, int(a[0]), w.wid, num, half)
                for i, s in enumerate(sets):
                    s(w, m, vals[:, i])
            else:
                st(w.cta.tmem, shape, int(a[0]), w.wid, np.stack([g(w) for g in gets], axis=1), half)
        except IsaError as e:
            raise _err(e, w, ins) from None
    return run


def _pipe(w, ln) -> Tcgen05Pipe:
    return _tc_state(w.cta)["pipes"].setdefault((w.wid, int(ln)), Tcgen05Pipe())


def _pair(w, ins) -> list:
    """(leader, peer) of a ``.cta_group::2`` operation: issued by the even-rank CTA of the pair."""
    cl = w.cta.cluster
    if w.cta.rank & 1 or w.cta.rank + 1 >= len(cl.ctas):
        raise EmulationError(f"{ins.opcode} .cta_group::2 issued by CTA rank {w.cta.rank} of a cluster of "
                             f"{len(cl.ctas)}: only the even-rank leader of a CTA pair may issue it, {w.where(ins)}")
    peer = cl.ctas[w.cta.rank + 1]
    _tc_state(peer)
    return [w.cta, peer]


def _tcgen05_async(ins, ctx, op):
    p = ins.parts
    ops = ins.operands
    if op == "cp":
        if p[2:] not in (["cta_group::1", "32x128b", "warpx4"], ["cta_group::2", "32x128b", "warpx4"]):
            raise ctx.unsupported(ins, "only .cta_group::{1,2}.32x128b.warpx4 is modelled")
        pair = p[2] == "cta_group::2"
        ga, gd = ctx.addr(ops[0])[1], ctx.src(ops[1], np.uint64)

        def cp(w, m):
            a, d = ga(w), gd(w)
            ctas = _pair(w, ins) if pair else [w.cta]
            for ln in np.nonzero(m)[0]:
                taddr, desc = int(a[ln]), int(d[ln])
                where = lambda j, ln=ln: w.where(ins, int(ln))  # noqa: E731

                def run(taddr=taddr, desc=desc, where=where, ln=ln):
                    for cta in ctas:  # .cta_group::2: each CTA's shared memory into its own tensor memory
                        try:
                            cp_32x128b_warpx4(cta.tmem, lambda x, width, c=cta: c.shared.read(x, width, where), taddr,
                                              desc)
                        except IsaError as e:
                            raise _err(e, w, ins, int(ln)) from None
                _pipe(w, ln).issue(run)
        return cp
    if op == "mma":
        kind = next((x[6:] for x in p if x.startswith("kind::")), None)
        pair = "cta_group::2" in p
        if pair and kind not in ("mxf4nvf4", "f16"):
            raise ctx.unsupported(ins, ".cta_group::2 is modelled for .kind::mxf4nvf4 and .kind::f16")
        rest = [x for x in p[2:] if x not in ("cta_group::1", "cta_group::2", f"kind::{kind}", "collector::a::discard",
                                              "collector::a::fill", "collector::a::use", "collector::a::lastuse")]
        scaled = kind == "mxf4nvf4"
        if kind not in ("mxf4nvf4", "f16") or rest != (["block_scale", "block16"] if scaled else []):
            raise ctx.unsupported(ins, "modelled: .kind::mxf4nvf4.block_scale.block16 and .kind::f16")
        a_tmem = ops[1].kind == "addr"
        if a_tmem and (scaled or pair):
            raise ctx.unsupported(ins, "A from tensor memory is modelled for .cta_group::1 .kind::f16")
        gd = ctx.addr(ops[0])[1]
        gadesc = ctx.addr(ops[1])[1] if a_tmem else ctx.src(ops[1], np.uint64)
        gbdesc, gidesc = ctx.src(ops[2], np.uint64), ctx.src(ops[3], np.uint32)
        if scaled:
            gsfa, gsfb, gen = ctx.addr(ops[4])[1], ctx.addr(ops[5])[1], ctx.src(ops[6], np.bool_)
            if len(ops) != 7:
                raise ctx.unsupported(ins, "disable-output-lane / scale-input-d operands are not modelled")
        else:
            gmask = None
            rest = ops[4:]
            if rest and rest[0].kind == "vec":
                if len(rest[0].items) != (8 if pair else 4):
                    raise ctx.unsupported(ins, "disable-output-lane must be 4 registers (8 for cta_group::2)")
                gmask = [ctx.src(x, np.uint32) for x in rest[0].items]
                rest = rest[1:]
            if len(rest) != 1:
                raise ctx.unsupported(ins, "scale-input-d is not modelled")
            gen = ctx.src(rest[0], np.bool_)

        def mma(w, m):
            vals = [g(w) for g in (gd, gadesc, gbdesc, gidesc)]
            sf = (gsfa(w), gsfb(w)) if scaled else None
            masks = [g(w) for g in gmask] if (not scaled and gmask is not None) else None
            en = gen(w)
            for ln in np.nonzero(m)[0]:
                d, ad, bd, idesc = (int(v[ln]) for v in vals)
                enable = bool(en[ln])
                sfa, sfb = (int(sf[0][ln]), int(sf[1][ln])) if scaled else (0, 0)
                dis = [int(x[ln]) for x in masks] if masks is not None else None
                where = lambda j, ln=ln: w.where(ins, int(ln))  # noqa: E731

                ctas = _pair(w, ins) if pair else None

                def run(d=d, ad=ad, bd=bd, idesc=idesc, enable=enable, sfa=sfa, sfb=sfb, where=where, ln=ln,
                        dis=dis, ctas=ctas):
                    reader = lambda x, width: w.cta.shared.read(x, width, where)  # noqa: E731
                    try:
                        if ctas is not None:
                            readers = [lambda x, width, c=c: c.shared.read(x, width, where) for c in ctas]
                            if scaled:
                                mma_mxf4nvf4_pair([c.tmem for c in ctas], readers, d, ad, bd, idesc, sfa, sfb, enable)
                            else:
                                mma_f16_pair([c.tmem for c in ctas], readers, d, ad, bd, idesc, enable,
                                             disable_output_lane=dis)
                        elif scaled:
                            mma_mxf4nvf4(w.cta.tmem, reader, d, ad, bd, idesc, sfa, sfb, enable)
                        elif a_tmem:
                            mma_f16_tmem_a(w.cta.tmem, reader, d, ad & 0xFFFFFFFF, bd, idesc, enable,
                                           disable_output_lane=dis)
                        else:
                            mma_f16(w.cta.tmem, reader, d, ad, bd, idesc, enable, disable_output_lane=dis)
                    except IsaError as e:
                        raise _err(e, w, ins, int(ln)) from None
                _pipe(w, ln).issue(run)
        return mma
    # commit
    mods = p[2:]
    multicast = "multicast::cluster" in mods
    if [x for x in mods if x not in ("cta_group::1", "cta_group::2", "mbarrier::arrive::one", "shared::cluster", "multicast::cluster",
                                     "b64")]:
        raise ctx.unsupported(ins)
    ga = ctx.addr(ops[0])[1]
    gmask = ctx.src(ops[1], np.uint16) if multicast else None

    def commit(w, m):
        a = ga(w)
        mask = gmask(w) if gmask is not None else None
        for ln in np.nonzero(m)[0]:
            cta0, off = _target(w, "shared::cluster", a[ln], ins, ln)
            if mask is not None:
                mk = int(mask[ln])
                targets = [c for r, c in enumerate(w.cta.cluster.ctas) if mk >> r & 1]
            else:
                targets = [cta0]

            def arrive(targets=targets, off=off, ln=ln):
                for cta in targets:
                    try:
                        _barrier(cta, off, w, ins, ln).arrive(1)
                    except IsaError as e:
                        raise _err(e, w, ins, int(ln)) from None
            _pipe(w, ln).commit(arrive)
    return commit


# ------------------------------------------------------------------------------------------------ cluster barrier


_ST_ASYNC_TYPES = {"b32": np.uint32, "b64": np.uint64, "u32": np.uint32, "s32": np.int32, "u64": np.uint64,
                   "s64": np.int64, "f32": np.float32, "f64": np.float64}


@opcode("st.async")
def _st_async(ins, ctx):
    """``st.async{.weak}{.shared::cluster}.mbarrier::complete_tx::bytes{.v2,.v4}.type [a], b, [mbar]`` (PTX ISA
    "st.async"): a store into the shared memory of a CTA of the cluster that performs complete-tx of its size on
    the mbarrier ``mbar``, which must be in the same CTA as ``a``. Modelled as the earliest legal completion: the
    bytes are written and the transaction completed when the store issues."""
    p = ins.parts
    mods, t = p[2:-1], p[-1]
    if "mbarrier::complete_tx::bytes" not in mods or t not in _ST_ASYNC_TYPES or \
            any(x not in ("weak", "shared::cluster", "mbarrier::complete_tx::bytes", "v2", "v4") for x in mods):
        raise ctx.unsupported(ins, "st.async{.weak}{.shared::cluster}.mbarrier::complete_tx::bytes{.v2,.v4}.<32/64-bit>")
    vec = 4 if "v4" in mods else 2 if "v2" in mods else 1
    dt = np.dtype(_ST_ASYNC_TYPES[t])
    ops = ins.operands
    srcs = list(ops[1].items) if ops[1].kind == "vec" else [ops[1]]
    if len(ops) != 3 or len(srcs) != vec:
        raise ctx.unsupported(ins, f"operands [a], b (x{vec}), [mbar]")
    ga, gm = ctx.addr(ops[0])[1], ctx.addr(ops[2])[1]
    gets = [ctx.src(x, dt) for x in srcs]
    nbytes = dt.itemsize * vec

    def ex(w, m):
        a, mb = ga(w), gm(w)
        vals = np.ascontiguousarray(np.stack([g(w) for g in gets], axis=1).astype(dt, copy=False)).view(np.uint8)
        for ln in np.nonzero(m)[0]:
            cta, off = _target(w, "shared::cluster", int(a[ln]), ins, ln)
            bcta, boff = _target(w, "shared::cluster", int(mb[ln]), ins, ln)
            if bcta is not cta:
                raise EmulationError(f"st.async: the mbarrier (CTA rank {bcta.rank}) must be in the destination "
                                     f"CTA (rank {cta.rank}), {w.where(ins, int(ln))}")
            cta.shared.write(np.array([off]), vals[ln:ln + 1], lambda j, ln=ln: w.where(ins, int(ln)))
            try:
                _barrier(bcta, boff, w, ins, ln).complete_tx(nbytes)
            except IsaError as e:
                raise _err(e, w, ins, int(ln)) from None

    return ex


@opcode("barrier.cluster")
def _barrier_cluster(ins, ctx):
    """``barrier.cluster.arrive{.release,.relaxed}{.aligned}`` / ``barrier.cluster.wait{.acquire}{.aligned}``
    (PTX ISA 9.7.13.4): every thread of every CTA of the cluster arrives; ``wait`` blocks until all have
    arrived in the thread's current phase. Modelled per whole warp (a partial warp is an error)."""
    p = ins.parts
    op = p[2] if len(p) > 2 else ""
    mods = set(p[3:])
    if op == "arrive" and mods <= {"release", "relaxed", "aligned"}:
        def arrive(w, m):
            _whole_warp(w, m, ins)
            cl = w.cta.cluster
            st = cl.ext.setdefault("barrier.cluster", {"count": 0, "gen": 0})
            if "barrier.cluster" in w.ext:
                raise EmulationError(f"barrier.cluster.arrive twice without a wait, {w.where(ins)}")
            w.ext["barrier.cluster"] = st["gen"]
            st["count"] += int(m.sum())
            total = sum(int(x.live.sum()) for c in cl.ctas for x in c.warps)
            if st["count"] == total:
                st["count"], st["gen"] = 0, st["gen"] + 1
        return arrive
    if op == "wait" and mods <= {"acquire", "aligned"}:
        def wait(w, m):
            _whole_warp(w, m, ins)
            gen = w.ext.pop("barrier.cluster", None)
            if gen is None:
                raise EmulationError(f"barrier.cluster.wait without a preceding arrive, {w.where(ins)}")
            st = w.cta.cluster.ext["barrier.cluster"]
            if st["gen"] > gen:
                return None
            return Wait(lambda: st["gen"] > gen, lambda: f"barrier.cluster ({st['count']} threads arrived)")
        return wait
    raise ctx.unsupported(ins)
