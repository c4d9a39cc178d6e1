"""Candidate policy of the sm_100a grouped W4A4 MoE kernels: per M bucket, ranked (GEMM1, GEMM2)
config pairs for one MoE layer shape, from the performance model
(:mod:`nvgemm.templates.sm100_moe.perf`).

* **Token tile** (``tile_n`` 8 / 16 / 32 / 64 tokens per work slot, shared by both GEMMs: one work
  list): from the expected pairs per *active* expert at the bucket's M (uniform routing, or a measured
  ``histogram`` of pairs per expert): the smallest tile that holds them and its neighbours are
  scored -- a tile smaller than an expert's count re-reads its weights, a larger one wastes MMA
  columns and epilogue work; the model weighs both.
* **Split-K** fills the 148 SMs: each GEMM is ranked over :data:`MOE_SPLIT_K` (bounded by its K
  tiles), so a layer with few active row tiles (TP8 decode) gets a deep split and a busy one none.
* **Ranking**: the best :data:`PER_GEMM` configs of each GEMM per tile, paired, ordered by the
  modelled GEMM1 + GEMM2 time; at most 8 candidates. Configs are chosen at the upper M of the M
  bucket (:func:`~nvgemm.templates.sm90_moe.policy.moe_buckets`: one token has a bucket of its own), so every
  M of a bucket runs the same kernels (batch invariance, one CUDA graph per bucket).
* **L2 prefetch** (decode): where a call's routed weights fit the L2 bound at the bucket's upper M
  (:func:`~nvgemm.templates.sm100_moe.perf.prefetch_fits_l2`), the pairs are ranked on the prefetch timeline
  (:func:`~nvgemm.templates.sm100_moe.perf.prefetched_pair_us`) and GEMM1 gets ``prefetch_next`` (it
  L2-prefetches GEMM2's routed weights); the prep's prefetch of GEMM1's weights is the launcher's per-call
  decision (the same bound at the call's M).

The layer presets, buckets and shapes are :mod:`.moe_sm90`'s.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

from nvgemm.templates.sm100_moe.perf import (
    byte_floor_us,
    expected_active_experts,
    finalize_kernels,
    fused_finalize_tail_us,
    host_us,
    moe_gemm_estimates,
    prefetch_fits_l2,
    prefetched_pair_us,
    prep_kernels as _prep_kernels,
)
from nvgemm.heuristics.perfmodel.hardware import get_hardware
from nvgemm.templates.sm90_moe.perf import expected_tiles
from nvgemm.templates.sm100_moe.config import (
    MOE_SPLIT_K,
    MOE_TILE_N,
    Sm100MoeConfig,
    moe_shape_problem,
    validate_moe_config,
)
from nvgemm.templates.sm90_moe.policy import (
    MOE_LAYERS,
    MoeCandidate,
    MoeShape,
    _shared_us,
    bucket_of,
    format_moe_plan,
    get_moe_layer,
    shape_from_preset,
)

MAX_CANDIDATES = 8
PER_GEMM = 3
GPU = "B200"


def token_tiles(m: int, top_k: int, num_experts: int, histogram=None) -> tuple[int, ...]:
    """The tiles scored for ``m`` tokens: the smallest ``tile_n`` holding the expected pairs per
    active expert (or the histogram's largest count), and its neighbours in :data:`MOE_TILE_N`."""
    if histogram is not None:
        per = max([c for c in histogram if c > 0] or [1])
    else:
        per = m * top_k / max(expected_active_experts(m, top_k, num_experts), 1e-9)
    i = next((j for j, t in enumerate(MOE_TILE_N) if t >= per), len(MOE_TILE_N) - 1)
    return tuple(MOE_TILE_N[max(0, i - 1):i + 2])


@functools.lru_cache(maxsize=None)
def _space(tile_n: int) -> tuple:
    """(position, config, dense twin) of the valid configs of ``tile_n`` (shape-independent: memoised)."""
    out = []
    for i, s in enumerate(MOE_SPLIT_K):
        c = Sm100MoeConfig(tile_n=tile_n, split_k=s, pdl=True)
        if validate_moe_config(c):
            out.append((i, c, c.dense()))
    return tuple(out)


def moe_candidates(shape: MoeShape, m: int, gpu: str = GPU, sm_count: int | None = None, histogram=None,
                   max_candidates: int = MAX_CANDIDATES) -> list[MoeCandidate]:
    """Ranked (GEMM1, GEMM2) configs for ``shape`` (gated, W4A4) at ``m`` tokens (module docstring).
    Both GEMMs of every scored tile are priced in one pass
    (:func:`~nvgemm.templates.sm100_moe.perf.moe_gemm_estimates`)."""
    if max_candidates < 1:
        raise ValueError(f"max_candidates must be >= 1, got {max_candidates}")
    spaces, jobs = [], []
    tiles = token_tiles(m, shape.top_k, shape.num_experts, histogram)
    for tn in tiles:
        for rows, k, gated in ((2 * shape.inter, shape.hidden, True), (shape.hidden, shape.inter, False)):
            space = [t for t in _space(tn) if not moe_shape_problem(t[1], rows, k, gated)]
            spaces.append(space)
            jobs.append(([c for _, c, _ in space], [d for _, _, d in space], tn, rows, k))
    best = []
    for space, ests in zip(spaces, moe_gemm_estimates(jobs, m, shape.top_k, shape.num_experts, gpu, sm_count,
                                                      histogram)):
        scored = [(0.5 * (e.us[0] + e.us[1]), i, c, e) for (i, c, _), e in zip(space, ests) if e is not None]
        scored.sort(key=lambda t: t[:2])
        best.append([(c, e) for _, _, c, e in scored[:PER_GEMM]])
    pairs = []
    for j in range(len(tiles)):
        for c1, e1 in best[2 * j]:
            for c2, e2 in best[2 * j + 1]:
                pairs.append(MoeCandidate(c1, c2, e1.us, e2.us, e1.tiles))
    hw = get_hardware(gpu, sm_count)
    n_pairs = m * shape.top_k if histogram is None else sum(histogram)
    if prefetch_fits_l2(n_pairs, shape.num_experts, 2 * shape.inter, shape.hidden, shape.hidden, shape.inter,
                        hw.l2_mb * 1e6):
        pairs = [_prefetched(p, shape, m, gpu, sm_count, histogram) for p in pairs]
    pairs.sort(key=lambda p: (sum(p.gemm_us), p.config13.tile_n, p.config13.split_k, p.config2.split_k))
    return pairs[:max_candidates]


def _prefetched(p: MoeCandidate, shape: MoeShape, m: int, gpu: str, sm_count, histogram) -> MoeCandidate:
    """``p`` on the decode L2-prefetch timeline (:func:`~nvgemm.templates.sm100_moe.perf.prefetched_pair_us`):
    the prep prefetches GEMM1's routed weights, GEMM1 (``prefetch_next``) GEMM2's."""
    us = prefetched_pair_us(p.config13, p.config2, m, shape.top_k, shape.num_experts, 2 * shape.inter, shape.hidden,
                            shape.hidden, shape.inter, gpu, sm_count, histogram)
    if us is None:
        return p
    return MoeCandidate(dataclasses.replace(p.config13, prefetch_next=True), p.config2, us[0], us[1], p.tiles)


@functools.lru_cache(maxsize=1024)
def pick_moe_configs(m: int, num_experts: int, top_k: int, hidden: int, inter: int,
                     sm_count: int = 148, gpu: str = GPU) -> tuple[Sm100MoeConfig, Sm100MoeConfig]:
    """The run-time pick: the first candidate at the upper M of ``m``'s bucket (one pair per bucket)."""
    shape = MoeShape("runtime", num_experts, top_k, hidden, inter)
    _, hi = bucket_of(m)
    cands = moe_candidates(shape, hi, gpu, sm_count, max_candidates=1)
    if cands:
        return cands[0].config13, cands[0].config2
    return Sm100MoeConfig(tile_n=8), Sm100MoeConfig(tile_n=8)  # no model estimate: a valid default


def price_pair(shape: MoeShape, config13: Sm100MoeConfig, config2: Sm100MoeConfig, m: int, gpu: str = GPU,
               sm_count: int | None = None, histogram=None) -> Optional[MoeCandidate]:
    """The (GEMM1, GEMM2) pair priced at ``m`` tokens as the runtime runs it (a MODEL): the prep's L2 prefetch
    where the call's routed weights fit (:func:`~.perf.prefetch_fits_l2` at ``m``), GEMM1's where its config has
    ``prefetch_next``, on the prefetch timeline; else each GEMM on its own (:func:`~.perf.moe_gemm_estimates`).
    None: no estimate."""
    hw = get_hardware(gpu, sm_count)
    n_pairs = m * shape.top_k if histogram is None else sum(histogram)
    rows13, k13, rows2, k2 = 2 * shape.inter, shape.hidden, shape.hidden, shape.inter
    prep_pf = prefetch_fits_l2(n_pairs, shape.num_experts, rows13, k13, rows2, k2, hw.l2_mb * 1e6)
    g1_pf = config13.prefetch_next
    if prep_pf or g1_pf:
        us = prefetched_pair_us(config13, config2, m, shape.top_k, shape.num_experts, rows13, k13, rows2, k2, gpu,
                                sm_count, histogram, prep_prefetch=prep_pf, gemm1_prefetch=g1_pf)
        if us is None:
            return None
        return MoeCandidate(config13, config2, us[0], us[1],
                            expected_tiles(m, shape.top_k, shape.num_experts, config13.tile_n, histogram))
    jobs = [([config13], [config13.dense()], config13.tile_n, rows13, k13),
            ([config2], [config2.dense()], config2.tile_n, rows2, k2)]
    e1, e2 = (r[0] for r in moe_gemm_estimates(jobs, m, shape.top_k, shape.num_experts, gpu, sm_count, histogram))
    if e1 is None or e2 is None:
        return None
    return MoeCandidate(config13, config2, e1.us, e2.us, e1.tiles)


def runtime_candidate(shape: MoeShape, m: int, gpu: str = GPU, sm_count: int | None = None,
                      histogram=None) -> Optional[MoeCandidate]:
    """What the runtime runs for ``m`` tokens, priced at ``m`` (a MODEL): the pair :func:`pick_moe_configs`
    picks at the upper M of ``m``'s bucket (with a measured ``histogram``: the first candidate at ``m``),
    through :func:`price_pair`."""
    if histogram is not None:
        cands = moe_candidates(shape, m, gpu, sm_count, histogram=histogram, max_candidates=1)
        return cands[0] if cands else None
    _, hi = bucket_of(m)
    cands = moe_candidates(shape, hi, gpu, sm_count, max_candidates=1)
    if not cands:
        return None
    return cands[0] if hi == m else price_pair(shape, cands[0].config13, cands[0].config2, m, gpu, sm_count)


def layer_model(shape: MoeShape, m: int, gpu: str = GPU, histogram=None, prep_kernels: Optional[int] = None) -> dict:
    """Modelled per-layer time of the grouped path with the pair the runtime runs at ``m`` (a MODEL;
    :func:`runtime_candidate`)."""
    c = runtime_candidate(shape, m, gpu, histogram=histogram)
    if c is None:
        return {}
    prep = _prep_kernels(m * shape.top_k) if prep_kernels is None else prep_kernels
    fin = finalize_kernels(m)
    host = host_us(gpu, prep, fin)
    gemm = c.gemm_us
    if fin == 0:  # GEMM2 runs the finalize: its last CTA's serial tail (one token after another)
        tail = fused_finalize_tail_us(m, shape.top_k, gpu)
        gemm = (gemm[0] + tail[0], gemm[1] + tail[1])
    shared = _shared_us(shape, m, gpu, ("sm100.nvfp4",)) if shape.shared_inter else (0.0, 0.0)
    total = tuple(gemm[i] + host[i] + shared[i] for i in range(2))
    return {"m": m, "active": expected_active_experts(m, shape.top_k, shape.num_experts), "tiles": c.tiles,
            "config13": c.config13.name(), "config2": c.config2.name(), "gemm_us": gemm, "host_us": host,
            "launches": 2 + prep + fin,
            "shared_us": shared, "total_us": total,
            "floor_us": byte_floor_us(m, shape.top_k, shape.num_experts, shape.hidden, shape.inter, shape.shared_inter,
                                      gpu)}


def format_plan(shape: MoeShape, ms, gpu: str = GPU, max_candidates: int = MAX_CANDIDATES) -> str:
    """``nvgemm plan`` on a Blackwell target: per M, the ranked candidates with their modelled times."""
    return format_moe_plan(shape, ms, gpu, "sm100 grouped W4A4",
                           lambda m: moe_candidates(shape, m, gpu, max_candidates=max_candidates),
                           lambda c: f"tile_n={c.config13.tile_n} slots", "nvgemm_cutedsl_sm100_moe_")


__all__ = ["MAX_CANDIDATES", "format_plan", "layer_model", "moe_candidates", "price_pair", "runtime_candidate",
           "pick_moe_configs", "token_tiles"]
