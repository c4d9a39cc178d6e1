"""The PTX interpreter on hand-written PTX, against the PTX ISA (no compile, no artifact): fragment
layouts of ``mma.m16n8k16`` (checked on lanes named in the ISA's fragment figures, then a full
product against torch), bit ops, rounding modes against exact rationals, divergence and
reconvergence, and the strict checks (out-of-bounds, poisoned shared memory, cp.async visibility,
deadlock, unknown opcode)."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest
import torch

from nvgemm.emulator.ptx import DeadlockError, EmulationError, UnknownOpcodeError
from nvgemm.emulator.ptx.ops.fp import round_fmt
from nvgemm.emulator.runner import launch_ptx

pytestmark = pytest.mark.emulator

HEAD = ".version 9.4\n.target sm_90a\n.address_size 64\n"


def kernel(body: str, params: str = ".param .u64 p_out", regs: str = "", name: str = "k", extra: str = "") -> str:
    decl = (".reg .pred %p<16>;\n.reg .b16 %rs<16>;\n.reg .b32 %r<64>;\n.reg .b64 %rd<32>;\n.reg .f32 %f<16>;\n"
            + regs)
    return f"{HEAD}{extra}\n.visible .entry {name}({params})\n{{\n{decl}\n{body}\n}}\n"


# ------------------------------------------------------------------------------------------ mma

MMA = kernel("""
    ld.param.u64 %rd1, [pa];  ld.param.u64 %rd2, [pb];  ld.param.u64 %rd3, [pc];  ld.param.u64 %rd4, [pd];
    mov.u32 %r1, %laneid;
    mul.wide.u32 %rd5, %r1, 16;
    add.s64 %rd6, %rd1, %rd5;  ld.global.v4.b32 {%r10, %r11, %r12, %r13}, [%rd6];
    mul.wide.u32 %rd7, %r1, 8;
    add.s64 %rd8, %rd2, %rd7;  ld.global.v2.b32 {%r14, %r15}, [%rd8];
    add.s64 %rd9, %rd3, %rd5;  ld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd9];
    mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f5, %f6, %f7, %f8}, {%r10, %r11, %r12, %r13}, {%r14, %r15}, {%f1, %f2, %f3, %f4};
    add.s64 %rd10, %rd4, %rd5; st.global.v4.f32 [%rd10], {%f5, %f6, %f7, %f8};
    ret;
