"""The sm100 grouped MoE path's decode L2-prefetch model (``templates/sm100_moe/perf.py``: a MODEL) and the
MoE policies' one-token bucket.

What is checked, each against an independent computation:
* with both prefetches off the timeline prices a pair exactly as the GEMMs alone (the existing model);
* a prefetch never makes a GEMM slower in the model (every preset, M = 1 / 2 / 4, several configs);
* the timeline's two regimes on hand-built estimates, against hand-derived numbers;
* the L2 bound from the experts' byte counts computed here;
* the one-token bucket and its pick;
* the decode target the prefetch exists for: the routed experts of Qwen3-30B-A3B and DeepSeek-V3 TP8 at one token
  on B200 reach 35 % of their weight-bytes floor in the model, and do not without the prefetches.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nvgemm.heuristics.perfmodel.hardware import get_hardware
from nvgemm.templates.sm100_moe import perf, policy
from nvgemm.templates.sm100_moe.config import FUSED_PREP_MAX_PAIRS, Sm100MoeConfig
from nvgemm.templates.sm90_moe.perf import byte_floor_us
from nvgemm.templates.sm90_moe.policy import MOE_LAYERS, bucket_of, moe_buckets

QWEN, DSV3 = MOE_LAYERS["Qwen3-30B-A3B"], MOE_LAYERS["DeepSeek-V3-TP8"]


def _dims(shape):
    return 2 * shape.inter, shape.hidden, shape.hidden, shape.inter


def _configs():
    return [(Sm100MoeConfig(tile_n=t, split_k=s, pdl=True), Sm100MoeConfig(tile_n=t, split_k=s2, pdl=True))
            for t in (8, 16) for s in (1, 4) for s2 in (1, 2)]


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B", "DeepSeek-V3-TP8", "Mixtral-8x7B"])
@pytest.mark.parametrize("m", [1, 2])
def test_timeline_without_prefetch_is_the_gemms_alone(name, m):
    shape = MOE_LAYERS[name]
    r13, k13, r2, k2 = _dims(shape)
    for c1, c2 in _configs():
        got = perf.prefetched_pair_us(c1, c2, m, shape.top_k, shape.num_experts, r13, k13, r2, k2, "B200",
                                      prep_prefetch=False, gemm1_prefetch=False)
        plain = perf.moe_gemm_estimates([([c1], [c1.dense()], c1.tile_n, r13, k13),
                                         ([c2], [c2.dense()], c2.tile_n, r2, k2)], m, shape.top_k,
                                        shape.num_experts, "B200")
        if got is None:
            assert plain[0][0] is None or plain[1][0] is None
            continue
        for g, e in zip(got, (plain[0][0], plain[1][0])):
            assert g == pytest.approx(e.us, rel=1e-12, abs=1e-12), (name, m, c1, c2)


@pytest.mark.parametrize("name", list(MOE_LAYERS))
def test_a_prefetch_never_slows_a_gemm(name):
    shape = MOE_LAYERS[name]
    r13, k13, r2, k2 = _dims(shape)
    for m in (1, 2, 4):
        for c1, c2 in _configs():
            base = perf.prefetched_pair_us(c1, c2, m, shape.top_k, shape.num_experts, r13, k13, r2, k2, "B200",
                                           prep_prefetch=False, gemm1_prefetch=False)
            if base is None:
                continue
            for pp, gp in ((True, False), (False, True), (True, True)):
                got = perf.prefetched_pair_us(c1, c2, m, shape.top_k, shape.num_experts, r13, k13, r2, k2, "B200",
                                              prep_prefetch=pp, gemm1_prefetch=gp)
                for g, b in zip(got, base):
                    assert g[0] <= b[0] + 1e-9 and g[1] <= b[1] + 1e-9, (name, m, c1, c2, pp, gp)


def _est(launch, kernel, tail, dram_bytes, depth=4, iters=4, units=1):
    geo = SimpleNamespace(dram_bytes=dram_bytes, depth=depth, iters_per_cta=iters, units_per_cta=units)
    return SimpleNamespace(launch_us=(launch, launch), kernel_us=(kernel, kernel), tail_us=(tail, tail), geometry=geo)


def test_timeline_regimes_by_hand():
    """B200's ends (1.965 GHz; DRAM 1400 / 2400 cycles, L2 300 / 700 cycles; 6.8 / 6.0 TB/s). Low end, by hand:
    DRAM latency 0.7125 us, L2 latency 0.1527 us. GEMM1: 6.8 MB arrive at 0.7125 + 1.0 = 1.7125 us after the prep;
    its L2-fed run ends at launch 1.0 + 0.5 = 1.5 us, so it ends at 1.7125 + 0.1527 + tail 0.1 = 1.9651 us (bytes
    bound), against 1.0 + 3.0 = 4.0 us DRAM-fed. GEMM2 (3.4 MB) issues its prefetch at GEMM1's start (its K tiles
    fit its ring): the bytes queue behind GEMM1's, arriving at 1.7125 + 0.5 = 2.2125 us; GEMM2 starts at
    1.9651 + 1.0 = 2.9651 us and its L2-fed run (0.4 us) ends after the arrival + L2 + tail (2.4652): 3.3651 us."""
    hw = get_hardware("B200")
    us = 1e6 / hw.clock_hz
    lat, l2 = hw.dram_latency[0] * us, hw.l2_latency[0] * us
    assert lat == pytest.approx(0.7125, abs=1e-4) and l2 == pytest.approx(0.15267, abs=1e-4)
    e1, e1l2 = _est(1.0, 3.0, 0.1, 6.8e6), _est(1.0, 0.5, 0.1, 6.8e6)
    e2, e2l2 = _est(1.0, 2.0, 0.1, 3.4e6), _est(1.0, 0.4, 0.1, 3.4e6)
    g1, g2 = perf.prefetch_timeline(e1, e1l2, e2, e2l2, "B200", True, True)
    end1 = lat + 1.0 + l2 + 0.1
    assert g1[0] == pytest.approx(end1, rel=1e-9)
    assert g2[0] == pytest.approx((end1 + 1.0 + 0.4) - end1, rel=1e-9)  # launch-bound: its own L2-fed run
    # a GEMM1 whose K tiles do not fit its ring issues GEMM2's prefetch later: after (1 - 4/8) of its run
    e1_deep = _est(1.0, 3.0, 0.1, 6.8e6, depth=4, iters=8)
    g1b, g2b = perf.prefetch_timeline(e1_deep, e1l2, e2, _est(1.0, 0.0, 0.1, 3.4e6), "B200", True, True)
    r2 = max(1.0 + 0.5 * (g1b[0] - 1.0) + lat, lat + 1.0) + 0.5
    assert g1b[0] + g2b[0] == pytest.approx(max(g1b[0] + 1.0, r2 + l2 + 0.1), rel=1e-9)


def test_l2_bound_from_the_experts_bytes():
    l2 = get_hardware("B200").l2_mb * 1e6
    # Qwen3: per expert (1536 x 2048 + 2048 x 768) x 0.5625 B = 2.65 MB; 8 experts = 21.2 MB <= half of 126 MB
    per_qwen = (1536 * 2048 + 2048 * 768) * 0.5625
    assert perf.prefetch_bytes(8, 128, *_dims(QWEN)) == pytest.approx(8 * per_qwen)
    assert perf.prefetch_fits_l2(8, 128, *_dims(QWEN), l2)
    assert not perf.prefetch_fits_l2(32, 128, *_dims(QWEN), l2)  # 84.9 MB
    # Llama-4-Scout, one pair: (16384 x 5120 + 5120 x 8192) x 0.5625 = 70.8 MB > 63 MB
    scout = MOE_LAYERS["Llama-4-Scout"]
    assert not perf.prefetch_fits_l2(1, scout.num_experts, *_dims(scout), l2)
    # at most FUSED_PREP_MAX_PAIRS pairs (the one-launch prep), whatever the bytes
    assert not perf.prefetch_fits_l2(FUSED_PREP_MAX_PAIRS + 1, 10**6, 128, 256, 256, 128, 1e15)
    assert perf.prefetch_fits_l2(FUSED_PREP_MAX_PAIRS, 10**6, 128, 256, 256, 128, 1e15)
    assert not perf.prefetch_fits_l2(0, 8, 128, 256, 256, 128, 1e15)


def test_one_token_has_its_own_moe_bucket():
    b = moe_buckets(256)
    assert b[:3] == [(1, 1), (2, 8), (9, 16)] and b[-1][1] == 256
    assert all(lo == prev_hi + 1 for (lo, _), (_, prev_hi) in zip(b[1:], b[:-1]))
    assert bucket_of(1) == (1, 1) and bucket_of(2) == (2, 8) and bucket_of(8) == (2, 8)
    # past 256 tokens the buckets keep doubling: never one ending at M itself (one pick per bucket)
    assert bucket_of(300) == bucket_of(512) == (257, 512) and bucket_of(513) == bucket_of(1000) == (513, 1024)
    assert bucket_of(5000) == (4097, 8192)
    # DeepSeek-V3 TP8 at one token: a routed expert has one row and four 128-row tiles, so GEMM1 splits K
    policy.pick_moe_configs.cache_clear()
    one = policy.pick_moe_configs(1, DSV3.num_experts, DSV3.top_k, DSV3.hidden, DSV3.inter)
    eight = policy.pick_moe_configs(8, DSV3.num_experts, DSV3.top_k, DSV3.hidden, DSV3.inter)
    assert one[0].split_k > 1 and one != eight


def _routed_share(shape, gpu="B200"):
    r = policy.layer_model(shape, 1, gpu)
    routed = 0.5 * (sum(r["total_us"]) - sum(r["shared_us"]))
    return byte_floor_us(1, shape.top_k, shape.num_experts, shape.hidden, shape.inter, 0, gpu) / routed


@pytest.mark.parametrize("shape", [QWEN, DSV3], ids=["Qwen3-30B-A3B", "DeepSeek-V3-TP8"])
def test_decode_moe_reaches_35_percent_of_the_floor_only_with_the_prefetches(shape, monkeypatch):
    policy.pick_moe_configs.cache_clear()
    assert policy.layer_model(shape, 1)["launches"] == 3
    assert _routed_share(shape) >= 0.35
    monkeypatch.setattr(policy, "prefetch_fits_l2", lambda *a, **k: False)
    assert _routed_share(shape) < 0.35
