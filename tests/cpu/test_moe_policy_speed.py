"""The grouped MoE policies' fast path changes no number and no pick.

``heuristics.moe_sm90`` / ``moe_sm100`` price every config of both GEMMs of every token tile in one
pass (``templates.sm90_moe.perf.grouped_gemm_estimates`` -> ``perfmodel.batch.gemm_totals``) and
memoise what does not depend on M (the config spaces, the feasible configs of a layer shape, the
binomial work-tile sums keyed by (M, top_k, E, tile)). The reference here is the policy as it was
written before, per config and unmemoised: the binomial sum recomputed for every config, every
equivalent dense problem priced by the full report (``model.estimate_with`` through ``model._model``,
bypassing ``estimate``'s memo) and its ``gemm_us`` interpolated, the sm100 empty-slot charge added,
configs ranked and paired by the documented rule. Equality is exact (``==`` on floats, every
candidate's configs, times and tiles): the fast path does the same IEEE operations in the same
order. Shapes: every MoE layer preset at the upper M of every bucket of 1..256 (what
``pick_moe_configs`` prices for M = 1..256, checked for every M), at off-bucket Ms, with a measured
histogram, ungated (sm90), and random layer shapes (fixed seed). Both paths of the batch pricing
(numpy, scalar loop) are forced for the sm90 policy.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from nvgemm.templates.sm90_moe import policy as moe_sm90
from nvgemm.templates.sm100_moe import policy as moe_sm100
from nvgemm.templates.sm90_moe.policy import MOE_LAYERS, MoeShape, bucket_of, moe_buckets
from nvgemm.heuristics.perfmodel.hardware import get_hardware
from nvgemm.heuristics.perfmodel import batch
from nvgemm.heuristics.perfmodel import model as model_mod
from nvgemm.templates.sm90_moe import perf as sm90_moe
from nvgemm.templates.sm100_moe import perf as sm100_moe
from nvgemm.templates.sm90_w4a16.perf import SM90_SPLITS
from nvgemm.templates.sm90_w4a16.config import MMA_ROW_TILES, ROW_TILE
from nvgemm.templates.sm90_moe.config import MOE_TILE_M, Sm90MoeConfig
from nvgemm.templates.sm90_moe.config import moe_shape_problem as problem90
from nvgemm.templates.sm90_moe.config import validate_moe_config as valid90
from nvgemm.templates.sm100_moe.config import MOE_SPLIT_K, Sm100MoeConfig
from nvgemm.templates.sm100_moe.config import moe_shape_problem as problem100
from nvgemm.templates.sm100_moe.config import validate_moe_config as valid100

BUCKET_MS = tuple(hi for _, hi in moe_buckets(256))
OTHER_MS = (3, 5, 20, 47, 100, 200)


# ---- the reference: the policies as written before, per config, unmemoised ----

def _ref_tiles(m, top_k, e, tile, histogram):
    if histogram is not None:
        return float(sum(math.ceil(c / tile) for c in histogram if c > 0))
    p = min(1.0, top_k / e)
    if p >= 1.0:
        pmf = [0.0] * m + [1.0]
    else:
        lq, lp = math.log1p(-p), math.log(p)
        pmf = [math.exp(math.lgamma(m + 1) - math.lgamma(c + 1) - math.lgamma(m - c + 1) + (c * lp if c else 0.0)
                        + (m - c) * lq) for c in range(m + 1)]
    return e * sum(q * math.ceil(c / tile) for c, q in enumerate(pmf))


def _ref_dense_gemm_us(dense, m, n, k, gpu, sm_count):
    est = model_mod._model(model_mod.estimate_with, dense, m, n, k, gpu, sm_count)  # no estimate() memo
    return None if est is None else est.gemm_us


def _ref_grouped(dense, tile, m, top_k, e, rows, k, gpu, sm_count, histogram):
    tiles = _ref_tiles(m, top_k, e, tile, histogram)
    if tiles <= 0:
        return None
    pairs = sum(histogram) if histogram is not None else m * top_k
    per_tile = min(float(tile), pairs / tiles)
    dense = replace(dense, pdl=True)
    lo_t, hi_t, mm = max(1, math.floor(tiles)), max(1, math.ceil(tiles)), max(1, math.ceil(per_tile))
    lo = _ref_dense_gemm_us(dense, mm, rows * lo_t, k, gpu, sm_count)
    hi = lo if hi_t == lo_t else _ref_dense_gemm_us(dense, mm, rows * hi_t, k, gpu, sm_count)
    if lo is None or hi is None:
        return None
    f = 0.0 if hi_t == lo_t else (tiles - lo_t) / (hi_t - lo_t)
    return tiles, tuple((1 - f) * a + f * b for a, b in zip(lo, hi))


def _ref_pairs(best, key):
    # the policies order pairs by sum(gemm_us) = (us13[0] + us2[0]) + (us13[1] + us2[1]) (sum's 0 + x is x);
    # the keys below add the same four numbers in the same grouping
    pairs = []
    for g1, g2 in best:
        for c1, t1, us1 in g1:
            for c2, _, us2 in g2:
                pairs.append((c1, c2, us1, us2, t1))
    pairs.sort(key=key)
    return pairs


def _top(scored):
    scored.sort(key=lambda s: s[:2])
    return [s[2:] for s in scored[:3]]


def _ref_sm90(shape, m, gpu="H200", sm_count=None, histogram=None, gated=True, limit=8):
    rows13 = 2 * shape.inter if gated else shape.inter
    best = []
    for tm in MOE_TILE_M:
        space = [Sm90MoeConfig(tile_m=tm, tile_n=ROW_TILE * rt * w, tile_k=256, split_k=s, num_warps=w, stages=st,
                               pdl=True)
                 for w in (2, 4, 8) for rt in MMA_ROW_TILES for st in (3, 4) for s in SM90_SPLITS]
        space = [c for c in space if c.tile_n <= 256 and valid90(c)]
        per_gemm = []
        for rows, k, g in ((rows13, shape.hidden, gated), (shape.hidden, shape.inter, False)):
            scored = []
            for i, c in enumerate(space):
                if problem90(c, rows, k, g):
                    continue
                r = _ref_grouped(c.dense(), tm, m, shape.top_k, shape.num_experts, rows, k, gpu, sm_count, histogram)
                if r is not None:
                    scored.append((0.5 * (r[1][0] + r[1][1]), i, c, r[0], r[1]))
            per_gemm.append(_top(scored))
        best.append(per_gemm)
    return _ref_pairs(best, lambda p: ((p[2][0] + p[3][0]) + (p[2][1] + p[3][1]), p[0].tile_m))[:limit]


def _ref_sm100(shape, m, gpu="B200", sm_count=None, histogram=None, limit=8):
    best = []
    pairs = m * shape.top_k if histogram is None else sum(histogram)
    for tn in moe_sm100.token_tiles(m, shape.top_k, shape.num_experts, histogram):
        per_gemm = []
        for rows, k, g in ((2 * shape.inter, shape.hidden, True), (shape.hidden, shape.inter, False)):
            scored = []
            rows_p = -(-rows // 128) * 128
            for i, s in enumerate(MOE_SPLIT_K):
                c = Sm100MoeConfig(tile_n=tn, split_k=s, pdl=True)
                if not valid100(c) or problem100(c, rows, k, g):
                    continue
                r = _ref_grouped(c.dense(), tn, m, shape.top_k, shape.num_experts, rows_p, k, gpu, sm_count,
                                 histogram)
                if r is not None:
                    x = sm100_moe.empty_slot_us(c, pairs, shape.num_experts, r[0], rows_p, gpu, sm_count)
                    us = (r[1][0] + x, r[1][1] + x)
                    scored.append((0.5 * (us[0] + us[1]), i, c, r[0], us))
            per_gemm.append(_top(scored))
        best.append(per_gemm)
    key = lambda p: ((p[2][0] + p[3][0]) + (p[2][1] + p[3][1]), p[0].tile_n, p[0].split_k, p[1].split_k)  # noqa: E731
    ranked = _ref_pairs(best, key)
    hw = get_hardware(gpu, sm_count)
    if sm100_moe.prefetch_fits_l2(pairs, shape.num_experts, 2 * shape.inter, shape.hidden, shape.hidden, shape.inter,
                                  hw.l2_mb * 1e6):
        # decode: every pair repriced on the L2-prefetch timeline, one pair at a time, GEMM1 with prefetch_next
        out = []
        for c1, c2, _, _, t1 in ranked:
            us = sm100_moe.prefetched_pair_us(c1, c2, m, shape.top_k, shape.num_experts, 2 * shape.inter,
                                              shape.hidden, shape.hidden, shape.inter, gpu, sm_count, histogram)
            out.append((replace(c1, prefetch_next=True), c2, us[0], us[1], t1))
        ranked = sorted(out, key=key)
    return ranked[:limit]


def _as_tuples(cands):
    return [(c.config13, c.config2, c.us13, c.us2, c.tiles) for c in cands]


# ---- the cases ----

def _random_shapes(seed, count):
    rng = random.Random(seed)
    out = []
    for j in range(count):
        e = rng.choice((8, 16, 32, 64, 128, 160, 256, 384))
        out.append((MoeShape(f"random{j}", e, rng.randint(1, min(8, e)), 256 * rng.randint(4, 28),
                             128 * rng.randint(1, 20)), rng.randint(1, 256)))
    return out


def _cases():
    out = [(s, m, None) for s in MOE_LAYERS.values() for m in BUCKET_MS + OTHER_MS[:2]]
    out += [(s, m, None) for s, m in _random_shapes(25, 6)]
    skew = [0] * 120 + [40, 30, 20, 10, 8, 4, 2, 1]  # Qwen3's 128 experts, 115 pairs, a hot few
    out.append((MOE_LAYERS["Qwen3-30B-A3B"], 32, skew))
    return out


_REF90: dict = {}


@pytest.fixture(params=["default", "numpy for every group", "scalar loop for every group"])
def batch_path(request, monkeypatch):
    if request.param != "default":
        monkeypatch.setattr(batch, "SCALAR_MAX", 0 if request.param.startswith("numpy") else 10**9)
    return request.param


def _clear_fast_memos():
    """Every memo of the fast path that depends on a shape, so each call is new to it."""
    sm90_moe._uniform_tiles.cache_clear()
    moe_sm90._feasible.cache_clear()
    moe_sm90.pick_moe_configs.cache_clear()
    moe_sm100.pick_moe_configs.cache_clear()


def test_sm90_moe_policy_equals_the_unmemoised_reference(batch_path):
    _clear_fast_memos()
    for shape, m, hist in _cases():
        key = (shape, m, None if hist is None else tuple(hist))
        if key not in _REF90:
            _REF90[key] = _ref_sm90(shape, m, histogram=hist)
        got = _as_tuples(moe_sm90.moe_candidates(shape, m, "H200", histogram=hist))
        assert got, (shape, m)
        assert got == _REF90[key], (shape, m)


def test_sm90_moe_policy_equals_the_reference_ungated_and_on_fewer_sms():
    _clear_fast_memos()
    for shape in list(MOE_LAYERS.values())[:2]:
        for m in (1, 64):
            assert _as_tuples(moe_sm90.moe_candidates(shape, m, gated=False)) == _ref_sm90(shape, m, gated=False)
            assert _as_tuples(moe_sm90.moe_candidates(shape, m, sm_count=66)) == _ref_sm90(shape, m, sm_count=66)


def test_sm100_moe_policy_equals_the_unmemoised_reference():
    _clear_fast_memos()
    for shape, m, hist in _cases():
        got = _as_tuples(moe_sm100.moe_candidates(shape, m, histogram=hist))
        assert got, (shape, m)
        assert got == _ref_sm100(shape, m, histogram=hist), (shape, m)
    assert _as_tuples(moe_sm100.moe_candidates(MOE_LAYERS["Mixtral-8x7B"], 16, sm_count=74)) == \
        _ref_sm100(MOE_LAYERS["Mixtral-8x7B"], 16, sm_count=74)


def test_run_time_picks_for_every_m_equal_the_reference_at_the_bucket_top():
    """``pick_moe_configs`` at M = 1..256 for every preset: the reference's first pair at the
    upper M of the bucket."""
    _clear_fast_memos()
    for s in MOE_LAYERS.values():
        ref90 = {hi: _REF90.get((s, hi, None)) or _ref_sm90(s, hi, limit=1) for hi in BUCKET_MS}
        ref100 = {hi: _ref_sm100(s, hi, limit=1) for hi in BUCKET_MS}
        for m in range(1, 257):
            hi = bucket_of(m)[1]
            assert moe_sm90.pick_moe_configs(m, s.num_experts, s.top_k, s.hidden, s.inter, True) == \
                ref90[hi][0][:2], (s.name, m)
            assert moe_sm100.pick_moe_configs(m, s.num_experts, s.top_k, s.hidden, s.inter) == \
                ref100[hi][0][:2], (s.name, m)


def test_gemm_totals_is_the_reports_gemm_us_and_keeps_its_nones():
    """``batch.gemm_totals`` = ``estimate(...).gemm_us`` per config over several shapes at once
    (sm90 ``mma`` dense twins: the batch families; sm100: the scalar engine path), including
    configs with no estimate (split-K beyond the K stages)."""
    cfgs90 = [c.dense() for c in (Sm90MoeConfig(tile_m=8, tile_n=128, tile_k=256, split_k=8, num_warps=4, stages=4,
                                                 pdl=True),
                                  Sm90MoeConfig(tile_m=32, tile_n=64, tile_k=256, split_k=1, num_warps=2, stages=3,
                                                pdl=True))]
    cfgs100 = [Sm100MoeConfig(tile_n=16, split_k=s, pdl=True).dense() for s in (1, 4)]
    for cfgs, gpu in ((cfgs90, "H200"), (cfgs100, "B200")):
        req = [(cfgs, m, n, k) for m, n, k in ((1, 4096, 512), (7, 14336, 4096), (32, 1536, 7168))]
        got = batch.gemm_totals(req, gpu)
        for (cs, m, n, k), row in zip(req, got):
            assert row == [_ref_dense_gemm_us(c, m, n, k, gpu, None) for c in cs]
    assert batch.gemm_totals([(cfgs90[:1], 1, 4096, 512)])[0][0] is None  # split 8 > the 2 K stages
