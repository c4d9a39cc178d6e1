"""Hardware numbers the performance model uses, with their sources and ranges.

Every number that is uncertain is a ``(low, high)`` range; the model reports a time range by
running once with the optimistic end of every range and once with the pessimistic end. Nothing
here is measured by nvgemm: these are published figures and stated assumptions. A GPU measurement
overrides any model output.

H200 (SXM, sm_90a) -- the brief's constants
    132 SMs, 4 warp schedulers per SM, 1.98 GHz boost clock, HBM3e 4.8 TB/s peak, 50 MB L2.
    Achievable streaming read: **3.85-4.3 TB/s (80-90 % of peak)**, one range for nvgemm's
    kernels and the bf16 cuBLAS baseline alike. Calibration (bench/results/model_calibration.md):
    published H200 bf16 GEMVs on 235-822 MB matrices reach 72-89 % of 4.8 TB/s for the best
    custom kernels and 70-82 % for cuBLAS (model_calibration.md's references); 4.3 TB/s is the top of the
    custom kernels' range, 3.85 TB/s its middle (a GEMV-class stream of nvgemm's kind is not
    assumed to reach the best published kernel's rate). Marlin's W4A16 reaches ~37 % on H100
    (anchors.md): the model does not describe Marlin, it is the reminder that a W4A16 decode
    kernel can fall far below its byte floor; only a measurement closes that.
    DRAM latency 1200-2000 cycles (unloaded ~600 ns is ~1200 cycles; the upper end covers
    queueing when every SM streams). L2 hit latency 270-550 cycles (near / far partition, loaded).
    Per-SM fabric: 64 B/clock from L2/DRAM into one SM (an assumption; it only limits configs that
    leave most SMs idle). Fixed cost of one kernel launched from a CUDA graph: 1.5-2.5 us
    (launch, CTA rasterisation, prologue and tail; the review_sm90_sass.md assumption). A tiny
    extra kernel in the same graph (a ``torch.zeros`` fill): 1.0-2.0 us.
    Tensor cores: 989 TFLOPS dense bf16 (wgmma); mma.sync is assumed to reach ~2/3 of that.
H100 (SXM)
    as H200 with HBM3 3.35 TB/s peak, 2.68-3.0 TB/s achievable (the H200's 80-90 %).
B200 (sm_100a) -- "as best known"
    148 SMs (2 dies x 74; chipsandcheese.com "Nvidia's B200: Keeping the CUDA Juggernaut
    Rolling"), 4 schedulers per SM, ~1.965 GHz max SM clock (similar to H100 SXM per the same
    article), HBM3e 8 TB/s peak (NVIDIA B200 datasheet) of which 6.0-6.8 TB/s (75-85 %) is taken
    as achievable (anchors.md: the best published bf16 GEMV-like streams reach 5.75-6 TB/s incl.
    their fixed costs: FlashInfer PR #4466, flashinfer#1732). L2 126 MB split across the dies; L2 hit ~150 ns inside a partition
    (~300 cycles) and slower across the die boundary: 300-700 cycles. DRAM latency 1400-2400
    cycles (higher than Hopper: cross-die hop; an assumption). Fixed cost per launch 1.5-2.5 us;
    with PDL (``griddepcontrol``) the prologue overlaps the previous kernel: 0.3-0.7 us less
    (an assumption; anchors.md reports a 3.5-6.5 us floor for small NVFP4 GEMMs *including*
    activation quantization). Tensor cores: ~9 PFLOPS dense FP4 (NVIDIA NVFP4 blog, quoted in
    anchors.md), 2.25 PFLOPS dense bf16.
GB200 / B300: B200's numbers (GB200 per GPU; B300 keeps 8 TB/s) -- coarse stand-ins.
GeForce / workstation Blackwell (sm_120a: RTX 5090, RTX 5080, RTX PRO 6000 Blackwell Workstation
Edition), DGX Spark (GB10, sm_121a), Ada (sm_89: L40S, RTX 4090), Ampere (sm_86: A10, RTX 3090;
sm_80: A100 SXM 80GB)
    Published figures per GPU (each entry's ``source``): SM count, boost clock, peak DRAM bandwidth,
    L2 size, dense bf16 tensor TFLOPS with fp32 accumulation (the ``mma.sync`` rate the W4A16 kernel
    uses; GeForce parts run it at half their fp16-accumulate rate). Shared memory per SM and
    resident threads / CTAs per SM: the CUDA C++ Programming Guide's table of compute capabilities
    (8.0: 164 KB, 2048 threads, 32 CTAs; 8.6: 100 KB, 1536, 16; 8.9: 100 KB, 1536, 24; 12.x:
    100 KB, 1536, 32). Stated assumptions, the same as Hopper's so that ratios between GPUs come from
    the published figures only: achievable streaming read 80-90 % of peak, DRAM latency 1200-2000
    and L2 latency 270-550 cycles, launch 1.5-2.5 us, 64 B/clock per SM. ``mma.sync`` is these
    GPUs' only tensor-core path (no wgmma): ``mma_sync_fraction`` 1. sm_8x has no PDL
    (``griddepcontrol`` is sm_90+): no PDL saving, for nvgemm's kernels and the bf16 baseline alike.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    name: str
    arch: str
    sm_count: int
    schedulers_per_sm: int
    clock_ghz: float
    peak_bw_tbs: float
    achievable_bw_tbs: float  # the optimistic end of the achievable streaming bandwidth
    l2_mb: float
    dram_latency: tuple[float, float]  # cycles (low, high)
    l2_latency: tuple[float, float]  # cycles (low, high)
    sm_fabric_bytes_per_clk: float  # L2/DRAM -> one SM
    launch_us: tuple[float, float]  # fixed cost per kernel in a CUDA graph
    aux_kernel_us: tuple[float, float]  # a tiny extra kernel (fill) in the same graph
    pdl_saving_us: tuple[float, float]  # launch-cost reduction with programmatic dependent launch
    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    max_ctas_per_sm: int = 32
    smem_per_sm: int = 233472  # bytes usable by CTAs (228 KB)
    smem_reserved_per_cta: int = 1024
    bf16_tflops: float = 989.0  # dense, tensor cores (wgmma / tcgen05)
    mma_sync_fraction: float = 0.66  # mma.sync vs the wgmma peak (assumption)
    fp4_tflops: float = 0.0  # dense block-scaled FP4 (sm100)
    achievable_bw_low_tbs: float = 0.0  # the pessimistic end (0: the optimistic one)
    source: str = ""

    @property
    def clock_hz(self) -> float:
        return self.clock_ghz * 1e9

    @property
    def achievable_bw(self) -> float:
        """Bytes per second."""
        return self.achievable_bw_tbs * 1e12

    @property
    def achievable_bw_range(self) -> tuple[float, float]:
        """(pessimistic, optimistic) achievable bandwidth, bytes per second."""
        return ((self.achievable_bw_low_tbs or self.achievable_bw_tbs) * 1e12, self.achievable_bw_tbs * 1e12)

    def cycles_to_us(self, cycles: float) -> float:
        return cycles / self.clock_hz * 1e6

    def little_bytes_per_sm(self, latency_cycles: float) -> float:
        """Bytes one SM must keep in flight to pull its share of the achievable bandwidth."""
        return self.achievable_bw / self.sm_count * latency_cycles / self.clock_hz


_HOPPER = dict(
    arch="sm_90a", sm_count=132, schedulers_per_sm=4, clock_ghz=1.98, l2_mb=50.0,
    dram_latency=(1200.0, 2000.0), l2_latency=(270.0, 550.0), sm_fabric_bytes_per_clk=64.0,
    launch_us=(1.5, 2.5), aux_kernel_us=(1.0, 2.0), pdl_saving_us=(0.3, 0.7), bf16_tflops=989.0,
)

GPUS: dict[str, Hardware] = {
    "H200": Hardware(name="H200", peak_bw_tbs=4.8, achievable_bw_tbs=4.3, achievable_bw_low_tbs=3.85,
                     source="brief constants; review_sm90_sass.md; published H200 bf16 GEMV (bench/results/model_calibration.md)", **_HOPPER),
    "H100": Hardware(name="H100", peak_bw_tbs=3.35, achievable_bw_tbs=3.0, achievable_bw_low_tbs=2.68,
                     source="H100 SXM datasheet (3.35 TB/s); 90 % achievable as on H200", **_HOPPER),
    "B200": Hardware(
        name="B200", arch="sm_100a", sm_count=148, schedulers_per_sm=4, clock_ghz=1.965, peak_bw_tbs=8.0,
        achievable_bw_tbs=6.8, achievable_bw_low_tbs=6.0, l2_mb=126.0, dram_latency=(1400.0, 2400.0), l2_latency=(300.0, 700.0),
        sm_fabric_bytes_per_clk=64.0, launch_us=(1.5, 2.5), aux_kernel_us=(1.0, 2.0), pdl_saving_us=(0.3, 0.7),
        bf16_tflops=2250.0, fp4_tflops=9000.0,
        source="NVIDIA B200 datasheet (8 TB/s); chipsandcheese B200 article (148 SMs, L2, clocks); "
        "achievable fraction and latencies assumed",
    ),
}
GPUS["GB200"] = Hardware(**{**GPUS["B200"].__dict__, "name": "GB200", "source": "B200 numbers (per GPU)"})
GPUS["B300"] = Hardware(**{**GPUS["B200"].__dict__, "name": "B300", "arch": "sm_103a",
                           "source": "B200 numbers as a stand-in"})


def _other(name: str, arch: str, sm_count: int, clock_ghz: float, peak_bw_tbs: float, l2_mb: float, bf16_tflops: float,
           source: str) -> Hardware:
    """A non-Hopper, non-sm_100 GPU: its published figures, the per-capability limits and the shared
    assumptions of the module docstring."""
    cc = {"sm_80": (167936, 2048, 32), "sm_86": (102400, 1536, 16), "sm_89": (102400, 1536, 24),
          "sm_120a": (102400, 1536, 32), "sm_121a": (102400, 1536, 32)}[arch]
    pdl = arch.startswith("sm_12")
    return Hardware(
        name=name, arch=arch, sm_count=sm_count, schedulers_per_sm=4, clock_ghz=clock_ghz, peak_bw_tbs=peak_bw_tbs,
        achievable_bw_tbs=round(0.9 * peak_bw_tbs, 4), achievable_bw_low_tbs=round(0.8 * peak_bw_tbs, 4), l2_mb=l2_mb,
        dram_latency=(1200.0, 2000.0), l2_latency=(270.0, 550.0), sm_fabric_bytes_per_clk=64.0, launch_us=(1.5, 2.5),
        aux_kernel_us=(1.0, 2.0), pdl_saving_us=(0.3, 0.7) if pdl else (0.0, 0.0), smem_per_sm=cc[0],
        max_threads_per_sm=cc[1], max_ctas_per_sm=cc[2], bf16_tflops=bf16_tflops, mma_sync_fraction=1.0,
        source=source + "; per-SM limits: CUDA C++ Programming Guide; achievable 80-90 % of peak and latencies assumed",
    )


GPUS.update({
    "RTX5090": _other("RTX5090", "sm_120a", 170, 2.407, 1.792, 96.0, 209.5,
                      "NVIDIA RTX Blackwell GPU architecture whitepaper, GeForce RTX 5090 (170 SMs, 2407 MHz boost, "
                      "1792 GB/s GDDR7, 96 MB L2, 209.5 dense fp16/bf16 tensor TFLOPS with fp32 accumulate)"),
    "RTX5080": _other("RTX5080", "sm_120a", 84, 2.617, 0.960, 64.0, 112.6,
                      "NVIDIA RTX Blackwell GPU architecture whitepaper, GeForce RTX 5080 (84 SMs, 2617 MHz boost, "
                      "960 GB/s GDDR7, 64 MB L2, 112.6 dense fp16/bf16 tensor TFLOPS with fp32 accumulate)"),
    "RTXPRO6000": _other("RTXPRO6000", "sm_120a", 188, 2.617, 1.792, 128.0, 500.0,
                         "NVIDIA RTX PRO 6000 Blackwell Workstation Edition datasheet (24064 CUDA cores = 188 SMs, "
                         "1792 GB/s GDDR7 ECC, 125 TFLOPS fp32 -> 2.6 GHz, 4000 AI TOPS fp4 sparse -> 500 dense bf16 "
                         "TFLOPS, fp32 accumulate at full rate on RTX PRO); 128 MB L2 (GB202, TechPowerUp GPU database)"),
    "GB10": _other("GB10", "sm_121a", 48, 2.52, 0.273, 24.0, 125.0,
                   "NVIDIA DGX Spark datasheet (GB10: 6144 CUDA cores = 48 SMs, 128 GB LPDDR5x at 273 GB/s, 1 PFLOPS "
                   "fp4 sparse -> 125 dense bf16 TFLOPS, an upper bound); Hot Chips 2025 GB10 talk (31 TFLOPS fp32 "
                   "-> 2.52 GHz); the 24 MB L2 is an assumption (not published)"),
    "L40S": _other("L40S", "sm_89", 142, 2.52, 0.864, 96.0, 362.05,
                   "NVIDIA L40S datasheet (864 GB/s GDDR6, 362.05 dense bf16 tensor TFLOPS); NVIDIA Ada Lovelace "
                   "architecture whitepaper (AD102: 142 SMs on L40S, 2520 MHz boost, 96 MB L2)"),
    "RTX4090": _other("RTX4090", "sm_89", 128, 2.52, 1.008, 72.0, 165.2,
                      "NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090 (128 SMs, 2520 MHz boost, "
                      "1008 GB/s GDDR6X, 72 MB L2, 165.2 dense fp16/bf16 tensor TFLOPS with fp32 accumulate)"),
    "A10": _other("A10", "sm_86", 72, 1.695, 0.600, 6.0, 125.0,
                  "NVIDIA A10 datasheet (600 GB/s GDDR6, 125 dense bf16 tensor TFLOPS); NVIDIA Ampere GA102 "
                  "whitepaper (72 SMs on A10, 1695 MHz boost, 6 MB L2)"),
    "RTX3090": _other("RTX3090", "sm_86", 82, 1.695, 0.936, 6.0, 71.0,
                      "NVIDIA Ampere GA102 GPU architecture whitepaper, GeForce RTX 3090 (82 SMs, 1695 MHz boost, "
                      "936 GB/s GDDR6X, 6 MB L2, 71 dense fp16/bf16 tensor TFLOPS with fp32 accumulate)"),
    "A100": _other("A100", "sm_80", 108, 1.41, 2.039, 40.0, 312.0,
                   "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM (2039 GB/s HBM2e, 312 dense bf16 tensor "
                   "TFLOPS); NVIDIA A100 architecture whitepaper (108 SMs, 1410 MHz boost, 40 MB L2)"),
})

#: The GPU a bare arch string is modelled on.
DEFAULT_GPU_OF_ARCH = {"sm_90a": "H200", "sm_100a": "B200", "sm_100f": "B200", "sm_103a": "B300",
                       "sm_120a": "RTX5090", "sm_121a": "GB10", "sm_89": "L40S", "sm_86": "A10", "sm_80": "A100"}

#: Other spellings of the GPU names (``get_hardware`` and ``Target.from_gpu`` accept them).
GPU_ALIASES = {"RTX_5090": "RTX5090", "RTX_5080": "RTX5080", "RTX_PRO_6000": "RTXPRO6000",
               "RTXPRO6000BLACKWELL": "RTXPRO6000", "DGX_SPARK": "GB10", "DGXSPARK": "GB10", "SPARK": "GB10",
               "RTX_4090": "RTX4090", "RTX_3090": "RTX3090", "A100_SXM": "A100", "A100_80GB": "A100"}


def get_hardware(name: str, sm_count: int | None = None) -> Hardware:
    """The model's description of a named GPU (``sm_count`` overrides the SM count)."""
    key = name.upper()
    key = GPU_ALIASES.get(key, key.replace("_SXM", ""))
    if key not in GPUS:
        raise KeyError(f"nvgemm perfmodel: no hardware description for {name!r}; known: {', '.join(GPUS)}")
    hw = GPUS[key]
    if sm_count is not None and sm_count != hw.sm_count:
        hw = Hardware(**{**hw.__dict__, "sm_count": int(sm_count)})
    return hw


__all__ = ["DEFAULT_GPU_OF_ARCH", "GPUS", "GPU_ALIASES", "Hardware", "get_hardware"]
