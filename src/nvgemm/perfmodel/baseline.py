"""The bf16 cuBLAS baseline, modelled the same way (a MODEL; a GPU measurement overrides it).

    time = launch + max(bytes / (achievable bandwidth x eff(M)),  2 M8 N K / (0.7 x bf16 peak))
    bytes = 2 N K (bf16 weights) + 2 M K + 2 M N,   M8 = M rounded up to a multiple of 8

Tensor-core issue is not the limit at decode (bf16's arithmetic intensity is ~M FLOP/byte, the
H200 ridge is ~230), so the model is a weight stream with an M-dependent streaming efficiency
``eff(M)`` of cuBLAS relative to the achievable bandwidth (ranges; the low time uses the high
efficiency):

    M = 1        0.78 .. 0.93   GEMV-class kernels stream well
    M = 2..16    0.75 .. 0.90   GEMM tiles of 64-128 rows, mostly padding; split-K on narrow N
    M = 17..64   0.70 .. 0.88
    M > 64       0.65 .. 0.85   (and the tensor floor above starts to matter)

One kernel per call at the same launch cost as nvgemm's (cuBLAS may add a split-K reduce kernel
on some small-M shapes; not modelled). Why these efficiencies (published bf16/fp16 numbers,
anchors.md; ``bench/results/sm90_model.md`` repeats the cross-check):

* B200, N=6656 K=19968 and N=19968 K=6656, M=1: 46.2 / 45.4 us measured (FlashInfer PR #4466)
  -> 0.85 / 0.86 of 6.8 TB/s incl. launch; the model gives 43.5-52.6 us.
* B200, 8192x8192, M=1: "fp16 matmul 5-6 TB/s" (flashinfer#1732) -> 22.4-26.8 us; model 22.7-27.8 us.
* H100, 8192x8192, M=1: ~58 us fp16 (Marlin's published comparison) -> 0.77 of 3.0 TB/s;
  model 49.6-60 us.
No published cuBLAS bf16 numbers at M = 2..64 on these shapes were found; the lower
efficiencies there are an assumption (wider range).

Tensor term: a tensor-core GEMM computes whole MMA tiles, at least 8 rows (the N of ``mma.sync`` /
``wgmma`` on the token side), so the FLOPs are counted for M rounded up to a multiple of 8 -- the
least padding any cuBLAS kernel can have (its real tiles are 64-256 tokens; the 0.7 efficiency
stands for the rest). nvgemm's own kernels are modelled with their actual tile padding.
"""

from __future__ import annotations

from dataclasses import dataclass

from .hardware import get_hardware

US = 1e6
TENSOR_EFFICIENCY = 0.7


def bf16_efficiency(m: int) -> tuple[float, float]:
    """(low, high) streaming efficiency of cuBLAS bf16 relative to the achievable bandwidth."""
    if m <= 1:
        return (0.78, 0.93)
    if m <= 16:
        return (0.75, 0.90)
    if m <= 64:
        return (0.70, 0.88)
    return (0.65, 0.85)


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
    hw = get_hardware(gpu, sm_count)
    nbytes = 2.0 * n * k + 2.0 * m * k + 2.0 * m * n
    eff_lo, eff_hi = bf16_efficiency(m)
    stream = (nbytes / (hw.achievable_bw * eff_hi) * US, nbytes / (hw.achievable_bw * eff_lo) * US)
    m8 = -(-m // 8) * 8  # whole 8-row MMA tiles (see the module docstring)
    tensor = 2.0 * m8 * n * k / (TENSOR_EFFICIENCY * hw.bf16_tflops * 1e12) * US
    total = (max(stream[0], tensor) + hw.launch_us[0], max(stream[1], tensor) + hw.launch_us[1])
    return BaselineEstimate(m, n, k, hw.name, nbytes, total, stream, tensor, hw.launch_us)


__all__ = ["BaselineEstimate", "bf16_baseline", "bf16_efficiency"]
