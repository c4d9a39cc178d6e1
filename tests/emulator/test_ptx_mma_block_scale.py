"""Block-scaled ``mma.sync`` of sm_120a / sm_121a on hand-written PTX, against the PTX ISA (9.7.14.3 "Block
Scaling for mma.sync", the m16n8k64 / m16n8k32 fragment sections): every lane's A / B / C registers and its
scale register are built here from the ISA's fragment and scale-selector formulas, the element and scale codes
are decoded here from the ISA's format tables (torch float8 views and literal tables, none of the emulator's
helpers), and D must equal the fp64 product rounded once to fp32, bit for bit.

Data: every product of two elements and two scales is exact in fp64 and so is every sum of 64 of them
(at most 4 + 4 + 4 + 4 significant bits per product, exponents within 2^-30 .. 2^24 by the code ranges drawn),
so the reference is exact before its one fp32 rounding -- the emulator's model (numerics.dot_f32) and any
summation order agree there."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nvgemm.emulator.ptx import EmulationError, UnknownOpcodeError
from nvgemm.emulator.runner import launch_ptx

pytestmark = pytest.mark.emulator

# PTX ISA 5.2.5.1, e2m1: codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 the sign
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                    dtype=torch.float64)


def dec(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    """fp64 values of element / scale codes (int64 tensor) of ``fmt``."""
    if fmt == "e2m1":
        return E2M1[codes]
    if fmt == "ue8m0":  # 2^(code - 127), 0xff NaN
        v = torch.pow(2.0, (codes - 127).double())
        return torch.where(codes == 255, torch.nan, v)
    if fmt in ("e4m3", "ue4m3"):  # ue4m3: the e4m3 code with the sign bit 0
        return codes.to(torch.uint8).view(torch.float8_e4m3fn).double()
    if fmt == "e5m2":
        return codes.to(torch.uint8).view(torch.float8_e5m2).double()
    raise ValueError(fmt)


def mma_opcode(kind: str, vec: str, shape: str, at: str, bt: str, st: str, spelling: str = "kind_first") -> str:
    """``kind_first``: CUTLASS's ``mma.sync.aligned.kind.block_scale.scale_vec.shape.row.col...``; ``isa``: the PTX
    ISA's ``mma.sync.aligned.shape.row.col.kind.block_scale{.scale_vec}...``; ``isa_default_vec``: the ISA's with
    ``.scale_vec`` left out (its default)."""
    types = f"f32.{at}.{bt}.f32.{st}"
    if spelling == "kind_first":
        return f"mma.sync.aligned.{kind}.block_scale.{vec}.{shape}.row.col.{types}"
    if spelling == "isa":
        return f"mma.sync.aligned.{shape}.row.col.{kind}.block_scale.{vec}.{types}"
    assert spelling == "isa_default_vec"
    return f"mma.sync.aligned.{shape}.row.col.{kind}.block_scale.{types}"


def mma_ptx(kind: str, vec: str, shape: str, at: str, bt: str, st: str, sel: str, spelling: str = "kind_first") -> str:
    return f""".version 8.7
