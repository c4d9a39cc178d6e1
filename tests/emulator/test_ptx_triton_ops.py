"""The PTX opcodes and syntax Triton's generated PTX (sm_90a / sm_100a) needs, on hand-written PTX against the
PTX ISA's definitions, re-implemented here in plain Python integers (independent of the emulator's numpy code):
``bfe``, ``bfi``, ``popc``, ``clz``, ``brev``, ``bfind``, packed ``.u16x2`` / ``.s16x2`` arithmetic, ``redux.sync``
(integer and sm_100a ``.f32``), the three-input ``min`` / ``max.f32`` (sm_100a), ``.NaN`` and signed zeros of
``min`` / ``max``; and the parser's handling of ``.loc`` / ``.file`` line directives, ``.ptr`` parameter
attributes and an unused ``__local_depot``."""

from __future__ import annotations

import math
import random
import struct
import zlib

import numpy as np
import pytest
import torch

from nvgemm.emulator.ptx import EmulationError
from nvgemm.emulator.runner import launch_ptx

pytestmark = pytest.mark.emulator

HEAD = ".version 9.4\n.target sm_100a\n.address_size 64\n"


def _kernel(body: str, params: str = ".param .u64 p_in, .param .u64 p_out") -> str:
    decl = ".reg .pred %p<8>;\n.reg .b16 %rs<8>;\n.reg .b32 %r<32>;\n.reg .b64 %rd<32>;\n"
    return f"{HEAD}.visible .entry k({params})\n{{\n{decl}\n{body}\n}}\n"


def _lanes_op(op: str, srcs: np.ndarray, wide: bool = False) -> np.ndarray:
    """Each lane loads ``srcs[lane, 0..2]`` into %r1..%r3 (or %rd1..%rd3 when ``wide``), runs ``op`` (which writes
    %r4 / %rd4) and stores it; returns the 32 results."""
    srcs = np.concatenate([srcs, np.zeros((32, 1), srcs.dtype)], 1)  # 4 operands a row: aligned vector loads
    if wide:
        load = "ld.global.v2.b64 {%rd1, %rd2}, [%rd12]; ld.global.b64 %rd3, [%rd12+16];"
        store, stride, out = "st.global.b64 [%rd13], %rd4;", 32, torch.zeros(32, dtype=torch.int64)
        inp = torch.from_numpy(srcs.astype(np.uint64).view(np.int64).copy())
    else:
        load = "ld.global.v2.b32 {%r1, %r2}, [%rd12]; ld.global.b32 %r3, [%rd12+8];"
        store, stride, out = "st.global.b32 [%rd13], %r4;", 16, torch.zeros(32, dtype=torch.int32)
        inp = torch.from_numpy(srcs.astype(np.uint32).view(np.int32).copy())
    body = f"""
    ld.param.u64 %rd10, [p_in]; ld.param.u64 %rd11, [p_out];
    mov.u32 %r10, %laneid;
    mul.wide.u32 %rd14, %r10, {stride}; add.s64 %rd12, %rd10, %rd14;
    mul.wide.u32 %rd15, %r10, {8 if wide else 4}; add.s64 %rd13, %rd11, %rd15;
    {load}
    {op}
    {store}
    ret;"""
    launch_ptx(_kernel(body), (1, 1, 1), (32, 1, 1), [inp, out])
    return out.numpy().view(np.uint64 if wide else np.uint32)


def _rand32(rng, n=32):
    return np.array([rng.getrandbits(32) for _ in range(n)], dtype=np.uint64)


# ------------------------------------------------------------------------------------------ ISA references


def bfe_ref(a: int, pos: int, ln: int, bits: int, signed: bool) -> int:
    """PTX ISA bfe: msb = bits - 1; sbit = signed && len != 0 ? a[min(pos + len - 1, msb)] : 0;
    d[i] = (i < len && pos + i <= msb) ? a[pos + i] : sbit."""
    pos, ln = pos & 0xFF, ln & 0xFF
    msb = bits - 1
    sbit = (a >> min(pos + ln - 1, msb)) & 1 if (signed and ln) else 0
    return sum((((a >> (pos + i)) & 1) if (i < ln and pos + i <= msb) else sbit) << i for i in range(bits))


def bfi_ref(f: int, b: int, pos: int, ln: int, bits: int) -> int:
    """PTX ISA bfi: d = b; for i < len and pos + i <= msb: d[pos + i] = f[i]."""
    pos, ln = pos & 0xFF, ln & 0xFF
    d = b
    for i in range(ln):
        if pos + i > bits - 1:
            break
        d = (d & ~(1 << (pos + i))) | (((f >> i) & 1) << (pos + i))
    return d


