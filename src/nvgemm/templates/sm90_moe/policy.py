"""Candidate policy of the sm_90a grouped MoE kernels: per M bucket, ranked (GEMM1, GEMM2) config
pairs for one MoE layer shape, from the performance model (:mod:`nvgemm.templates.sm90_moe.perf`).

* **Token tile** (``tile_m`` 8 / 16 / 32, shared by both GEMMs: one work list): every tile size is
  scored on the expected number of work tiles under uniform routing at the bucket's M (or a
  measured ``histogram`` of pairs per expert) -- a tile smaller than an expert's count re-reads its
  weights, a larger one wastes MMA columns; the model weighs both.
* **Split-K** fills the SMs: each GEMM is ranked over the ``mma`` family's shapes x splits
  (:data:`~nvgemm.templates.sm90_w4a16.perf.SM90_SPLITS`, bounded by the K stages), so a layer with
  few active tiles (TP8 decode) gets a deep split and a busy one none.
* **Ranking**: the best :data:`PER_GEMM` configs of each GEMM per tile size, paired, ordered by the
  modelled GEMM1 + GEMM2 time (the host path's prep/finalize cost is the same for all pairs); at most
  8 candidates. Configs are chosen per M bucket (:func:`moe_buckets`: the dense buckets with one token on
  its own) at the bucket's upper M, so every M of a bucket runs the same kernels (batch invariance, one CUDA graph
  per bucket).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

from nvgemm.templates.sm90_w4a16.perf import SM90_SPLITS
from nvgemm.templates.sm90_moe.perf import (
    byte_floor_us, expected_active_experts, finalize_kernels, fused_finalize_tail_us,
    grouped_gemm_times, host_us, sm90_finalize_rounds, prep_kernels as _prep_kernels,
)
from nvgemm.templates.sm90_w4a16.config import MMA_ROW_TILES, ROW_TILE
from nvgemm.templates.sm90_moe.config import MOE_TILE_M, Sm90MoeConfig, moe_shape_problem, validate_moe_config
from nvgemm.heuristics.policy import m_buckets
from nvgemm.heuristics.perfmodel.model import best
from nvgemm.heuristics.presets import MOE_PRESETS as P

MAX_CANDIDATES = 8
PER_GEMM = 3


@dataclass(frozen=True)
class MoeShape:
    """One MoE layer on one GPU (per-rank sizes under tensor parallelism)."""

    name: str
    num_experts: int
    top_k: int
    hidden: int
    inter: int  # per-rank expert intermediate size
    shared_inter: int = 0  # per-rank shared-expert intermediate size (0: none)
    source: str = ""


def shape_from_preset(preset, tp: int = 1) -> MoeShape:
    """A :class:`MoeShape` of a ``nvgemm.heuristics.presets.MoePreset`` on ``tp`` tensor-parallel
    ranks (expert and shared intermediate sizes divided by ``tp``)."""
    if tp < 1 or preset.expert_intermediate % tp or preset.shared_intermediate % tp:
        raise ValueError(f"tp={tp} does not divide {preset.name}'s intermediate sizes")
    name = preset.name if tp == 1 else f"{preset.name}-TP{tp}"
    return MoeShape(name, preset.num_experts, preset.top_k, preset.hidden, preset.expert_intermediate // tp,
                    preset.shared_intermediate // tp, f"{preset.name} preset, TP{tp}")


def _layers() -> dict:
    return {s.name: s for s in (shape_from_preset(P["DeepSeek-V3"], 8), shape_from_preset(P["Qwen3-30B-A3B"]),
                                shape_from_preset(P["Llama-4-Scout"]), shape_from_preset(P["Mixtral-8x7B"]))}


#: The MoE layers of the issue's benchmarks (moe-core's presets; DeepSeek-V3 at TP8, the rest TP1).
MOE_LAYERS = _layers()


def get_moe_layer(name: str) -> MoeShape:
    for k, v in MOE_LAYERS.items():
        if k.lower() == name.lower():
            return v
    raise KeyError(f"nvgemm: unknown MoE layer {name!r}; known: {', '.join(MOE_LAYERS)}")


@dataclass(frozen=True)
class MoeCandidate:
    config13: Sm90MoeConfig
    config2: Sm90MoeConfig
    us13: tuple[float, float]
    us2: tuple[float, float]
    tiles: float

    @property
    def gemm_us(self) -> tuple[float, float]:
        return (self.us13[0] + self.us2[0], self.us13[1] + self.us2[1])


@functools.lru_cache(maxsize=None)
def _space(tile_m: int) -> tuple:
    """The valid configs of token tile ``tile_m`` with their dense twins (shape-independent: memoised)."""
    out = []
    for w in (2, 4, 8):
        for rt in MMA_ROW_TILES:
            for st in (3, 4):
                for s in SM90_SPLITS:
                    c = Sm90MoeConfig(tile_m=tile_m, tile_n=ROW_TILE * rt * w, tile_k=256, split_k=s, num_warps=w,
                                      stages=st, pdl=True)
                    if c.tile_n > 256 or not validate_moe_config(c):
                        continue
                    out.append((c, c.dense()))
    return tuple(out)


@functools.lru_cache(maxsize=1024)
def _feasible(tile_m: int, rows: int, k: int, gated: bool) -> tuple:
    """(position in the space, config, dense twin) of the configs of ``tile_m`` that can run one grouped
    GEMM of ``rows`` x ``k`` (memoised per layer shape: it does not depend on M)."""
    return tuple((i, c, d) for i, (c, d) in enumerate(_space(tile_m)) if not moe_shape_problem(c, rows, k, gated))


def _ranked(shape: MoeShape, m: int, gated: bool, gpu, sm_count, histogram) -> list:
    """Per token tile of :data:`MOE_TILE_M`: the :data:`PER_GEMM` fastest configs of GEMM1 and of
    GEMM2, ordered by (modelled middle, position in the space). Every config of both GEMMs at every
    tile is priced in one pass (:func:`~nvgemm.templates.sm90_moe.perf.grouped_gemm_estimates`)."""
    rows13 = 2 * shape.inter if gated else shape.inter
    spaces, jobs = [], []
    for tm in MOE_TILE_M:
        for rows, k, g in ((rows13, shape.hidden, gated), (shape.hidden, shape.inter, False)):
            space = _feasible(tm, rows, k, g)
            spaces.append(space)
            jobs.append(([c for _, c, _ in space], [d for _, _, d in space], tm, rows, k))
    out = []
    for space, r in zip(spaces, grouped_gemm_times(jobs, m, shape.top_k, shape.num_experts, gpu, sm_count, histogram)):
        if r is None:
            out.append([])
            continue
        scored = [(0.5 * (us[0] + us[1]), i, c, us) for (i, c, _), us in zip(space, r[2]) if us is not None]
        scored.sort(key=lambda t: t[:2])
        out.append([(c, us, r[0]) for _, _, c, us in scored[:PER_GEMM]])
    return [(out[2 * j], out[2 * j + 1]) for j in range(len(MOE_TILE_M))]


def moe_candidates(shape: MoeShape, m: int, gpu: str = "H200", sm_count: int | None = None, histogram=None,
                   max_candidates: int = MAX_CANDIDATES, gated: bool = True) -> list[MoeCandidate]:
    """Ranked (GEMM1, GEMM2) configs for ``shape`` at ``m`` tokens (see the module docstring)."""
    if max_candidates < 1:
        raise ValueError(f"max_candidates must be >= 1, got {max_candidates}")
    pairs = []
    for g1, g2 in _ranked(shape, m, gated, gpu, sm_count, histogram):
        for c1, us1, tiles in g1:
            for c2, us2, _ in g2:
                pairs.append(MoeCandidate(c1, c2, us1, us2, tiles))
    pairs.sort(key=lambda p: (sum(p.gemm_us), p.config13.tile_m))
    return pairs[:max_candidates]


def moe_buckets(max_m: int = 256) -> list[tuple[int, int]]:
    """The M buckets of the grouped MoE policies: the dense policy's (:func:`nvgemm.heuristics.policy.m_buckets`)
    with one token in a bucket of its own. Batch-1 decode is the MoE layer's commonest call and the one whose
    best kernels differ most from a few tokens' (at one token a routed expert has one row: deeper split-K, other
    token tiles, and the L2 prefetches of ``templates/sm100_moe`` fit), so it gets its own pick; every M of a
    bucket still runs the same kernels (batch invariance within a bucket, one CUDA graph per bucket)."""
    return one_token_apart(m_buckets(max_m))


def one_token_apart(buckets) -> list[tuple[int, int]]:
    """``buckets`` (``(lo, hi)`` pairs) with a bucket starting at one token split into ``(1, 1)`` and the rest."""
    out = []
    for lo, hi in buckets:
        if lo == 1 and hi > 1:
            out += [(1, 1), (2, hi)]
        else:
            out.append((lo, hi))
    return out


def bucket_of(m: int, max_m: int = 256) -> tuple[int, int]:
    """The MoE bucket (:func:`moe_buckets`) of ``m`` tokens: every M of it runs the configs picked at its upper M.
    Past ``max_m`` the buckets keep doubling (257-512, 513-1024, ...): a bucket never ends at ``m`` itself, so a
    prefill of 300 tokens runs what one of 400 does."""
    top = max(max_m, 1)
    while top < m:
        top *= 2
    for lo, hi in moe_buckets(top):
        if lo <= m <= hi:
            return lo, hi
    raise ValueError(f"M={m} outside the buckets")


@functools.lru_cache(maxsize=1024)
def pick_moe_configs(m: int, num_experts: int, top_k: int, hidden: int, inter: int, gated: bool,
                     sm_count: int = 132, gpu: str = "H200") -> tuple[Sm90MoeConfig, Sm90MoeConfig]:
    """The run-time pick: the first candidate at the upper M of ``m``'s bucket (one pair per bucket)."""
    shape = MoeShape("runtime", num_experts, top_k, hidden, inter)
    _, hi = bucket_of(m)
    cands = moe_candidates(shape, hi, gpu, sm_count, gated=gated, max_candidates=1)
    if cands:
        return cands[0].config13, cands[0].config2
    # no model estimate (shapes outside the facts table): a valid default
    c1 = Sm90MoeConfig(tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4)
    c2 = Sm90MoeConfig(tile_m=8, tile_n=64, tile_k=256, num_warps=4, stages=4)
    return c1, c2


