"""Candidate policy for the sm90 NVFP4 weight-only (W4A16) kernels (``Sm90W4A16Config``).

Self-contained (the Hopper-kernel helper may retune it). nvMatmulHeuristics has no mixed
bf16 x FP4 precision, so this family is rule-based only.

Today only the ``gemv`` family has a template (``templates/sm90_w4a16_gemv.py``); it serves any
M (M > tile_m adds grid rows that re-read the weights, from L2 when they fit). Its knobs (see
``templates/sm90_config.py``): tile_m activation rows per CTA, tile_n weight rows per CTA,
tile_k = 32 x threads x v (v 16-byte vectors per thread per step), num_warps, split_k CTAs along
K, stages 1, no PDL. Rules:

    tile_m     the smallest power of two >= M, at most 8 (register budget); M > 8 -> 8
    tile_n     16 first (N/16 CTAs fill an H100 for every preset shape), then 8 and 32
    warps      4 (tile_k 4096) first; 8 warps (tile_k 8192) for K >= 8192; 2 and 1 warp for short K
    v          2 vectors per thread where the register rule of validate_config allows (tile_m 8)
    split-K    when the CTAs leave most SMs idle (:func:`nvgemm.heuristics.problem.choose_split_k`,
               in whole tile_k steps)

``wgmma`` (larger M, template ``sm90_w4a16_wgmma``) is emitted first for M > 32 when
:data:`WGMMA_AVAILABLE` is set (the gemv candidates follow as fallbacks). Every emitted config
passes ``can_implement``.
"""

from __future__ import annotations

from dataclasses import replace

from nvgemm.templates.sm90_config import Sm90W4A16Config

from .implementable import can_implement
from .problem import Candidate, GemmProblem, ceil_div, choose_split_k

W = Sm90W4A16Config
WGMMA_AVAILABLE = True
GEMV_MAX_TILE_M = 8


def _next_pow2(x: int) -> int:
    p = 1
    while p < x:
        p *= 2
    return p


def _gemv(tm: int, tn: int, warps: int, v: int = 1) -> Sm90W4A16Config:
    return W("gemv", tile_m=tm, tile_n=tn, tile_k=32 * 32 * warps * v, num_warps=warps, stages=1, pdl=False)


def rule_candidates(problem: GemmProblem) -> list[Candidate]:
    m, n, k, sm = problem.m_hi, problem.n, problem.k, problem.target.sm_count
    out: list[Candidate] = []
    seen: set = set()

    def add(cfg: Sm90W4A16Config, reason: str) -> None:
        ctas = ceil_div(m, cfg.tile_m) * ceil_div(n, cfg.tile_n)
        s = choose_split_k(ctas, k, cfg.tile_k, sm)
        if s > 1 and can_implement(problem, replace(cfg, split_k=s)):
            cfg = replace(cfg, split_k=s)
            reason = f"{reason}; split-K {s}: {ctas} CTAs -> {ctas * s} on {sm} SMs"
        if cfg not in seen and can_implement(problem, cfg):
            seen.add(cfg)
            out.append(Candidate(cfg, reason))

    if WGMMA_AVAILABLE and m > 32:
        tmw = 64 if m <= 64 else 128
        warps = 4 if tmw == 64 else 8
        add(W("wgmma", tmw, 128, 64, num_warps=warps, stages=4, pdl=False), f"M={m}: wgmma {tmw}x128")
        add(W("wgmma", tmw, 256, 64, num_warps=warps, stages=3, pdl=False), f"M={m}: wgmma {tmw}x256")
    tm = min(_next_pow2(m), GEMV_MAX_TILE_M)
    band = f"decode M<={tm}" if m <= GEMV_MAX_TILE_M else f"M={m}: gemv in {ceil_div(m, tm)} row groups"
    add(_gemv(tm, 16, 4), f"{band}: gemv tile_m={tm}, 16 weight rows x 4 warps along K")
    add(_gemv(tm, 8, 4), f"{band}: gemv, 8 weight rows per CTA (more CTAs)")
    add(_gemv(tm, 32, 4), f"{band}: gemv, 32 weight rows per CTA (activation reuse)")
    if k >= 8192:
        add(_gemv(tm, 16, 8), f"{band}: gemv, 8 warps along K (tile_k 8192)")
    add(_gemv(tm, 16, 4, v=2), f"{band}: gemv, 2 vectors per thread in flight")
    add(_gemv(tm, 16, 2), f"{band}: gemv, 2 warps (tile_k 2048, more CTAs per SM)")
    add(_gemv(tm, 8, 1), f"{band}: gemv, 1 warp per CTA (tile_k 1024)")
    return out


def candidates(problem: GemmProblem, max_candidates: int = 8, use_nvmmh: bool = True) -> list[Candidate]:
    del use_nvmmh  # no nvMatmulHeuristics precision for bf16 x fp4
    return rule_candidates(problem)[:max_candidates]
