"""The sm120 W4A4 family's performance model: a byte / latency model of the decode kernel on the
consumer-Blackwell devices. **A MODEL, not a measurement** (the kernel has never run on hardware);
the candidate policy only ranks configs with it. Its numbers: ``python bench/compile_sweep_sm120.py`` (the
first pick's modelled time per problem) and ``python bench/perf_model.py sm120`` (the picks against the bf16
baseline, ``bench/results/sm120_model.md``).

Device numbers come from :mod:`nvgemm.heuristics.perfmodel.hardware` (``GPUS``: RTX 5090, RTX 5080,
RTX PRO 6000, GB10; each entry cites its sources), the single place nvgemm keeps them: SM count,
achievable streaming bandwidth (80-90 % of the published peak), DRAM latency (1200-2000 cycles at
the published boost clock), the per-launch cost less the PDL saving, and the compute capability's
shared memory / resident threads / resident CTAs per SM. A bare arch is modelled on
``DEFAULT_GPU_OF_ARCH`` (RTX 5090 for sm_120a, GB10 for sm_121a).

Kernel assumption kept here: split-K pays its fp32 partials' round trip through L2 and one extra
dependent step of 1-2 us (:data:`SPLITK_STEP_US`).

The kernel's own facts the model uses: shared memory per CTA (:func:`~.config.smem_bytes`) and
threads decide the CTAs resident per SM; ``stages - 1`` stages of weight bytes are in flight per
CTA (the cp.async ring), which bounds the bandwidth a grid can draw by Little's law; registers are
not a limit (the compile sweep's SASS: <= 128 per thread, no spills,
``bench/results/sm120_compile_sweep.md``).
"""

from __future__ import annotations

from nvgemm.heuristics.perfmodel.facts import FamilyFacts, Geometry, KernelFacts, SplitKReduce
from nvgemm.heuristics.perfmodel.hardware import DEFAULT_GPU_OF_ARCH, GPUS, Hardware, get_hardware
from nvgemm.templates.sm120_w4a4.config import (
    ROW_TILE, TEMPLATE_ID, Sm120W4A4Config, config_from_name, k_stages, smem_bytes, stage_bytes,
)
from nvgemm.templates.sm120_w4a4.validity import can_implement_problem


#: the split-K reduce's extra dependent step, us (pessimistic, optimistic): a kernel assumption
SPLITK_STEP_US = (2.0, 1.0)
#: the GPUs with sm_120a / sm_121a profiles in ``GPUS``
SM120_GPUS = tuple(name for name, hw in GPUS.items() if hw.arch in ("sm_120a", "sm_121a"))


def device_for(arch: str, sm_count: int = 0, gpu: str | None = None) -> Hardware:
    """The hardware profile the model runs on: ``gpu``'s (``get_hardware``); without a name, the profile of the
    arch with the caller's SM count (a real device's: 84 SMs on sm_120a is an RTX 5080), else the arch's
    default GPU's with that SM count."""
    if arch not in ("sm_120a", "sm_121a"):
        raise ValueError(f"nvgemm sm120 perf: arch {arch!r} is not sm_120a / sm_121a")
    if gpu is None and sm_count:
        gpu = next((g for g, hw in GPUS.items() if hw.arch == arch and hw.sm_count == int(sm_count)), None)
    hw = get_hardware(gpu or DEFAULT_GPU_OF_ARCH[arch], int(sm_count) or None)
    if hw.arch != arch:
        raise ValueError(f"nvgemm sm120 perf: GPU {hw.name} is {hw.arch}, not {arch}")
    return hw


def _dram_latency_ns(dev: Hardware, end: int) -> float:
    """Loaded DRAM latency, ns: the pessimistic end (0) is the high cycle count."""
    return dev.cycles_to_us(dev.dram_latency[1 - end]) * 1e3


def _launch_us(dev: Hardware, pdl: bool, end: int) -> float:
    """One launch in a CUDA graph, less the PDL saving when the kernel launches with PDL."""
    return dev.launch_us[1 - end] - (dev.pdl_saving_us[end] if pdl else 0.0)


