"""The analytic time model: static kernel facts + geometry + hardware -> a modelled time range.

    kernel = max(byte floor, issue floor, tensor floor, serial latency chain)
    per call = kernel + launches + split-K reduce kernel + host-path helper kernels

Every output is a MODEL (a GPU measurement overrides it) and a ``(low, high)`` range: *low* takes
the optimistic end of every hardware range (DRAM/L2 latency, launch cost, helper-kernel cost, PDL
saving), *high* the pessimistic end. Terms (times per call, busiest SM where it matters):

byte floor
    DRAM bytes of the call (weights + scales, re-read when M tiles run after the weights left
    L2; activations; output; split-K partials written) / the achievable bandwidth.
issue floor (engine ``sass_chain``)
    every CTA's warp-instructions -- ``iterations x issue cycles of the main-loop body + passes x
    per-pass overhead + prologue/epilogue`` (issue cycles count the integer datapath at 2 and the
    conversion unit at 8 cycles per warp-instruction, see :mod:`.sass`) -- spread over all SMs x
    4 schedulers x clock.
tensor floor
    tensor-core FLOPs incl. tile padding / the family's rate (mma.sync, wgmma, tcgen05).
serial latency chain (Little's law)
    *sass_chain*: CTAs run in waves of ``resident CTAs per SM x SMs``; one main-loop step of a
    CTA takes ``max(T1(L), w x issue cycles, q x bytes per step / per-SM fabric, q x tensor-core
    cycles per step at the SM's rate)`` (the last: a tensor-bound kernel pays for a partial last
    wave; a split tail -- the last CTAs each doing a share of a tile's K after the full waves --
    runs in its own waves at its own step count) where
    ``T1(L) = chain_base + round_trips x L`` is the single-warp time of one iteration replayed
    from the SASS control bits (:func:`.sass.loop_cycles`; iterations that re-read weights
    still in L2 -- a CTA's second M pass, later M tiles of weights that fit L2 -- take the L2
    latency: ``L`` is blended by the family's ``l2_reread_fraction``), ``w`` the warps sharing a
    scheduler and ``q`` the resident CTAs (the standard multithreading bound: warps hide each
    other's latency until the scheduler is full). A CTA = iterations x step + per-pass and fixed
    overhead at ``w`` x their instructions + in-kernel split-K round trips. Full waves at full
    residency, then the tail wave at its own (lower) residency.
    *pipeline* (TMA / warp-specialised, sm100): one CTA per SM keeps ``stages`` K tiles in
    flight, so a stage takes ``max(L / stages, stage bytes / per-SM fabric, MMA cycles)``; the
    busiest CTA = fill latency + its stages + its exposed epilogue + split-K round trips (fence,
    counter atomic, reduction).
launches
    fixed cost per kernel of the call in a CUDA graph (the main kernel plus a split-K reduce
    kernel), less the PDL saving when the config launches with PDL; host-path helper kernels
    (fills, activation quantize) at the tiny-kernel cost each.

Bytes in flight per SM: *peak* = resident CTAs x stream bytes of one iteration (x stages for a
pipeline); *time-averaged* = (weight bytes per active SM / kernel time) x L (Little's law);
*needed* = achievable bandwidth / SMs x L.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from .facts import FamilyFacts, Geometry, KernelFacts, ceil_div, family_for
from .hardware import Hardware, get_hardware
from .table import lookup

US = 1e6


@dataclass(frozen=True)
class Occupancy:
    ctas_per_sm: int
    warps_per_sm: int
    limiter: str  # "registers" | "shared memory" | "threads" | "CTA slots" | "persistent (1 CTA/SM)"


@dataclass(frozen=True)
class Estimate:
    """One modelled call (all times in microseconds, ranges as (low, high))."""

    config: str
    family: str
    gpu: str
    m: int
    n: int
    k: int
    facts: KernelFacts
    geometry: Geometry
    occupancy: Occupancy
    byte_floor_us: float
    issue_floor_us: float
    tensor_floor_us: float
    chain_us: tuple[float, float]
    kernel_us: tuple[float, float]
    launch_us: tuple[float, float]
    splitk_us: tuple[float, float]
    aux_us: tuple[float, float]
    total_us: tuple[float, float]
    limiter: tuple[str, str]  # what sets the kernel time at (low, high)
    inflight_peak_per_sm: float  # bytes
    inflight_avg_per_sm: tuple[float, float]
    inflight_needed_per_sm: tuple[float, float]
    weight_tbs: tuple[float, float]  # weight + scale bytes / total time (TB/s), (at low, at high)
    pct_of_achievable: tuple[float, float]
    pct_of_peak: tuple[float, float]
    notes: tuple[str, ...] = field(default=())
    _peak: float = 0.0  # peak bandwidth TB/s of the modelled GPU

    @property
    def mid_us(self) -> float:
        return 0.5 * (self.total_us[0] + self.total_us[1])

    @property
    def gemm_us(self) -> tuple[float, float]:
        """The GEMM alone: kernel(s) + their launches, without the host path's helper kernels."""
        return (self.total_us[0] - self.aux_us[0], self.total_us[1] - self.aux_us[1])

    def gemm_pct_of_peak(self) -> tuple[float, float]:
        """Weight bytes / GEMM time as % of the peak bandwidth, (at low, at high)."""
        return tuple(100 * self.weight_tbs_at(t) / self._peak for t in self.gemm_us)

    def weight_tbs_at(self, us: float) -> float:
        return self.geometry.weight_bytes / (us / US) / 1e12

    def as_dict(self) -> dict:
        return {
            "config": self.config, "family": self.family, "gpu": self.gpu, "m": self.m, "n": self.n, "k": self.k,
            "facts_source": self.facts.source, "regs": self.facts.regs, "smem_bytes": self.facts.smem_bytes,
            "spills": {"ldl": self.facts.ldl, "stl": self.facts.stl, "ldl_loop": self.facts.ldl_loop,
                       "stl_loop": self.facts.stl_loop},
            "loop_instrs": self.facts.loop_instrs, "instr_per_elem": _finite(self.facts.instr_per_elem),
            "round_trips_per_iter": self.facts.round_trips,
            "occupancy": self.occupancy.__dict__, "ctas": self.geometry.ctas,
            "iters_per_cta": self.geometry.iters_per_cta,
            "byte_floor_us": self.byte_floor_us, "issue_floor_us": self.issue_floor_us,
            "tensor_floor_us": self.tensor_floor_us, "chain_us": self.chain_us, "kernel_us": self.kernel_us,
            "launch_us": self.launch_us, "splitk_us": self.splitk_us, "aux_us": self.aux_us,
            "total_us": self.total_us, "gemm_us": self.gemm_us, "limiter": self.limiter,
            "inflight_peak_per_sm": self.inflight_peak_per_sm, "inflight_avg_per_sm": self.inflight_avg_per_sm,
            "inflight_needed_per_sm": self.inflight_needed_per_sm, "weight_tbs": self.weight_tbs,
            "pct_of_achievable": self.pct_of_achievable, "pct_of_peak": self.pct_of_peak, "notes": list(self.notes),
        }


