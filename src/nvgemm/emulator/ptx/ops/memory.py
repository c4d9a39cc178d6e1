"""Memory opcodes: ``ld``, ``st``, ``cp.async`` (+ ``commit_group`` / ``wait_group`` / ``wait_all``),
``atom``, ``red``, ``fence`` / ``membar``, ``createpolicy``, ``cvta``, ``prefetch`` (PTX ISA "Data
Movement and Conversion Instructions", "Parallel Synchronization and Communication Instructions").

Memory model: the emulator executes one sequentially consistent interleaving, so fences and
``.sem``/``.scope`` qualifiers are accepted and have no further effect, and cache operators
(``.ca``, ``.cg``, ``.nc``, ``L2::cache_hint``, eviction priorities) are performance hints only. ``prefetch``
has no functional effect either, but its global L2 forms are recorded (:func:`note_prefetch`): a prefetch of the
wrong bytes is a performance bug, one outside every allocation an error.

``cp.async`` (non-bulk): the source bytes (``src-size`` of them; the rest of ``cp-size`` is zero-fill,
``src-size`` 0 reads nothing) are read at issue and bounds-checked then; the destination bytes are
*in flight* until a ``cp.async.wait_group N`` / ``wait_all`` executed by the issuing thread completes
the group (per thread: every group but its newest N), and reading or overwriting them before that
is an error. Copies still pending when a CTA exits are completed and counted in
``Launch.stats["cp_async_unwaited"]``.

Addresses: ``.shared`` / ``.shared::cta`` operands are offsets in the CTA's shared window;
a CTA's shared addresses are ``(rank << CLUSTER_RANK_SHIFT) | offset`` with ``rank`` its
``%cluster_ctarank`` (as on hardware, where CuTe reaches the pair leader's mbarrier by clearing bit 24);
``.shared::cluster`` addresses name any CTA of the cluster that way, ``mapa`` swaps the rank bits; generic
addresses are global unless they fall in the shared / param windows (``cvta``).
"""

from __future__ import annotations

import numpy as np

from nvgemm.emulator.ptx.errors import EmulationError
from nvgemm.emulator.ptx.machine import CLUSTER_RANK_SHIFT, FULL, LANES, PARAM_WINDOW, SHARED_WINDOW, AsyncWrite

ALL_LANES = np.arange(LANES)
from nvgemm.emulator.ptx.program import TYPE_DTYPE
from nvgemm.emulator.ptx.ops import opcode

_SPACES = {"global", "shared", "shared::cta", "shared::cluster", "param", "param::entry", "param::func", "local",
           "const"}
_HINTS = {"ca", "cg", "cs", "lu", "cv", "nc", "wb", "wt", "L1::no_allocate", "L1::evict_normal", "L1::evict_unchanged",
          "L1::evict_first", "L1::evict_last", "L2::evict_first", "L2::evict_last", "L2::evict_normal",
          "L2::64B", "L2::128B", "L2::256B", "L2::cache_hint", "weak", "relaxed", "acquire", "release", "volatile",
          "mmio", "cta", "cluster", "gpu", "sys", "unified"}
_VEC = {"v2": 2, "v4": 4, "v8": 8}


def _where(w, ins, lanes):
    return lambda j: w.where(ins, int(lanes[j]))


def _classify(ins, ctx, allowed_extra=frozenset()):
    space, vec, hints = None, 1, []
    for p in ins.parts[1:-1]:
        if p in _SPACES:
            space = p
        elif p in _VEC:
            vec = _VEC[p]
        elif p in _HINTS or p in allowed_extra:
            hints.append(p)
        else:
            raise ctx.unsupported(ins, f"modifier .{p}")
    t = ins.parts[-1]
    if t not in TYPE_DTYPE or t == "pred":
        raise ctx.unsupported(ins, f"type .{t}")
    if space in ("local", "const"):
        raise ctx.unsupported(ins, f"state space .{space}")
    return space, vec, t, hints


