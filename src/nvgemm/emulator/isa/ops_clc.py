"""Opcode module: cluster launch control (``clusterlaunchcontrol.try_cancel`` / ``.query_cancel``) and the
``.b128`` register moves around it (``mov.b128``), on the semantics of :mod:`.clc`.

* ``mov.b128 q, {lo, hi}`` packs two 64-bit halves (``lo`` = bits 0..63), ``mov.b128 {lo, hi}, q`` unpacks,
  ``mov.b128 q, q2`` copies.
* ``clusterlaunchcontrol.try_cancel.async{.shared::cta}.mbarrier::complete_tx::bytes{.multicast::cluster::all}.b128
  [addr], [mbar]``: each executing lane is one request. It cancels the head of the launch queue
  (:meth:`~nvgemm.emulator.ptx.schedule.LaunchQueue.cancel`: the first pending cluster of the requester's
  shape; decided at issue, a legal instant for the atomic request) and writes the response at ``addr`` of the executing CTA -- with ``.multicast::cluster::all``
  of every CTA of the cluster at the same offset -- as an async-proxy write that, like a TMA load
  (:mod:`.ops_sm100`), stays in flight and performs its complete-tx of 16 bytes on the mbarrier at ``mbar``
  (same offset in each receiving CTA) only when a thread of that CTA waits on the mbarrier, so a kernel that
  reads the response without waiting reads in-flight bytes and fails. ``addr`` and ``mbar`` must lie in the
  executing CTA's shared::cta window (16- and 8-byte aligned). A try_cancel from a CTA that already observed
  a failed response (a ``query_cancel.is_canceled`` that returned false) is undefined in the ISA and an error.
* ``clusterlaunchcontrol.query_cancel.is_canceled.pred.b128 p, q``,
  ``.get_first_ctaid{::x,::y,::z}.b32.b128 r, q``, ``.get_first_ctaid.v4.b32.b128 {x, y, z, _}, q``.
"""

from __future__ import annotations

import numpy as np

from nvgemm.emulator.ptx.errors import EmulationError
from nvgemm.emulator.ptx.ops import opcode
from nvgemm.emulator.isa.clc import RESPONSE_BYTES, decode_response, encode_response, response_words
from nvgemm.emulator.isa.errors import IsaError
from nvgemm.emulator.isa.ops_sm100 import _exit_hook, _target

FAILURE_OBSERVED = "clc.failure_observed"  # Cta.ext key: a query of this CTA saw a failed response


def _b128(ctx, ins, op):
    if op.kind != "reg" or ctx.reg(op)[0] != "b128":
        raise ctx.unsupported(ins, f"{op.text!r} is not a .b128 register")
    return ctx.reg(op)[1]


@opcode("mov.b128")
def _mov_b128(ins, ctx):
    if ins.opcode != "mov.b128" or len(ins.operands) != 2:
        raise ctx.unsupported(ins)
    d, a = ins.operands
    if d.kind == "reg" and a.kind == "vec" and len(a.items) == 2:  # pack
        i = _b128(ctx, ins, d)
        glo, ghi = (ctx.src(x, np.uint64) for x in a.items)

        def pack(w, m):
            v = np.stack([glo(w), ghi(w)], axis=1)
            np.copyto(w.bank["b128"][i], v, where=np.asarray(m)[:, None])
        return pack
    if d.kind == "vec" and len(d.items) == 2 and a.kind == "reg":  # unpack
        i = _b128(ctx, ins, a)
        slo, shi = (ctx.dst(x, np.uint64) for x in d.items)

        def unpack(w, m):
            q = w.bank["b128"][i]
            slo(w, m, q[:, 0].copy())
            shi(w, m, q[:, 1].copy())
        return unpack
    if d.kind == "reg" and a.kind == "reg":
        i, j = _b128(ctx, ins, d), _b128(ctx, ins, a)

        def copy(w, m):
            np.copyto(w.bank["b128"][i], w.bank["b128"][j].copy(), where=np.asarray(m)[:, None])
        return copy
    raise ctx.unsupported(ins, "only {lo, hi} 64-bit halves and register copies are modelled")


_TRY = "clusterlaunchcontrol.try_cancel.async"


