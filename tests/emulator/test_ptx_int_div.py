"""Integer ``div`` / ``rem`` on hand-written PTX: C semantics (truncation toward zero, the remainder takes the
dividend's sign) against Python, and division by zero, which the PTX ISA defines as "an unspecified,
machine-specific value" (no trap): compilers speculate such divisions and discard the result on the zero divisor's
path (NVIDIA's Hopper dense_gemm example does, for grids narrower than its raster swizzle). The emulator's stand-in
value is all ones, and every occurrence is counted in ``Launch.stats["int_div_by_zero"]``."""

from __future__ import annotations

import pytest
import torch

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
