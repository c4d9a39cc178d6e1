"""TMA (``cp.async.bulk.tensor``, sm_90+/sm_100a): the 128-byte tensor map as CuTeDSL encodes it, and the tiled
load / store of one box with swizzle and out-of-bounds fill.

The tensor map (CUtensorMap) format is not documented by NVIDIA, and CuTeDSL 4.8 encodes it inline in the host
code (no ``cuTensorMapEncodeTiled`` call to intercept). The decoding below was established by experiment:
nvgemm's sm100 kernel launched through the emulator's fake CUDA runtime (``record_only``) for 7 problems
(M, N, K, tile_n, output dtype and swap-AB varied; the parameter bytes of its 5 maps -- A, B, SFA, SFB, C --
diffed against the tensors' pointers, shapes and strides and the kernel's tile shapes). The test
``tests/compile/test_emu_isa_tma_map.py`` re-runs that experiment when cutlass is importable. The layout
agrees with the compact descriptor FlashGPU-Sim documents for sm_120 device-built maps (read, not copied).
Fields (q = little-endian 64-bit word of the map):

=============  ======================================================================================
q0             global address (16-byte aligned)
q1 bits 0-3    ``0b0010`` in every map observed (meaning unknown; anything else is rejected)
q1 bits 4-6    rank - 1
q1 bits 7-12   element type: 0 = 8-bit (fp8 operands: established by NVIDIA's Hopper dense_gemm
               example with e4m3 A/B running bit-exact through its TMA loads, bench/run_nvidia_examples.py),
               1 = 16-bit (CuTe's view of the e4m3 scale-factor blocks), 6 = f16, 7 = f32, 10 = bf16,
               11 = packed 4-bit (e2m1; dims and box count 4-bit elements), 12 = 4-bit padded in shared
               memory (``.b4x16_p64``, CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B: each 16 packed elements, 8 bytes
               in global memory, land in 16 bytes of shared memory, data first, the 8 padding bytes left
               unwritten; dims, box and coordinates count 4-bit elements in groups of 16, the transaction
               count is the packed bytes -- established by NVIDIA's sm_120 mixed E2M1 x E4M3 block-scaled
               example: its expect_tx is the packed size, its ldmatrix .b4x16_p64 reads the padded rows, and
               it runs bit-exact); other codes are rejected
q1 bits 13-14  swizzle: 0 none, 1 32B, 2 64B, 3 128B
q1 bits 16-31  ``0x0004``, or ``0x0024`` for the two 128 KiB tensors of the experiment (bit 21: no
               functional input varied with it -- taken as a cache hint, **unverified**); others rejected
q1 bits 32-63  global stride of dimension 1, in bytes >> 4; q2 low/high and q3 low: dimensions 2, 3, 4
q4, q5, q6lo   global dimension - 1 of dimensions 0, 1 | 2, 3 | 4 (32 bits each)
q6 bits 56-63  box dimension 0 - 1; q7 bytes 0-3: box dimensions 1-4 - 1
rest           zero in every map observed (element strides 1, no interleave, zero OOB fill, as CuTe
               builds them); non-zero bits there are rejected since their meaning is not established
bytes 64-127   never written by the encoder (host stack leftovers); ignored
=============  ======================================================================================

Tiled load (PTX ISA 5.5.3 "Tiled mode", ``cp.async.bulk.tensor.Nd.shared::cluster.global.tile``): the box at
signed element coordinates ``c`` holds the elements ``c + i`` (``0 <= i < box``); an element with any
coordinate outside ``[0, dim)`` is filled with zero (the OOB fill CuTe selects) and is never read. The box is
stored densely in shared memory, dimension 0 fastest, and the swizzle is applied to the absolute shared byte
address of every 16-byte unit (the same functions as :mod:`.smem_desc`); the box's inner extent in bytes
must not exceed the swizzle span. The transaction count (``complete_tx``) is the full box size in bytes,
out-of-bounds elements included. The tiled store writes the in-bounds elements of the box back and skips
the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from nvgemm.emulator.isa.errors import IsaError
from nvgemm.emulator.isa.smem_desc import swizzle

#: element type code -> (name, size in bits)
TMA_DTYPES = {0: ("b8", 8), 1: ("b16", 16), 6: ("f16", 16), 7: ("f32", 32), 10: ("bf16", 16), 11: ("b4", 4),
              12: ("b4x16_p64", 4)}
_CONTROL_OK = (0x0004, 0x0024)


@dataclass(frozen=True)
class TensorMap:
    address: int
    rank: int
    dtype: str
    elem_bits: int
    dims: tuple
    strides: tuple  # bytes, dimension 1.. (dimension 0 is contiguous)
    box: tuple
    swizzle: int
    raw: bytes

    @property
    def box_bytes(self) -> int:
        return int(np.prod(self.box)) * self.elem_bits // 8


def _f(v: int, lo: int, width: int) -> int:
    return (v >> lo) & ((1 << width) - 1)


def decode_tensor_map(raw: bytes) -> TensorMap:
    """Decode the first 64 bytes of a CuTeDSL-encoded CUtensorMap (see the module docstring)."""
    if len(raw) < 64:
        raise IsaError(f"tensor map: {len(raw)} bytes, expected 128")
    q = [int.from_bytes(raw[8 * i:8 * i + 8], "little") for i in range(8)]
    where = f"tensor map at global {q[0]:#x}"
    if _f(q[1], 0, 4) != 0b0010:
        raise IsaError(f"{where}: q1 bits 0-3 = {_f(q[1], 0, 4):#06b}, only 0b0010 is established")
    rank = _f(q[1], 4, 3) + 1
    code = _f(q[1], 7, 6)
    if code not in TMA_DTYPES:
        raise IsaError(f"{where}: element type code {code} is not established (known: {sorted(TMA_DTYPES)})")
    if _f(q[1], 15, 1) or _f(q[1], 16, 16) not in _CONTROL_OK:
        raise IsaError(f"{where}: q1 bits 15-31 = {_f(q[1], 15, 17):#x} not established")
    if rank > 5:
        raise IsaError(f"{where}: rank {rank} (TMA has at most 5 dimensions)")
    name, bits = TMA_DTYPES[code]
    stride_enc = [q[1] >> 32, _f(q[2], 0, 32), q[2] >> 32, _f(q[3], 0, 32)]
    dim_enc = [_f(q[4], 0, 32), q[4] >> 32, _f(q[5], 0, 32), q[5] >> 32, _f(q[6], 0, 32)]
    box_enc = [q[6] >> 56] + [_f(q[7], 8 * i, 8) for i in range(4)]
    for i in range(rank, 5):
        if dim_enc[i] or box_enc[i] or (i >= 1 and stride_enc[i - 1]):
            raise IsaError(f"{where}: rank {rank} but dimension {i} fields are set")
    if q[3] >> 32 or _f(q[6], 32, 24) or q[7] >> 32:
        raise IsaError(f"{where}: bits outside the established fields are set (q3 {q[3]:#x}, q6 {q[6]:#x}, "
                       f"q7 {q[7]:#x}): element strides / interleave / OOB fill are not modelled")
    if q[0] % 16:
        raise IsaError(f"{where}: global address not 16-byte aligned")
    sw = (0, 32, 64, 128)[_f(q[1], 13, 2)]
    box = tuple(int(b) + 1 for b in box_enc[:rank])
    if sw and box[0] * (8 if name == "b4x16_p64" else bits) > 8 * sw:  # shared-memory bytes of the inner extent
        raise IsaError(f"{where}: box inner extent {box[0] * bits // 8} bytes exceeds the {sw}B swizzle span")
    return TensorMap(q[0], rank, name, bits, tuple(int(d) + 1 for d in dim_enc[:rank]),
                     tuple(int(s) << 4 for s in stride_enc[:rank - 1]), box, sw, bytes(raw[:128]))


def _box_geometry(tm: TensorMap, coords) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(global byte address, in-bounds mask, shared byte offset within the box) per element unit, unit bytes.

    Element units are whole bytes: 4-bit maps move pairs of elements (coordinate 0 and the box's inner
    extent must be even)."""
    if len(coords) != tm.rank:
        raise IsaError(f"TMA {tm.rank}d map used with {len(coords)} coordinates")
    c = [int(x) for x in coords]
    box = list(tm.box)
    dims = list(tm.dims)
    stride_s = None
    if tm.dtype == "b4x16_p64":  # units of 16 elements: 8 bytes in global memory, 16 in shared memory
        if c[0] % 16 or box[0] % 16 or dims[0] % 16:
            raise IsaError(f"TMA .b4x16_p64 map: coordinate {c[0]}, box {box[0]} and dim {dims[0]} must be multiples "
                           f"of 16 (other cases are not modelled)")
        c[0], box[0], dims[0] = c[0] // 16, box[0] // 16, dims[0] // 16
        unit, stride_s = 8, 16
    elif tm.elem_bits == 4:
        if c[0] % 2 or box[0] % 2 or dims[0] % 2:
            raise IsaError(f"TMA 4-bit map: coordinate {c[0]}, box {box[0]} and dim {dims[0]} must be even")
        c[0], box[0], dims[0] = c[0] // 2, box[0] // 2, dims[0] // 2
        unit = 1
    else:
        unit = tm.elem_bits // 8
    grids = np.meshgrid(*[np.arange(b, dtype=np.int64) for b in reversed(box)], indexing="ij")
    idx = [g.ravel() for g in reversed(grids)]  # idx[0] fastest
    gcoord = [idx[d] + c[d] for d in range(tm.rank)]
    inb = np.ones(idx[0].shape, dtype=bool)
    for d in range(tm.rank):
        inb &= (gcoord[d] >= 0) & (gcoord[d] < dims[d])
    gaddr = tm.address + gcoord[0] * unit
    for d in range(1, tm.rank):
        gaddr = gaddr + gcoord[d] * tm.strides[d - 1]
    soff = np.arange(idx[0].size, dtype=np.int64) * (stride_s or unit)
    return gaddr, inb, soff, unit


