"""The emulator's TMA semantics (nvgemm.emulator.isa.tma): tensor maps captured from CuTeDSL-built launches
(the experiment of the module docstring; 64-byte prefixes with the tensors they describe) decode to those
tensors, and box loads / stores match torch slicing with zero fill, with the 128B swizzle checked against the
ISA figure's "16-byte unit j of row r at unit j ^ (r % 8)"."""

from __future__ import annotations

import numpy as np
import pytest

from nvgemm.emulator.isa.errors import IsaError
from nvgemm.emulator.isa.tma import decode_tensor_map, tile_load, tile_store

# (words 0-7 of a captured map, what the host passed): nvgemm sm100 t128, M=128 N=384 K=512 bf16 out
CAPTURED = {
    "A fp4 [128, 256 B]": ([0x00005585027EA200, 0x0000001000046592, 0, 0, 0x0000007F000001FF, 0, 0xFF00000000000000,
                            0x7F], dict(dtype="b4", dims=(512, 128), strides=(256,), box=(256, 128), swizzle=128)),
    "SFB [3 x 128x32 blocks]": ([0x00005585026DB500, 0x00000020000400A2, 0x100, 0, 0x00000007000000FF, 2,
                                 0xFF00000000000000, 0x3], dict(dtype="b16", dims=(256, 8, 3), strides=(512, 4096),
                                                                box=(256, 4, 1), swizzle=0)),
    "C bf16 [128, 384]": ([0x00005585027267C0, 0x0000003000044512, 0, 0, 0x0000007F0000017F, 0, 0x1F00000000000000,
                           0x7F], dict(dtype="bf16", dims=(384, 128), strides=(768,), box=(32, 128), swizzle=64)),
    "C f32 [128, 256] (control 0x24)": ([0x0000558502763E00, 0x0000004000246392, 0, 0, 0x0000007F000000FF, 0,
                                         0x1F00000000000000, 0x7F],
                                        dict(dtype="f32", dims=(256, 128), strides=(1024,), box=(32, 128),
                                             swizzle=128)),
}


def raw(words) -> bytes:
    return b"".join(int(w).to_bytes(8, "little") for w in words) + bytes(64)


@pytest.mark.parametrize("name", list(CAPTURED))
def test_captured_maps_decode_to_the_host_tensors(name):
    words, want = CAPTURED[name]
    tm = decode_tensor_map(raw(words))
    assert tm.address == words[0]
    assert (tm.dtype, tm.dims, tm.strides, tm.box, tm.swizzle) == (want["dtype"], want["dims"], want["strides"],
                                                                   want["box"], want["swizzle"])


def test_unestablished_fields_are_rejected():
    words = list(CAPTURED["A fp4 [128, 256 B]"][0])
    for bad, msg in [((1, words[1] ^ 0x2), "bits 0-3"), ((1, words[1] ^ (3 << 7)), "element type code"),
                     ((1, words[1] | (1 << 20)), "bits 15-31"), ((7, words[7] | (1 << 40)), "outside the established"),
                     ((5, 1), "dimension 2 fields"), ((0, words[0] + 8), "16-byte aligned")]:
        w = list(words)
        w[bad[0]] = bad[1]
        with pytest.raises(IsaError, match=msg):
            decode_tensor_map(raw(w))


class _Global:
    """A host buffer at a fake device address, read like the core's bounds-checked global memory."""

    def __init__(self, data: np.ndarray, base: int = 0x10000):
        self.buf, self.base = data.view(np.uint8).ravel(), base

    def read(self, addrs, width):
        off = addrs - self.base
        assert off.min() >= 0 and off.max() + width <= self.buf.size, "read outside the tensor"
        return self.buf[off[:, None] + np.arange(width)]


def make_map(base, dtype_code, dims, strides, box, sw_code, elem_shift=0):
    rank = len(dims)
    q = [0] * 8
    q[0] = base
    q[1] = 0b0010 | ((rank - 1) << 4) | (dtype_code << 7) | (sw_code << 13) | (0x4 << 16) | ((strides[0] >> 4) << 32)
    if rank > 2:
        q[2] = strides[1] >> 4
    q[4] = (dims[0] - 1) | ((dims[1] - 1) << 32)
    if rank > 2:
        q[5] = dims[2] - 1
    q[6] = (box[0] - 1) << 56
    q[7] = (box[1] - 1) | ((box[2] - 1) << 8 if rank > 2 else 0)
    return decode_tensor_map(raw(q))


