"""Candidate policy of the grouped sm120 W4A4 MoE kernels: ranked (GEMM1, GEMM2) config pairs for one
MoE layer shape, from the family's performance model (:mod:`.perf`, a MODEL).

* **Token tile** (``tile_n`` 8 / 16 / 32 tokens per work slot, shared by both GEMMs: one work list):
  the smallest tile holding the expected pairs per active expert at the bucket's upper M, and its
  neighbours.
* **CTA shape** per GEMM from :data:`SHAPES` (rows per CTA, warps, stages, tile_k; GEMM1 needs an
  even number of row tiles per warp: gate + up) and split-K from :data:`MOE_SPLIT_K`, filtered by
  :func:`~.config.moe_shape_problem`, ranked by the mean of the model's optimistic and pessimistic
  times (ties keep :data:`SHAPES` order). PDL is on.
* Configs are chosen at the upper M of the M bucket (:func:`nvgemm.templates.sm90_moe.policy.bucket_of`),
  so every M of a bucket runs the same kernels (batch invariance, one CUDA graph per bucket).
"""

from __future__ import annotations

import functools

from nvgemm.templates.sm100_moe.perf import expected_active_experts
from nvgemm.templates.sm120_moe.config import MOE_SPLIT_K, MOE_TILE_N, Sm120MoeConfig, moe_shape_problem
from nvgemm.templates.sm120_moe.perf import gemm_range_us
from nvgemm.templates.sm90_moe.policy import bucket_of

#: (tile_rows, num_warps, stages, tile_k)
SHAPES = ((128, 4, 4, 256), (64, 2, 4, 256), (256, 8, 3, 256), (128, 2, 4, 256), (64, 4, 4, 256))
PER_GEMM = 3
MAX_CANDIDATES = 8


def token_tiles(m: int, top_k: int, num_experts: int) -> tuple[int, ...]:
    per = m * top_k / max(expected_active_experts(m, top_k, num_experts), 1e-9)
    i = next((j for j, t in enumerate(MOE_TILE_N) if t >= per), len(MOE_TILE_N) - 1)
    return tuple(MOE_TILE_N[max(0, i - 1):i + 2])


def _ranked_gemm(tile_n: int, m: int, top_k: int, num_experts: int, rows: int, k: int, gated: bool, arch: str,
                 sm_count: int, gpu: str | None = None) -> list:
    scored = []
    for i, (tr, w, st, tk) in enumerate(SHAPES):
        for s in MOE_SPLIT_K:
            c = Sm120MoeConfig(tile_n=tile_n, tile_rows=tr, tile_k=tk, num_warps=w, stages=st, split_k=s, pdl=True)
            if moe_shape_problem(c, rows, k, gated):
                continue
            lo, hi = gemm_range_us(c, m, top_k, num_experts, rows, k, gated, arch, sm_count, gpu)
            scored.append(((lo + hi) / 2, i, s, c))
    scored.sort(key=lambda t: (round(t[0], 3), t[1], t[2]))
    return [(c, us) for us, _, _, c in scored[:PER_GEMM]]


def moe_candidates(m: int, num_experts: int, top_k: int, hidden: int, inter: int, arch: str = "sm_120a",
                   sm_count: int = 0, max_candidates: int = MAX_CANDIDATES, gpu: str | None = None) -> list:
    """Ranked ((GEMM1 config, GEMM2 config), modelled us) at ``m`` tokens (a MODEL) on ``gpu``'s hardware
    profile (default: the arch's default GPU)."""
    pairs = []
    for tn in token_tiles(m, top_k, num_experts):
        g1 = _ranked_gemm(tn, m, top_k, num_experts, 2 * inter, hidden, True, arch, sm_count, gpu)
        g2 = _ranked_gemm(tn, m, top_k, num_experts, hidden, inter, False, arch, sm_count, gpu)
        pairs += [((c1, c2), u1 + u2) for c1, u1 in g1 for c2, u2 in g2]
    pairs.sort(key=lambda p: (round(p[1], 3), p[0][0].tile_n))
    return pairs[:max_candidates]


@functools.lru_cache(maxsize=1024)
def pick_moe_configs(m: int, num_experts: int, top_k: int, hidden: int, inter: int, arch: str = "sm_120a",
                     sm_count: int = 0) -> tuple[Sm120MoeConfig, Sm120MoeConfig]:
    """The run-time pick: the first candidate at the upper M of ``m``'s bucket (one pair per bucket)."""
    _, hi = bucket_of(m)
    cands = moe_candidates(hi, num_experts, top_k, hidden, inter, arch, sm_count, max_candidates=1)
    if not cands:
        raise ValueError(f"nvgemm sm120 moe: no implementable config for H={hidden} I={inter} (E={num_experts}, "
                         f"top_k={top_k})")
    return cands[0][0]


def format_plan(shape, ms, gpu: str = "RTX5090", max_candidates: int = MAX_CANDIDATES) -> str:
    """``nvgemm plan`` on an sm_120a / sm_121a target (W4A4): per M, the ranked (GEMM1, GEMM2) pairs with their
    modelled times on ``gpu``'s profile (``shape``: a :class:`nvgemm.templates.sm90_moe.policy.MoeShape`)."""
    from nvgemm.heuristics.perfmodel.hardware import get_hardware  # lazy: only the plan CLI prints this

    hw = get_hardware(gpu)
    lines = [f"{shape.name}: {shape.num_experts} experts, top-{shape.top_k}, H={shape.hidden}, I={shape.inter}"
             f"{f', shared I={shape.shared_inter} (dense W4A4 GEMMs, above)' if shape.shared_inter else ''} on "
             f"{hw.name} (sm120 grouped W4A4; times are a MODEL: kernel + launch per GEMM, uniform routing)"]
    for m in ms:
        lo, hi = bucket_of(m)
        a = expected_active_experts(m, shape.top_k, shape.num_experts)
        lines.append(f"  M={m} (bucket {lo}..{hi}): ~{a:.1f} active experts, {m * shape.top_k / a:.2f} pairs per "
                     "active expert")
        cands = moe_candidates(m, shape.num_experts, shape.top_k, shape.hidden, shape.inter, hw.arch, hw.sm_count,
                               max_candidates, gpu=hw.name)
        for i, ((c1, c2), _) in enumerate(cands):
            r1 = gemm_range_us(c1, m, shape.top_k, shape.num_experts, 2 * shape.inter, shape.hidden, True, hw.arch,
                               hw.sm_count, hw.name)
            r2 = gemm_range_us(c2, m, shape.top_k, shape.num_experts, shape.hidden, shape.inter, False, hw.arch,
                               hw.sm_count, hw.name)
            us = (r1[0] + r2[0], r1[1] + r2[1])
            lines.append(f"    {i + 1}. tile_n={c1.tile_n}  {sum(us) / 2:7.1f} us  [{us[0]:.1f}-{us[1]:.1f}]  "
                         f"G1 {c1.name().replace('nvgemm_cutedsl_sm120_moe_', '')}  "
                         f"G2 {c2.name().replace('nvgemm_cutedsl_sm120_moe_', '')}")
    return "\n".join(lines)


__all__ = ["MAX_CANDIDATES", "SHAPES", "format_plan", "moe_candidates", "pick_moe_configs", "token_tiles"]
