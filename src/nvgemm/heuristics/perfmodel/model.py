"""The analytic time model: static kernel facts + geometry + hardware -> a modelled time range.

    kernel = fill + sum over rounds of [iterations x colimit(per-CTA step, chip byte step)
                                        + per-CTA overhead] + the last CTA's tail
    per call = kernel + launches + host-path helper kernels

Every output is a MODEL (a GPU measurement overrides it) and a ``(low, high)`` range: *low* takes
the optimistic end of every hardware range (achievable bandwidth, DRAM/L2 latency, launch cost,
helper-kernel cost, PDL saving), *high* the pessimistic end. The bf16 cuBLAS baseline
(:mod:`.baseline`) is modelled with the same bandwidth range, fill and launch cost, so a modelled
ratio carries one efficiency assumption on both sides.

Rounds (engine ``sass_chain``: the sm90 families)
    The grid's ``n`` CTAs are spread breadth-first over the ``P`` SMs, at most ``q`` resident
    per SM (:func:`occupancy`): ``n // P`` CTAs on every SM and one more on ``n % P`` of them,
    run in rounds of ``q`` (:func:`rounds`). Round ``j`` has ``k_j`` CTAs on the busiest SM and
    ``a_j`` CTAs on the whole chip; SMs without a CTA stream nothing (an idle SM earns nothing),
    and a partial last round runs at its own, lower, residency. A split tail (wgmma: the last
    ``tail_ctas`` CTAs each doing a share of a tile's K after the full waves) is a second grid
    with its own rounds. In one round every resident CTA runs the same iterations; one iteration
    of a CTA takes

        step = colimit(step_sm, step_chip)
        step_sm   = colimit(latency, w x issue cycles, k x bytes per step / per-SM fabric,
                            k x tensor-core cycles per step at the SM's rate)
        latency   = max(T1(L), L / depth)
        step_chip = a_j x DRAM bytes per CTA step / achievable bytes per cycle

    ``T1(L) = chain_base + round_trips x L`` is the single-warp time of one iteration replayed
    from the SASS control bits (:func:`.sass.loop_cycles`; re-read iterations -- weights still in
    L2 -- take the L2 latency, blended by ``l2_reread_fraction``); ``L / depth`` is Little's law:
    a CTA keeps ``depth`` iterations of loads in flight, so it cannot stream more than ``depth x
    bytes per step`` per latency ``L``. ``w`` = warps sharing a scheduler. The SM's streaming rate
    is ``k x bytes per step / step_sm`` -- set by the bytes it keeps in flight -- and the chip's
    rate is the sum over the SMs that hold CTAs, capped by the achievable bandwidth
    (``step_chip``). DRAM bytes per CTA step = the call's DRAM bytes / all CTA steps, so the
    rounds' byte steps add up to the byte floor.
fill
    each round starts with one loaded DRAM latency ``L`` -- the prologue issues its ring stages at
    once and nothing is consumed before the first data arrive -- plus the first stage of each of the
    ``k`` resident CTAs through the SM's port (``k x bytes per step / fabric``); the prologue's
    other stages are part of the steady-state steps. A later round's CTAs start while the SM's
    other resident CTAs still stream (they are staggered by then), so a later round pays
    ``fill / q`` (``q = 1``: all of it).
tail
    every round's CTAs finish with their per-pass and fixed instructions (``w x``) and the
    exposed epilogue; CTAs that reduce split-K partials in-kernel pay the serial L2 round trips
    of the reduction (partial stores + fence, counter atomic, partial loads). The last round's
    is the last CTA's tail, on the critical path of the call.
colimit (:func:`colimit`)
    two limits within a factor :data:`COLIMIT_MARGIN` of each other do not hide each other fully
    (a resource near full utilisation queues the other's requests). ``colimit`` is the largest
    term times ``1 + sum of (h(r) - h(m))`` over the other terms with ratio ``r = term / largest
    > m``, ``h(r) = (1 + r^p)^(1/p)``, ``p`` = :data:`COLIMIT_P`: equal terms cost 17 % more than
    either alone, a term at 80 % of the largest 5 %, below 50 % nothing. An assumption (a smooth
    maximum; no Hopper measurement fits ``p``), applied alike to nvgemm and the baseline.

Pipeline engine (``pipeline``: the persistent, warp-specialised sm100 kernel)
    ``grid`` CTAs = the persistent bound the launcher uses
    (:func:`nvgemm.templates.sm100_w4a4.occupancy.aot_max_active_clusters` x cluster size) each take
    ``units_per_cta`` work units of ``stages`` K tiles; rounds of units: all ``grid`` CTAs in
    the full rounds, ``units mod grid`` in the last; a stage takes ``colimit(L / stages, stage
    bytes / fabric, MMA cycles, chip byte step)``. Fill once (one DRAM latency + one stage through
    the port; the ring stays full across units),
    then the exposed epilogue and the split-K round trips as the tail.

Floors (reported, not added): byte floor = DRAM bytes / achievable bandwidth; issue floor = all
warp-instructions over all schedulers; tensor floor = tensor-core FLOPs (incl. padding) / rate.
Bytes in flight per SM: *peak* = resident CTAs x depth x stream bytes of one iteration;
*time-averaged* = (weight bytes per active SM / kernel time) x L; *needed* = achievable bandwidth /
SMs x L (Little's law).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from nvgemm.heuristics.perfmodel.facts import FamilyFacts, Geometry, KernelFacts, ceil_div, family_for
from nvgemm.heuristics.perfmodel.hardware import Hardware, get_hardware
from nvgemm.heuristics.perfmodel.table import lookup

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
    rounds: int = 1  # rounds of CTAs on the busiest SM (all grids of the call)
    active_sms: int = 0  # SMs that hold at least one CTA
    fill_us: tuple[float, float] = (0.0, 0.0)  # first round's fill (loaded DRAM latency + first stage)
    tail_us: tuple[float, float] = (0.0, 0.0)  # the last CTA's epilogue / split-K reduction
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
            "iters_per_cta": self.geometry.iters_per_cta, "rounds": self.rounds, "active_sms": self.active_sms,
            "fill_us": self.fill_us, "tail_us": self.tail_us,
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
    """Resident CTAs per SM from registers (per scheduler quadrant), shared memory, threads
    (shape-independent: memoised per (facts, threads, forced residency, hardware))."""
    key = (id(facts), id(hw), geo.threads, geo.resident_ctas)
    hit = _OCC.get(key)
    if hit is None or hit[0] is not facts or hit[1] is not hw:
        # keyed by identity (hashing two large frozen records costs more than the occupancy);
        # the entry keeps both alive, so an id cannot be reused while it is cached
        hit = _OCC[key] = (facts, hw, _occupancy(facts, geo.threads, geo.resident_ctas, hw))
    return hit[2]


_OCC: dict = {}


def _occupancy(facts: KernelFacts, threads: int, resident: int | None, hw: Hardware) -> Occupancy:
    warps = ceil_div(threads, 32)
    if resident is not None:
        return Occupancy(resident, resident * warps, "persistent (1 CTA/SM)")
    limits = {"CTA slots": hw.max_ctas_per_sm, "threads": hw.max_threads_per_sm // threads}
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


#: two limits within this ratio of each other are combined by :func:`colimit`, not max()-ed
COLIMIT_MARGIN = 0.5
#: exponent of the smooth maximum in :func:`colimit` (equal terms: 2^(1/4) = +19 %, less h(margin))
COLIMIT_P = 4.0


def _h(r: float) -> float:
    return (1.0 + r ** COLIMIT_P) ** (1.0 / COLIMIT_P)


_H_MARGIN = _h(COLIMIT_MARGIN)


def colimit(*terms: float) -> float:
    """The time of co-limited work (see the module docstring): the largest term, plus a share of
    every other term within :data:`COLIMIT_MARGIN` of it. ``colimit(a) == a``; terms below
    ``margin x largest`` add nothing (the plain maximum)."""
    hi = max(terms)
    if hi <= 0.0:
        return 0.0
    lim = COLIMIT_MARGIN * hi
    g, skipped = 1.0, False
    for t in terms:
        if t > lim:
            if t == hi and not skipped:
                skipped = True
                continue
            g += _h(t / hi) - _H_MARGIN
    return hi * g


def _colimit2(a: float, b: float) -> float:
    """``colimit(a, b)`` without the varargs (the hot path of the ranking)."""
    if a < b:
        a, b = b, a
    if b <= COLIMIT_MARGIN * a:
        return a
    return a * (1.0 + _h(b / a) - _H_MARGIN)


def rounds(n: int, sms: int, q: int) -> list[tuple[int, int, int]]:
    """Rounds of an ``n``-CTA grid on ``sms`` SMs with ``q`` resident CTAs per SM, breadth-first
    (``n // sms`` CTAs on every SM, one more on ``n % sms`` of them): ``(count, k, a)`` = that
    many identical rounds with ``k`` CTAs on the busiest SM and ``a`` on the chip. At most two
    entries: the full rounds, then the partial one."""
    if n <= 0:
        return []
    base, extra = divmod(n, sms)
    full = base // q  # rounds in which every SM holds q CTAs
    out = [(full, q, q * sms)] if full else []
    lo = base - full * q  # CTAs left per SM (0..q-1), one more on the `extra` SMs
    hi = lo + (1 if extra else 0)
    if hi:
        out.append((1, hi, extra * hi + (sms - extra) * lo))
    return out


def _sass_chain(facts: KernelFacts, geo: Geometry, hw: Hardware, occ: Occupancy, ends, detail: bool = True) -> list:
    """Kernel cycles of a sass_chain family at each ``(DRAM latency, L2 latency, achievable bytes
    per cycle)`` of ``ends`` (see the module docstring). ``detail``: per end a dict with the
    busiest SM's timeline, fill, tail, rounds and the limiter, else the cycles alone (the
    ranking's fast path)."""
    warps = -(-geo.threads // 32)
    sched = hw.schedulers_per_sm
    fabric = hw.sm_fabric_bytes_per_clk
    bytes_iter = geo.stream_bytes_per_iter + geo.other_bytes_per_iter
    issue_iter = facts.loop_issue_cycles or facts.loop_instrs
    f = geo.l2_reread_fraction  # re-read iterations wait for L2, not DRAM
    depth = max(geo.depth, 1.0)
    splitk = geo.splitk
    trips = splitk.dependent_l2_trips if splitk is not None and splitk.kind != "kernel" else 0.0
    full_ctas = geo.ctas - geo.tail_ctas
    steps = full_ctas * geo.iters_per_cta + geo.tail_ctas * geo.tail_iters
    tensor_step = 0.0
    if geo.tensor_tflops and steps:
        tensor_step = geo.tensor_flops / steps / (geo.tensor_tflops * 1e12 / hw.sm_count / hw.clock_hz)
    per_cta = geo.passes_per_cta * facts.pass_instrs + facts.fixed_instrs
    q = occ.ctas_per_sm
    grids = ((geo.ctas, geo.iters_per_cta, True),) if not geo.tail_ctas else (
        (full_ctas, geo.iters_per_cta, False), (geo.tail_ctas, geo.tail_iters, True))
    plan = []  # per round group: (count, iters, reduce, w, issue, fabric, tensor, a, first stage / fabric)
    for n, iters, reduce in grids:
        for count, k, a in rounds(n, hw.sm_count, q):
            w = -(-k * warps // sched)
            plan.append((count, iters, reduce, w, w * issue_iter, k * bytes_iter / fabric, k * tensor_step, a,
                         k * bytes_iter / fabric))
    out = []
    for lat, l2, bw_clk in ends:
        eff_lat = f * l2 + (1.0 - f) * lat
        latency = max(facts.chain_base + facts.round_trips * eff_lat, eff_lat / depth)  # Little: depth steps per L
        dram_step = geo.dram_bytes / steps / bw_clk if steps else 0.0  # chip cycles per CTA step
        reduce_tail = trips * l2 + geo.epilogue_cycles
        cycles = sm_cycles = fill0 = tail = 0.0
        limiter = ""
        first = True
        for count, iters, reduce, w, issue, fab, ten, a, prologue in plan:
            hi = max(latency, issue, fab, ten)
            lim = COLIMIT_MARGIN * hi
            if (issue > lim) + (fab > lim) + (ten > lim) + (latency > lim) > 1:
                step_sm = colimit(latency, issue, fab, ten)
            else:
                step_sm = hi  # one term above the margin: the plain maximum
            step_chip = a * dram_step
            step = _colimit2(step_sm, step_chip)
            fill = lat + prologue
            tail = w * per_cta + (reduce_tail if reduce else geo.epilogue_cycles)
            rnd_fill = fill + (count - 1) * fill / q if first else count * fill / q
            cycles += rnd_fill + count * (iters * step + tail)
            if detail:
                sm_cycles += rnd_fill + count * (iters * step_sm + tail)
                if first:
                    fill0 = fill
                    terms = {"latency": latency, "issue": issue, "fabric": fab, "tensor": ten}
                    limiter = "bytes" if step_chip >= step_sm else max(terms, key=terms.get)
            first = False
        out.append(cycles if not detail else {
            "cycles": cycles, "sm_cycles": sm_cycles, "fill": fill0, "tail": tail,
            "rounds": sum(g[0] for g in plan), "limiter": limiter, "active_sms": min(hw.sm_count, geo.ctas)})
    return out


def _pipeline(facts: KernelFacts, geo: Geometry, hw: Hardware, ends, detail: bool = True) -> list:
    """Kernel cycles of the persistent pipeline engine at each end of ``ends`` (see
    :func:`_sass_chain` and the module docstring)."""
    return [_pipeline_at(facts, geo, hw, lat, l2, bw, detail) for lat, l2, bw in ends]


def _pipeline_at(facts: KernelFacts, geo: Geometry, hw: Hardware, lat: float, l2: float,
                 bw_bytes_per_clk: float, detail: bool):
    bytes_stage = geo.stream_bytes_per_iter + geo.other_bytes_per_iter
    units = max(geo.units_per_cta, 1)
    k_per_unit = geo.iters_per_cta / units
    total_units = geo.total_units or geo.ctas * units
    mma_cycles = 0.0
    steps = total_units * k_per_unit
    if geo.tensor_tflops and steps:
        per_sm_flops_per_clk = geo.tensor_tflops * 1e12 / hw.sm_count / hw.clock_hz
        mma_cycles = geo.tensor_flops / steps / per_sm_flops_per_clk
    dram_step = geo.dram_bytes / steps if steps else 0.0
    terms = {"latency": lat / max(geo.depth, 1.0), "fabric": bytes_stage / hw.sm_fabric_bytes_per_clk,
             "tensor": mma_cycles}
    step_sm = colimit(*terms.values())
    cycles = sm_cycles = 0.0
    limiter = ""
    full, last = divmod(total_units, geo.ctas)
    for count, active in ((full, geo.ctas), (1 if last else 0, last)):
        if not count:
            continue
        step_chip = active * dram_step / bw_bytes_per_clk
        cycles += count * k_per_unit * colimit(step_sm, step_chip)
        sm_cycles += count * k_per_unit * step_sm
        if not limiter:
            limiter = "bytes" if step_chip >= step_sm else max(terms, key=terms.get)
    trips = geo.splitk.dependent_l2_trips if geo.splitk else 0.0
    fill = lat + bytes_stage / hw.sm_fabric_bytes_per_clk
    tail = geo.epilogue_cycles + trips * l2
    if not detail:
        return fill + cycles + tail
    return {"cycles": fill + cycles + tail, "sm_cycles": fill + sm_cycles + tail, "fill": fill, "tail": tail,
            "rounds": full + (1 if last else 0), "limiter": limiter, "active_sms": min(hw.sm_count, geo.ctas)}


def _geometry(config, m: int, n: int, k: int, hw: Hardware, facts: KernelFacts, fam: FamilyFacts) -> Geometry:
    if fam.engine == "pipeline" and hasattr(fam, "geometry"):
        kind = "rolled" if facts.extra.get("rolled_reduce", False) else "batched"
        try:
            return fam.geometry(config, m, n, k, hw, reduce_kind=kind)
        except TypeError:
            return fam.geometry(config, m, n, k, hw)
    return fam.geometry(config, m, n, k, hw)


def _call_terms(geo: Geometry, hw: Hardware):
    """(launch, split-K reduce kernel, helper kernels) of one call, each (low, high) us."""
    launches = 1 + geo.extra_launches
    pdl = hw.pdl_saving_us if geo.pdl else (0.0, 0.0)
    launch = (launches * hw.launch_us[0] - pdl[1], launches * hw.launch_us[1] - pdl[0])
    sk = (0.0, 0.0)
    if geo.splitk is not None and geo.splitk.kind == "kernel":
        sk = tuple(geo.splitk.workspace_bytes / bw * US + 2 * l2 / hw.clock_hz * US
                   for l2, bw in zip(hw.l2_latency, hw.achievable_bw_range[::-1]))
    aux = (geo.aux_kernels * hw.aux_kernel_us[0], geo.aux_kernels * hw.aux_kernel_us[1])
    return launch, sk, aux


def _ends(hw: Hardware):
    """(DRAM latency, L2 latency, achievable bytes per cycle) at the low and the high end
    (memoised by identity, as :func:`occupancy`)."""
    hit = _ENDS.get(id(hw))
    if hit is None or hit[0] is not hw:
        ends = tuple(zip(hw.dram_latency, hw.l2_latency, [bw / hw.clock_hz for bw in hw.achievable_bw_range[::-1]]))
        hit = _ENDS[id(hw)] = (hw, ends)
    return hit[1]


_ENDS: dict = {}


def total_us_with(config, m: int, n: int, k: int, hw: Hardware, facts: KernelFacts, fam: FamilyFacts):
    """``(low, high)`` modelled call time -- :func:`estimate_with`'s ``total_us`` without the
    report fields (the same equations; the scalar reference of the ranking's batch path,
    :func:`nvgemm.heuristics.perfmodel.batch.totals`)."""
    cyc, launch, sk, aux = _call_parts(config, m, n, k, hw, facts, fam)
    us = US / hw.clock_hz
    return (cyc[0] * us + launch[0] + sk[0] + aux[0], cyc[1] * us + launch[1] + sk[1] + aux[1])


def _call_parts(config, m: int, n: int, k: int, hw: Hardware, facts: KernelFacts, fam: FamilyFacts):
    """(kernel cycles per end, launch, split-K kernel, helper kernels) of one call, without the
    report fields: what :func:`total_us_with` and ``batch.gemm_us_with`` add up (each in its order)."""
    geo = _geometry(config, m, n, k, hw, facts, fam)
    occ = occupancy(facts, geo, hw)
    if occ.ctas_per_sm == 0:
        raise ValueError(f"{config.name()}: does not fit on an SM ({occ.limiter})")
    launch, sk, aux = _call_terms(geo, hw)
    if fam.engine == "pipeline":
        return _pipeline(facts, geo, hw, _ends(hw), detail=False), launch, sk, aux
    return _sass_chain(facts, geo, hw, occ, _ends(hw), detail=False), launch, sk, aux


def estimate_with(config, m: int, n: int, k: int, hw: Hardware, facts: KernelFacts, fam: FamilyFacts) -> Estimate:
    """The model for explicit static facts (what :func:`estimate` does after the table lookup)."""
    geo = _geometry(config, m, n, k, hw, facts, fam)
    occ = occupancy(facts, geo, hw)
    notes: list[str] = []
    if facts.source.startswith(("table (", "estimate", "variant")):
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

    chains, kernels, limiters, fills, tails = [], [], [], [], []
    if fam.engine == "pipeline":
        per_end = _pipeline(facts, geo, hw, _ends(hw))
    else:
        per_end = _sass_chain(facts, geo, hw, occ, _ends(hw))
    for r in per_end:
        chains.append(r["sm_cycles"] / clk * US)
        kernels.append(r["cycles"] / clk * US)
        limiters.append(r["limiter"])
        fills.append(r["fill"] / clk * US)
        tails.append(r["tail"] / clk * US)

    launch, sk, aux = _call_terms(geo, hw)
    total = tuple(kernels[i] + launch[i] + sk[i] + aux[i] for i in range(2))

    active_sms = r["active_sms"]
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
        rounds=r["rounds"], active_sms=active_sms, fill_us=(fills[0], fills[1]), tail_us=(tails[0], tails[1]),
        notes=tuple(notes), _peak=hw.peak_bw_tbs,
    )


def why_not(config, m: int, n: int, k: int) -> str | None:
    """Why the model has no estimate for ``config`` on (M, N, K) (None: it has one)."""
    fam = family_for(config)
    if fam is None:
        return f"no performance-model family owns {type(config).__name__}"
    return fam.shape_problem(config, m, n, k)


@functools.lru_cache(maxsize=4096)
def _prepared(config, gpu: str, sm_count: int | None, activation: str | None = None):
    """(family, hardware, static facts) of ``config`` on ``gpu`` -- shape-independent, memoised
    (None: no family or no facts). ``activation``: the facts of the variant compiled for it where
    the table records them (:func:`.table.lookup`; None: the main loop's shared entry)."""
    fam = family_for(config)
    if fam is None:
        return None
    hw = get_hardware(gpu, sm_count)
    # the family's table entries (sm_90a's for the W4A16 kernels); the variant's main-loop timing facts from the
    # GPU's own arch where its compile sweep recorded them (the mma kernel on sm_120a / sm_89 / ...)
    facts = lookup(config, hw.arch if hw.arch == fam.arch else fam.arch, activation=activation, own_arch=hw.arch)
    return None if facts is None else (fam, hw, facts)


def _model(fn, config, m: int, n: int, k: int, gpu: str, sm_count: int | None, activation: str | None = None):
    prep = _prepared(config, gpu, sm_count, activation)
    if prep is None or prep[0].shape_problem(config, m, n, k):
        return None
    fam, hw, facts = prep
    try:
        return fn(config, m, n, k, hw, facts, fam)
    except ValueError:
        return None


@functools.lru_cache(maxsize=65536)
def _estimate_cached(config, m: int, n: int, k: int, gpu: str, sm_count: int | None,
                     activation: str | None = None) -> Estimate | None:
    return _model(estimate_with, config, m, n, k, gpu, sm_count, activation)


@functools.lru_cache(maxsize=65536)
def _total_cached(config, m: int, n: int, k: int, gpu: str, sm_count: int | None, activation: str | None = None):
    return _model(total_us_with, config, m, n, k, gpu, sm_count, activation)


def estimate(config, m: int, n: int, k: int, gpu: str = "H200", sm_count: int | None = None,
             activation: str | None = None) -> Estimate | None:
    """Modelled call of ``config`` on (M, N, K) on ``gpu`` -- None when the model cannot say
    (no family, the shape does not fit the config, no static facts). No compile, ~0.1 ms.
    ``activation`` (``"none"`` / ``"silu_mul"``): price the variant compiled for it, with its own
    SASS facts where the table records them (else, and with None, the main loop's shared entry:
    e.g. the grouped MoE kernel, priced with its dense twin's main loop)."""
    return _estimate_cached(config, int(m), int(n), int(k), gpu, sm_count, activation)


def estimate_l2_fed(config, m: int, n: int, k: int, gpu: str = "H200", sm_count: int | None = None,
                    activation: str | None = None, l2_bw_over_dram: tuple[float, float] = (1.0, 1.0)) -> Estimate | None:
    """:func:`estimate` of a call whose weights are already in L2 when its loads issue (a MODEL): the same
    equations on the hardware with the L2 latency in place of the DRAM latency (the first round's fill and
    Little's law) and the chip's byte rate scaled by ``l2_bw_over_dram`` (optimistic, pessimistic ends);
    the per-SM fabric limit and everything else stay. What a kernel whose weights an earlier kernel
    prefetched into L2 costs once its own loads start (:mod:`nvgemm.templates.sm100_moe.perf`)."""
    prep = _prepared(config, gpu, sm_count, activation)
    if prep is None or prep[0].shape_problem(config, m, n, k):
        return None
    fam, hw, facts = prep
    return estimate_with(config, int(m), int(n), int(k), _l2_fed_hardware(hw, tuple(l2_bw_over_dram)), facts, fam)


@functools.lru_cache(maxsize=64)
def _l2_fed_hardware(hw: Hardware, l2_bw_over_dram: tuple[float, float]) -> Hardware:
    lo_bw = hw.achievable_bw_low_tbs or hw.achievable_bw_tbs
    return Hardware(**{**hw.__dict__, "name": f"{hw.name} (weights in L2)", "dram_latency": hw.l2_latency,
                       "achievable_bw_tbs": hw.achievable_bw_tbs * l2_bw_over_dram[0],
                       "achievable_bw_low_tbs": lo_bw * l2_bw_over_dram[1]})


def estimate_us(config, m: int, n: int, k: int, gpu: str = "H200", sm_count: int | None = None,
                activation: str | None = None):
    """``(low, high)`` modelled microseconds per call, or None (the fast path: the same equations
    as :func:`estimate`, without its report fields; ``activation`` as there)."""
    return _total_cached(config, int(m), int(n), int(k), gpu, sm_count, activation)


#: Default relative difference of modelled (mid) times below which :func:`rank` calls two configs a
#: tie (the model's own low-high range is +-15-20 %; callers may widen it, see templates/sm90_w4a16/policy.py).
MODEL_TIE = 0.01


@functools.lru_cache(maxsize=4096)
def _issue_key(config, gpu: str, sm_count: int | None, activation: str | None = None) -> float:
    ipe = _prepared(config, gpu, sm_count, activation)[2].instr_per_elem
    return ipe if ipe == ipe else float("inf")  # NaN (no per-element count): no preference


def rank(configs, m: int, n: int, k: int, gpu: str = "H200", sm_count: int | None = None,
         key=None, tie: float = MODEL_TIE, limit: int | None = None, report: bool = True,
         activation: str | None = None) -> list[tuple[object, Estimate]]:
    """``configs`` the model can estimate, fastest first: by the middle of the range, except that
    configs within ``tie`` (relative) of the fastest remaining one are ties, led by the one that
    issues the fewest main-loop instructions per weight element (more issue headroom if the GPU is
    less ideal than modelled), then by the middle, the high end and the input order. Items without
    an estimate are dropped. ``key`` maps an item to its config (e.g. ``lambda c: c.config`` to
    rank the policy's ``Candidate`` objects); the items themselves are returned. ``limit``: only
    the first ``limit`` (all are priced together by :func:`nvgemm.heuristics.perfmodel.batch.totals` --
    :func:`total_us_with`'s numbers -- and the others' full :class:`Estimate` is never built).
    ``report=False``: pairs ``(item, (low, high) us)`` instead of full estimates (the policy's
    path: no report at all). ``activation``: price the variants compiled for it (:func:`estimate`)."""
    # lazy: breaks the cycle heuristics.perfmodel.model <-> heuristics.perfmodel.batch
    from nvgemm.heuristics.perfmodel.batch import totals  # the vectorised fast path (it imports this module)

    m, n, k = int(m), int(n), int(k)
    configs = list(configs)
    cfgs = [key(c) for c in configs] if key else configs
    scored = []
    for i, (c, cfg, t) in enumerate(zip(configs, cfgs, totals(cfgs, m, n, k, gpu, sm_count, activation))):
        if t is not None:
            scored.append((0.5 * (t[0] + t[1]), t[1], i, c, cfg, t, _issue_key(cfg, gpu, sm_count, activation)))
    scored.sort(key=lambda t: t[:3])
    out = []
    cap = len(scored) if limit is None else limit
    while scored and len(out) < cap:
        lim = scored[0][0] * (1.0 + tie)
        j = 1  # scored is sorted by mid: the ties are a prefix
        while j < len(scored) and scored[j][0] <= lim:
            j += 1
        best_i = min(range(j), key=lambda i: (scored[i][6], *scored[i][:3])) if j > 1 else 0
        pick = scored.pop(best_i)
        out.append((pick[3], _estimate_cached(pick[4], m, n, k, gpu, sm_count, activation) if report else pick[5]))
    return out


def best(family_names, m: int, n: int, k: int, gpu: str = "H200", sm_count: int | None = None,
         activation: str | None = None):
    """The model's fastest config over the search spaces of the named families (None if none);
    ``activation`` as in :func:`estimate`."""
    # lazy: breaks the cycle heuristics.perfmodel.model <-> heuristics.perfmodel.facts (through a package __init__)
    from nvgemm.heuristics.perfmodel.facts import registered_families

    cands = []
    for fam in registered_families():
        if fam.name in family_names and hasattr(fam, "search_space"):
            cands.extend(fam.search_space(m))
    ranked = rank(cands, m, n, k, gpu, sm_count, activation=activation)
    return ranked[0] if ranked else None


__all__ = ["COLIMIT_MARGIN", "COLIMIT_P", "MODEL_TIE", "Estimate", "Occupancy", "best", "colimit", "rounds", "estimate", "estimate_l2_fed", "estimate_us", "estimate_with", "occupancy", "rank", "total_us_with", "why_not"]
