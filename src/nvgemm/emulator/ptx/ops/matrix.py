"""``ldmatrix`` / ``stmatrix`` ``.sync.aligned.m8n8.{x1,x2,x4}{.trans}{.shared{::cta}}.b16`` (PTX ISA "Warp-level
matrix load instruction: ldmatrix", "Warp-level matrix store instruction: stmatrix").

Written from the ISA text: each 8 x 8 matrix of 16-bit elements is eight rows of 16 contiguous bytes; lane
``8 * i + r`` supplies the shared-memory address of row ``r`` of matrix ``i`` (lanes ``0..8n-1`` for ``.xn``; the
other lanes' addresses are ignored); row addresses must be 16-byte aligned. Register ``i`` of lane ``t`` holds two
elements of matrix ``i`` (the first in the low half): without ``.trans`` row ``t / 4``, columns ``2 (t % 4)`` and
``2 (t % 4) + 1``; with ``.trans`` the matrix is transposed on the way, so the lane holds rows ``2 (t % 4)`` and
``2 (t % 4) + 1`` of column ``t / 4``. ``stmatrix`` is the same mapping in the other direction. Both are warp
collectives: every lane must execute them.

``ldmatrix.sync.aligned.m8n16.{x1,x2,x4}{.shared{::cta}}.b8x16.b4x16_p64`` (sm_100a / sm_120a): each 8 x 16
matrix row is 16 unsigned 4-bit elements packed in 8 bytes (element ``j`` in byte ``j / 2``, the even one in the
low nibble) followed by 64 bits of padding (not read), so row addresses are again 16-byte aligned; lane ``t``
receives row ``t / 4``, columns ``4 (t % 4) .. 4 (t % 4) + 3`` as four 8-bit elements of its register (the
first in the low byte), each 4-bit value in the low four bits of its byte and the upper four bits zero (CUTLASS's sm_120 collective
shifts such a register left by 2 for ``mma .kind::mxf8f6f4``, whose 8-bit e2m1 container holds the value in
bits 5..2). ``.b6x16_p32`` and the ``.m16n16`` shapes are not modelled.
"""

from __future__ import annotations

import numpy as np

from nvgemm.emulator.ptx.errors import EmulationError
from nvgemm.emulator.ptx.machine import FULL, LANE_IDS
from nvgemm.emulator.ptx.ops import opcode
from nvgemm.emulator.ptx.ops.memory import read_bytes, write_bytes

_NUM = {"x1": 1, "x2": 2, "x4": 4}
_ROW = (LANE_IDS >> 2).astype(np.int64)  # t / 4
_COL = ((LANE_IDS & 3) * 2).astype(np.int64)  # 2 (t % 4)


def _decode(ins, ctx):
    p = ins.parts
    if "m8n16" in p:
        return _decode_m8n16(ins, ctx)
    mods = p[1:-1]
    if p[-1] != "b16" or mods[:3] != ["sync", "aligned", "m8n8"] or len(mods) < 4 or mods[3] not in _NUM:
        raise ctx.unsupported(ins, "only .sync.aligned.m8n8.{x1,x2,x4}{.trans}{.shared}.b16")
    rest = mods[4:]
    trans = "trans" in rest
    rest = [x for x in rest if x != "trans"]
    space = rest[0] if rest else None
    if len(rest) > 1 or space not in (None, "shared", "shared::cta"):
        raise ctx.unsupported(ins, f"modifiers {rest}")
    return _NUM[mods[3]], trans, space


def _decode_m8n16(ins, ctx):
    p = ins.parts
    if p[0] != "ldmatrix" or p[-2:] != ["b8x16", "b4x16_p64"] or p[1:4] != ["sync", "aligned", "m8n16"] \
            or len(p) < 7 or p[4] not in _NUM:
        raise ctx.unsupported(ins, "of the .m8n16 forms only ldmatrix.sync.aligned.m8n16.{x1,x2,x4}{.shared}"
                                   ".b8x16.b4x16_p64")
    rest = p[5:-2]
    space = rest[0] if rest else None
    if len(rest) > 1 or space not in (None, "shared", "shared::cta"):
        raise ctx.unsupported(ins, f"modifiers {rest}")
    return _NUM[p[4]], "b4x16_p64", space


