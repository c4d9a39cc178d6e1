"""Opcode module: ``wgmma.fence / mma_async / commit_group / wait_group`` on the emulator core, using the
pure semantics of :mod:`.wgmma`.

Each warp of a warpgroup runs its own rows of the MMA (:func:`.wgmma.mma_async_warp`; the operation
decomposes by rows, so no cross-warp join is needed) and keeps its own async groups
(``Warp.ext["wgmma"]``). Issue-time operands (descriptors, scale-d, the immediates) must be warp-uniform;
the A registers, the accumulators and shared memory are read when ``wait_group`` retires the group, through
the core's checked shared-memory read (poisoned bytes or bytes an async copy still writes are errors).

The ISA's fence rule (9.7.15.6.1): registers that ordinary instructions wrote after the last
``wgmma.fence`` should not feed a ``wgmma.mma_async`` (as A or accumulator). PTX registers are virtual, and
compiler-generated PTX does break the rule as written (CuTeDSL's accumulator initialisation is scheduled
after the fence); ptxas then orders or serialises the WGMMA itself, so the values are still defined. The
module therefore counts such uses instead of failing: it compares the registers an ``mma_async`` uses with
a snapshot taken at the fence (updated by the groups' own write-backs) and adds the changed ones to
``Launch.stats["wgmma_unfenced_register_writes"]``.
"""

from __future__ import annotations

import numpy as np

from nvgemm.emulator.ptx.errors import EmulationError
from nvgemm.emulator.ptx.ops import opcode
from nvgemm.emulator.isa.errors import IsaError
from nvgemm.emulator.isa.wgmma import WgmmaGroups, WgmmaShape, mma_async_warp


class _WarpState:
    def __init__(self):
        self.groups = WgmmaGroups()
        self.snapshot: dict = {}


def _state(w) -> _WarpState:
    st = w.ext.get("wgmma")
    if st is None:
        st = w.ext["wgmma"] = _WarpState()
    return st


def _full_warp(w, m, ins):
    if not m.all():
        raise EmulationError(f"{ins.opcode} executed by a partial warp (lanes {np.nonzero(~m)[0].tolist()} "
                             f"missing), {w.where(ins)}")


def _uniform(v: np.ndarray, what: str, w, ins):
    if not (v == v[0]).all():
        raise EmulationError(f"{ins.opcode}: {what} differs between lanes, {w.where(ins)}")
    return v[0]


def _reg_key(ctx, op, ins):
    if op.kind != "reg":
        raise ctx.unsupported(ins, f"operand {op.text!r} is not a register")
    bank, i = ctx.reg(op)
    if bank != "b32":
        raise ctx.unsupported(ins, f"operand {op.text!r} is not a 32-bit register")
    return i


def _imm(ctx, op, ins, what):
    if op.kind != "imm":
        raise ctx.unsupported(ins, f"{what} must be an immediate, got {op.text!r}")
    return op.value


