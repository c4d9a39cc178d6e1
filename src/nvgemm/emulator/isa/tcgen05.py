"""``tcgen05`` (sm_100a) semantics: Tensor Memory and its allocator, the instruction descriptor, the block-scaled
``kind::mxf4nvf4`` and the ``kind::f16`` MMAs (A in shared or tensor memory), ``tcgen05.cp .32x128b.warpx4``,
``tcgen05.ld / st .32x32b.xN`` and ``.16x32bx2.xN``, and the commit pipe, written from the PTX ISA 9.7.16
("TensorCore 5th Generation Family Instructions").

Tensor Memory (9.7.16.1): per CTA 128 lanes x 512 columns of 32-bit cells. A TMEM address is 32 bits,
lane in bits 31-16 and column in bits 15-0. Cells start **poisoned**: reading a cell nothing wrote (an MMA
accumulating into it, ``tcgen05.ld``) is an error naming the lane and column.

Allocation (9.7.16.7.1): ``tcgen05.alloc [smem], ncols`` with ncols a power of two in 32..512 writes the
address (lane 0, first column) to shared memory; ``dealloc taddr, ncols`` frees exactly an allocation;
after ``relinquish_alloc_permit`` the CTA may not allocate again. Allocations here are first-fit and
aligned to their size; all must be freed before the CTA exits (:meth:`TmemAllocator.check_exit`).

Instruction descriptor (9.7.17.4.2 tables 45 / 47) -- :func:`decode_idesc`.

Data path layouts (9.7.16.10.5): for ``M = 128`` with ``cta_group::1`` (layout D) row ``m`` of D is TMEM
lane ``m`` and column ``n`` is ``column(d) + n``, one fp32 per cell. ``M = 256`` needs ``cta_group::2``
(:func:`mma_mxf4nvf4_pair`: the CTA pair's shared and tensor memory; layout A, rows 128..255 in the peer).

Block scaling (9.7.16.10.7): ``D += (A * SFA) (B * SFB)^T`` with one ue4m3 (or ue8m0) scale per 16
elements of K (``block16`` = ``scale_vec::4X``; K = 64 per instruction, so 4 scales per row of A and per
column of B). The ISA requires the scale factors to be duplicated in all four 32-lane partitions of TMEM.
Their placement inside a partition is modelled as: the scale of row ``m`` (A; column ``n`` for B) and
K-block ``kb`` is byte ``data_id + kb`` of the cell at lane ``32 p + m % 32`` (any partition ``p``), column
``column(sf) + m // 32``. That is the cell a ``tcgen05.cp .32x128b.warpx4`` lands when the scales sit in
shared memory in the 512-byte ``32 x 16`` blocks of the 128 x 4 scale tile (byte ``16 (m % 32) +
4 (m // 32) + kb``, the layout nvgemm's ``to_blocked`` and cuBLAS use). The ISA states this placement in a
figure, not in text; it is confirmed end to end by nvgemm's sm100 kernel, whose scale-factor path (smem
layout, ``tcgen05.cp`` atom, TMEM offsets) CuTe's own block-scaled helpers build: on the emulator it matches
the reference bit for bit (``tests/compile/test_emu_isa_sm100_kernel.py``; reversing the byte order or
transposing the cell index makes it fail). The float model is :func:`~.numerics.dot_f32` with the scale
products folded in exactly.

``tcgen05.cp .32x128b.warpx4 [taddr], s-desc``: 32 rows of 128 bits read from shared memory through a
shared-memory descriptor (canonical K-major layout of 32-bit elements) and written to lanes
``32 p + r`` (all four partitions ``p``), columns ``column(taddr) .. + 3`` (cell ``j`` = bytes
``4 j .. 4 j + 3`` of the row, little endian).

``tcgen05.ld.sync.aligned.32x32b.xN.b32``: warp ``w`` may access only lanes ``32 (w % 4) .. + 31``; thread
``l`` receives register ``i`` = cell (lane ``lane(taddr) + l``, column ``column(taddr) + i``).

``tcgen05.{ld,st}.sync.aligned.16x32bx2.xN.b32`` (9.7.16.2.3, "Matrix fragments for shape .16x32bx2"; the
instructions' ``immHalfSplitoff`` operand): two accesses of shape ``16x32b``, the first at ``taddr``, the second
at ``taddr + immHalfSplitoff`` (columns). Threads ``0..15`` make the first: thread ``t``, register ``i`` is the
cell (lane ``lane(taddr) + t``, column ``column(taddr) + i``); threads ``16..31`` the second: (lane
``lane(taddr) + t - 16``, column ``column(taddr) + immHalfSplitoff + i``). The 16 lanes must lie in the warp's
32-lane partition; halves that overlap are rejected (:func:`ldst_cells`).

MMA shapes with ``cta_group::1`` (9.7.16.10.5): ``M = 128`` (layout D, above) and ``M = 64`` without ``.ws``
(layout F, "4x1, 1/2 datapath utilized", lane alignment 0 or 16): row ``m`` of D is lane
``a + 32 (m // 16) + m % 16`` with ``a = lane(d)`` in {0, 16} -- the first or second 16 lanes of each warp's
partition -- and column ``column(d) + n``. A may sit in tensor memory (``tcgen05.mma ... [d], [a-tmem], b-desc,
idesc, ...``, :func:`mma_f16_tmem_a`): its rows use D's lanes (the ISA requires the same lane alignment for A and
D in layout F) and its 16-bit elements are packed two per 32-bit cell along K, element ``2j`` in the low half
(9.7.16.10.4: only D's sub-word elements are unpacked), so an ``M x 16`` A occupies 8 columns from
``column(a)``. Every row ``m`` and element ``k`` of this placement is checked end to end by Triton's sm_100a W4A16
GEMM (its 64 x 64 tile stores A with ``tcgen05.st .16x32bx2`` and reads D with ``tcgen05.ld .16x32bx2``), which
matches the torch reference bit for bit on the emulator (``bench/triton_emulator_sweep.py``).

``tcgen05.mma`` / ``cp`` are asynchronous: :class:`Tcgen05Pipe` queues them per issuing thread and runs them
at ``tcgen05.commit``, which then performs the ``mbarrier::arrive::one``. ``elect.sync`` (one lane of the
member mask, the lowest here) and ``setmaxnreg`` (a register-budget hint with no functional effect on
values) need no model beyond the core.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from nvgemm.emulator.isa import numerics
from nvgemm.emulator.isa.errors import IsaError
from nvgemm.emulator.isa.smem_desc import decode_tcgen05_desc, read_operand

LANES, COLUMNS = 128, 512


def split_taddr(taddr: int) -> tuple[int, int]:
    """(lane, column) of a TMEM address."""
    t = int(taddr) & 0xFFFFFFFF
    return t >> 16, t & 0xFFFF


def make_taddr(lane: int, column: int) -> int:
    return (lane << 16) | column


@dataclass
class Tmem:
    """One CTA's Tensor Memory (uint32 cells) with a written-mask for poison checks."""

    where: str = "CTA"
    cells: np.ndarray = field(default_factory=lambda: np.zeros((LANES, COLUMNS), dtype=np.uint32))
    written: np.ndarray = field(default_factory=lambda: np.zeros((LANES, COLUMNS), dtype=bool))

    def _span(self, lane: int, col: int, nl: int, nc: int, op: str) -> None:
        if lane < 0 or col < 0 or lane + nl > LANES or col + nc > COLUMNS:
            raise IsaError(f"{op} on {self.where}: lanes {lane}..{lane + nl - 1}, columns {col}..{col + nc - 1} "
                           f"outside tensor memory ({LANES} x {COLUMNS})")

    def read(self, lane: int, col: int, nl: int, nc: int, op: str) -> np.ndarray:
        self._span(lane, col, nl, nc, op)
        ok = self.written[lane:lane + nl, col:col + nc]
        if not ok.all():
            bl, bc = np.argwhere(~ok)[0]
            raise IsaError(f"{op} on {self.where} reads tensor memory lane {lane + bl}, column {col + bc} "
                           "that nothing wrote")
        return self.cells[lane:lane + nl, col:col + nc].copy()

    def write(self, lane: int, col: int, values: np.ndarray, op: str) -> None:
        v = np.asarray(values, dtype=np.uint32)
        self._span(lane, col, v.shape[0], v.shape[1], op)
        self.cells[lane:lane + v.shape[0], col:col + v.shape[1]] = v
        self.written[lane:lane + v.shape[0], col:col + v.shape[1]] = True


