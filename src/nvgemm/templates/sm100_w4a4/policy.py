"""Candidate policy for the sm100 NVFP4 W4A4 GEMM (``Sm100Nvfp4GemmConfig``).

Two sources, merged into one ranked, capped, deterministic list:

(a) nvgemm's decode rules, by token-count band (``m_hi`` = exact M or the range's upper bound):

    M <= 32     swap-AB (weights fill the 128-row MMA side), the narrowest tile_n in {8,16,32}
                that covers M (one token tile), cluster_m 1/2/4 (activation multicast), the next
                wider tile, and an L2-prefetch variant. Needs N >= 128, else native.
    33..64      swap-AB tile_n=64 (1-CTA and 2-CTA 256-row weight tiles), cluster_m 2.
    65..128     2-CTA swap-AB 256x128, 1-CTA swap 128x128 and 256x64, native 128x64.
    129..256    native 2-CTA 256x128 and 1-CTA 128x128/128x64, 2-CTA swap-AB 256x128.
    257..1024   native tiles ranked by wave efficiency x operand reuse (2-CTA 256xN and 128xN).
    > 1024      the same ranking over the large tiles.

    In every band, split-K is added when the output tiles would leave most SMs idle
    (CTAs <= SMs/2): the factor with the lowest waves x (K tiles per slice + 1) among those that
    split K into equal slices of >= 2 whole 256-wide tiles
    (:func:`nvgemm.core.problem.choose_split_k`). The split variant takes the rule's place;
    the band's first tile also stays in unsplit right after it.

(b) nvMatmulHeuristics picks (:mod:`nvgemm.heuristics.nvmmh`) for the problem in the band's main
    orientation (swap-AB for M <= 128, native above), with the logical K and the correct
    precision string, restricted to nvgemm's space, each mapped to the 1-CTA config and, for
    M > 32 with an even cluster_m and a kernel-M extent >= 256, also to the 2-CTA config; a
    split-K nvgemm lacks (3, 5, 6 ...) is snapped to the nearest implementable factor.

tile_n 256 is never emitted (rules or library): the kernel has one TMEM accumulator stage there and
no overlapping accumulator, so its MMA warp idles through every epilogue; 192/128-wide tiles keep
two accumulator stages (``POLICY_TILE_N``).

Merge order: decode bands (M <= 64) take two rule candidates per nvMatmulHeuristics pick
(the library does not model narrow tiles well), 65..256 alternate, above 256 the library leads.
Duplicates are merged (the rule's reason plus the library's rank and estimate). Every emitted
config passes the family's :func:`nvgemm.templates.sm100_w4a4.validity.can_implement`.
"""

from __future__ import annotations

from dataclasses import replace

from nvgemm.templates.sm100_w4a4.config import (
    SM100_CLUSTER,
    SM100_SPLIT_K,
    SM100_TILE_K,
    SM100_TILE_N,
    Sm100Nvfp4GemmConfig,
)

from nvgemm.heuristics import nvmmh
from nvgemm.templates.sm100_w4a4.validity import NARROW_TILE_N, SWAP_AB_MAX_M, can_implement
from nvgemm.core.problem import Candidate, GemmProblem, ceil_div, choose_split_k

C = Sm100Nvfp4GemmConfig
NARROW_TILES = (8, 16, 32)
SWAP_MIN_N = 128
NVMMH_COUNT = 4
NVMMH_COUNT_DECODE = 4
#: the per-CTA configs nvMatmulHeuristics may answer with (the kernel's tile_n and cluster sets)
NVMMH_SPACE = nvmmh.NvmmhSpace(tile_n=frozenset(SM100_TILE_N), cluster=frozenset(SM100_CLUSTER))
# Weight bytes above which a decode GEMM streams its weights from HBM (L2 cannot hold them across
# calls): an L2-prefetch variant of the primary decode tile is then worth measuring.
PREFETCH_MIN_WEIGHT_BYTES = 8 << 20
# tile_n the policy emits: all of the config space except 256 (one accumulator stage, see above)
POLICY_TILE_N = tuple(t for t in SM100_TILE_N if t != 256)
LARGE_TILES = ((256, 192, 2, 1), (256, 128, 2, 1), (128, 192, 1, 1), (128, 128, 1, 1), (256, 64, 2, 1))
MID_TILES = ((256, 128, 2, 1), (128, 128, 1, 1), (256, 192, 2, 1), (128, 64, 1, 1), (128, 192, 1, 1), (256, 64, 2, 1))