@opcode("wgmma.fence", "wgmma.commit_group", "wgmma.wait_group", "wgmma.mma_async")
def _wgmma(ins, ctx):
    p = ins.parts
    if p[2:4] != ["sync", "aligned"]:
        raise ctx.unsupported(ins)
    if p[1] == "fence" and len(p) == 4:
        def fence(w, m):
            _full_warp(w, m, ins)
            st = _state(w)
            st.groups.fence()
            st.snapshot = {"b32": w.bank["b32"].copy()}
        return fence
    if p[1] == "commit_group" and len(p) == 4:
        def commit(w, m):
            _full_warp(w, m, ins)
            _state(w).groups.commit_group()
        return commit
    if p[1] == "wait_group" and len(p) == 4:
        n = _imm(ctx, ins.operands[0], ins, "wait_group N")

        def wait(w, m):
            _full_warp(w, m, ins)
            st = _state(w)
            bank = w.bank["b32"]
            try:
                out = st.groups.wait_group(n, lambda i: bank[i])
            except IsaError as e:
                raise EmulationError(f"{e}, {w.where(ins)}") from None
            snap = st.snapshot.get("b32")
            for i, v in out.items():
                bank[i] = v
                if snap is not None:
                    snap[i] = v
        return wait
    if p[1] != "mma_async":
        raise ctx.unsupported(ins)
    try:
        shape = WgmmaShape.parse(ins.opcode)
    except IsaError as e:
        raise ctx.unsupported(ins, str(e)) from None
    ops = ins.operands
    d_op, a_op, b_op = ops[:3]
    if d_op.kind != "vec" or len(d_op.items) != shape.n // 2:
        raise ctx.unsupported(ins, f"accumulator must be a vector of {shape.n // 2} registers")
    d_keys = [_reg_key(ctx, x, ins) for x in d_op.items]
    reg_a = a_op.kind == "vec"
    if shape.elem_bits == 8:  # d, a-desc, b-desc, scale-d, imm-scale-a, imm-scale-b (K-major only: no imm-trans)
        if reg_a:
            raise ctx.unsupported(ins, "8-bit wgmma with A in registers is not modelled")
        imms = ops[4:]
        if len(imms) != 2:
            raise ctx.unsupported(ins, "the 8-bit descriptor form takes scale-d, imm-scale-a, imm-scale-b")
        a_keys = []
        get_a_desc = ctx.src(a_op, np.uint64)
        sa, sb = (_imm(ctx, x, ins, "immediate") for x in imms)
        ta = tb = 0
    elif reg_a:
        if len(a_op.items) != 4:
            raise ctx.unsupported(ins, "register A must be a vector of 4 registers")
        a_keys = [_reg_key(ctx, x, ins) for x in a_op.items]
        imms = ops[4:]
        if len(imms) != 3:
            raise ctx.unsupported(ins, "register-A form takes scale-d, imm-scale-a, imm-scale-b, imm-trans-b")
        sa, sb, tb = (_imm(ctx, x, ins, "immediate") for x in imms)
        ta = 0
        get_a_desc = None
    else:
        a_keys = []
        get_a_desc = ctx.src(a_op, np.uint64)
        imms = ops[4:]
        if len(imms) != 4:
            raise ctx.unsupported(ins, "descriptor form takes scale-d and four immediates")
        sa, sb, ta, tb = (_imm(ctx, x, ins, "immediate") for x in imms)
    get_b_desc = ctx.src(b_op, np.uint64)
    get_scale_d = ctx.src(ops[3], np.bool_)

    def mma(w, m):
        _full_warp(w, m, ins)
        st = _state(w)
        snap = st.snapshot.get("b32")
        bank = w.bank["b32"]
        if snap is not None:
            stale = sum(not np.array_equal(bank[i], snap[i]) for i in d_keys + a_keys)
            if stale:
                stats = w.cta.launch.stats
                stats["wgmma_unfenced_register_writes"] = stats.get("wgmma_unfenced_register_writes", 0) + stale
        b_desc = int(_uniform(get_b_desc(w), "the B descriptor", w, ins))
        a_desc = int(_uniform(get_a_desc(w), "the A descriptor", w, ins)) if get_a_desc else None
        scale_d = bool(_uniform(get_scale_d(w), "scale-d", w, ins))
        shared = w.cta.shared
        warp_in_group = w.wid % 4

        def smem(addrs, width):
            return shared.read(addrs, width, lambda j: f"{w.where(ins)} (async read of shared {int(addrs[j]):#x})")

        def run(read):
            d_regs = np.stack([read(i) for i in d_keys], axis=1)
            a = a_desc if a_desc is not None else np.stack([read(i) for i in a_keys], axis=1)
            out = mma_async_warp(shape, warp_in_group, d_regs, a, b_desc, smem, scale_d=scale_d, imm_scale_a=sa,
                                 imm_scale_b=sb, imm_trans_a=ta, imm_trans_b=tb)
            return [out[:, j] for j in range(len(d_keys))]

        try:
            st.groups.issue(d_keys, a_keys, run)
        except IsaError as e:
            raise EmulationError(f"{e}, {w.where(ins)}") from None
    return mma