@dataclass
class TmemAllocator:
    """``tcgen05.alloc / dealloc / relinquish_alloc_permit`` of one CTA's 512 columns."""

    where: str = "CTA"
    allocations: dict = field(default_factory=dict)  # first column -> ncols
    relinquished: bool = False

    def alloc(self, ncols: int) -> int | None:
        """The TMEM address of a new allocation, or None when no aligned run of ``ncols`` columns is free
        (the instruction then blocks until one is; with no other CTA on the SM that is a deadlock)."""
        if self.relinquished:
            raise IsaError(f"tcgen05.alloc on {self.where} after tcgen05.relinquish_alloc_permit")
        if ncols < 32 or ncols > COLUMNS or ncols & (ncols - 1):
            raise IsaError(f"tcgen05.alloc on {self.where}: {ncols} columns; the ISA wants a power of 2 in 32..512")
        for start in range(0, COLUMNS, ncols):
            if all(s + n <= start or start + ncols <= s for s, n in self.allocations.items()):
                self.allocations[start] = ncols
                return make_taddr(0, start)
        return None

    def dealloc(self, taddr: int, ncols: int) -> None:
        lane, col = split_taddr(taddr)
        if lane != 0 or self.allocations.get(col) != ncols:
            raise IsaError(f"tcgen05.dealloc on {self.where}: address {taddr:#x}, {ncols} columns does not match "
                           f"an allocation ({ {c: n for c, n in self.allocations.items()} })")
        del self.allocations[col]

    def relinquish_alloc_permit(self) -> None:
        self.relinquished = True

    def check_exit(self) -> None:
        if self.allocations:
            raise IsaError(f"{self.where} exits with tensor memory still allocated: "
                           f"{ {c: n for c, n in self.allocations.items()} } (first column: columns)")


