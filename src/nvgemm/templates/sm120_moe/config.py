"""Config space and shape rule of the sm_120a / sm_121a grouped W4A4 MoE kernel (``"moe_mma_sync_sm120"``); pure Python.

The grouped kernel (:mod:`.kernel`) is the sm120 swap-AB decode kernel of
:mod:`nvgemm.templates.sm120_w4a4` (weight rows on the ``mma.sync m16n8k64 .kind::mxf4nvf4
.block_scale`` M side, tokens on its N side, a cp.async ring, deterministic split-K) run over the
**work list** of :func:`nvgemm.templates.sm90_moe.launch.build_work_list`: the token tile ``j`` of
the grouped GEMM is work slot ``j`` = ``(expert, first permuted pair, pairs <= tile_n)``. Fields:

    tile_n     tokens (routed pairs) per work slot = the CTA's token tile: 8 | 16 | 32
    tile_rows  weight rows per CTA = 16 x row tiles per warp x num_warps (the dense ``tile_n``)
    tile_k     K elements per pipeline stage (64 x 2 or 4 slabs)
    num_warps  warps per CTA
    stages     cp.async ring depth
    split_k    CTAs along K per (row block, slot); fp32 partials summed in split order
    pdl        programmatic dependent launch: every thread waits (``griddepcontrol.wait``) before it
               reads the work list (the expert of a slot comes from the routing)

Per expert the weight rows are padded to a multiple of 128 in the stack (the stacked block scales are
then the 2-D 128x4 swizzle of ``[E * rows_padded, K / 16]``), GEMM1's rows stay in the checkpoint's
``[gate | up]`` order (a warp pairs gate row tile ``t`` with up row tile ``t + I/16``), and the token
side keeps one whole 128-row scale atom per work slot (the slot's rows are rows 0..tile_n-1 of atom
``j``): the sm100 grouped family's operand layout, so its prep and finalize serve this family as is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nvgemm.core.status import Status
from nvgemm.templates.sm120_w4a4.config import SM120_ARCHS, Sm120W4A4Config, k_stages, validate_config

MOE_FAMILY = "moe_mma_sync_sm120"
TEMPLATE_ID = "sm120_moe_nvfp4"
MOE_ARCHS = SM120_ARCHS
MOE_TILE_N = (8, 16, 32)
MOE_SPLIT_K = (1, 2, 4, 8)
ROW_ALIGN = 128  # weight rows per expert are padded to this in the stack (whole 128-row scale atoms)


@dataclass(frozen=True)
class Sm120MoeConfig:
    tile_n: int = 8
    tile_rows: int = 128
    tile_k: int = 256
    num_warps: int = 4
    stages: int = 4
    split_k: int = 1
    pdl: bool = True

    family = MOE_FAMILY  # class attribute (not a field)
    swap_ab = True

    def name(self) -> str:
        s = (f"nvgemm_cutedsl_sm120_moe_t{self.tile_rows}x{self.tile_n}x{self.tile_k}_w{self.num_warps}"
             f"_s{self.stages}")
        if self.split_k > 1:
            s += f"_sk{self.split_k}"
        if self.pdl:
            s += "_pdl"
        return s

    def dense(self) -> Sm120W4A4Config:
        """The dense sm120 config of the kernel's main loop (its token tile = the work slot)."""
        return Sm120W4A4Config(tile_m=self.tile_n, tile_n=self.tile_rows, tile_k=self.tile_k, split_k=self.split_k,
                               num_warps=self.num_warps, stages=self.stages, pdl=self.pdl)


def validate_moe_config(c: Sm120MoeConfig) -> Status:
    """The one validity rule of grouped sm120 MoE configs (policy, template, runtime, tests)."""
    if not isinstance(c, Sm120MoeConfig):
        return Status.fail(f"expects Sm120MoeConfig, got {type(c).__name__}")
    if c.tile_n not in MOE_TILE_N:
        return Status.fail(f"moe tile_n={c.tile_n} not in {MOE_TILE_N} (tokens per work slot)")
    if c.split_k not in MOE_SPLIT_K:
        return Status.fail(f"moe split_k={c.split_k} not in {MOE_SPLIT_K}")
    return validate_config(c.dense())


def padded_rows(rows: int) -> int:
    """Weight rows per expert in the stack (a multiple of 128)."""
    return -(-rows // ROW_ALIGN) * ROW_ALIGN


def moe_shape_problem(c: Sm120MoeConfig, rows: int, k: int, gated: bool) -> str | None:
    """Why ``c`` cannot run one grouped GEMM with ``rows`` weight rows per expert (gate + up for
    gated GEMM1) and reduction ``k`` (None: it can). The family's predicate."""
    st = validate_moe_config(c)
    if not st:
        return st.reason
    if rows < 1 or k < 1:
        return f"empty grouped GEMM (rows={rows}, K={k})"
    if k % 32:
        return f"K={k} is not a multiple of 32 (packed FP4 rows are copied in 16-byte pieces)"
    if gated:
        if rows % 2 or (rows // 2) % 32:
            return (f"silu_mul with the fused NVFP4 requant needs I = {rows / 2:g} to be a multiple of 32 (whole "
                    f"gate / up row tiles of 16 and 16-byte rows of GEMM2's packed input)")
        if c.dense().row_tiles % 2:
            return f"silu_mul needs an even number of row tiles per warp (gate + up), got {c.dense().row_tiles}"
    elif rows % 4:
        return f"{rows} output rows per expert is not a multiple of 4 (16-byte fp32 output rows)"
    stages = k_stages(k, c.tile_k)
    if c.split_k > stages:
        return f"split_k={c.split_k} exceeds the {stages} pipeline stages of K={k} (tile_k={c.tile_k})"
    return None


_NAME_RE = re.compile(r"nvgemm_cutedsl_sm120_moe_t(\d+)x(\d+)x(\d+)_w(\d+)_s(\d+)(?:_sk(\d+))?(_pdl)?")


def moe_config_from_name(name: str) -> Sm120MoeConfig:
    """Inverse of :meth:`Sm120MoeConfig.name`."""
    m = _NAME_RE.fullmatch(name)
    if m is None:
        raise ValueError(f"not an sm120 MoE config name: {name!r}")
    tr, tn, tk, nw, st, sk, pdl = m.groups()
    return Sm120MoeConfig(tile_n=int(tn), tile_rows=int(tr), tile_k=int(tk), num_warps=int(nw), stages=int(st),
                          split_k=int(sk or 1), pdl=bool(pdl))


__all__ = ["MOE_ARCHS", "MOE_FAMILY", "MOE_SPLIT_K", "MOE_TILE_N", "ROW_ALIGN", "TEMPLATE_ID", "Sm120MoeConfig",
           "moe_config_from_name", "moe_shape_problem", "padded_rows", "validate_moe_config"]
