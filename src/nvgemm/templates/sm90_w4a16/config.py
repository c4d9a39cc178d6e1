"""Config space and validity rule of the sm_90a NVFP4 weight-only (W4A16) kernels; pure Python.

Two families, both reading the operand layout of :mod:`nvgemm.templates.sm90_w4a16.operand` (weights in
16-row tiles and 64-element K chunks, one 16-byte vector per lane already in mma.sync A-fragment
order; re-encoded block scales):

``"mma"`` (:mod:`.mma`) decode batches, M of 1..32 per CTA (larger M: more M tiles): the weight is
the 16-row A operand of ``mma.sync.m16n8k16`` (swap-AB), decoded in registers with an exact packed
decode (E2M1 bits placed in bf16/fp16 pairs, times the block scale in one packed multiply), the
activations are the B operand. A CTA-wide ``stages``-deep cp.async ring streams weights, scales
and activations. Fields:

    tile_m     tokens per CTA: 8 | 16 | 32 (groups of 8 = the MMA's N); M > tile_m adds M tiles
               that re-read the weights
    tile_n     weight rows per CTA = 16 x row tiles per warp (1, 2 or 4) x num_warps
    tile_k     K elements per pipeline stage = 64 x chunks per stage (2 or 4)
    num_warps  1, 2, 4 or 8 warps, each owning its row tiles for the CTA's whole K range
    stages     cp.async ring depth, 2..6 (stages - 1 loads in flight ahead of the math)
    split_k    CTAs along K; the last CTA of a tile sums the fp32 partials in split order
               (deterministic) and runs the epilogue
    pdl        programmatic dependent launch: weights stream before ``griddepcontrol.wait``

``"wgmma"`` (:mod:`.wgmma`) tens to hundreds of tokens per CTA: the same 16-row weight tiles,
decoded in registers exactly as ``mma`` does, are the **register A operand** of
``wgmma.mma_async.m64nNk16`` (swap-AB: weights are the 64-row M side of each warpgroup's MMA,
the CTA's tokens are N = ``tile_m``); the activations are the shared-memory B operand, K-major
with the 128-byte swizzle, copied in the operand's K order (4-byte ``cp.async`` pieces). The same
CTA-wide ``stages``-deep cp.async ring streams weights, scales and activations. Fields:

    tile_m     tokens per CTA = the WGMMA's N: 16, 24, .., 256 (multiples of 8); M tiles of one
               row block run side by side (M-fastest grid), so their weight reads share L2
    tile_n     weight rows per CTA = 64 x row blocks per warpgroup (1 or 2) x warpgroups
    tile_k     K per pipeline stage = 64 x chunks per stage (2 or 4)
    num_warps  4 or 8 (one or two warpgroups)
    stages     ring depth, 3..6 (``stages - 2`` stages in flight ahead of the math: the slot a
               refill overwrites was read by WGMMAs that completed one stage earlier)
    split_k    K split of the tiles of the last, partial wave only (stream-K-like; every tile when
               there are fewer tiles than SMs): the full waves run whole tiles, then each tail
               tile runs as ``split_k`` CTAs reduced in-kernel as ``mma`` does (deterministic)
    pdl        as ``mma``
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nvgemm.core.status import Status

SM90_FAMILIES = ("mma", "wgmma")
#: Archs of the ``wgmma`` family (``wgmma.mma_async`` is sm_90a only) and of the Hopper backend.
SM90_ARCHS = ("sm_90a",)
#: Archs the ``mma`` family compiles for: every instruction it issues (``cp.async`` with L2 cache
#: hints, ``createpolicy``, ``ld.shared``, ``mma.sync.m16n8k16`` bf16 / f16, ``shf`` / ``lop3`` /
#: ``prmt``, ``fence.acq_rel.gpu`` / ``atom.acq_rel.gpu``) exists from sm_80 on; two are sm_90+
#: (PTX ISA: ``griddepcontrol``, and ``mul{.rnd}.bf16x2``), see :data:`ARCH_CAPS`.
MMA_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_120a", "sm_121a")
#: Every arch a config of this folder compiles for.
ALL_ARCHS = MMA_ARCHS


@dataclass(frozen=True)
class ArchCaps:
    """What one target arch gives the ``mma`` kernel (PTX ISA target requirements, CUDA C++
    Programming Guide "Technical Specifications per Compute Capability").

    ``pdl``: ``griddepcontrol.{wait,launch_dependents}`` (sm_90+); without it a config must have
    ``pdl=False``. ``bf16_mul``: ``mul.rn.bf16x2`` (sm_90+); without it the bf16 scale multiply is
    ``fma.rn.bf16x2 d, a, b, -0.0`` (sm_80+), the same value bit for bit (``a * b + (-0)`` is
    ``a * b`` for every a, b, the sign of a zero product included, and the product is exact).
    ``smem_optin``: dynamic shared memory one CTA may opt into (bytes)."""

    pdl: bool
    bf16_mul: bool
    smem_optin: int


ARCH_CAPS = {
    "sm_80": ArchCaps(pdl=False, bf16_mul=False, smem_optin=163 * 1024),
    "sm_86": ArchCaps(pdl=False, bf16_mul=False, smem_optin=99 * 1024),
    "sm_89": ArchCaps(pdl=False, bf16_mul=False, smem_optin=99 * 1024),
    "sm_90a": ArchCaps(pdl=True, bf16_mul=True, smem_optin=227 * 1024),
    "sm_120a": ArchCaps(pdl=True, bf16_mul=True, smem_optin=99 * 1024),
    "sm_121a": ArchCaps(pdl=True, bf16_mul=True, smem_optin=99 * 1024),
}


def arch_problem(c: "Sm90W4A16Config", arch: str) -> str | None:
    """Why ``c`` cannot be compiled for ``arch`` (None: it can): the family's archs, PDL, and the
    arch's shared-memory limit (the config's own rule, :func:`validate_config`, is Hopper's)."""
    archs = MMA_ARCHS if c.family == "mma" else SM90_ARCHS
    if arch not in archs:
        return f"the {c.family} kernel targets {archs}, not {arch}"
    caps = ARCH_CAPS[arch]
    if c.pdl and not caps.pdl:
        return f"pdl=True needs griddepcontrol (sm_90+); {arch} has none"
    smem = mma_smem_bytes(c) if c.family == "mma" else wgmma_smem_bytes(c)
    if smem > caps.smem_optin - 1024:
        return f"{c.family} config needs {smem} bytes of shared memory (> {caps.smem_optin - 1024} on {arch})"
    return None

