"""The ranking's fast path: :func:`totals` prices many configs of one shape at once.

The sm90 candidate policy (:mod:`nvgemm.templates.sm90_w4a16.policy`) prices 13-139 configs per new shape;
the scalar :func:`~nvgemm.heuristics.perfmodel.model.total_us_with` costs ~11 us of Python per config. Here
the ``sass_chain`` engine runs once over numpy arrays -- (end of the hardware ranges, round
group, config) -- for families whose facts hook has ``geometry_batch`` / ``batch_row`` (the same
geometry as ``geometry``, on arrays: ``families/sm90.py``). What does not depend on the shape
(static facts, occupancy, the family's per-config integers) is memoised per config in a
registry the arrays are gathered from. Groups of fewer than :data:`SCALAR_MAX` configs (most
calls: 13-80 configs) take a lean scalar loop instead (:func:`_chain_rows` over the family's
``geometry_rows`` tuples): numpy's per-call overhead exceeds the loop's there. Configs of other
families or engines take the scalar model.

The same numbers, not close ones: every array operation is the scalar code's IEEE operation on
the same operands in the same order (``max``, ``+``, ``*``, ``/``, floor division), round groups
and co-limit terms the scalar loop skips enter as exact zeros, and the co-limit's
``(1 + r^4)^(1/4)`` uses ``np.float_power`` (the C library's ``pow``, as Python's ``**``;
``np.power`` may take a SIMD path that differs in the last bit). ``tests/cpu/test_policy_speed.py``
checks :func:`totals` -- both paths, each forced for every group -- against the scalar model bit
for bit and the policy's picks against a ranking rebuilt from the scalar model.
"""

from __future__ import annotations

import functools

import numpy as np

from nvgemm.heuristics.perfmodel.model import (
    COLIMIT_MARGIN,
    COLIMIT_P,
    US,
    _H_MARGIN,
    _call_parts,
    _colimit2,
    _ends,
    _model,
    _occupancy,
    _prepared,
    _total_cached,
    colimit,
    rounds,
)


def totals(configs, m: int, n: int, k: int, gpu: str = "H200", sm_count: int | None = None,
           activation: str | None = None) -> list:
    """``(low, high)`` modelled us of every config on (M, N, K), or None where the model cannot
    price it -- :func:`~nvgemm.heuristics.perfmodel.model.estimate_us` of each (``activation`` as there),
    computed together."""
    return _totals(configs, m, n, k, gpu, sm_count, activation, False)


def gemm_totals(requests, gpu: str = "H200", sm_count: int | None = None) -> list:
    """Per request ``(configs, m, n, k)``: ``estimate(config, m, n, k, gpu, sm_count).gemm_us`` of
    every config (None where there is no estimate), bit-equal to it: the full report's rounding
    (kernel cycles ``/ clock x 1e6``, then ``+ launch + split-K kernel + helper kernels - helper
    kernels``), not :func:`totals`'. All requests are priced together: one numpy pass over every
    config of every shape (a grouped MoE policy call prices ~12 dense shapes of ~60 configs each:
    ``families/sm90_moe.py``)."""
    return _totals_many(requests, gpu, sm_count, None, True)


def gemm_us_with(config, m: int, n: int, k: int, hw, facts, fam) -> tuple[float, float]:
    """:func:`~nvgemm.heuristics.perfmodel.model.estimate_with`'s ``gemm_us`` without the report fields (the
    same operations in the same order; any engine)."""
    cyc, launch, sk, aux = _call_parts(config, m, n, k, hw, facts, fam)
    clk = hw.clock_hz
    return tuple((cyc[i] / clk * US + launch[i] + sk[i] + aux[i]) - aux[i] for i in range(2))


def _totals(configs, m: int, n: int, k: int, gpu: str, sm_count: int | None, activation: str | None,
            gemm: bool) -> list:
    return _totals_many([(configs, m, n, k)], gpu, sm_count, activation, gemm)[0]


