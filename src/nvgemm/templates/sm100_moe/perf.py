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

**L2 prefetch at decode** (:func:`prefetch_plan`; a MODEL of a mechanism that has never run on hardware):
where the routed pairs fit the one-launch prep and both GEMMs' routed weights fit :data:`L2_PREFETCH_SHARE` of
the L2 (:func:`prefetch_fits_l2`), the prep L2-prefetches GEMM1's routed weights (and scales) as its last act and
GEMM1 (``config.prefetch_next``) prefetches GEMM2's once its own loads are issued. A prefetch only moves
the start of a DRAM stream earlier, so the model is a timeline per end of the hardware ranges (time 0 = the
prep's end, its whole cost charged before): the prefetched bytes arrive after one DRAM latency at the achievable
bandwidth, GEMM1's first and GEMM2's after them, in that order (one memory stream for both); a GEMM ends at
``min(its DRAM-fed time, max(its L2-fed time, its bytes' arrival + one L2 latency + its tail))`` after its
launch, where the L2-fed time is the dense model on the hardware with the L2 latency in place of the DRAM
latency and the chip's byte rate x :data:`L2_BW_OVER_DRAM`
(:func:`~nvgemm.heuristics.perfmodel.model.estimate_l2_fed`). So a prefetch never makes a GEMM slower in the
model, and a GEMM whose launch gap is shorter than a DRAM latency gains nothing. Not modelled: prefetched
lines evicted before use (hence the L2 share bound), the prefetch instructions' issue cost (a few per
thread), DRAM contention with other streams.

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
from nvgemm.heuristics.perfmodel.model import estimate, estimate_l2_fed
from nvgemm.templates.sm90_moe.perf import (
    _with_pdl,
    slot_corners,
    FINALIZE_KERNELS,
    NVFP4_BYTES_PER_ELEM,
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


#: L2 read bandwidth over the achievable DRAM bandwidth, (optimistic, pessimistic) end, for weights an earlier
#: kernel prefetched into L2 -- an assumption: published microbenchmarks put Hopper's L2 at roughly twice its
#: DRAM bandwidth; Blackwell's has not been measured here.
L2_BW_OVER_DRAM = (2.0, 1.5)
#: Share of the L2 the decode prefetches of one layer may fill (both GEMMs' routed weights and scales), so the
#: lines survive until their GEMM reads them (an assumption, not a measured eviction bound).
L2_PREFETCH_SHARE = 0.5


def prefetch_bytes(pairs: int, num_experts: int, rows13: int, k13: int, rows2: int, k2: int) -> float:
    """Upper bound of one call's routed NVFP4 weight + scale bytes of both GEMMs (every pair a distinct expert;
    rows padded to 128 as in the stack)."""
    experts = min(max(pairs, 0), num_experts)
    pad = lambda r: -(-r // 128) * 128  # noqa: E731
    return experts * (pad(rows13) * k13 + pad(rows2) * k2) * NVFP4_BYTES_PER_ELEM


def prefetch_fits_l2(pairs: int, num_experts: int, rows13: int, k13: int, rows2: int, k2: int,
                     l2_bytes: float) -> bool:
    """Whether a call of ``pairs`` routed pairs prefetches its weights into L2: at most
    :data:`~.config.FUSED_PREP_MAX_PAIRS` pairs (the one-launch prep) and both GEMMs' routed weights within
    :data:`L2_PREFETCH_SHARE` of ``l2_bytes``. The launcher (with the device's L2 size) and the policy (with the
    model's) ask the same question."""
    return (0 < pairs <= FUSED_PREP_MAX_PAIRS
            and prefetch_bytes(pairs, num_experts, rows13, k13, rows2, k2) <= L2_PREFETCH_SHARE * l2_bytes)


def prefetch_timeline(e1, e1_l2, e2, e2_l2, gpu: str, prep_prefetch: bool, gemm1_prefetch: bool):
    """``((GEMM1 low, high), (GEMM2 low, high))`` us (kernel + launch each, as :func:`moe_gemm_estimates`) of
    one layer's GEMM pair on the decode prefetch timeline (module docstring). ``e*`` are the dense twins'
    estimates on the equivalent problems, ``e*_l2`` the same with the weights in L2."""
    hw = get_hardware(gpu)
    us = 1e6 / hw.clock_hz
    bws = hw.achievable_bw_range[::-1]  # (optimistic, pessimistic)
    g1, g2 = [], []
    for i in range(2):
        lat, l2, bw = hw.dram_latency[i] * us, hw.l2_latency[i] * us, bws[i]
        b1, b2 = e1.geometry.dram_bytes, e2.geometry.dram_bytes
        s1, k1 = e1.launch_us[i], e1.kernel_us[i]
        if prep_prefetch:
            r1 = lat + b1 / bw * 1e6
            end1 = min(s1 + k1, max(s1 + e1_l2.kernel_us[i], r1 + l2 + e1_l2.tail_us[i]))
        else:  # GEMM1 streams its own bytes; they are through before its tail
            end1 = s1 + k1
            r1 = end1 - e1.tail_us[i]
        s2, k2 = end1 + e2.launch_us[i], e2.kernel_us[i]
        if gemm1_prefetch:
            geo = e1.geometry
            per_unit = geo.iters_per_cta / max(geo.units_per_cta, 1)
            # GEMM1's TMA warp issues GEMM2's prefetches after its own last load: at once when its units' K tiles
            # fit its ring, else after the share of its main loop that frees the last stages
            frac = max(0.0, 1.0 - geo.depth / max(per_unit, 1.0))
            r2 = max(s1 + frac * (end1 - s1) + lat, r1) + b2 / bw * 1e6
            end2 = min(s2 + k2, max(s2 + e2_l2.kernel_us[i], r2 + l2 + e2_l2.tail_us[i]))
        else:
            end2 = s2 + k2
        g1.append(end1)
        g2.append(end2 - end1)
    return (g1[0], g1[1]), (g2[0], g2[1])


def prefetched_pair_us(config13, config2, m: int, top_k: int, num_experts: int, rows13: int, k13: int, rows2: int,
                       k2: int, gpu: str = "B200", sm_count: int | None = None, histogram=None,
                       prep_prefetch: bool = True, gemm1_prefetch: bool = True):
    """``(GEMM1 (low, high), GEMM2 (low, high))`` us of a (GEMM1, GEMM2) pair on the decode prefetch timeline
    (:func:`prefetch_timeline`), priced as :func:`moe_gemm_estimates` prices each GEMM -- the dense twin on the
    whole-slot problems around the expected work slots, interpolated, plus the grid's empty slots -- or None when
    the model has no estimate. With both prefetches off it is :func:`moe_gemm_estimates`' numbers."""
    if config2.tile_n != config13.tile_n:
        raise ValueError(f"nvgemm sm100 moe: GEMM1 and GEMM2 share one work list: tile_n {config13.tile_n} != "
                         f"{config2.tile_n}")
    c = slot_corners(m, top_k, num_experts, config13.tile_n, histogram)
    if c is None:
        return None
    pairs = m * top_k if histogram is None else sum(histogram)
    per = []
    for cfg, rows, k in ((config13, rows13, k13), (config2, rows2, k2)):
        rows_p = -(-rows // 128) * 128
        dense = cfg.dense() if cfg.pdl else _with_pdl(cfg.dense())
        ests = {}
        for t in {c.lo, c.hi}:
            args = (dense, c.m, rows_p * t, k, gpu, sm_count)
            e, el2 = estimate(*args), estimate_l2_fed(*args, l2_bw_over_dram=L2_BW_OVER_DRAM)
            if e is None or el2 is None:
                return None
            ests[t] = (e, el2)
        per.append((ests, empty_slot_us(cfg, pairs, num_experts, c.tiles, rows_p, gpu, sm_count)))
    (es1, x1), (es2, x2) = per
    out1, out2 = [0.0, 0.0], [0.0, 0.0]
    # the two GEMMs share the work list (one tile_n): the same whole-slot corners
    for t, w in ((c.lo, 1 - c.f), (c.hi, c.f)):
        if w == 0.0:
            continue
        a, b = prefetch_timeline(es1[t][0], es1[t][1], es2[t][0], es2[t][1], gpu, prep_prefetch, gemm1_prefetch)
        for i in range(2):
            out1[i] += w * a[i]
            out2[i] += w * b[i]
    return (out1[0] + x1, out1[1] + x1), (out2[0] + x2, out2[1] + x2)


def host_us(gpu: str = "B200", prep_kernels: int = PREP_KERNELS,
            finalize: int = FINALIZE_KERNELS) -> tuple[float, float]:
    """Tiny kernels of the host path (prep + finalize launches) at the aux-kernel cost."""
    hw = get_hardware(gpu)
    n = prep_kernels + finalize
    return (n * hw.aux_kernel_us[0], n * hw.aux_kernel_us[1])


__all__ = ["L2_BW_OVER_DRAM", "L2_PREFETCH_SHARE", "prefetch_bytes", "prefetch_fits_l2", "prefetch_timeline",
           "prefetched_pair_us",
           "finalize_kernels", "fused_finalize_tail_us", "EMPTY_UNIT_CYCLES", "PREP_KERNELS", "PREP_KERNELS_LARGE", "prep_kernels", "empty_slot_us", "byte_floor_us", "expected_active_experts", "host_us",
           "moe_gemm_estimate", "moe_gemm_estimates"]