@pytest.mark.parametrize("coords", [(0, 0), (64, 32), (-16, 120), (200, -3)])
def test_tile_load_bf16_sw128_zero_fill(coords, seed):
    rng = np.random.default_rng(seed)
    rows, cols = 136, 256  # bf16 [136, 256], row stride 512 B; box 64 x 64 (128 B rows) with the 128B swizzle
    g = rng.integers(1, 1 << 16, size=(rows, cols)).astype(np.uint16)
    glob = _Global(g)
    tm = make_map(glob.base, 10, (cols, rows), (cols * 2,), (64, 64), 3)
    smem_base = 2048
    addr, data = tile_load(tm, coords, smem_base, glob.read)
    smem = np.zeros(smem_base + 64 * 128, dtype=np.uint8)
    smem[addr] = data[:, 0]
    smem[addr + 1] = data[:, 1]
    c0, c1 = coords
    want = np.zeros((64, 64), dtype=np.uint16)
    r0, r1, k0, k1 = max(c1, 0), min(c1 + 64, rows), max(c0, 0), min(c0 + 64, cols)
    want[r0 - c1:r1 - c1, k0 - c0:k1 - c0] = g[r0:r1, k0:k1]
    got = np.zeros((64, 64), dtype=np.uint16)
    for r in range(64):
        row = smem_base + r * 128
        for j in range(8):
            unit = smem[row + 16 * (j ^ (r % 8)):row + 16 * (j ^ (r % 8)) + 16]
            got[r, 8 * j:8 * j + 8] = unit.view(np.uint16)
    np.testing.assert_array_equal(got, want)
    assert tm.box_bytes == 64 * 64 * 2


def test_tile_load_4bit_and_3d(seed):
    rng = np.random.default_rng(seed)
    g = rng.integers(0, 256, size=(3, 8, 512), dtype=np.uint8)  # 3 blocks x 8 rows x 512 B, 16-bit elements
    glob = _Global(g)
    tm = make_map(glob.base, 1, (256, 8, 3), (512, 4096), (256, 4, 1), 0)
    addr, data = tile_load(tm, (0, 4, 2), 0, glob.read)
    np.testing.assert_array_equal(addr, np.arange(0, 4 * 512, 2))  # 16-bit units, dense
    np.testing.assert_array_equal(data.reshape(4, 512), g[2, 4:8])
    f4 = rng.integers(0, 256, size=(16, 64), dtype=np.uint8)  # 16 rows of 128 e2m1
    glob4 = _Global(f4)
    tm4 = make_map(glob4.base, 11, (128, 16), (64,), (64, 8), 0)
    addr, data = tile_load(tm4, (96, 12), 128, glob4.read)
    img = np.zeros((8, 32), dtype=np.uint8)
    img.ravel()[addr - 128] = data[:, 0]
    want = np.zeros((8, 32), dtype=np.uint8)
    want[:4, :16] = f4[12:16, 48:64]
    np.testing.assert_array_equal(img, want)
    with pytest.raises(IsaError, match="must be even"):
        tile_load(tm4, (3, 0), 0, glob4.read)
    with pytest.raises(IsaError, match="128-byte aligned"):
        tile_load(tm4, (0, 0), 64, glob4.read)


def test_tile_store_skips_out_of_bounds(seed):
    rng = np.random.default_rng(seed)
    tm = make_map(0x40000, 7, (40, 20), (160,), (32, 16), 0)  # f32 [20, 40]
    box = rng.standard_normal((16, 32)).astype(np.float32)
    sm = box.view(np.uint8).ravel()
    gaddr, data = tile_store(tm, (32, 8), 0, lambda a, w: sm[a[:, None] + np.arange(w)])
    g = np.full((20, 40), np.nan, dtype=np.float32)
    gb = g.view(np.uint8).ravel()
    for a, d in zip(gaddr - 0x40000, data):
        gb[a:a + 4] = d
    want = np.full((20, 40), np.nan, dtype=np.float32)
    want[8:20, 32:40] = box[:12, :8]
    np.testing.assert_array_equal(g, want)


@pytest.mark.parametrize("coords", [(0, 0), (-16, 120), (200, -3)])
def test_box_addresses_are_the_in_bounds_reads_of_a_load(coords, seed):
    """The PDL record of a bulk tensor load or prefetch (``box_addresses``) names exactly the global bytes the
    load reads: in-bounds element units only."""
    from nvgemm.emulator.isa.tma import box_addresses

    rng = np.random.default_rng(seed)
    rows, cols = 136, 256
    glob = _Global(rng.integers(1, 1 << 16, size=(rows, cols)).astype(np.uint16))
    tm = make_map(glob.base, 10, (cols, rows), (cols * 2,), (64, 64), 3)
    read = []
    tile_load(tm, coords, 2048, lambda a, width: read.append(a.copy()) or glob.read(a, width))
    got = box_addresses(tm, coords)
    np.testing.assert_array_equal(np.sort(got), np.sort(np.concatenate(read) if read else np.zeros(0, np.uint64)))
    c0, c1 = coords
    inb = (min(c0 + 64, cols) - max(c0, 0)) * (min(c1 + 64, rows) - max(c1, 0))
    assert got.size == inb and got.dtype == np.uint64