@opcode("clusterlaunchcontrol")
def _clc(ins, ctx):
    p = ins.parts
    if ins.opcode.startswith(_TRY + "."):
        mods = p[3:]
        space = None
        if mods and mods[0] == "shared::cta":
            space, mods = "shared", mods[1:]
        multicast = "multicast::cluster::all" in mods
        if [x for x in mods if x != "multicast::cluster::all"] != ["mbarrier::complete_tx::bytes", "b128"]:
            raise ctx.unsupported(ins)
        ga, gb = ctx.addr(ins.operands[0])[1], ctx.addr(ins.operands[1])[1]

        def try_cancel(w, m):
            _exit_hook(w)  # pending responses land at CTA exit like TMA loads
            a, b = ga(w), gb(w)
            queue = w.cta.launch.ext["launch_queue"]
            for ln in np.nonzero(m)[0]:
                where = lambda j, ln=ln: w.where(ins, ln)  # noqa: E731
                if w.cta.ext.get(FAILURE_OBSERVED):
                    raise EmulationError(f"clusterlaunchcontrol.try_cancel from CTA {w.cta.ctaid}, which already "
                                         f"observed a failed request (undefined behaviour in the ISA), {where(0)}")
                cta, off = _target(w, space, a[ln], ins, ln)
                bcta, boff = _target(w, space, b[ln], ins, ln)
                if cta is not w.cta or bcta is not w.cta:
                    raise EmulationError(f"try_cancel response or mbarrier outside the executing CTA's shared::cta "
                                         f"window, {where(0)}")
                if off % RESPONSE_BYTES or boff % 8:
                    raise EmulationError(f"try_cancel response at shared {off:#x} (needs 16-byte alignment) / "
                                         f"mbarrier at {boff:#x} (8-byte), {where(0)}")
                resp = np.frombuffer(encode_response(queue.cancel(tuple(w.cta.cluster.dims))), np.uint8)[None, :]
                for c in (w.cta.cluster.ctas if multicast else [w.cta]):
                    tok = c.shared.write_async(np.array([off]), resp, where)
                    c.ext.setdefault("tma_loads", {}).setdefault(boff, []).append((tok, RESPONSE_BYTES))
        return try_cancel
    if p[:2] != ["clusterlaunchcontrol", "query_cancel"] or p[-1] != "b128" or len(ins.operands) != 2:
        raise ctx.unsupported(ins)
    d, q = ins.operands
    iq = _b128(ctx, ins, q)

    def decoded(w, m):
        v = w.bank["b128"][iq]
        out = {}
        for ln in np.nonzero(m)[0]:
            try:
                out[ln] = decode_response(response_words(int(v[ln, 0]), int(v[ln, 1])))
            except IsaError as e:
                raise EmulationError(f"{e}, {w.where(ins, ln)}") from None
        return out

    what = ".".join(p[2:-1])
    if what == "is_canceled.pred":
        sp = ctx.dst(d, np.bool_)

        def is_canceled(w, m):
            r = np.zeros(32, bool)
            for ln, (ok, _) in decoded(w, m).items():
                r[ln] = ok
                if not ok:
                    w.cta.ext[FAILURE_OBSERVED] = True
            sp(w, m, r)
        return is_canceled
    axes = {"get_first_ctaid::x.b32": (0,), "get_first_ctaid::y.b32": (1,), "get_first_ctaid::z.b32": (2,),
            "get_first_ctaid.v4.b32": (0, 1, 2, None)}.get(what)
    if axes is None:
        raise ctx.unsupported(ins)
    dsts = d.items if d.kind == "vec" else (d,)
    if len(dsts) != len(axes):
        raise ctx.unsupported(ins, f"{len(dsts)} destinations for {len(axes)} words")
    setters = [(ax, ctx.dst(x, np.uint32)) for ax, x in zip(axes, dsts) if ax is not None]

    def first_ctaid(w, m):
        vals = np.zeros((3, 32), np.uint32)
        for ln, (_, ctaid) in decoded(w, m).items():
            vals[:, ln] = ctaid
        for ax, sd in setters:
            sd(w, m, vals[ax])
    return first_ctaid
