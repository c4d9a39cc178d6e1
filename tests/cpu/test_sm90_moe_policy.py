"""Policy and performance model of the sm90 grouped MoE kernels (pure Python, no kernels): the
expected work tiles against a Monte-Carlo simulation of uniform routing, the histogram option, the
candidate list's rules (at most 8, valid, ranked by the model, one pick per M bucket), and that a
skewed measured histogram moves the token tile up."""

from __future__ import annotations

import math

import pytest
import torch

from nvgemm.templates.sm90_moe.policy import MOE_LAYERS, bucket_of, moe_candidates, pick_moe_configs
from nvgemm.templates.sm90_moe.perf import expected_active_experts, expected_tiles
from nvgemm.templates.sm90_moe.config import moe_shape_problem, validate_moe_config


@pytest.mark.parametrize("m,k,e,tm", [(1, 8, 256, 8), (32, 8, 128, 8), (64, 2, 8, 16), (256, 8, 128, 32)])
def test_expected_tiles_matches_simulated_uniform_routing(m, k, e, tm):
    g = torch.Generator().manual_seed(m + e)
    tiles, active = [], []
    for _ in range(300):  # top-k distinct experts per token: the k smallest of e uniform keys
        ids = torch.rand(m, e, generator=g).topk(k, dim=1, largest=False).indices
        c = torch.bincount(ids.reshape(-1), minlength=e)
        tiles.append(float(((c + tm - 1) // tm).sum()))
        active.append(float((c > 0).sum()))
    sim_t, sim_a = sum(tiles) / len(tiles), sum(active) / len(active)
    assert abs(expected_tiles(m, k, e, tm) - sim_t) <= 0.03 * sim_t + 0.1
    assert abs(expected_active_experts(m, k, e) - sim_a) <= 0.03 * sim_a + 0.1


def test_histogram_option():
    assert expected_tiles(4, 2, 4, 8, histogram=[9, 0, 8, 1]) == 2 + 0 + 1 + 1


@pytest.mark.parametrize("name", list(MOE_LAYERS))
@pytest.mark.parametrize("m", [1, 32])
def test_candidates_rules(name, m):
    s = MOE_LAYERS[name]
    cands = moe_candidates(s, m, "H200")
    assert 1 <= len(cands) <= 8
    times = [sum(c.gemm_us) for c in cands]
    assert times == sorted(times)
    for c in cands:
        assert c.config13.tile_m == c.config2.tile_m  # one work list
        for cfg, rows, kk, gated in ((c.config13, 2 * s.inter, s.hidden, True), (c.config2, s.hidden, s.inter, False)):
            assert validate_moe_config(cfg)
            assert moe_shape_problem(cfg, rows, kk, gated) is None


def test_one_pick_per_bucket():
    s = MOE_LAYERS["Qwen3-30B-A3B"]
    lo, hi = bucket_of(5)
    picks = {pick_moe_configs(m, s.num_experts, s.top_k, s.hidden, s.inter, True) for m in range(lo, hi + 1)}
    assert len(picks) == 1


def test_split_k_fills_the_sms_at_tp8_decode():
    """DeepSeek-V3 TP8 at M=1: 8 active experts x 512 gate/up rows -> few CTAs; GEMM1 splits K."""
    c = moe_candidates(MOE_LAYERS["DeepSeek-V3-TP8"], 1, "H200")[0]
    feat = c.config13.tile_n // 2
    ctas = 8 * math.ceil(256 / feat) * c.config13.split_k
    assert c.config13.split_k > 1 and ctas >= 32


def test_skewed_histogram_prefers_a_larger_token_tile():
    s = MOE_LAYERS["Qwen3-30B-A3B"]
    uniform = moe_candidates(s, 32, "H200")[0]
    skew = [0] * s.num_experts
    for i in range(8):  # every token picks the same 8 experts: 32 pairs each
        skew[i] = 32
    hot = moe_candidates(s, 32, "H200", histogram=skew)[0]
    assert uniform.config13.tile_m == 8 and hot.config13.tile_m == 32