def kernel_dims(problem: GemmProblem, swap_ab: bool) -> tuple[int, int]:
    """(kernel M, kernel N) extents: with swap-AB the weights' N is the MMA's M side."""
    return (problem.n, problem.m_hi) if swap_ab else (problem.m_hi, problem.n)


def cta_count(cfg: Sm100Nvfp4GemmConfig, kernel_m: int, kernel_n: int) -> int:
    """CTAs of one output pass (before split-K), grid rounded up to whole clusters."""
    ctas_m = ceil_div(kernel_m, cfg.tile_m) * (2 if cfg.use_2cta else 1)
    ctas_m = ceil_div(ctas_m, cfg.cluster_m) * cfg.cluster_m
    ctas_n = ceil_div(ceil_div(kernel_n, cfg.tile_n), cfg.cluster_n) * cfg.cluster_n
    return ctas_m * ctas_n


def wave_efficiency(ctas: int, sm_count: int) -> float:
    return ctas / (ceil_div(ctas, sm_count) * sm_count)


class _Builder:
    """Ordered, de-duplicated rule candidates. Where split-K applies, the split variant takes the
    rule's place; the first rule's unsplit twin follows it directly, the others go last."""

    def __init__(self, problem: GemmProblem):
        self.p = problem
        self.primary: list[Candidate] = []
        self.secondary: list[Candidate] = []
        self.seen: set = set()

    def _push(self, lst, cfg, reason):
        if cfg not in self.seen:
            self.seen.add(cfg)
            lst.append(Candidate(cfg, reason))

    def add(self, cfg: Sm100Nvfp4GemmConfig, reason: str, *, split: bool = True) -> None:
        if cfg in self.seen or not can_implement(self.p, cfg):
            return
        km, kn = kernel_dims(self.p, cfg.swap_ab)
        ctas = cta_count(cfg, km, kn)
        sm = self.p.target.sm_count
        s = choose_split_k(ctas, self.p.k, SM100_TILE_K, sm) if split else 1
        if s > 1:
            sk = replace(cfg, split_k=s)
            if can_implement(self.p, sk):
                first = not self.primary
                self._push(self.primary, sk, f"{reason}; split-K {s}: {ctas} tiles -> {ctas * s} CTAs on {sm} SMs")
                # the band's main tile also competes unsplit right away; other unsplit twins go last
                twin_list = self.primary if first else self.secondary
                self._push(twin_list, cfg, f"{reason}; no split-K ({ctas} CTAs on {sm} SMs)")
                return
        self._push(self.primary, cfg, reason)

    def result(self) -> list[Candidate]:
        return self.primary + self.secondary


def _ranked_native_tiles(problem: GemmProblem, tiles) -> list[tuple[C, float]]:
    km, kn = kernel_dims(problem, False)
    scored = []
    for tm, tn, cm, cn in tiles:
        cfg = C(tile_m=tm, tile_n=tn, cluster_m=cm, cluster_n=cn)
        eff = wave_efficiency(cta_count(cfg, km, kn), problem.target.sm_count)
        # operand reuse of one MMA tile (FLOPs per loaded element), normalised to 256x256
        reuse = (tm * tn / (tm + tn)) / 128.0
        # clip tiles to the problem: a tile larger than M or N wastes its extra rows/columns
        used = min(tm, km) / tm * min(tn, kn) / tn
        scored.append((cfg, round(eff * reuse * used, 4)))
    scored.sort(key=lambda t: (-t[1], -t[0].tile_m, -t[0].tile_n, t[0].cluster_m))
    return scored


