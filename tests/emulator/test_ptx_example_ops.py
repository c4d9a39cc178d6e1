"""Opcode semantics NVIDIA's CuTeDSL examples needed (bench/run_nvidia_examples.py), on hand-written PTX.

Integer ``div`` / ``rem``: C semantics (truncation toward zero, the remainder takes the
dividend's sign) against Python, and division by zero, which the PTX ISA defines as "an unspecified,
machine-specific value" (no trap): compilers speculate such divisions and discard the result on the zero divisor's
path (NVIDIA's Hopper dense_gemm example does, for grids narrower than its raster swizzle). The emulator's stand-in
value is all ones, and every occurrence is counted in ``Launch.stats["int_div_by_zero"]``.

``setmaxnreg`` (Hopper dense_gemm_persistent's warp-specialised register split): a resource hint with no
functional effect; the ISA's operand rule (24..256, a multiple of 8) and whole-warp execution are checked.

``.f32x2`` arithmetic (Blackwell dense_gemm_alpha_beta_persistent's epilogue): two independent f32 operations on the
halves of a .b64 register, checked against exact rationals rounded per half. Mixed-precision ``fma/add.f32.bf16``
(Blackwell rmsnorm): 16-bit sources, f32 addend and result, one rounding. ``st.async ... mbarrier::complete_tx``
(Blackwell rmsnorm with a 2-CTA cluster): a store into the peer CTA's shared memory that completes the transaction
on the peer's mbarrier, which the peer waits on. ``copysign`` (Hopper FP8 GELU epilogue's erf): the value of b with
the sign bit of a, checked bit for bit against numpy's copysign (zeros, infinities, NaNs included)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

import pytest
import torch

from nvgemm.emulator.ptx import EmulationError
from nvgemm.emulator.runner import launch_ptx

pytestmark = pytest.mark.emulator

SRC = """.version 9.4
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 p_a, .param .u64 p_b, .param .u64 p_out)
{
.reg .pred %p<4>;
.reg .b32 %r<16>;
.reg .b64 %rd<16>;
    ld.param.u64 %rd1, [p_a]; ld.param.u64 %rd2, [p_b]; ld.param.u64 %rd3, [p_out];
    mov.u32 %r1, %tid.x; shl.b32 %r2, %r1, 2; cvt.u64.u32 %rd4, %r2;
    add.s64 %rd5, %rd1, %rd4; add.s64 %rd6, %rd2, %rd4;
    ld.global.b32 %r3, [%rd5]; ld.global.b32 %r4, [%rd6];
    div.s32 %r5, %r3, %r4;
    rem.s32 %r6, %r3, %r4;
    setp.ne.s32 %p1, %r4, 0;
    selp.b32 %r7, %r6, 12345, %p1;
    shl.b32 %r8, %r1, 4; cvt.u64.u32 %rd7, %r8; add.s64 %rd8, %rd3, %rd7;
    st.global.v4.b32 [%rd8], {%r5, %r6, %r7, %r4};
    ret;
}
"""


def test_int_div_rem_c_semantics_and_division_by_zero():
    a = torch.tensor([(-1) ** i * (7 * i + 3) for i in range(32)], dtype=torch.int32)
    b = torch.tensor([(i % 4) * (-1) ** (i // 4) for i in range(32)], dtype=torch.int32)  # 8 zero divisors
    out = torch.zeros(32, 4, dtype=torch.int32)
    launch = launch_ptx(SRC, (1, 1, 1), (32, 1, 1), [a, b, out])
    for i in range(32):
        x, y = int(a[i]), int(b[i])
        if y:
            q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
            assert out[i].tolist() == [q, x - q * y, x - q * y, y], i
        else:  # the unspecified value, and the selected fallback where the program discards it
            assert out[i].tolist() == [-1, -1, 12345, 0], i
    assert launch.stats["int_div_by_zero"] == 2 * 8  # div and rem, 8 lanes each


SETMAXNREG = """.version 9.4
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 p_out)
{
.reg .pred %p<4>;
.reg .b32 %r<8>;
.reg .b64 %rd<8>;
    ld.param.u64 %rd1, [p_out];
    mov.u32 %r1, %tid.x; shr.u32 %r2, %r1, 5;
    setp.eq.s32 %p1, %r2, 0;
    GUARD
    @%p1 setmaxnreg.dec.sync.aligned.u32 DEC;
    @!%p1 setmaxnreg.inc.sync.aligned.u32 232;
    shl.b32 %r3, %r1, 2; cvt.u64.u32 %rd2, %r3; add.s64 %rd3, %rd1, %rd2;
    st.global.b32 [%rd3], %r1;
    ret;
}
"""


def test_setmaxnreg_is_a_checked_hint():
    out = torch.zeros(64, dtype=torch.int32)
    launch = launch_ptx(SETMAXNREG.replace("GUARD", "").replace("DEC", "40"), (1, 1, 1), (64, 1, 1), [out])
    assert torch.equal(out, torch.arange(64, dtype=torch.int32))
    assert launch.stats["setmaxnreg.dec"] == 1 and launch.stats["setmaxnreg.inc"] == 1  # one per warp
    with pytest.raises(EmulationError, match="24..256 and a multiple of 8"):
        launch_ptx(SETMAXNREG.replace("GUARD", "").replace("DEC", "20"), (1, 1, 1), (64, 1, 1), [out])
    divergent = SETMAXNREG.replace("GUARD", "and.b32 %r4, %r1, 1; setp.eq.s32 %p1, %r4, 0;").replace("DEC", "40")
    with pytest.raises(EmulationError, match="partial warp"):
        launch_ptx(divergent, (1, 1, 1), (64, 1, 1), [out])


F32X2 = """.version 9.4
.target sm_100a
.address_size 64
.visible .entry k(.param .u64 p_a, .param .u64 p_b, .param .u64 p_c, .param .u64 p_out)
{
.reg .b32 %r<4>;
.reg .b64 %rd<24>;
    ld.param.u64 %rd1, [p_a]; ld.param.u64 %rd2, [p_b]; ld.param.u64 %rd3, [p_c]; ld.param.u64 %rd4, [p_out];
    mov.u32 %r1, %tid.x; shl.b32 %r2, %r1, 3; cvt.u64.u32 %rd5, %r2;
    add.s64 %rd6, %rd1, %rd5; add.s64 %rd7, %rd2, %rd5; add.s64 %rd8, %rd3, %rd5;
    ld.global.b64 %rd9, [%rd6]; ld.global.b64 %rd10, [%rd7]; ld.global.b64 %rd11, [%rd8];
    mul.rn.f32x2 %rd12, %rd9, %rd10;
    add.rz.f32x2 %rd13, %rd9, %rd10;
    fma.rn.f32x2 %rd14, %rd9, %rd10, %rd11;
    shl.b32 %r3, %r1, 5; cvt.u64.u32 %rd15, %r3; add.s64 %rd16, %rd4, %rd15;
    st.global.v4.b64 [%rd16], {%rd12, %rd13, %rd14, %rd9};
    ret;
}
"""


def _round_f32(x: Fraction, mode: str) -> np.float32:
    """The f32 nearest to the exact ``x`` (ties to even) or, for ``rz``, the largest not above it in magnitude."""
    r = np.float32(float(x))
    cands = [np.nextafter(r, np.float32(-np.inf)), r, np.nextafter(r, np.float32(np.inf))]
    if mode == "rz":
        return max((c for c in cands if abs(Fraction(float(c))) <= abs(x)), key=lambda c: abs(Fraction(float(c))))
    return min(cands, key=lambda c: (abs(Fraction(float(c)) - x), int(np.float32(c).view(np.uint32)) & 1))


def test_f32x2_halves_are_independent_f32_operations():
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal(64).astype(np.float32) for _ in range(3))
    b[1::2] *= 2.0 ** -20  # odd halves: sums that need rounding
    out = torch.zeros(32, 8, dtype=torch.float32)
    launch_ptx(F32X2, (1, 1, 1), (32, 1, 1), [torch.from_numpy(x) for x in (a, b, c)] + [out])
    got = out.numpy().reshape(32, 4, 2)
    for i in range(64):
        lane, h = divmod(i, 2)
        fa, fb, fc = (Fraction(float(x[i])) for x in (a, b, c))
        assert got[lane, 0, h] == _round_f32(fa * fb, "rn"), i
        assert got[lane, 1, h] == _round_f32(fa + fb, "rz"), i
        assert got[lane, 2, h] == _round_f32(fa * fb + fc, "rn"), i
    assert np.array_equal(got[:, 3].ravel(), a)


MIXED = """.version 9.4
.target sm_100a
.address_size 64
.visible .entry k(.param .u64 p_a, .param .u64 p_b, .param .u64 p_c, .param .u64 p_out)
{
.reg .b16 %rs<4>;
.reg .b32 %r<16>;
.reg .b64 %rd<24>;
    ld.param.u64 %rd1, [p_a]; ld.param.u64 %rd2, [p_b]; ld.param.u64 %rd3, [p_c]; ld.param.u64 %rd4, [p_out];
    mov.u32 %r1, %tid.x; shl.b32 %r2, %r1, 1; cvt.u64.u32 %rd5, %r2; shl.b32 %r3, %r1, 2; cvt.u64.u32 %rd6, %r3;
    add.s64 %rd7, %rd1, %rd5; add.s64 %rd8, %rd2, %rd5; add.s64 %rd9, %rd3, %rd6;
    ld.global.b16 %rs1, [%rd7]; ld.global.b16 %rs2, [%rd8]; ld.global.b32 %r4, [%rd9];
    fma.rn.f32.bf16 %r5, %rs1, %rs2, %r4;
    add.rz.f32.bf16 %r6, %rs1, %r4;
    shl.b32 %r7, %r1, 3; cvt.u64.u32 %rd10, %r7; add.s64 %rd11, %rd4, %rd10;
    st.global.v2.b32 [%rd11], {%r5, %r6};
    ret;
}
"""


def test_mixed_precision_fma_and_add_round_once_to_f32():
    g = torch.Generator().manual_seed(5)
    a, b = (torch.randn(32, generator=g).to(torch.bfloat16) for _ in range(2))
    c = torch.randn(32, generator=g) * 2.0 ** -12  # sums that need rounding
    out = torch.zeros(32, 2)
    launch_ptx(MIXED, (1, 1, 1), (32, 1, 1), [a, b, c, out])
    for i in range(32):
        fa, fb, fc = (Fraction(float(x[i])) for x in (a, b, c))
        assert out[i, 0].item() == float(_round_f32(fa * fb + fc, "rn")), i
        assert out[i, 1].item() == float(_round_f32(fa + fc, "rz")), i


ST_ASYNC = """.version 9.4
.target sm_100a
.address_size 64
.shared .align 16 .b8 buf[16];
.shared .align 8 .b8 bar[8];
.visible .entry k(.param .u64 p_out)
{
.reg .pred %p<4>;
.reg .b32 %r<32>;
.reg .b64 %rd<16>;
    ld.param.u64 %rd1, [p_out];
    mov.u32 %r1, %cluster_ctarank; mov.u32 %r2, buf; mov.u32 %r3, bar; mov.u32 %r4, %laneid;
    setp.eq.u32 %p1, %r4, 0;
    @%p1 mbarrier.init.shared.b64 [%r3], 1;
    @%p1 mbarrier.arrive.expect_tx.shared.b64 %rd2, [%r3], 8;
    barrier.cluster.arrive.aligned;
    barrier.cluster.wait.aligned;
    xor.b32 %r6, %r1, 1;
    mapa.shared::cluster.u32 %r7, %r2, %r6;
    mapa.shared::cluster.u32 %r8, %r3, %r6;
    add.u32 %r9, %r1, 200; add.u32 %r10, %r1, 300;
    @%p1 st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%r7], {%r9, %r10}, [BAR];