def _s(v: int, bits: int) -> int:
    return v - (1 << bits) if v >> (bits - 1) else v


# ------------------------------------------------------------------------------------------ bit fields


@pytest.mark.parametrize("t", ["u32", "s32"])
def test_bfe_32(t):
    rng = random.Random(1)
    a = _rand32(rng)
    pos = np.array([rng.choice([0, 1, 3, 7, 16, 28, 31, 32, 40, 255, 0x1FF]) for _ in range(32)], np.uint64)
    ln = np.array([rng.choice([0, 1, 3, 4, 8, 16, 31, 32, 33, 255, 0x104]) for _ in range(32)], np.uint64)
    got = _lanes_op(f"bfe.{t} %r4, %r1, %r2, %r3;", np.stack([a, pos, ln], 1))
    want = [bfe_ref(int(x), int(p), int(n), 32, t == "s32") for x, p, n in zip(a, pos, ln)]
    assert got.tolist() == want


@pytest.mark.parametrize("t", ["u64", "s64"])
def test_bfe_64(t):
    rng = random.Random(2)
    a = np.array([rng.getrandbits(64) for _ in range(32)], np.uint64)
    pos = np.array([rng.choice([0, 5, 31, 32, 60, 63, 64, 200]) for _ in range(32)], np.uint64)
    ln = np.array([rng.choice([0, 1, 4, 31, 33, 64, 70]) for _ in range(32)], np.uint64)
    body = f"cvt.u32.u64 %r5, %rd2; cvt.u32.u64 %r6, %rd3; bfe.{t} %rd4, %rd1, %r5, %r6;"
    got = _lanes_op(body, np.stack([a, pos, ln], 1), wide=True)
    assert got.tolist() == [bfe_ref(int(x), int(p), int(n), 64, t == "s64") for x, p, n in zip(a, pos, ln)]


def test_bfi_32():
    rng = random.Random(3)
    f, b = _rand32(rng), _rand32(rng)
    pos = np.array([rng.choice([0, 4, 12, 30, 31, 32, 300]) for _ in range(32)], np.uint64)
    ln = np.array([rng.choice([0, 1, 4, 8, 20, 32, 40]) for _ in range(32)], np.uint64)
    # the ISA's operand order: bfi.b32 d, f, b, pos, len -- pos and len come from %r3's two halves here
    srcs = np.stack([f, b, pos | (ln << np.uint64(16))], 1)
    got = _lanes_op("and.b32 %r5, %r3, 65535; shr.b32 %r6, %r3, 16; bfi.b32 %r4, %r1, %r2, %r5, %r6;", srcs)
    assert got.tolist() == [bfi_ref(int(x), int(y), int(p), int(n), 32) for x, y, p, n in zip(f, b, pos, ln)]


def test_popc_clz_brev_bfind():
    rng = random.Random(4)
    a = _rand32(rng)
    a[:6] = [0, 1, 0x80000000, 0xFFFFFFFF, 0x7FFFFFFF, 0x00010000]
    srcs = np.stack([a, a, a], 1)
    assert _lanes_op("popc.b32 %r4, %r1;", srcs).tolist() == [bin(int(x)).count("1") for x in a]
    assert _lanes_op("clz.b32 %r4, %r1;", srcs).tolist() == [32 - int(x).bit_length() for x in a]
    assert _lanes_op("brev.b32 %r4, %r1;", srcs).tolist() == [int(f"{int(x):032b}"[::-1], 2) for x in a]
    # bfind: position of the most significant non-sign bit, 0xffffffff when there is none
    want_u = [int(x).bit_length() - 1 if x else 0xFFFFFFFF for x in a]
    assert _lanes_op("bfind.u32 %r4, %r1;", srcs).tolist() == want_u
    want_s = []
    for x in a:
        v = _s(int(x), 32)
        v = ~v if v < 0 else v
        want_s.append(v.bit_length() - 1 if v else 0xFFFFFFFF)
    assert _lanes_op("bfind.s32 %r4, %r1;", srcs).tolist() == want_s
    want_sh = [31 - p if p != 0xFFFFFFFF else p for p in want_u]
    assert _lanes_op("bfind.shiftamt.u32 %r4, %r1;", srcs).tolist() == want_sh


# ------------------------------------------------------------------------------------------ packed 16x2


def _halves(v: int) -> tuple[int, int]:
    return v & 0xFFFF, v >> 16