def rule_candidates(problem: GemmProblem) -> list[Candidate]:
    m = problem.m_hi
    n = problem.n
    b = _Builder(problem)
    swap_ok = n >= SWAP_MIN_N and m <= SWAP_AB_MAX_M
    if m <= 32 and swap_ok:
        narrow = next(t for t in NARROW_TILES if t >= m)
        band = f"decode M<={narrow}"
        b.add(C(128, narrow, swap_ab=True), f"{band}: swap-AB, tile_n={narrow} holds all tokens, weights on the MMA M side")
        b.add(C(128, narrow, 2, 1, swap_ab=True), f"{band}: swap-AB + cluster_m=2 (activation tile multicast)")
        b.add(C(128, narrow, 4, 1, swap_ab=True), f"{band}: swap-AB + cluster_m=4 (activation tile multicast)")
        wider = next((t for t in NARROW_TILES if t > narrow), 64)
        b.add(C(128, wider, swap_ab=True), f"{band}: swap-AB, next wider token tile {wider}")
        if narrow < 32 and wider != 32:
            b.add(C(128, 32, swap_ab=True), f"{band}: swap-AB, token tile 32")
        if n * problem.k // 2 >= PREFETCH_MIN_WEIGHT_BYTES:
            b.add(C(128, narrow, swap_ab=True, l2_prefetch=True), f"{band}: swap-AB, L2 prefetch of streamed weights")
    elif m <= 64 and swap_ok:
        band = "batch 33-64"
        b.add(C(128, 64, swap_ab=True), f"{band}: swap-AB, tile_n=64 holds all tokens")
        b.add(C(256, 64, 2, 1, swap_ab=True), f"{band}: swap-AB, 2-CTA 256-row weight tile")
        b.add(C(128, 64, 2, 1, swap_ab=True), f"{band}: swap-AB + cluster_m=2 (activation multicast)")
        b.add(C(256, 64, 4, 1, swap_ab=True), f"{band}: swap-AB, 2-CTA + cluster_m=4")
        if n * problem.k // 2 >= PREFETCH_MIN_WEIGHT_BYTES:
            b.add(C(128, 64, swap_ab=True, l2_prefetch=True), f"{band}: swap-AB, L2 prefetch of streamed weights")
    elif m <= 128 and swap_ok:
        band = "batch 65-128"
        b.add(C(256, 128, 2, 1, swap_ab=True), f"{band}: 2-CTA swap-AB 256x128 (tokens in one tile)")
        b.add(C(128, 128, swap_ab=True), f"{band}: swap-AB 128x128 (tokens in one tile)")
        b.add(C(256, 64, 2, 1, swap_ab=True), f"{band}: 2-CTA swap-AB 256x64 (two token tiles, more CTAs)")
        b.add(C(128, 64), f"{band}: native 128x64")
        b.add(C(256, 128, 4, 1, swap_ab=True), f"{band}: 2-CTA swap-AB, cluster_m=4")
    elif m <= 256:
        band = "batch 129-256"
        b.add(C(256, 128, 2, 1), f"{band}: native 2-CTA 256x128")
        b.add(C(128, 128), f"{band}: native 128x128")
        if swap_ok:
            b.add(C(256, 128, 2, 1, swap_ab=True), f"{band}: 2-CTA swap-AB 256x128 (two token tiles)")
        b.add(C(128, 64), f"{band}: native 128x64 (more CTAs)")
        b.add(C(256, 128, 2, 2), f"{band}: native 2-CTA 256x128, cluster 2x2")
    else:
        band = "prefill 257-1024" if m <= 1024 else "prefill M>1024"
        tiles = MID_TILES if m <= 1024 else LARGE_TILES
        for cfg, score in _ranked_native_tiles(problem, tiles):
            kind = "2-CTA " if cfg.use_2cta else ""
            b.add(cfg, f"{band}: native {kind}{cfg.tile_m}x{cfg.tile_n} (wave-efficiency x reuse score {score:.2f})")
    if not b.primary and not b.secondary:
        # tiny N (< 128) decode, or anything no band covered: native tiles that fit
        for tn in (64, 128, 32, 16, 8):
            b.add(C(128, tn), f"fallback: native 128x{tn}")
    return b.result()


def _main_orientation_swap(problem: GemmProblem) -> bool:
    return problem.m_hi <= 128 and problem.n >= SWAP_MIN_N