def shared_target(w, space: str | None, addrs: np.ndarray, where):
    """(SharedMemory, offsets) of shared / shared::cluster / generic-shared addresses of the executing CTA.

    The shared::cta window of CTA ``rank`` sits at ``rank << CLUSTER_RANK_SHIFT`` inside the shared::cluster
    window (PTX ISA: the shared::cta window is contained in the shared::cluster window), so a CTA's own
    shared addresses carry its rank in bits 24+; ``.shared::cta`` accesses must name the executing CTA.
    """
    a = addrs.astype(np.uint64)
    if space is None:  # generic: inside the shared window, which covers the cluster's CTAs
        a = a - np.uint64(SHARED_WINDOW)
    hi = (a >> np.uint64(CLUSTER_RANK_SHIFT)).astype(np.int64)
    lo = (a & np.uint64((1 << CLUSTER_RANK_SHIFT) - 1)).astype(np.int64)
    if hi.size and (hi != hi[0]).any():
        raise EmulationError(f"one shared access spans several CTAs, {where(int(np.argmax(hi != hi[0])))}")
    rank = int(hi[0]) if hi.size else w.cta.rank
    if rank == w.cta.rank:
        return w.cta.shared, lo
    if space in ("shared", "shared::cta"):
        raise EmulationError(f"a .{space} access to {int(a[0]):#x} names CTA rank {rank}, not the executing "
                             f"CTA's rank {w.cta.rank}, {where(0)}")
    return w.cta.cluster.shared_of(rank), lo


def cluster_target(w, space: str | None, addr: int, where):
    """(Cta, offset) of one shared / shared::cluster / generic-shared address (see :func:`shared_target`)."""
    a = int(addr)
    if space is None:
        if a < SHARED_WINDOW:
            raise EmulationError(f"generic address {a:#x} is not in the shared window, {where(0)}")
        a -= SHARED_WINDOW
    rank, off = a >> CLUSTER_RANK_SHIFT, a & ((1 << CLUSTER_RANK_SHIFT) - 1)
    if rank == w.cta.rank:
        return w.cta, off
    if space != "shared::cluster" and space is not None:
        raise EmulationError(f"a .{space} address {a:#x} names CTA rank {rank}, not the executing CTA's rank "
                             f"{w.cta.rank}, {where(0)}")
    ctas = w.cta.cluster.ctas
    if not 0 <= rank < len(ctas):
        raise EmulationError(f"shared::cluster address {a:#x} names CTA rank {rank} of a cluster of {len(ctas)}, "
                             f"{where(0)}")
    return ctas[rank], off


def _route(w, space, addrs):
    """Split generic addresses into (global mask, shared mask, param mask)."""
    if space is not None:
        return space
    a = addrs.astype(np.uint64)
    sh = a >= np.uint64(SHARED_WINDOW)
    pa = (a >= np.uint64(PARAM_WINDOW)) & ~sh
    if sh.all():
        return "generic-shared"
    if pa.all():
        return "generic-param"
    if not (sh | pa).any():
        return "global"
    return "mixed"


def note_pdl(w, kind: str, addrs: np.ndarray, before_wait: bool | None = None) -> None:
    """Global accesses before this warp's ``griddepcontrol.wait`` (PDL: the previous kernel may still
    be running): ``Launch.ext["pdl_pre_wait_reads" / "..._writes" / "..._prefetches"]`` collect the
    allocations touched. Every global access records here: plain loads and stores, ``cp.async``, and the
    bulk tensor (TMA) loads, stores and L2 prefetches with the addresses their tensor map and box give.
    ``before_wait``: the warp's state when the access was issued (an asynchronous store performs later)."""
    if before_wait is None:
        before_wait = not w.ext.get("griddepcontrol.wait")
    if before_wait:
        launch = w.cta.launch
        launch.ext.setdefault(f"pdl_pre_wait_{kind}", set()).update(launch.gmem.names_of(addrs))


#: Bytes of the cache line an L2 prefetch names (the L2 line of the PTX ISA's ``prefetch`` description).
L2_LINE = 128


