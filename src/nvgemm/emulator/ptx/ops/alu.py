"""Integer, bit, predicate and data-movement opcodes (PTX ISA 9.x, sections "Integer Arithmetic",
"Logic and Shift", "Comparison and Selection", "Data Movement: mov", "cvt" between integer types).

Semantics implemented exactly as written in the ISA: two's-complement wrap-around, ``mul.hi`` /
``mul.wide`` on the full product, shift amounts clamped to the width (``shr.s`` sign-fills),
``shf`` funnel shifts with ``.wrap`` (amount mod 32) or ``.clamp`` (min(amount, 32)), ``lop3``
computing bit ``i`` as ``immLut >> (a_i << 2 | b_i << 1 | c_i) & 1``, ``prmt`` default mode (byte
selector nibbles, bit 3 = replicate the selected byte's sign), ``dp4a`` / ``dp2a`` byte dot products, and
``setp`` on every numeric type including ``.f16`` / ``.f16x2`` / ``.bf16`` / ``.bf16x2`` ("Half Precision
Comparison Instructions").
"""

from __future__ import annotations

import numpy as np

from nvgemm.emulator.ptx.machine import LANES
from nvgemm.emulator.ptx.program import TYPE_DTYPE
from nvgemm.emulator.ptx.ops import opcode
from nvgemm.emulator.ptx.ops.bits import PACKED_TYPES, packed16x2
from nvgemm.emulator.ptx.ops.fp import FORMATS as FP_FORMATS, compile_fp_arith, from_bits, ftz32

_INT = {"s16", "u16", "s32", "u32", "s64", "u64", "b16", "b32", "b64", "s8", "u8", "b8"}
_WIDER = {np.dtype(np.int16): np.int32, np.dtype(np.uint16): np.uint32, np.dtype(np.int32): np.int64,
          np.dtype(np.uint32): np.uint64, np.dtype(np.int64): object, np.dtype(np.uint64): object}


def _mods(ins, known: set[str], ctx, start: int = 1):
    """The instruction's modifiers after the base opcode; unknown ones are an error."""
    mods = ins.parts[start:]
    bad = [m for m in mods if m not in known]
    if bad:
        raise ctx.unsupported(ins, f"modifier(s) {bad}")
    return mods


def _type_of(ins, ctx, allowed: set[str]) -> str:
    t = ins.parts[-1]
    if t not in allowed:
        raise ctx.unsupported(ins, f"type .{t}")
    return t


def _binary(ins, ctx, fn, t):
    dt = TYPE_DTYPE[t]
    d, a, b = ins.operands
    ga, gb, sd = ctx.src(a, dt), ctx.src(b, dt), ctx.dst(d, dt)

    def ex(w, m):
        sd(w, m, fn(ga(w), gb(w)).astype(dt, copy=False))

    return ex


def _full_product(a: np.ndarray, b: np.ndarray, dt) -> np.ndarray:
    """Exact product as Python ints (object array) for 64-bit, numpy wide ints otherwise."""
    wide = _WIDER[np.dtype(dt)]
    if wide is object:
        return np.array([int(x) * int(y) for x, y in zip(a.tolist(), b.tolist())], dtype=object)
    return a.astype(wide) * b.astype(wide)


def _wrap(v: np.ndarray, dt) -> np.ndarray:
    """Python-int / wide array -> ``dt`` with two's-complement wrap-around."""
    dt = np.dtype(dt)
    bits = 8 * dt.itemsize
    if v.dtype == object:
        mask = (1 << bits) - 1
        u = np.array([int(x) & mask for x in v], dtype=np.uint64 if bits == 64 else np.uint32)
        return u.view(dt) if u.dtype.itemsize == dt.itemsize else u.astype(dt)
    return v.astype(dt)


def _hi(v: np.ndarray, dt) -> np.ndarray:
    dt = np.dtype(dt)
    bits = 8 * dt.itemsize
    if v.dtype == object:
        return _wrap(np.array([int(x) >> bits for x in v], dtype=object), dt)
    return (v >> bits).astype(dt)


@opcode("add", "sub")
def _add(ins, ctx):
    t = ins.parts[-1]
    if t in PACKED_TYPES:
        return packed16x2(ins, ctx)
    if t not in _INT:
        return compile_fp_arith(ins, ctx)
    _mods(ins, {"s16", "u16", "s32", "u32", "s64", "u64"}, ctx)
    op = np.add if ins.parts[0] == "add" else np.subtract
    return _binary(ins, ctx, op, t)


