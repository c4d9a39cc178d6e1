"""Config space and validity rule of the sm_90a grouped MoE kernel (``"moe_mma"``); pure Python.

The grouped kernel (:mod:`.kernel`) is the ``mma`` decode kernel of :mod:`nvgemm.templates.sm90_w4a16`
(weights as the 16-row A operand of ``mma.sync.m16n8k16``, exact packed decode, cp.async ring,
deterministic split-K) run over a **work list** instead of a dense M range: grid z enumerates work
tiles ``(expert, first permuted row, rows)``, each holding up to ``tile_m`` (token, slot) pairs
routed to one expert. A tile's weights are the expert's rows of the stacked prepared weight (row
tile offset ``expert x tiles per expert``), its activation rows are gathered through a row table
(GEMM1: the token of each permuted pair; GEMM2: the identity), its alpha is the expert's (one
value, or one per row when an expert's gate/up ``weight_scale_2`` differ). Fields are those of
:class:`~nvgemm.templates.sm90_w4a16.config.Sm90W4A16Config` (family ``mma``):

    tile_m     pairs per work tile (tokens routed to one expert): 8 | 16 | 32
    tile_n     weight rows per CTA = 16 x row tiles per warp (1, 2, 4) x num_warps
    tile_k     K per pipeline stage = 64 x 2 | 4
    num_warps  1, 2, 4, 8
    stages     cp.async ring depth 2..6
    split_k    CTAs along K per (row block, work tile); fp32 partials summed in split order
    pdl        programmatic dependent launch: the CTA waits (``griddepcontrol.wait``) **before**
               reading the work list -- the expert of a tile comes from the routing -- so only the
               launch latency overlaps the previous kernel
    finalize   GEMM2 only: the top-k finalize runs in the kernel (the last CTA of each feature block
               sums the tokens' expert rows in slot order, adds shared_out / residual, rounds once)
    direct     one token: no work list, work slot j is routed pair j read from the ids (no prep launch)
    early_weights  GEMM2 only (needs ``pdl``): its routing (work list, or the ids with ``direct``) and row
               table are final before its ``griddepcontrol.wait`` (written by grids that completed before
               GEMM1's wait returned), so the CTA reads its work slot and issues the cp.async copies of the
               ring's first weight and scale stages before the wait; the activations (GEMM1's output)
               after it (:mod:`.kernel`)

The kernel itself is unchanged in its numerics from the dense ``mma`` kernel; the validity rule is
the dense one plus the work-list bounds (:func:`work_tiles_bound`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config, validate_config as _validate_dense
from nvgemm.core.status import Status

MOE_FAMILY = "moe_mma"
MOE_ARCHS = ("sm_90a",)
MOE_TILE_M = (8, 16, 32)


@dataclass(frozen=True)
class Sm90MoeConfig:
    tile_m: int = 8
    tile_n: int = 128
    tile_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    stages: int = 4
    pdl: bool = False
    #: GEMM2 only: the kernel also runs the top-k finalize (:class:`~.kernel.Sm90MoeMmaKernel`): the
    #: last CTA of each feature block sums every token's expert rows in slot order (no extra launch)
    finalize: bool = False
    #: one token: no work list -- slot j is pair j (expert ``ids[j]``, one row, -1: empty), read from the
    #: ids themselves (``mYRows``), so the call needs no prep launch
    direct: bool = False
    #: GEMM2 only: read the work slot and issue the first weight stages before ``griddepcontrol.wait``
    early_weights: bool = False

    family = MOE_FAMILY  # class attribute (not a field): one family

    def name(self) -> str:
        s = f"nvgemm_cutedsl_sm90_moe_mma_t{self.tile_m}x{self.tile_n}x{self.tile_k}_w{self.num_warps}_s{self.stages}"
        if self.split_k > 1:
            s += f"_sk{self.split_k}"
        if self.pdl:
            s += "_pdl"
        if self.finalize:
            s += "_fin"
        if self.direct:
            s += "_dir"
        if self.early_weights:
            s += "_ew"
        return s

    def dense(self) -> Sm90W4A16Config:
        """The dense ``mma`` config with the same tile and pipeline (the kernel's inner loop)."""
        return Sm90W4A16Config("mma", tile_m=self.tile_m, tile_n=self.tile_n, tile_k=self.tile_k,
                               split_k=self.split_k, num_warps=self.num_warps, stages=self.stages, pdl=self.pdl)

    @property
    def row_tiles(self) -> int:
        # the dense config's rule on this config's own fields (no dense config built: the MoE
        # policy asks for it of every config of its space)
        return Sm90W4A16Config.row_tiles.fget(self)


def validate_moe_config(c: Sm90MoeConfig) -> Status:
    """The one validity rule of grouped MoE configs (policy, template, runtime and tests use it)."""
    if not isinstance(c, Sm90MoeConfig):
        return Status.fail(f"expects Sm90MoeConfig, got {type(c).__name__}")
    if c.tile_m not in MOE_TILE_M:
        return Status.fail(f"moe tile_m={c.tile_m} not in {MOE_TILE_M} (pairs per work tile, groups of 8)")
    if c.early_weights and not c.pdl:
        return Status.fail("moe early_weights (weight copies before griddepcontrol.wait) needs pdl=True")
    return _validate_dense(c.dense())


def work_tiles_bound(pairs: int, num_experts: int, tile_m: int) -> int:
    """Work-list length that holds every routing of ``pairs`` (token, slot) pairs over
    ``num_experts`` experts in tiles of ``tile_m``: sum_e ceil(c_e / tile_m) <= floor(P / tile_m) +
    (active experts) <= floor(P / tile_m) + min(E, P). Fixed per (M, top_k): the grid of a CUDA
    graph does not depend on the routing; slots past the routing's tiles hold zero rows and exit."""
    return max(1, pairs // tile_m + min(num_experts, pairs))


#: Tokens up to which GEMM2 runs the top-k finalize itself (``finalize``: no finalize launch). The last
#: CTA of a row block finalizes every token alone, two dependent L2 round trips per token (the slots'
#: rows, then their y values; sm_100a: tokens in sequence), a serial tail that grows with the batch:
#: at 2 tokens it costs about one tiny-kernel launch (the model, ``perf.fused_finalize_tail_us``), so
#: above this the finalize is its own kernel.
FUSED_FINALIZE_MAX_TOKENS = 2


def fused_finalize_ok(tokens: int, x_dtype, out_dtype, shared_out, residual) -> bool:
    """Whether GEMM2 runs the finalize of a call (its output, ``shared_out`` and ``residual`` in the
    activations' dtype, contiguous; at most :data:`FUSED_FINALIZE_MAX_TOKENS` tokens)."""
    if not 0 < tokens <= FUSED_FINALIZE_MAX_TOKENS or out_dtype != x_dtype:
        return False
    return all(t is None or (t.dtype == x_dtype and t.dim() == 2 and t.is_contiguous()) for t in (shared_out, residual))


@dataclass
class MoeWorkList:
    """Routing tables of one call (:mod:`.launch` builds them); all on the ids' device."""

    rows: torch.Tensor  # int32 [P]: source token of permuted row p
    tiles: torch.Tensor  # int32 [4 * slots]: (expert, first row, rows, 0)
    pos: torch.Tensor  # int64 [M, K]: permuted row of pair (t, s)
    valid: torch.Tensor  # bool [M, K]: the slot routes to a local expert
    counts: torch.Tensor  # int64 [E]: pairs per local expert
    tile_m: int
    #: int32 [M * K]: permuted row of pair (t, s), -1 for an empty slot (the fused finalize's table)
    y_rows: Optional[torch.Tensor] = None

    @property
    def slots(self) -> int:
        return self.tiles.numel() // 4


def moe_shape_problem(c: Sm90MoeConfig, rows: int, k: int, gated: bool) -> str | None:
    """Why ``c`` cannot run one grouped GEMM with ``rows`` weight rows per expert (gate + up for a
    gated GEMM1) and reduction ``k`` (None: it can)."""
    if k % 32:
        return f"K={k} is not a multiple of 32 (16-byte rows of packed FP4 / of the activations)"
    if rows % 16:
        return f"{rows} weight rows per expert is not a multiple of 16 (whole row tiles per expert)"
    if gated and (rows // 2) % 16:
        return f"silu_mul needs I = {rows // 2} to be a multiple of 16 (whole gate and up row tiles)"
    if gated and c.row_tiles % 2:
        return f"silu_mul needs an even number of row tiles per warp (gate + up), got {c.row_tiles}"
    nstage = -(-k // 256) * (256 // c.tile_k)
    if c.split_k > nstage:
        return f"split_k={c.split_k} exceeds the {nstage} pipeline stages of K={k}"
    return None


_NAME_RE = re.compile(r"nvgemm_cutedsl_sm90_moe_mma_t(\d+)x(\d+)x(\d+)_w(\d+)_s(\d+)(?:_sk(\d+))?(_pdl)?(_fin)?(_dir)?(_ew)?")


def moe_config_from_name(name: str) -> Sm90MoeConfig:
    """Inverse of :meth:`Sm90MoeConfig.name`."""
    m = _NAME_RE.fullmatch(name)
    if m is None:
        raise ValueError(f"not an sm90 MoE config name: {name!r}")
    tm, tn, tk, nw, st, sk, pdl, fin, direct, ew = m.groups()
    return Sm90MoeConfig(tile_m=int(tm), tile_n=int(tn), tile_k=int(tk), split_k=int(sk or 1), num_warps=int(nw),
                         stages=int(st), pdl=bool(pdl), finalize=bool(fin), direct=bool(direct),
                         early_weights=bool(ew))


__all__ = ["FUSED_FINALIZE_MAX_TOKENS", "MOE_ARCHS", "fused_finalize_ok", "MOE_FAMILY", "MOE_TILE_M", "MoeWorkList", "Sm90MoeConfig", "moe_config_from_name", "moe_shape_problem",
           "validate_moe_config", "work_tiles_bound"]