""", ".param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 pd")


def _frag_a(A: torch.Tensor) -> torch.Tensor:
    """[32 lanes, 8 elements] of A per the ISA table (written out with row/col per element index)."""
    out = torch.zeros(32, 8, dtype=A.dtype)
    for lane in range(32):
        group, tig = lane >> 2, lane % 4
        for i in range(8):
            row = group if (i < 2 or 4 <= i < 6) else group + 8
            col = tig * 2 + (i & 1) + (8 if i >= 4 else 0)
            out[lane, i] = A[row, col]
    return out


def test_mma_fragments_match_the_isa_figures_and_torch(seed):
    g = torch.Generator().manual_seed(seed)
    A = (torch.randint(-8, 9, (16, 16), generator=g) / 4).to(torch.bfloat16)
    B = (torch.randint(-8, 9, (16, 8), generator=g) / 4).to(torch.bfloat16)
    C = torch.randint(-8, 9, (16, 8), generator=g).float()
    fa = _frag_a(A)
    # spot checks against the ISA figure (lane 0: rows 0/8, cols 0,1 / 8,9; lane 5: group 1, tig 1)
    assert fa[0, 0] == A[0, 0] and fa[0, 2] == A[8, 0] and fa[0, 4] == A[0, 8] and fa[0, 7] == A[8, 9]
    assert fa[5, 0] == A[1, 2] and fa[5, 3] == A[9, 3] and fa[5, 5] == A[1, 11]
    fb = torch.zeros(32, 4, dtype=torch.bfloat16)
    fc = torch.zeros(32, 4)
    for lane in range(32):
        group, tig = lane >> 2, lane % 4
        for i in range(4):
            fb[lane, i] = B[tig * 2 + (i & 1) + (8 if i >= 2 else 0), group]
            fc[lane, i] = C[group + (8 if i >= 2 else 0), tig * 2 + (i & 1)]
    d = torch.zeros(32, 4)
    launch_ptx(MMA, (1, 1, 1), (32, 1, 1), [fa.contiguous(), fb.contiguous(), fc.contiguous(), d])
    want = A.double() @ B.double() + C.double()
    got = torch.zeros(16, 8, dtype=torch.float64)
    for lane in range(32):
        group, tig = lane >> 2, lane % 4
        for i in range(4):
            got[group + (8 if i >= 2 else 0), tig * 2 + (i & 1)] = d[lane, i]
    assert torch.equal(got, want)


def test_mma_on_a_partial_warp_is_an_error():
    src = MMA.replace("mov.u32 %r1, %laneid;", "mov.u32 %r1, %laneid;\n setp.eq.u32 %p1, %r1, 3;\n @%p1 ret;")
    z = [torch.zeros(32, 4), torch.zeros(32, 2), torch.zeros(32, 4), torch.zeros(32, 4)]
    with pytest.raises(EmulationError, match="partial warp"):
        launch_ptx(src, (1, 1, 1), (32, 1, 1), z)


# ------------------------------------------------------------------------------------------ bit ops

BITS = kernel("""
    ld.param.u64 %rd1, [p_in]; ld.param.u64 %rd2, [p_out];
    mov.u32 %r1, %laneid; mul.wide.u32 %rd3, %r1, 4; add.s64 %rd4, %rd1, %rd3;
    ld.global.b32 %r2, [%rd4];
    prmt.b32 %r3, %r2, 0x80C0FF11, 0x4B31;
    lop3.b32 %r4, %r2, 0x0F0F0F0F, 0x33333333, 0x96;
    shf.r.wrap.b32 %r5, %r2, %r2, %r1;
    shf.l.clamp.b32 %r6, %r2, 0x12345678, %r1;
    shfl.sync.idx.b32 %r7, %r2, 31, 0x1f, -1;
    shfl.sync.bfly.b32 %r8, %r2, 1, 0x1f, -1;
    shr.s32 %r9, %r2, 40;
    mul.hi.s32 %r10, %r2, -7;
    mul.wide.s32 %rd9, %r2, %r2;
    mul.wide.u32 %rd11, %r1, 48; add.s64 %rd12, %rd2, %rd11;
    st.global.v4.b32 [%rd12], {%r3, %r4, %r5, %r6};
    st.global.v4.b32 [%rd12+16], {%r7, %r8, %r9, %r10};
    st.global.b64 [%rd12+32], %rd9;
    ret;