def ctas_per_sm(c: Sm120W4A4Config, dev: Hardware) -> int:
    # every block also reserves 1 KB of the SM's shared memory for the system (smem_reserved_per_cta)
    return max(0, min(dev.smem_per_sm // (smem_bytes(c) + dev.smem_reserved_per_cta),
                      dev.max_threads_per_sm // c.threads, dev.max_ctas_per_sm))


def model_us(c: Sm120W4A4Config, m: int, n: int, k: int, dev: Hardware, gated: bool = False,
             out_bytes: int = 2, end: int = 1) -> float:
    """Modelled time of one call (us); ``end`` 0 = pessimistic, 1 = optimistic end of every range."""
    feat = c.tile_n // 2 if gated else c.tile_n
    n_out = n // 2 if gated else n
    grid_n, grid_m = -(-n_out // feat), -(-m // c.tile_m)
    ctas = grid_n * grid_m * c.split_k
    per_sm = ctas_per_sm(c, dev)
    if per_sm == 0:
        return float("inf")
    resident = min(ctas, dev.sm_count * per_sm)
    waves = -(-ctas // (dev.sm_count * per_sm))
    n_pad = -(-n // ROW_TILE) * ROW_TILE
    kst = -(-k // c.tile_k)
    # weights and scales once (M tiles of a row block share them through L2), activations per row block
    # (L2 hits after the first), the output, and split-K's fp32 partials written and read back
    w_bytes = n_pad * kst * c.tile_k * (0.5 + 1 / 16)
    bytes_ = w_bytes + m * k * 0.5625 + m * n_out * out_bytes
    if c.split_k > 1:
        bytes_ += 2 * c.split_k * m * n_pad * 4
    bw = dev.achievable_bw_range[end]
    lat_ns = _dram_latency_ns(dev, end)
    # Little's law: bytes in flight over the grid's resident CTAs (stages - 1 weight stages each)
    stage_w = c.tile_n * c.tile_k * (0.5 + 1 / 16)
    inflight = resident * (c.stages - 1) * stage_w
    bw = min(bw, inflight / (lat_ns * 1e-9))
    # wave quantisation: a partial last wave streams at the rate of its CTAs
    eff = ctas / (waves * dev.sm_count * per_sm) if waves > 1 else 1.0
    t = bytes_ / bw / max(eff, 1e-3) * 1e6
    # the K loop of one CTA cannot be shorter than its stages' latency chain (ring refills)
    stages_per_cta = -(-kst // c.split_k)
    t = max(t, waves * stages_per_cta * lat_ns * 1e-3 / max(c.stages - 1, 1))
    t += _launch_us(dev, c.pdl, end)
    if c.split_k > 1:
        t += SPLITK_STEP_US[end]
    return t


def model_range_us(c: Sm120W4A4Config, m: int, n: int, k: int, dev: Hardware, gated: bool = False,
                   out_bytes: int = 2) -> tuple[float, float]:
    """(optimistic, pessimistic) modelled time."""
    return (model_us(c, m, n, k, dev, gated, out_bytes, 1), model_us(c, m, n, k, dev, gated, out_bytes, 0))


def byte_floor_us(m: int, n: int, k: int, dev: Hardware) -> float:
    """The time to read the NVFP4 weights once at the optimistic achievable bandwidth."""
    return n * k * 0.5625 / dev.achievable_bw_range[1] * 1e6


#: bytes per weight element streamed: 0.5 (E2M1) + 1/16 (one ue4m3 scale per 16)
NVFP4_BYTES = 0.5625
#: serial L2 round trips of the in-kernel split-K reduce (partial stores + fence, counter atomic, loads)
SPLITK_L2_TRIPS = 3.0
#: main-loop SASS instructions per MMA (per warp), read from the compiled kernels (cutlass-dsl 4.8.1,
#: tests/compile/test_sm120_compile.py's loop finder): 59 instructions around 8 OMMA.SF for
#: t8x128x256 w4 s4 (sm_120a), 74 around 16 for t16x128x256 / t32x64x128 (the ring refill sits in a
#: branch ptxas places after the loop); used by :meth:`Sm120Facts.estimate_static` for configs the
#: committed SASS table does not hold
LOOP_INSTRS_PER_MMA = 7.5


class Sm120Facts(FamilyFacts):
    """Facts of the sm120 W4A4 decode kernel for nvgemm's performance model
    (:mod:`nvgemm.heuristics.perfmodel`): a cp.async ring of ``stages`` (every copy an ``LDGSTS``),
    one iteration = one stage = ``tile_k`` K of the CTA's ``tile_n`` rows, of which a thread consumes
    ``row_tiles x slabs x 16 x 64 / 32`` weight elements; ``stages - 1`` stages in flight. The
    in-kernel split-K reduce is ``batched`` (the last CTA loads every partial of an element, then sums)."""

    name = "sm120.w4a4"
    arch = "sm_120a"
    engine = "sass_chain"
    stream_load = r"^LDGSTS"
    dynamic_smem = True

    def matches(self, config) -> bool:
        return isinstance(config, Sm120W4A4Config)

    def template_id(self, config) -> str:
        return TEMPLATE_ID

    def elems_per_thread_iter(self, config) -> float:
        return config.row_tiles * config.slabs * ROW_TILE * 64 / 32

    def loop_key(self, config):
        """split_k does not change the main loop (a split runs fewer iterations of it)."""
        c = config
        return (self.name, c.tile_m, c.tile_n, c.tile_k, c.num_warps, c.stages, c.pdl)

    def shape_problem(self, config, m: int, n: int, k: int) -> str | None:
        st = can_implement_problem(config, m=m, n=n, k=k)
        return None if st else st.reason

    def min_round_trips(self, config) -> float:
        return 1.0 / max(config.stages - 1, 1)

    def parse_name(self, name: str):
        try:
            return config_from_name(name)
        except ValueError:
            return None

    def estimate_static(self, config) -> KernelFacts | None:
        mmas = config.row_tiles * config.slabs * config.m_groups
        loop = int(round(LOOP_INSTRS_PER_MMA * mmas))
        return KernelFacts(config=config.name(), arch=self.arch, family=self.name, regs=128,
                           smem_bytes=smem_bytes(config), loop_instrs=loop, loop_issue_cycles=loop,
                           chain_base=float(loop), round_trips=self.min_round_trips(config),
                           elems_per_thread_iter=self.elems_per_thread_iter(config), source="estimate")

    def geometry(self, config, m: int, n: int, k: int, hw) -> Geometry:
        c = config
        n_pad = -(-n // ROW_TILE) * ROW_TILE
        grid_n, grid_m = -(-n // c.tile_n), -(-m // c.tile_m)
        kst = k_stages(k, c.tile_k)
        sb = stage_bytes(c)
        wb = n_pad * kst * c.tile_k * NVFP4_BYTES
        ws = float(2 * c.split_k * m * n_pad * 4) if c.split_k > 1 else 0.0
        splitk = SplitKReduce("batched", c.split_k, ws, dependent_l2_trips=SPLITK_L2_TRIPS) if c.split_k > 1 else None
        return Geometry(ctas=grid_n * grid_m * c.split_k, threads=c.threads, iters_per_cta=-(-kst // c.split_k),
                        passes_per_cta=1, stream_bytes_per_iter=float(sb["weights"] + sb["weight_scales"]),
                        other_bytes_per_iter=float(sb["x"] + sb["x_scales"]), dram_bytes=wb + m * k * NVFP4_BYTES
                        + m * n * 2 + ws, weight_bytes=wb, depth=float(c.stages - 1), splitk=splitk, pdl=c.pdl,
                        aux_kernels=1,  # the activation quantizer
                        l2_reread_fraction=(grid_m - 1) / grid_m)


__all__ = ["NVFP4_BYTES", "SM120_GPUS", "SPLITK_STEP_US", "Sm120Facts", "byte_floor_us", "ctas_per_sm", "device_for", "model_range_us",
           "model_us"]