.target sm_120a
.address_size 64
.visible .entry k(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 psa, .param .u64 psb, .param .u64 pd)
{{
.reg .b32 %r<40>;
.reg .f32 %f<16>;
.reg .b64 %rd<32>;
ld.param.u64 %rd1, [pa]; ld.param.u64 %rd2, [pb]; ld.param.u64 %rd3, [pc];
ld.param.u64 %rd4, [psa]; ld.param.u64 %rd5, [psb]; ld.param.u64 %rd6, [pd];
mov.u32 %r1, %laneid;
mul.wide.u32 %rd7, %r1, 16; mul.wide.u32 %rd8, %r1, 8; mul.wide.u32 %rd9, %r1, 4;
add.s64 %rd10, %rd1, %rd7; ld.global.v4.b32 {{%r10, %r11, %r12, %r13}}, [%rd10];
add.s64 %rd11, %rd2, %rd8; ld.global.v2.b32 {{%r14, %r15}}, [%rd11];
add.s64 %rd12, %rd3, %rd7; ld.global.v4.f32 {{%f1, %f2, %f3, %f4}}, [%rd12];
add.s64 %rd13, %rd4, %rd9; ld.global.b32 %r16, [%rd13];
add.s64 %rd14, %rd5, %rd9; ld.global.b32 %r17, [%rd14];
{mma_opcode(kind, vec, shape, at, bt, st, spelling)} {{%f5, %f6, %f7, %f8}}, {{%r10, %r11, %r12, %r13}}, {{%r14, %r15}}, {{%f1, %f2, %f3, %f4}}, {{%r16}}, {sel};
add.s64 %rd15, %rd6, %rd7; st.global.v4.f32 [%rd15], {{%f5, %f6, %f7, %f8}};
ret;
}}
"""


def selectors(bid_a, tid_a, bid_b, tid_b) -> str:
    return f"{{{bid_a}, {tid_a}}}, {{%r17}}, {{{bid_b}, {tid_b}}}"


def fragments(A, B, C, K, bits):
    """Per-lane registers (ISA fragment formulas): A (16 x K) / B (K x 8) codes, C (16 x 8) f32."""
    E = 32 // bits
    ra = np.zeros((32, 4), np.uint32)
    rb = np.zeros((32, 2), np.uint32)
    rc = torch.zeros(32, 4)
    for lane in range(32):
        g, q = lane >> 2, lane % 4
        for i in range(4 * E):
            r, j = divmod(i, E)
            row = g + 8 * (r % 2)
            col = q * E + j + (K // 2) * (r // 2)
            ra[lane, r] |= np.uint32(int(A[row, col]) << (bits * j))
        for i in range(2 * E):
            r, j = divmod(i, E)
            rb[lane, r] |= np.uint32(int(B[q * E + j + (K // 2) * r, g]) << (bits * j))
        for i in range(4):
            rc[lane, i] = C[g + 8 * (i >= 2), q * 2 + (i & 1)]
    return torch.from_numpy(ra.view(np.int32)), torch.from_numpy(rb.view(np.int32)), rc


def scale_regs(SA, SB, nsf, bid_a, tid_a, bid_b, tid_b, seed):
    """Scale registers: random bytes everywhere (lanes / bytes the MMA must ignore), the scale of A row m chunk s
    in lane 4 (m % 8) + 2 thread-id-a + m // 8, of B column n chunk s in lane 4 n + thread-id-b; byte s
    (2X / 4X) or byte byte-id (1X)."""
    g = torch.Generator().manual_seed(seed)
    ra = torch.randint(0, 256, (32, 4), generator=g, dtype=torch.int64)
    rb = torch.randint(0, 256, (32, 4), generator=g, dtype=torch.int64)
    for m in range(16):
        for s in range(nsf):
            ra[4 * (m % 8) + 2 * tid_a + m // 8, bid_a if nsf == 1 else s] = SA[m, s]
    for n in range(8):
        for s in range(nsf):
            rb[4 * n + tid_b, bid_b if nsf == 1 else s] = SB[s, n]
    pack = lambda r: torch.from_numpy(  # noqa: E731
        (r[:, 0] | r[:, 1] << 8 | r[:, 2] << 16 | r[:, 3] << 24).numpy().astype(np.uint32).view(np.int32))
    return pack(ra), pack(rb)


def run(kind, vec, shape, at, bt, st, sel, seed, *, scale_codes, elem_codes, nan_scale=False, spelling="kind_first"):
    K = 64 if shape == "m16n8k64" else 32
    bits = 4 if at == "e2m1" else 8
    nsf = {"scale_vec::1X": 1, "scale_vec::2X": 2, "scale_vec::4X": 4}[vec]
    g = torch.Generator().manual_seed(seed)
    A = elem_codes[0][torch.randint(0, len(elem_codes[0]), (16, K), generator=g)]
    B = elem_codes[1][torch.randint(0, len(elem_codes[1]), (K, 8), generator=g)]
    C = torch.randint(-64, 65, (16, 8), generator=g).float() / 8
    SA = scale_codes[torch.randint(0, len(scale_codes), (16, nsf), generator=g)]
    SB = scale_codes[torch.randint(0, len(scale_codes), (nsf, 8), generator=g)]
    if nan_scale:
        SA[3, nsf - 1] = 0x7F if st == "ue4m3" else 0xFF
    fa, fb, fc = fragments(A, B, C, K, bits)
    sa, sb = scale_regs(SA, SB, nsf, *sel, seed + 1)
    d = torch.zeros(32, 4)
    launch_ptx(mma_ptx(kind, vec, shape, at, bt, st, selectors(*sel), spelling), (1, 1, 1), (32, 1, 1),
               [fa, fb, fc, sa, sb, d], device="RTX5090")
    chunk = K // nsf
    Av = dec(A, at) * dec(SA, st).repeat_interleave(chunk, dim=1)
    Bv = dec(B, bt) * dec(SB, st).repeat_interleave(chunk, dim=0)
    want = (Av @ Bv + C.double()).float()
    got = torch.zeros(16, 8)
    for lane in range(32):
        g_, q = lane >> 2, lane % 4
        for i in range(4):
            got[g_ + 8 * (i >= 2), q * 2 + (i & 1)] = d[lane, i]
    return got, want


UE4M3_OK = torch.tensor([c for c in range(0x7F)], dtype=torch.int64)  # every non-NaN ue4m3 (subnormals too)
UE8M0_OK = torch.arange(117, 138, dtype=torch.int64)  # 2^-10 .. 2^10
E2M1_ALL = torch.arange(16, dtype=torch.int64)
FP8_OK = torch.tensor([c for c in range(256) if (c & 0x7F) not in (0x7F,) and (c & 0x78) != 0x78], dtype=torch.int64)
E5M2_OK = torch.tensor([c for c in range(256) if (c & 0x7C) != 0x7C], dtype=torch.int64)  # no inf / NaN

NVF4 = ("kind::mxf4nvf4", "scale_vec::4X", "m16n8k64", "e2m1", "e2m1", "ue4m3")


@pytest.mark.parametrize("sel", [(0, 0, 0, 0), (0, 1, 0, 3), (0, 1, 0, 1), (0, 0, 0, 2)])
def test_nvfp4_m16n8k64_4x_ue4m3_matches_the_isa(sel, seed):
    got, want = run(*NVF4, sel, seed, scale_codes=UE4M3_OK, elem_codes=(E2M1_ALL, E2M1_ALL))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_nvfp4_fragments_on_lanes_named_by_the_isa():
    """One nonzero product: A[9, 40] (row 9 = G 1 + 8, col 40 = 32 + Q 1 * 8 + 0: lane 5, register 3, nibble 0)
    times B[40, 2] (row 40 = 32 + Q 1 * 8: lane 4 * 2 + 1 = 9, register 1, nibble 0); the scale of A row 9 from
    lane 4 * (9 % 8) + 9 // 8 = 5 byte 2 (K chunk 40 // 16), of B column 2 from lane 8 byte 2; D[9, 2] lands in
    c2 of lane 4 * 1 + 1 (row G + 8, column 2 Q + 0)."""
    fa = torch.zeros(32, 4, dtype=torch.int32)
    fb = torch.zeros(32, 2, dtype=torch.int32)
    fa[5, 3] = 0x3  # e2m1 1.5
    fb[9, 1] = 0x4  # e2m1 2.0
    sa = torch.full((32,), 0x38383838, dtype=torch.int32)  # decoys: scale 1 in every other lane / byte
    sb = torch.full((32,), 0x38383838, dtype=torch.int32)
    sa[5] = 0x38403838  # ue4m3 0x40 = 2^(8 - 7) = 2 in byte 2
    sb[8] = 0x38303838  # ue4m3 0x30 = 2^(6 - 7) = 0.5 in byte 2
    d = torch.zeros(32, 4)
    launch_ptx(mma_ptx(*NVF4, selectors(0, 0, 0, 0)), (1, 1, 1), (32, 1, 1),
               [fa, fb, torch.zeros(32, 4), sa, sb, d], device="RTX5090")
    want = torch.zeros(32, 4)
    want[5, 2] = 1.5 * 2.0 * 2.0 * 0.5
    assert torch.equal(d, want)


@pytest.mark.parametrize("kind", ["kind::mxf4", "kind::mxf4nvf4"])
def test_mxfp4_m16n8k64_2x_ue8m0_matches_the_isa(kind, seed):
    got, want = run(kind, "scale_vec::2X", "m16n8k64", "e2m1", "e2m1", "ue8m0", (0, 1, 0, 2), seed,
                    scale_codes=UE8M0_OK, elem_codes=(E2M1_ALL, E2M1_ALL))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_mxf4nvf4_4x_ue8m0_matches_the_isa(seed):
    got, want = run("kind::mxf4nvf4", "scale_vec::4X", "m16n8k64", "e2m1", "e2m1", "ue8m0", (0, 0, 0, 1), seed,
                    scale_codes=UE8M0_OK, elem_codes=(E2M1_ALL, E2M1_ALL))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("at,bt", [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e5m2", "e5m2")])
@pytest.mark.parametrize("bid", [0, 3])
def test_mxfp8_m16n8k32_1x_ue8m0_matches_the_isa(at, bt, bid, seed):
    codes = {"e4m3": FP8_OK, "e5m2": E5M2_OK}
    got, want = run("kind::mxf8f6f4", "scale_vec::1X", "m16n8k32", at, bt, "ue8m0", (bid, 1, 3 - bid, 2), seed,
                    scale_codes=UE8M0_OK, elem_codes=(codes[at], codes[bt]))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_a_nan_scale_makes_its_row_nan(seed):
    got, want = run(*NVF4, (0, 0, 0, 0), seed, scale_codes=UE4M3_OK, elem_codes=(E2M1_ALL, E2M1_ALL),
                    nan_scale=True)
    assert torch.isnan(got[3]).all() and not torch.isnan(got[torch.arange(16) != 3]).any()
    assert torch.equal(got.view(torch.int32)[torch.arange(16) != 3], want.view(torch.int32)[torch.arange(16) != 3])


@pytest.mark.parametrize("kind,vec,st", [("kind::mxf4nvf4", "scale_vec::2X", "ue4m3"),
                                         ("kind::mxf4", "scale_vec::4X", "ue8m0"),
                                         ("kind::mxf8f6f4", "scale_vec::2X", "ue8m0")])
def test_combinations_outside_the_isa_table_are_refused(kind, vec, st):
    shape, at = ("m16n8k32", "e4m3") if kind == "kind::mxf8f6f4" else ("m16n8k64", "e2m1")
    z = [torch.zeros(32, 4, dtype=torch.int32), torch.zeros(32, 2, dtype=torch.int32), torch.zeros(32, 4),
         torch.zeros(32, dtype=torch.int32), torch.zeros(32, dtype=torch.int32), torch.zeros(32, 4)]
    with pytest.raises(UnknownOpcodeError, match="not a combination"):
        launch_ptx(mma_ptx(kind, vec, shape, at, at, st, selectors(0, 0, 0, 0)), (1, 1, 1), (32, 1, 1), z)


def test_a_byte_id_the_emulator_does_not_model_is_an_error():
    z = [torch.zeros(32, 4, dtype=torch.int32), torch.zeros(32, 2, dtype=torch.int32), torch.zeros(32, 4),
         torch.zeros(32, dtype=torch.int32), torch.zeros(32, dtype=torch.int32), torch.zeros(32, 4)]
    with pytest.raises(EmulationError, match="byte-id-a 1 with .scale_vec::4X"):
        launch_ptx(mma_ptx(*NVF4, selectors(1, 0, 0, 0)), (1, 1, 1), (32, 1, 1), z)


@pytest.mark.parametrize("case,spelling", [
    (NVF4, "isa"),
    (("kind::mxf4nvf4", "scale_vec::2X", "m16n8k64", "e2m1", "e2m1", "ue8m0"), "isa"),
    (("kind::mxf4", "scale_vec::2X", "m16n8k64", "e2m1", "e2m1", "ue8m0"), "isa"),
    (("kind::mxf4", "scale_vec::2X", "m16n8k64", "e2m1", "e2m1", "ue8m0"), "isa_default_vec"),
    (("kind::mxf8f6f4", "scale_vec::1X", "m16n8k32", "e4m3", "e5m2", "ue8m0"), "isa"),
    (("kind::mxf8f6f4", "scale_vec::1X", "m16n8k32", "e4m3", "e5m2", "ue8m0"), "isa_default_vec"),
])
def test_isa_qualifier_order_gives_the_kind_first_result(case, spelling, seed):
    """The ISA's ``shape.row.col.kind.block_scale{.scale_vec}`` order (and its default ``.scale_vec``) runs the same
    instruction as the kind-first spelling: bit-identical D, equal to the ISA reference."""
    kind, vec, shape, at, bt, st = case
    codes = {"e2m1": E2M1_ALL, "e4m3": FP8_OK, "e5m2": E5M2_OK}
    scales = UE4M3_OK if st == "ue4m3" else UE8M0_OK
    sel = (1, 0, 2, 3) if vec == "scale_vec::1X" else (0, 1, 0, 3)
    kw = dict(scale_codes=scales, elem_codes=(codes[at], codes[bt]))
    got_kf, want = run(kind, vec, shape, at, bt, st, sel, seed, **kw)
    got_isa, want2 = run(kind, vec, shape, at, bt, st, sel, seed, spelling=spelling, **kw)
    assert torch.equal(want, want2)
    assert torch.equal(got_isa.view(torch.int32), got_kf.view(torch.int32))
    assert torch.equal(got_isa.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("opcode,why", [
    ("mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.f32.e2m1.e2m1.f32.ue4m3", "required"),
    ("mma.sync.aligned.m16n8k64.row.col.block_scale.kind::mxf4nvf4.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3", "form"),
    ("mma.sync.aligned.m16n8k64.kind::mxf4nvf4.block_scale.scale_vec::4X.row.col.f32.e2m1.e2m1.f32.ue4m3", "form"),
    ("mma.sync.aligned.row.col.m16n8k64.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3", "form"),
])
def test_qualifier_orders_outside_the_isa_are_reported_by_name(opcode, why):
    z = [torch.zeros(32, 4, dtype=torch.int32), torch.zeros(32, 2, dtype=torch.int32), torch.zeros(32, 4),
         torch.zeros(32, dtype=torch.int32), torch.zeros(32, dtype=torch.int32), torch.zeros(32, 4)]
    ptx = mma_ptx(*NVF4, selectors(0, 0, 0, 0)).replace(mma_opcode(*NVF4), opcode)
    assert opcode in ptx
    with pytest.raises(UnknownOpcodeError, match=opcode.replace(".", r"\.") + ".*" + why):
        launch_ptx(ptx, (1, 1, 1), (32, 1, 1), z)


# ------------------------------------------------------------------------------------------ FP4 in 8-bit containers

LDM = """.version 8.7
.target sm_120a
.address_size 64
.shared .align 128 .b8 buf[1024];
.visible .entry k(.param .u64 p_in, .param .u64 p_out)
{
.reg .b32 %r<16>;
.reg .b64 %rd<16>;
ld.param.u64 %rd1, [p_in]; ld.param.u64 %rd2, [p_out];
mov.u32 %r1, %laneid;
mov.u32 %r2, buf;
mul.wide.u32 %rd3, %r1, 8; add.s64 %rd4, %rd1, %rd3; ld.global.b64 %rd5, [%rd4];
mul.lo.u32 %r3, %r1, 16; add.u32 %r4, %r2, %r3; st.shared.b64 [%r4], %rd5;
bar.sync 0;
mul.lo.u32 %r5, %r1, 16; add.u32 %r6, %r2, %r5;
ldmatrix.sync.aligned.m8n16.x4.shared.b8x16.b4x16_p64 {%r10, %r11, %r12, %r13}, [%r6];
mul.wide.u32 %rd6, %r1, 16; add.s64 %rd7, %rd2, %rd6; st.global.v4.b32 [%rd7], {%r10, %r11, %r12, %r13};
ret;
}
"""


def test_ldmatrix_m8n16_b4x16_p64_unpacks_each_nibble_into_the_low_bits_of_a_byte(seed):
    """Four 8 x 16 matrices of 4-bit codes, row r of matrix i at shared offset 16 (8 i + r) (8 packed bytes, the
    even element in the low nibble, then 8 padding bytes never written: reading them would be an uninitialised
    shared read); lane t's register i holds row t / 4, columns 4 (t % 4) .. + 3 of matrix i, one per byte, the
    4-bit value in the low nibble (PTX ISA ldmatrix, 8x16 fragment layout)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (4, 8, 16), generator=g)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8).reshape(32, 8)
    out = torch.zeros(32, 4, dtype=torch.int32)
    launch_ptx(LDM, (1, 1, 1), (32, 1, 1), [packed.contiguous().view(torch.int64).reshape(32), out], device="RTX5090")
    o = out.numpy().view(np.uint32)
    for t in range(32):
        for i in range(4):
            want = sum(int(codes[i, t // 4, 4 * (t % 4) + j]) << (8 * j) for j in range(4))
            assert o[t, i] == want, (t, i)


@pytest.mark.parametrize("at,bt", [("e2m1", "e4m3"), ("e5m2", "e2m1"), ("e2m1", "e2m1")])
def test_mxf8f6f4_e2m1_operand_sits_in_bits_5_to_2_of_its_byte(at, bt, seed):
    """kind::mxf8f6f4 with an e2m1 operand: one element per byte of the m16n8k32 8-bit fragment, its code in
    bits 5..2 (the other bits zero); random e2m1 codes against the ISA decode."""
    codes = {"e2m1": torch.arange(16, dtype=torch.int64) << 2, "e4m3": FP8_OK, "e5m2": E5M2_OK}

    def dec_container(c, fmt):
        return dec(c >> 2, "e2m1") if fmt == "e2m1" else dec(c, fmt)

    K, nsf = 32, 1
    g = torch.Generator().manual_seed(seed)
    A = codes[at][torch.randint(0, len(codes[at]), (16, K), generator=g)]
    B = codes[bt][torch.randint(0, len(codes[bt]), (K, 8), generator=g)]
    C = torch.randint(-64, 65, (16, 8), generator=g).float() / 8
    SA = UE8M0_OK[torch.randint(0, len(UE8M0_OK), (16, nsf), generator=g)]
    SB = UE8M0_OK[torch.randint(0, len(UE8M0_OK), (nsf, 8), generator=g)]
    fa, fb, fc = fragments(A, B, C, K, 8)
    sa, sb = scale_regs(SA, SB, nsf, 2, 0, 1, 3, seed + 1)
    d = torch.zeros(32, 4)
    launch_ptx(mma_ptx("kind::mxf8f6f4", "scale_vec::1X", "m16n8k32", at, bt, "ue8m0", selectors(2, 0, 1, 3)),
               (1, 1, 1), (32, 1, 1), [fa, fb, fc, sa, sb, d], device="RTX5090")
    want = ((dec_container(A, at) * dec(SA, "ue8m0")) @ (dec_container(B, bt) * dec(SB, "ue8m0")) + C.double()).float()
    got = torch.zeros(16, 8)
    for lane in range(32):
        for i in range(4):
            got[(lane >> 2) + 8 * (i >= 2), (lane % 4) * 2 + (i & 1)] = d[lane, i]
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_tma_b4x16_p64_map_pads_each_16_elements_to_16_shared_bytes():
    """A hand-built rank-2 map of element type 12 (16U4_ALIGN16B, .b4x16_p64): a 32 x 64 box of 4-bit elements
    from a (40 rows, 64 elements) tensor lands as 16-byte units per 16 elements, the 8 packed bytes first and the
    8 padding bytes unwritten; rows past the tensor are zero-filled; the transaction count is the packed size."""
    from nvgemm.emulator.isa.tma import decode_tensor_map, tile_load

    addr, rows, cols, stride = 0x10000, 40, 64, 64  # stride in bytes (a padded row pitch of the global tensor)
    q = [0] * 16
    q[0] = addr
    q[1] = 0b0010 | (1 << 4) | (12 << 7) | (0x0004 << 16) | ((stride >> 4) << 32)
    q[4] = (cols - 1) | ((rows - 1) << 32)
    q[6] = (64 - 1) << 56
    q[7] = 32 - 1
    raw = b"".join(x.to_bytes(8, "little") for x in q)
    tm = decode_tensor_map(raw)
    assert tm.dtype == "b4x16_p64" and tm.box == (64, 32) and tm.box_bytes == 64 * 32 // 2
    gmem = np.random.default_rng(0).integers(0, 256, rows * stride, dtype=np.uint8)

    def read_global(a, width):
        off = a.astype(np.int64) - addr
        return np.stack([gmem[o:o + width] for o in off])

    saddr, data = tile_load(tm, (0, 16), 0, read_global)  # rows 16..47: 24 in bounds, 8 past the end
    assert data.shape == (32 * 4, 8)
    for r in range(32):
        for u in range(4):
            j = r * 4 + u
            assert saddr[j] == 16 * j  # no swizzle: unit j at 16 j, its padding at 16 j + 8 untouched
            want = gmem[(16 + r) * stride + 8 * u:(16 + r) * stride + 8 * u + 8] if 16 + r < rows else np.zeros(8)
            assert (data[j] == want).all(), (r, u)