def _totals_many(requests, gpu: str, sm_count: int | None, activation: str | None, gemm: bool) -> list:
    outs: list = []
    groups: dict = {}  # geometry_batch function -> (static, {request: ([index in configs], [registry row])})
    statics: list = [None, None]  # the last request's config list and its _static rows
    for j, (configs, m, n, k) in enumerate(requests):
        m, n, k = int(m), int(n), int(k)
        out: list = [None] * len(configs)
        outs.append(out)
        if statics[0] is not configs:  # requests often share one config list (the MoE models' lo / hi tiles)
            statics[:] = [configs, [_static(c, gpu, sm_count, activation) for c in configs]]
        mine: dict = {}  # this request's entries of groups
        for i, (c, st) in enumerate(zip(configs, statics[1])):
            if st is None:
                # other engines, or no facts: the scalar model
                out[i] = _model(gemm_us_with, c, m, n, k, gpu, sm_count) if gemm else \
                    _total_cached(c, m, n, k, gpu, sm_count, activation)
            elif st[3] and not st[0].shape_problem(c, m, n, k):  # q == 0: does not fit on an SM (None)
                entry = mine.get(st[2])
                if entry is None:
                    entry = mine[st[2]] = groups.setdefault(st[2], (st, {}))[1].setdefault(j, ([], []))
                entry[0].append(i)
                entry[1].append(st[4])
    for (fam, hw, _, _, _), per in groups.values():
        if sum(len(w) for w, _ in per.values()) < SCALAR_MAX:  # numpy's fixed cost exceeds the scalar loop's
            for j, (where, rows) in per.items():
                _, m, n, k = requests[j]
                geos = fam.geometry_rows([_REG_INTS[r][_FACT_INTS:] for r in rows], int(m), int(n), int(k), hw)
                for i, t in zip(where, _chain_rows(geos, [_REG_INTS[r] for r in rows],
                                                   [_REG_FLOATS[r] for r in rows], hw, gemm)):
                    outs[j][i] = t
            continue
        ints, floats = _registry_arrays()
        idx = np.array([r for _, rows in per.values() for r in rows])
        r, fl = ints[idx], floats[idx]
        if len(per) == 1:
            _, m, n, k = requests[next(iter(per))]
            m, n, k = int(m), int(n), int(k)
        else:  # several shapes: one (M, N, K) per config, one geometry and one chain pass for all
            m, n, k = (np.repeat(np.array([int(requests[j][x]) for j in per], dtype=np.int64),
                                 [len(w) for w, _ in per.values()]) for x in (1, 2, 3))
        col = fam.geometry_batch(r[:, _FACT_INTS:], m, n, k, hw)
        col["issue_iter"], col["pass_instrs"], col["fixed_instrs"], col["q"] = r[:, :_FACT_INTS].T
        col["chain_base"], col["round_trips"] = fl.T
        lo, hi = _chain_totals(col, hw, gemm)
        lo, hi = lo.tolist(), hi.tolist()
        at = 0
        for j, (where, _) in per.items():
            for x, i in enumerate(where):
                outs[j][i] = (lo[at + x], hi[at + x])
            at += len(where)
    return outs


#: groups of fewer configs take the scalar loop (:func:`_chain_rows`, the same numbers): numpy's
#: ~0.25 ms of calls per group against ~8 us per config on the 2-core machine (measured: the loop
#: is faster up to ~80-100 configs)
SCALAR_MAX = 80
_FACT_INTS = 4  # registry columns before the family's batch_row: issue cycles, pass, fixed, q
_REG_INTS: list = []
_REG_FLOATS: list = []
_REG_ARRAYS: list = [None, None, 0]  # the registry as arrays (rebuilt when it grew)


def _registry_arrays():
    if _REG_ARRAYS[2] != len(_REG_INTS):
        width = max(len(r) for r in _REG_INTS)  # families' rows may differ in length: pad
        _REG_ARRAYS[:] = [np.array([r + (0,) * (width - len(r)) for r in _REG_INTS], dtype=np.int64),
                          np.array(_REG_FLOATS, dtype=float), len(_REG_INTS)]
    return _REG_ARRAYS[0], _REG_ARRAYS[1]


