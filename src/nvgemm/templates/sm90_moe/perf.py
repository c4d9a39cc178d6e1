"""Performance model of the sm_90a grouped MoE path (a MODEL, never a measurement).

One routed MoE layer on the grouped path (:mod:`nvgemm.templates.sm90_moe`) is

    prep (work list) + GEMM1 (gate/up, silu_mul) + GEMM2 (down) + finalize (top-k sum)

**Routing.** Under uniform routing each expert receives ``c ~ Binomial(M, top_k / E)`` pairs (a token
picks ``top_k`` distinct experts), so the expected active experts are ``E (1 - (1 - k/E)^M)`` and the
expected work tiles ``E x sum_c P(c) ceil(c / tile_m)`` (:func:`expected_tiles`); a measured
histogram (pairs per expert of a real batch, or an average over batches) replaces the binomial.

**A grouped GEMM** is modelled as the dense ``mma`` kernel (same main loop, same SASS facts -- the
compile test checks the grouped kernel's loop has the dense kernel's HMMA count and no spills) on
the equivalent dense problem: ``N = rows per expert x tiles`` (interpolated between the whole
numbers of tiles around the expected value; each work tile streams its expert's
weight block once; a second tile of the same expert is charged as a DRAM re-read, a conservative
choice), ``M = mean pairs per tile`` (at most ``tile_m``), the layer's K. The grid slots past the
routing's tiles exit at once and are not charged. The dense model's own wave, latency-chain and
launch terms apply unchanged (:func:`nvgemm.heuristics.perfmodel.model.estimate`).

**PDL.** Both GEMMs are priced as PDL kernels: the dense model's one PDL term, ``pdl_saving_us``
(0.3-0.7 us off the launch: the prologue overlapping the previous kernel), and nothing else. GEMM2
issues its first weight stages before ``griddepcontrol.wait`` (``config.early_weights``), the prologue
that term stands for; GEMM1 cannot (its routing is its producer's output) and keeps the term for its
launch-side prologue. No first-round fill is hidden behind the previous kernel: the dense model charges
its fill with or without PDL, so the grouped model does too.

**Host path.** On CUDA the work list is one Triton launch (``templates/sm90_moe/prep_triton.py``:
ids through the expert map, stable sort, counts, tiles), none for one token without an expert map (the
grouped kernels read the ids: :func:`prep_kernels`); the top-k sum runs in GEMM2's last CTA per
row block up to :data:`~.config.FUSED_FINALIZE_MAX_TOKENS` tokens (charged as its serial tail,
:func:`fused_finalize_tail_us`) and is one more launch above (the finalize kernel); launches are
charged the hardware's tiny-kernel cost (``aux_kernel_us``) -- at TP >= 4 these
launches cost as much as the GEMMs' bytes (the brief's section 5.2 consequence (a)). The torch
fallback of the prep step (more than 4096 pairs) launches about 24 tiny kernels
(``prep_kernels=24``).

The **byte floor** is the brief's: ``(active experts + shared experts) x 3 x H x I x 0.5625`` bytes
at the achievable bandwidth (weights only; activations are negligible at decode).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from nvgemm.heuristics.perfmodel.hardware import get_hardware
from nvgemm.heuristics.perfmodel.batch import gemm_totals
from nvgemm.templates.sm90_moe.config import FUSED_FINALIZE_MAX_TOKENS

#: Launches of the work-list prep per layer on CUDA (the one Triton kernel; the torch fallback
#: beyond 4096 pairs launches ~24).
PREP_KERNELS = 1
#: The finalize kernel (one Triton launch) above :data:`~.config.FUSED_FINALIZE_MAX_TOKENS` tokens; at or
#: below it GEMM2 runs the finalize (:func:`finalize_kernels`, :func:`fused_finalize_tail_us`).
FINALIZE_KERNELS = 1
#: Slots of a token the fused finalize loads in one round trip (the kernels' ``FIN_SLOTS``).
FIN_SLOTS = 8
NVFP4_BYTES_PER_ELEM = 0.5625


def expected_active_experts(m: int, top_k: int, num_experts: int) -> float:
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** m)


def _binom_pmf(n: int, p: float) -> list[float]:
    if p >= 1.0:
        return [0.0] * n + [1.0]
    out = []
    lq = math.log1p(-p)
    lp = math.log(p) if p > 0 else -math.inf
    for c in range(n + 1):
        lc = math.lgamma(n + 1) - math.lgamma(c + 1) - math.lgamma(n - c + 1)
        out.append(math.exp(lc + (c * lp if c else 0.0) + (n - c) * lq))
    return out


def expected_tiles(m: int, top_k: int, num_experts: int, tile_m: int,
                   histogram: Optional[Sequence[float]] = None) -> float:
    """Expected work tiles of one call: uniform routing (binomial per expert), or ``histogram``
    (pairs per expert; fractional averages allowed, each rounded up per tile)."""
    if histogram is not None:
        return float(sum(math.ceil(c / tile_m) for c in histogram if c > 0))
    return _uniform_tiles(int(m), int(top_k), int(num_experts), int(tile_m))


@functools.lru_cache(maxsize=4096)
def _uniform_tiles(m: int, top_k: int, num_experts: int, tile_m: int) -> float:
    """:func:`expected_tiles` under uniform routing, memoised: the binomial sum depends on
    (M, top_k, E, tile) only, and a policy call asks for it once per config."""
    pmf = _binom_pmf(m, min(1.0, top_k / num_experts))
    return num_experts * sum(p * math.ceil(c / tile_m) for c, p in enumerate(pmf))


def byte_floor_us(m: int, top_k: int, num_experts: int, hidden: int, inter: int, shared_inter: int = 0,
                  gpu: str = "H200", gated: bool = True) -> float:
    """Weight bytes of the active experts (+ the shared expert) at the achievable bandwidth."""
    hw = get_hardware(gpu)
    mats = 3 if gated else 2
    a = expected_active_experts(m, top_k, num_experts)
    byts = (a * inter + shared_inter) * mats * hidden * NVFP4_BYTES_PER_ELEM
    return byts / hw.achievable_bw * 1e6


@dataclass(frozen=True)
class MoeGemmEstimate:
    config: object
    tiles: float
    rows_per_tile: float
    us: tuple[float, float]  # kernel + its launch (model)


def moe_gemm_estimate(config, m: int, top_k: int, num_experts: int, rows: int, k: int, gpu: str = "H200",
                      sm_count: int | None = None, histogram=None) -> Optional[MoeGemmEstimate]:
    """Modelled time of one grouped GEMM (``rows`` weight rows per expert, reduction ``k``), or None
    when the dense model has no estimate for the equivalent problem."""
    return grouped_gemm_estimate(config, config.dense(), config.tile_m, m, top_k, num_experts, rows, k, gpu, sm_count,
                                 histogram)


def grouped_gemm_estimate(config, dense, token_tile: int, m: int, top_k: int, num_experts: int, rows: int, k: int,
                          gpu: str, sm_count: int | None, histogram) -> Optional[MoeGemmEstimate]:
    """A grouped GEMM as the ``dense`` config on the equivalent dense problem (the module docstring):
    ``N = rows x work tiles`` (tiles of ``token_tile`` pairs), ``M = mean pairs per tile``. Shared by
    the grouped families (sm90 ``mma``, sm100 swap-AB tcgen05)."""
    return grouped_gemm_estimates([([config], [dense], token_tile, rows, k)], m, top_k, num_experts, gpu, sm_count,
                                  histogram)[0][0]


def grouped_gemm_estimates(jobs, m: int, top_k: int, num_experts: int, gpu: str, sm_count: int | None,
                           histogram) -> list:
    """:func:`grouped_gemm_estimate` of many configs at once: per job ``(configs, dense twins,
    token tile, rows, k)`` the list of estimates (None: no estimate); see :func:`grouped_gemm_times`."""
    out = []
    for (configs, *_), r in zip(jobs, grouped_gemm_times(jobs, m, top_k, num_experts, gpu, sm_count, histogram)):
        out.append([None] * len(configs) if r is None else
                   [None if us is None else MoeGemmEstimate(c, r[0], r[1], us) for c, us in zip(configs, r[2])])
    return out


def grouped_gemm_times(jobs, m: int, top_k: int, num_experts: int, gpu: str, sm_count: int | None,
                       histogram) -> list:
    """The numbers of :func:`grouped_gemm_estimates` without building an estimate per config: per job
    ``(configs, dense twins, token tile, rows, k)`` either None (no work tiles) or ``(tiles, pairs
    per tile, [modelled (low, high) us or None per config])``. The routing terms are computed once
    per job and both whole-tile problems of every config of every job go through one
    :func:`nvgemm.heuristics.perfmodel.batch.gemm_totals` (the report's ``gemm_us``, bit for bit). What the
    policies call; ``tests/cpu/test_moe_policy_speed.py`` checks them against the per-config
    :func:`~nvgemm.heuristics.perfmodel.model.estimate` path."""
    plans, requests = [], []
    for configs, denses, token_tile, rows, k in jobs:
        c = slot_corners(m, top_k, num_experts, token_tile, histogram)
        if c is None:
            plans.append(None)
            continue
        # the SASS facts table holds the PDL variants (same loop)
        dense = denses if all(d.pdl for d in denses) else [_with_pdl(d) for d in denses]
        plans.append((c.tiles, c.per_tile, c.f, len(requests), len(requests) + (c.hi != c.lo)))
        requests.append((dense, c.m, rows * c.lo, k))
        if c.hi != c.lo:
            requests.append((dense, c.m, rows * c.hi, k))
    priced = gemm_totals(requests, gpu, sm_count)
    out = []
    for plan in plans:
        if plan is None:
            out.append(None)
            continue
        tiles, per_tile, f, i_lo, i_hi = plan
        g = 1 - f
        out.append((tiles, per_tile, [None if lo is None or hi is None else
                                      (g * lo[0] + f * hi[0], g * lo[1] + f * hi[1])
                                      for lo, hi in zip(priced[i_lo], priced[i_hi])]))
    return out


@dataclass(frozen=True)
class SlotCorners:
    """The expected work slots of a grouped GEMM and the whole-slot problems the model prices around them:
    ``tiles`` (fractional) lies between ``lo`` and ``hi`` slots, at ``f`` of the way; ``per_tile`` pairs per
    slot (at most the token tile), ``m`` = its ceiling, the dense twin's M."""

    tiles: float
    per_tile: float
    lo: int
    hi: int
    f: float

    @property
    def m(self) -> int:
        return max(1, math.ceil(self.per_tile))


def slot_corners(m: int, top_k: int, num_experts: int, token_tile: int, histogram=None) -> Optional[SlotCorners]:
    """:class:`SlotCorners` of ``m`` tokens' routing (uniform, or a measured ``histogram``) over slots of
    ``token_tile`` pairs; None when there is no work slot."""
    tiles = expected_tiles(m, top_k, num_experts, token_tile, histogram)
    if tiles <= 0:
        return None
    pairs = sum(histogram) if histogram is not None else m * top_k
    # expected tiles are fractional: interpolate between the whole-tile problems around them
    lo, hi = max(1, math.floor(tiles)), max(1, math.ceil(tiles))
    f = 0.0 if hi == lo else (tiles - lo) / (hi - lo)
    return SlotCorners(tiles, min(float(token_tile), pairs / tiles), lo, hi, f)


@functools.lru_cache(maxsize=4096)
def _with_pdl(dense):
    return replace(dense, pdl=True)


def prep_kernels(tokens: int) -> int:
    """Work-list launches of a call of ``tokens`` tokens: none for one token (``direct``: the kernels read the
    routing from the ids; no expert map), else the one Triton prep."""
    return 0 if tokens == 1 else PREP_KERNELS


def finalize_kernels(tokens: int) -> int:
    """Finalize launches of a call of ``tokens`` tokens: none when GEMM2 runs it (``moe_forward`` on CUDA)."""
    return 0 if 0 < tokens <= FUSED_FINALIZE_MAX_TOKENS else FINALIZE_KERNELS


def fused_finalize_tail_us(tokens: int, top_k: int, gpu: str, rounds: Optional[int] = None) -> tuple[float, float]:
    """The fused finalize's serial tail on GEMM2's last CTA of a row block, (low, high) us: the arrival
    (fence + counter atomic: one L2 round trip) and, per round of its threads (``rounds``; default one per
    token, the sm_100a epilogue's loop) and chunk of :data:`FIN_SLOTS` slots, two dependent L2 round trips
    (the slots' rows and weights, then their y values, which GEMM2's CTAs just wrote to L2). The stores of
    the finalized rows are fire-and-forget. The finalize launch it replaces costs ``aux_kernel_us``."""
    hw = get_hardware(gpu)
    r = tokens if rounds is None else rounds
    trips = 1 + 2 * r * -(-top_k // FIN_SLOTS)
    return tuple(trips * lat / hw.clock_hz * 1e6 for lat in hw.l2_latency)


def sm90_finalize_rounds(tokens: int, config2) -> int:
    """Rounds of the sm90 fused finalize: ``tokens x features per CTA`` items over the CTA's threads."""
    return -(-tokens * config2.tile_n // (32 * config2.num_warps))


def host_us(gpu: str = "H200", prep_kernels: int = PREP_KERNELS,
            finalize: int = FINALIZE_KERNELS) -> tuple[float, float]:
    """Tiny kernels of the host path (prep + finalize launches) at the aux-kernel cost."""
    hw = get_hardware(gpu)
    n = prep_kernels + finalize
    return (n * hw.aux_kernel_us[0], n * hw.aux_kernel_us[1])


__all__ = ["prep_kernels", "FIN_SLOTS", "FINALIZE_KERNELS", "finalize_kernels", "fused_finalize_tail_us", "sm90_finalize_rounds", "MoeGemmEstimate", "NVFP4_BYTES_PER_ELEM", "PREP_KERNELS", "byte_floor_us",
           "expected_active_experts", "expected_tiles", "grouped_gemm_estimate", "grouped_gemm_estimates",
           "grouped_gemm_times", "host_us", "moe_gemm_estimate", "SlotCorners",
           "slot_corners"]
