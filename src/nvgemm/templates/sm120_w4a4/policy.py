"""Candidate policy of the sm120 W4A4 decode kernel (``Sm120W4A4Config``), ranked by the family's
byte / latency model (:mod:`.perf`: a MODEL until a consumer-Blackwell GPU measures it).

Candidates: tokens per CTA from M (8 / 16 / 32; larger M runs more M tiles), the shapes of
:data:`SHAPES` (rows per CTA, warps, stages, tile_k), and split-K where it brings the grid to one to
three waves of resident CTAs (decode layers with few row blocks); filtered by ``can_implement``,
ordered by the mean of the model's optimistic and pessimistic times (ties keep :data:`SHAPES`
order). PDL is on.
"""

from __future__ import annotations

from functools import lru_cache

from nvgemm.core.problem import Candidate, GemmProblem, Target
from nvgemm.templates.sm120_w4a4.config import Sm120W4A4Config, k_stages
from nvgemm.templates.sm120_w4a4.perf import ctas_per_sm, device_for, model_range_us
from nvgemm.templates.sm120_w4a4.validity import can_implement, can_implement_problem

#: (tile_n, num_warps, stages, tile_k): 2 row tiles per warp first (two MMAs per B fragment load),
#: then 1 and 4; a shape whose ring does not fit 99 KB at the problem's tile_m is dropped by
#: ``can_implement``.
SHAPES = ((128, 4, 4, 256), (256, 8, 3, 256), (128, 4, 3, 256), (64, 2, 4, 256), (256, 4, 3, 128),
          (128, 8, 4, 256), (128, 2, 4, 256), (64, 4, 4, 256))
SPLITS = (1, 2, 3, 4, 6, 8)


def tile_m_for(m: int) -> int:
    return 8 if m <= 8 else (16 if m <= 16 else 32)


def _configs(m: int, n: int, k: int, gated: bool, dev) -> list[Sm120W4A4Config]:
    tm = tile_m_for(m)
    out = []
    for tn, w, st, tk in SHAPES:
        base = Sm120W4A4Config(tile_m=tm, tile_n=tn, tile_k=tk, num_warps=w, stages=st, pdl=True)
        per_sm = ctas_per_sm(base, dev)
        feat = tn // 2 if gated else tn
        ctas = -(-(n // 2 if gated else n) // feat) * -(-m // tm)
        cap = dev.sm_count * max(per_sm, 1)
        for s in SPLITS:
            if s > 1 and (s > k_stages(k, tk) or ctas * s > 3 * cap or ctas >= cap):
                continue
            out.append(Sm120W4A4Config(tile_m=tm, tile_n=tn, tile_k=tk, num_warps=w, stages=st, split_k=s, pdl=True))
    return out


@lru_cache(maxsize=4096)
def ranked(m: int, n: int, k: int, activation: str, arch: str, sm_count: int, out_bytes: int = 2,
           gpu: str | None = None) -> tuple:
    """((config, (optimistic us, pessimistic us)), ...) of the implementable candidates, fastest first, modelled
    on ``gpu``'s hardware profile (default: the arch's default GPU; :func:`.perf.device_for`)."""
    dev = device_for(arch, sm_count, gpu)
    gated = activation == "silu_mul"
    scored = []
    for i, c in enumerate(_configs(m, n, k, gated, dev)):
        if not can_implement_problem(c, m=m, n=n, k=k, activation=activation, arch=arch):
            continue
        lo, hi = model_range_us(c, m, n, k, dev, gated, out_bytes)
        scored.append(((lo + hi) / 2, i, c, (lo, hi)))
    scored.sort(key=lambda t: (round(t[0], 3), t[1]))
    return tuple((c, r) for _, _, c, r in scored)


def pick_config(m: int, n: int, k: int, activation: str, arch: str, sm_count: int = 0, gpu: str | None = None):
    """The policy's first candidate (None: nothing implementable)."""
    r = ranked(m, n, k, activation, arch, sm_count, 2, gpu)
    return r[0][0] if r else None


_OUT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def candidates(problem: GemmProblem, max_candidates: int = 8, use_nvmmh: bool = True) -> list[Candidate]:
    """The family's ranked candidates for a dense W4A4 ``problem`` on sm_120a / sm_121a."""
    del use_nvmmh  # nvMatmulHeuristics has no sm_120 block-scaled warp-MMA kernels to rank
    t: Target = problem.target
    out = []
    for c, (lo, hi) in ranked(problem.m_hi, problem.n, problem.k, problem.epilogue, t.arch, t.sm_count,
                              _OUT_BYTES.get(problem.out_dtype, 2), t.gpu):
        if not can_implement(problem, c):
            continue
        out.append(Candidate(c, f"sm120 decode kernel {c.tile_m} tokens x {c.tile_n} rows per CTA, {c.num_warps} "
                                f"warps, {c.stages}-stage ring, split-K {c.split_k}: modelled {lo:.1f}-{hi:.1f} us "
                                "(a model)"))
        if len(out) >= max_candidates:
            break
    return out


__all__ = ["SHAPES", "SPLITS", "candidates", "pick_config", "ranked", "tile_m_for"]