@functools.lru_cache(maxsize=8192)
def _static(config, gpu: str, sm_count: int | None, activation: str | None = None):
    """What the batch path needs of a config that does not depend on the shape: (family,
    hardware, the family's ``geometry_batch`` function, resident CTAs per SM, its row in the
    registry of static integers -- issue cycles per iteration, per-pass and fixed instructions,
    resident CTAs, then the family's ``batch_row(config)`` -- and floats -- chain base, round
    trips); None for a config the batch path does not price (no facts, another engine, a family
    without ``geometry_batch``). Batch families run ``config.threads`` threads per CTA with no
    forced residency."""
    prep = _prepared(config, gpu, sm_count, activation)
    if prep is None:
        return None
    fam, hw, facts = prep
    if fam.engine != "sass_chain" or not hasattr(fam, "geometry_batch"):
        return None
    q = _occupancy(facts, config.threads, None, hw).ctas_per_sm
    _REG_INTS.append((facts.loop_issue_cycles or facts.loop_instrs, facts.pass_instrs, facts.fixed_instrs, q)
                     + tuple(fam.batch_row(config)))
    _REG_FLOATS.append((float(facts.chain_base), float(facts.round_trips)))
    return fam, hw, type(fam).geometry_batch, q, len(_REG_INTS) - 1