@opcode("mul")
def _mul(ins, ctx):
    t = ins.parts[-1]
    if t not in _INT:
        return compile_fp_arith(ins, ctx)
    mods = _mods(ins, {"lo", "hi", "wide", "s16", "u16", "s32", "u32", "s64", "u64"}, ctx)
    dt = TYPE_DTYPE[t]
    d, a, b = ins.operands
    ga, gb = ctx.src(a, dt), ctx.src(b, dt)
    if "wide" in mods:
        if t not in ("s16", "u16", "s32", "u32"):
            raise ctx.unsupported(ins, "mul.wide needs a 16/32-bit type")
        wdt = _WIDER[np.dtype(dt)]
        sd = ctx.dst(d, wdt)
        return lambda w, m: sd(w, m, ga(w).astype(wdt) * gb(w).astype(wdt))
    sd = ctx.dst(d, dt)
    if "hi" in mods:
        return lambda w, m: sd(w, m, _hi(_full_product(ga(w), gb(w), dt), dt))
    return lambda w, m: sd(w, m, (ga(w) * gb(w)).astype(dt, copy=False))


@opcode("mad")
def _mad(ins, ctx):
    t = ins.parts[-1]
    if t not in _INT:
        return compile_fp_arith(ins, ctx)
    mods = _mods(ins, {"lo", "hi", "wide", "s16", "u16", "s32", "u32", "s64", "u64"}, ctx)
    dt = TYPE_DTYPE[t]
    d, a, b, c = ins.operands
    ga, gb = ctx.src(a, dt), ctx.src(b, dt)
    if "wide" in mods:
        wdt = _WIDER[np.dtype(dt)]
        gc, sd = ctx.src(c, wdt), ctx.dst(d, wdt)
        return lambda w, m: sd(w, m, ga(w).astype(wdt) * gb(w).astype(wdt) + gc(w))
    gc, sd = ctx.src(c, dt), ctx.dst(d, dt)
    if "hi" in mods:
        return lambda w, m: sd(w, m, _hi(_full_product(ga(w), gb(w), dt), dt) + gc(w))
    return lambda w, m: sd(w, m, (ga(w) * gb(w) + gc(w)).astype(dt, copy=False))


@opcode("min", "max")
def _minmax(ins, ctx):
    t = ins.parts[-1]
    if t in PACKED_TYPES:
        return packed16x2(ins, ctx)
    if t not in _INT:
        return compile_fp_arith(ins, ctx)
    _mods(ins, {"s16", "u16", "s32", "u32", "s64", "u64"}, ctx)
    return _binary(ins, ctx, np.minimum if ins.parts[0] == "min" else np.maximum, t)


@opcode("neg", "abs")
def _neg(ins, ctx):
    t = ins.parts[-1]
    if t not in _INT:
        return compile_fp_arith(ins, ctx)
    _mods(ins, {"s16", "s32", "s64"}, ctx)
    dt = TYPE_DTYPE[t]
    d, a = ins.operands
    ga, sd = ctx.src(a, dt), ctx.dst(d, dt)
    fn = np.negative if ins.parts[0] == "neg" else np.abs
    return lambda w, m: sd(w, m, fn(ga(w)))


