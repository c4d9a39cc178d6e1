"""Candidate policy for the sm90 NVFP4 weight-only (W4A16) kernels (``Sm90W4A16Config``), ranked
by the performance model (:mod:`nvgemm.perfmodel`: a MODEL until an H200 measures it).

nvMatmulHeuristics has no mixed bf16 x FP4 precision, so the candidates come from the two kernel
families' search spaces (``templates/sm90/config.py``), filtered by ``can_implement`` and ordered
by modelled time on the target (H200 figures, the target's SM count); configs whose SASS (the
model's committed facts table) spills to local memory are dropped:

* ``mma`` (decode kernel, mma.sync tensor cores, cp.async ring, in-kernel split-K): every M; the
  model prices tile_m (8 / 16 / 32 tokens per CTA; more tokens = more M tiles that re-read the
  weights), row tiles per warp, warps, ring depth and split-K (which fills the SMs on the small
  layers and pays an fp32 partial round trip);
* ``wgmma`` (weights decoded into shared memory, WGMMA): M > 32, where tensor-core throughput and
  M-tile count start to matter.

The first candidate is the model's fastest; the reason string carries its modelled time and the
modelled bf16 cuBLAS time of the same GEMM. If the model cannot price a config (no SASS facts in
the table), the families' default order applies (``_RULE_ORDER``). PDL is on for the mma family.
"""

from __future__ import annotations

from dataclasses import replace

from nvgemm.templates.sm90.config import Sm90W4A16Config

from .implementable import can_implement
from .problem import Candidate, GemmProblem, ceil_div

W = Sm90W4A16Config
#: mma configs the policy considers (before split-K): (tile_n, num_warps, stages); tile_k 256. The
#: first eight have >= 2 row tiles per warp (2.0-2.2 SASS instructions per weight element at tile_m
#: 8); the last two have one row tile per warp in 8 warps, which the model prefers at 32 tokens per
#: CTA (fewer registers, more warps to hide latency) at ~3.6 instructions per element. Ties keep
#: this order.
MMA_SHAPES = ((128, 4, 4), (128, 2, 4), (64, 2, 4), (128, 4, 3), (256, 4, 3), (256, 4, 4), (256, 8, 3), (64, 2, 3),
              (128, 8, 3), (128, 8, 4))
MMA_SPLITS = (1, 2, 3, 4, 6, 7, 8)
WGMMA_SHAPES = ((64, 128), (64, 64), (128, 128), (128, 64))
WGMMA_SPLITS = (1, 2, 4)


def _tile_m(m: int) -> int:
    return 8 if m <= 8 else (16 if m <= 16 else 32)


def rule_candidates(problem: GemmProblem) -> list[Candidate]:
    """Every implementable candidate, in the families' default order (no model)."""
    m, n = problem.m_hi, problem.n
    out: list[Candidate] = []
    seen: set = set()

    def add(cfg: Sm90W4A16Config, reason: str) -> None:
        if cfg not in seen and can_implement(problem, cfg):
            seen.add(cfg)
            out.append(Candidate(cfg, reason))

    tm = _tile_m(m)
    sms = problem.target.sm_count
    grid_m = ceil_div(m, tm)
    for tn, w, st in MMA_SHAPES:
        ctas = ceil_div(n, tn) * grid_m
        # split-K only to bring the grid to one to three CTAs per SM (the model prices the rest)
        splits = [s for s in MMA_SPLITS if s == 1 or sms <= ctas * s <= 3 * sms]
        for s in splits:
            add(W("mma", tile_m=tm, tile_n=tn, tile_k=256, split_k=s, num_warps=w, stages=st, pdl=True),
                f"decode kernel: {tm} tokens x {tn} rows per CTA, {w} warps, {st}-stage ring, split-K {s}")
    if m > 32:
        for tmw, tn in WGMMA_SHAPES:
            for s in WGMMA_SPLITS:
                add(W("wgmma", tile_m=tmw, tile_n=tn, tile_k=64, split_k=s, num_warps=4 * tmw // 64, stages=1),
                    f"M={m}: wgmma {tmw}x{tn}, split-K {s}")
    return out


def _gpu_of(problem: GemmProblem) -> str:
    gpu = (problem.target.gpu or "").upper()
    return gpu if gpu in ("H100", "H200") else "H200"


def ranked_candidates(problem: GemmProblem) -> list[Candidate]:
    """:func:`rule_candidates` ordered by the performance model (fastest first); candidates the
    model cannot price keep their rule order after the priced ones."""
    cands = rule_candidates(problem)
    try:
        from nvgemm.perfmodel import bf16_baseline, lookup, rank
    except ImportError:  # pragma: no cover - the model ships with nvgemm
        return cands

    def spills(c: Candidate) -> bool:  # no spills anywhere (the SASS facts table says)
        f = lookup(c.config, "sm_90a")
        return f is not None and (f.ldl or f.stl) > 0

    cands = [c for c in cands if not spills(c)]
    m, n, k = problem.m_hi, problem.n, problem.k
    gpu, sms = _gpu_of(problem), problem.target.sm_count
    ranked = rank(cands, m, n, k, gpu, sms, key=lambda c: c.config)
    if not ranked:
        return cands
    base = bf16_baseline(m, n, k, gpu, sms)
    b_mid = 0.5 * (base.total_us[0] + base.total_us[1])
    priced = {id(c) for c, _ in ranked}
    out = [replace(c, reason=f"{c.reason}; modelled {e.mid_us:.1f} us (bf16 cuBLAS modelled {b_mid:.1f} us)",
                   est_runtime_us=e.mid_us)
           for c, e in ranked]
    return out + [c for c in cands if id(c) not in priced]


def candidates(problem: GemmProblem, max_candidates: int = 8, use_nvmmh: bool = True) -> list[Candidate]:
    del use_nvmmh  # no nvMatmulHeuristics precision for bf16 x fp4
    return ranked_candidates(problem)[:max_candidates]


__all__ = ["candidates", "ranked_candidates", "rule_candidates"]