# -- instruction descriptor -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class InstrDesc:
    kind: str
    m: int
    n: int
    k: int
    atype: str
    btype: str
    dtype: str
    negate_a: bool
    negate_b: bool
    a_major: str
    b_major: str
    scale_type: str | None = None
    sfa_id: int = 0
    sfb_id: int = 0


def _bits(v: int, lo: int, width: int) -> int:
    return (v >> lo) & ((1 << width) - 1)


def decode_idesc(kind: str, value: int) -> InstrDesc:
    """Decode the 32-bit instruction descriptor of ``tcgen05.mma .kind::{f16, mxf4nvf4}`` (dense)."""
    v = int(value) & 0xFFFFFFFF
    where = f"tcgen05.mma .kind::{kind} instruction descriptor {v:#010x}"
    if _bits(v, 2, 1):
        raise IsaError(f"{where}: sparse MMA (bit 2) is not modelled")
    n = _bits(v, 17, 6) << 3
    if kind == "f16":
        if _bits(v, 0, 2) or _bits(v, 3, 1) or _bits(v, 6, 1) or _bits(v, 23, 1) or _bits(v, 29, 1):
            raise IsaError(f"{where}: reserved bits set")
        if _bits(v, 30, 2):
            raise IsaError(f"{where}: .ws B-reuse shift (bits 30-31) is not modelled")
        dtype = {0: "f16", 1: "f32"}.get(_bits(v, 4, 2))
        at, bt = ({0: "f16", 1: "bf16"}.get(_bits(v, 7, 3)), {0: "f16", 1: "bf16"}.get(_bits(v, 10, 3)))
        if dtype != "f32" or at is None or at != bt:
            raise IsaError(f"{where}: types d={_bits(v, 4, 2)} a={_bits(v, 7, 3)} b={_bits(v, 10, 3)} not modelled "
                           "(f32 accumulator, f16 or bf16 inputs)")
        return InstrDesc("f16", _bits(v, 24, 5) << 4, n, 16, at, bt, "f32", bool(_bits(v, 13, 1)),
                         bool(_bits(v, 14, 1)), "mn" if _bits(v, 15, 1) else "k", "mn" if _bits(v, 16, 1) else "k")
    if kind == "mxf4nvf4":
        if _bits(v, 0, 2) or _bits(v, 3, 1) or _bits(v, 6, 1) or _bits(v, 12, 1) or _bits(v, 24, 3):
            raise IsaError(f"{where}: reserved bits set")
        if _bits(v, 7, 3) != 1 or _bits(v, 10, 2) != 1:
            raise IsaError(f"{where}: atype {_bits(v, 7, 3)} / btype {_bits(v, 10, 2)}: the ISA allows E2M1 = 1")
        if _bits(v, 15, 1) or _bits(v, 16, 1):
            raise IsaError(f"{where}: transposed operands are not allowed for .kind::mxf4nvf4")
        if _bits(v, 31, 1):
            raise IsaError(f"{where}: K = 96 (bit 31) is not modelled")
        return InstrDesc("mxf4nvf4", _bits(v, 27, 2) << 7, n, 64, "e2m1", "e2m1", "f32", bool(_bits(v, 13, 1)),
                         bool(_bits(v, 14, 1)), "k", "k", "ue8m0" if _bits(v, 23, 1) else "ue4m3",
                         _bits(v, 29, 2), _bits(v, 4, 2))
    raise IsaError(f"tcgen05.mma .kind::{kind} is not modelled (f16, mxf4nvf4)")