@opcode("div", "rem")
def _div(ins, ctx):
    t = ins.parts[-1]
    if t not in _INT:
        return compile_fp_arith(ins, ctx)
    _mods(ins, {"s32", "u32", "s64", "u64"}, ctx)
    dt = TYPE_DTYPE[t]
    d, a, b = ins.operands
    ga, gb, sd = ctx.src(a, dt), ctx.src(b, dt), ctx.dst(d, dt)
    is_div = ins.parts[0] == "div"

    unspecified = np.array(-1).astype(dt)  # all ones

    def ex(w, m):
        x, y = ga(w), gb(w)
        zero = (y == 0) & m
        if zero.any():
            # PTX ISA (div, integer): "Division by zero yields an unspecified, machine-specific value" -- no trap.
            # Compilers speculate divisions whose result a zero divisor's path then discards (NVIDIA's Hopper
            # dense_gemm example: its raster swizzle divides by (nclusterid.x & ~7) * nclusterid.y, 0 for small
            # grids). The emulator's stand-in value is all ones (not hardware's bits: an address or result built
            # from it shows); every occurrence is counted in Launch.stats["int_div_by_zero"].
            st = w.cta.launch.stats
            st["int_div_by_zero"] = st.get("int_div_by_zero", 0) + int(zero.sum())
        ys = np.where(y == 0, 1, y).astype(dt)
        if np.dtype(dt).kind == "i":  # C semantics: truncate toward zero
            q = (np.abs(x.astype(object)) // np.abs(ys.astype(object))) * np.sign(x.astype(object) * ys.astype(object))
            q = _wrap(np.array(q, dtype=object), dt)
            r = _wrap(np.array(x.astype(object) - q.astype(object) * ys.astype(object), dtype=object), dt)
        else:
            q, r = x // ys, x % ys
        sd(w, m, np.where(y == 0, unspecified, q if is_div else r).astype(dt))

    return ex


@opcode("and", "or", "xor")
def _logic(ins, ctx):
    t = _type_of(ins, ctx, {"b16", "b32", "b64", "pred"})
    _mods(ins, {t}, ctx)
    fn = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[ins.parts[0]]
    return _binary(ins, ctx, fn, t)


@opcode("not", "cnot")
def _not(ins, ctx):
    t = _type_of(ins, ctx, {"b16", "b32", "b64", "pred"})
    _mods(ins, {t}, ctx)
    dt = TYPE_DTYPE[t]
    d, a = ins.operands
    ga, sd = ctx.src(a, dt), ctx.dst(d, dt)
    if ins.parts[0] == "cnot":
        return lambda w, m: sd(w, m, (ga(w) == 0).astype(dt))
    return lambda w, m: sd(w, m, ~ga(w))


@opcode("shl", "shr")
def _shift(ins, ctx):
    t = _type_of(ins, ctx, {"b16", "b32", "b64", "s16", "s32", "s64", "u16", "u32", "u64"})
    _mods(ins, {t}, ctx)
    dt = np.dtype(TYPE_DTYPE[t])
    bits = 8 * dt.itemsize
    d, a, b = ins.operands
    ga, gb, sd = ctx.src(a, dt), ctx.src(b, np.uint32), ctx.dst(d, dt)
    left = ins.parts[0] == "shl"
    signed = t.startswith("s") and not left

    def ex(w, m):
        x, n = ga(w), gb(w)
        big = n >= bits
        nn = np.minimum(n, bits - 1).astype(dt)
        if left:
            r = np.where(big, 0, x << nn).astype(dt)
        elif signed:
            r = x >> nn  # arithmetic; amounts >= width give the sign fill, = >> (bits - 1)
        else:
            r = np.where(big, 0, x >> nn).astype(dt)
        sd(w, m, r)

    return ex


@opcode("shf")
def _shf(ins, ctx):
    mods = _mods(ins, {"l", "r", "wrap", "clamp", "b32"}, ctx)
    d, a, b, c = ins.operands
    ga, gb, gc, sd = ctx.src(a, np.uint32), ctx.src(b, np.uint32), ctx.src(c, np.uint32), ctx.dst(d, np.uint32)
    wrap = "wrap" in mods
    left = "l" in mods

    def ex(w, m):
        n = gc(w)
        n = (n & np.uint32(31)) if wrap else np.minimum(n, np.uint32(32))
        v = (gb(w).astype(np.uint64) << np.uint64(32)) | ga(w).astype(np.uint64)
        n64 = n.astype(np.uint64)
        if left:
            r = ((v << n64) >> np.uint64(32)) & np.uint64(0xFFFFFFFF)
        else:
            r = (v >> n64) & np.uint64(0xFFFFFFFF)
        sd(w, m, r.astype(np.uint32))

    return ex


@opcode("lop3")
def _lop3(ins, ctx):
    _mods(ins, {"b32"}, ctx)
    d, a, b, c, lut = ins.operands
    if lut.kind != "imm":
        raise ctx.unsupported(ins, "lop3 with a non-immediate LUT")
    L = lut.value & 0xFF
    ga, gb, gc, sd = ctx.src(a, np.uint32), ctx.src(b, np.uint32), ctx.src(c, np.uint32), ctx.dst(d, np.uint32)
    terms = [i for i in range(8) if (L >> i) & 1]

    def ex(w, m):
        x, y, z = ga(w), gb(w), gc(w)
        r = np.zeros(LANES, np.uint32)
        for i in terms:
            r |= (x if i & 4 else ~x) & (y if i & 2 else ~y) & (z if i & 1 else ~z)
        sd(w, m, r)

    return ex


@opcode("prmt")
def _prmt(ins, ctx):
    mods = _mods(ins, {"b32"}, ctx)
    del mods
    d, a, b, c = ins.operands
    ga, gb, gc, sd = ctx.src(a, np.uint32), ctx.src(b, np.uint32), ctx.src(c, np.uint32), ctx.dst(d, np.uint32)

    def ex(w, m):
        src = np.stack([ga(w), gb(w)], axis=1).view(np.uint8).reshape(LANES, 8)  # bytes 0-3 = a, 4-7 = b
        sel = gc(w)
        out = np.zeros((LANES, 4), np.uint8)
        rows = np.arange(LANES)
        for i in range(4):
            nib = (sel >> np.uint32(4 * i)) & np.uint32(0xF)
            byte = src[rows, (nib & np.uint32(7)).astype(np.int64)]
            sign = np.where(byte & 0x80, 0xFF, 0x00).astype(np.uint8)
            out[:, i] = np.where(nib & np.uint32(8), sign, byte)
        sd(w, m, out.view(np.uint32).reshape(LANES))

    return ex


def _vector_mov(ins, ctx):
    d, a = ins.operands
    t = ins.parts[-1]
    dt = np.dtype(TYPE_DTYPE[t])
    if d.kind == "vec":  # unpack: mov.b32 {lo, hi}, a
        n = len(d.items)
        part = {2: np.uint16, 4: np.uint32, 8: np.uint64}[dt.itemsize // n] if dt.itemsize // n > 1 else np.uint8
        ga = ctx.src(a, dt)
        sets = [ctx.dst(x, part) for x in d.items]

        def ex(w, m):
            v = np.ascontiguousarray(ga(w)).view(part).reshape(LANES, n)
            for i, s in enumerate(sets):
                s(w, m, v[:, i].copy())

        return ex
    n = len(a.items)  # pack: mov.b32 d, {lo, hi}
    part = {2: np.uint16, 4: np.uint32, 8: np.uint64}.get(dt.itemsize // n, np.uint8)
    gets = [ctx.src(x, part) for x in a.items]
    sd = ctx.dst(d, dt)

    def ex2(w, m):
        v = np.stack([g(w) for g in gets], axis=1)
        sd(w, m, np.ascontiguousarray(v).view(dt).reshape(LANES))

    return ex2


@opcode("mov")
def _mov(ins, ctx):
    t = _type_of(ins, ctx, {"b16", "b32", "b64", "u16", "u32", "u64", "s16", "s32", "s64", "f32", "f64", "pred",
                            "f16", "bf16"})
    _mods(ins, {t}, ctx)
    d, a = ins.operands
    if d.kind == "vec" or a.kind == "vec":
        return _vector_mov(ins, ctx)
    dt = TYPE_DTYPE[t]
    ga, sd = ctx.src(a, dt), ctx.dst(d, dt)
    return lambda w, m: sd(w, m, ga(w))


def compile_int_cvt(ins, ctx, dtype_t: str, atype_t: str, mods: list[str]):
    """cvt between integer types: sign/zero extension or truncation (``.sat`` clamps)."""
    dd, da = np.dtype(TYPE_DTYPE[dtype_t]), np.dtype(TYPE_DTYPE[atype_t])
    d, a = ins.operands
    ga, sd = ctx.src(a, da), ctx.dst(d, dd)
    sat = "sat" in mods
    if sat:
        info = np.iinfo(dd)

        def ex_sat(w, m):
            v = ga(w).astype(object) if da.itemsize == 8 else ga(w).astype(np.int64)
            sd(w, m, np.clip(v, info.min, info.max).astype(dd))

        return ex_sat
    return lambda w, m: sd(w, m, ga(w).astype(dd))


_HALF_FMT = {"f16": ("f16", 1), "f16x2": ("f16", 2), "bf16": ("bf16", 1), "bf16x2": ("bf16", 2)}
_UNORDERED = ("equ", "neu", "ltu", "leu", "gtu", "geu")
_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
        "ge": np.greater_equal, "lo": np.less, "ls": np.less_equal, "hi": np.greater, "hs": np.greater_equal}


def _float_compare(cmp_op: str):
    """PTX ISA "Floating Point Notes" of setp: ordered comparisons are false if either operand is NaN, the
    unordered ``equ`` .. ``geu`` true; ``num`` / ``nan`` test for NaN operands. None for an unknown operator."""
    if cmp_op in ("eq", "ne", "lt", "le", "gt", "ge"):
        f = _CMP[cmp_op]
        return lambda x, y: f(x, y) & ~np.isnan(x) & ~np.isnan(y)
    if cmp_op in _UNORDERED:
        f = _CMP[cmp_op[:2]]
        return lambda x, y: f(x, y) | np.isnan(x) | np.isnan(y)
    if cmp_op == "num":
        return lambda x, y: ~np.isnan(x) & ~np.isnan(y)
    if cmp_op == "nan":
        return lambda x, y: np.isnan(x) | np.isnan(y)
    return None


@opcode("setp")
def _setp(ins, ctx):
    """``setp.CmpOp{.BoolOp}{.ftz}.type p{|q}, a, b{, {!}c}`` (PTX ISA "Comparison and Selection Instructions:
    setp" and "Half Precision Comparison Instructions: setp"). Scalar types: ``p = BoolOp(t, c)``,
    ``q = BoolOp(!t, c)``. ``.f16x2`` / ``.bf16x2``: the halves compare independently, ``p`` from the low
    halves, ``q`` from the high halves (not a complement). ``.ftz`` (f32, f16, f16x2) flushes subnormal inputs
    to sign-preserving zero before the comparison."""
    parts = ins.parts
    if len(parts) < 3:
        raise ctx.unsupported(ins)
    cmp_op, t, mods = parts[1], parts[-1], parts[2:-1]
    bool_op = mods[0] if mods and mods[0] in ("and", "or", "xor") else None
    ftz = mods[1 if bool_op else 0:] == ["ftz"]
    if mods[1 if bool_op else 0:] not in ([], ["ftz"]) or t not in TYPE_DTYPE or t == "pred":
        raise ctx.unsupported(ins, "modifiers or type (ISA order: setp.CmpOp{.BoolOp}{.ftz}.type)")
    half = _HALF_FMT.get(t)
    if ftz and t not in ("f32", "f16", "f16x2"):
        raise ctx.unsupported(ins, f".ftz is not defined for .{t}")
    ops = ins.operands
    if len(ops) != (4 if bool_op else 3):
        raise ctx.unsupported(ins, "operand count")
    dst, a, b = ops[0], ops[1], ops[2]
    gc = ctx.src(ops[3], np.bool_) if bool_op else None
    if dst.kind == "dual":
        sp, sq = ctx.dst(dst.items[0], np.bool_), ctx.dst(dst.items[1], np.bool_)
    else:
        sp, sq = ctx.dst(dst, np.bool_), None
    comb = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}.get(bool_op)

    if half is not None:
        fmt, n = half
        if (n == 2) != (sq is not None):
            raise ctx.unsupported(ins, f".{t} writes {'p|q' if n == 2 else 'one predicate p'}")
        cmpf = _float_compare(cmp_op)
        if cmpf is None:
            raise ctx.unsupported(ins, f"comparison .{cmp_op} on .{t}")
        raw = np.uint16 if n == 1 else np.uint32
        ga, gb = ctx.src(a, raw), ctx.src(b, raw)
        min_normal = 2.0 ** FP_FORMATS[fmt][1]

        def value(bits, half_index):
            v = from_bits((bits >> np.uint32(16 * half_index)) & np.uint32(0xFFFF), fmt)
            if ftz:
                v = np.where(np.abs(v) < min_normal, np.copysign(0.0, v), v)
            return v

        def exh(w, m):
            x, y = ga(w), gb(w)
            for i, s in enumerate((sp, sq)[:n]):
                r = cmpf(value(x, i), value(y, i))
                s(w, m, comb(r, gc(w)) if comb is not None else r)

        return exh

    dt = np.dtype(TYPE_DTYPE[t])
    ga, gb = ctx.src(a, dt), ctx.src(b, dt)
    if dt.kind == "f":
        cmpf = _float_compare(cmp_op)
        if ftz:
            inner = cmpf
            cmpf = None if inner is None else (lambda x, y: inner(ftz32(x), ftz32(y)))
    elif cmp_op in _CMP:
        cmpf = _CMP[cmp_op]
        if cmp_op in ("lo", "ls", "hi", "hs") and dt.kind == "i":
            udt = TYPE_DTYPE["u" + t[1:]]
            ga, gb = ctx.src(a, udt), ctx.src(b, udt)
    else:
        cmpf = None
    if cmpf is None:
        raise ctx.unsupported(ins, f"comparison .{cmp_op} on .{t}")

    def ex(w, m):
        r = cmpf(ga(w), gb(w))
        if comb is not None:
            c = gc(w)
            p, q = comb(r, c), comb(~r, c)
        else:
            p, q = r, ~r
        sp(w, m, p)
        if sq is not None:
            sq(w, m, q)

    return ex


@opcode("dp4a", "dp2a")
def _dot_accumulate(ins, ctx):
    """``dp4a.atype.btype d, a, b, c`` and ``dp2a.{lo,hi}.atype.btype d, a, b, c`` (PTX ISA "Integer Arithmetic
    Instructions: dp4a / dp2a"), ``.atype``, ``.btype`` in {``.u32``, ``.s32``}. dp4a: the four bytes of ``a`` and
    of ``b``, sign- or zero-extended by their type, ``d = c + sum a_i b_i``. dp2a: the two 16-bit halves of ``a``
    times bytes 0, 1 (``.lo``) or 2, 3 (``.hi``) of ``b``. ``c`` / ``d`` are ``.u32`` when both types are ``.u32``,
    else ``.s32``; the sum wraps to 32 bits."""
    p = ins.parts
    four = p[0] == "dp4a"
    if four:
        mode, types = None, p[1:]
    else:
        mode, types = (p[1] if len(p) > 1 else None), p[2:]
        if mode not in ("lo", "hi"):
            raise ctx.unsupported(ins, "dp2a needs .lo or .hi")
    if len(types) != 2 or any(x not in ("u32", "s32") for x in types):
        raise ctx.unsupported(ins, "types (.atype.btype from .u32 / .s32)")
    if len(ins.operands) != 4:
        raise ctx.unsupported(ins, "operand count (d, a, b, c)")
    a_signed, b_signed = types[0] == "s32", types[1] == "s32"
    out_dt = np.uint32 if not (a_signed or b_signed) else np.int32
    d, a, b, c = ins.operands
    ga, gb, gc, sd = ctx.src(a, np.uint32), ctx.src(b, np.uint32), ctx.src(c, out_dt), ctx.dst(d, out_dt)
    a_part = (np.int8 if a_signed else np.uint8) if four else (np.int16 if a_signed else np.uint16)
    b_part = np.int8 if b_signed else np.uint8
    first = 0 if (four or mode == "lo") else 2
    n = 4 if four else 2

    def ex(w, m):
        va = np.ascontiguousarray(ga(w)).view(a_part).reshape(LANES, -1).astype(np.int64)  # element 0 = low bits
        vb = np.ascontiguousarray(gb(w)).view(b_part).reshape(LANES, 4).astype(np.int64)[:, first:first + n]
        acc = gc(w).astype(np.int64) + (va * vb).sum(axis=1)
        sd(w, m, (acc & 0xFFFFFFFF).astype(np.uint32).view(out_dt))

    return ex


@opcode("selp")
def _selp(ins, ctx):
    t = _type_of(ins, ctx, {"b16", "b32", "b64", "u16", "u32", "u64", "s16", "s32", "s64", "f32", "f64"})
    _mods(ins, {t}, ctx)
    dt = TYPE_DTYPE[t]
    d, a, b, c = ins.operands
    ga, gb, gc, sd = ctx.src(a, dt), ctx.src(b, dt), ctx.src(c, np.bool_), ctx.dst(d, dt)
    return lambda w, m: sd(w, m, np.where(gc(w), ga(w), gb(w)).astype(dt, copy=False))


__all__ = ["compile_int_cvt"]