""", ".param .u64 p_in, .param .u64 p_out")


def _prmt(a: int, b: int, sel: int) -> int:
    src = a.to_bytes(4, "little") + b.to_bytes(4, "little")
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = src[nib & 7]
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def test_bit_ops_follow_the_isa(seed):
    rnd = random.Random(seed)
    vals = [rnd.getrandbits(32) for _ in range(32)]
    x = torch.tensor(np.array(vals, dtype=np.uint32).view(np.int32))
    out = torch.zeros(32 * 12, dtype=torch.int32)
    launch_ptx(BITS, (1, 1, 1), (32, 1, 1), [x, out])
    o = out.numpy().view(np.uint32).reshape(32, 12)
    for lane, v in enumerate(vals):
        sv = v - (1 << 32) if v >> 31 else v
        assert o[lane, 0] == _prmt(v, 0x80C0FF11, 0x4B31)
        assert o[lane, 1] == (v ^ 0x0F0F0F0F ^ 0x33333333) & 0xFFFFFFFF  # LUT 0x96 = a ^ b ^ c
        n = lane & 31
        assert o[lane, 2] == ((((v << 32) | v) >> n) & 0xFFFFFFFF)
        n2 = min(lane, 32)
        assert o[lane, 3] == ((((0x12345678 << 32) | v) << n2) >> 32) & 0xFFFFFFFF
        assert o[lane, 4] == vals[31]
        assert o[lane, 5] == vals[lane ^ 1]
        assert o[lane, 6] == (0xFFFFFFFF if sv < 0 else 0)  # shift >= width: sign fill
        assert o[lane, 7] == ((sv * -7) >> 32) & 0xFFFFFFFF
        wide = int(o[lane, 8]) | (int(o[lane, 9]) << 32)
        assert wide == (sv * sv) & ((1 << 64) - 1)


# ------------------------------------------------------------------------------------------ rounding


def _exact_round(q: Fraction, mant: int, emin: int, mode: str) -> float:
    if q == 0:
        return 0.0
    sign = -1 if q < 0 else 1
    a = abs(q)
    e = 0
    while a >= 2:
        a /= 2
        e += 1
    while a < 1:
        a *= 2
        e -= 1
    e = max(e, emin)
    quantum = Fraction(2) ** (e - mant)
    k = abs(q) / quantum
    fl = k.numerator // k.denominator
    frac = k - fl
    if mode == "rn":
        up = frac > Fraction(1, 2) or (frac == Fraction(1, 2) and fl % 2 == 1)
    elif mode == "rz":
        up = False
    elif mode == "rm":
        up = sign < 0 and frac > 0
    else:
        up = sign > 0 and frac > 0
    return sign * float((fl + up) * quantum)


@pytest.mark.parametrize("mode", ["rn", "rz", "rm", "rp"])
def test_fma_rounding_matches_exact_rationals(mode, seed):
    rnd = random.Random(seed)
    a = np.array([rnd.uniform(-4, 4) for _ in range(400)], np.float32).astype(np.float64)
    b = np.array([rnd.uniform(-4, 4) for _ in range(400)], np.float32).astype(np.float64)
    c = np.array([rnd.uniform(-4, 4) * 2.0 ** rnd.randint(-30, 5) for _ in range(400)], np.float32).astype(np.float64)
    a[:50] = 1.0
    b[:50] = 2.0**-24  # products and sums landing exactly on ties / grid points
    from nvgemm.emulator.ptx.ops.fp import two_sum

    s, e = two_sum(a * b, c)
    got = round_fmt(s, e, "f32", mode)
    for i in range(400):
        want = _exact_round(Fraction(a[i]) * Fraction(b[i]) + Fraction(c[i]), 23, -126, mode)
        assert got[i] == want, (i, a[i], b[i], c[i], got[i], want)


def test_bf16_rounding_is_nearest_even():
    vals = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 2.0**-133 * 1.5, 3.4e38])
    got = round_fmt(vals, None, "bf16", "rn")
    assert list(got[:3]) == [1.0, 1 + 2.0**-6, -1.0]
    assert got[3] == 2.0**-132  # subnormal tie to even
    assert np.isinf(got[4])


# ------------------------------------------------------------------------------------------ divergence

DIVERGE = kernel("""
    ld.param.u64 %rd1, [p_out];
    mov.u32 %r1, %tid.x; and.b32 %r2, %r1, 3;
    setp.eq.u32 %p1, %r2, 0;
    mov.u32 %r3, 0;
    @%p1 bra $L_A;
    setp.eq.u32 %p2, %r2, 1;
    @%p2 bra $L_B;
    add.u32 %r3, %r3, 100;
    bra.uni $L_J;
$L_A:
    add.u32 %r3, %r3, 10;
    bra.uni $L_J;
$L_B:
    add.u32 %r3, %r3, 20;
$L_J:
    { .reg .b32 t; add.u32 t, %r3, 1; mov.u32 %r3, t; }
    mov.u32 %r4, 0;
$L_LOOP:
    add.u32 %r4, %r4, 1;
    setp.lt.u32 %p3, %r4, %r2;
    @%p3 bra $L_LOOP;
    mad.lo.u32 %r3, %r4, 1000, %r3;
    bar.sync 0;
    mul.wide.u32 %rd2, %r1, 4; add.s64 %rd3, %rd1, %rd2; st.global.b32 [%rd3], %r3;
    ret;
