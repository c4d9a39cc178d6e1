"""Floating-point opcodes and ``cvt`` (PTX ISA "Floating-Point Instructions", "Half Precision
Floating-Point Instructions", "cvt").

Rounding is exact: every result is computed as an exact float64 value ``s`` plus an exact error term
``e`` (products of f32 / f16 / bf16 operands are exact in float64; sums use Knuth's TwoSum), then
rounded once to the destination format with the instruction's mode (``.rn`` ties-to-even, ``.rz``,
``.rm``, ``.rp``), handling subnormals, overflow and canonical NaNs (``0x7fffffff`` f32,
``0x7fff`` f16 / bf16). ``.ftz`` flushes f32 subnormal inputs and results to sign-preserving zero;
``.sat`` clamps to [0, 1] (NaN -> 0). An f32 ``add`` / ``mul`` without a rounding modifier is
emulated as ``.rn`` (ptxas may contract it into an fma on hardware: an inexact-data caveat only).

Approximate instructions (``ex2.approx``, ``lg2.approx``, ``rcp.approx``, ``sqrt.approx``,
``tanh.approx``, ``div.approx`` / ``div.full``) are implementation-defined on hardware; they are
computed here in float64 and rounded to nearest, so results on such paths are compared with a
tolerance, never bit for bit.
"""

from __future__ import annotations

import numpy as np

from nvgemm.emulator.ptx.program import TYPE_DTYPE
from nvgemm.emulator.ptx.ops import opcode

# format: (explicit mantissa bits, min normal exponent, max finite, canonical NaN bits)
FORMATS = {
    "f32": (23, -126, float(np.finfo(np.float32).max), 0x7FFFFFFF),
    "f16": (10, -14, 65504.0, 0x7FFF),
    "bf16": (7, -126, float(np.float32(np.uint32(0x7F7F0000).view(np.float32))), 0x7FFF),
    "f64": (52, -1022, float(np.finfo(np.float64).max), 0x7FFFFFFFFFFFFFFF),
}


def fminmax(op: str, a: np.ndarray, b: np.ndarray, propagate_nan: bool = False) -> np.ndarray:
    """PTX ``min`` / ``max`` on floats: a NaN operand is ignored (the other is the result; NaN only if both are),
    or with ``.NaN`` makes the result NaN; ``-0.0`` orders below ``+0.0``."""
    f = np.fmin if op == "min" else np.fmax
    r = f(a, b)
    zeros = (a == 0) & (b == 0)
    if zeros.any():
        neg = np.signbit(a) | np.signbit(b) if op == "min" else np.signbit(a) & np.signbit(b)
        r = np.where(zeros, np.where(neg, -0.0, 0.0), r)
    if propagate_nan:
        r = np.where(np.isnan(a) | np.isnan(b), np.nan, r)
    return r


def two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, np.where(np.isfinite(s), e, 0.0)


