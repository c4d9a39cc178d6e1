"""Bit-field, population-count and packed 16x2 integer opcodes (PTX ISA "Integer Arithmetic Instructions":
``bfe``, ``bfi``, ``popc``, ``clz``, ``brev``, ``bfind``, and the ``.u16x2`` / ``.s16x2`` forms of ``add``,
``sub``, ``min``, ``max``), as Triton's generated PTX uses them.

Semantics exactly as the ISA's pseudocode:

* ``bfe.{u32,s32,u64,s64} d, a, b, c``: ``pos = b & 0xff``, ``len = c & 0xff``; bit ``i`` of ``d`` is
  ``a[pos + i]`` for ``i < len`` and ``pos + i <= msb``, else the sign bit: 0 for ``.u``, and for ``.s``
  ``a[min(pos + len - 1, msb)]`` (0 when ``len == 0``);
* ``bfi.{b32,b64} f, a, b, c, d``: ``f = b`` with bits ``[pos, pos + len)`` (``pos = c & 0xff``,
  ``len = d & 0xff``, clipped at the msb) replaced by the low bits of ``a``;
* ``popc`` / ``clz`` give a ``.u32``; ``brev`` reverses the bits; ``bfind{.shiftamt}`` is the bit position of
  the most significant non-sign bit (``0xffffffff`` when none; ``.shiftamt``: ``msb - position``);
* ``add`` / ``sub`` ``.{u16x2,s16x2}`` wrap each half independently; ``min`` / ``max`` ``.{u16x2,s16x2}``
  compare each half (``.relu`` on ``.s16x2`` clamps a negative result to 0).
"""

from __future__ import annotations

import numpy as np

from nvgemm.emulator.ptx.ops import opcode

_U = {32: np.uint32, 64: np.uint64}


def _width(t: str) -> int:
    return int(t[1:])