def _check_shape(d: InstrDesc, cta_group: int) -> None:
    if cta_group != 1:
        raise IsaError(f"tcgen05.mma .cta_group::{cta_group} reads two CTAs' tensor and shared memory: "
                       "mma_mxf4nvf4_pair models it")
    if d.m != 128 and not (d.m == 64 and d.kind == "f16"):
        raise IsaError(f"tcgen05.mma .kind::{d.kind}: M = {d.m} is not modelled with cta_group::1 (M = 128; "
                       "M = 64 for .kind::f16)")
    step = 16 if d.kind == "f16" else 8
    if d.n % step or not step <= d.n <= 256:
        raise IsaError(f"tcgen05.mma .kind::{d.kind}: N = {d.n} must be a multiple of {step} in {step}..256")


def row_lanes(m: int, taddr: int, op: str) -> np.ndarray:
    """The TMEM lane of each of the ``m`` rows of an MMA operand in tensor memory (D, or A) at ``taddr``
    (``cta_group::1``): layout D for M = 128 (lane ``m``, the address at lane 0), layout F for M = 64 (lane
    ``a + 32 (m // 16) + m % 16``, the address at lane ``a`` = 0 or 16); see the module docstring."""
    lane, _ = split_taddr(taddr)
    if m == 128:
        if lane != 0:
            raise IsaError(f"{op}: tensor memory address {taddr:#x} must start at lane 0 for M = 128")
        return np.arange(128)
    if m == 64:
        if lane not in (0, 16):
            raise IsaError(f"{op}: tensor memory address {taddr:#x}: M = 64 (layout F) needs lane alignment 0 or 16, "
                           f"got lane {lane}")
        r = np.arange(64)
        return lane + 32 * (r // 16) + r % 16
    raise IsaError(f"{op}: M = {m} is not modelled with cta_group::1 (64, 128)")


def _lane_runs(lanes: np.ndarray) -> list[tuple[int, int, int]]:
    """(first index, first lane, count) of each run of consecutive lanes in ``lanes``."""
    runs, start = [], 0
    for i in range(1, len(lanes) + 1):
        if i == len(lanes) or lanes[i] != lanes[i - 1] + 1:
            runs.append((start, int(lanes[start]), i - start))
            start = i
    return runs


def read_rows(tmem: Tmem, lanes: np.ndarray, col: int, ncols: int, op: str) -> np.ndarray:
    """(len(lanes), ncols) cells of the given lanes from column ``col`` (poison-checked)."""
    out = np.empty((len(lanes), ncols), dtype=np.uint32)
    for i, lane, n in _lane_runs(lanes):
        out[i:i + n] = tmem.read(lane, col, n, ncols, op)
    return out


def write_rows(tmem: Tmem, lanes: np.ndarray, col: int, values: np.ndarray, op: str) -> None:
    for i, lane, n in _lane_runs(lanes):
        tmem.write(lane, col, values[i:i + n], op)


def _accumulate(tmem: Tmem, d_taddr: int, d: InstrDesc, av: np.ndarray, bv: np.ndarray, enable_input_d: bool,
                op: str, disable_output_lane=None) -> None:
    _, col = split_taddr(d_taddr)
    lanes = row_lanes(d.m, d_taddr, op)
    keep = np.ones(len(lanes), dtype=bool)
    if disable_output_lane is not None:  # 4 x b32: bit l % 32 of word l // 32 disables TMEM lane l
        words = np.asarray(disable_output_lane, dtype=np.uint32)
        keep = ((words[lanes // 32] >> (lanes % 32).astype(np.uint32)) & 1) == 0
    rows = np.nonzero(keep)[0]
    if not len(rows):
        return
    prev = numerics.bits_f32(read_rows(tmem, lanes[rows], col, d.n, op)) if enable_input_d else None
    out = numerics.f32_bits(numerics.dot_f32(av[rows], bv, prev))
    write_rows(tmem, lanes[rows], col, out, op)


def mma_f16(tmem: Tmem, smem: np.ndarray, d_taddr: int, a_desc: int, b_desc: int, idesc: int,
            enable_input_d: bool, *, disable_output_lane=None, cta_group: int = 1, window_base: int = 0) -> None:
    """``tcgen05.mma.cta_group::1.kind::f16 [d], a-desc, b-desc, idesc, {disable-output-lane}, enable-input-d``
    (A from smem; rows whose disable-output-lane bit is set are left unchanged)."""
    d = decode_idesc("f16", idesc)
    _check_shape(d, cta_group)
    a = read_operand(smem, decode_tcgen05_desc(a_desc), d.m, d.k, 16, d.a_major, window_base=window_base)
    b = read_operand(smem, decode_tcgen05_desc(b_desc), d.n, d.k, 16, d.b_major, window_base=window_base)
    av = numerics.values(a, d.atype) * (-1.0 if d.negate_a else 1.0)
    bv = numerics.values(b, d.btype) * (-1.0 if d.negate_b else 1.0)
    _accumulate(tmem, d_taddr, d, av, bv, enable_input_d, "tcgen05.mma.kind::f16", disable_output_lane)


def tmem_a_operand(tmem: Tmem, a_taddr: int, d_taddr: int, d: InstrDesc, op: str) -> np.ndarray:
    """Raw 16-bit codes (M, K) of an A operand in tensor memory (see the module docstring): row ``m`` at the lane
    :func:`row_lanes` gives it, element ``k`` in the low (even ``k``) or high (odd ``k``) half of column
    ``column(a) + k // 2``."""
    if d.a_major != "k":
        raise IsaError(f"{op}: A in tensor memory with the transpose-A bit (idesc bit 15) set is not modelled")
    lane_a, col_a = split_taddr(a_taddr)
    lane_d, _ = split_taddr(d_taddr)
    if lane_a != lane_d:
        raise IsaError(f"{op}: A at lane {lane_a} and D at lane {lane_d}: the ISA requires A and D at the same "
                       "tensor memory lane alignment")
    cells = read_rows(tmem, row_lanes(d.m, a_taddr, op), col_a, d.k // 2, op)
    return np.stack([cells & 0xFFFF, cells >> 16], axis=2).reshape(d.m, d.k).astype(np.uint16)


def mma_f16_tmem_a(tmem: Tmem, smem, d_taddr: int, a_taddr: int, b_desc: int, idesc: int, enable_input_d: bool,
                   *, disable_output_lane=None, cta_group: int = 1, window_base: int = 0) -> None:
    """``tcgen05.mma.cta_group::1.kind::f16 [d], [a-tmem], b-desc, idesc, {disable-output-lane}, enable-input-d``:
    A (M x 16, 16-bit) from tensor memory, B from shared memory, M = 64 or 128."""
    op = "tcgen05.mma.kind::f16 (A in tensor memory)"
    d = decode_idesc("f16", idesc)
    _check_shape(d, cta_group)
    a = tmem_a_operand(tmem, a_taddr, d_taddr, d, op)
    b = read_operand(smem, decode_tcgen05_desc(b_desc), d.n, d.k, 16, d.b_major, window_base=window_base)
    av = numerics.values(a, d.atype) * (-1.0 if d.negate_a else 1.0)
    bv = numerics.values(b, d.btype) * (-1.0 if d.negate_b else 1.0)
    _accumulate(tmem, d_taddr, d, av, bv, enable_input_d, op, disable_output_lane)


def scale_factors(tmem: Tmem, sf_taddr: int, rows: int, data_id: int, nblocks: int, op: str) -> np.ndarray:
    """(rows, nblocks) scale-factor codes read from TMEM in the placement described in the module docstring,
    checking that every 32-lane partition holds the same copy (the ISA's duplication rule)."""
    lane, col = split_taddr(sf_taddr)
    if lane != 0:
        raise IsaError(f"{op}: scale-factor address {sf_taddr:#x} must start at lane 0")
    if data_id + nblocks > 4:
        raise IsaError(f"{op}: scale factor data id {data_id} + {nblocks} scales per row exceeds a 32-bit cell")
    ncol = (rows + 31) // 32
    cells = tmem.read(0, col, 128, ncol, op)
    parts = cells.reshape(4, 32, ncol)
    if not (parts == parts[:1]).all():
        p, l, c = np.argwhere(parts != parts[:1])[0]
        raise IsaError(f"{op}: scale factors differ between lane partitions (lane {32 * p + l}, column {col + c} "
                       "differs from lane partition 0); the ISA requires them duplicated")
    m = np.arange(rows)
    cell = parts[0][m % 32, m // 32]
    shifts = 8 * (data_id + np.arange(nblocks, dtype=np.uint32))
    return ((cell[:, None] >> shifts[None, :]) & 0xFF).astype(np.uint8)


def mma_mxf4nvf4(tmem: Tmem, smem: np.ndarray, d_taddr: int, a_desc: int, b_desc: int, idesc: int,
                 sfa_taddr: int, sfb_taddr: int, enable_input_d: bool, *, cta_group: int = 1,
                 window_base: int = 0) -> None:
    """``tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.block16 [d], a-desc, b-desc, idesc, [sfa], [sfb],
    enable-input-d`` (``collector::a::*`` hints have no functional effect)."""
    op = "tcgen05.mma.kind::mxf4nvf4"
    d = decode_idesc("mxf4nvf4", idesc)
    _check_shape(d, cta_group)
    if d.scale_type != "ue4m3":
        raise IsaError(f"{op}: .block16 scales are ue4m3 (idesc bit 23 = 0); got {d.scale_type}")
    nb = d.k // 16
    a = read_operand(smem, decode_tcgen05_desc(a_desc), d.m, d.k, 4, "k", window_base=window_base)
    b = read_operand(smem, decode_tcgen05_desc(b_desc), d.n, d.k, 4, "k", window_base=window_base)
    sfa = numerics.values(scale_factors(tmem, sfa_taddr, d.m, d.sfa_id, nb, op), "ue4m3")
    sfb = numerics.values(scale_factors(tmem, sfb_taddr, d.n, d.sfb_id, nb, op), "ue4m3")
    av = numerics.values(a, "e2m1") * np.repeat(sfa, 16, axis=1) * (-1.0 if d.negate_a else 1.0)
    bv = numerics.values(b, "e2m1") * np.repeat(sfb, 16, axis=1) * (-1.0 if d.negate_b else 1.0)
    _accumulate(tmem, d_taddr, d, av, bv, enable_input_d, op)


def _pair_idesc(kind: str, idesc: int, op: str) -> InstrDesc:
    """The decoded instruction descriptor of a ``cta_group::2`` MMA: M = 256 (128 rows per CTA) and N a multiple of
    16 in 16..256 are modelled."""
    d = decode_idesc(kind, idesc)
    if d.m != 256:
        raise IsaError(f"{op}: M = {d.m} is not modelled with cta_group::2 (M = 256)")
    if d.n % 16 or not 16 <= d.n <= 256:
        raise IsaError(f"{op}: N = {d.n} must be a multiple of 16 in 16..256")
    return d


def mma_mxf4nvf4_pair(tmems, smems, d_taddr: int, a_desc: int, b_desc: int, idesc: int, sfa_taddr: int,
                      sfb_taddr: int, enable_input_d: bool) -> None:
    """``tcgen05.mma.cta_group::2.kind::mxf4nvf4.block_scale.block16`` with M = 256, issued by the pair leader:
    ``tmems`` / ``smems`` are the (leader, peer) CTAs' tensor memory and shared-memory readers. Each CTA holds
    its 128 rows of A at ``a-desc`` and N / 2 rows of B at ``b-desc`` (leader: columns 0 .. N/2 - 1, peer: the
    rest) in its own shared memory, and its 128 rows of D, its 128 rows of SFA and the scales of all N columns
    of B in its own tensor memory at the same addresses (9.7.16.10.5 layout A for M = 256: row ``m`` of D is
    lane ``m % 128`` of CTA ``m // 128``).

    Scale factor B: each CTA's 128 rows of D are scaled with the SFB in **its own** tensor memory at
    ``scale-B-tmem``. PTX ISA 9.7.16.10.9.1 (``tcgen05.mma``; 9.7.17.x in later ISA versions): "The qualifier
    ``.cta_group::2`` specifies that the matrix multiply and accumulate operation is performed on the Tensor Memory
    of the executing thread's CTA and its peer CTA"; 9.7.16.10.7 (Block Scaling): ``scale_A`` and ``scale_B`` "are
    matrices residing in Tensor Memory", addressed by ``[scale-A-tmem]`` / ``[scale-B-tmem]`` exactly like
    ``[d-tmem]``, whose per-CTA reading (each CTA's own lanes) layout A fixes. No sentence of the ISA names the
    leader's copy or splits SFB by B's halves, and NVIDIA's hardware-validated CuTe code is consistent with the
    per-CTA reading only: ``blockscaled_layout.make_smem_layout_sfb`` sizes every CTA's SFB tile for all N columns
    of the MMA (``round_up(N, 128)``, not divided by the atom's CTA count as ``make_smem_layout_sfa`` divides M),
    ``cluster_shape_to_tma_atom_SFB`` multicasts it to both CTAs and ``Cp4x32x128bOp(CtaGroup.TWO)`` writes it into
    both CTAs' tensor memory -- work that reading the leader's copy only, or one half per CTA, would make dead.
    tests/cpu/test_emu_isa_tcgen05.py::test_mma_mxf4nvf4_cta_pair_reads_sfb_from_each_cta holds the CTAs' SFB
    different and tells the three readings apart."""
    op = "tcgen05.mma.cta_group::2.kind::mxf4nvf4"
    d = _pair_idesc("mxf4nvf4", idesc, op)
    if d.scale_type != "ue4m3":
        raise IsaError(f"{op}: .block16 scales are ue4m3 (idesc bit 23 = 0); got {d.scale_type}")
    nb = d.k // 16
    b = np.concatenate([read_operand(s, decode_tcgen05_desc(b_desc), d.n // 2, d.k, 4, "k") for s in smems])
    half = replace(d, m=128)
    for tmem, smem in zip(tmems, smems):
        a = read_operand(smem, decode_tcgen05_desc(a_desc), 128, d.k, 4, "k")
        sfa = numerics.values(scale_factors(tmem, sfa_taddr, 128, d.sfa_id, nb, op), "ue4m3")
        sfb = numerics.values(scale_factors(tmem, sfb_taddr, d.n, d.sfb_id, nb, op), "ue4m3")
        av = numerics.values(a, "e2m1") * np.repeat(sfa, 16, axis=1) * (-1.0 if d.negate_a else 1.0)
        bv = numerics.values(b, "e2m1") * np.repeat(sfb, 16, axis=1) * (-1.0 if d.negate_b else 1.0)
        _accumulate(tmem, d_taddr, half, av, bv, enable_input_d, op)


def mma_f16_pair(tmems, smems, d_taddr: int, a_desc: int, b_desc: int, idesc: int, enable_input_d: bool, *,
                 disable_output_lane=None) -> None:
    """``tcgen05.mma.cta_group::2.kind::f16`` with M = 256, issued by the pair leader: the operand and D placement
    of :func:`mma_mxf4nvf4_pair` (each CTA: its 128 rows of A, N / 2 rows of B at the same descriptor addresses,
    its 128 rows of D in its own tensor memory). The ISA's 8-word disable-output-lane vector of ``cta_group::2``
    is modelled only all-zero (its bit-to-lane mapping across the pair is not spelled out); M = 128 with
    ``cta_group::2`` is not modelled."""
    op = "tcgen05.mma.cta_group::2.kind::f16"
    d = _pair_idesc("f16", idesc, op)
    if disable_output_lane is not None and any(int(w) for w in disable_output_lane):
        raise IsaError(f"{op}: a non-zero disable-output-lane vector is not modelled for cta_group::2")
    b = np.concatenate([read_operand(sm, decode_tcgen05_desc(b_desc), d.n // 2, d.k, 16, d.b_major) for sm in smems])
    bv = numerics.values(b, d.btype) * (-1.0 if d.negate_b else 1.0)
    half = replace(d, m=128)
    for tmem, smem in zip(tmems, smems):
        a = read_operand(smem, decode_tcgen05_desc(a_desc), 128, d.k, 16, d.a_major)
        _accumulate(tmem, d_taddr, half, numerics.values(a, d.atype) * (-1.0 if d.negate_a else 1.0), bv,
                    enable_input_d, op)


def cp_32x128b_warpx4(tmem: Tmem, smem: np.ndarray, taddr: int, src_desc: int, *, window_base: int = 0) -> None:
    """``tcgen05.cp.cta_group::1.32x128b.warpx4 [taddr], s-desc``."""
    lane, col = split_taddr(taddr)
    if lane % 32:
        raise IsaError(f"tcgen05.cp.32x128b.warpx4: address {taddr:#x} lane {lane} is not 0 in its partition")
    rows = read_operand(smem, decode_tcgen05_desc(src_desc), 32, 4, 32, "k", window_base=window_base)
    tmem.write(0, col, np.tile(rows, (4, 1)), "tcgen05.cp.32x128b.warpx4")


LDST_SHAPES = ("32x32b", "16x32bx2")


def ldst_cells(shape: str, taddr: int, warp_id: int, num: int, half_split: int | None = None):
    """(lanes, columns), each (32 threads, num registers): the cell of register ``i`` of thread ``t`` for
    ``tcgen05.{ld,st}.sync.aligned.<shape>.x{num}.b32`` by warp ``warp_id`` at ``taddr`` (module docstring);
    ``half_split`` is the ``.16x32bx2`` immHalfSplitoff operand."""
    op = f"tcgen05.ld/st.{shape}.x{num}"
    if num not in (1, 2, 4, 8, 16, 32, 64, 128):
        raise IsaError(f"{op}: .num must be a power of 2 in 1..128")
    lane, col = split_taddr(taddr)
    part = 32 * (warp_id % 4)
    t = np.arange(32)[:, None]
    i = np.arange(num)[None, :]
    if shape == "32x32b":
        if half_split is not None:
            raise IsaError(f"{op}: immHalfSplitoff is an operand of .16x32bx2 only")
        if lane != part:
            raise IsaError(f"{op} by warp {warp_id}: lane {lane} is outside its lanes {part}..{part + 31} "
                           "(or not the partition's first lane)")
        return np.broadcast_to(lane + t, (32, num)), np.broadcast_to(col + i, (32, num))
    if shape == "16x32bx2":
        if half_split is None:
            raise IsaError(f"{op}: .16x32bx2 needs the immHalfSplitoff operand")
        if not (part <= lane and lane + 16 <= part + 32):
            raise IsaError(f"{op} by warp {warp_id}: lanes {lane}..{lane + 15} are outside its lanes "
                           f"{part}..{part + 31}")
        if abs(int(half_split)) < num:
            raise IsaError(f"{op}: immHalfSplitoff {half_split} makes the two halves' {num} columns overlap")
        lanes = lane + t % 16
        cols = col + i + np.where(t >= 16, int(half_split), 0)
        return np.broadcast_to(lanes, (32, num)), cols
    raise IsaError(f"tcgen05.ld/st: shape .{shape} is not modelled ({', '.join(LDST_SHAPES)})")


def _cells_in_range(lanes, cols, op, where):
    if (cols < 0).any() or (cols >= COLUMNS).any():
        raise IsaError(f"{op} on {where}: columns {int(cols.min())}..{int(cols.max())} outside tensor memory "
                       f"({LANES} x {COLUMNS})")


def ld(tmem: Tmem, shape: str, taddr: int, warp_id: int, num: int, half_split: int | None = None) -> np.ndarray:
    """``tcgen05.ld.sync.aligned.<shape>.x{num}.b32``: the (32 threads, num) registers of warp ``warp_id``."""
    op = f"tcgen05.ld.{shape}.x{num} (warp {warp_id})"
    lanes, cols = ldst_cells(shape, taddr, warp_id, num, half_split)
    _cells_in_range(lanes, cols, op, tmem.where)
    ok = tmem.written[lanes, cols]
    if not ok.all():
        t, r = np.argwhere(~ok)[0]
        raise IsaError(f"{op} on {tmem.where} reads tensor memory lane {lanes[t, r]}, column {cols[t, r]} "
                       "that nothing wrote")
    return tmem.cells[lanes, cols].copy()


def st(tmem: Tmem, shape: str, taddr: int, warp_id: int, values: np.ndarray, half_split: int | None = None) -> None:
    """``tcgen05.st.sync.aligned.<shape>.x{num}.b32``: warp ``warp_id``'s (32 threads, num) registers."""
    v = np.asarray(values, dtype=np.uint32)
    num = v.shape[1]
    op = f"tcgen05.st.{shape}.x{num} (warp {warp_id})"
    lanes, cols = ldst_cells(shape, taddr, warp_id, num, half_split)
    _cells_in_range(lanes, cols, op, tmem.where)
    tmem.cells[lanes, cols] = v
    tmem.written[lanes, cols] = True


def ld_32x32b(tmem: Tmem, taddr: int, warp_id: int, num: int) -> np.ndarray:
    """``tcgen05.ld.sync.aligned.32x32b.x{num}.b32``: the (32 threads, num) registers of warp ``warp_id``."""
    return ld(tmem, "32x32b", taddr, warp_id, num)


@dataclass
class Tcgen05Pipe:
    """The asynchronous tcgen05 operations (mma, cp) one thread issued and has not committed yet."""

    pending: list = field(default_factory=list)

    def issue(self, run: Callable[[], None]) -> None:
        self.pending.append(run)

    def commit(self, arrive: Callable[[], None]) -> None:
        """``tcgen05.commit ... mbarrier::arrive::one``: complete every issued operation in order, then arrive
        (for ``.multicast::cluster`` the caller's ``arrive`` arrives on every CTA in the mask)."""
        ops, self.pending = self.pending, []
        for run in ops:
            run()
        arrive()