""")


def test_divergent_branches_and_loops_reconverge():
    out = torch.zeros(64, dtype=torch.int32)
    launch_ptx(DIVERGE, (1, 1, 1), (64, 1, 1), [out])
    want = [({0: 10, 1: 20}.get(t % 4, 100) + 1) + 1000 * max(t % 4, 1) for t in range(64)]
    assert out.tolist() == want


# ------------------------------------------------------------------------------------------ strict checks


def test_out_of_bounds_global_access_names_cta_and_lane():
    src = kernel("""
        ld.param.u64 %rd1, [p_out]; mov.u32 %r1, %tid.x;
        mul.wide.u32 %rd2, %r1, 4; add.s64 %rd3, %rd1, %rd2; st.global.b32 [%rd3], %r1; ret;""")
    out = torch.zeros(40, dtype=torch.int32)
    with pytest.raises(EmulationError, match=r"out-of-bounds global access.*CTA \(1, 0, 0\) warp 1 lane 8 \(thread 40\)"):
        launch_ptx(src, (2, 1, 1), (64, 1, 1), [out], order="reverse")


def test_poisoned_shared_memory_read_is_an_error():
    src = kernel("""
        .shared .align 4 .b8 buf[256];
        mov.u32 %r1, %tid.x; shl.b32 %r2, %r1, 2; mov.u32 %r3, buf;
        add.u32 %r4, %r3, %r2; st.shared.b32 [%r4], %r1; bar.sync 0;
        ld.shared.b32 %r5, [%r4+128]; ret;""".replace(".shared .align 4 .b8 buf[256];", ""),
                 extra=".shared .align 4 .b8 buf[256];")
    launch_ptx(src.replace("[%r4+128]", "[%r4+0]"), (1, 1, 1), (32, 1, 1), [torch.zeros(1)])
    with pytest.raises(EmulationError, match="uninitialised \\(poisoned\\) shared bytes"):
        launch_ptx(src, (1, 1, 1), (32, 1, 1), [torch.zeros(1)])


CPASYNC = """
    ld.param.u64 %rd1, [p_in]; ld.param.u64 %rd2, [p_out];
    mov.u32 %r1, %tid.x; shl.b32 %r2, %r1, 4; mov.u32 %r3, smem; add.u32 %r4, %r3, %r2;
    cvt.u64.u32 %rd3, %r2; add.s64 %rd4, %rd1, %rd3;
    cp.async.cg.shared.global [%r4], [%rd4], 16;
    cp.async.commit_group;
    cp.async.ca.shared.global [%r4+512], [%rd4], 16, 4;
    cp.async.commit_group;
    WAIT
    ld.shared.v4.b32 {%r5, %r6, %r7, %r8}, [%r4];
    ld.shared.v4.b32 {%r9, %r10, %r11, %r12}, [%r4+512];
    add.s64 %rd5, %rd2, %rd3; st.global.v4.b32 [%rd5], {%r5, %r6, %r7, %r8};
    st.global.v4.b32 [%rd5+512], {%r9, %r10, %r11, %r12};
    ret;
"""


def test_cp_async_data_lands_only_at_its_wait_group():
    src_in = torch.arange(128, dtype=torch.int32) + 1
    params = ".param .u64 p_in, .param .u64 p_out"
    smem = ".extern .shared .align 16 .b8 smem[];"
    ok = kernel(CPASYNC.replace("WAIT", "cp.async.wait_group 0;"), params, extra=smem)
    out = torch.zeros(256, dtype=torch.int32)
    launch_ptx(ok, (1, 1, 1), (32, 1, 1), [src_in, out], dyn_smem=1024)
    assert torch.equal(out[:128], src_in)
    zf = out[128:].reshape(32, 4)  # src-size 4: first word copied, the rest zero-filled
    assert torch.equal(zf[:, 0], src_in.reshape(32, 4)[:, 0]) and not zf[:, 1:].any()
    early = kernel(CPASYNC.replace("WAIT", "cp.async.wait_group 1;"), params, extra=smem)  # the second group may be pending
    with pytest.raises(EmulationError, match="asynchronous copy into them is still in flight"):
        launch_ptx(early, (1, 1, 1), (32, 1, 1), [src_in, torch.zeros(256, dtype=torch.int32)], dyn_smem=1024)


def test_barrier_some_warps_never_reach_is_a_deadlock():
    src = kernel("""
        mov.u32 %r1, %tid.x; setp.ge.u32 %p1, %r1, 64; @%p1 bra $L_SKIP;
        bar.sync 0;
    $L_SKIP:
        bar.sync 1;
        ret;""")
    with pytest.raises(DeadlockError, match=r"warp 0: pc \d+ \(bar.sync 1\).*barrier 1 \(64/96|warp 2: pc"):
        launch_ptx(src, (1, 1, 1), (96, 1, 1), [torch.zeros(1)])


def test_unknown_opcode_is_an_error_naming_it():
    src = kernel("mov.u32 %r1, %tid.x; vabsdiff4.u32.u32.u32.add %r2, %r1, %r1, %r1; ret;")
    with pytest.raises(UnknownOpcodeError, match="vabsdiff4.u32.u32.u32.add"):
        launch_ptx(src, (1, 1, 1), (32, 1, 1), [torch.zeros(1)])
