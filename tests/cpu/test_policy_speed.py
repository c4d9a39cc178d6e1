"""The sm90 policy's fast path (``nvgemm.heuristics.perfmodel.batch``) changes no number and no pick.

The fast path prices all configs of a shape at once on numpy arrays and memoises what does not
depend on the shape. Its references here are the scalar model, unmemoised:
:func:`nvgemm.heuristics.perfmodel.model.total_us_with` (a ``Geometry`` and ``_sass_chain`` per config, what
the policy ranked with before; itself checked against the full report, ``estimate_with``) for
every number, and a ranking written out below from the documented rule of
:func:`nvgemm.heuristics.perfmodel.rank` over those numbers for every pick. Equality is exact
(``==`` on floats): the fast path does the same IEEE operations in the same order, so any
difference is a bug, not rounding. Shapes: every preset layer x 14 batch sizes x both epilogues,
plus random shapes (fixed seeds) over N 16..64000, K 32..25600, M 1..2048.
"""

from __future__ import annotations

import random

import pytest

from nvgemm.heuristics import GemmProblem
from nvgemm.templates.sm90_w4a16 import policy as sm90
from nvgemm.heuristics.presets import PRESETS
from nvgemm.core.problem import Target
from nvgemm.heuristics.perfmodel import MODEL_TIE, batch, estimate_with, family_for, get_hardware, lookup
from nvgemm.heuristics.perfmodel import model as model_mod
from nvgemm.heuristics.perfmodel.table import load_table, spill_status

MS = (1, 3, 8, 13, 32, 48, 100, 128, 200, 256, 384, 512, 1000, 2048)
H200 = Target.from_gpu("H200")


def _preset_problems():
    out = []
    for p in PRESETS.values():
        for lg in p.layers:
            for m in MS:
                for ep in ("none", "silu_mul"):
                    out.append(GemmProblem(n=lg.n, k=lg.k, m=m, epilogue=ep, a_format="bf16", target=H200))
    return out


def _random_problems(seed: int, count: int):
    rng = random.Random(seed)
    return [GemmProblem(n=16 * rng.randint(1, 4000), k=32 * rng.randint(1, 800), m=rng.randint(1, 2048),
                        a_format="bf16", target=H200) for _ in range(count)]


def _reference_us(config, m, n, k, sm_count, activation=None):
    """Modelled (low, high) us of ``config``, unmemoised: the scalar model
    (:func:`~nvgemm.heuristics.perfmodel.model.total_us_with`: a ``Geometry``, ``_sass_chain`` per end) --
    what the policy ranked with before the batch path -- checked against the full report
    (:func:`estimate_with`, which converts cycles to us as ``cycles / clock x 1e6`` instead of
    ``cycles x (1e6 / clock)``: the two differ in the last bits, 1e-12 relative). None: no
    estimate. ``activation``: the variant's own facts where recorded (``lookup``)."""
    fam = family_for(config)
    hw = get_hardware("H200", sm_count)
    facts = lookup(config, fam.arch, activation=activation)
    if facts is None or fam.shape_problem(config, m, n, k):
        return None
    try:
        t = model_mod.total_us_with(config, m, n, k, hw, facts, fam)
        e = estimate_with(config, m, n, k, hw, facts, fam).total_us
    except ValueError:  # does not fit on an SM
        return None
    assert all(abs(a - b) <= 1e-12 * b for a, b in zip(t, e)), (config.name(), t, e)
    return t


