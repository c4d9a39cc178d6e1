"""A destination register wider than a signed instruction type receives the value sign-extended (PTX ISA,
"Operand Size Exceeding Instruction-Type Size": signed types sign-extend, unsigned / bit types zero-extend).
Found by NVIDIA's CuTeDSL tutorial fp16_gemm_6, whose int8 dequantization is ``cvt.s8.s32`` into a 16-bit
register followed by ``cvt.rn.f32.s16``: with zero extension -2 became 254."""

from __future__ import annotations

import pytest
import torch

from nvgemm.emulator.runner import launch_ptx

pytestmark = pytest.mark.emulator

PTX = """.version 9.4
.target sm_100a
.address_size 64
.visible .entry k(.param .u64 p_in, .param .u64 p_out)
{
.reg .b16 %rs<4>;
.reg .b32 %r<16>;
.reg .b64 %rd<8>;
.reg .f32 %f<4>;
    ld.param.u64 %rd1, [p_in];
    ld.param.u64 %rd2, [p_out];
    mov.u32 %r1, %laneid;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd1, %rd3;
    ld.global.u32 %r2, [%rd4];
    cvt.s8.s32 %rs1, %r2;
    cvt.rn.f32.s16 %f1, %rs1;
    cvt.u32.u16 %r3, %rs1;
    cvt.u8.u32 %rs2, %r2;
    cvt.u32.u16 %r4, %rs2;
    mul.wide.u32 %rd5, %r1, 16;
    add.s64 %rd6, %rd2, %rd5;
    mov.b32 %r5, %f1;
    st.global.v4.b32 [%rd6], {%r5, %r3, %r4, %r2};
    ret;
}
"""


def test_cvt_to_s8_sign_extends_into_the_16_bit_register():
    x = torch.tensor([-2, -1, 0, 1, 127, -128, 0x1FE, -0x181] + list(range(-12, 12)), dtype=torch.int32)
    out = torch.zeros(32, 4, dtype=torch.int32)
    launch_ptx(PTX, (1, 1, 1), (32, 1, 1), [x, out])
    s8 = ((x & 0xFF) ^ 0x80) - 0x80  # cvt.s8.s32 wraps to the low byte, read as signed
    assert out[:, 0].view(torch.float32).tolist() == s8.float().tolist()
    assert out[:, 1].tolist() == (s8 & 0xFFFF).tolist()  # the whole 16-bit register holds the sign-extended byte
    assert out[:, 2].tolist() == (x & 0xFF).tolist()  # unsigned: zero-extended
