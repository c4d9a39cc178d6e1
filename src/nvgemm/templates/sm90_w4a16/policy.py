"""Candidate policy for the sm90 NVFP4 weight-only (W4A16) kernels (``Sm90W4A16Config``), ranked
by the performance model (:mod:`nvgemm.heuristics.perfmodel`: a MODEL until an H200 measures it).

nvMatmulHeuristics has no mixed bf16 x FP4 precision, so the candidates come from the two kernel
families' search spaces (``templates/sm90_w4a16/config.py``), filtered by ``can_implement`` and ordered
by modelled time on the target (H200 figures, the target's SM count); a (config, activation) variant
whose own SASS spills to local memory (the ``spills`` records of the model's committed table,
compiled with the reference and the fullest epilogue: ``bench/compile_sweep_sm90.py``) is dropped,
and each variant is priced with its own main-loop SASS facts where those records hold them (the
problem's activation; ``perfmodel.table.variant_facts``). All candidates of a problem are priced
at once (``perfmodel.batch``):

* ``mma`` (decode kernel, mma.sync tensor cores, cp.async ring, in-kernel split-K): every M; the
  model prices tile_m (8 / 16 / 32 tokens per CTA; more tokens = more M tiles that re-read the
  weights), row tiles per warp, warps, ring depth and split-K (which fills the SMs on the small
  layers and pays an fp32 partial round trip);
* ``wgmma`` (the same register decode as the A operand of a pipelined WGMMA, tokens as its N,
  activations in shared memory): M >= 16, where the mma family's MMAs and re-read M tiles start
  to cost; the model prices tokens per CTA (16 .. 256), rows per CTA, stage depth and split-K.

The first candidate is the model's fastest; the reason string carries its modelled time and the
modelled bf16 cuBLAS time of the same GEMM. If the model cannot price a config (no SASS facts in
the table), it keeps its place in the families' default order after the priced ones. PDL is on
where the arch has ``griddepcontrol`` (sm_90a, sm_120a, sm_121a). On sm_80 / sm_86 / sm_89 /
sm_120a / sm_121a only the ``mma`` family runs (``wgmma`` is sm_90a only); the model prices it on the target
GPU's hardware description with the SASS facts of the same config -- the main-loop timing facts of
the arch's own compile sweep where it recorded them (one kernel source and the same instruction
count, but ptxas encodes longer stalls on sm_120a), else sm_90a's -- and drops what that arch's
own compile sweep found spilling.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from nvgemm.templates.sm90_w4a16.config import (
    ARCH_CAPS, SM90_ARCHS, WGMMA_SHAPES, WGMMA_TILE_M, Sm90W4A16Config, wgmma_tail_tiles,
)

from nvgemm.templates.sm90_w4a16.validity import sm90_config_fits, sm90_problem_status
from nvgemm.core.problem import Candidate, GemmProblem, ceil_div

W = Sm90W4A16Config
#: mma configs the policy considers (before split-K): (tile_n, num_warps, stages); tile_k 256. The
#: first eight have >= 2 row tiles per warp (2.0-2.2 SASS instructions per weight element at tile_m
#: 8); the last two have one row tile per warp in 8 warps, which the model prefers at 32 tokens per
#: CTA (fewer registers, more warps to hide latency) at ~3.6 instructions per element. Ties keep
#: this order.
MMA_SHAPES = ((128, 4, 4), (128, 2, 4), (64, 2, 4), (128, 4, 3), (256, 4, 3), (256, 4, 4), (256, 8, 3), (64, 2, 3),
              (128, 8, 3), (128, 8, 4))
MMA_SPLITS = (1, 2, 3, 4, 6, 7, 8)
#: M tiles run side by side per row block; the policy prices 1..WGMMA_MAX_GRID_M of them
WGMMA_MAX_GRID_M = 4
WGMMA_SPLITS = (1, 2, 3, 4, 6, 8)
WGMMA_MIN_M = 16
#: Model ties at decode sizes (M <= 32): the picks there are byte-bound with issue floors well
#: below the byte floor, and configs within 3 % differ only in latency-chain terms the model cannot
#: vouch for; among those the one issuing fewer main-loop instructions per weight element leads
#: (``perfmodel.rank``). Larger M keeps the model's default (1 %): it is tensor-core / issue bound.
DECODE_TIE = 0.03


def _tile_m(m: int) -> int:
    return 8 if m <= 8 else (16 if m <= 16 else 32)


def wgmma_tile_ms(m: int) -> list[int]:
    """Tokens per CTA worth pricing for M: for 1..WGMMA_MAX_GRID_M M tiles side by side, the
    smallest WGMMA N that covers M in that many tiles (least padding); beyond 4 x 256, 256."""
    out: list[int] = []
    for gm in range(1, WGMMA_MAX_GRID_M + 1):
        need = -(-m // gm)
        t = next((t for t in WGMMA_TILE_M if t >= need), None)
        if t is not None and t not in out:
            out.append(t)
    return out or [WGMMA_TILE_M[-1]]


def rule_candidates(problem: GemmProblem) -> list[Candidate]:
    """Every implementable candidate, in the families' default order (no model)."""
    m, n = problem.m_hi, problem.n
    out: list[Candidate] = []
    seen: set = set()

    if not sm90_problem_status(problem):
        return out  # can_implement fails for every config (the problem's own rules)

    def add(*key) -> None:  # can_implement, less the problem rules checked above
        if key not in seen:  # the config's fields: equal keys, equal configs
            cand = _candidate(*key)
            if sm90_config_fits(problem, cand.config):
                seen.add(key)
                out.append(cand)

    tm = _tile_m(m)
    sms = problem.target.sm_count
    arch = problem.target.arch
    pdl = ARCH_CAPS[arch].pdl  # griddepcontrol: sm_90+
    grid_m = ceil_div(m, tm)
    for tn, w, st in MMA_SHAPES:
        ctas = ceil_div(n, tn) * grid_m
        # split-K only to bring the grid to one to three CTAs per SM (the model prices the rest)
        splits = [s for s in MMA_SPLITS if s == 1 or sms <= ctas * s <= 3 * sms]
        for s in splits:
            add("mma", tm, tn, 256, s, w, st, pdl)
    if m >= WGMMA_MIN_M and arch in SM90_ARCHS:
        for tmw in wgmma_tile_ms(m):
            for tn, w, tk, st in WGMMA_SHAPES:
                # split-K splits only the tiles of the last, partial wave, into split_k CTAs each:
                # priced where that tail exists (else every split_k runs the unsplit kernel) and its
                # split CTAs fit in two rounds of one CTA per SM (more only adds rounds to the tail)
                tiles = ceil_div(n, tn) * ceil_div(m, tmw)
                for s in WGMMA_SPLITS:
                    if s > 1:
                        tail = wgmma_tail_tiles(tiles, s, sms)
                        if not tail or tail * s > 2 * sms:
                            continue
                    add("wgmma", tmw, tn, tk, s, w, st, pdl)
    return out