@pytest.mark.parametrize("op,t", [("add", "s16x2"), ("add", "u16x2"), ("sub", "s16x2"), ("min", "s16x2"),
                                  ("max", "u16x2"), ("max.relu", "s16x2"), ("min.relu", "s16x2")])
def test_packed_16x2(op, t):
    rng = random.Random(zlib.crc32(f"{op}.{t}".encode()))
    a, b = _rand32(rng), _rand32(rng)
    a[0], b[0] = 0x7FFF8000, 0x00018000  # wrap-around in both halves
    got = _lanes_op(f"{op}.{t} %r4, %r1, %r2;", np.stack([a, b, a], 1))
    base = op.split(".")[0]
    want = []
    for x, y in zip(a, b):
        out = 0
        for sh, (u, v) in zip((0, 16), zip(_halves(int(x)), _halves(int(y)))):
            if t == "s16x2":
                u, v = _s(u, 16), _s(v, 16)
            r = {"add": u + v, "sub": u - v, "min": min(u, v), "max": max(u, v)}[base]
            if op.endswith("relu"):
                r = max(r, 0)
            out |= (r & 0xFFFF) << sh
        want.append(out)
    assert got.tolist() == want


# ------------------------------------------------------------------------------------------ redux.sync


@pytest.mark.parametrize("op,t", [("add", "u32"), ("add", "s32"), ("min", "s32"), ("max", "u32"), ("min", "u32"),
                                  ("and", "b32"), ("or", "b32"), ("xor", "b32")])
def test_redux_integer(op, t):
    rng = random.Random(zlib.crc32(f"{op}.{t}".encode()))
    a = _rand32(rng)
    got = _lanes_op(f"mov.b32 %r5, -1; redux.sync.{op}.{t} %r4, %r1, %r5;", np.stack([a, a, a], 1))
    vals = [_s(int(x), 32) if t == "s32" else int(x) for x in a]
    if op == "add":
        r = sum(vals) & 0xFFFFFFFF
    elif op in ("min", "max"):
        r = (min if op == "min" else max)(vals) & 0xFFFFFFFF
    else:
        r = 0 if op != "and" else 0xFFFFFFFF
        for v in vals:
            r = {"and": r & v, "or": r | v, "xor": r ^ v}[op]
    assert got.tolist() == [r] * 32


def _f32bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _bits_f32(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b))[0]


@pytest.mark.parametrize("mods", ["max", "min", "max.abs", "min.abs", "max.NaN", "min.abs.NaN"])
@pytest.mark.parametrize("with_nan", [False, True])
def test_redux_f32(mods, with_nan):
    rng = random.Random(7)
    vals = [rng.uniform(-100, 100) for _ in range(32)]
    vals[3], vals[4] = -0.0, 0.0
    if with_nan:
        vals[9] = math.nan
    a = np.array([_f32bits(v) for v in vals], np.uint64)
    got = _lanes_op(f"mov.b32 %r5, -1; redux.sync.{mods}.f32 %r4, %r1, %r5;", np.stack([a, a, a], 1))
    xs = [_bits_f32(int(b)) for b in a]
    if ".abs" in mods:
        xs = [abs(x) for x in xs]
    if with_nan and ".NaN" in mods:
        assert set(got.tolist()) == {0x7FFFFFFF}  # the canonical NaN
        return
    xs = [x for x in xs if not math.isnan(x)]  # without .NaN a NaN input is ignored
    r = (max if mods.startswith("max") else min)(xs)
    assert set(got.tolist()) == {_f32bits(r)}


def test_redux_needs_every_member_lane():
    body = """
    ld.param.u64 %rd10, [p_in]; ld.param.u64 %rd11, [p_out];
    mov.u32 %r10, %laneid; setp.lt.u32 %p1, %r10, 16; mov.b32 %r5, -1;
    @%p1 redux.sync.add.u32 %r4, %r10, %r5;
    ret;"""
    with pytest.raises(EmulationError, match="membermask"):
        launch_ptx(_kernel(body), (1, 1, 1), (32, 1, 1), [torch.zeros(1), torch.zeros(1)])


# ------------------------------------------------------------------------------------------ min / max.f32