def _reference_ranking(problem, limit=8):
    """``sm90.ranked_candidates(problem, limit)`` rebuilt from the documented rule: the rule
    candidates less the spilling variants, priced by :func:`_reference_us`, sorted by (middle of
    the range, high end, input order); repeatedly the fastest remaining one's ties (within
    ``tie`` relative of its middle) go to the fewest main-loop instructions per weight element,
    then (middle, high end, input order)."""
    m, n, k, sms = problem.m_hi, problem.n, problem.k, problem.target.sm_count
    table = load_table()
    cands = [c for c in sm90.rule_candidates(problem)
             if not spill_status(c.config, problem.epilogue, "sm_90a", table)]
    scored = []
    for i, c in enumerate(cands):
        t = _reference_us(c.config, m, n, k, sms, problem.epilogue)
        if t is not None:
            ipe = lookup(c.config, "sm_90a", activation=problem.epilogue).instr_per_elem
            scored.append(((t[0] + t[1]) / 2, t[1], i, ipe if ipe == ipe else float("inf"), c, t))
    scored.sort(key=lambda s: s[:3])
    tie = sm90.DECODE_TIE if m <= 32 else MODEL_TIE
    out = []
    while scored and len(out) < limit:
        ties = [s for s in scored if s[0] <= scored[0][0] * (1.0 + tie)]
        pick = min(ties, key=lambda s: (s[3], s[0], s[1], s[2]))
        scored.remove(pick)
        out.append((pick[4].config, pick[5]))
    return out


def _check_totals(problems):
    checked = 0
    for p in problems:
        cfgs = [c.config for c in sm90.rule_candidates(p)]
        got = batch.totals(cfgs, p.m_hi, p.n, p.k, "H200", p.target.sm_count, p.epilogue)
        for c, t in zip(cfgs, got):
            ref = _reference_us(c, p.m_hi, p.n, p.k, p.target.sm_count, p.epilogue)
            assert t == ref, (c.name(), p, t, ref)
            checked += t is not None
    return checked


@pytest.fixture(params=["numpy for every group", "scalar loop for every group"])
def batch_min(request, monkeypatch):
    # both paths of ``totals`` for every group (by default: the scalar loop below SCALAR_MAX configs)
    monkeypatch.setattr(batch, "SCALAR_MAX", 0 if request.param.startswith("numpy") else 10**9)


def test_batch_totals_equal_the_report_path_bit_for_bit_on_the_presets(batch_min):
    assert _check_totals(_preset_problems()) > 10000


def test_batch_totals_equal_the_report_path_bit_for_bit_on_random_shapes(batch_min):
    assert _check_totals(_random_problems(23, 250)) > 5000


def test_batch_totals_match_the_scalar_fast_path_and_keep_its_nones():
    """``totals`` = ``estimate_us`` per config, including configs it cannot price (a shape the
    config cannot run: split-K beyond the K stages) and configs of another engine (sm100, which
    takes the scalar path inside ``totals``)."""
    from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config as W
    from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig

    cfgs = [W("mma", tile_m=8, tile_n=128, tile_k=256, split_k=8, num_warps=4, stages=4, pdl=True),
            W("wgmma", tile_m=64, tile_n=256, tile_k=128, split_k=2, num_warps=8, stages=4, pdl=True),
            Sm100Nvfp4GemmConfig()]
    for m, n, k in ((1, 4096, 512), (64, 4096, 4096), (300, 1000, 7168)):
        got = batch.totals(cfgs, m, n, k)
        assert got == [model_mod.total_us_with(c, m, n, k, get_hardware("H200"), lookup(c), family_for(c))
                       if not family_for(c).shape_problem(c, m, n, k) else None for c in cfgs[:2]] + [
            model_mod.estimate_us(cfgs[2], m, n, k)]
    assert batch.totals(cfgs[:1], 1, 4096, 512)[0] is None  # split 8 > the 2 K stages of K=512


@pytest.mark.parametrize("which", ["presets", "random"])
def test_policy_picks_and_times_equal_the_reference_ranking(which):
    problems = _preset_problems() if which == "presets" else _random_problems(5, 300)
    for p in problems:
        got = sm90.ranked_candidates(p, limit=8)
        ref = _reference_ranking(p)
        assert [c.config for c in got] == [c for c, _ in ref], p
        for c, (_, t) in zip(got, ref):
            assert f"; model {0.5 * (t[0] + t[1]):.1f} us" in c.reason, (p, c.reason, t)