def note_prefetch(w, addrs: np.ndarray, where) -> None:
    """Record global L2 prefetches (``prefetch.global.L2``, ``cp.async.bulk.prefetch{.tensor}.L2``).

    A prefetch has no functional effect, but one that names the wrong bytes is a performance bug nobody sees
    without a GPU, so the emulator keeps them: ``Launch.ext["l2_prefetch_lines"]`` maps each allocation's name
    to the set of ``L2_LINE``-byte lines (offset // ``L2_LINE`` within the allocation) prefetched by the
    launch, and ``Launch.stats["l2_prefetches"]`` counts the addresses recorded (one per executing lane of a
    ``prefetch``), so a line prefetched twice shows.
    nvgemm never prefetches outside a tensor it was handed: an address in no allocation raises
    :class:`EmulationError` (``where(i)`` names lane ``i``)."""
    if not len(addrs):
        return
    a64 = addrs.astype(np.uint64, copy=False)
    gmem = w.cta.launch.gmem
    gmem = getattr(gmem, "mem", gmem)  # a grid of a PDL stream (ptx/pdl.py): the stream's allocations
    rec = w.cta.launch.ext.setdefault("l2_prefetch_lines", {})
    idx = np.searchsorted(gmem._bases, a64, side="right") - 1
    for i in np.unique(idx):
        sel = idx == i
        if i < 0:
            gmem._locate(a64[sel][:1], 1, lambda _j: where(int(np.argmax(sel))))  # raises: before every allocation
        al = gmem.allocs[int(i)]
        off = (a64[sel] - np.uint64(al.base)).astype(np.int64)
        if (off >= al.size).any():
            bad = int(np.nonzero(sel)[0][int(np.argmax(off >= al.size))])
            raise EmulationError(f"L2 prefetch outside every allocation at {int(a64[bad]):#x}, {where(bad)}; "
                                 f"nearest allocation {al.name} [{al.base:#x}, {al.base + al.size:#x})")
        rec.setdefault(al.name, set()).update((off // L2_LINE).tolist())
    stats = w.cta.launch.stats
    stats["l2_prefetches"] = stats.get("l2_prefetches", 0) + len(addrs)


def read_bytes(w, ins, space, addrs: np.ndarray, width: int, lanes: np.ndarray) -> np.ndarray:
    where = _where(w, ins, lanes)
    r = _route(w, space, addrs)
    if r == "global":
        note_pdl(w, "reads", addrs)
        return w.cta.launch.gmem.read(addrs, width, where)
    if r in ("shared", "shared::cta", "shared::cluster", "generic-shared"):
        smem, offs = shared_target(w, None if r == "generic-shared" else space, addrs, where)
        return smem.read(offs, width, where)
    if r in ("param", "param::entry", "generic-param"):
        offs = addrs.astype(np.uint64) - (np.uint64(PARAM_WINDOW) if r == "generic-param" else np.uint64(0))
        params = np.frombuffer(w.cta.launch.params, np.uint8)
        offs = offs.astype(np.int64)
        if (offs < 0).any() or (offs + width > len(params)).any():
            bad = int(np.argmax((offs < 0) | (offs + width > len(params))))
            raise EmulationError(f"parameter read past the {len(params)} parameter bytes, {where(bad)}")
        return params[offs[:, None] + np.arange(width)]
    out = np.empty((len(addrs), width), np.uint8)  # mixed generic: lane by lane
    for j in range(len(addrs)):
        out[j] = read_bytes(w, ins, None, addrs[j:j + 1], width, lanes[j:j + 1])[0]
    return out


def write_bytes(w, ins, space, addrs: np.ndarray, data: np.ndarray, lanes: np.ndarray) -> None:
    where = _where(w, ins, lanes)
    r = _route(w, space, addrs)
    if r == "global":
        note_pdl(w, "writes", addrs)
        w.cta.launch.gmem.write(addrs, data, where)
        return
    if r in ("shared", "shared::cta", "shared::cluster", "generic-shared"):
        smem, offs = shared_target(w, None if r == "generic-shared" else space, addrs, where)
        smem.write(offs, data, where)
        return
    if r == "mixed":
        for j in range(len(addrs)):
            write_bytes(w, ins, None, addrs[j:j + 1], data[j:j + 1], lanes[j:j + 1])
        return
    raise EmulationError(f"store to the parameter space, {where(0)}")


def _operand_list(op):
    return list(op.items) if op.kind == "vec" else [op]


@opcode("ld")
def _ld(ins, ctx):
    space, vec, t, _ = _classify(ins, ctx)
    dt = np.dtype(TYPE_DTYPE[t])
    dsts = _operand_list(ins.operands[0])
    if len(dsts) != vec:
        raise ctx.unsupported(ins, f"{len(dsts)} destinations for .v{vec}")
    _, ga = ctx.addr(ins.operands[1])
    sets = [ctx.dst(d, dt) for d in dsts]
    width = dt.itemsize * vec

    def ex(w, m):
        lanes = ALL_LANES if m is FULL else np.nonzero(m)[0]
        raw = read_bytes(w, ins, space, ga(w)[lanes], width, lanes)
        vals = np.ascontiguousarray(raw).view(dt).reshape(len(lanes), vec)
        for i, s in enumerate(sets):
            full = np.zeros(LANES, dt)
            full[lanes] = vals[:, i]
            s(w, m, full)

    return ex


@opcode("st")
def _st(ins, ctx):
    space, vec, t, _ = _classify(ins, ctx)
    dt = np.dtype(TYPE_DTYPE[t])
    _, ga = ctx.addr(ins.operands[0])
    srcs = _operand_list(ins.operands[1])
    if len(srcs) != vec:
        raise ctx.unsupported(ins, f"{len(srcs)} sources for .v{vec}")
    gets = [ctx.src(s, dt) for s in srcs]

    def ex(w, m):
        lanes = ALL_LANES if m is FULL else np.nonzero(m)[0]
        vals = np.stack([g(w)[lanes] for g in gets], axis=1).astype(dt, copy=False)
        data = np.ascontiguousarray(vals).view(np.uint8).reshape(len(lanes), dt.itemsize * vec)
        write_bytes(w, ins, space, ga(w)[lanes], data, lanes)

    return ex


# ------------------------------------------------------------------------------------------- cp.async


class CpAsyncState:
    """Per-warp ``cp.async`` bookkeeping with per-lane group semantics."""

    def __init__(self):
        self.uncommitted: list[AsyncWrite] = []
        self.groups: list[list] = []  # [lane mask, [AsyncWrite]]


def _state(w) -> CpAsyncState:
    s = w.ext.get("cp.async")
    if s is None:
        s = w.ext["cp.async"] = CpAsyncState()
    return s


def _split(tok: AsyncWrite, sel_lanes: np.ndarray) -> tuple[AsyncWrite | None, AsyncWrite | None]:
    """(part of ``tok`` for lanes in ``sel_lanes`` (bool[32]), the rest)."""
    rows = sel_lanes[tok.lanes]
    if rows.all():
        return tok, None
    if not rows.any():
        return None, tok
    a = AsyncWrite(tok.shared, tok.ix[rows], tok.data[rows])
    a.lanes = tok.lanes[rows]
    b = AsyncWrite(tok.shared, tok.ix[~rows], tok.data[~rows])
    b.lanes = tok.lanes[~rows]
    return a, b


@opcode("cp.async")
def _cp_async(ins, ctx):
    parts = ins.parts
    if parts[2] in ("commit_group", "wait_group", "wait_all"):
        return _cp_async_group(ins, ctx)
    if parts[2] not in ("ca", "cg"):
        raise ctx.unsupported(ins)
    known = {"ca", "cg", "shared", "shared::cta", "global", "L2::cache_hint", "L2::64B", "L2::128B", "L2::256B"}
    bad = [p for p in parts[2:] if p not in known]
    if bad:
        raise ctx.unsupported(ins, f"modifier(s) {bad}")
    ops = list(ins.operands)
    if "L2::cache_hint" in parts:
        ops = ops[:-1]  # the cache policy
    dst, src, size = ops[0], ops[1], ops[2]
    if size.kind != "imm" or size.value not in (4, 8, 16) or (parts[2] == "cg" and size.value != 16):
        raise ctx.unsupported(ins, f"cp-size {size.text}")
    cp = size.value
    _, gdst = ctx.addr(dst)
    _, gsrc = ctx.addr(src)
    extra = ops[3] if len(ops) > 3 else None
    gsz = gign = None
    if extra is not None:
        if extra.kind == "reg" and ctx.reg(extra)[0] == "pred":
            gign = ctx.src(extra, np.bool_)
        else:
            gsz = ctx.src(extra, np.uint32)

    def ex(w, m):
        lanes = ALL_LANES if m is FULL else np.nonzero(m)[0]
        n = len(lanes)
        srcsz = np.full(n, cp, np.int64)
        if gsz is not None:
            srcsz = gsz(w)[lanes].astype(np.int64)
            if (srcsz > cp).any():
                bad = int(np.argmax(srcsz > cp))
                raise EmulationError(f"cp.async src-size {srcsz[bad]} > cp-size {cp}, {w.where(ins, int(lanes[bad]))}")
        if gign is not None:
            srcsz = np.where(gign(w)[lanes], 0, cp)
        data = np.zeros((n, cp), np.uint8)
        sa = gsrc(w)[lanes]
        full = srcsz == cp
        where = _where(w, ins, lanes)
        if (srcsz > 0).any():
            note_pdl(w, "reads", sa[srcsz > 0])
        if full.any():
            fl = np.nonzero(full)[0]
            data[fl] = w.cta.launch.gmem.read(sa[fl], cp, lambda j: where(int(fl[j])))
        part = np.nonzero((srcsz > 0) & ~full)[0]
        for j in part:  # partial source: bytes one by one (only their range is checked)
            k = int(srcsz[j])
            data[j, :k] = w.cta.launch.gmem.read(sa[j:j + 1] + np.arange(k, dtype=np.uint64), 1,
                                                 lambda _i, j=j: where(int(j)))[:, 0]
        smem, offs = shared_target(w, "shared", gdst(w)[lanes], where)
        tok = smem.write_async(offs, data, where)
        tok.lanes = lanes
        _state(w).uncommitted.append(tok)

    return ex


def _cp_async_group(ins, ctx):
    kind = ins.parts[2]
    if len(ins.parts) != 3:
        raise ctx.unsupported(ins)
    if kind == "commit_group":
        def commit(w, m):
            st = _state(w)
            keep, moved = [], []
            for tok in st.uncommitted:
                a, b = _split(tok, m)
                if a is not None:
                    moved.append(a)
                if b is not None:
                    keep.append(b)
            st.uncommitted = keep
            st.groups.append([m.copy(), moved])

        return commit
    if kind == "wait_all":
        n_keep = 0
    else:
        if not ins.operands or ins.operands[0].kind != "imm":
            raise ctx.unsupported(ins, "wait_group needs an immediate")
        n_keep = ins.operands[0].value

    def wait(w, m):
        st = _state(w)
        if kind == "wait_all":  # wait_all = commit_group + wait_group 0
            commit_all = [t for t in st.uncommitted]
            st.uncommitted = []
            st.groups.append([m.copy(), commit_all])
        remaining = np.zeros(LANES, np.int64)
        for gm, _ in st.groups:
            remaining += gm
        for g in st.groups:
            gm, toks = g
            done = m & gm & (remaining > n_keep)
            if not done.any():
                continue
            rest = []
            for tok in toks:
                a, b = _split(tok, done)
                if a is not None:
                    a.complete()
                if b is not None:
                    rest.append(b)
            g[1] = rest
            g[0] = gm & ~done
            remaining -= done
        st.groups = [g for g in st.groups if g[0].any()]  # empty groups still count for wait_group N

    return wait


def finish_cta_async(cta) -> None:
    """CTA exit: complete copies nobody waited for (counted in ``Launch.stats``)."""
    n = 0
    for w in cta.warps:
        st = w.ext.get("cp.async")
        if st is None:
            continue
        for tok in st.uncommitted + [t for _, toks in st.groups for t in toks]:
            if not tok.done:
                tok.complete()
                n += 1
    if n:
        cta.launch.stats["cp_async_unwaited"] = cta.launch.stats.get("cp_async_unwaited", 0) + n


# ------------------------------------------------------------------------------------------- atomics

_ATOM_OPS = {"add", "inc", "dec", "min", "max", "and", "or", "xor", "exch", "cas"}


@opcode("atom", "red")
def _atom(ins, ctx):
    is_red = ins.parts[0] == "red"
    space, op = None, None
    for p in ins.parts[1:-1]:
        if p in _SPACES:
            space = p
        elif p in _ATOM_OPS:
            op = p
        elif p in ("relaxed", "acquire", "release", "acq_rel", "sc", "cta", "cluster", "gpu", "sys", "L2::cache_hint"):
            pass
        else:
            raise ctx.unsupported(ins, f"modifier .{p}")
    t = ins.parts[-1]
    if op is None or t not in ("b32", "u32", "s32", "b64", "u64", "s64", "f32"):
        raise ctx.unsupported(ins)
    if op in ("inc", "dec") and t != "u32":
        raise ctx.unsupported(ins)
    dt = np.dtype(TYPE_DTYPE[t])
    ops = list(ins.operands)
    if "L2::cache_hint" in ins.parts:
        ops = ops[:-1]
    if is_red:
        addr_op, vals = ops[0], ops[1:]
        sd = None
    else:
        addr_op, vals = ops[1], ops[2:]
        sd = ctx.dst(ops[0], dt)
    _, ga = ctx.addr(addr_op)
    gv = [ctx.src(v, dt) for v in vals]

    def apply(old, b, c):
        if op == "add":
            return (old + b).astype(dt) if dt.kind != "f" else np.float32(np.float32(old) + np.float32(b))
        if op == "inc":
            return dt.type(0) if old >= b else dt.type(old + 1)
        if op == "dec":
            return b if (old == 0 or old > b) else dt.type(old - 1)
        if op == "min":
            return min(old, b)
        if op == "max":
            return max(old, b)
        if op == "and":
            return old & b
        if op == "or":
            return old | b
        if op == "xor":
            return old ^ b
        if op == "exch":
            return b
        if op == "cas":
            return c if old == b else old
        raise AssertionError(op)

    def ex(w, m):
        lanes = ALL_LANES if m is FULL else np.nonzero(m)[0]
        addrs = ga(w)
        bs = [g(w) for g in gv]
        out = np.zeros(LANES, dt)
        for lane in lanes:  # serialised in lane order
            a = addrs[lane:lane + 1]
            raw = read_bytes(w, ins, space, a, dt.itemsize, lanes[lanes == lane])
            old = raw.view(dt)[0, 0] if raw.ndim == 2 else raw.view(dt)[0]
            new = apply(old, bs[0][lane], bs[1][lane] if len(bs) > 1 else None)
            write_bytes(w, ins, space, a, np.array([new], dtype=dt).view(np.uint8).reshape(1, dt.itemsize),
                        lanes[lanes == lane])
            out[lane] = old
        if sd is not None:
            sd(w, m, out)

    return ex


@opcode("fence", "membar")
def _fence(ins, ctx):
    known = {"sc", "acq_rel", "acquire", "release", "cta", "cluster", "gpu", "sys", "gl", "proxy", "async",
             "shared::cta", "shared::cluster", "global", "alias", "mbarrier_init", "tensormap", "generic",
             "async::generic", "async.shared::cta", "async.global"}
    bad = [p for p in ins.parts[1:] if p not in known]
    if bad:
        raise ctx.unsupported(ins, f"modifier(s) {bad}")
    return lambda w, m: None


@opcode("createpolicy")
def _createpolicy(ins, ctx):
    if "fractional" not in ins.parts:
        raise ctx.unsupported(ins)
    sd = ctx.dst(ins.operands[0], np.uint64)
    policy = np.full(LANES, 0x10E0_0000_0000_0000, np.uint64)  # an opaque policy word (hint only)
    return lambda w, m: sd(w, m, policy)


@opcode("cvta")
def _cvta(ins, ctx):
    parts = ins.parts[1:]
    to = parts[0] == "to"
    if to:
        parts = parts[1:]
    space, t = parts[0], parts[-1]
    if t not in ("u32", "u64") or space not in ("shared", "shared::cta", "shared::cluster", "param", "global", "local"):
        raise ctx.unsupported(ins)
    if space in ("local", "shared::cluster") and not to:
        raise ctx.unsupported(ins)
    dt = TYPE_DTYPE[t]
    g, sd = ctx.src(ins.operands[1], np.uint64), ctx.dst(ins.operands[0], dt)
    win = {"shared": SHARED_WINDOW, "shared::cta": SHARED_WINDOW, "shared::cluster": SHARED_WINDOW,
           "param": PARAM_WINDOW, "global": 0, "local": 0}[space]
    w64 = np.uint64(win)

    def ex(w, m):
        a = g(w)
        if to:
            if win and (a[m] < w64).any():
                bad = int(np.argmax(m & (a < w64)))
                raise EmulationError(f"cvta.to.{space} of an address outside the {space} window, {w.where(ins, bad)}")
            r = a - w64 if win else a
        else:
            r = a + w64
        sd(w, m, r.astype(dt))

    return ex


@opcode("mapa")
def _mapa(ins, ctx):
    """``mapa{.shared::cluster}.u32/.u64 d, a, rank`` (PTX ISA 9.7.9.22): the address in CTA ``rank`` of the
    cluster that corresponds to ``a``: the rank bits (24+) replaced; generic addresses stay generic. A rank
    outside the cluster is not an error here (compilers hoist ``mapa`` over the lanes that never use the
    result, e.g. every lane mapping to rank ``laneid``); an access through the address is
    (:func:`cluster_target`)."""
    parts = ins.parts[1:]
    space = parts[0] if parts[0] == "shared::cluster" else None
    t = parts[-1]
    if t not in ("u32", "u64") or len(parts) != (2 if space else 1):
        raise ctx.unsupported(ins)
    dt = TYPE_DTYPE[t]
    ga, gr, sd = ctx.src(ins.operands[1], np.uint64), ctx.src(ins.operands[2], np.uint64), ctx.dst(ins.operands[0], dt)
    low = np.uint64((1 << CLUSTER_RANK_SHIFT) - 1)
    win = np.uint64(0 if space else SHARED_WINDOW)

    def ex(w, m):
        a, r = ga(w), gr(w)
        if space is None and (a[m] < win).any():
            raise EmulationError(f"mapa of a generic address outside the shared window, {w.where(ins)}")
        r = np.minimum(r, np.uint64(0xFF))  # keep an out-of-range rank out-of-range without overflowing a .u32
        sd(w, m, (win + (((a - win) & low) | (r << np.uint64(CLUSTER_RANK_SHIFT)))).astype(dt))

    return ex


_PREFETCH_LEVELS = {"L1", "L2", "L2::evict_last", "L2::evict_normal"}


def _no_effect(w, m):
    return None


@opcode("prefetch", "prefetchu")
def _prefetch(ins, ctx):
    """PTX ISA "prefetch, prefetchu": ``prefetch{.global, .local}.{L1, L2} [a]``,
    ``prefetch.global.L2::{evict_last, evict_normal} [a]``, ``prefetchu.L1 [a]``,
    ``prefetch{.const, .param}.tensormap [a]``. Cache hints with no functional effect; the global L2 forms
    (``.global``, or a generic address outside the shared and parameter windows) are recorded by
    :func:`note_prefetch` for the lanes that execute them. L1, uniform-cache, local and tensormap prefetches,
    and a generic prefetch of a shared address (the ISA: no operation), record nothing."""
    mods = ins.parts[1:]
    if ins.parts[0] == "prefetchu":
        if mods != ["L1"]:
            raise ctx.unsupported(ins, "prefetchu takes .L1 only")
        return _no_effect
    if mods and mods[-1] == "tensormap":
        if len(mods) > 2 or (len(mods) == 2 and mods[0] not in ("const", "param")):
            raise ctx.unsupported(ins, "a tensormap prefetch takes .const, .param or no state space")
        return _no_effect
    space = mods[0] if mods and mods[0] in ("global", "local") else None
    level = mods[1:] if space else mods
    if len(level) != 1 or level[0] not in _PREFETCH_LEVELS:
        raise ctx.unsupported(ins, f"cache level {'.'.join(level) or '(none)'}")
    if "::" in level[0] and space != "global":
        raise ctx.unsupported(ins, "an eviction priority needs the .global state space")
    if level[0] == "L1" or space == "local":
        return _no_effect
    _, ga = ctx.addr(ins.operands[0])

    def ex(w, m):
        lanes = ALL_LANES if m is FULL else np.nonzero(m)[0]
        a = ga(w)[lanes]
        if space is None:  # generic: the global lanes (a shared or parameter address: no operation)
            glob = a < np.uint64(PARAM_WINDOW)
            lanes, a = lanes[glob], a[glob]
        note_pdl(w, "prefetches", a)
        note_prefetch(w, a, _where(w, ins, lanes))

    return ex


__all__ = ["CpAsyncState", "L2_LINE", "cluster_target", "finish_cta_async", "note_prefetch", "read_bytes", "shared_target",
           "write_bytes"]