#: K elements of one weight chunk: a warp's 16-row tile x 64 K = 512 bytes, one 16-byte vector
#: per lane (rows g and g + 8, scale block q of the chunk).
CHUNK = 64
#: Weight rows per tile (the MMA's M).
ROW_TILE = 16
#: The prepared weight's K is padded to a multiple of this (4 chunks: the scale layout's group).
K_ALIGN = 4 * CHUNK
#: The decoded operand is ``E2M1 * s * 2**-7`` (bf16 and fp16 alike); the epilogue multiplies
#: the fp32 accumulator by 2**7 (exact).
DECODE_UNSCALE = 128.0

MMA_TILE_M = (8, 16, 32)
MMA_ROW_TILES = (1, 2, 4)
MMA_CHUNKS_PER_STAGE = (2, 4)
MMA_STAGES = (2, 3, 4, 5, 6)
MMA_WARPS = (1, 2, 4, 8)
#: Shared memory a CTA may use (227 KB opt-in on sm_90, less a reserve for the epilogue flags).
SMEM_LIMIT = 227 * 1024 - 1024
#: fp32 accumulator registers per thread the mma kernel allows (row tiles x groups of 8 x 4).
MMA_MAX_ACC_REGS = 32

#: WGMMA N (tokens per CTA) of the wgmma family: every multiple of 8 (the WGMMA's N granularity)
#: from 16 to 256, so one to four M tiles side by side cover any M up to 1024 with the least padding.
WGMMA_TILE_M = tuple(range(16, 257, 8))
#: wgmma shapes the candidate policy (and the performance model's table) use, before tile_m and
#: split-K: (tile_n, num_warps, tile_k, stages) -- two warpgroups of two row blocks (256 rows;
#: tile_m <= 128), of one (128 rows; a 3-stage ring for the largest tile_m), and one warpgroup of
#: two row blocks. Combinations that do not fit (accumulators, shared memory) are skipped.
WGMMA_SHAPES = ((256, 8, 128, 4), (256, 8, 256, 3), (128, 8, 128, 4), (128, 8, 128, 3), (128, 4, 128, 4))
#: 64-row WGMMA row blocks per warpgroup (= 16-row tiles per warp).
WGMMA_ROW_BLOCKS = (1, 2)
WGMMA_WARPS = (4, 8)
WGMMA_CHUNKS_PER_STAGE = (2, 4)
WGMMA_STAGES = (3, 4, 5, 6)
#: fp32 accumulator registers per thread the wgmma kernel allows (row blocks x tile_m / 2).
WGMMA_MAX_ACC_REGS = 128
#: The activation tile of one 64-deep chunk is ``tile_m`` rows of 128 bytes in 1024-byte swizzle
#: atoms; stage offsets keep that alignment.
SWIZZLE_ATOM = 1024


