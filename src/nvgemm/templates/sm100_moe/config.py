"""Config space and validity rule of the sm_100a grouped W4A4 MoE kernel (``"moe_tcgen05"``); pure Python.

The grouped kernel (:mod:`.kernel`) is the swap-AB decode kernel of :mod:`nvgemm.templates.sm100_w4a4`
(weights on the 128-row MMA M side, tokens on the MMA N side, block-scaled ``tcgen05.mma``, TMA,
deterministic split-K, the fused SwiGLU + NVFP4 requant epilogue) run over a **work list**: the N
tile ``j`` of the grouped GEMM is work slot ``j`` = ``(expert, first permuted pair, pairs <= tile_n)``
of :func:`nvgemm.templates.sm90_moe.launch.build_work_list` (tile_m there = tile_n here). Fields:

    tile_n   tokens (routed pairs) per work slot = the MMA N: 8 | 16 | 32 | 64
    split_k  CTAs along K per (row tile, slot); fp32 partials summed in split order
    pdl      programmatic dependent launch; every warp waits (``griddepcontrol.wait``) before it
             reads the work list (the expert of a slot comes from the routing)
    finalize GEMM2 only: the kernel also runs the top-k finalize (its fp32 rows ``y`` are scratch;
             the last CTA of each row tile sums every token's slots in slot order, adds shared_out /
             residual and rounds once into the epilogue's out_dtype)
    early_weights  GEMM2 only (needs ``pdl``): the work list is final before the kernel's
             ``griddepcontrol.wait`` (written by a grid that completed before GEMM1's wait returned), so
             the TMA warp reads its first work slot and TMA-loads that expert's first weight and
             weight-scale K tiles into the smem ring before the wait (:mod:`.kernel`)
    prefetch_next  GEMM1 only (name suffix ``_pf2``): after its own last weight load is issued, GEMM1's
             TMA warp L2-prefetches GEMM2's weight and weight-scale tiles of the experts in its work
             slots (every GEMM2 row tile x K tile of each routed expert once, spread over the work units
             of the expert's first slot), so GEMM2's weights stream into L2 while GEMM1 drains and
             GEMM2 launches; the launcher passes GEMM2's stacked weights to GEMM1 (:mod:`.kernel`)

Fixed: 1-CTA 128-row tiles, cluster 1x1, tile_k 256. Per expert the weight rows are padded to a
multiple of 128 in the stack (a 128-row A tile never straddles two experts, and the stacked block
scales are the 2-D 128x4 swizzle of ``[E * rows_padded, K / 16]``); the token side keeps one whole
128-row SFB atom per work slot (the slot's rows are rows 0..tile_n-1 of atom ``j``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig, validate_config as _validate_dense
from nvgemm.templates.sm90_moe.config import work_tiles_bound
from nvgemm.core.status import Status

MOE_FAMILY = "moe_tcgen05"
#: Routed pairs (tokens x top_k) up to which the host prep is one Triton launch (:mod:`.prep_triton`
#: recomputes the work list in every program); above it the work-list kernel runs first and a gather
#: follows. 128 = 16 tokens at top-8.
FUSED_PREP_MAX_PAIRS = 128
MOE_ARCHS = ("sm_100a",)
MOE_TILE_N = (8, 16, 32, 64)
MOE_SPLIT_K = (1, 2, 4, 8)
ROW_ALIGN = 128  # weight rows per expert are padded to this in the stack (one MMA tile)


@dataclass(frozen=True)
class Sm100MoeConfig:
    tile_n: int = 8
    split_k: int = 1
    pdl: bool = True
    finalize: bool = False
    early_weights: bool = False
    prefetch_next: bool = False

    family = MOE_FAMILY  # class attribute (not a field)
    tile_m = 128
    cluster_m = 1
    cluster_n = 1
    swap_ab = True

    def name(self) -> str:
        s = f"nvgemm_cutedsl_sm100_moe_t128x{self.tile_n}x256"
        if self.split_k > 1:
            s += f"_sk{self.split_k}"
        if self.pdl:
            s += "_pdl"
        if self.finalize:
            s += "_fin"
        if self.early_weights:
            s += "_ew"
        if self.prefetch_next:
            s += "_pf2"
        return s

    def dense(self) -> Sm100Nvfp4GemmConfig:
        """The dense swap-AB config with the same tile, split-K and PDL (the kernel's inner loop)."""
        return Sm100Nvfp4GemmConfig(tile_m=128, tile_n=self.tile_n, swap_ab=True, split_k=self.split_k, pdl=self.pdl)


def validate_moe_config(c: Sm100MoeConfig) -> Status:
    """The one validity rule of grouped sm100 MoE configs (policy, template, runtime, tests)."""
    if not isinstance(c, Sm100MoeConfig):
        return Status.fail(f"expects Sm100MoeConfig, got {type(c).__name__}")
    if c.tile_n not in MOE_TILE_N:
        return Status.fail(f"moe tile_n={c.tile_n} not in {MOE_TILE_N} (tokens per work slot)")
    if c.split_k not in MOE_SPLIT_K:
        return Status.fail(f"moe split_k={c.split_k} not in {MOE_SPLIT_K}")
    if c.early_weights and not c.pdl:
        return Status.fail("moe early_weights (weight loads before griddepcontrol.wait) needs pdl=True")
    if c.prefetch_next and (c.finalize or c.early_weights):
        return Status.fail("moe prefetch_next (GEMM1 L2-prefetches GEMM2's weights) is GEMM1's: it cannot combine with "
                           "GEMM2's finalize / early_weights (GEMM2 has no next GEMM)")
    return _validate_dense(c.dense())


def padded_rows(rows: int) -> int:
    """Weight rows per expert in the stack (a multiple of 128)."""
    return -(-rows // ROW_ALIGN) * ROW_ALIGN


def moe_shape_problem(c: Sm100MoeConfig, rows: int, k: int, gated: bool) -> str | None:
    """Why ``c`` cannot run one grouped GEMM with ``rows`` weight rows per expert (gate + up for
    gated GEMM1) and reduction ``k`` (None: it can)."""
    if k % 32:
        return f"K={k} is not a multiple of 32 (16-byte TMA rows of packed FP4)"
    if gated and (rows % 2 or (rows // 2) % 32):
        return f"silu_mul with the fused NVFP4 requant needs I = {rows // 2} to be a multiple of 32 (whole " \
               f"16-blocks per warp and 16-byte rows of GEMM2's packed input)"
    if gated and c.split_k >= 8 and c.tile_n >= 32:
        return f"split_k={c.split_k} with tile_n={c.tile_n} and the fused requant epilogue spills registers (2 LDL/STL " \
               f"in SASS: the split-K reduction's vectors in flight on top of the requant; the dense kernel alike)"
    if not gated and rows % 4:
        return f"{rows} output rows per expert is not a multiple of 4 (16-byte fp32 output rows)"
    ktiles = -(-k // 256)
    if c.split_k > ktiles:
        return f"split_k={c.split_k} exceeds the {ktiles} K tiles of 256 in K={k}"
    return None


_NAME_RE = re.compile(r"nvgemm_cutedsl_sm100_moe_t128x(\d+)x256(?:_sk(\d+))?(_pdl)?(_fin)?(_ew)?(_pf2)?")


def moe_config_from_name(name: str) -> Sm100MoeConfig:
    """Inverse of :meth:`Sm100MoeConfig.name`."""
    m = _NAME_RE.fullmatch(name)
    if m is None:
        raise ValueError(f"not an sm100 MoE config name: {name!r}")
    tn, sk, pdl, fin, ew, pf2 = m.groups()
    return Sm100MoeConfig(tile_n=int(tn), split_k=int(sk or 1), pdl=bool(pdl), finalize=bool(fin),
                          early_weights=bool(ew), prefetch_next=bool(pf2))


__all__ = ["MOE_ARCHS", "MOE_FAMILY", "MOE_SPLIT_K", "MOE_TILE_N", "ROW_ALIGN", "Sm100MoeConfig",
           "moe_config_from_name", "moe_shape_problem", "padded_rows", "validate_moe_config", "work_tiles_bound"]
