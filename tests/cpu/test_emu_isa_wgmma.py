"""The emulator's wgmma semantics (nvgemm.emulator.isa): descriptors, swizzles, fragments, mma_async, groups.

References are written here from the PTX ISA's own definitions, independently of the implementation:
CuTe's ``Swizzle<B, M, S>`` functor (the ISA cites it), the ISA's worked "exact layout" examples evaluated
with a small CuTe-layout evaluator, the 128B swizzle described as "16-byte unit j of row r of a 1024-byte
atom is stored at unit j ^ (r % 8)", and torch float64 matmuls on data whose sums are exact.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nvgemm.emulator.isa import numerics
from nvgemm.emulator.isa.errors import IsaError
from nvgemm.emulator.isa.smem_desc import (
    decode_tcgen05_desc,
    decode_wgmma_desc,
    operand_addresses,
    read_operand,
    swizzle,
)
from nvgemm.emulator.isa.wgmma import (
    WgmmaGroups,
    WgmmaShape,
    a_fragment_coords,
    a_to_registers,
    d_fragment_coords,
    d_from_registers,
    d_to_registers,
    mma_async,
)


# -- references ------------------------------------------------------------------------------------------
def cute_swizzle(offset: int, b: int, m: int, s: int) -> int:
    """CuTe's Swizzle<B, M, S> (cute/swizzle.hpp, cited by the ISA): offset ^ ((offset & yyy_msk) >> S)."""
    yyy = ((1 << b) - 1) << (m + s)
    return offset ^ ((offset & yyy) >> s)


def cute_layout_offset(shape, stride, coord_flat: int) -> int:
    """Offset of a flat (colexicographic) coordinate in a (nested) CuTe layout."""
    def flat(t):
        return [x for e in t for x in flat(e)] if isinstance(t, tuple) else [t]
    off = 0
    for n, d in zip(flat(shape), flat(stride)):
        off += (coord_flat % n) * d
        coord_flat //= n
    return off


def mode_size(shape) -> int:
    return int(np.prod([mode_size(e) for e in shape])) if isinstance(shape, tuple) else shape