def layer_model(shape: MoeShape, m: int, gpu: str = "H200", histogram=None, prep_kernels: Optional[int] = None) -> dict:
    """Modelled per-layer time of the grouped path with the policy's first candidate (a MODEL)."""
    cands = moe_candidates(shape, m, gpu, histogram=histogram, max_candidates=1)
    if not cands:
        return {}
    c = cands[0]
    fin = finalize_kernels(m)
    prep = _prep_kernels(m) if prep_kernels is None else prep_kernels
    host = host_us(gpu, prep, fin)
    gemm = c.gemm_us
    if fin == 0:  # GEMM2 runs the finalize: its last CTA's serial tail
        tail = fused_finalize_tail_us(m, shape.top_k, gpu, sm90_finalize_rounds(m, c.config2))
        gemm = (gemm[0] + tail[0], gemm[1] + tail[1])
    shared = (0.0, 0.0)
    if shape.shared_inter:
        shared = _shared_us(shape, m, gpu)
    total = tuple(gemm[i] + host[i] + shared[i] for i in range(2))
    return {"m": m, "active": expected_active_experts(m, shape.top_k, shape.num_experts), "tiles": c.tiles,
            "config13": c.config13.name(), "config2": c.config2.name(), "gemm_us": gemm, "host_us": host,
            "launches": 2 + prep + fin,
            "shared_us": shared, "total_us": total,
            "floor_us": byte_floor_us(m, shape.top_k, shape.num_experts, shape.hidden, shape.inter, shape.shared_inter,
                                      gpu)}


