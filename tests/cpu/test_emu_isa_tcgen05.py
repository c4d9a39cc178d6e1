"""The emulator's tcgen05 semantics (nvgemm.emulator.isa.tcgen05) against references built here from the PTX ISA:
instruction descriptors assembled field by field from tables 45/47, operands stored into shared memory as the
ISA's 128B-swizzle figure draws them, scale factors in cuBLAS's documented 128x4 -> 32x16-byte block layout,
and torch float64 matmuls on data whose fp32 sums are exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nvgemm.emulator.isa import numerics
from nvgemm.emulator.isa.errors import IsaError
from nvgemm.emulator.isa.tcgen05 import (
    Tcgen05Pipe,
    Tmem,
    TmemAllocator,
    cp_32x128b_warpx4,
    decode_idesc,
    ld,
    ld_32x32b,
    make_taddr,
    mma_f16,
    mma_f16_pair,
    mma_f16_tmem_a,
    mma_mxf4nvf4,
    mma_mxf4nvf4_pair,
    st,
)


def tc_desc(start: int, lbo: int, sbo: int, swizzle_code: int) -> int:
    return (start >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (1 << 46) | (swizzle_code << 61)


def idesc_mxf4nvf4(m: int, n: int, *, neg_a=0, neg_b=0, sfa_id=0, sfb_id=0, ue8m0=0) -> int:
    return ((sfb_id << 4) | (1 << 7) | (1 << 10) | (neg_a << 13) | (neg_b << 14) | ((n >> 3) << 17)
            | (ue8m0 << 23) | ((m >> 7) << 27) | (sfa_id << 29))


def idesc_f16(m: int, n: int, bf16: bool) -> int:
    t = 1 if bf16 else 0
    return (1 << 4) | (t << 7) | (t << 10) | ((n >> 3) << 17) | ((m >> 4) << 24)


def store_rows_sw128(smem: np.ndarray, base: int, rows_bytes: np.ndarray) -> None:
    """Rows of <= 128 bytes, K-major with the 128B swizzle (ISA figure: unit j of row r at unit j ^ (r % 8))."""
    nrows, nbytes = rows_bytes.shape
    for r in range(nrows):
        row = base + (r // 8) * 1024 + (r % 8) * 128
        for j in range(nbytes // 16):
            a = row + 16 * (j ^ (r % 8))
            smem[a:a + 16] = rows_bytes[r, 16 * j:16 * j + 16]


def pack_e2m1(codes: np.ndarray) -> np.ndarray:
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def store_scales_blocked(smem: np.ndarray, base: int, sf: np.ndarray) -> None:
    """(rows <= 128, 4) scale codes into one 512-byte block: byte 16 (m % 32) + 4 (m // 32) + kb (cuBLAS)."""
    for m in range(sf.shape[0]):
        for kb in range(4):
            smem[base + 16 * (m % 32) + 4 * (m // 32) + kb] = sf[m, kb]


UE4M3_POW2 = np.array([0x30, 0x38, 0x40, 0x28, 0x20], dtype=np.uint8)  # 2**-1, 2**0, 2**1, 2**-2, 2**-3


@pytest.mark.parametrize("n", [16, 64, 128, 256])
def test_mma_mxf4nvf4_block16_matches_torch(n, seed):
    rng = np.random.default_rng(seed)
    a_codes = rng.integers(0, 16, size=(128, 64)).astype(np.uint8)
    b_codes = rng.integers(0, 16, size=(n, 64)).astype(np.uint8)
    sfa = rng.choice(UE4M3_POW2, size=(128, 4))
    sfb = rng.choice(UE4M3_POW2, size=(n, 4))
    smem = np.zeros(64 * 1024, dtype=np.uint8)
    a_base, b_base, sf_base = 1024, 1024 + 16 * 1024, 60 * 1024
    store_rows_sw128(smem, a_base, pack_e2m1(a_codes))
    store_rows_sw128(smem, b_base, pack_e2m1(b_codes))
    store_scales_blocked(smem, sf_base, sfa)
    for blk in range((n + 127) // 128):
        store_scales_blocked(smem, sf_base + 512 * (1 + blk), sfb[128 * blk:128 * blk + 128])

    tmem, alloc = Tmem(), TmemAllocator()
    base_col = alloc.alloc(512) & 0xFFFF
    d_col, sfa_col, sfb_col = base_col, base_col + 256, base_col + 264
    sf_desc = lambda addr: tc_desc(addr, 16, 128, 0)  # noqa: E731 -- 32 rows of 16 B, 8-row groups 128 B apart
    cp_32x128b_warpx4(tmem, smem, make_taddr(0, sfa_col), sf_desc(sf_base))
    for blk in range((n + 127) // 128):
        cp_32x128b_warpx4(tmem, smem, make_taddr(0, sfb_col + 4 * blk), sf_desc(sf_base + 512 * (1 + blk)))

    d0 = rng.integers(-64, 65, size=(128, n)).astype(np.float32)
    tmem.write(0, d_col, numerics.f32_bits(d0), "test")
    pipe = Tcgen05Pipe()
    arrived = []
    pipe.issue(lambda: mma_mxf4nvf4(tmem, smem, make_taddr(0, d_col), tc_desc(a_base, 16, 1024, 2),
                                    tc_desc(b_base, 16, 1024, 2), idesc_mxf4nvf4(128, n),
                                    make_taddr(0, sfa_col), make_taddr(0, sfb_col), True))
    assert tmem.cells[0, d_col] == numerics.f32_bits(d0)[0, 0]  # nothing ran before the commit
    pipe.commit(lambda: arrived.append(1))
    assert arrived == [1]

    e2m1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)
    sv = lambda c: torch.from_numpy(2.0 ** ((c.astype(np.float64) // 8) - 7))  # noqa: E731 -- pow2 ue4m3 only
    a_ref = e2m1[torch.from_numpy(a_codes).long()] * sv(sfa).repeat_interleave(16, dim=1)
    b_ref = e2m1[torch.from_numpy(b_codes).long()] * sv(sfb).repeat_interleave(16, dim=1)
    ref = (a_ref @ b_ref.T + torch.from_numpy(d0).double()).float().numpy()
    x = min(n, 128)  # .num is at most 128 registers: two loads for N = 256
    got = np.concatenate([np.concatenate([ld_32x32b(tmem, make_taddr(32 * w, d_col + c), w + 4, x)
                                          for c in range(0, n, x)], axis=1) for w in range(4)])
    np.testing.assert_array_equal(numerics.bits_f32(got), ref)


def test_mma_mxf4nvf4_overwrite_negate_and_data_id(seed):
    rng = np.random.default_rng(seed)
    n = 32
    a_codes = rng.integers(0, 16, size=(128, 64)).astype(np.uint8)
    b_codes = rng.integers(0, 16, size=(n, 64)).astype(np.uint8)
    smem = np.zeros(40 * 1024, dtype=np.uint8)
    store_rows_sw128(smem, 1024, pack_e2m1(a_codes))
    store_rows_sw128(smem, 20 * 1024, pack_e2m1(b_codes))
    tmem = Tmem()
    one = np.full(128 * 4, 0x38383838, dtype=np.uint32).reshape(128, 4)  # ue4m3 1.0 in every byte
    tmem.write(0, 300, one, "test")
    idesc = idesc_mxf4nvf4(128, n, neg_b=1)
    mma_mxf4nvf4(tmem, smem, make_taddr(0, 0), tc_desc(1024, 16, 1024, 2), tc_desc(20 * 1024, 16, 1024, 2),
                 idesc, make_taddr(0, 300), make_taddr(0, 300), False)  # no D input: poisoned D is fine
    e2m1 = numerics.E2M1
    ref = -(e2m1[a_codes] @ e2m1[b_codes].T)
    np.testing.assert_array_equal(numerics.bits_f32(tmem.cells[:, :n]), ref.astype(np.float32))
    with pytest.raises(IsaError, match="exceeds a 32-bit cell"):
        mma_mxf4nvf4(tmem, smem, 0, tc_desc(1024, 16, 1024, 2), tc_desc(20 * 1024, 16, 1024, 2),
                     idesc_mxf4nvf4(128, n, sfa_id=2), make_taddr(0, 300), make_taddr(0, 300), True)
    tmem.write(96, 300, np.zeros((1, 1), np.uint32), "test")
    with pytest.raises(IsaError, match="duplicated"):
        mma_mxf4nvf4(tmem, smem, 0, tc_desc(1024, 16, 1024, 2), tc_desc(20 * 1024, 16, 1024, 2), idesc,
                     make_taddr(0, 300), make_taddr(0, 300), True)


E2M1_F64 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)


def _scaled(codes: np.ndarray, sf: np.ndarray) -> torch.Tensor:
    """fp64 values of E2M1 codes times their ue4m3 power-of-two block scales (16 elements per scale)."""
    sv = torch.from_numpy(2.0 ** ((sf.astype(np.float64) // 8) - 7))
    return E2M1_F64[torch.from_numpy(codes).long()] * sv.repeat_interleave(16, dim=1)


def _run_pair(n: int, a_codes, b_codes, sfa, sfb_of_cta) -> np.ndarray:
    """One ``.cta_group::2`` M = 256 MMA: CTA c holds rows 128 c.. of A, rows (n / 2) c.. of B (128B-swizzled
    K-major), its SFA rows and the scale block(s) ``sfb_of_cta[c]`` (all N columns), copied into its own tensor
    memory with ``tcgen05.cp``; returns the (256, n) fp32 D of both CTAs."""
    a_base, b_base, sf_base = 1024, 1024 + 16 * 1024, 60 * 1024
    sf_desc = lambda addr: tc_desc(addr, 16, 128, 0)  # noqa: E731
    smems, tmems = [], []
    for c in range(2):
        smem = np.zeros(64 * 1024, dtype=np.uint8)
        store_rows_sw128(smem, a_base, pack_e2m1(a_codes[128 * c:128 * c + 128]))
        store_rows_sw128(smem, b_base, pack_e2m1(b_codes[n // 2 * c:n // 2 * (c + 1)]))
        store_scales_blocked(smem, sf_base, sfa[128 * c:128 * c + 128])
        for blk in range((n + 127) // 128):
            store_scales_blocked(smem, sf_base + 512 * (1 + blk), sfb_of_cta[c][128 * blk:128 * blk + 128])
        tmem = Tmem()
        cp_32x128b_warpx4(tmem, smem, make_taddr(0, 256), sf_desc(sf_base))
        for blk in range((n + 127) // 128):
            cp_32x128b_warpx4(tmem, smem, make_taddr(0, 264 + 4 * blk), sf_desc(sf_base + 512 * (1 + blk)))
        smems.append(smem)
        tmems.append(tmem)
    mma_mxf4nvf4_pair(tmems, smems, make_taddr(0, 0), tc_desc(a_base, 16, 1024, 2), tc_desc(b_base, 16, 1024, 2),
                      idesc_mxf4nvf4(256, n), make_taddr(0, 256), make_taddr(0, 264), False)
    with pytest.raises(IsaError, match="M = 128 is not modelled with cta_group::2"):
        mma_mxf4nvf4_pair(tmems, smems, 0, 0, 0, idesc_mxf4nvf4(128, n), 0, 0, False)
    return np.concatenate([numerics.bits_f32(t.read(0, 0, 128, n, "test")) for t in tmems])


@pytest.mark.parametrize("n", [64, 256])
def test_mma_mxf4nvf4_cta_pair_matches_torch(n, seed):
    """``.cta_group::2``, M = 256: each CTA holds 128 rows of A and N / 2 rows of B at the same descriptor
    addresses of its own shared memory; its tensor memory holds its SFA rows, the scales of all N columns of B,
    and receives its 128 rows of D (layout A: row m in CTA m // 128, lane m % 128)."""
    rng = np.random.default_rng(seed)
    a_codes = rng.integers(0, 16, size=(256, 64)).astype(np.uint8)
    b_codes = rng.integers(0, 16, size=(n, 64)).astype(np.uint8)
    sfa = rng.choice(UE4M3_POW2, size=(256, 4))
    sfb = rng.choice(UE4M3_POW2, size=(n, 4))
    got = _run_pair(n, a_codes, b_codes, sfa, (sfb, sfb))
    np.testing.assert_array_equal(got, (_scaled(a_codes, sfa) @ _scaled(b_codes, sfb).T).float().numpy())


@pytest.mark.parametrize("n", [64, 256])
def test_mma_mxf4nvf4_cta_pair_reads_sfb_from_each_cta(n, seed):
    """Where the B scale factors of a ``.cta_group::2`` MMA are read from, pinned down with the two CTAs holding
    *different* SFB at the scale-B address (nvgemm's kernel and CuTe multicast identical SFB, so they cannot
    tell). Three readings, all distinct on this data: (1) each CTA's rows of D use the SFB in its own tensor
    memory; (2) both use the leader's; (3) column n uses the SFB of the CTA holding that column of B. The emulator
    follows (1), the ISA reading (citations in :func:`nvgemm.emulator.isa.tcgen05.mma_mxf4nvf4_pair`). Fails
    when the pair reads the leader's SFB for both CTAs (checked by that mutation)."""
    rng = np.random.default_rng(seed)
    a_codes = rng.integers(0, 16, size=(256, 64)).astype(np.uint8)
    b_codes = rng.integers(0, 16, size=(n, 64)).astype(np.uint8)
    sfa = rng.choice(UE4M3_POW2, size=(256, 4))
    sfb0 = rng.choice(UE4M3_POW2, size=(n, 4))
    sfb1 = sfb0.copy()
    sfb1[:, 1] = np.where(sfb0[:, 1] == 0x38, 0x40, 0x38)  # every column's K-block-1 scale differs in the peer
    got = _run_pair(n, a_codes, b_codes, sfa, (sfb0, sfb1))
    a = _scaled(a_codes, sfa)
    b0, b1 = _scaled(b_codes, sfb0), _scaled(b_codes, sfb1)
    own = torch.cat([a[:128] @ b0.T, a[128:] @ b1.T]).float().numpy()
    leader = (a @ b0.T).float().numpy()
    by_b_half = (a @ torch.cat([b0[:n // 2], b1[n // 2:]]).T).float().numpy()
    assert not np.array_equal(own, leader) and not np.array_equal(own, by_b_half)
    np.testing.assert_array_equal(got, own)


@pytest.mark.parametrize("bf16", [True, False])
def test_mma_f16_matches_torch(bf16, seed):
    g = torch.Generator().manual_seed(seed)
    tdt = torch.bfloat16 if bf16 else torch.float16
    n = 64
    a = torch.randint(-8, 9, (128, 64), generator=g).to(tdt) * 0.5
    b = torch.randint(-8, 9, (n, 64), generator=g).to(tdt) * 0.25
    smem = np.zeros(48 * 1024, dtype=np.uint8)
    store_rows_sw128(smem, 1024, a.view(torch.int16).numpy().view(np.uint8).reshape(128, 128))
    store_rows_sw128(smem, 20 * 1024, b.view(torch.int16).numpy().view(np.uint8).reshape(n, 128))
    tmem = Tmem()
    for s in range(4):  # k-steps of 16: start + 32 s inside the 128B swizzle atom
        mma_f16(tmem, smem, make_taddr(0, 64), tc_desc(1024 + 32 * s, 16, 1024, 2),
                tc_desc(20 * 1024 + 32 * s, 16, 1024, 2), idesc_f16(128, n, bf16), s > 0)
    ref = (a.double() @ b.double().T).float().numpy()
    np.testing.assert_array_equal(numerics.bits_f32(tmem.read(0, 64, 128, n, "t")), ref)
    with pytest.raises(IsaError, match="nothing wrote"):
        mma_f16(tmem, smem, make_taddr(0, 200), tc_desc(1024, 16, 1024, 2), tc_desc(20 * 1024, 16, 1024, 2),
                idesc_f16(128, n, bf16), True)


@pytest.mark.parametrize("n", [32, 256])
def test_mma_f16_cta_pair_matches_torch(n, seed):
    """``.cta_group::2 .kind::f16``, M = 256, four K-steps of 16: CTA c holds rows 128 c.. of A and rows
    (n / 2) c.. of B at the same descriptor addresses and gets its 128 rows of D (NVIDIA's CuTeDSL tutorial
    fp16_gemm_1 issues this form). A non-zero 8-word disable-output-lane vector is refused, not guessed."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-8, 9, (256, 64), generator=g).to(torch.bfloat16) * 0.5
    b = torch.randint(-8, 9, (n, 64), generator=g).to(torch.bfloat16) * 0.25
    smems, tmems = [], []
    for c in range(2):
        smem = np.zeros(64 * 1024, dtype=np.uint8)
        rows = lambda t: t.view(torch.int16).numpy().view(np.uint8).reshape(t.shape[0], 128)  # noqa: E731
        store_rows_sw128(smem, 1024, rows(a[128 * c:128 * c + 128]))
        store_rows_sw128(smem, 20 * 1024, rows(b[n // 2 * c:n // 2 * (c + 1)]))
        smems.append(smem)
        tmems.append(Tmem())
    for s in range(4):
        mma_f16_pair(tmems, smems, make_taddr(0, 0), tc_desc(1024 + 32 * s, 16, 1024, 2),
                     tc_desc(20 * 1024 + 32 * s, 16, 1024, 2), idesc_f16(256, n, True), s > 0,
                     disable_output_lane=[0] * 8)
    got = np.concatenate([numerics.bits_f32(t.read(0, 0, 128, n, "t")) for t in tmems])
    np.testing.assert_array_equal(got, (a.double() @ b.double().T).float().numpy())
    with pytest.raises(IsaError, match="disable-output-lane"):
        mma_f16_pair(tmems, smems, 0, tc_desc(1024, 16, 1024, 2), tc_desc(20 * 1024, 16, 1024, 2),
                     idesc_f16(256, n, True), True, disable_output_lane=[0, 0, 0, 0, 1, 0, 0, 0])
    with pytest.raises(IsaError, match="M = 128 is not modelled"):
        mma_f16_pair(tmems, smems, 0, 0, 0, idesc_f16(128, n, True), True)


def test_idesc_decode_fields_and_rejections():
    d = decode_idesc("mxf4nvf4", idesc_mxf4nvf4(128, 200, neg_a=1, sfa_id=2, sfb_id=2))
    assert (d.m, d.n, d.k, d.negate_a, d.negate_b, d.sfa_id, d.sfb_id, d.scale_type) == (128, 200, 64, True, False,
                                                                                         2, 2, "ue4m3")
    assert decode_idesc("mxf4nvf4", idesc_mxf4nvf4(256, 128, ue8m0=1)).m == 256
    d = decode_idesc("f16", idesc_f16(64, 256, True) | (1 << 16))
    assert (d.m, d.n, d.atype, d.b_major) == (64, 256, "bf16", "mn")
    with pytest.raises(IsaError, match="sparse"):
        decode_idesc("mxf4nvf4", idesc_mxf4nvf4(128, 64) | 4)
    with pytest.raises(IsaError, match="transposed"):
        decode_idesc("mxf4nvf4", idesc_mxf4nvf4(128, 64) | (1 << 15))
    with pytest.raises(IsaError, match="E2M1"):
        decode_idesc("mxf4nvf4", idesc_mxf4nvf4(128, 64) ^ (1 << 7))
    with pytest.raises(IsaError, match="not modelled"):
        decode_idesc("tf32", 0)
    tmem = Tmem()
    with pytest.raises(IsaError, match="cta_group::2.*mma_mxf4nvf4_pair"):
        mma_mxf4nvf4(tmem, np.zeros(1024, np.uint8), 0, 0, 0, idesc_mxf4nvf4(256, 128), 0, 0, False, cta_group=2)
    with pytest.raises(IsaError, match="M = 256"):
        mma_mxf4nvf4(tmem, np.zeros(1024, np.uint8), 0, 0, 0, idesc_mxf4nvf4(256, 128), 0, 0, False)


def test_tmem_allocator():
    al = TmemAllocator("CTA (1,0,0)")
    assert al.alloc(256) == 0 and al.alloc(128) == 256 and al.alloc(64) == 384
    assert al.alloc(256) is None
    with pytest.raises(IsaError, match="power of 2"):
        al.alloc(48)
    with pytest.raises(IsaError, match="does not match"):
        al.dealloc(256, 64)
    al.dealloc(256, 128)
    assert al.alloc(128) == 256
    al.relinquish_alloc_permit()
    with pytest.raises(IsaError, match="relinquish"):
        al.alloc(32)
    with pytest.raises(IsaError, match="CTA \\(1,0,0\\) exits with tensor memory still allocated"):
        al.check_exit()
    for c, nc in [(0, 256), (256, 128), (384, 64)]:
        al.dealloc(c, nc)
    al.check_exit()


def test_ld_lane_partitions_and_shapes():
    tmem = Tmem()
    vals = np.arange(128 * 8, dtype=np.uint32).reshape(128, 8)
    tmem.write(0, 16, vals, "test")
    np.testing.assert_array_equal(ld_32x32b(tmem, make_taddr(64, 16), 6, 8), vals[64:96])
    with pytest.raises(IsaError, match="outside its lanes 32..63"):
        ld_32x32b(tmem, make_taddr(0, 16), 1, 8)
    with pytest.raises(IsaError, match="power of 2"):
        ld_32x32b(tmem, make_taddr(0, 16), 0, 3)
    with pytest.raises(IsaError, match="lane 0, column 24 that nothing wrote"):
        ld_32x32b(tmem, make_taddr(0, 16), 0, 16)


def test_mma_f16_disable_output_lane(seed):
    g = torch.Generator().manual_seed(seed)
    n = 16
    a = torch.randint(-8, 9, (128, 64), generator=g).to(torch.bfloat16)
    b = torch.randint(-8, 9, (n, 64), generator=g).to(torch.bfloat16)
    smem = np.zeros(40 * 1024, dtype=np.uint8)
    store_rows_sw128(smem, 1024, a.view(torch.int16).numpy().view(np.uint8).reshape(128, 128))
    store_rows_sw128(smem, 20 * 1024, b.view(torch.int16).numpy().view(np.uint8).reshape(n, 128))
    tmem = Tmem()
    old = np.full((128, n), 7.0, dtype=np.float32)
    tmem.write(0, 0, numerics.f32_bits(old), "test")
    mask = np.array([0x80000001, 0, 0, 0xFFFFFFFF], dtype=np.uint32)  # lanes 0, 31 and 96..127 disabled
    mma_f16(tmem, smem, make_taddr(0, 0), tc_desc(1024, 16, 1024, 2), tc_desc(20 * 1024, 16, 1024, 2),
            idesc_f16(128, n, True), False, disable_output_lane=mask)
    ref = (a.double()[:, :16] @ b.double()[:, :16].T).float().numpy()
    off = np.zeros(128, bool)
    off[[0, 31]] = True
    off[96:] = True
    ref[off] = 7.0
    np.testing.assert_array_equal(numerics.bits_f32(tmem.cells[:, :n]), ref)


@pytest.mark.parametrize("n", [64, 256])
def test_mma_f16_cta_pair_matches_torch(n, seed):
    """``.cta_group::2.kind::f16``, M = 256 (NVIDIA's Blackwell dense_gemm example with 2-CTA MMA needs it): each CTA
    holds 128 rows of A and N / 2 rows of B at the same descriptor addresses of its own shared memory and receives
    its 128 rows of D (layout A: row m in CTA m // 128, lane m % 128); four k-steps of 16 inside the swizzle atom."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-8, 9, (256, 64), generator=g).to(torch.bfloat16) * 0.5
    b = torch.randint(-8, 9, (n, 64), generator=g).to(torch.bfloat16) * 0.25
    smems, tmems = [], []
    for c in range(2):
        smem = np.zeros(96 * 1024, dtype=np.uint8)
        store_rows_sw128(smem, 1024, a[128 * c:128 * c + 128].view(torch.int16).numpy().view(np.uint8).reshape(128, 128))
        half = b[n // 2 * c:n // 2 * (c + 1)]
        store_rows_sw128(smem, 40 * 1024, half.view(torch.int16).numpy().view(np.uint8).reshape(n // 2, 128))
        smems.append(smem)
        tmems.append(Tmem())
    for s in range(4):
        mma_f16_pair(tmems, smems, make_taddr(0, 32), tc_desc(1024 + 32 * s, 16, 1024, 2),
                     tc_desc(40 * 1024 + 32 * s, 16, 1024, 2), idesc_f16(256, n, True), s > 0)
    ref = (a.double() @ b.double().T).float().numpy()
    got = np.concatenate([numerics.bits_f32(t.read(0, 32, 128, n, "test")) for t in tmems])
    np.testing.assert_array_equal(got, ref)
    with pytest.raises(IsaError, match="M = 128 is not modelled with cta_group::2"):
        mma_f16_pair(tmems, smems, 0, 0, 0, idesc_f16(128, n, True), False)


@pytest.mark.parametrize("lane0", [0, 16])
def test_st_ld_16x32bx2_fragment(lane0):
    """PTX ISA 9.7.16.2.3 (shape .16x32bx2, the immHalfSplitoff operand): two 16x32b accesses, threads 0-15 at
    (lane(taddr) + t, column(taddr) + i), threads 16-31 at (lane(taddr) + t - 16, column(taddr) + off + i), in
    the issuing warp's 32-lane partition; checked cell by cell, and .32x32b reads back the same cells."""
    rng = np.random.default_rng(lane0)
    warp, num, off, col = 6, 8, 40, 100  # warp 6: lanes 64..95
    vals = rng.integers(0, 2**32, size=(32, num), dtype=np.uint32)
    tmem = Tmem()
    st(tmem, "16x32bx2", make_taddr(64 + lane0, col), warp, vals, off)
    for t in range(32):
        for i in range(num):
            lane, c = 64 + lane0 + t % 16, col + i + (off if t >= 16 else 0)
            assert tmem.cells[lane, c] == vals[t, i] and tmem.written[lane, c]
    assert tmem.written.sum() == 32 * num  # nothing else written
    np.testing.assert_array_equal(ld(tmem, "16x32bx2", make_taddr(64 + lane0, col), warp, num, off), vals)
    other = np.zeros((128, 64), np.uint32)
    tmem.write(0, 200, other, "test")
    st(tmem, "32x32b", make_taddr(64, 200), warp, vals)  # .32x32b: thread t at lane 64 + t, column 200 + i
    np.testing.assert_array_equal(tmem.cells[64:96, 200:200 + num], vals)
    with pytest.raises(IsaError, match="overlap"):
        st(tmem, "16x32bx2", make_taddr(64, col), warp, vals, num - 1)
    with pytest.raises(IsaError, match="outside its lanes 64..95"):
        ld(tmem, "16x32bx2", make_taddr(64 + 17, col), warp, num, off)  # lanes 81..96 leave the partition
    with pytest.raises(IsaError, match="immHalfSplitoff"):
        ld(tmem, "16x32bx2", make_taddr(64, col), warp, num)
    with pytest.raises(IsaError, match="nothing wrote"):
        ld(tmem, "16x32bx2", make_taddr(64 + lane0, col), warp, num, off + 8)
    with pytest.raises(IsaError, match="not modelled"):
        ld(tmem, "16x64b", make_taddr(64, col), warp, num)


def _store_a_tmem(tmem: Tmem, a: torch.Tensor, lanes, col: int) -> None:
    """A (M x K, 16-bit) into tensor memory as the ISA packs it: row m at ``lanes[m]``, elements 2j / 2j+1 in the
    low / high half of column ``col + j``."""
    codes = a.view(torch.int16).numpy().view(np.uint16).astype(np.uint32)
    for m, lane in enumerate(lanes):
        tmem.write(int(lane), col, (codes[m, 0::2] | (codes[m, 1::2] << 16))[None, :], "test")


@pytest.mark.parametrize("m,align", [(64, 0), (64, 16), (128, 0)])
def test_mma_f16_a_in_tensor_memory(m, align, seed):
    """``tcgen05.mma.cta_group::1.kind::f16 [d], [a-tmem], b-desc, ...``, four K-steps of 16 (A advanced by 8
    columns each): M = 64 is layout F of 9.7.16.10.5 (row r at lane align + 32 (r // 16) + r % 16, align 0 or 16,
    the same for A and D), M = 128 layout D (row r at lane r); D vs torch float64 on exact data; the other lanes
    of a layout-F tile are left untouched."""
    g = torch.Generator().manual_seed(seed)
    n = 32
    a = torch.randint(-8, 9, (m, 64), generator=g).to(torch.bfloat16) * 0.5
    b = torch.randint(-8, 9, (n, 64), generator=g).to(torch.bfloat16) * 0.25
    r = np.arange(m)
    lanes = r if m == 128 else align + 32 * (r // 16) + r % 16
    smem = np.zeros(24 * 1024, dtype=np.uint8)
    store_rows_sw128(smem, 1024, b.view(torch.int16).numpy().view(np.uint8).reshape(n, 128))
    tmem = Tmem()
    _store_a_tmem(tmem, a, lanes, 256)
    for s in range(4):
        mma_f16_tmem_a(tmem, smem, make_taddr(align, 64), make_taddr(align, 256 + 8 * s),
                       tc_desc(1024 + 32 * s, 16, 1024, 2), idesc_f16(m, n, True), s > 0)
    ref = (a.double() @ b.double().T).float().numpy()
    got = np.stack([numerics.bits_f32(tmem.read(int(lane), 64, 1, n, "t"))[0] for lane in lanes])
    np.testing.assert_array_equal(got, ref)
    assert tmem.written[:, 64:64 + n].sum() == m * n  # D only in its rows' lanes
    if m == 64:
        with pytest.raises(IsaError, match="same tensor memory lane alignment"):
            mma_f16_tmem_a(tmem, smem, make_taddr(align, 64), make_taddr(16 - align, 256), tc_desc(1024, 16, 1024, 2),
                           idesc_f16(m, n, True), True)
        with pytest.raises(IsaError, match="lane alignment 0 or 16"):
            mma_f16_tmem_a(tmem, smem, make_taddr(8, 64), make_taddr(8, 256), tc_desc(1024, 16, 1024, 2),
                           idesc_f16(m, n, True), True)
    with pytest.raises(IsaError, match="transpose-A"):
        mma_f16_tmem_a(tmem, smem, make_taddr(align, 64), make_taddr(align, 256), tc_desc(1024, 16, 1024, 2),
                       idesc_f16(m, n, True) | (1 << 15), True)


def test_mma_f16_m64_smem_a_layout_f(seed):
    """M = 64 with A from shared memory writes D in layout F too (lanes 0-15, 32-47, 64-79, 96-111 for
    alignment 0); the lanes between stay unwritten."""
    g = torch.Generator().manual_seed(seed)
    n = 16
    a = torch.randint(-8, 9, (64, 64), generator=g).to(torch.bfloat16)
    b = torch.randint(-8, 9, (n, 64), generator=g).to(torch.bfloat16)
    smem = np.zeros(40 * 1024, dtype=np.uint8)
    store_rows_sw128(smem, 1024, a.view(torch.int16).numpy().view(np.uint8).reshape(64, 128))
    store_rows_sw128(smem, 20 * 1024, b.view(torch.int16).numpy().view(np.uint8).reshape(n, 128))
    tmem = Tmem()
    for s in range(4):
        mma_f16(tmem, smem, make_taddr(0, 0), tc_desc(1024 + 32 * s, 16, 1024, 2),
                tc_desc(20 * 1024 + 32 * s, 16, 1024, 2), idesc_f16(64, n, True), s > 0)
    ref = (a.double() @ b.double().T).float().numpy()
    for q in range(4):
        np.testing.assert_array_equal(numerics.bits_f32(tmem.read(32 * q, 0, 16, n, "t")), ref[16 * q:16 * q + 16])
        assert not tmem.written[32 * q + 16:32 * q + 32].any()