def test_three_input_max_min_f32():
    """sm_100a ``max.f32 d, a, b, c`` (Triton's block-amax tree): every operand counts (the third was once ignored)."""
    rng = random.Random(8)
    v = [[rng.uniform(-8, 8) for _ in range(3)] for _ in range(32)]
    for i in range(32):
        v[i][i % 3] = 50.0 + i  # the maximum sits in each operand position in turn
    a = np.array([[_f32bits(x) for x in row] for row in v], np.uint64)
    got = _lanes_op("max.f32 %r4, %r1, %r2, %r3;", a)
    assert got.tolist() == [_f32bits(max(row)) for row in v]
    got = _lanes_op("neg.f32 %r6, %r1; neg.f32 %r7, %r2; neg.f32 %r8, %r3; min.f32 %r4, %r6, %r7, %r8;", a)
    assert got.tolist() == [_f32bits(-max(row)) for row in v]


def test_min_max_nan_and_signed_zero():
    nan = math.nan
    pairs = [(1.0, nan), (nan, -2.0), (nan, nan), (0.0, -0.0), (-0.0, 0.0), (-0.0, -0.0), (3.0, -4.0)] * 5
    pairs = pairs[:32]
    a = np.array([[_f32bits(x), _f32bits(y), 0] for x, y in pairs], np.uint64)

    def want(op, x, y, propagate):
        if math.isnan(x) or math.isnan(y):
            if propagate or (math.isnan(x) and math.isnan(y)):
                return 0x7FFFFFFF
            return _f32bits(y if math.isnan(x) else x)
        if x == 0 and y == 0:  # -0.0 < +0.0
            neg = (math.copysign(1, x) < 0) or (math.copysign(1, y) < 0) if op == "min" else \
                (math.copysign(1, x) < 0) and (math.copysign(1, y) < 0)
            return _f32bits(-0.0 if neg else 0.0)
        return _f32bits(min(x, y) if op == "min" else max(x, y))

    for op in ("min", "max"):
        for propagate in (False, True):
            mod = ".NaN" if propagate else ""
            got = _lanes_op(f"{op}{mod}.f32 %r4, %r1, %r2;", a)
            assert got.tolist() == [want(op, x, y, propagate) for x, y in pairs], (op, propagate)


# ------------------------------------------------------------------------------------------ parser


def test_loc_directive_does_not_swallow_the_next_statement():
    """``.loc`` ends at its line (no ';'): the ``add`` after it must execute (it was once read as part of it)."""
    ptx = _kernel("""
    ld.param.u64 %rd11, [p_out];
    mov.b32 %r4, 1;
    .loc	1 18 1                          // file.py:18:1
    add.s32 %r4, %r4, 41;
    .loc	2 162 12, function_name $L__info_string0, inlined_at 2 182 16 // inlined
    st.global.b32 [%rd11], %r4;
    ret;""").replace(".visible .entry", '.file 1 "/x/file.py"\n.visible .entry')
    out = torch.zeros(1, dtype=torch.int32)
    launch_ptx(ptx, (1, 1, 1), (1, 1, 1), [out, out])
    assert int(out[0]) == 42


def test_ptr_parameter_attributes_and_offsets():
    """``.param .u64 .ptr .global .align 16 name`` is an 8-byte parameter (the attributes describe the memory it
    points to); a following ``.u32`` sits at offset 8."""
    params = ".param .u64 .ptr .global .align 16 p_out, .param .u32 p_v, .param .u64 .ptr .align 1 p_in"
    ptx = _kernel("""
    ld.param.u64 %rd11, [p_out]; ld.param.u32 %r1, [p_v];
    st.global.b32 [%rd11], %r1;
    ret;""", params)
    out = torch.zeros(4, dtype=torch.int32)
    launch = launch_ptx(ptx, (1, 1, 1), (1, 1, 1), [out, 1234, out])
    assert int(out[0]) == 1234
    assert [(p.offset, p.size) for p in launch.program.entry.params] == [(0, 8), (8, 4), (16, 8)]


def test_unused_local_depot_is_accepted_and_a_use_is_an_error():
    depot = ".local .align 1 .b8 __local_depot0[8];\n.reg .b64 %SP;\n.reg .b64 %SPL;\n"
    ok = _kernel(depot + "ld.param.u64 %rd11, [p_out]; st.global.b32 [%rd11], 7; ret;")
    out = torch.zeros(1, dtype=torch.int32)
    launch_ptx(ok, (1, 1, 1), (1, 1, 1), [out, out])
    assert int(out[0]) == 7
    bad = _kernel(depot + "mov.u64 %SPL, __local_depot0; ld.param.u64 %rd11, [p_out]; ret;")
    with pytest.raises(EmulationError):
        launch_ptx(bad, (1, 1, 1), (1, 1, 1), [out, out])