def _chain_rows(geos, ints, floats, hw, gemm: bool = False) -> list:
    """``_sass_chain(..., detail=False)`` plus ``_call_terms`` per config, as a scalar loop over
    :meth:`geometry_rows` tuples and the registry's static rows: the scalar model's operations in
    its order, without its ``Geometry`` / ``Occupancy`` objects and helper calls. ``gemm``: the
    report's ``gemm_us`` (:func:`gemm_totals`) instead of ``total_us_with``'s total."""
    sms, sched, fabric = hw.sm_count, hw.schedulers_per_sm, hw.sm_fabric_bytes_per_clk
    ends = _ends(hw)
    clock = hw.clock_hz
    us = US / clock
    margin = COLIMIT_MARGIN
    out = []
    for (ctas, threads, iters_cta, stream, other, dram, depth, trips, f, tflops, ttf, tail_ctas, tail_iters, pdl), \
            (issue_iter, pass_i, fixed_i, q, *_), (chain_base, round_trips) in zip(geos, ints, floats):
        warps = -(-threads // 32)
        bytes_iter = stream + other
        depth = max(depth, 1.0)
        full_ctas = ctas - tail_ctas
        steps = full_ctas * iters_cta + tail_ctas * tail_iters
        tensor_step = tflops / steps / (ttf * 1e12 / sms / clock) if ttf and steps else 0.0
        per_cta = 1 * pass_i + fixed_i  # passes_per_cta = 1 (batch families)
        plan = []
        for gn, iters, reduce in (((ctas, iters_cta, True),) if not tail_ctas else
                                  ((full_ctas, iters_cta, False), (tail_ctas, tail_iters, True))):
            for count, kk, a in rounds(gn, sms, q):
                w = -(-kk * warps // sched)
                plan.append((count, iters, reduce, w, w * issue_iter, kk * bytes_iter / fabric, kk * tensor_step, a))
        res = []
        for lat, l2, bw_clk in ends:
            eff_lat = f * l2 + (1.0 - f) * lat
            latency = max(chain_base + round_trips * eff_lat, eff_lat / depth)
            dram_step = dram / steps / bw_clk if steps else 0.0
            reduce_tail = trips * l2 + 0.0  # + epilogue cycles (0 for batch families)
            cycles, first = 0.0, True
            for count, iters, reduce, w, issue, fab, ten, a in plan:
                hi = max(latency, issue, fab, ten)
                lim = margin * hi
                if (issue > lim) + (fab > lim) + (ten > lim) + (latency > lim) > 1:
                    step_sm = colimit(latency, issue, fab, ten)
                else:
                    step_sm = hi
                step = _colimit2(step_sm, a * dram_step)
                fill = lat + fab
                tl = w * per_cta + (reduce_tail if reduce else 0.0)
                cycles += (fill + (count - 1) * fill / q if first else count * fill / q) + count * (iters * step + tl)
                first = False
            res.append(cycles)
        if gemm:  # estimate_with: kernel cycles / clock x 1e6, + launch + split-K + aux, - aux
            a0, a1 = 0 * hw.aux_kernel_us[0], 0 * hw.aux_kernel_us[1]
            out.append((res[0] / clock * US + (1 * hw.launch_us[0] - (hw.pdl_saving_us[1] if pdl else 0.0)) + 0.0
                        + a0 - a0,
                        res[1] / clock * US + (1 * hw.launch_us[1] - (hw.pdl_saving_us[0] if pdl else 0.0)) + 0.0
                        + a1 - a1))
            continue
        out.append((res[0] * us + (1 * hw.launch_us[0] - (hw.pdl_saving_us[1] if pdl else 0.0)) + 0.0
                    + 0 * hw.aux_kernel_us[0],
                    res[1] * us + (1 * hw.launch_us[1] - (hw.pdl_saving_us[0] if pdl else 0.0)) + 0.0
                    + 0 * hw.aux_kernel_us[1]))
    return out


def _h_where(num: np.ndarray, den: np.ndarray, mask: np.ndarray, one_plus: bool) -> np.ndarray:
    """Where ``mask``: ``_h(num / den) - _H_MARGIN`` (``colimit``: ``g += _h(t / hi) -
    _H_MARGIN``), or with ``one_plus`` ``1.0 + _h(num / den) - _H_MARGIN`` (``_colimit2``); 0.0
    elsewhere. Bit-equal to the scalar ``_h``: ``np.float_power`` calls the C library's ``pow``
    as Python's ``**`` does (``np.power`` may use a SIMD approximation that differs in the last
    bit); only the masked elements are evaluated."""
    r = np.zeros(mask.shape)
    np.divide(num, den, out=r, where=mask)
    np.float_power(r, COLIMIT_P, out=r, where=mask)
    np.add(1.0, r, out=r, where=mask)
    np.float_power(r, _INV_P, out=r, where=mask)
    if one_plus:
        np.add(1.0, r, out=r, where=mask)
    np.subtract(r, _H_MARGIN, out=r, where=mask)
    return r


_INV_P = 1.0 / COLIMIT_P  # _h's exponent, the same float


def _chain_totals(c: dict, hw, gemm: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``_sass_chain(..., detail=False)`` plus ``_call_terms`` over the columns ``c``: the
    modelled us at both ends. Arrays are (end, round group, config): the scalar loop's round
    groups (per grid -- the full CTAs, then a split tail's CTAs -- its full rounds, then its
    partial round) are 4 rows; a group the scalar plan does not have is a row with ``count`` 0
    (it adds exactly 0.0)."""
    sms = hw.sm_count
    warps = -(-c["threads"] // 32)
    bytes_iter = c["stream_bytes_per_iter"] + c["other_bytes_per_iter"]
    f = c["l2_reread_fraction"]
    depth = np.maximum(c["depth"], 1.0)
    ctas, tail_ctas, iters_cta, tail_iters = c["ctas"], c["tail_ctas"], c["iters_per_cta"], c["tail_iters"]
    full_ctas = ctas - tail_ctas  # = ctas without a split tail: its one grid
    steps = full_ctas * iters_cta + tail_ctas * tail_iters
    safe_steps = np.where(steps != 0, steps, 1)
    rate = c["tensor_tflops"] * 1e12 / sms / hw.clock_hz
    has = (c["tensor_tflops"] != 0) & (steps != 0)
    tensor_step = np.where(has, c["tensor_flops"] / safe_steps / np.where(rate != 0, rate, 1.0), 0.0)
    per_cta = c["passes_per_cta"] * c["pass_instrs"] + c["fixed_instrs"]
    q = c["q"]
    epi = c["epilogue_cycles"]
    nc = ctas.shape[0]

    # rounds() of each grid: full rounds of q CTAs per SM, then one partial round
    base, extra = np.divmod(np.stack([full_ctas, tail_ctas]), sms)
    full = base // q
    lo = base - full * q
    part = lo + (extra != 0)
    count = np.stack([full, part != 0], axis=1).reshape(4, nc)
    kk = np.stack([np.broadcast_to(q, full.shape), part], axis=1).reshape(4, nc)
    a = np.stack([np.broadcast_to(q * sms, full.shape), extra * part + (sms - extra) * lo], axis=1).reshape(4, nc)
    iters = np.repeat(np.stack([iters_cta, tail_iters]), 2, axis=0)
    reduce = np.ones((4, nc), dtype=bool)  # the tail grid reduces; the other only without a tail
    reduce[:2] = tail_ctas == 0
    active = count != 0
    is_first = active & (np.arange(4)[:, None] == active.argmax(axis=0))
    w = -(-kk * warps // hw.schedulers_per_sm)
    issue = w * c["issue_iter"]
    fab = kk * bytes_iter / hw.sm_fabric_bytes_per_clk  # also the first stage through the port
    ten = kk * tensor_step
    w_per_cta = w * per_cta

    ends = np.array(_ends(hw))[:, :, None, None]  # (end, field, 1, 1)
    lat, l2, bw_clk = ends[:, 0], ends[:, 1], ends[:, 2]
    eff_lat = f * l2 + (1.0 - f) * lat
    latency = np.maximum(c["chain_base"] + c["round_trips"] * eff_lat, eff_lat / depth)
    dram_step = np.where(steps != 0, c["dram_bytes"] / safe_steps / bw_clk, 0.0)
    reduce_tail = c["trips"] * l2 + epi

    # step_sm = colimit(latency, issue, fab, ten): the first term equal to the largest is the
    # largest; every other term above the margin adds h(t / hi) - h(margin), in this order
    terms = np.empty((4, 2, 4, nc))
    terms[0], terms[1], terms[2], terms[3] = latency, issue, fab, ten
    hi = terms.max(axis=0)
    first_hi = np.arange(4)[:, None, None, None] == (terms == hi).argmax(axis=0)
    h = _h_where(terms, hi, (terms > COLIMIT_MARGIN * hi) & ~first_hi & active, False)
    step_sm = hi * (1.0 + h[0] + h[1] + h[2] + h[3])
    # step = _colimit2(step_sm, step_chip)
    step_chip = a * dram_step
    big, small = np.maximum(step_sm, step_chip), np.minimum(step_sm, step_chip)
    near = (small > COLIMIT_MARGIN * big) & active
    step = np.where(near, big * _h_where(small, big, near, True), big)
    fill = lat + fab
    tl = w_per_cta + np.where(reduce, reduce_tail, epi)
    rnd_fill = np.where(is_first, fill + (count - 1) * fill / q, count * fill / q)
    contrib = rnd_fill + count * (iters * step + tl)
    cycles = contrib[:, 0] + contrib[:, 1] + contrib[:, 2] + contrib[:, 3]

    # _call_terms: launches less the PDL saving; no split-K reduce kernel (a batch family reduces
    # in-kernel: 0.0); helper kernels
    launches = 1 + c["extra_launches"]
    pdl = c["pdl"]
    us = US / hw.clock_hz
    res = []
    for e in (0, 1):
        launch = launches * hw.launch_us[e] - np.where(pdl, hw.pdl_saving_us[1 - e], 0.0)
        aux = c["aux_kernels"] * hw.aux_kernel_us[e]
        if gemm:  # the report's gemm_us (gemm_totals)
            res.append(cycles[e] / hw.clock_hz * US + launch + 0.0 + aux - aux)
        else:
            res.append(cycles[e] * us + launch + 0.0 + aux)
    return res[0], res[1]


__all__ = ["gemm_totals", "gemm_us_with", "totals"]