def _operands(ins, ctx, load: bool):
    """(matrices, .trans, state space, register operands, address getter, the lanes giving row addresses)."""
    n, trans, space = _decode(ins, ctx)
    regs, addr = (ins.operands[0], ins.operands[1]) if load else (ins.operands[1], ins.operands[0])
    items = list(regs.items) if regs.kind == "vec" else [regs]
    if len(items) != n:
        raise ctx.unsupported(ins, f"{len(items)} registers for .x{n}")
    return n, trans, space, items, ctx.addr(addr)[1], np.arange(8 * n)


def _rows(w, ins, m, ga, n):
    if m is not FULL and not m.all():
        raise EmulationError(f"{ins.parts[0]} executed by a partial warp (lanes {np.nonzero(~m)[0].tolist()} missing), "
                             f"{w.where(ins)}")
    addrs = ga(w)[:8 * n]
    if (addrs % 16).any():
        bad = int(np.argmax(addrs % 16 != 0))
        raise EmulationError(f"{ins.parts[0]}: row address {int(addrs[bad]):#x} is not 16-byte aligned, "
                             f"{w.where(ins, bad)}")
    return addrs


@opcode("ldmatrix")
def _ldmatrix(ins, ctx):
    n, trans, space, items, ga, lanes = _operands(ins, ctx, load=True)
    sets = [ctx.dst(x, np.uint32) for x in items]

    if trans == "b4x16_p64":
        return _ldmatrix_b4x16_p64(ins, n, space, sets, ga, lanes)

    def ex(w, m):
        addrs = _rows(w, ins, m, ga, n)
        mat = np.ascontiguousarray(read_bytes(w, ins, space, addrs, 16, lanes)).view(np.uint16).reshape(n, 8, 8)
        for i in range(n):
            if trans:
                lo, hi = mat[i, _COL, _ROW], mat[i, _COL + 1, _ROW]
            else:
                lo, hi = mat[i, _ROW, _COL], mat[i, _ROW, _COL + 1]
            sets[i](w, m, lo.astype(np.uint32) | (hi.astype(np.uint32) << np.uint32(16)))

    return ex


def _ldmatrix_b4x16_p64(ins, n, space, sets, ga, lanes):
    shifts = (np.arange(4, dtype=np.uint32) * np.uint32(8))[None, :]

    def ex(w, m):
        addrs = _rows(w, ins, m, ga, n)
        raw = np.ascontiguousarray(read_bytes(w, ins, space, addrs, 8, lanes)).reshape(n, 8, 8)  # padding unread
        nib = np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(n, 8, 16).astype(np.uint32)  # [matrix, row, column]
        cols = (LANE_IDS & 3).astype(np.int64)[:, None] * 4 + np.arange(4)[None, :]  # [lane, byte]
        for i in range(n):
            sets[i](w, m, (nib[i][_ROW[:, None], cols] << shifts).sum(axis=1, dtype=np.uint32))

    return ex


@opcode("stmatrix")
def _stmatrix(ins, ctx):
    n, trans, space, items, ga, lanes = _operands(ins, ctx, load=False)
    gets = [ctx.src(x, np.uint32) for x in items]

    def ex(w, m):
        addrs = _rows(w, ins, m, ga, n)
        mat = np.zeros((n, 8, 8), np.uint16)
        for i in range(n):
            v = gets[i](w).astype(np.uint32)
            lo, hi = (v & np.uint32(0xFFFF)).astype(np.uint16), (v >> np.uint32(16)).astype(np.uint16)
            if trans:
                mat[i, _COL, _ROW], mat[i, _COL + 1, _ROW] = lo, hi
            else:
                mat[i, _ROW, _COL], mat[i, _ROW, _COL + 1] = lo, hi
        write_bytes(w, ins, space, addrs, mat.reshape(8 * n, 8).view(np.uint8).reshape(8 * n, 16), lanes)

    return ex
