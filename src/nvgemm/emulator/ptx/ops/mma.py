"""``mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32`` (PTX ISA "Warp-level Matrix
Multiply-Accumulate Instructions", "Matrix Fragments for mma.m16n8k16 with floating point type").

Fragments, with ``groupID = laneid >> 2`` and ``threadID_in_group = laneid % 4`` (ISA text):

* A (16 x 16, row): four .b32 registers = elements a0..a7 (two per register, a_{2r} in the low half);
  ``row = groupID`` for a_i with ``i < 2 || 4 <= i < 6``, else ``groupID + 8``;
  ``col = threadID_in_group * 2 + (i & 1)`` for ``i < 4``, else ``+ 8``.
* B (16 x 8, col): two registers = b0..b3; ``row = threadID_in_group * 2 + (i & 1)`` for ``i < 2``, else
  ``+ 8``; ``col = groupID``.
* C / D (16 x 8, f32): four registers c0..c3; ``row = groupID`` for ``i < 2``, else ``groupID + 8``;
  ``col = threadID_in_group * 2 + (i & 1)``.

Arithmetic: D = A B + C with the products and sums formed exactly in float64 and one rounding to
f32 (ties to even). Exact whenever the fp32 sum of the 16 products and C is exact (the test data's
design); on other data the hardware's accumulation order / internal truncation may differ in the
last bits (documented tolerance).
"""

from __future__ import annotations

import numpy as np

from nvgemm.emulator.ptx.errors import EmulationError
from nvgemm.emulator.ptx.machine import FULL, LANE_IDS
from nvgemm.emulator.ptx.ops.fp import from_bits, round_fmt, to_bits
from nvgemm.emulator.ptx.ops import opcode

_G = (LANE_IDS >> 2).astype(np.int64)
_Q = (LANE_IDS & 3).astype(np.int64)


def _a_index():
    rows, cols = np.zeros((8, 32), np.int64), np.zeros((8, 32), np.int64)
    for i in range(8):
        rows[i] = _G + (0 if (i < 2 or 4 <= i < 6) else 8)
        cols[i] = _Q * 2 + (i & 1) + (0 if i < 4 else 8)
    return rows, cols


def _b_index():
    rows, cols = np.zeros((4, 32), np.int64), np.zeros((4, 32), np.int64)
    for i in range(4):
        rows[i] = _Q * 2 + (i & 1) + (0 if i < 2 else 8)
        cols[i] = _G
    return rows, cols


def _c_index():
    rows, cols = np.zeros((4, 32), np.int64), np.zeros((4, 32), np.int64)
    for i in range(4):
        rows[i] = _G + (0 if i < 2 else 8)
        cols[i] = _Q * 2 + (i & 1)
    return rows, cols


A_ROW, A_COL = _a_index()
B_ROW, B_COL = _b_index()
C_ROW, C_COL = _c_index()
# flat gathers: register halves [element i, lane] -> matrix positions, and back for C / D
A_GATHER = np.zeros(256, np.int64)
A_GATHER[A_ROW.ravel() * 16 + A_COL.ravel()] = np.arange(256)
B_GATHER = np.zeros(128, np.int64)
B_GATHER[B_ROW.ravel() * 8 + B_COL.ravel()] = np.arange(128)
C_FLAT = (C_ROW * 8 + C_COL).ravel()
C_GATHER = np.zeros(128, np.int64)
C_GATHER[C_FLAT] = np.arange(128)


@opcode("mma")
def _mma(ins, ctx):
    p = ins.parts
    if (p[1:5] != ["sync", "aligned", "m16n8k16", "row"] or p[5] != "col" or len(p) != 10 or p[6] != "f32"
            or p[9] != "f32" or p[7] != p[8] or p[7] not in ("bf16", "f16")):
        raise ctx.unsupported(ins)
    fmt = p[7]
    d, a, b, c = ins.operands
    if not (len(d.items) == 4 and len(a.items) == 4 and len(b.items) == 2 and len(c.items) == 4):
        raise ctx.unsupported(ins, "operand vector sizes")
    regs = [*a.items, *b.items, *c.items, *d.items]
    if all(x.kind == "reg" and ctx.reg(x)[0] == "b32" for x in regs):  # one gather / scatter per operand
        ia = np.array([ctx.reg(x)[1] for x in a.items])
        ib = np.array([ctx.reg(x)[1] for x in b.items])
        ic = np.array([ctx.reg(x)[1] for x in c.items])
        idd = np.array([ctx.reg(x)[1] for x in d.items])

        def read(w):
            r = w.bank["b32"]
            return r[ia], r[ib], r[ic].view(np.float32)

        def write(w, m, out):
            if m is FULL:
                w.bank["b32"][idd] = out
            else:
                for j, i in enumerate(idd):
                    np.copyto(w.bank["b32"][i], out[j], where=m)
    else:
        ga = [ctx.src(x, np.uint32) for x in a.items]
        gb = [ctx.src(x, np.uint32) for x in b.items]
        gc = [ctx.src(x, np.float32) for x in c.items]
        sd = [ctx.dst(x, np.uint32) for x in d.items]

        def read(w):
            return (np.stack([g(w) for g in ga]), np.stack([g(w) for g in gb]), np.stack([g(w) for g in gc]))

        def write(w, m, out):
            for i in range(4):
                sd[i](w, m, out[i])

    def ex(w, m):
        if m is not FULL and not m.all():
            raise EmulationError(f"mma.sync.aligned executed by a partial warp (lanes "
                                 f"{np.nonzero(~m)[0].tolist()} missing), {w.where(ins)}")
        ar, br, cr = read(w)
        # registers [r, lane] -> 16-bit halves [element 2r + h, lane] (little endian: low half first)
        ah = ar.view(np.uint16).reshape(4, 32, 2).transpose(0, 2, 1).ravel()
        bh = br.view(np.uint16).reshape(2, 32, 2).transpose(0, 2, 1).ravel()
        A = from_bits(ah[A_GATHER], fmt).reshape(16, 16)
        B = from_bits(bh[B_GATHER], fmt).reshape(16, 8)
        C = cr.ravel()[C_GATHER].astype(np.float64).reshape(16, 8)
        D = A @ B + C
        write(w, m, to_bits(round_fmt(D.ravel()[C_FLAT], None, "f32", "rn"), "f32").reshape(4, 32))

    return ex