def box_addresses(tm: TensorMap, coords) -> np.ndarray:
    """Global byte addresses (uint64) of the in-bounds element units of the box at ``coords`` (what a
    load or an L2 prefetch of that box reads)."""
    gaddr, inb, _soff, _unit = _box_geometry(tm, coords)
    return gaddr[inb].astype(np.uint64)


def tile_load(tm: TensorMap, coords, smem_addr: int, read_global: Callable[[np.ndarray, int], np.ndarray]):
    """The bytes one box load writes to shared memory: returns (shared byte addresses (n,), bytes (n, unit)).

    ``read_global(addresses, width) -> uint8 (n, width)`` reads in-bounds elements only."""
    if smem_addr % 128:
        raise IsaError(f"TMA load to shared address {smem_addr:#x}: must be 128-byte aligned")
    gaddr, inb, soff, unit = _box_geometry(tm, coords)
    data = np.zeros((gaddr.size, unit), dtype=np.uint8)
    if inb.any():
        data[inb] = read_global(gaddr[inb], unit)
    return swizzle(smem_addr + soff, tm.swizzle), data


def tile_store(tm: TensorMap, coords, smem_addr: int, read_shared: Callable[[np.ndarray, int], np.ndarray]):
    """The writes one box store makes: returns (global addresses (n,), bytes (n, unit)) of in-bounds elements."""
    if smem_addr % 128:
        raise IsaError(f"TMA store from shared address {smem_addr:#x}: must be 128-byte aligned")
    if tm.dtype == "b4x16_p64":
        raise IsaError("TMA store through a .b4x16_p64 map is not modelled")
    gaddr, inb, soff, unit = _box_geometry(tm, coords)
    saddr = swizzle(smem_addr + soff, tm.swizzle)
    return gaddr[inb], read_shared(saddr[inb], unit)
