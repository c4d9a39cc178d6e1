"""Opcode semantics NVIDIA's CuTeDSL examples needed (bench/run_nvidia_examples.py), on hand-written PTX.

Integer ``div`` / ``rem``: C semantics (truncation toward zero, the remainder takes the
dividend's sign) against Python, and division by zero, which the PTX ISA defines as "an unspecified,
machine-specific value" (no trap): compilers speculate such divisions and discard the result on the zero divisor's
path (NVIDIA's Hopper dense_gemm example does, for grids narrower than its raster swizzle). The emulator's stand-in
value is all ones, and every occurrence is counted in ``Launch.stats["int_div_by_zero"]``.

``setmaxnreg`` (Hopper dense_gemm_persistent's warp-specialised register split): a resource hint with no
functional effect; the ISA's operand rule (24..256, a multiple of 8) and whole-warp execution are checked."""

from __future__ import annotations

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
