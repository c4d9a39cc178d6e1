"""Config space and validity rule of the sm_120a / sm_121a NVFP4 W4A4 decode kernel; pure Python.

The kernel (:mod:`.kernel`) is a swap-AB decode GEMM on the warp-level block-scaled tensor core
instruction of consumer Blackwell, ``mma.sync.aligned.m16n8k64 .kind::mxf4nvf4.block_scale
.scale_vec::4X`` (E2M1 x E2M1, ue4m3 scales per 16 K elements, fp32 accumulators): weight rows are
the MMA's 16-row A operand, tokens its 8-column B operand. Fields:

    tile_m     tokens per CTA: 8 | 16 | 32 (groups of 8 = the MMA's N); M > tile_m adds M tiles
               that re-read the weights
    tile_n     weight rows per CTA = 16 x row tiles per warp (1, 2 or 4) x num_warps
    tile_k     K elements per pipeline stage = 64 x slabs per stage (2 or 4); one slab is one MMA's K
    num_warps  1, 2, 4 or 8 warps, each owning its row tiles for the CTA's whole K range
    stages     cp.async ring depth, 2..6 (stages - 1 loads in flight ahead of the math)
    split_k    CTAs along K (whole stages each; the last split may be shorter or empty); the last CTA
               of a tile sums the fp32 partials in split order (deterministic) and runs the epilogue
    pdl        programmatic dependent launch: weights stream before ``griddepcontrol.wait``

Budgets (sm_120a and sm_121a alike): at most 99 KB (101376 bytes) of dynamic shared memory per
block -- CuTeDSL's own ``SMEM_CAPACITY_MAP`` for ``sm_120`` / ``sm_121`` (100 KB per SM less 1 KB
the system reserves per block) -- and no thread-block clusters beyond 1x1x1 (NVIDIA's CuTeDSL
GeForce block-scaled GEMM example requires a 1x1 cluster), so the config has no cluster field.
fp32 accumulators: at most 32 registers per thread (row tiles x token groups x 4).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nvgemm.core.status import Status

SM120_ARCHS = ("sm_120a", "sm_121a")
TEMPLATE_ID = "sm120_nvfp4_gemm"

#: K elements of one MMA (``m16n8k64``): one slab = 32 bytes of packed E2M1 per row, 4 block scales.
SLAB = 64
#: Weight rows per MMA tile (the MMA's M).
ROW_TILE = 16
#: Tokens per MMA (the MMA's N).
TOKEN_GROUP = 8
#: Bytes of padding after each staged row: rows of ``tile_k / 2 + 16`` bytes make every 8-row
#: ``ldmatrix`` phase hit 8 distinct 16-byte bank groups.
ROW_PAD = 16

TILE_M = (8, 16, 32)
ROW_TILES = (1, 2, 4)
SLABS_PER_STAGE = (2, 4)
STAGES = (2, 3, 4, 5, 6)
WARPS = (1, 2, 4, 8)
#: Dynamic shared memory per block on sm_120 / sm_121: CuTeDSL ``cutlass_dsl.SMEM_CAPACITY_MAP``
#: (``(100 - 1) * 1024``), the CUDA limit for compute capability 12.x.
SMEM_CAPACITY = 99 * 1024
#: What the ring may use: the capacity less the split-K flag word and the allocator's alignment slack.
SMEM_LIMIT = SMEM_CAPACITY - 256
#: fp32 accumulator registers per thread allowed (row tiles x token groups x 4): with the A / B
#: fragments and the copy pointers this keeps the kernel under 128 registers (no spills; the
#: compile test reads the SASS).
MAX_ACC_REGS = 32


@dataclass(frozen=True)
class Sm120W4A4Config:
    tile_m: int = 8
    tile_n: int = 128
    tile_k: int = 256
    split_k: int = 1
    num_warps: int = 4
    stages: int = 4
    pdl: bool = False

    def name(self) -> str:
        s = f"nvgemm_cutedsl_sm120_w4a4_t{self.tile_m}x{self.tile_n}x{self.tile_k}_w{self.num_warps}_s{self.stages}"
        if self.split_k > 1:
            s += f"_sk{self.split_k}"
        if self.pdl:
            s += "_pdl"
        return s

    @property
    def threads(self) -> int:
        return 32 * self.num_warps

    @property
    def row_tiles(self) -> int:
        """16-row weight tiles per warp."""
        return self.tile_n // (ROW_TILE * self.num_warps)

    @property
    def slabs(self) -> int:
        """64-deep MMA slabs per pipeline stage."""
        return self.tile_k // SLAB

    @property
    def m_groups(self) -> int:
        """Groups of 8 tokens per CTA (one MMA N each)."""
        return self.tile_m // TOKEN_GROUP


def stage_bytes(c: Sm120W4A4Config) -> dict:
    """Shared-memory bytes of one pipeline stage, by operand: weight rows and activation rows of
    ``tile_k / 2 + 16`` bytes, one 4-byte scale word (4 ue4m3 block scales) per row and slab."""
    row = c.tile_k // 2 + ROW_PAD
    return {"weights": c.tile_n * row, "weight_scales": c.tile_n * c.slabs * 4,
            "x": c.tile_m * row, "x_scales": c.tile_m * c.slabs * 4}


def smem_bytes(c: Sm120W4A4Config) -> int:
    """Shared memory of one CTA: the ring plus the split-K flag word."""
    return c.stages * sum(stage_bytes(c).values()) + 16


def validate_config(c: Sm120W4A4Config) -> Status:
    """The one validity rule of the config alone (heuristics, template, runtime and tests use it)."""
    if c.tile_m not in TILE_M:
        return Status.fail(f"tile_m={c.tile_m} not in {TILE_M} (groups of 8 tokens: the MMA's N)")
    if c.num_warps not in WARPS:
        return Status.fail(f"num_warps={c.num_warps} not in {WARPS}")
    if c.tile_n % (ROW_TILE * c.num_warps) or c.row_tiles not in ROW_TILES:
        return Status.fail(f"tile_n={c.tile_n} must be 16 x row tiles per warp {ROW_TILES} x num_warps={c.num_warps}")
    if c.tile_k % SLAB or c.slabs not in SLABS_PER_STAGE:
        return Status.fail(f"tile_k={c.tile_k} must be 64 x slabs per stage {SLABS_PER_STAGE}")
    if c.stages not in STAGES:
        return Status.fail(f"stages={c.stages} not in {STAGES} (cp.async ring depth)")
    if c.split_k < 1:
        return Status.fail(f"split_k={c.split_k} must be >= 1")
    acc = c.row_tiles * c.m_groups * 4
    if acc > MAX_ACC_REGS:
        return Status.fail(f"tile_m={c.tile_m} x {c.row_tiles} row tiles per warp needs {acc} fp32 accumulator "
                           f"registers per thread (> {MAX_ACC_REGS})")
    smem = smem_bytes(c)
    if smem > SMEM_LIMIT:
        return Status.fail(f"config needs {smem} bytes of shared memory; sm_120a / sm_121a give a block at most "
                           f"{SMEM_CAPACITY} (99 KB), {SMEM_LIMIT} for the ring")
    return Status.success()


def k_stages(k: int, tile_k: int) -> int:
    """Pipeline stages covering K (the last one may be partial: predicated copies)."""
    return -(-k // tile_k)


_NAME_RE = re.compile(r"nvgemm_cutedsl_sm120_w4a4_t(\d+)x(\d+)x(\d+)_w(\d+)_s(\d+)(?:_sk(\d+))?(_pdl)?")


def config_from_name(name: str) -> Sm120W4A4Config:
    """Inverse of :meth:`Sm120W4A4Config.name`."""
    m = _NAME_RE.fullmatch(name)
    if m is None:
        raise ValueError(f"not an sm120 W4A4 config name: {name!r}")
    tm, tn, tk, nw, st, sk, pdl = m.groups()
    return Sm120W4A4Config(tile_m=int(tm), tile_n=int(tn), tile_k=int(tk), split_k=int(sk or 1), num_warps=int(nw),
                           stages=int(st), pdl=bool(pdl))


__all__ = ["MAX_ACC_REGS", "ROW_PAD", "ROW_TILE", "SLAB", "SLABS_PER_STAGE", "SM120_ARCHS", "SMEM_CAPACITY",
           "SMEM_LIMIT", "STAGES", "TEMPLATE_ID", "TILE_M", "TOKEN_GROUP", "WARPS", "ROW_TILES", "Sm120W4A4Config",
           "config_from_name", "k_stages", "smem_bytes", "stage_bytes", "validate_config"]
