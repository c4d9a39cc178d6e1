"""`nvgemm plan` MoE presets: routing statistics against a simulation, bytes against the brief's arithmetic."""

from __future__ import annotations

import json
import math

import pytest
import torch

from nvgemm import cli
from nvgemm.heuristics.presets import MOE_PRESETS, get_moe_preset


@pytest.mark.parametrize("name,m", [("Qwen3-30B-A3B", 8), ("DeepSeek-V3", 32), ("Mixtral-8x7B", 3), ("Llama-4-Scout", 16)])
def test_active_experts_match_a_routing_simulation(name, m):
    """A(M) = E (1 - (1 - k/E)^M) against sampled uniform routing (k distinct experts per token):
    600 trials, mean within 5 standard errors."""
    p = get_moe_preset(name)
    g = torch.Generator().manual_seed(0)
    trials = 600
    counts = torch.empty(trials)
    for t in range(trials):
        ids = torch.rand(m, p.num_experts, generator=g).argsort(dim=1)[:, : p.top_k]
        counts[t] = ids.unique().numel()
    se = counts.std().item() / math.sqrt(trials)
    assert abs(counts.mean().item() - p.active_experts(m)) <= 5 * se + 1e-9
    assert p.tokens_per_active_expert(m) == pytest.approx(m * p.top_k / p.active_experts(m))


def test_bytes_match_the_brief():
    """moe_nvfp4.md 5.2 (arithmetic): DeepSeek-V3 24.8 MB per expert, 223 MB at M=1 (8 routed + 1 shared);
    Qwen3-30B-A3B 2.65 MB per expert, 21 MB at M=1; Mixtral 99.1 MB per expert."""
    ds, qw, mx = get_moe_preset("DeepSeek-V3"), get_moe_preset("qwen3-30b-a3b"), get_moe_preset("mixtral")
    assert ds.expert_bytes() / 1e6 == pytest.approx(24.8, abs=0.05)
    assert (ds.active_experts(1) * ds.expert_bytes() + ds.shared_bytes()) / 1e6 == pytest.approx(223, abs=1)
    assert qw.expert_bytes() / 1e6 == pytest.approx(2.65, abs=0.01)
    assert mx.expert_bytes() / 1e6 == pytest.approx(99.1, abs=0.05)
    assert get_moe_preset("gpt-2") is None


@pytest.mark.parametrize("name", sorted(MOE_PRESETS))
def test_plan_moe_presets(name, capsys):
    assert cli.main(["plan", "--model", name, "--m", "1,8,128", "--json", "--no-nvmmh", "--max-candidates", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    p = MOE_PRESETS[name]
    routing = {r["m"]: r for r in out["moe_routing"]}
    for m in (1, 8, 128):
        assert routing[m]["expert_gemm_m"] == math.ceil(p.tokens_per_active_expert(m) - 1e-9)
    assert routing[1]["expert_gemm_m"] == 1 and routing[1]["active_experts"] == pytest.approx(p.top_k)
    layers = {r["layer"] for r in out["rows"]}
    assert {"expert.gate_up", "expert.down"} <= layers
    assert ("shared.gate_up" in layers) == bool(p.shared_intermediate)
    exp = [r for r in out["rows"] if r["layer"] == "expert.gate_up"]
    assert [r["n"] for r in exp] == [2 * p.expert_intermediate] * 3 and all(r["candidates"] for r in exp)
    assert f"({routing[128]['expert_gemm_m']}/expert)" in exp[-1]["m"]


def test_plan_moe_text(capsys):
    assert cli.main(["plan", "--model", "Qwen3-30B-A3B", "--gpu", "H200", "--m", "1,32", "--no-nvmmh",
                     "--max-candidates", "1"]) == 0
    out = capsys.readouterr().out
    assert "routing (128 experts, top-8, uniform)" in out and "model, not a measurement" in out
    assert "[expert.down] M=32 (3/expert) N=2048 K=768" in out


@pytest.mark.parametrize("gpu", ["RTX5090", "GB10"])
def test_plan_moe_sm120_grouped_candidates(capsys, gpu):
    """``nvgemm plan`` for a MoE preset on sm_120a / sm_121a (W4A4) lists the grouped sm120 kernels' ranked
    (GEMM1, GEMM2) pairs: the policy's order on the GPU's own profile, each modelled above the byte floor of
    the routed experts' NVFP4 weights at the GPU's peak bandwidth."""
    from nvgemm.heuristics.perfmodel import get_hardware
    from nvgemm.templates.sm100_moe.perf import expected_active_experts
    from nvgemm.templates.sm120_moe.policy import moe_candidates

    assert cli.main(["plan", "--model", "Qwen3-30B-A3B", "--gpu", gpu, "--m", "1,64", "--no-nvmmh",
                     "--max-candidates", "2"]) == 0
    out = capsys.readouterr().out
    hw = get_hardware(gpu)
    section = out.split(f"on {gpu} (sm120 grouped W4A4; times are a MODEL")[1]
    for m in (1, 64):
        block = section.split(f"  M={m} ")[1].split("\n  M=")[0]
        rows = [ln.split() for ln in block.strip().splitlines()[1:]]
        want = moe_candidates(m, 128, 8, 2048, 768, hw.arch, hw.sm_count, 2, gpu=gpu)
        assert len(rows) == len(want) == 2
        for r, ((c1, c2), _) in zip(rows, want):
            assert r[-3] == c1.name().replace("nvgemm_cutedsl_sm120_moe_", "")
            assert r[-1] == c2.name().replace("nvgemm_cutedsl_sm120_moe_", "")
            floor = expected_active_experts(m, 8, 128) * 3 * 2048 * 768 * 0.5625 / (hw.peak_bw_tbs * 1e12) * 1e6
            assert float(r[2]) > floor, (m, r, floor)