def round_fmt(s: np.ndarray, e: np.ndarray | None, fmt: str, mode: str = "rn") -> np.ndarray:
    """Round the exact value ``s + e`` (float64, |e| <= half an ulp of s) to ``fmt``; returns float64
    values representable in ``fmt`` (inf / nan passed through)."""
    s = np.asarray(s, np.float64)
    if mode == "rn" and (e is None or not e.any()):  # fast paths: numpy's conversions round to nearest even
        if fmt == "f32":
            return s.astype(np.float32).astype(np.float64)
        if fmt == "f16":
            return s.astype(np.float16).astype(np.float64)
        if fmt == "f64":
            return s
        with np.errstate(over="ignore", invalid="ignore"):
            f = s.astype(np.float32)
            if ((f.astype(np.float64) == s) | np.isnan(s)).all():  # exact in f32: one rounding to bf16
                u = f.view(np.uint32)
                r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
                r = np.where(np.isnan(f), u, r)  # NaN stays NaN (canonicalised by to_bits)
                return r.view(np.float32).astype(np.float64)
    mant, emin, fmax, _ = FORMATS[fmt]
    e = np.zeros_like(s) if e is None else np.asarray(e, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.isfinite(s)
        ss = np.where(finite, s, 0.0)
        m, ex = np.frexp(ss)  # ss = m 2**ex, 0.5 <= |m| < 1
        ebin = np.maximum(ex - 1, emin)  # exponent of the binade (subnormals share emin)
        q = np.ldexp(1.0, (ebin - mant).astype(np.int64))
        k = ss / q
        fl = np.floor(k)
        frac = k - fl
        pos = ss > 0
        neg = ss < 0
        if mode == "rn":
            up = (frac > 0.5) | ((frac == 0.5) & ((e > 0) | ((e == 0) & (np.fmod(fl, 2) != 0))))
            r = (fl + up) * q
        else:
            on_grid = frac == 0
            if mode == "rz":
                r = np.where(pos, fl, np.where(frac > 0, fl + 1, fl)) * q
                adj_down = on_grid & pos & (e < 0)
                adj_up = on_grid & neg & (e > 0)
            elif mode == "rm":
                r = fl * q
                adj_down = on_grid & (e < 0)
                adj_up = np.zeros_like(adj_down)
            elif mode == "rp":
                r = np.where(frac > 0, fl + 1, fl) * q
                adj_down = np.zeros_like(on_grid)
                adj_up = on_grid & (e > 0)
            else:
                raise ValueError(mode)
            # one step toward -inf / +inf from an on-grid value (the step below a power of two is half
            # the quantum when that power is a normal binade's start)
            pow2 = (np.abs(m) == 0.5) & (ex - 1 > emin)
            q_dn_pos = np.where(pow2 & pos, q / 2, q)
            q_up_neg = np.where(pow2 & neg, q / 2, q)
            r = np.where(adj_down, ss - q_dn_pos, r)
            r = np.where(adj_up, ss + q_up_neg, r)
            zero_exact = (ss == 0) & (e != 0)  # exact zero sum with a nonzero tail: the smallest step
            tiny = np.ldexp(1.0, emin - mant)
            if mode == "rm":
                r = np.where(zero_exact & (e < 0), -tiny, r)
            if mode == "rp":
                r = np.where(zero_exact & (e > 0), tiny, r)
        # overflow
        big = np.abs(r) > fmax
        if mode == "rn":
            r = np.where(big, np.sign(r) * np.inf, r)
        else:
            to_inf = {"rz": np.zeros_like(big), "rm": r < 0, "rp": r > 0}[mode]
            r = np.where(big, np.where(to_inf, np.sign(r) * np.inf, np.sign(r) * fmax), r)
        r = np.where(finite, r, s)
        r = np.where((r == 0) & (np.signbit(ss) | ((ss == 0) & np.signbit(s))), -0.0, r)
    return r


def to_bits(v: np.ndarray, fmt: str) -> np.ndarray:
    """Representable float64 values -> raw bits of ``fmt`` (NaN -> canonical NaN)."""
    nan_bits = FORMATS[fmt][3]
    if fmt == "f32":
        b = v.astype(np.float32).view(np.uint32)
        return np.where(np.isnan(v), np.uint32(nan_bits), b).astype(np.uint32)
    if fmt == "f16":
        b = v.astype(np.float16).view(np.uint16)
        return np.where(np.isnan(v), np.uint16(nan_bits), b).astype(np.uint16)
    if fmt == "bf16":
        b = (v.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
        return np.where(np.isnan(v), np.uint16(nan_bits), b).astype(np.uint16)
    if fmt == "f64":
        return v.view(np.uint64)
    raise ValueError(fmt)


def from_bits(b: np.ndarray, fmt: str) -> np.ndarray:
    """Raw bits of ``fmt`` -> float64 (exact)."""
    if fmt == "f32":
        return b.astype(np.uint32).view(np.float32).astype(np.float64)
    if fmt == "f16":
        return b.astype(np.uint16).view(np.float16).astype(np.float64)
    if fmt == "bf16":
        return (b.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    if fmt == "f64":
        return b.view(np.float64)
    raise ValueError(fmt)


def ftz32(v: np.ndarray) -> np.ndarray:
    return np.where(np.abs(v) < 2.0**-126, np.copysign(0.0, v), v)


_MODES = {"rn", "rz", "rm", "rp"}


def _split(ins, ctx, allowed_extra: set[str]):
    mods = ins.parts[1:]
    t = mods[-1]
    rest = mods[:-1]
    bad = [x for x in rest if x not in _MODES | allowed_extra]
    if bad:
        raise ctx.unsupported(ins, f"modifier(s) {bad}")
    mode = next((x for x in rest if x in _MODES), "rn")
    return t, set(rest), mode


def _exact_op(op: str, xs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    """Exact value (s, e) of op on float64 inputs that are f32/f16/bf16 values."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if op == "add":
            return two_sum(xs[0], xs[1])
        if op == "sub":
            return two_sum(xs[0], -xs[1])
        if op == "mul":
            return xs[0] * xs[1], None  # exact: <= 48 significant bits
        if op in ("fma", "mad"):
            return two_sum(xs[0] * xs[1], xs[2])
    raise ValueError(op)


def compile_fp_arith(ins, ctx):
    op = ins.parts[0]
    t = ins.parts[-1]
    if len(ins.parts) >= 3 and ins.parts[-2] == "f32" and t in ("f16", "bf16"):
        return _compile_mixed(ins, ctx)
    if t in ("f16x2", "bf16x2", "f16", "bf16"):
        return _compile_half(ins, ctx)
    if t == "f32x2":
        return _compile_f32x2(ins, ctx)
    if t not in ("f32", "f64"):
        raise ctx.unsupported(ins, f"type .{t}")
    dt = TYPE_DTYPE[t]
    nin = {"add": 2, "sub": 2, "mul": 2, "fma": 3, "mad": 3, "div": 2, "min": 2, "max": 2, "neg": 1, "abs": 1}[op]
    if op in ("min", "max") and t == "f32" and len(ins.operands) == 4:
        nin = 3  # the three-input form (PTX ISA 8.8, sm_100+): min / max of a, b and c
    if len(ins.operands) != 1 + nin:
        raise ctx.unsupported(ins, f"{len(ins.operands) - 1} source operands")
    extra = ({"ftz", "sat"} | ({"full", "approx"} if op == "div" else set())
             | ({"NaN"} if op in ("min", "max") else set()))
    t, mods, mode = _split(ins, ctx, extra)
    ftz = "ftz" in mods and t == "f32"
    sat = "sat" in mods
    d = ins.operands[0]
    gets = [ctx.src(o, dt) for o in ins.operands[1:1 + nin]]
    sd = ctx.dst(d, dt)

    def fin(w, m, r):
        if ftz:
            r = ftz32(r)
        if sat:
            r = np.where(np.isnan(r), 0.0, np.clip(r, 0.0, 1.0))
        sd(w, m, to_bits(r, t).view(dt))

    def args(w):
        xs = [g(w).astype(np.float64) for g in gets]
        return [ftz32(x) for x in xs] if ftz else xs

    if op in ("add", "sub", "mul", "fma", "mad"):
        if t == "f64" and op in ("mul", "fma", "mad"):
            raise ctx.unsupported(ins, "f64 products are not emulated exactly")

        def ex(w, m):
            s, e = _exact_op(op, args(w))
            fin(w, m, round_fmt(s, e, t, mode))

        return ex
    if op == "div":
        approx = "approx" in mods or "full" in mods

        def exd(w, m):
            x, y = args(w)
            with np.errstate(divide="ignore", invalid="ignore"):
                if approx or t == "f64":
                    r = round_fmt(x / y, None, t, "rn")
                else:
                    q = (x.astype(np.float32) / y.astype(np.float32)).astype(np.float64)  # IEEE RN
                    r = q if mode == "rn" else _directed_div(x, y, q, t, mode)
            fin(w, m, r)

        return exd
    if op in ("min", "max"):
        propagate = "NaN" in mods
        def exm(w, m):
            xs = args(w)
            r = fminmax(op, xs[0], xs[1], propagate)
            for x in xs[2:]:
                r = fminmax(op, r, x, propagate)
            fin(w, m, r)

        return exm
    if op == "neg":
        return lambda w, m: sd(w, m, (gets[0](w).view(np.uint32 if t == "f32" else np.uint64)
                                      ^ (np.uint32(0x80000000) if t == "f32" else np.uint64(1 << 63))).view(dt))
    if op == "abs":
        return lambda w, m: fin(w, m, np.abs(args(w)[0]))
    raise ctx.unsupported(ins)


def _directed_div(x, y, q, t, mode):
    # remainder sign tells the direction of the exact quotient relative to q
    rem = x - q * y  # exact in float64 for f32 operands (q*y has <= 48 bits)
    e = np.sign(rem) * np.sign(y) * np.ldexp(1.0, -1100)
    return round_fmt(q, e, t, mode)


def _bf16_product_rn(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """bf16 x bf16 rounded to nearest-even bf16: the f32 product is exact (16 significant bits) unless
    it is an f32 subnormal, where the general path rounds once from the exact float64 value."""
    p = (x * y).astype(np.float32)
    tiny = (np.abs(p) < np.float32(2.0**-126)) & (p != 0)
    if tiny.any() or not np.isfinite(p).all():
        return round_fmt(x * y, None, "bf16", "rn")
    u = p.view(np.uint32)
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return r.view(np.float32).astype(np.float64)


def _compile_half(ins, ctx):
    op = ins.parts[0]
    t, mods, mode = _split(ins, ctx, {"ftz", "sat"})
    if mods - {"rn"} - _MODES:
        raise ctx.unsupported(ins, f"modifiers {sorted(mods)} on .{t}")
    fmt = t.replace("x2", "")
    nin = {"add": 2, "sub": 2, "mul": 2, "fma": 3, "neg": 1, "abs": 1, "min": 2, "max": 2}.get(op)
    if nin is None:
        raise ctx.unsupported(ins)
    lanes2 = t.endswith("x2")
    rdt = np.uint32 if lanes2 else np.uint16
    gets = [ctx.src(o, rdt) for o in ins.operands[1:1 + nin]]
    sd = ctx.dst(ins.operands[0], rdt)

    def ex(w, m):
        # both halves of every lane at once: a .b32 register viewed as two 16-bit values (low half first)
        xs = [from_bits(np.ascontiguousarray(g(w)).view(np.uint16), fmt) for g in gets]
        if op == "mul" and fmt == "bf16" and mode == "rn":
            r = _bf16_product_rn(xs[0], xs[1])
        elif op in ("add", "sub", "mul", "fma"):
            s, e = _exact_op(op, xs)
            r = round_fmt(s, e, fmt, mode)
        elif op == "neg":
            r = -xs[0]
        elif op == "abs":
            r = np.abs(xs[0])
        else:
            r = (np.fmin if op == "min" else np.fmax)(*xs)
        if "sat" in mods:
            r = np.where(np.isnan(r), 0.0, np.clip(r, 0.0, 1.0))
        out = to_bits(r, fmt)
        sd(w, m, out.view(np.uint32) if lanes2 else out)

    return ex


def _compile_mixed(ins, ctx):
    """Mixed precision (sm_100+): ``fma{.rnd}{.sat}.f32.{f16,bf16} d, a, b, c`` and ``{add,sub}{.rnd}{.sat}.f32.
    {f16,bf16} d, a, c`` -- the 16-bit operands (a, b) are widened, c and d are f32, and the exact result is rounded
    once to f32."""
    op = ins.parts[0]
    src_t = ins.parts[-1]
    nin = {"fma": 3, "add": 2, "sub": 2}.get(op)
    if nin is None:
        raise ctx.unsupported(ins, f"{op} with mixed .f32.{src_t} types")
    mods = ins.parts[1:-2]
    bad = [x for x in mods if x not in _MODES | {"sat"}]
    if bad:
        raise ctx.unsupported(ins, f"modifier(s) {bad}")
    mode = next((x for x in mods if x in _MODES), "rn")
    narrow = nin - 1  # the leading operands are 16-bit, the last one f32
    ops = ins.operands[1:1 + nin]
    gets = [ctx.src(o, np.uint16) for o in ops[:narrow]] + [ctx.src(ops[-1], np.float32)]
    sd = ctx.dst(ins.operands[0], np.float32)

    def ex(w, m):
        xs = [from_bits(np.ascontiguousarray(g(w)), src_t) for g in gets[:narrow]]
        xs.append(gets[-1](w).astype(np.float64))
        s_, e = _exact_op(op, xs)
        r = round_fmt(s_, e, "f32", mode)
        if "sat" in mods:
            r = np.where(np.isnan(r), 0.0, np.clip(r, 0.0, 1.0))
        sd(w, m, to_bits(r, "f32").view(np.float32))

    return ex


def _compile_f32x2(ins, ctx):
    """``{add,sub,mul,fma}{.rnd}{.ftz}{.sat}.f32x2 d, a, b{, c}`` (sm_100+): two independent f32 operations on the
    32-bit halves of .b64 registers, each rounded as its .f32 form."""
    op = ins.parts[0]
    nin = {"add": 2, "sub": 2, "mul": 2, "fma": 3}.get(op)
    if nin is None:
        raise ctx.unsupported(ins, f"{op} on .f32x2")
    _, mods, mode = _split(ins, ctx, {"ftz", "sat"})
    gets = [ctx.src(o, np.uint64) for o in ins.operands[1:1 + nin]]
    sd = ctx.dst(ins.operands[0], np.uint64)
    ftz, sat = "ftz" in mods, "sat" in mods

    def ex(w, m):
        xs = [np.ascontiguousarray(g(w)).view(np.float32).astype(np.float64) for g in gets]  # (64,): both halves
        if ftz:
            xs = [ftz32(x) for x in xs]
        s, e = _exact_op(op, xs)
        r = round_fmt(s, e, "f32", mode)
        if ftz:
            r = ftz32(r)
        if sat:
            r = np.where(np.isnan(r), 0.0, np.clip(r, 0.0, 1.0))
        sd(w, m, np.ascontiguousarray(to_bits(r, "f32")).view(np.uint64))

    return ex


@opcode("copysign")
def _copysign(ins, ctx):
    """``copysign.{f32,f64} d, a, b`` (PTX ISA): the value of ``b`` with the sign bit of ``a`` (bits only: NaNs and
    zeros included)."""
    t = ins.parts[-1]
    if ins.parts[1:] != [t] or t not in ("f32", "f64"):
        raise ctx.unsupported(ins, "copysign.{f32,f64}")
    ut = np.uint32 if t == "f32" else np.uint64
    sign = ut(1 << (31 if t == "f32" else 63))
    d, a, b = ins.operands
    ga, gb, sd = ctx.src(a, ut), ctx.src(b, ut), ctx.dst(d, ut)
    return lambda w, m: sd(w, m, (ga(w) & sign) | (gb(w) & ~sign))


@opcode("fma")
def _fma(ins, ctx):
    return compile_fp_arith(ins, ctx)


@opcode("ex2", "lg2", "rcp", "sqrt", "rsqrt", "tanh", "sin", "cos")
def _approx(ins, ctx):
    op = ins.parts[0]
    t, mods, mode = _split(ins, ctx, {"approx", "ftz", "full"})
    if t != "f32":
        raise ctx.unsupported(ins, f"type .{t}")
    approx = "approx" in mods or "full" in mods
    if not approx and op not in ("rcp", "sqrt"):
        raise ctx.unsupported(ins, "only the .approx form exists")
    fn = {"ex2": np.exp2, "lg2": np.log2, "rcp": lambda x: 1.0 / x, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x),
          "tanh": np.tanh, "sin": np.sin, "cos": np.cos}[op]
    ftz = "ftz" in mods
    g, sd = ctx.src(ins.operands[1], np.float32), ctx.dst(ins.operands[0], np.float32)

    def ex(w, m):
        x = g(w).astype(np.float64)
        if ftz:
            x = ftz32(x)
        with np.errstate(all="ignore"):
            r = fn(x)
        r = round_fmt(r, None, "f32", "rn" if approx else mode)
        if ftz:
            r = ftz32(r)
        sd(w, m, to_bits(r, "f32").view(np.float32))

    return ex


_FLOAT_T = {"f16", "bf16", "f32", "f64"}
_INT_T = {"s8", "u8", "s16", "u16", "s32", "u32", "s64", "u64", "b8", "b16", "b32", "b64"}


_E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_rn_satfinite(x: np.ndarray) -> np.ndarray:
    """float64 -> E2M1 codes (PTX ``cvt.rn.satfinite.e2m1x2.f32`` per element): nearest grid value, ties to the
    even code, saturating at 6 (also +-inf); the sign bit is the input's (``-0.0`` and negative values that
    round to zero give 0x8). NaN has no E2M1 encoding; mapped to 0x7 (documented, not a PTX statement)."""
    a = np.abs(np.nan_to_num(x, nan=6.0, posinf=6.0, neginf=-6.0))
    dist = np.abs(a[..., None] - _E2M1_GRID)
    idx = np.argmin(dist, axis=-1)  # the first (lower) index on a tie
    nxt = np.minimum(idx + 1, 7)
    tie = (np.take_along_axis(dist, nxt[..., None], -1)[..., 0] == np.take_along_axis(dist, idx[..., None], -1)[..., 0])
    idx = np.where(tie & (idx % 2 == 1) & (idx < 7), idx + 1, idx)
    return (idx | (np.signbit(x) & ~np.isnan(x)).astype(np.int64) << 3).astype(np.uint32)


def e4m3_rn_satfinite(x: np.ndarray) -> np.ndarray:
    """float64 -> float8 e4m3fn bits (``cvt.rn.satfinite.e4m3x2.f32`` per element): RNE with subnormals
    (quantum 2**-9), finite overflow saturates to +-448, NaN -> 0x7F."""
    xf = np.nan_to_num(x, nan=0.0, posinf=448.0, neginf=-448.0)
    a0 = np.abs(xf)
    with np.errstate(divide="ignore"):
        e0 = np.maximum(np.floor(np.log2(np.where(a0 > 0, a0, 1.0))), -6)
    q = np.ldexp(1.0, (e0 - 3).astype(np.int64))  # the quantum of the binade (subnormals: 2**-9)
    r = np.copysign(np.minimum(np.rint(a0 / q) * q, 448.0), xf)  # rint: ties to even; satfinite
    a = np.abs(r)
    with np.errstate(divide="ignore"):
        ex = np.where(a > 0, np.floor(np.log2(np.where(a > 0, a, 1.0))), -7)
    sub = ex < -6
    exp_bits = np.where(sub, 0, ex + 7).astype(np.int64)
    mant = np.where(sub, a / 2.0**-9, (a / np.ldexp(1.0, ex.astype(np.int64)) - 1.0) * 8).astype(np.int64)
    bits = (np.signbit(r).astype(np.int64) << 7) | (exp_bits << 3) | mant
    return np.where(np.isnan(x), 0x7F, bits).astype(np.uint32)


def e4m3_to_f64(b: np.ndarray) -> np.ndarray:
    b = b.astype(np.int64) & 0xFF
    sign = np.where(b & 0x80, -1.0, 1.0)
    ex, mant = (b >> 3) & 0xF, b & 0x7
    v = np.where(ex == 0, mant * 2.0**-9, np.ldexp(1.0 + mant / 8.0, (ex - 7)))
    return np.where((b & 0x7F) == 0x7F, np.nan, sign * v)


def _cvt_narrow(ins, ctx, parts):
    """``cvt.rn.satfinite.{e2m1x2,e4m3x2}.f32 d, a, b`` (a -> the upper half of d) and ``cvt.rn.f16x2.e4m3x2``."""
    dtype_t, atype_t, mods = parts[-2], parts[-1], set(parts[:-2])
    if dtype_t in ("e2m1x2", "e4m3x2") and atype_t == "f32" and mods == {"rn", "satfinite"}:
        d, a, b = ins.operands
        ga, gb = ctx.src(a, np.float32), ctx.src(b, np.float32)
        sd = ctx.dst(d, np.uint16)
        enc, width = (e2m1_rn_satfinite, 4) if dtype_t == "e2m1x2" else (e4m3_rn_satfinite, 8)

        def ex(w, m):
            hi = enc(ga(w).astype(np.float64))
            lo = enc(gb(w).astype(np.float64))
            sd(w, m, ((hi << np.uint32(width)) | lo).astype(np.uint16))

        return ex
    if dtype_t == "f16x2" and atype_t == "e4m3x2" and mods == {"rn"}:
        d, a = ins.operands
        ga, sd = ctx.src(a, np.uint16), ctx.dst(d, np.uint32)

        def ex2(w, m):
            v = ga(w).astype(np.uint32)
            hi = to_bits(e4m3_to_f64(v >> np.uint32(8)), "f16").astype(np.uint32)
            lo = to_bits(e4m3_to_f64(v & np.uint32(0xFF)), "f16").astype(np.uint32)
            sd(w, m, (hi << np.uint32(16)) | lo)

        return ex2
    raise ctx.unsupported(ins)


@opcode("cvt")
def _cvt(ins, ctx):
    parts = ins.parts[1:]
    if len(parts) >= 2 and ("e2m1x2" in parts[-2:] or "e4m3x2" in parts[-2:]):
        return _cvt_narrow(ins, ctx, parts)
    if len(parts) >= 2 and parts[-2] in _FLOAT_T | _INT_T | {"bf16x2", "f16x2"}:
        dtype_t, atype_t = parts[-2], parts[-1]
        mods = parts[:-2]
    else:
        raise ctx.unsupported(ins)
    known = {"rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi", "sat", "ftz", "relu", "satfinite"}
    bad = [x for x in mods if x not in known]
    if bad:
        raise ctx.unsupported(ins, f"modifier(s) {bad}")
    if dtype_t in _INT_T and atype_t in _INT_T:
        # lazy: breaks the cycle emulator.ptx.ops.fp <-> emulator.ptx.ops.alu
        from nvgemm.emulator.ptx.ops.alu import compile_int_cvt
        return compile_int_cvt(ins, ctx, dtype_t, atype_t, mods)
    ftz = "ftz" in mods
    sat = "sat" in mods
    if dtype_t in ("bf16x2", "f16x2"):  # cvt.rn.bf16x2.f32 d, a, b: d = {hi: cvt(a), lo: cvt(b)}
        fmt = dtype_t[:-2]
        mode = next((x for x in mods if x in _MODES), None)
        if mode is None or atype_t != "f32" or {"relu", "satfinite"} & set(mods):
            raise ctx.unsupported(ins)
        d, a, b = ins.operands
        ga, gb, sd = ctx.src(a, np.float32), ctx.src(b, np.float32), ctx.dst(d, np.uint32)

        def expk(w, m):
            hi = to_bits(round_fmt(ga(w).astype(np.float64), None, fmt, mode), fmt).astype(np.uint32)
            lo = to_bits(round_fmt(gb(w).astype(np.float64), None, fmt, mode), fmt).astype(np.uint32)
            sd(w, m, (hi << np.uint32(16)) | lo)

        return expk
    d, a = ins.operands
    if atype_t in _FLOAT_T:
        asrc = ctx.src(a, np.uint16 if atype_t in ("f16", "bf16") else TYPE_DTYPE[atype_t])

        def read(w):
            v = asrc(w)
            x = from_bits(v, atype_t) if atype_t in ("f16", "bf16") else v.astype(np.float64)
            return ftz32(x) if ftz and atype_t == "f32" else x
    else:
        asrc = ctx.src(a, TYPE_DTYPE[atype_t])

        def read(w):
            v = asrc(w)
            return v.astype(object) if v.dtype.itemsize == 8 else v.astype(np.float64)

    if dtype_t in _FLOAT_T:
        mode = next((x for x in mods if x in _MODES), None)
        narrowing = (atype_t in _INT_T) or {"f64": 3, "f32": 2, "f16": 1, "bf16": 1}[dtype_t] < \
            {"f64": 3, "f32": 2, "f16": 1, "bf16": 1}[atype_t] or (atype_t, dtype_t) in (("f16", "bf16"), ("bf16", "f16"))
        if narrowing and mode is None:
            raise ctx.unsupported(ins, "a narrowing float conversion needs a rounding modifier")
        if {"relu", "satfinite"} & set(mods):
            raise ctx.unsupported(ins)
        store_dt = np.uint16 if dtype_t in ("f16", "bf16") else TYPE_DTYPE[dtype_t]
        sd = ctx.dst(d, store_dt)

        def ex(w, m):
            x = read(w)
            if x.dtype == object:
                xf = np.array([float(v) for v in x])  # 64-bit ints: exact only below 2**53
                r = round_fmt(xf, None, dtype_t, mode or "rn")
            else:
                r = round_fmt(x, None, dtype_t, mode or "rn")
            if sat:
                r = np.where(np.isnan(r), 0.0, np.clip(r, 0.0, 1.0))
            if ftz and dtype_t == "f32":
                r = ftz32(r)
            b = to_bits(r, dtype_t)
            sd(w, m, b if dtype_t in ("f16", "bf16") else b.view(TYPE_DTYPE[dtype_t]))

        return ex
    # float -> integer: .rni/.rzi/.rmi/.rpi, saturating to the range, NaN -> 0
    imode = next((x for x in mods if x in ("rni", "rzi", "rmi", "rpi")), None)
    if imode is None:
        raise ctx.unsupported(ins, "float -> int needs .rni/.rzi/.rmi/.rpi")
    idt = np.dtype(TYPE_DTYPE[dtype_t])
    info = np.iinfo(idt)
    sd = ctx.dst(d, idt)
    rf = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}[imode]

    def exi(w, m):
        x = read(w)
        with np.errstate(invalid="ignore"):
            r = np.where(np.isnan(x), 0.0, np.clip(rf(x), float(info.min), float(info.max)))
        if idt.itemsize == 8:
            sd(w, m, np.array([int(v) for v in r], dtype=object).astype(idt))
        else:
            sd(w, m, r.astype(idt))

    return exi


__all__ = ["FORMATS", "compile_fp_arith", "from_bits", "round_fmt", "to_bits", "two_sum"]
