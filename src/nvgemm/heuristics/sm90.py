"""Candidate policy for the sm90 NVFP4 weight-only (W4A16) kernels (``Sm90W4A16Config``).

Self-contained (the Hopper-kernel helper may retune it). nvMatmulHeuristics has no mixed
bf16 x FP4 precision, so this family is rule-based only:

    M <= 32   "gemv" bandwidth kernel: tile_m = the smallest power of two >= M (weights read once),
              tile_n 64/128, tile_k 256/512, plus a tile_m=8 variant for 9..32 (more CTAs, L2
              reuse of weights) and a wgmma 64-row fallback.
    M > 32    "wgmma": tile_m 64 (M <= 64) or 128, tile_n 128/256 (and 64 when tiles are few).

Split-K whenever the output tiles leave most SMs idle (same rule as sm100:
:func:`nvgemm.heuristics.problem.choose_split_k`). Every config passes ``can_implement``.
"""

from __future__ import annotations

from dataclasses import replace

from nvgemm.templates.sm90_config import Sm90W4A16Config

from .implementable import SM90_GEMV_MAX_M, can_implement
from .problem import Candidate, GemmProblem, ceil_div, choose_split_k

W = Sm90W4A16Config


def _ctas(cfg: Sm90W4A16Config, m: int, n: int) -> int:
    return ceil_div(m, cfg.tile_m) * ceil_div(n, cfg.tile_n)


def _next_pow2(x: int) -> int:
    p = 1
    while p < x:
        p *= 2
    return p


def rule_candidates(problem: GemmProblem) -> list[Candidate]:
    m, n, sm = problem.m_hi, problem.n, problem.target.sm_count
    out: list[Candidate] = []
    seen: set = set()

    def add(cfg: Sm90W4A16Config, reason: str) -> None:
        ctas = _ctas(cfg, m, n)
        s = choose_split_k(ctas, problem.k, cfg.tile_k, sm)
        if s > 1 and can_implement(problem, replace(cfg, split_k=s)):
            cfg = replace(cfg, split_k=s)
            reason = f"{reason}; split-K {s}: {ctas} tiles -> {ctas * s} CTAs on {sm} SMs"
        if cfg not in seen and can_implement(problem, cfg):
            seen.add(cfg)
            out.append(Candidate(cfg, reason))

    if m <= SM90_GEMV_MAX_M:
        tm = _next_pow2(m)
        band = f"decode M<={tm}"
        add(W("gemv", tm, 64, 256, num_warps=4, stages=2), f"{band}: gemv, tile_m={tm} reads each weight once")
        add(W("gemv", tm, 128, 256, num_warps=4, stages=2), f"{band}: gemv, wider 128-column tile")
        add(W("gemv", tm, 64, 512, num_warps=8, stages=2), f"{band}: gemv, 512-deep K step, 8 warps")
        add(W("gemv", tm, 128, 512, num_warps=8, stages=3), f"{band}: gemv, 128x512, 3 stages")
        if tm > 8:
            add(W("gemv", 8, 64, 256, num_warps=4, stages=2), f"{band}: gemv, tile_m=8 (more CTAs, weights hit L2)")
        add(W("wgmma", 64, 128, 64, num_warps=4, stages=4), f"{band}: wgmma 64x128 fallback")
    else:
        tm = 64 if m <= 64 else 128
        warps = 4 if tm == 64 else 8
        band = f"batch M<={m}" if m <= 256 else "prefill"
        add(W("wgmma", tm, 128, 64, num_warps=warps, stages=4), f"{band}: wgmma {tm}x128, bf16 dequant in smem")
        add(W("wgmma", tm, 256, 64, num_warps=warps, stages=3), f"{band}: wgmma {tm}x256")
        if tm == 128:
            add(W("wgmma", 64, 128, 64, num_warps=4, stages=4), f"{band}: wgmma 64x128 (more CTAs)")
        add(W("wgmma", tm, 64, 64, num_warps=4, stages=4), f"{band}: wgmma {tm}x64 (more CTAs)")
        add(W("wgmma", tm, 128, 128, num_warps=warps, stages=3), f"{band}: wgmma {tm}x128, 128-deep K step")
    return out


def candidates(problem: GemmProblem, max_candidates: int = 8, use_nvmmh: bool = True) -> list[Candidate]:
    del use_nvmmh  # no nvMatmulHeuristics precision for bf16 x FP4
    return rule_candidates(problem)[:max_candidates]
