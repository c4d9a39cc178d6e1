"""Performance model of the sm_100a grouped W4A4 MoE path (a MODEL, never a measurement).

One routed MoE layer on the grouped path (:mod:`nvgemm.templates.sm100_moe`) is

    prep (work list + per-slot NVFP4 activations) + GEMM1 (gate/up, fused SwiGLU + NVFP4 requant)
    + GEMM2 (down) + finalize (top-k sum)

**Routing** is :mod:`.sm90_moe`'s: uniform (binomial pairs per expert) or a measured histogram;
the expected work slots of tile ``tile_n`` are :func:`~.sm90_moe.expected_tiles`.

**A grouped GEMM** is modelled as the dense swap-AB sm100 kernel (:mod:`.sm100`: the same warp
roles, TMA/MMA pipeline and split-K reduction) on the equivalent dense problem: ``N = rows per
expert (padded to 128) x work slots`` (interpolated between the whole numbers of slots around the
expected value; each slot streams its expert's weight block once, so a second slot of the same
expert is charged as a DRAM re-read), ``M = mean pairs per slot`` (at most ``tile_n``), the layer's
K. The dense model's own terms then charge what the grouped kernel pays: its persistent grid of
``min(units, 148)`` CTAs over ``row tiles x slots x split_k`` units, the first round's fill, the
partial last round (idle SMs earn nothing), the exposed epilogue / split-K reduction as the tail,
and the launch. Work slots past the routing's tiles (no loads, no MMAs; the epilogue stores zeros)
are not charged.

**Host path**: :data:`PREP_KERNELS` tiny launches (the work list and the activation prep are one
Triton launch each on CUDA) and the finalize, each at the hardware's tiny-kernel cost. **Byte floor**: :func:`~.sm90_moe.byte_floor_us` (active + shared experts' NVFP4
weight bytes at the achievable bandwidth).
"""

from __future__ import annotations

from typing import Optional

from ..hardware import get_hardware
from .sm90_moe import (FINALIZE_KERNELS, MoeGemmEstimate, byte_floor_us, expected_active_experts,
                       grouped_gemm_estimate)

#: Launches of the host prep per layer on CUDA besides the two GEMMs and the finalize: the work-list
#: Triton kernel, the activation prep Triton kernel (gather + per-expert NVFP4 + scale atoms + the
#: pair -> row map), two zero fills (the scale atoms of GEMM1's input and of GEMM2's input) and the
#: pair -> row gather.
PREP_KERNELS = 5


def moe_gemm_estimate(config, m: int, top_k: int, num_experts: int, rows: int, k: int, gpu: str = "B200",
                      sm_count: int | None = None, histogram=None) -> Optional[MoeGemmEstimate]:
    """Modelled time of one grouped GEMM (``rows`` weight rows per expert, padded to 128 in the stack;
    reduction ``k``), or None when the dense model has no estimate for the equivalent problem."""
    rows_p = -(-rows // 128) * 128
    return grouped_gemm_estimate(config, config.dense(), config.tile_n, m, top_k, num_experts, rows_p, k, gpu,
                                 sm_count, histogram)


def host_us(gpu: str = "B200", prep_kernels: int = PREP_KERNELS) -> tuple[float, float]:
    """Tiny kernels of the host path (prep + finalize) at the aux-kernel cost."""
    hw = get_hardware(gpu)
    n = prep_kernels + FINALIZE_KERNELS
    return (n * hw.aux_kernel_us[0], n * hw.aux_kernel_us[1])


__all__ = ["PREP_KERNELS", "byte_floor_us", "expected_active_experts", "host_us",
           "moe_gemm_estimate"]