def _finite(x: float):
    return None if x is None or math.isnan(x) else x


def occupancy(facts: KernelFacts, geo: Geometry, hw: Hardware) -> Occupancy:
    """Resident CTAs per SM from registers (per scheduler quadrant), shared memory, threads."""
    warps = ceil_div(geo.threads, 32)
    if geo.resident_ctas is not None:
        return Occupancy(geo.resident_ctas, geo.resident_ctas * warps, "persistent (1 CTA/SM)")
    limits = {"CTA slots": hw.max_ctas_per_sm, "threads": hw.max_threads_per_sm // geo.threads}
    if facts.regs:
        alloc = ceil_div(max(facts.regs, 1) * 32, 256) * 256  # registers per warp, 256-register units
        warps_by_regs = hw.schedulers_per_sm * ((hw.regs_per_sm // hw.schedulers_per_sm) // alloc)
        limits["registers"] = warps_by_regs // warps
    if facts.smem_bytes:
        limits["shared memory"] = hw.smem_per_sm // (facts.smem_bytes + hw.smem_reserved_per_cta)
    limiter = min(limits, key=lambda k: (limits[k], k))
    r = max(1, limits[limiter]) if limits[limiter] >= 1 else 0
    if r == 0:
        return Occupancy(0, 0, limiter)
    return Occupancy(r, r * warps, limiter)


def _sass_chain_cycles(facts: KernelFacts, geo: Geometry, hw: Hardware, occ: Occupancy, lat: float,
                       l2: float) -> float:
    warps = ceil_div(geo.threads, 32)
    slots = occ.ctas_per_sm * hw.sm_count
    fabric = hw.sm_fabric_bytes_per_clk
    bytes_iter = geo.stream_bytes_per_iter + geo.other_bytes_per_iter
    issue_iter = facts.loop_issue_cycles or facts.loop_instrs
    f = geo.l2_reread_fraction  # re-read iterations wait for L2, not DRAM
    t1 = facts.chain_cycles(f * l2 + (1.0 - f) * lat)
    trips = geo.splitk.dependent_l2_trips if geo.splitk and geo.splitk.kind != "kernel" else 0.0
    full_ctas = geo.ctas - geo.tail_ctas
    # tensor-core cycles of one CTA's main-loop step at the SM's rate (q resident CTAs share it), so
    # a tensor-bound kernel pays for partial waves like a latency-bound one
    tensor_step = 0.0
    steps = full_ctas * geo.iters_per_cta + geo.tail_ctas * geo.tail_iters
    if geo.tensor_tflops and steps:
        sm_flops_per_clk = geo.tensor_tflops * 1e12 / hw.sm_count / hw.clock_hz
        tensor_step = geo.tensor_flops / steps / sm_flops_per_clk

    def cta_cycles(q: int, iters: int, reduce: bool) -> float:
        w = ceil_div(q * warps, hw.schedulers_per_sm)
        step = max(t1, w * issue_iter, q * bytes_iter / fabric, q * tensor_step)
        return (iters * step + w * (geo.passes_per_cta * facts.pass_instrs + facts.fixed_instrs)
                + (trips * l2 if reduce else 0.0) + geo.epilogue_cycles)

    def waves(n: int, iters: int, reduce: bool) -> float:
        full, tail = divmod(n, slots)
        cycles = full * cta_cycles(occ.ctas_per_sm, iters, reduce)
        if tail:
            cycles += cta_cycles(ceil_div(tail, hw.sm_count), iters, reduce)
        return cycles

    if not geo.tail_ctas:  # every CTA alike (split-K: all of them reduce)
        return waves(geo.ctas, geo.iters_per_cta, True)
    return waves(full_ctas, geo.iters_per_cta, False) + waves(geo.tail_ctas, geo.tail_iters, True)


def _pipeline_chain_cycles(facts: KernelFacts, geo: Geometry, hw: Hardware, lat: float, l2: float) -> float:
    bytes_stage = geo.stream_bytes_per_iter + geo.other_bytes_per_iter
    mma_cycles = 0.0
    if geo.tensor_tflops and geo.iters_per_cta:
        per_sm_flops_per_clk = geo.tensor_tflops * 1e12 / hw.sm_count / hw.clock_hz
        mma_cycles = geo.tensor_flops / max(geo.ctas, 1) / geo.iters_per_cta / per_sm_flops_per_clk
    step = max(lat / max(geo.depth, 1.0), bytes_stage / hw.sm_fabric_bytes_per_clk, mma_cycles)
    trips = geo.splitk.dependent_l2_trips if geo.splitk else 0.0
    return lat + geo.iters_per_cta * step + geo.epilogue_cycles + trips * l2


def estimate_with(config, m: int, n: int, k: int, hw: Hardware, facts: KernelFacts, fam: FamilyFacts) -> Estimate:
    """The model for explicit static facts (what :func:`estimate` does after the table lookup)."""
    if fam.engine == "pipeline" and hasattr(fam, "geometry"):
        kind = "rolled" if facts.extra.get("rolled_reduce", False) else "batched"
        try:
            geo = fam.geometry(config, m, n, k, hw, reduce_kind=kind)
        except TypeError:
            geo = fam.geometry(config, m, n, k, hw)
    else:
        geo = fam.geometry(config, m, n, k, hw)
    occ = occupancy(facts, geo, hw)
    notes: list[str] = []
    if facts.source.startswith(("table (", "estimate")):
        notes.append(f"static facts: {facts.source}")
    if occ.ctas_per_sm == 0:
        raise ValueError(f"{config.name()}: does not fit on an SM ({occ.limiter})")
    warps = ceil_div(geo.threads, 32)
    clk = hw.clock_hz
    byte_floor = geo.dram_bytes / hw.achievable_bw * US
    issue_floor = 0.0
    if fam.engine == "sass_chain":
        steps = (geo.ctas - geo.tail_ctas) * geo.iters_per_cta + geo.tail_ctas * geo.tail_iters
        warp_cycles = warps * (steps * (facts.loop_issue_cycles or facts.loop_instrs)
                               + geo.ctas * (geo.passes_per_cta * facts.pass_instrs + facts.fixed_instrs))
        issue_floor = warp_cycles / (hw.sm_count * hw.schedulers_per_sm) / clk * US
    tensor_floor = geo.tensor_flops / (geo.tensor_tflops * 1e12) * US if geo.tensor_tflops else 0.0

    chains, kernels, limiters = [], [], []
    for lat, l2 in zip(hw.dram_latency, hw.l2_latency):
        if fam.engine == "pipeline":
            cyc = _pipeline_chain_cycles(facts, geo, hw, lat, l2)
        else:
            cyc = _sass_chain_cycles(facts, geo, hw, occ, lat, l2)
        chain = cyc / clk * US
        terms = {"bytes": byte_floor, "issue": issue_floor, "tensor": tensor_floor, "latency": chain}
        lim = max(terms, key=terms.get)
        chains.append(chain)
        kernels.append(terms[lim])
        limiters.append(lim)

    launches = 1 + geo.extra_launches
    pdl = hw.pdl_saving_us if geo.pdl else (0.0, 0.0)
    launch = (launches * hw.launch_us[0] - pdl[1], launches * hw.launch_us[1] - pdl[0])
    sk = (0.0, 0.0)
    if geo.splitk is not None and geo.splitk.kind == "kernel":
        rd = geo.splitk.workspace_bytes / hw.achievable_bw * US
        sk = tuple(rd + 2 * l2 / clk * US for l2 in hw.l2_latency)
    aux = (geo.aux_kernels * hw.aux_kernel_us[0], geo.aux_kernels * hw.aux_kernel_us[1])
    total = tuple(kernels[i] + launch[i] + sk[i] + aux[i] for i in range(2))

    active_sms = min(hw.sm_count, geo.ctas)
    # both engines: ``depth`` iterations of loads in flight per CTA (a TMA / cp.async ring; 1: none ahead)
    peak = occ.ctas_per_sm * geo.depth * geo.stream_bytes_per_iter
    avg = tuple(geo.weight_bytes / active_sms / (kernels[i] / US) * (hw.dram_latency[i] / clk) for i in range(2))
    needed = tuple(hw.little_bytes_per_sm(lat) for lat in hw.dram_latency)
    tbs = tuple(geo.weight_bytes / (t / US) / 1e12 for t in total)
    if fam.engine == "sass_chain" and (facts.ldl_loop or facts.stl_loop):
        notes.append(f"local memory in the main loop (LDL {facts.ldl_loop}, STL {facts.stl_loop})")
    if geo.note:
        notes.append(geo.note)
    return Estimate(
        config=config.name(), family=fam.name, gpu=hw.name, m=m, n=n, k=k, facts=facts, geometry=geo, occupancy=occ,
        byte_floor_us=byte_floor, issue_floor_us=issue_floor, tensor_floor_us=tensor_floor,
        chain_us=(chains[0], chains[1]), kernel_us=(kernels[0], kernels[1]), launch_us=launch, splitk_us=sk,
        aux_us=aux, total_us=(total[0], total[1]), limiter=(limiters[0], limiters[1]),
        inflight_peak_per_sm=peak, inflight_avg_per_sm=(avg[0], avg[1]), inflight_needed_per_sm=(needed[0], needed[1]),
        weight_tbs=(tbs[0], tbs[1]),
        pct_of_achievable=(100 * tbs[0] / hw.achievable_bw_tbs, 100 * tbs[1] / hw.achievable_bw_tbs),
        pct_of_peak=(100 * tbs[0] / hw.peak_bw_tbs, 100 * tbs[1] / hw.peak_bw_tbs),
        notes=tuple(notes), _peak=hw.peak_bw_tbs,
    )


def why_not(config, m: int, n: int, k: int) -> str | None:
    """Why the model has no estimate for ``config`` on (M, N, K) (None: it has one)."""
    fam = family_for(config)
    if fam is None:
        return f"no performance-model family owns {type(config).__name__}"
    return fam.shape_problem(config, m, n, k)


@functools.lru_cache(maxsize=65536)
def _estimate_cached(config, m: int, n: int, k: int, gpu: str, sm_count: int | None) -> Estimate | None:
    fam = family_for(config)
    if fam is None or fam.shape_problem(config, m, n, k):
        return None
    hw = get_hardware(gpu, sm_count)
    facts = lookup(config, hw.arch if hw.arch == fam.arch else fam.arch)
    if facts is None:
        return None
    try:
        return estimate_with(config, m, n, k, hw, facts, fam)
    except ValueError:
        return None


def estimate(config, m: int, n: int, k: int, gpu: str = "H200", sm_count: int | None = None) -> Estimate | None:
    """Modelled call of ``config`` on (M, N, K) on ``gpu`` -- None when the model cannot say
    (no family, the shape does not fit the config, no static facts). No compile, ~50 us."""
    return _estimate_cached(config, int(m), int(n), int(k), gpu, sm_count)


def estimate_us(config, m: int, n: int, k: int, gpu: str = "H200", sm_count: int | None = None):
    """``(low, high)`` modelled microseconds per call, or None."""
    e = estimate(config, m, n, k, gpu, sm_count)
    return e.total_us if e is not None else None


#: Default relative difference of modelled (mid) times below which :func:`rank` calls two configs a
#: tie (the model's own low-high range is +-15-20 %; callers may widen it, see heuristics/sm90.py).
MODEL_TIE = 0.01


def _issue_key(e: "Estimate") -> float:
    ipe = e.facts.instr_per_elem
    return ipe if ipe == ipe else float("inf")  # NaN (no per-element count): no preference


def rank(configs, m: int, n: int, k: int, gpu: str = "H200", sm_count: int | None = None,
         key=None, tie: float = MODEL_TIE) -> list[tuple[object, Estimate]]:
    """``configs`` the model can estimate, fastest first: by the middle of the range, except that
    configs within ``tie`` (relative) of the fastest remaining one are ties, led by the one that
    issues the fewest main-loop instructions per weight element (more issue headroom if the GPU is
    less ideal than modelled), then by the middle, the high end and the input order. Items without
    an estimate are dropped. ``key`` maps an item to its config (e.g. ``lambda c: c.config`` to
    rank the policy's ``Candidate`` objects); the items themselves are returned."""
    scored = []
    for i, c in enumerate(configs):
        e = estimate(key(c) if key else c, m, n, k, gpu, sm_count)
        if e is not None:
            scored.append((e.mid_us, e.total_us[1], i, c, e))
    scored.sort(key=lambda t: t[:3])
    out = []
    while scored:
        lim = scored[0][0] * (1.0 + tie)
        j = 1  # scored is sorted by mid: the ties are a prefix
        while j < len(scored) and scored[j][0] <= lim:
            j += 1
        best_i = min(range(j), key=lambda i: (_issue_key(scored[i][4]), *scored[i][:3])) if j > 1 else 0
        pick = scored.pop(best_i)
        out.append((pick[3], pick[4]))
    return out


def best(family_names, m: int, n: int, k: int, gpu: str = "H200", sm_count: int | None = None):
    """The model's fastest config over the search spaces of the named families (None if none)."""
    from .facts import registered_families

    cands = []
    for fam in registered_families():
        if fam.name in family_names and hasattr(fam, "search_space"):
            cands.extend(fam.search_space(m))
    ranked = rank(cands, m, n, k, gpu, sm_count)
    return ranked[0] if ranked else None


__all__ = ["MODEL_TIE", "Estimate", "Occupancy", "best", "estimate", "estimate_us", "estimate_with", "occupancy", "rank", "why_not"]