@lru_cache(maxsize=4096)
def _candidate(family: str, tm: int, tn: int, tk: int, s: int, w: int, st: int, pdl: bool = True) -> Candidate:
    """The rule candidate of one config with its reason (shape-independent: memoised)."""
    cfg = W(family, tile_m=tm, tile_n=tn, tile_k=tk, split_k=s, num_warps=w, stages=st, pdl=pdl)
    if family == "mma":
        return Candidate(cfg, f"decode kernel: {tm} tokens x {tn} rows per CTA, {w} warps, {st}-stage ring, "
                              f"split-K {s}")
    return Candidate(cfg, f"wgmma (register-A decode): {tm} tokens x {tn} rows per CTA, {w} warps, tile_k {tk}, "
                          f"{st}-stage ring, split-K {s}")


def _gpu_of(problem: GemmProblem) -> str:
    """The modelled GPU: the target's own when the model describes it for the target's arch, else the
    arch's default (``perfmodel.hardware.DEFAULT_GPU_OF_ARCH``; H200 for sm_90a)."""
    # lazy: heuristics.perfmodel sits above the templates' pure-Python modules (see ranked_candidates)
    from nvgemm.heuristics.perfmodel.hardware import DEFAULT_GPU_OF_ARCH, GPUS

    arch = problem.target.arch
    gpu = (problem.target.gpu or "").upper()
    if gpu in GPUS and GPUS[gpu].arch == arch:
        return gpu
    return DEFAULT_GPU_OF_ARCH.get(arch, "H200")


def ranked_candidates(problem: GemmProblem, limit: int | None = None) -> list[Candidate]:
    """:func:`rule_candidates` ordered by the performance model (fastest first); candidates the
    model cannot price keep their rule order after the priced ones. ``limit``: the first
    ``limit`` only. The model's fast path prices them (``rank(..., report=False)``: no full
    report is built)."""
    cands = rule_candidates(problem)
    try:
        # lazy: breaks the cycle templates.sm90_w4a16.policy <-> heuristics.perfmodel (through a package __init__); breaks the cycle templates.sm90_w4a16.policy <-> heuristics.perfmodel.table (through a package __init__)
        from nvgemm.heuristics.perfmodel import MODEL_TIE, bf16_baseline, estimate_us, rank
        from nvgemm.heuristics.perfmodel.table import load_table, spill_status
    except ImportError:  # pragma: no cover - the model ships with nvgemm
        return cands

    table = load_table()

    def spills(c: Candidate) -> bool:  # the variant's own SASS spills (per config and activation)
        return bool(spill_status(c.config, problem.epilogue, problem.target.arch, table))

    cands = [c for c in cands if not spills(c)]
    m, n, k = problem.m_hi, problem.n, problem.k
    gpu, sms, act = _gpu_of(problem), problem.target.sm_count, problem.epilogue
    ranked = rank(cands, m, n, k, gpu, sms, key=lambda c: c.config, tie=DECODE_TIE if m <= 32 else MODEL_TIE,
                  limit=limit, report=False, activation=act)
    if not ranked:
        return cands[:limit]
    base = bf16_baseline(m, n, k, gpu, sms)
    b_mid = 0.5 * (base.total_us[0] + base.total_us[1])
    # the model's time goes into the reason (labelled); est_runtime_us stays nvMatmulHeuristics' field
    out = [replace(c, reason=f"{c.reason}; model {0.5 * (t[0] + t[1]):.1f} us (bf16 cuBLAS model {b_mid:.1f} us)")
           for c, t in ranked]
    if limit is not None and len(out) >= limit:
        return out  # the unpriced ones would come after these
    priced = {id(c) for c in cands if estimate_us(c.config, m, n, k, gpu, sms, act) is not None}
    out += [c for c in cands if id(c) not in priced]
    return out if limit is None else out[:limit]


def candidates(problem: GemmProblem, max_candidates: int = 8, use_nvmmh: bool = True) -> list[Candidate]:
    del use_nvmmh  # no nvMatmulHeuristics precision for bf16 x fp4
    return ranked_candidates(problem, limit=max_candidates)


__all__ = ["WGMMA_SHAPES", "candidates", "ranked_candidates", "rule_candidates", "wgmma_tile_ms"]
