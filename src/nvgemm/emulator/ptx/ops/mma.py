"""``mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32`` (PTX ISA "Warp-level Matrix
Multiply-Accumulate Instructions", "Matrix Fragments for mma.m16n8k16 with floating point type"), and the
block-scaled ``mma.sync.aligned.m16n8k{64,32}.row.col.kind::{mxf4nvf4,mxf4,mxf8f6f4}.block_scale`` of sm_120a /
sm_121a, in either qualifier order (see :func:`block_scale_qualifiers`, :func:`_mma_block_scale`).

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

from nvgemm.emulator.isa import numerics
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
    if "block_scale" in p:
        return _mma_block_scale(ins, ctx)
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


# ------------------------------------------------------------------------------------------------------------
# block-scaled mma.sync (sm_120a / sm_121a)
# ------------------------------------------------------------------------------------------------------------
#
# PTX ISA 9.7.14.3 "Block Scaling for mma.sync" and the fragment sections for m16n8k64 (.e2m1) and m16n8k32
# (8-bit types):
#
#   mma.sync.aligned.shape.row.col.kind.block_scale.scale_vec.f32.atype.btype.f32.stype
#       d, a, b, c, scale-a-data, {byte-id-a, thread-id-a}, scale-b-data, {byte-id-b, thread-id-b};
#
# D = (A * scale_A) (B * scale_B) + C. scale_A is M x SF (SF = 1, 2, 4 for scale_vec::1X / 2X / 4X): each row
# of A is cut into SF chunks of K / SF elements, chunk s multiplied by scale_A[m, s]; scale_B is SF x N,
# likewise per column of B. Valid combinations (ISA table "Valid combinations of .scale_vec_size and .kind"):
#   kind::mxf8f6f4  e4m3 / e5m2 / e2m1 (e3m2, e2m3: not modelled)       ue8m0  1X   m16n8k32
#   kind::mxf4      e2m1                                                  ue8m0  2X   m16n8k64
#   kind::mxf4nvf4  e2m1                                                  ue8m0  2X / 4X, ue4m3 4X   m16n8k64
#
# Fragments (groupID G = laneid >> 2, threadID_in_group Q = laneid % 4; E elements per .b32 register, 8 for
# e2m1 packed low nibble first (kinds mxf4 / mxf4nvf4), 4 for 8-bit containers low byte first (kind::mxf8f6f4,
# whose e2m1 operand sits in bits 5..2 of its byte: CUTLASS's sm_120 collective shifts the ldmatrix
# .b4x16_p64 result left by 2 for it); element i in register i // E, slot i % E):
#   A (16 x K): 4 registers; row = G + 8 * (r % 2), col = Q * E + (i % E) + (K / 2) * (r // 2), r = i // E
#   B (K x 8):  2 registers; row = Q * E + (i % E) + (K / 2) * r, col = G
#   C / D:      as m16n8k16 (f32).
# Scale selectors: scale-a-data / scale-b-data are one .b32 register per lane; thread-id-a (0 or 1) picks the
# lanes that supply scale_A -- row m from lane 4 * (m % 8) + 2 * thread-id-a + m // 8 -- and thread-id-b
# (0..3) the lanes for scale_B -- column n from lane 4 * n + thread-id-b; byte-id picks the byte(s) of that
# register: 1X one byte (byte-id 0..3); 2X / 4X the chunk-s scale in byte s (byte-id 0). Other byte-id values
# of 2X / 4X are refused (not modelled). Arithmetic as numerics.dot_f32: exact products, one fp32 rounding.

_BS_SHAPES = {"kind::mxf4nvf4": "m16n8k64", "kind::mxf4": "m16n8k64", "kind::mxf8f6f4": "m16n8k32"}
_BS_VALID = {
    "kind::mxf4nvf4": ({("e2m1", "e2m1")}, {("scale_vec::2X", "ue8m0"), ("scale_vec::4X", "ue8m0"),
                                             ("scale_vec::4X", "ue4m3")}),
    "kind::mxf4": ({("e2m1", "e2m1")}, {("scale_vec::2X", "ue8m0")}),
    "kind::mxf8f6f4": ({(x, y) for x in ("e4m3", "e5m2", "e2m1") for y in ("e4m3", "e5m2", "e2m1")},
                       {("scale_vec::1X", "ue8m0")}),
}
_SF_COUNT = {"scale_vec::1X": 1, "scale_vec::2X": 2, "scale_vec::4X": 4}


def _bs_index(k: int, epr: int):
    """Flat gathers of the block-scaled fragments: element (i, lane) -> A position (row * k + col) and
    B position (col * k + row, i.e. B stored as N x K)."""
    na, nb = 4 * epr, 2 * epr
    a_pos = np.zeros((na, 32), np.int64)
    for i in range(na):
        r, j = divmod(i, epr)
        a_pos[i] = (_G + 8 * (r % 2)) * k + _Q * epr + j + (k // 2) * (r // 2)
    b_pos = np.zeros((nb, 32), np.int64)
    for i in range(nb):
        r, j = divmod(i, epr)
        b_pos[i] = _G * k + _Q * epr + j + (k // 2) * r
    a_g = np.zeros(16 * k, np.int64)
    a_g[a_pos.ravel()] = np.arange(na * 32)
    b_g = np.zeros(8 * k, np.int64)
    b_g[b_pos.ravel()] = np.arange(nb * 32)
    return a_g, b_g


_BS_GATHER = {(64, 8): _bs_index(64, 8), (32, 4): _bs_index(32, 4)}
SFA_LANE = (4 * (np.arange(16) % 8) + np.arange(16) // 8).astype(np.int64)  # thread-id-a 0; +2 for 1
SFB_LANE = (4 * np.arange(8)).astype(np.int64)  # thread-id-b 0; + thread-id-b


def _unpack(regs: np.ndarray, epr: int) -> np.ndarray:
    """[registers, 32 lanes] uint32 -> element codes [register * epr + slot, lane] (low bits first)."""
    bits = 32 // epr
    shifts = (np.arange(epr, dtype=np.uint32) * bits)[None, :, None]
    codes = (regs[:, None, :] >> shifts) & np.uint32((1 << bits) - 1)
    return codes.reshape(-1, 32)


def _scale_codes(reg: np.ndarray, lanes: np.ndarray, nsf: int, byte_id: int) -> np.ndarray:
    """Scale codes [row or column, chunk] from the scale register of ``lanes``: chunk s in byte s (2X / 4X),
    the one chunk of 1X in byte ``byte_id``."""
    sbytes = np.arange(nsf, dtype=np.uint32) if nsf > 1 else np.array([byte_id], dtype=np.uint32)
    return (reg[lanes][:, None] >> (np.uint32(8) * sbytes[None, :])) & np.uint32(0xFF)


_BS_DEFAULT_VEC = {"kind::mxf4": "scale_vec::2X", "kind::mxf8f6f4": "scale_vec::1X"}  # mxf4nvf4: mandatory


def block_scale_qualifiers(p: list[str]) -> list[str] | None:
    """The one canonical spelling of a block-scaled mma's dotted parts,
    ``mma.sync.aligned.kind.block_scale.scale_vec.shape.row.col.f32.atype.btype.f32.stype``, or None for a form
    outside the accepted ones. Accepted: the ISA's ``mma.sync.aligned.shape.row.col.kind.block_scale{.scale_vec}
    ...`` and the kind-first ``mma.sync.aligned.kind.block_scale{.scale_vec}.shape.row.col...`` (CUTLASS's
    spelling, which ptxas also takes); a missing ``.scale_vec`` is the ISA's default (2X for kind::mxf4, 1X for
    kind::mxf8f6f4; kind::mxf4nvf4 has none: it must be given)."""
    if p[:3] != ["mma", "sync", "aligned"] or len(p) < 12:
        return None
    quals, types = p[3:-5], p[-5:]
    if quals[0].startswith("kind::"):  # kind group first: kind, block_scale, optional scale_vec
        n = 3 if len(quals) > 2 and quals[2].startswith("scale_vec::") else 2
        group, shape_rc = quals[:n], quals[n:]
    else:
        shape_rc, group = quals[:3], quals[3:]
    if (len(shape_rc) != 3 or shape_rc[1:] != ["row", "col"] or not group[:1] or not group[0].startswith("kind::")
            or group[1:2] != ["block_scale"] or len(group) not in (2, 3)
            or (len(group) == 3 and not group[2].startswith("scale_vec::"))):
        return None
    kind = group[0]
    vec = group[2] if len(group) == 3 else _BS_DEFAULT_VEC.get(kind)
    if vec is None:
        return None
    return ["mma", "sync", "aligned", kind, "block_scale", vec, shape_rc[0], "row", "col", *types]


def _mma_block_scale(ins, ctx):
    p = block_scale_qualifiers(ins.parts)
    kind = p[3] if p is not None else None
    if p is None or kind not in _BS_SHAPES:
        raise ctx.unsupported(ins, "block-scaled mma form (expected mma.sync.aligned.shape.row.col.kind::*."
                                   "block_scale{.scale_vec::*}.f32.atype.btype.f32.stype, or with "
                                   "kind::*.block_scale{.scale_vec::*} before the shape; .scale_vec is required "
                                   "for kind::mxf4nvf4)")
    vec = p[5]
    shape, row, col, dt, at, bt, ct, st = p[6:14]
    pairs, scales = _BS_VALID[kind]
    if shape != _BS_SHAPES[kind] or (row, col, dt, ct) != ("row", "col", "f32", "f32"):
        raise ctx.unsupported(ins, f"{kind} is {_BS_SHAPES[kind]}.row.col with f32 C / D")
    if (at, bt) not in pairs or (vec, st) not in scales:
        raise ctx.unsupported(ins, f"{kind} with .{at}.{bt}, .{vec}, .{st} is not a combination the emulator "
                                   f"models (PTX ISA valid combinations; e3m2 / e2m3 / e2m1 in mxf8f6f4 are not "
                                   f"modelled)")
    k = 64 if shape == "m16n8k64" else 32
    epr = 8 if k == 64 else 4
    # an e2m1 operand of kind::mxf8f6f4: the 4-bit code in bits 5..2 of its 8-bit container
    code_a = (lambda c: (c >> np.uint32(2)) & np.uint32(0xF)) if (k == 32 and at == "e2m1") else (lambda c: c)
    code_b = (lambda c: (c >> np.uint32(2)) & np.uint32(0xF)) if (k == 32 and bt == "e2m1") else (lambda c: c)
    nsf = _SF_COUNT[vec]
    if len(ins.operands) != 8:
        raise ctx.unsupported(ins, "operand count (d, a, b, c, scale-a-data, {byte-id-a, thread-id-a}, "
                                   "scale-b-data, {byte-id-b, thread-id-b})")
    d, a, b, c, sa, sela, sb, selb = ins.operands
    sizes = [len(x.items) if x.items else 1 for x in (d, a, b, c, sa, sela, sb, selb)]
    if sizes != [4, 4, 2, 4, 1, 2, 1, 2]:
        raise ctx.unsupported(ins, f"operand vector sizes {sizes}, expected [4, 4, 2, 4, 1, 2, 1, 2]")
    items = lambda x: x.items if x.items else [x]  # noqa: E731
    ga = [ctx.src(x, np.uint32) for x in a.items]
    gb = [ctx.src(x, np.uint32) for x in b.items]
    gc = [ctx.src(x, np.float32) for x in c.items]
    gsa, gsb = ctx.src(items(sa)[0], np.uint32), ctx.src(items(sb)[0], np.uint32)
    gsel = [ctx.src(x, np.uint32) for x in (*sela.items, *selb.items)]
    sd = [ctx.dst(x, np.uint32) for x in d.items]
    a_g, b_g = _BS_GATHER[(k, epr)]
    chunk = k // nsf

    def selectors(w):
        vals = []
        for name, g in zip(("byte-id-a", "thread-id-a", "byte-id-b", "thread-id-b"), gsel):
            v = np.asarray(g(w)).astype(np.int64)
            if not (v == v[0]).all():
                raise EmulationError(f"{ins.opcode}: {name} differs across the warp ({sorted(set(v.tolist()))}), "
                                     f"{w.where(ins)}")
            vals.append(int(v[0]))
        bid_a, tid_a, bid_b, tid_b = vals
        for name, bid in (("byte-id-a", bid_a), ("byte-id-b", bid_b)):
            ok = range(4) if nsf == 1 else (0,)
            if bid not in ok:
                raise EmulationError(f"{ins.opcode}: {name} {bid} with .{vec}: the emulator models "
                                     f"{list(ok)}, {w.where(ins)}")
        if tid_a not in (0, 1) or tid_b not in range(4):
            raise EmulationError(f"{ins.opcode}: thread-id-a {tid_a} / thread-id-b {tid_b} out of range "
                                 f"(0..1 / 0..3), {w.where(ins)}")
        return bid_a, tid_a, bid_b, tid_b

    def ex(w, m):
        if m is not FULL and not m.all():
            raise EmulationError(f"mma.sync.aligned executed by a partial warp (lanes "
                                 f"{np.nonzero(~m)[0].tolist()} missing), {w.where(ins)}")
        bid_a, tid_a, bid_b, tid_b = selectors(w)
        ar = np.stack([np.asarray(g(w), np.uint32) for g in ga])
        br = np.stack([np.asarray(g(w), np.uint32) for g in gb])
        cr = np.stack([np.asarray(g(w), np.float32) for g in gc])
        A = numerics.values(code_a(_unpack(ar, epr).ravel()[a_g]), at).reshape(16, k)
        B = numerics.values(code_b(_unpack(br, epr).ravel()[b_g]), bt).reshape(8, k)
        sfa = numerics.values(_scale_codes(np.asarray(gsa(w), np.uint32), SFA_LANE + 2 * tid_a, nsf, bid_a), st)
        sfb = numerics.values(_scale_codes(np.asarray(gsb(w), np.uint32), SFB_LANE + tid_b, nsf, bid_b), st)
        A = A * np.repeat(sfa, chunk, axis=1)
        B = B * np.repeat(sfb, chunk, axis=1)
        C = cr.ravel()[C_GATHER].reshape(16, 8)
        D = numerics.dot_f32(A, B, C)
        out = numerics.f32_bits(D.ravel()[C_FLAT]).reshape(4, 32)
        for i in range(4):
            sd[i](w, m, out[i])

    return ex
