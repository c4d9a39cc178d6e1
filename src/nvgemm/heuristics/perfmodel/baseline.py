"""The bf16 cuBLAS baseline, modelled the same way (a MODEL; a GPU measurement overrides it).

    time = launch - PDL saving + fill + colimit(bytes / achievable bandwidth,  2 M8 N K / (0.7 x bf16 peak))
    bytes = 2 N K (bf16 weights) + 2 M K + 2 M N,   M8 = M rounded up to a multiple of 8
    fill  = one loaded DRAM latency (the first data of the stream)

**One efficiency assumption for both sides of every ratio**: the baseline uses the
hardware's achievable-bandwidth range, DRAM-latency range, launch cost (with the PDL saving
nvgemm's kernels get: cuBLAS in a CUDA graph is given the same overlap) and co-limit rule
(:func:`nvgemm.heuristics.perfmodel.model.colimit`) exactly as nvgemm's kernels do, and is charged nothing
else -- no waves, no idle SMs, no tail, no split-K reduce kernel -- so it is an *ideal* stream of
its bytes and every modelled ratio nvgemm/bf16 is at most the byte ratio (2 / 0.5625 = 3.56x for
the weights; ``tests/cpu/test_perfmodel.py`` checks it). Calibration against published bf16 GEMV
numbers (``bench/results/model_calibration.md``): on H200, 235-822 MB matrices, the model lands at
76-89 % of 4.8 TB/s against 70-82 % published for cuBLAS and 72-89 % for the best custom kernels,
so the modelled baseline is if anything faster than cuBLAS (ratios against it are conservative).
B200 6656 x 19968 at M = 1: 46.2 us measured (FlashInfer PR #4466); the model's range brackets it.

Tensor term: a tensor-core GEMM computes whole MMA tiles, at least 8 rows (the N of ``mma.sync`` /
``wgmma`` on the token side), so the FLOPs are counted for M rounded up to a multiple of 8 -- the
least padding any cuBLAS kernel can have (its real tiles are 64-256 tokens; the 0.7 efficiency
stands for the rest). nvgemm's own kernels are modelled with their actual tile padding.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvgemm.heuristics.perfmodel.hardware import get_hardware

US = 1e6
TENSOR_EFFICIENCY = 0.7


@dataclass(frozen=True)
class BaselineEstimate:
    m: int
    n: int
    k: int
    gpu: str
    bytes: float
    total_us: tuple[float, float]
    stream_us: tuple[float, float]
    tensor_us: float
    launch_us: tuple[float, float]

    @property
    def mid_us(self) -> float:
        return 0.5 * (self.total_us[0] + self.total_us[1])


def bf16_baseline(m: int, n: int, k: int, gpu: str = "H200", sm_count: int | None = None) -> BaselineEstimate:
    """Modelled bf16 x bf16 cuBLAS GEMM [M, K] x [K, N] -> bf16 on ``gpu``."""
    # lazy: breaks the cycle heuristics.perfmodel.baseline <-> heuristics.perfmodel.model (through a package __init__)
    from nvgemm.heuristics.perfmodel.model import colimit

    hw = get_hardware(gpu, sm_count)
    nbytes = 2.0 * n * k + 2.0 * m * k + 2.0 * m * n
    bw_lo, bw_hi = hw.achievable_bw_range
    stream = (nbytes / bw_hi * US, nbytes / bw_lo * US)
    fill = tuple(hw.cycles_to_us(lat) for lat in hw.dram_latency)
    m8 = -(-m // 8) * 8  # whole 8-row MMA tiles (see the module docstring)
    tensor = 2.0 * m8 * n * k / (TENSOR_EFFICIENCY * hw.bf16_tflops * 1e12) * US
    # the launch model of nvgemm's PDL kernels: one launch less the programmatic-dependent-launch saving
    launch = (hw.launch_us[0] - hw.pdl_saving_us[1], hw.launch_us[1] - hw.pdl_saving_us[0])
    total = tuple(launch[i] + fill[i] + colimit(stream[i], tensor) for i in range(2))
    return BaselineEstimate(m, n, k, hw.name, nbytes, (total[0], total[1]), stream, tensor, launch)


__all__ = ["BaselineEstimate", "TENSOR_EFFICIENCY", "bf16_baseline"]