def wgmma_desc(start: int, lbo: int, sbo: int, swizzle_bytes: int) -> int:
    code = {0: 0, 128: 1, 64: 2, 32: 3}[swizzle_bytes]
    return (start >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (code << 62)


def store_kmajor_sw128(smem: np.ndarray, base: int, mat: np.ndarray) -> None:
    """Store a (R, 64) 16-bit matrix K-major with the 128B swizzle, as the ISA figure draws it: row r of
    1024-byte atom r // 8 is 128 bytes at (r % 8) * 128, and its 16-byte unit j sits at unit j ^ (r % 8)."""
    rows, k = mat.shape
    assert k == 64 and base % 1024 == 0
    raw = mat.astype(np.uint16).view(np.uint8).reshape(rows, 8, 16)
    for r in range(rows):
        row_addr = base + (r // 8) * 1024 + (r % 8) * 128
        for j in range(8):
            a = row_addr + 16 * (j ^ (r % 8))
            smem[a:a + 16] = raw[r, j]


def bf16_codes(x: torch.Tensor) -> np.ndarray:
    return x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


# -- swizzle and descriptors -----------------------------------------------------------------------------
@pytest.mark.parametrize("width,b", [(32, 1), (64, 2), (128, 3)])
def test_swizzle_is_cute_swizzle_b43_on_bytes(width, b):
    addr = np.arange(0, 8192)
    ref = np.array([cute_swizzle(int(a), b, 4, 3) for a in addr])
    np.testing.assert_array_equal(swizzle(addr, width), ref)
    np.testing.assert_array_equal(swizzle(addr, 0), addr)


def test_swizzle_128b_is_unit_xor_row_within_1024_byte_atoms():
    addr = np.arange(3 * 1024)
    atom, row, unit, byte = addr // 1024, (addr % 1024) // 128, (addr % 128) // 16, addr % 16
    np.testing.assert_array_equal(swizzle(addr, 128), atom * 1024 + row * 128 + (unit ^ row) * 16 + byte)


ISA_EXAMPLES = [
    # (major, swizzle, elem bits, exact layout shape, stride (elements), LBO, SBO (elements)) -- ISA 9.7.15.5.1.2.1.3
    ("k", 0, 32, ((8, 2), (4, 4)), ((4, 32), (1, 64)), 64, 32),
    ("mn", 0, 16, ((8, 1, 2), (8, 2)), ((1, 8, 64), (8, 128)), 128, 64),
    ("mn", 32, 16, ((8, 2, 2), (8, 2)), ((1, 8, 128), (16, 256)), 128, 256),
    ("mn", 64, 16, ((8, 4, 2), (8, 2)), ((1, 8, 256), (32, 512)), 256, 512),
]


@pytest.mark.parametrize("major,sw,bits,shape,stride,lbo,sbo", ISA_EXAMPLES)
def test_operand_addresses_match_isa_exact_layout_examples(major, sw, bits, shape, stride, lbo, sbo):
    eb = bits // 8
    base = 4096
    desc = decode_wgmma_desc(wgmma_desc(base, lbo * eb, sbo * eb, sw))
    rows, cols = mode_size(shape[0]), mode_size(shape[1])
    if major == "k":
        mn, k = rows, cols
    else:  # the ISA writes MN-major examples as (MN, K) too
        mn, k = rows, cols
    addr, bit = operand_addresses(desc, mn, k, bits, major)
    b = {0: 0, 32: 1, 64: 2, 128: 3}[sw]
    for i in range(mn):
        for kk in range(k):
            el = cute_layout_offset(shape[0], stride[0], i) + cute_layout_offset(shape[1], stride[1], kk)
            assert addr[i, kk] == cute_swizzle(base + el * eb, b, 4, 3), (i, kk)
    assert not bit.any()


@pytest.mark.parametrize("rows", [64, 128])
def test_sw128_kmajor_kstep_advances_start_by_32_bytes_inside_the_atom(rows, seed):
    rng = np.random.default_rng(seed)
    mat = rng.integers(0, 1 << 16, size=(rows, 64)).astype(np.uint16)
    smem = np.zeros(3 * 1024 + rows * 128, dtype=np.uint8)
    base = 2048  # 1024-aligned but not 0: the swizzle reads absolute address bits
    store_kmajor_sw128(smem, base, mat)
    for s in range(4):
        desc = decode_wgmma_desc(wgmma_desc(base + 32 * s, 16, 1024, 128))
        got = read_operand(smem, desc, rows, 16, 16, "k")
        np.testing.assert_array_equal(got, mat[:, 16 * s:16 * s + 16])


def test_read_operand_window_base_and_bounds():
    smem = np.arange(2048, dtype=np.uint32).astype(np.uint8)
    desc = decode_wgmma_desc(wgmma_desc(0x400, 16, 1024, 128))
    got = read_operand(smem, desc, 8, 16, 16, "k", window_base=0x400)
    ref = read_operand(np.concatenate([np.zeros(0x400, np.uint8), smem]), desc, 8, 16, 16, "k")
    np.testing.assert_array_equal(got, ref)
    with pytest.raises(IsaError, match="outside"):
        read_operand(smem[:512], desc, 64, 16, 16, "k", window_base=0x400)


def test_4bit_kmajor_nibbles_low_first():
    # 8 rows x 64 e2m1 (32 bytes per row) with the 128B swizzle; byte b of row r holds elements 2b (low), 2b+1
    smem = np.zeros(2048, dtype=np.uint8)
    codes = (np.arange(8 * 64).reshape(8, 64) * 7 % 16).astype(np.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    for r in range(8):
        for j in range(2):
            a = 1024 + r * 128 + 16 * (j ^ r)
            smem[a:a + 16] = packed[r, 16 * j:16 * j + 16]
    tc = (1024 >> 4) | (1 << 16) | ((1024 >> 4) << 32) | (1 << 46) | (2 << 61)
    got = read_operand(smem, decode_tcgen05_desc(tc), 8, 64, 4, "k")
    np.testing.assert_array_equal(got, codes)


def test_nvgemm_wgmma_constant_decodes_to_sw128_kmajor():
    from nvgemm.templates.sm90_w4a16.common import WGMMA_DESC_SW128_KMAJOR

    d = decode_wgmma_desc(WGMMA_DESC_SW128_KMAJOR | (0x2400 >> 4))
    assert (d.start, d.lbo, d.sbo, d.swizzle, d.base_offset) == (0x2400, 16, 1024, 128, 0)


def test_descriptor_fields_and_rejections():
    d = decode_wgmma_desc(wgmma_desc(0x3FFF0, 0x100, 0x2000, 64))
    assert (d.start, d.lbo, d.sbo, d.swizzle) == (0x3FFF0, 0x100, 0x2000, 64)
    with pytest.raises(IsaError, match="reserved bits 46-48"):
        decode_wgmma_desc(wgmma_desc(0, 16, 1024, 128) | (1 << 46))
    with pytest.raises(IsaError, match="base offset 3"):
        decode_wgmma_desc(wgmma_desc(0, 16, 1024, 128) | (3 << 49))
    ok = (1 << 46) | (2 << 61)
    assert decode_tcgen05_desc(ok | (0x40 << 32)).swizzle == 128
    assert decode_tcgen05_desc((1 << 46) | (6 << 61)).swizzle == 32
    with pytest.raises(IsaError, match="bits 46-48"):
        decode_tcgen05_desc(2 << 61)
    for bad in (3, 5, 7):
        with pytest.raises(IsaError, match="invalid"):
            decode_tcgen05_desc((1 << 46) | (bad << 61))
    with pytest.raises(IsaError, match="32B atoms"):
        decode_tcgen05_desc((1 << 46) | (1 << 61))
    with pytest.raises(IsaError, match="absolute"):
        decode_tcgen05_desc(ok | (1 << 52))


# -- fragments ---------------------------------------------------------------------------------------------
def test_fragments_cover_their_tiles_once():
    r, c = a_fragment_coords()
    assert sorted(zip(r.ravel(), c.ravel())) == [(i, j) for i in range(64) for j in range(16)]
    for n in (8, 32, 128, 256):
        r, c = d_fragment_coords(n)
        assert sorted(zip(r.ravel(), c.ravel())) == [(i, j) for i in range(64) for j in range(n)]


def test_fragment_spot_values_from_isa_figures():
    r, c = a_fragment_coords()
    # thread 37 = warp 1, lane 5: g = 1, q = 1; a0/a1 -> (17, 2/3), a2/a3 -> (25, 2/3), a4 -> (17, 10), a7 -> (25, 11)
    assert [(r[37, j], c[37, j]) for j in (0, 1, 2, 3, 4, 7)] == [(17, 2), (17, 3), (25, 2), (25, 3), (17, 10),
                                                                  (25, 11)]
    r, c = d_fragment_coords(32)
    # thread 127 = warp 3, lane 31: g = 7, q = 3; d0 (55, 6), d3 (63, 7), d4 (55, 14), d15 (63, 31)
    assert [(r[127, i], c[127, i]) for i in (0, 3, 4, 15)] == [(55, 6), (63, 7), (55, 14), (63, 31)]


# -- mma_async --------------------------------------------------------------------------------------------
def _setup(n, seed, dtype="bf16"):
    g = torch.Generator().manual_seed(seed)
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float16
    a = torch.randint(-8, 9, (64, 16), generator=g).to(tdt) * 0.25
    b = torch.randint(-8, 9, (n, 64), generator=g).to(tdt) * 0.5
    d = torch.randint(-64, 65, (64, n), generator=g).float()
    smem = np.zeros(1024 + 1024 * (n // 8), dtype=np.uint8)
    store_kmajor_sw128(smem, 1024, b.view(torch.int16).numpy().view(np.uint16))
    return a, b, d, smem, tdt


@pytest.mark.parametrize("n", [8, 32, 128, 256])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_mma_async_register_a_matches_torch(n, dtype, seed):
    a, b, d, smem, tdt = _setup(n, seed, dtype)
    shape = WgmmaShape.parse(f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dtype}.{dtype}")
    a_regs = a_to_registers(a.view(torch.int16).numpy().view(np.uint16))
    for s in range(4):  # the four 16-deep k-steps of one 64-deep swizzle atom: start + 32 s
        desc = wgmma_desc(1024 + 32 * s, 16, 1024, 128)
        out = mma_async(shape, d_to_registers(d.numpy()), a_regs, desc, smem, scale_d=True)
        ref = a.double() @ b[:, 16 * s:16 * s + 16].double().T + d.double()
        np.testing.assert_array_equal(d_from_registers(out, n), ref.float().numpy())


def test_mma_async_scale_d_negation_and_transposed_b(seed):
    n = 32
    a, b, d, smem, _ = _setup(n, seed)
    shape = WgmmaShape.parse(f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16")
    a_regs = a_to_registers(bf16_codes(a))
    out = mma_async(shape, d_to_registers(d.numpy()), a_regs, wgmma_desc(1024, 16, 1024, 128), smem,
                    scale_d=False, imm_scale_a=-1)
    np.testing.assert_array_equal(d_from_registers(out, n), (-(a.double() @ b[:, :16].double().T)).float().numpy())
    # N-major B (imm-trans-b = 1), 128B swizzle: ((T,8,m),(8,k)) : ((1,T,LBO),(8T,SBO)), T = 8 bf16
    bt = b[:, :16]  # (N, K) logical
    smem2 = np.zeros(8192, dtype=np.uint8)
    codes = bf16_codes(bt)
    lbo, sbo = 2048, 1024  # 64 N-elements per 128-byte row; the next 64 N at LBO, the next 8 K at SBO
    shape_mn, stride_mn = ((8, 8, 1), (8, 2)), ((1, 8, lbo // 2), (64, sbo // 2))
    for i in range(n):
        for k in range(16):
            el = cute_layout_offset(shape_mn[0], stride_mn[0], i) + cute_layout_offset(shape_mn[1], stride_mn[1], k)
            a_ = cute_swizzle(2048 + 2 * el, 3, 4, 3)
            smem2[a_:a_ + 2] = np.array([codes[i, k]], dtype=np.uint16).view(np.uint8)
    out = mma_async(shape, d_to_registers(d.numpy()), a_regs, wgmma_desc(2048, lbo, sbo, 128), smem2,
                    scale_d=True, imm_trans_b=1, imm_scale_b=-1)
    ref = -(a.double() @ bt.double().T) + d.double()
    np.testing.assert_array_equal(d_from_registers(out, n), ref.float().numpy())


def test_mma_async_shared_a_descriptor(seed):
    n = 16
    a, b, d, smem, _ = _setup(n, seed)
    big = np.zeros(16384, dtype=np.uint8)
    big[:smem.size] = smem
    a64 = torch.zeros(64, 64, dtype=torch.bfloat16)
    a64[:, 16:32] = a
    store_kmajor_sw128(big, 8192, bf16_codes(a64))
    shape = WgmmaShape.parse(f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16")
    out = mma_async(shape, d_to_registers(d.numpy()), wgmma_desc(8192 + 32, 16, 1024, 128),
                    wgmma_desc(1024 + 32, 16, 1024, 128), big, scale_d=True)
    ref = a.double() @ b[:, 16:32].double().T + d.double()
    np.testing.assert_array_equal(d_from_registers(out, n), ref.float().numpy())


def test_dot_f32_rounds_once_to_nearest_even():
    # 1 + 2**-24 + 2**-24: exact sum 1 + 2**-23 (representable); summing into fp32 step by step would give 1.0
    a = np.array([[1.0, 2.0 ** -24, 2.0 ** -24]])
    b = np.ones((1, 3))
    assert numerics.dot_f32(a, b, None)[0, 0] == np.float32(1 + 2.0 ** -23)
    # a tie rounds to even: 1 + 2**-24 -> 1.0
    assert numerics.dot_f32(np.array([[1.0, 2.0 ** -24]]), np.ones((1, 2)), None)[0, 0] == np.float32(1.0)


def test_shape_parse_rejects_unmodelled_forms():
    with pytest.raises(IsaError, match="multiple of 8"):
        WgmmaShape.parse("wgmma.mma_async.sync.aligned.m64n12k16.f32.bf16.bf16")
    with pytest.raises(IsaError, match="not modelled"):
        WgmmaShape.parse("wgmma.mma_async.sync.aligned.m64n32k16.f32.e4m3.e4m3")  # 8-bit inputs are K = 32
    with pytest.raises(IsaError, match="not modelled"):
        WgmmaShape.parse("wgmma.mma_async.sync.aligned.m64n32k16.f16.f16.f16")


# -- async groups -----------------------------------------------------------------------------------------
def test_groups_defer_until_wait_and_read_smem_then(seed):
    n = 8
    a, b, d, smem, _ = _setup(n, seed)
    shape = WgmmaShape.parse("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16")
    regs = {"d": d_to_registers(d.numpy()), "a": a_to_registers(bf16_codes(a))}
    grp = WgmmaGroups()
    with pytest.raises(IsaError, match="before any wgmma.fence"):
        grp.issue(["d"], ["a"], lambda read: None)
    grp.fence()

    def op(read):
        return [mma_async(shape, read("d"), read("a"), wgmma_desc(1024, 16, 1024, 128), smem, scale_d=True)]

    grp.issue(["d"], ["a"], op)
    grp.commit_group()
    grp.issue(["d"], ["a"], op)  # chained on the same accumulator: must see the first result
    grp.commit_group()
    assert grp.pending_registers() == {"d", "a"}
    smem_b_before = smem.copy()
    smem[1024:1024 + 16] = 0  # overwrite part of B before the wait: the deferred run reads the new bytes
    assert grp.wait_group(1, regs.__getitem__).keys() == {"d"}
    b_now = torch.from_numpy(read_operand(smem, decode_wgmma_desc(wgmma_desc(1024, 16, 1024, 128)), n, 16, 16,
                                          "k").view(np.int16)).view(torch.bfloat16)
    assert not np.array_equal(smem, smem_b_before)
    out1 = grp.wait_group(0, lambda k: regs[k] if k != "d" else d_to_registers(d.numpy()))
    ref = a.double() @ b_now.double().T + d.double()
    np.testing.assert_array_equal(d_from_registers(out1["d"], n), ref.float().numpy())
    assert not grp.pending_registers()


def test_groups_chain_within_one_group_and_fence_rule():
    grp = WgmmaGroups()
    grp.fence()
    grp.issue(["d"], [], lambda read: [read("d") + 1])
    grp.issue(["d"], [], lambda read: [read("d") * 10])
    grp.commit_group()
    grp.commit_group()  # an empty group
    assert grp.wait_group(1, {"d": 1}.__getitem__) == {"d": 20}
    assert grp.wait_group(0, {"d": 1}.__getitem__) == {}
    grp.registers_written(["d"])
    with pytest.raises(IsaError, match="since the last wgmma.fence"):
        grp.issue(["d"], [], lambda read: [read("d")])
    grp.fence()
    grp.issue(["d"], [], lambda read: [read("d")])
    with pytest.raises(IsaError, match="non-negative"):
        grp.wait_group(-1, {}.__getitem__)


def test_mma_async_m_major_a_descriptor(seed):
    """imm-trans-a = 1: A (64 x 16) M-major in shared memory with the 64B swizzle, ((T,4,m),(8,k)) :
    ((1,T,LBO),(4T,SBO)) per the ISA's canonical table, stored element by element through CuTe's Swizzle<2,4,3>."""
    n = 8
    a, b, d, smem, _ = _setup(n, seed)
    codes = bf16_codes(a)  # (M, K)
    big = np.zeros(16384, dtype=np.uint8)
    big[:smem.size] = smem
    base, lbo, sbo = 8192, 512, 1024  # the next 32 M at LBO, the next 8 K at SBO
    shape, stride = ((8, 4, 2), (8, 2)), ((1, 8, lbo // 2), (32, sbo // 2))
    for i in range(64):
        for k in range(16):
            el = cute_layout_offset(shape[0], stride[0], i) + cute_layout_offset(shape[1], stride[1], k)
            addr = cute_swizzle(base + 2 * el, 2, 4, 3)
            big[addr:addr + 2] = np.array([codes[i, k]], dtype=np.uint16).view(np.uint8)
    shape_ = WgmmaShape.parse(f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16")
    out = mma_async(shape_, d_to_registers(d.numpy()), wgmma_desc(base, lbo, sbo, 64), wgmma_desc(1024, 16, 1024, 128),
                    big, scale_d=True, imm_trans_a=1)
    ref = a.double() @ b[:, :16].double().T + d.double()
    np.testing.assert_array_equal(d_from_registers(out, n), ref.float().numpy())


@pytest.mark.parametrize("n", [16, 128])
def test_mma_async_fp8_descriptors_match_torch(n, seed):
    """``m64nNk32`` with e4m3 A and e5m2 B (NVIDIA's Hopper FP8 dense_gemm example needed it): both K-major from
    128B-swizzled shared memory (128 one-byte elements per row, four k-steps of 32 at start + 32 s); values from
    torch's own float8 types."""
    g = torch.Generator().manual_seed(seed)
    a = (torch.randint(-8, 9, (64, 128), generator=g) * 0.25).to(torch.float8_e4m3fn)
    b = (torch.randint(-8, 9, (n, 128), generator=g) * 0.5).to(torch.float8_e5m2)
    d = torch.randint(-64, 65, (64, n), generator=g).float()
    smem = np.zeros(2048 + 1024 * 8 + 1024 * (n // 8), dtype=np.uint8)
    for base, mat in ((1024, a), (1024 + 8 * 1024, b)):
        raw = mat.view(torch.uint8).numpy()
        for r in range(raw.shape[0]):
            row = base + (r // 8) * 1024 + (r % 8) * 128
            for j in range(8):
                smem[row + 16 * (j ^ (r % 8)):row + 16 * (j ^ (r % 8)) + 16] = raw[r, 16 * j:16 * j + 16]
    shape = WgmmaShape.parse(f"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e5m2")
    regs = d_to_registers(d.numpy())
    for s in range(4):
        regs = mma_async(shape, regs, wgmma_desc(1024 + 32 * s, 16, 1024, 128),
                         wgmma_desc(1024 + 8 * 1024 + 32 * s, 16, 1024, 128), smem, scale_d=True)
    ref = a.double() @ b.double().T + d.double()
    np.testing.assert_array_equal(d_from_registers(regs, n), ref.float().numpy())
    with pytest.raises(IsaError, match="only K-major"):
        mma_async(shape, regs, wgmma_desc(1024, 16, 1024, 128), wgmma_desc(1024, 16, 1024, 128), smem, scale_d=True,
                  imm_trans_b=1)
