"""Performance model of the sm_100a grouped W4A4 MoE path (a MODEL, never a measurement).

One routed MoE layer on the grouped path (:mod:`nvgemm.templates.sm100_moe`) is

    prep (work list + per-slot NVFP4 activations) + GEMM1 (gate/up, fused SwiGLU + NVFP4 requant)
    + GEMM2 (down) + finalize (top-k sum)

**Routing** is :mod:`.sm90_moe`'s: uniform (binomial pairs per expert) or a measured histogram;
the expected work slots of tile ``tile_n`` are :func:`~.sm90_moe.expected_tiles`.

**A grouped GEMM** is modelled as the dense swap-AB sm100 kernel (:mod:`.sm100`: the same warp
roles, TMA/MMA pipeline and split-K reduction) on the equivalent dense problem: ``N = rows per
expert (padded to 128) x work slots`` (interpolated between the whole numbers of slots around the
expected value; each slot streams its expert's weight block once, so a second slot of the same
expert is charged as a DRAM re-read), ``M = mean pairs per slot`` (at most ``tile_n``), the layer's
K. The dense model's own terms then charge what the grouped kernel pays: its persistent grid of
``min(units, 148)`` CTAs over ``row tiles x slots x split_k`` units, the first round's fill, the
partial last round (idle SMs earn nothing), the exposed epilogue / split-K reduction as the tail,
and the launch. The grid's work slots past the routing's tiles (the grid is fixed per M bucket) load
nothing and issue no MMA; each of their units is charged its scheduler step and accumulator
handshake (:func:`empty_slot_us`). **PDL**: both GEMMs get the dense model's one PDL term
(``pdl_saving_us``, 0.3-0.7 us off the launch) and nothing more; GEMM2 TMA-loads its first weight tiles
before ``griddepcontrol.wait`` (``config.early_weights``, the prologue that term stands for), GEMM1 cannot (its
work list is its producer's output); the first round's fill is charged with or without PDL, as in the dense
model.

**Host path**: :func:`prep_kernels` tiny launches (one Triton launch up to
:data:`~.config.FUSED_PREP_MAX_PAIRS` routed pairs: work list, activations and the scale padding
together; three above) and, above :data:`~.sm90_moe.config.FUSED_FINALIZE_MAX_TOKENS` tokens, the
finalize, each at the hardware's tiny-kernel cost; at or below it GEMM2 runs the finalize, charged as
its last CTA's serial tail (:func:`~.sm90_moe.perf.fused_finalize_tail_us`, one token after another). **Byte floor**: :func:`~.sm90_moe.byte_floor_us` (active + shared experts' NVFP4
weight bytes at the achievable bandwidth).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

from nvgemm.templates.sm100_moe.config import FUSED_PREP_MAX_PAIRS
from nvgemm.templates.sm90_moe.config import work_tiles_bound
from nvgemm.heuristics.perfmodel.hardware import get_hardware
from nvgemm.templates.sm100_w4a4.perf import EPI_SUBTILE_CYCLES, persistent_ctas
from nvgemm.templates.sm90_moe.perf import (
    FINALIZE_KERNELS,
    MoeGemmEstimate,
    byte_floor_us,
    expected_active_experts,
    finalize_kernels,
    fused_finalize_tail_us,
    grouped_gemm_estimates,
)

#: Launches of the host prep per layer on CUDA besides the two GEMMs and the finalize, at decode
#: (:data:`~.config.FUSED_PREP_MAX_PAIRS` routed pairs or fewer): one Triton kernel (work list, per-slot
#: NVFP4 activations and their scale atoms, the pair -> output row map, GEMM2's scale padding).
PREP_KERNELS = 1
#: Above that: the work-list kernel, the prep kernel and the pair -> row gather.
PREP_KERNELS_LARGE = 3


def prep_kernels(pairs: int) -> int:
    """Host prep launches of a call with ``pairs`` routed (token, slot) pairs (``launch.moe_forward`` on CUDA)."""
    return PREP_KERNELS if pairs <= FUSED_PREP_MAX_PAIRS else PREP_KERNELS_LARGE
#: Cycles of one empty work unit on its CTA (scheduler step + MMA-warp acquire/commit + epilogue
#: wait/release of the accumulator stage; no loads, MMAs or stores) -- an assumption, like the dense
#: family's :data:`~.sm100.EPI_SUBTILE_CYCLES`.
EMPTY_UNIT_CYCLES = 150


def moe_gemm_estimate(config, m: int, top_k: int, num_experts: int, rows: int, k: int, gpu: str = "B200",
                      sm_count: int | None = None, histogram=None) -> Optional[MoeGemmEstimate]:
    """Modelled time of one grouped GEMM (``rows`` weight rows per expert, padded to 128 in the stack;
    reduction ``k``), or None when the dense model has no estimate for the equivalent problem."""
    return moe_gemm_estimates([([config], [config.dense()], config.tile_n, rows, k)], m, top_k, num_experts, gpu,
                              sm_count, histogram)[0][0]


def moe_gemm_estimates(jobs, m: int, top_k: int, num_experts: int, gpu: str = "B200", sm_count: int | None = None,
                       histogram=None) -> list:
    """:func:`moe_gemm_estimate` of many configs priced together: per job ``(configs of one token
    tile, their dense twins, tile_n, rows, k)`` the list of estimates (None: no estimate)."""
    gjobs = [(configs, denses, tile_n, -(-rows // 128) * 128, k) for configs, denses, tile_n, rows, k in jobs]
    pairs = m * top_k if histogram is None else sum(histogram)
    out = []
    for (_, _, _, rows_p, _), ests in zip(gjobs, grouped_gemm_estimates(gjobs, m, top_k, num_experts, gpu, sm_count,
                                                                        histogram)):
        row = []
        for e in ests:
            if e is not None:
                extra = empty_slot_us(e.config, pairs, num_experts, e.tiles, rows_p, gpu, sm_count)
                e = replace(e, us=(e.us[0] + extra, e.us[1] + extra))
            row.append(e)
        out.append(row)
    return out


def empty_slot_us(config, pairs: int, num_experts: int, tiles: float, rows_p: int, gpu: str,
                  sm_count: int | None) -> float:
    """The grid's slots past the routing's tiles (fixed per M bucket: :func:`work_tiles_bound`): their
    units load nothing and issue no MMA, but each costs its CTA a scheduler step and the accumulator
    handshake (:data:`EMPTY_UNIT_CYCLES`), plus, with split-K, publishing a zero partial and the counter
    (one epilogue pass per sub-tile). Charged on the busiest CTA."""
    hw = get_hardware(gpu)
    empty = max(0.0, work_tiles_bound(pairs, num_experts, config.tile_n) - tiles)
    units = empty * (rows_p // 128) * config.split_k
    ctas = min(sm_count or hw.sm_count, persistent_ctas(hw, 1))
    per_unit = EMPTY_UNIT_CYCLES
    if config.split_k > 1:
        per_unit += (config.tile_n // min(config.tile_n, 32)) * EPI_SUBTILE_CYCLES
    return math.ceil(units / ctas) * per_unit / hw.clock_hz * 1e6


def host_us(gpu: str = "B200", prep_kernels: int = PREP_KERNELS,
            finalize: int = FINALIZE_KERNELS) -> tuple[float, float]:
    """Tiny kernels of the host path (prep + finalize launches) at the aux-kernel cost."""
    hw = get_hardware(gpu)
    n = prep_kernels + finalize
    return (n * hw.aux_kernel_us[0], n * hw.aux_kernel_us[1])


__all__ = ["finalize_kernels", "fused_finalize_tail_us", "EMPTY_UNIT_CYCLES", "PREP_KERNELS", "PREP_KERNELS_LARGE", "prep_kernels", "empty_slot_us", "byte_floor_us", "expected_active_experts", "host_us",
           "moe_gemm_estimate", "moe_gemm_estimates"]