def _shared_us(shape: MoeShape, m: int, gpu: str, families=("sm90.mma", "sm90.wgmma")) -> tuple[float, float]:
    """The shared expert as two dense GEMMs of ``families`` (gate_up with silu_mul, down; default the
    W4A16 sm90 families), the model's best."""
    tot = [0.0, 0.0]
    for n, k in ((2 * shape.shared_inter, shape.hidden), (shape.hidden, shape.shared_inter)):
        b = best(families, m, n, k, gpu)
        if b is None:
            continue
        us = b[1].gemm_us
        tot[0] += us[0]
        tot[1] += us[1]
    return (tot[0], tot[1])


def format_moe_plan(shape: MoeShape, ms, gpu: str, kind: str, candidates, tile_label, prefix: str) -> str:
    """Per M, the ranked grouped candidates with their modelled times (``nvgemm plan`` for MoE presets):
    ``candidates(m)`` gives them, ``tile_label(c)`` names each one's token tile, ``prefix`` is cut from
    config names."""
    lines = [f"{shape.name}: {shape.num_experts} experts, top-{shape.top_k}, H={shape.hidden}, I={shape.inter}"
             f"{f', shared I={shape.shared_inter}' if shape.shared_inter else ''} on {gpu} ({kind}; "
             "times are a MODEL: kernel + launch per GEMM, uniform routing)"]
    for m in ms:
        lo, hi = bucket_of(m)
        a = expected_active_experts(m, shape.top_k, shape.num_experts)
        lines.append(f"  M={m} (bucket {lo}..{hi}): ~{a:.1f} active experts, {m * shape.top_k / a:.2f} pairs per "
                     "active expert")
        for i, c in enumerate(candidates(m)):
            lines.append(f"    {i + 1}. {tile_label(c)}~{c.tiles:.1f}  "
                         f"{sum(c.gemm_us) / 2:7.1f} us  [{c.gemm_us[0]:.1f}-{c.gemm_us[1]:.1f}]  "
                         f"G1 {c.config13.name().replace(prefix, '')}  G2 {c.config2.name().replace(prefix, '')}")
    return "\n".join(lines)


def format_plan(shape: MoeShape, ms, gpu: str = "H200", max_candidates: int = MAX_CANDIDATES) -> str:
    """``nvgemm plan --moe``: per M, the ranked candidates with their modelled times."""
    return format_moe_plan(shape, ms, gpu, "sm90 grouped W4A16",
                           lambda m: moe_candidates(shape, m, gpu, max_candidates=max_candidates),
                           lambda c: f"tile_m={c.config13.tile_m} tiles", "nvgemm_cutedsl_sm90_moe_mma_")


__all__ = ["MAX_CANDIDATES", "MOE_LAYERS", "MoeCandidate", "MoeShape", "bucket_of", "moe_buckets", "one_token_apart", "format_plan",
           "get_moe_layer", "layer_model", "moe_candidates", "pick_moe_configs", "shape_from_preset"]
