"""Performance-model pricing of the grouped sm120 MoE kernels (a MODEL: no consumer-Blackwell GPU has
measured them). A grouped GEMM is priced as the dense sm120 decode kernel
(:func:`nvgemm.templates.sm120_w4a4.perf.model_us` on the GPU's profile in
:mod:`nvgemm.heuristics.perfmodel.hardware`) on the **active experts' weights**: ``rows x active experts`` weight rows streamed once,
``tile_n`` tokens per work slot and ``ceil(pairs per expert / tile_n)`` slots per expert as the M
tiles that re-read them (uniform routing: :func:`nvgemm.templates.sm100_moe.perf.expected_active_experts`)."""

from __future__ import annotations

from nvgemm.templates.sm100_moe.perf import expected_active_experts
from nvgemm.templates.sm120_moe.config import Sm120MoeConfig
from nvgemm.templates.sm120_w4a4.perf import device_for, model_us


def slots_per_expert(m: int, top_k: int, num_experts: int, tile_n: int) -> tuple[float, int]:
    """(expected active experts, work slots per active expert) at ``m`` tokens, uniform routing."""
    active = max(expected_active_experts(m, top_k, num_experts), 1e-9)
    per = m * top_k / active
    return active, max(1, -(-int(round(per)) // tile_n))


def gemm_range_us(c: Sm120MoeConfig, m: int, top_k: int, num_experts: int, rows: int, k: int, gated: bool,
                  arch: str = "sm_120a", sm_count: int = 0, gpu: str | None = None) -> tuple[float, float]:
    """(optimistic, pessimistic) modelled time (us) of one grouped GEMM (a MODEL) on ``gpu`` (default: the
    arch's default GPU)."""
    dev = device_for(arch, sm_count, gpu)
    active, slots = slots_per_expert(m, top_k, num_experts, c.tile_n)
    n_eq = rows * max(1, round(active))
    out_bytes = 0.5 if gated else 4  # GEMM1 writes packed FP4 codes, GEMM2 fp32
    return tuple(model_us(c.dense(), slots * c.tile_n, n_eq, k, dev, gated, out_bytes, end) for end in (1, 0))


__all__ = ["gemm_range_us", "slots_per_expert"]