WAIT:
    mbarrier.try_wait.parity.shared.b64 %p2, [%r3], 0;
    @!%p2 bra WAIT;
    ld.shared.v2.b32 {%r12, %r13}, [%r2];
    mul.wide.u32 %rd3, %r1, 8; add.s64 %rd4, %rd1, %rd3;
    @%p1 st.global.v2.b32 [%rd4], {%r12, %r13};
    barrier.cluster.arrive.aligned;
    barrier.cluster.wait.aligned;
    ret;
}
"""


def test_st_async_stores_into_the_peer_and_completes_its_transaction():
    import nvgemm.emulator.isa.ops_sm100  # noqa: F401 -- registers mbarrier, st.async, barrier.cluster

    out = torch.zeros(2, 2, dtype=torch.int32)
    launch_ptx(ST_ASYNC.replace("BAR", "%r8"), (2, 1, 1), (32, 1, 1), [out], cluster=(2, 1, 1))
    assert out.tolist() == [[201, 301], [200, 300]]  # each CTA received its peer's pair
    with pytest.raises(EmulationError, match="must be in the destination CTA"):
        launch_ptx(ST_ASYNC.replace("BAR", "%r3"), (2, 1, 1), (32, 1, 1), [out], cluster=(2, 1, 1))


COPYSIGN = """.version 9.4
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 p_a, .param .u64 p_b, .param .u64 p_out)
{
.reg .b32 %r<8>;
.reg .b64 %rd<12>;
    ld.param.u64 %rd1, [p_a]; ld.param.u64 %rd2, [p_b]; ld.param.u64 %rd3, [p_out];
    mov.u32 %r1, %tid.x; shl.b32 %r2, %r1, 2; cvt.u64.u32 %rd4, %r2;
    add.s64 %rd5, %rd1, %rd4; add.s64 %rd6, %rd2, %rd4; add.s64 %rd7, %rd3, %rd4;
    ld.global.b32 %r3, [%rd5]; ld.global.b32 %r4, [%rd6];
    copysign.f32 %r5, %r3, %r4;
    st.global.b32 [%rd7], %r5;
    ret;
}
"""


def test_copysign_takes_the_sign_of_a_and_the_value_of_b():
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.5, -2.25]
    a = np.array(special * 4, dtype=np.float32)
    b = np.array(special[::-1] * 4, dtype=np.float32)
    b[::3] = -b[::3]
    out = torch.zeros(32)
    launch_ptx(COPYSIGN, (1, 1, 1), (32, 1, 1), [torch.from_numpy(a), torch.from_numpy(b), out])
    np.testing.assert_array_equal(out.numpy().view(np.uint32), np.copysign(b, a).view(np.uint32))
