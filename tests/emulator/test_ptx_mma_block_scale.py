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


def mma_ptx(kind: str, vec: str, shape: str, at: str, bt: str, st: str, sel: str) -> str:
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
mma.sync.aligned.{kind}.block_scale.{vec}.{shape}.row.col.f32.{at}.{bt}.f32.{st} {{%f5, %f6, %f7, %f8}}, {{%r10, %r11, %r12, %r13}}, {{%r14, %r15}}, {{%f1, %f2, %f3, %f4}}, {{%r16}}, {sel};
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


def run(kind, vec, shape, at, bt, st, sel, seed, *, scale_codes, elem_codes, nan_scale=False):
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
    launch_ptx(mma_ptx(kind, vec, shape, at, bt, st, selectors(*sel)), (1, 1, 1), (32, 1, 1),
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