@dataclass(frozen=True)
class Sm90W4A16Config:
    family: str = "mma"
    tile_m: int = 8  # tokens per CTA: mma 8 | 16 | 32; wgmma 16 .. 256 (the WGMMA's N)
    tile_n: int = 128  # weight rows (GEMM output columns) per CTA
    tile_k: int = 128  # K per pipeline stage (64 x chunks)
    split_k: int = 1
    num_warps: int = 4
    stages: int = 4
    pdl: bool = False

    def __hash__(self) -> int:
        """The dataclass hash (of the field tuple), computed once per object: the candidate policy
        looks configs up in several memos per call. Not pickled (``__getstate__``): str hashes
        differ between processes."""
        try:
            return self.__dict__["_hash"]
        except KeyError:
            h = hash((self.family, self.tile_m, self.tile_n, self.tile_k, self.split_k, self.num_warps, self.stages,
                      self.pdl))
            object.__setattr__(self, "_hash", h)
            return h

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def name(self) -> str:
        s = (
            f"nvgemm_cutedsl_sm90_w4a16_{self.family}_t{self.tile_m}x{self.tile_n}x{self.tile_k}"
            f"_w{self.num_warps}_s{self.stages}"
        )
        if self.split_k > 1:
            s += f"_sk{self.split_k}"
        if self.pdl:
            s += "_pdl"
        return s

    @property
    def threads(self) -> int:
        return 32 * self.num_warps

    # --- geometry (both families: each warp owns ``row_tiles`` 16-row tiles of the CTA's rows)
    @property
    def row_tiles(self) -> int:
        """16-row weight tiles per warp (wgmma: 64-row blocks per warpgroup)."""
        return self.tile_n // (ROW_TILE * self.num_warps)

    @property
    def chunks_per_stage(self) -> int:
        """64-element K chunks per pipeline stage."""
        return self.tile_k // CHUNK

    @property
    def m_groups(self) -> int:
        """Groups of 8 tokens per CTA (mma: one MMA N each; wgmma: columns of the accumulator)."""
        return self.tile_m // 8


def mma_stage_bytes(c: Sm90W4A16Config) -> dict:
    """Shared-memory bytes of one mma pipeline stage, by operand (weights, scales, activations).

    Activations are staged as ``tile_m`` rows of ``tile_k`` bf16/fp16 values with 16 bytes of
    padding per row (conflict-free 16-byte fragment loads)."""
    w = c.num_warps * c.row_tiles * c.chunks_per_stage * 512
    s = c.num_warps * c.row_tiles * 32 * 2 * c.chunks_per_stage
    x = c.tile_m * (2 * c.tile_k + 16)
    return {"weights": w, "scales": s, "x": x}


def mma_smem_bytes(c: Sm90W4A16Config) -> int:
    """Shared memory of one mma CTA: the ring plus the split-K flag word."""
    return c.stages * sum(mma_stage_bytes(c).values()) + 16


