"""``dp4a`` / ``dp2a`` and the half-precision ``setp`` forms (``.f16``, ``.f16x2``, ``.bf16``, ``.bf16x2``, with
``.BoolOp`` and ``.ftz``) on hand-written PTX, against the PTX ISA's definitions re-implemented here in plain
Python (integers for the dot products; floats decoded from their bits by torch for the comparisons), independent
of the emulator's numpy code. Every comparison result is exact (a boolean), so the checks are equality."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from nvgemm.emulator.ptx import UnknownOpcodeError
from nvgemm.emulator.runner import launch_ptx

pytestmark = pytest.mark.emulator

HEAD = ".version 8.7\n.target sm_90a\n.address_size 64\n"
N = 256  # threads of the one CTA each test launches: one case per thread


def _run(body: str, srcs: np.ndarray) -> np.ndarray:
    """Thread t loads ``srcs[t, 0..2]`` into %r1..%r3, runs ``body`` (which writes %r4) and stores %r4."""
    srcs = np.concatenate([srcs.astype(np.uint64), np.zeros((len(srcs), 1), np.uint64)], 1)
    assert srcs.shape == (N, 4)
    ptx = f"""{HEAD}.visible .entry k(.param .u64 p_in, .param .u64 p_out)
{{
.reg .pred %p<8>;
.reg .b16 %rs<8>;
.reg .b32 %r<32>;
.reg .b64 %rd<32>;
ld.param.u64 %rd10, [p_in]; ld.param.u64 %rd11, [p_out];
mov.u32 %r10, %tid.x;
mul.wide.u32 %rd14, %r10, 16; add.s64 %rd12, %rd10, %rd14;
mul.wide.u32 %rd15, %r10, 4; add.s64 %rd13, %rd11, %rd15;
ld.global.v2.b32 {{%r1, %r2}}, [%rd12]; ld.global.b32 %r3, [%rd12+8];
{body}
st.global.b32 [%rd13], %r4;
ret;
}}
"""
    inp = torch.from_numpy(srcs.astype(np.uint32).view(np.int32).copy())
    out = torch.zeros(N, dtype=torch.int32)
    launch_ptx(ptx, (1, 1, 1), (N, 1, 1), [inp, out])
    return out.numpy().view(np.uint32)


# ------------------------------------------------------------------------------------------ dp4a / dp2a


def _ext(v: int, bits: int, signed: bool) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if signed and v >> (bits - 1) else v


def dp4a_ref(a: int, b: int, c: int, at: str, bt: str) -> int:
    """PTX ISA dp4a: d = c + sum_i ext(a.byte[i], atype) * ext(b.byte[i], btype), 32-bit wrap-around."""
    d = c
    for i in range(4):
        d += _ext(a >> (8 * i), 8, at == "s32") * _ext(b >> (8 * i), 8, bt == "s32")
    return d & 0xFFFFFFFF


def dp2a_ref(a: int, b: int, c: int, at: str, bt: str, mode: str) -> int:
    """PTX ISA dp2a: d = c + sum_{i<2} ext(a.half[i], atype) * ext(b.byte[sel + i], btype), sel = 0 (.lo) / 2
    (.hi), 32-bit wrap-around."""
    sel = 0 if mode == "lo" else 2
    d = c
    for i in range(2):
        d += _ext(a >> (16 * i), 16, at == "s32") * _ext(b >> (8 * (sel + i)), 8, bt == "s32")
    return d & 0xFFFFFFFF


EDGE = [0, 0xFFFFFFFF, 0x80808080, 0x7F7F7F7F, 0x80007FFF, 0x7FFF8000, 0x00FF00FF, 0xFF00FF00, 0x80000000,
        0x7FFFFFFF, 0x01020304, 0xFEFDFCFB]


def _dot_inputs(seed: int) -> np.ndarray:
    rng = random.Random(seed)
    rows = [(a, b, c) for a in EDGE[:6] for b in EDGE[:6] for c in (0, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)]
    rows += [(a, b, rng.choice(EDGE)) for a in EDGE for b in EDGE if (a, b) not in [(x, y) for x, y, _ in rows]]
    while len(rows) < N:
        rows.append((rng.getrandbits(32), rng.getrandbits(32), rng.getrandbits(32)))
    return np.array(rows[:N], dtype=np.uint64)


TYPES = [("u32", "u32"), ("u32", "s32"), ("s32", "u32"), ("s32", "s32")]


@pytest.mark.parametrize("at,bt", TYPES)
def test_dp4a_matches_the_isa(at, bt, seed):
    srcs = _dot_inputs(seed)
    got = _run(f"dp4a.{at}.{bt} %r4, %r1, %r2, %r3;", srcs)
    want = [dp4a_ref(int(a), int(b), int(c), at, bt) for a, b, c in srcs]
    assert got.tolist() == want


@pytest.mark.parametrize("mode", ["lo", "hi"])
@pytest.mark.parametrize("at,bt", TYPES)
def test_dp2a_matches_the_isa(mode, at, bt, seed):
    srcs = _dot_inputs(seed)
    got = _run(f"dp2a.{mode}.{at}.{bt} %r4, %r1, %r2, %r3;", srcs)
    want = [dp2a_ref(int(a), int(b), int(c), at, bt, mode) for a, b, c in srcs]
    assert got.tolist() == want


def test_dot_sign_extension_and_half_selection_known_values():
    """Hand-computed rows: a byte 0xFF is -1 only for .s32; dp2a.hi reads bytes 2, 3 of b."""
    rows = np.zeros((N, 3), np.uint64)
    rows[0] = (0x000000FF, 0x00000002, 10)   # u.u: 255 * 2 + 10 = 520;   s.u: -1 * 2 + 10 = 8
    rows[1] = (0xFFFFFFFF, 0xFFFFFFFF, 0)    # u.u: 4 * 255 * 255;        s.s: 4 * (-1)(-1) = 4
    rows[2] = (0x0001FFFF, 0x03020100, 0)    # dp2a.lo: a = (0xffff, 1), b bytes 0, 1 = 0, 1 -> 1 either sign
    rows[3] = (0x0001FFFF, 0x03020100, 0)    # dp2a.hi: bytes 2, 3 = 2, 3 -> 0xffff*2 + 3 (u) / -2 + 3 (s)
    assert _run("dp4a.u32.u32 %r4, %r1, %r2, %r3;", rows)[:2].tolist() == [520, 4 * 255 * 255]
    assert _run("dp4a.s32.u32 %r4, %r1, %r2, %r3;", rows)[0] == 8
    assert _run("dp4a.s32.s32 %r4, %r1, %r2, %r3;", rows)[1] == 4
    assert _run("dp2a.lo.u32.u32 %r4, %r1, %r2, %r3;", rows)[2] == 1
    assert _run("dp2a.hi.u32.u32 %r4, %r1, %r2, %r3;", rows)[3] == 0xFFFF * 2 + 3
    assert _run("dp2a.hi.s32.u32 %r4, %r1, %r2, %r3;", rows)[3] == 1


@pytest.mark.parametrize("op", ["dp4a.s16.u32", "dp4a.u32", "dp2a.u32.u32", "dp2a.mid.u32.u32", "dp8a.u32.u32"])
def test_dot_forms_outside_the_isa_are_reported_by_name(op):
    with pytest.raises(UnknownOpcodeError, match=op.replace(".", r"\.")):
        _run(f"{op} %r4, %r1, %r2, %r3;", np.zeros((N, 3), np.uint64))


# ------------------------------------------------------------------------------------------ half-precision setp

# bit patterns: signed zeros, +-1, 1 + ulp, infinities, quiet / signalling / negative NaNs, the smallest and largest
# subnormals, the smallest normal, the largest finite
F16_BITS = [0x0000, 0x8000, 0x3C00, 0xBC00, 0x3C01, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE00, 0x0001, 0x8001, 0x03FF,
            0x0400, 0x7BFF, 0x83FF]
BF16_BITS = [0x0000, 0x8000, 0x3F80, 0xBF80, 0x3F81, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFC0, 0x0001, 0x8001, 0x007F,
             0x0080, 0x7F7F, 0x807F]
CMPS = ["eq", "ne", "lt", "le", "gt", "ge", "equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan"]
MIN_NORMAL = {"f16": 2.0 ** -14, "bf16": 2.0 ** -126}


def half_value(bits: int, fmt: str, ftz: bool = False) -> float:
    t = torch.tensor([bits], dtype=torch.int32).to(torch.int16).view(torch.float16 if fmt == "f16" else torch.bfloat16)
    v = float(t.double().item())
    if ftz and abs(v) < MIN_NORMAL[fmt]:
        v = math.copysign(0.0, v)  # PTX ISA: .ftz flushes subnormal inputs to sign-preserving zero
    return v


def cmp_ref(op: str, x: float, y: float) -> bool:
    """PTX ISA setp "Floating Point Notes": ordered comparisons are False when either operand is NaN, the
    unordered ones (suffix u) True; num = neither is NaN, nan = either is."""
    nan = math.isnan(x) or math.isnan(y)
    if op == "num":
        return not nan
    if op == "nan":
        return nan
    if nan:
        return op.endswith("u")
    return {"eq": x == y, "ne": x != y, "lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y}[op[:2]]


def _pairs(bits: list[int]) -> list[tuple[int, int]]:
    return [(x, y) for x in bits for y in bits]  # 256 pairs: every combination


PRED_OUT = "selp.b32 %r5, 1, 0, %p1; selp.b32 %r6, 2, 0, %p2; or.b32 %r4, %r5, %r6;"


@pytest.mark.parametrize("fmt", ["f16", "bf16"])
@pytest.mark.parametrize("op", CMPS)
def test_setp_half_scalar_matches_the_isa(fmt, op):
    bits = F16_BITS if fmt == "f16" else BF16_BITS
    pairs = _pairs(bits)
    srcs = np.array([(x, y, 0) for x, y in pairs], np.uint64)
    body = (f"mov.b32 {{%rs1, %rs2}}, %r1; mov.b32 {{%rs3, %rs4}}, %r2; setp.{op}.{fmt} %p1, %rs1, %rs3; "
            f"setp.ne.u32 %p2, %r3, %r3; {PRED_OUT}")
    got = _run(body, srcs)
    want = [int(cmp_ref(op, half_value(x, fmt), half_value(y, fmt))) for x, y in pairs]
    assert got.tolist() == want


@pytest.mark.parametrize("fmt", ["f16x2", "bf16x2"])
@pytest.mark.parametrize("op", CMPS)
def test_setp_half_x2_writes_p_from_the_low_and_q_from_the_high_halves(fmt, op):
    base = fmt[:-2]
    bits = F16_BITS if base == "f16" else BF16_BITS
    pairs = _pairs(bits)
    hi = pairs[97:] + pairs[:97]  # a different pair in the high halves, so p and q differ on many lanes
    srcs = np.array([(x | (hx << 16), y | (hy << 16), 0) for (x, y), (hx, hy) in zip(pairs, hi)], np.uint64)
    got = _run(f"setp.{op}.{fmt} %p1|%p2, %r1, %r2; {PRED_OUT}", srcs)
    want = [int(cmp_ref(op, half_value(x, base), half_value(y, base)))
            | 2 * int(cmp_ref(op, half_value(hx, base), half_value(hy, base))) for (x, y), (hx, hy) in zip(pairs, hi)]
    assert got.tolist() == want
    assert {1, 2} <= set(want)  # p and q differ both ways on some lanes: neither a copy nor a complement


@pytest.mark.parametrize("fmt", ["f16", "f16x2"])
@pytest.mark.parametrize("op", ["eq", "lt", "gtu", "ne"])
def test_setp_ftz_flushes_subnormal_inputs(fmt, op):
    pairs = _pairs(F16_BITS)
    if fmt == "f16":
        srcs = np.array([(x, y, 0) for x, y in pairs], np.uint64)
        body = (f"mov.b32 {{%rs1, %rs2}}, %r1; mov.b32 {{%rs3, %rs4}}, %r2; setp.{op}.ftz.f16 %p1, %rs1, %rs3; "
                f"setp.ne.u32 %p2, %r3, %r3; {PRED_OUT}")
        want = [int(cmp_ref(op, half_value(x, "f16", True), half_value(y, "f16", True))) for x, y in pairs]
    else:
        srcs = np.array([(x | (y << 16), y | (x << 16), 0) for x, y in pairs], np.uint64)
        body = f"setp.{op}.ftz.f16x2 %p1|%p2, %r1, %r2; {PRED_OUT}"
        want = [int(cmp_ref(op, half_value(x, "f16", True), half_value(y, "f16", True)))
                | 2 * int(cmp_ref(op, half_value(y, "f16", True), half_value(x, "f16", True))) for x, y in pairs]
    got = _run(body, srcs)
    assert got.tolist() == want
    # the flush matters: without .ftz, subnormal vs zero compares differently on some lanes
    plain = [int(cmp_ref(op, half_value(x, "f16"), half_value(y, "f16"))) for x, y in pairs]
    assert [w & 1 for w in want] != plain


@pytest.mark.parametrize("bool_op", ["and", "or", "xor"])
@pytest.mark.parametrize("fmt", ["bf16", "bf16x2", "f16x2"])
def test_setp_half_bool_op_combines_each_result_with_c(bool_op, fmt):
    base = fmt[:-2] if fmt.endswith("x2") else fmt
    bits = F16_BITS if base == "f16" else BF16_BITS
    pairs = _pairs(bits)
    cs = [(i * 7) % 3 == 0 for i in range(N)]  # the predicate c, from %r3
    comb = {"and": lambda t, c: t and c, "or": lambda t, c: t or c, "xor": lambda t, c: t != c}[bool_op]
    setc = "setp.ne.u32 %p3, %r3, 0;"
    if fmt.endswith("x2"):
        srcs = np.array([(x | (y << 16), y | (x << 16), c) for (x, y), c in zip(pairs, cs)], np.uint64)
        body = f"{setc} setp.ltu.{bool_op}.{fmt} %p1|%p2, %r1, %r2, %p3; {PRED_OUT}"
        want = [int(comb(cmp_ref("ltu", half_value(x, base), half_value(y, base)), c))
                | 2 * int(comb(cmp_ref("ltu", half_value(y, base), half_value(x, base)), c))
                for (x, y), c in zip(pairs, cs)]
    else:
        srcs = np.array([(x, y, c) for (x, y), c in zip(pairs, cs)], np.uint64)
        body = (f"{setc} mov.b32 {{%rs1, %rs2}}, %r1; mov.b32 {{%rs3, %rs4}}, %r2; "
                f"setp.ltu.{bool_op}.{fmt} %p1, %rs1, %rs3, !%p3; setp.ne.u32 %p2, %r10, %r10; {PRED_OUT}")
        want = [int(comb(cmp_ref("ltu", half_value(x, base), half_value(y, base)), not c))
                for (x, y), c in zip(pairs, cs)]
    assert _run(body, srcs).tolist() == want


def test_setp_f32_ftz_and_bool_op_in_isa_order():
    """setp.CmpOp.BoolOp.ftz.f32: subnormal inputs flush to zero; the complement goes to q."""
    vals = [0.0, -0.0, 1e-40, -1e-40, 1.0, float("nan"), float("inf")]
    pairs = [(x, y) for x in vals for y in vals]
    pairs += [(0.0, 0.0)] * (N - len(pairs))
    f2b = lambda v: int(np.array(v, np.float32).view(np.uint32))  # noqa: E731
    srcs = np.array([(f2b(x), f2b(y), 1) for x, y in pairs], np.uint64)
    got = _run(f"setp.ne.u32 %p3, %r3, 0; setp.eq.and.ftz.f32 %p1|%p2, %r1, %r2, %p3; {PRED_OUT}", srcs)
    ftz = lambda v: math.copysign(0.0, v) if abs(v) < 2.0 ** -126 else v  # noqa: E731
    want = [int(cmp_ref("eq", ftz(x), ftz(y))) | 2 * int(not cmp_ref("eq", ftz(x), ftz(y))) for x, y in pairs]
    assert got.tolist() == want


@pytest.mark.parametrize("ins", ["setp.lt.ftz.bf16 %p1, %rs1, %rs3;", "setp.lo.f16 %p1, %rs1, %rs3;",
                                 "setp.lt.bf16x2 %p1, %r1, %r2;", "setp.lt.f16 %p1|%p2, %rs1, %rs3;",
                                 "setp.lt.ftz.s32 %p1, %r1, %r2;", "setp.lt.f32.ftz %p1, %r1, %r2;"])
def test_setp_forms_outside_the_isa_are_reported_by_name(ins):
    with pytest.raises(UnknownOpcodeError, match=ins.split()[0].replace(".", r"\.")):
        _run(f"mov.b32 {{%rs1, %rs2}}, %r1; mov.b32 {{%rs3, %rs4}}, %r2; {ins} mov.b32 %r4, 0;",
             np.zeros((N, 3), np.uint64))