def bfe(a: np.ndarray, pos: np.ndarray, ln: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """``bfe`` per the ISA's pseudocode on unsigned bit patterns (returns the unsigned pattern)."""
    if bits == 64:
        return _bfe_scalar(a, pos, ln, bits, signed)
    v = a.astype(np.int64) & 0xFFFFFFFF
    p = pos.astype(np.int64) & 0xFF
    n = ln.astype(np.int64) & 0xFF
    n_in = np.clip(np.minimum(n, bits - p), 0, bits)  # field bits that lie inside the source
    field = np.where(p < bits, v >> np.minimum(p, bits - 1), 0) & ((np.int64(1) << n_in) - 1)
    if signed:
        sbit = np.where(n > 0, (v >> np.minimum(p + n - 1, bits - 1)) & 1, 0)
        fill = ((np.int64(1) << bits) - 1) ^ ((np.int64(1) << n_in) - 1)  # bits n_in .. msb take the sign
        field = np.where(sbit == 1, field | fill, field)
    return field.astype(np.uint32)


def _bfe_scalar(a, pos, ln, bits, signed):
    ud = _U[bits]
    out = np.zeros(a.shape, ud)
    for lane in range(a.size):
        p, n, v = int(pos.flat[lane]) & 0xFF, int(ln.flat[lane]) & 0xFF, int(a.flat[lane])
        sbit = ((v >> min(p + n - 1, bits - 1)) & 1) if (signed and n) else 0
        r = 0
        for i in range(bits):
            r |= (((v >> (p + i)) & 1) if (i < n and p + i <= bits - 1) else sbit) << i
        out.flat[lane] = r
    return out


def bfi(f: np.ndarray, b: np.ndarray, pos: np.ndarray, ln: np.ndarray, bits: int) -> np.ndarray:
    """``bfi``: ``b`` with ``len`` bits at ``pos`` taken from ``f`` (clipped at the msb)."""
    ud = _U[bits]
    out = np.zeros(b.shape, ud)
    for lane in range(b.size):
        p, n = int(pos.flat[lane]) & 0xFF, int(ln.flat[lane]) & 0xFF
        v, src = int(b.flat[lane]), int(f.flat[lane])
        for i in range(n):
            if p + i > bits - 1:
                break
            v = (v & ~(1 << (p + i))) | (((src >> i) & 1) << (p + i))
        out.flat[lane] = v & ((1 << bits) - 1)
    return out


@opcode("bfe")
def _bfe(ins, ctx):
    t = ins.parts[-1]
    if ins.parts[1:] != [t] or t not in ("u32", "s32", "u64", "s64"):
        raise ctx.unsupported(ins)
    bits = _width(t)
    d, a, b, c = ins.operands
    ga, gb, gc = ctx.src(a, _U[bits]), ctx.src(b, np.uint32), ctx.src(c, np.uint32)
    sd = ctx.dst(d, _U[bits])
    signed = t[0] == "s"
    return lambda w, m: sd(w, m, bfe(ga(w), gb(w), gc(w), bits, signed))


@opcode("bfi")
def _bfi(ins, ctx):
    t = ins.parts[-1]
    if ins.parts[1:] != [t] or t not in ("b32", "b64"):
        raise ctx.unsupported(ins)
    bits = _width(t)
    d, f, b, c, n = ins.operands
    gf, gb = ctx.src(f, _U[bits]), ctx.src(b, _U[bits])
    gc, gn, sd = ctx.src(c, np.uint32), ctx.src(n, np.uint32), ctx.dst(d, _U[bits])
    return lambda w, m: sd(w, m, bfi(gf(w), gb(w), gc(w), gn(w), bits))


def popc(a: np.ndarray, bits: int) -> np.ndarray:
    b = np.ascontiguousarray(a.astype(_U[bits]))
    return np.unpackbits(b.view(np.uint8).reshape(b.size, bits // 8), axis=1).sum(1).astype(np.uint32).reshape(a.shape)


def clz(a: np.ndarray, bits: int) -> np.ndarray:
    return np.array([bits - (int(v) & ((1 << bits) - 1)).bit_length() for v in a.ravel()],
                    np.uint32).reshape(a.shape)


def brev(a: np.ndarray, bits: int) -> np.ndarray:
    return np.array([int(format(int(v) & ((1 << bits) - 1), f"0{bits}b")[::-1], 2) for v in a.ravel()],
                    _U[bits]).reshape(a.shape)


def bfind(a: np.ndarray, bits: int, signed: bool, shiftamt: bool) -> np.ndarray:
    out = []
    for v in a.ravel():
        v = int(v) & ((1 << bits) - 1)
        if signed and v >> (bits - 1):
            v = ~v & ((1 << bits) - 1)  # the most significant bit that differs from the sign
        p = v.bit_length() - 1
        out.append(0xFFFFFFFF if p < 0 else (bits - 1 - p if shiftamt else p))
    return np.array(out, np.uint32).reshape(a.shape)


@opcode("popc", "clz", "brev", "bfind")
def _count(ins, ctx):
    op, t = ins.parts[0], ins.parts[-1]
    mods = ins.parts[1:-1]
    if op == "bfind":
        ok = t in ("u32", "s32", "u64", "s64") and mods in ([], ["shiftamt"])
    else:
        ok = t in ("b32", "b64") and not mods
    if not ok:
        raise ctx.unsupported(ins)
    bits = _width(t)
    d, a = ins.operands
    ga = ctx.src(a, _U[bits])
    if op == "brev":
        sd = ctx.dst(d, _U[bits])
        return lambda w, m: sd(w, m, brev(ga(w), bits))
    sd = ctx.dst(d, np.uint32)
    if op == "bfind":
        signed, sh = t[0] == "s", bool(mods)
        return lambda w, m: sd(w, m, bfind(ga(w), bits, signed, sh))
    fn = popc if op == "popc" else clz
    return lambda w, m: sd(w, m, fn(ga(w), bits))


def packed16x2(ins, ctx):
    """``{add,sub,min,max}{.relu}.{u16x2,s16x2} d, a, b``: two independent 16-bit lanes of a .b32."""
    op, t = ins.parts[0], ins.parts[-1]
    mods = ins.parts[1:-1]
    relu = mods == ["relu"]
    if mods and not (relu and op in ("min", "max") and t == "s16x2"):
        raise ctx.unsupported(ins, f"modifier(s) {mods}")
    hdt = np.int16 if t == "s16x2" else np.uint16
    d, a, b = ins.operands
    ga, gb, sd = ctx.src(a, np.uint32), ctx.src(b, np.uint32), ctx.dst(d, np.uint32)

    def halves(v):
        return (v & np.uint32(0xFFFF)).astype(np.uint16).view(hdt), (v >> np.uint32(16)).astype(np.uint16).view(hdt)

    def one(x, y):
        if op in ("add", "sub"):
            wide = x.astype(np.int64) + (y.astype(np.int64) if op == "add" else -y.astype(np.int64))
            return (wide & 0xFFFF).astype(np.uint16)
        r = np.minimum(x, y) if op == "min" else np.maximum(x, y)
        if relu:
            r = np.maximum(r, 0).astype(hdt)
        return r.view(np.uint16)

    def ex(w, m):
        al, ah = halves(ga(w))
        bl, bh = halves(gb(w))
        lo, hi = one(al, bl), one(ah, bh)
        sd(w, m, lo.astype(np.uint32) | (hi.astype(np.uint32) << np.uint32(16)))

    return ex


PACKED_TYPES = ("u16x2", "s16x2")

__all__ = ["PACKED_TYPES", "bfe", "bfi", "bfind", "brev", "clz", "packed16x2", "popc"]