def nvmmh_candidates(problem: GemmProblem, count: int | None = None) -> list[Candidate] | None:
    """nvMatmulHeuristics picks mapped into nvgemm configs (None when the library is unavailable).

    ``count`` defaults to NVMMH_COUNT_DECODE for M <= 64 (the merge takes one library pick per two
    rules there) and NVMMH_COUNT otherwise; each returned config costs the library one runtime
    estimate, so a small count keeps a policy call near 1 ms."""
    if count is None:
        count = NVMMH_COUNT_DECODE if problem.m_hi <= 64 else NVMMH_COUNT
    swap = _main_orientation_swap(problem)
    picks = nvmmh.query(problem, swap, count, space=NVMMH_SPACE)
    if picks is None:
        return None
    km, _ = kernel_dims(problem, swap)
    out: list[Candidate] = []
    seen = set()
    for pk in picks:
        if pk.tile_n not in POLICY_TILE_N:
            continue
        # the 2-CTA alias only outside the narrow-token decode band (there it would crowd out rules)
        two_cta = pk.cluster_m % 2 == 0 and km >= 256 and problem.m_hi > 32
        tile_ms = (128, 256) if two_cta else (128,)
        for tile_m in tile_ms:
            base = C(tile_m, pk.tile_n, pk.cluster_m, pk.cluster_n, swap_ab=swap)
            cfg = _snap_split_k(problem, base, pk.split_k)
            if cfg is None or cfg in seen:
                continue
            seen.add(cfg)
            orient = "swap-AB" if swap else "native"
            cta = "2-CTA " if cfg.use_2cta else ""
            sk = f"split-K {pk.split_k}" + (f"->{cfg.split_k}" if cfg.split_k != pk.split_k else "")
            out.append(
                Candidate(
                    cfg,
                    f"nvMatmulHeuristics #{pk.rank + 1} ({orient}, {cta}per-CTA 128x{pk.tile_n}, "
                    f"cluster {pk.cluster_m}x{pk.cluster_n}, {sk})",
                    pk.runtime_us,
                )
            )
    return out


def _snap_split_k(problem: GemmProblem, base: Sm100Nvfp4GemmConfig, split_k: int) -> Sm100Nvfp4GemmConfig | None:
    """The library's split-K if nvgemm implements it, else the nearest implementable factor
    (ties to the smaller), else None."""
    if not can_implement(problem, base):  # split_k=1: every problem/tile rule except the split rule
        return None
    k_tiles = ceil_div(problem.k, SM100_TILE_K)
    for s in sorted({1, *SM100_SPLIT_K}, key=lambda s: (abs(s - split_k), s)):
        if s == 1:
            return base
        if s <= k_tiles and k_tiles % s == 0:
            cfg = replace(base, split_k=s)
            if can_implement(problem, cfg):
                return cfg
    return base


def _pattern(m_hi: int) -> str:
    if m_hi <= 64:
        return "RRH"
    if m_hi <= 256:
        return "RH"
    return "HR"


def merge(rules: list[Candidate], picks: list[Candidate], pattern: str, cap: int) -> list[Candidate]:
    """Interleave rule and library candidates by ``pattern``; merge duplicates; stop at ``cap``."""
    by_cfg = {c.config: c for c in picks}
    out: list[Candidate] = []
    index: dict = {}
    ri = hi = step = 0
    while len(out) < cap and (ri < len(rules) or hi < len(picks)):
        src = pattern[step % len(pattern)]
        step += 1
        if (src == "R" and ri < len(rules)) or hi >= len(picks):
            cand = rules[ri]
            ri += 1
            lib = by_cfg.get(cand.config)
            if lib is not None:
                cand = Candidate(cand.config, f"{cand.reason}; also {lib.reason.split(' (')[0]}", lib.est_runtime_us)
        else:
            cand = picks[hi]
            hi += 1
        if cand.config in index:
            continue
        index[cand.config] = len(out)
        out.append(cand)
    return out


def candidates(problem: GemmProblem, max_candidates: int = 8, use_nvmmh: bool = True) -> list[Candidate]:
    rules = rule_candidates(problem)
    picks = (nvmmh_candidates(problem) if use_nvmmh else None) or []
    return merge(rules, picks, _pattern(problem.m_hi), max_candidates)


__all__ = [
    "NARROW_TILE_N",
    "candidates",
    "cta_count",
    "kernel_dims",
    "merge",
    "nvmmh_candidates",
    "rule_candidates",
]