def _align(v: int, a: int) -> int:
    return -(-v // a) * a


def wgmma_stage_bytes(c: Sm90W4A16Config) -> dict:
    """Shared-memory bytes of one wgmma pipeline stage, by operand: the weight vectors and scale
    words (as ``mma``: each lane's own), padding to the 1024-byte swizzle atom, and the activations
    (``chunks`` x ``tile_m`` rows x 128 bytes, the WGMMA B operand)."""
    w = c.num_warps * c.row_tiles * c.chunks_per_stage * 512
    s = c.num_warps * c.row_tiles * 32 * 2 * c.chunks_per_stage
    pad = _align(w + s, SWIZZLE_ATOM) - (w + s)
    x = c.chunks_per_stage * c.tile_m * 128
    return {"weights": w, "scales": s, "pad": pad, "x": x}


def wgmma_smem_bytes(c: Sm90W4A16Config) -> int:
    """Shared memory of one wgmma CTA, exactly what its launch requests: the ring plus the split-K flag
    word. The ring needs its 1024-byte swizzle alignment but no slack for it: it is the first allocation
    of the dynamic window, which the PTX declares ``.extern .shared .align 1024`` (no static shared
    memory precedes it). The emulator's launch recorder checks the equality
    (tests/emulator/test_launch_recorder.py)."""
    return c.stages * sum(wgmma_stage_bytes(c).values()) + 16


def wgmma_tail_tiles(tiles, split_k: int, sm_count: int, select=None):
    """Tiles the wgmma kernel splits in K (``split_k`` CTAs each) for a grid of ``tiles`` output
    tiles on ``sm_count`` SMs: none without split-K, else the tiles of the last, partial wave
    (``tiles mod sm_count``; every tile when there are fewer than the SMs). The kernel's host code
    evaluates it on DSL integers (``select`` as in :func:`wgmma_cta_role`), the model on ints; the
    kernel recovers it from its grid (``(grid - tiles) / (split_k - 1)``)."""
    if split_k <= 1:
        return 0
    sel = select or (lambda c, a, b: a if c else b)
    return sel(tiles < sm_count, tiles, tiles % sm_count)


def wgmma_cta_role(cta, tiles, tail, split_k, select=None):
    """What CTA ``cta`` of the wgmma grid computes: ``(tile, part, reduce)``. The grid runs the
    ``tiles - tail`` whole tiles first (CTA i = tile i; tiles in M-fastest order), then the
    ``tail`` last tiles as ``split_k`` adjacent CTAs each (part ``p`` of ``split_k`` of the tile's
    K stages; ``reduce`` true: its fp32 partials are summed in-kernel). Plain integer arithmetic
    (``select(c, a, b)``: ``a if c else b``) so the kernel evaluates it on DSL integers with
    ``cutlass.select_`` and the tests on Python ints."""
    sel = select or (lambda c, a, b: a if c else b)
    n_whole = tiles - tail
    is_tail = cta >= n_whole
    j = sel(is_tail, cta - n_whole, 0)
    tile = sel(is_tail, n_whole + j // split_k, cta)
    part = sel(is_tail, j % split_k, 0)
    return tile, part, is_tail


def _validate_mma(c: Sm90W4A16Config) -> Status:
    if c.tile_m not in MMA_TILE_M:
        return Status.fail(f"mma tile_m={c.tile_m} not in {MMA_TILE_M} (groups of 8 tokens)")
    if c.num_warps not in MMA_WARPS:
        return Status.fail(f"mma num_warps={c.num_warps} not in {MMA_WARPS}")
    if c.tile_n % (ROW_TILE * c.num_warps) or c.row_tiles not in MMA_ROW_TILES:
        return Status.fail(
            f"mma tile_n={c.tile_n} must be 16 x row tiles per warp {MMA_ROW_TILES} x num_warps={c.num_warps}"
        )
    if c.tile_k % CHUNK or c.chunks_per_stage not in MMA_CHUNKS_PER_STAGE:
        return Status.fail(f"mma tile_k={c.tile_k} must be 64 x chunks per stage {MMA_CHUNKS_PER_STAGE}")
    if c.stages not in MMA_STAGES:
        return Status.fail(f"mma stages={c.stages} not in {MMA_STAGES} (cp.async ring depth)")
    acc = c.row_tiles * c.m_groups * 4
    if acc > MMA_MAX_ACC_REGS:
        return Status.fail(
            f"mma tile_m={c.tile_m} x {c.row_tiles} row tiles per warp needs {acc} fp32 accumulator registers "
            f"per thread (> {MMA_MAX_ACC_REGS})"
        )
    smem = mma_smem_bytes(c)
    if smem > SMEM_LIMIT:
        return Status.fail(f"mma config needs {smem} bytes of shared memory (> {SMEM_LIMIT})")
    return Status.success()


def _validate_wgmma(c: Sm90W4A16Config) -> Status:
    if c.tile_m not in WGMMA_TILE_M:
        return Status.fail(f"wgmma tile_m={c.tile_m} not in {WGMMA_TILE_M} (the WGMMA's N: tokens per CTA)")
    if c.num_warps not in WGMMA_WARPS:
        return Status.fail(f"wgmma num_warps={c.num_warps} not in {WGMMA_WARPS} (one or two warpgroups)")
    if c.tile_n % (ROW_TILE * c.num_warps) or c.row_tiles not in WGMMA_ROW_BLOCKS:
        return Status.fail(
            f"wgmma tile_n={c.tile_n} must be 64 x row blocks per warpgroup {WGMMA_ROW_BLOCKS} x warpgroups "
            f"({c.num_warps // 4})")
    if c.tile_k % CHUNK or c.chunks_per_stage not in WGMMA_CHUNKS_PER_STAGE:
        return Status.fail(f"wgmma tile_k={c.tile_k} must be 64 x chunks per stage {WGMMA_CHUNKS_PER_STAGE}")
    if c.stages not in WGMMA_STAGES:
        return Status.fail(f"wgmma stages={c.stages} not in {WGMMA_STAGES} (cp.async ring depth; stages - 2 ahead)")
    acc = c.row_tiles * c.tile_m // 2
    if acc > WGMMA_MAX_ACC_REGS:
        return Status.fail(
            f"wgmma tile_m={c.tile_m} x {c.row_tiles} row blocks per warpgroup needs {acc} fp32 accumulator "
            f"registers per thread (> {WGMMA_MAX_ACC_REGS})")
    smem = wgmma_smem_bytes(c)
    if smem > SMEM_LIMIT:
        return Status.fail(f"wgmma config needs {smem} bytes of shared memory (> {SMEM_LIMIT})")
    return Status.success()


_NAME_RE = re.compile(r"nvgemm_cutedsl_sm90_w4a16_([a-z]+)_t(\d+)x(\d+)x(\d+)_w(\d+)_s(\d+)(?:_sk(\d+))?(_pdl)?")


def config_from_name(name: str) -> Sm90W4A16Config:
    """Inverse of :meth:`Sm90W4A16Config.name` (autotuned code names its kernel config)."""
    m = _NAME_RE.fullmatch(name)
    if m is None:
        raise ValueError(f"not an sm90 W4A16 config name: {name!r}")
    fam, tm, tn, tk, nw, st, sk, pdl = m.groups()
    return Sm90W4A16Config(family=fam, tile_m=int(tm), tile_n=int(tn), tile_k=int(tk), split_k=int(sk or 1),
                           num_warps=int(nw), stages=int(st), pdl=bool(pdl))


def template_id_of(c: Sm90W4A16Config) -> str:
    """The AOT template that compiles ``c``: one per kernel (``sm90_w4a16_mma`` / ``sm90_w4a16_wgmma``)."""
    return f"sm90_w4a16_{c.family}"


def validate_config(c: Sm90W4A16Config) -> Status:
    """The one validity rule of sm90 configs (heuristics, templates, runtime and tests use it)."""
    if c.family not in SM90_FAMILIES:
        return Status.fail(f"family={c.family!r} not in {SM90_FAMILIES}")
    if c.split_k < 1:
        return Status.fail(f"split_k={c.split_k} must be >= 1")
    if c.family == "mma":
        return _validate_mma(c)
    return _validate_wgmma(c)


def shape_problem(c: Sm90W4A16Config, m: int, n: int, k: int, gated: bool = False) -> str | None:
    """Why ``c`` cannot run an (M, N, K) problem (None: it can). K is the layer's K (the prepared
    weight pads it to a multiple of 256); N the weight rows (gate + up for a gated layer)."""
    if k % 32:
        return f"K={k} is not a multiple of 32 (16-byte rows of packed FP4)"
    if gated and (n % 2 or (n // 2) % ROW_TILE):
        return f"silu_mul needs N/2 = {n // 2} to be a multiple of {ROW_TILE} (whole gate and up row tiles)"
    if c.family == "mma" and gated and c.row_tiles % 2:
        return f"silu_mul needs an even number of row tiles per warp (gate + up), got {c.row_tiles}"
    if c.family == "wgmma" and gated and c.row_tiles % 2:
        return f"silu_mul needs two row blocks per warpgroup (gate + up), got {c.row_tiles}"
    if c.family in SM90_FAMILIES:
        nstage = -(-k // K_ALIGN) * (K_ALIGN // c.tile_k)
        if c.split_k > nstage:
            return f"split_k={c.split_k} exceeds the {nstage} pipeline stages of K={k}"
    return None


__all__ = [
    "CHUNK",
    "DECODE_UNSCALE",
    "K_ALIGN",
    "MMA_CHUNKS_PER_STAGE",
    "MMA_ROW_TILES",
    "MMA_STAGES",
    "MMA_TILE_M",
    "MMA_WARPS",
    "ROW_TILE",
    "SWIZZLE_ATOM",
    "WGMMA_CHUNKS_PER_STAGE",
    "WGMMA_ROW_BLOCKS",
    "WGMMA_SHAPES",
    "WGMMA_STAGES",
    "WGMMA_TILE_M",
    "WGMMA_WARPS",
    "ALL_ARCHS",
    "ARCH_CAPS",
    "ArchCaps",
    "MMA_ARCHS",
    "SM90_ARCHS",
    "SM90_FAMILIES",
    "arch_problem",
    "Sm90W4A16Config",
    "config_from_name",
    "mma_smem_bytes",
    "mma_stage_bytes",
    "shape_problem",
    "template_id_of",
    "validate_config",
    "wgmma_smem_bytes",
    "wgmma_stage_bytes",
    "wgmma_cta_role",
    "wgmma_tail_tiles",
]
