"""Inline PTX of the fused NVFP4 requant epilogue (sm_100a): the exact conversions the contract names.

One instruction each (imported only when a kernel is compiled):

* :func:`div_rn` -- ``div.rn.f32`` (true division; the quantizer convention of ``nvgemm.core.formats``);
* :func:`to_e4m3` -- ``cvt.rn.satfinite.e4m3x2.f32`` (block scale byte, RNE, caller clamps to 448);
* :func:`e4m3_to_f32` -- ``cvt.rn.f16x2.e4m3x2`` + ``cvt.f32.f16`` (exact widening);
* :func:`to_e2m1x2` -- ``cvt.rn.satfinite.e2m1x2.f32`` (two codes, ``hi`` in bits 7..4, ``lo`` in 3..0:
  exactly the packed byte with the even feature in the low nibble).
"""

from __future__ import annotations

from cutlass import Float32, Int32
from cutlass.cutlass_dsl import T, dsl_user_op

from nvgemm.templates.sm90_w4a16.common import _asm, _v


@dsl_user_op
def div_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    return Float32(_asm(T.f32(), [_v(a, Float32, loc, ip), _v(b, Float32, loc, ip)], "div.rn.f32 $0, $1, $2;",
                        "=f,f,f", loc, ip))


@dsl_user_op
def to_e4m3(x: Float32, *, loc=None, ip=None) -> Int32:
    """fp32 -> e4m3 byte (in the low 8 bits of the result)."""
    return Int32(_asm(T.i32(), [_v(x, Float32, loc, ip)],
                      "{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, 0f00000000, $1; cvt.u32.u16 $0, t; }",
                      "=r,f", loc, ip))


@dsl_user_op
def e4m3_to_f32(byte: Int32, *, loc=None, ip=None) -> Float32:
    return Float32(_asm(T.f32(), [_v(byte, Int32, loc, ip)],
                        "{ .reg .b16 t; .reg .b32 h; .reg .b16 lo, hi; cvt.u16.u32 t, $1; "
                        "cvt.rn.f16x2.e4m3x2 h, t; mov.b32 {lo, hi}, h; cvt.f32.f16 $0, lo; }",
                        "=f,r", loc, ip))


@dsl_user_op
def to_e2m1x2(hi: Float32, lo: Float32, *, loc=None, ip=None) -> Int32:
    """Two fp32 values (already divided by their scale) -> one packed byte."""
    return Int32(_asm(T.i32(), [_v(hi, Float32, loc, ip), _v(lo, Float32, loc, ip)],
                      "{ .reg .b8 t; cvt.rn.satfinite.e2m1x2.f32 t, $1, $2; cvt.u32.u8 $0, t; }",
                      "=r,f,f", loc, ip))
