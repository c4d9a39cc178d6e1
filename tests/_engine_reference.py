"""What the engine end-to-end stages (``tests/vllm_engine``, ``tests/sglang_engine``) check a served model
against, shared by both: the tiny MIXED_PRECISION export built from two ModelOpt exports, the tiny MoE
models, each dumped linear call's checkpoint math in fp64 and each dumped MoE call's expert operands (both
sliced the way tensor / expert parallelism must slice them), and the log-probability comparisons with
nvgemm's own model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from nvgemm.core.formats import dequantize, quantize_activation, to_blocked

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
ROW_PARALLEL = ("o_proj", "down_proj")
LAYERS = [f"model.layers.{i}.{m}" for i in range(2)
          for m in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")]

# Per call: the plugin's GEMM and this reference decode the same codes and scales and differ by the
# fp32 summation order (<= K * 2^-24 of sum |a*b|) and one bf16 rounding of the output (<= 2^-9
# relative; 2^-8 allowed). A wrongly sliced shard, scale or layout is off by O(1).
BF16_REL = 2.0**-8


def make_mixed(w4a4: Path, w4a16: Path, dst: Path) -> Path:
    """A ModelOpt MIXED_PRECISION export: layer 0 NVFP4 (W4A4), layer 1 W4A16_NVFP4, built from the
    two ModelOpt exports of the same model (ModelOpt's own tensors, per-layer quantized_layers map)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(w4a4, dst, dirs_exist_ok=True)
    a, b = load_file(str(w4a4 / "model.safetensors")), load_file(str(w4a16 / "model.safetensors"))
    merged = {k: v for k, v in a.items() if not k.startswith("model.layers.1.")}
    merged.update({k: v for k, v in b.items() if k.startswith("model.layers.1.")})
    save_file(merged, str(dst / "model.safetensors"), metadata={"format": "pt"})
    layers = {}
    for key in merged:
        if key.endswith(".weight_scale"):
            name = key[: -len(".weight_scale")]
            layers[name] = {"quant_algo": "W4A16_NVFP4" if name.startswith("model.layers.1.") else "NVFP4",
                            "group_size": 16}
    hfq = json.loads((dst / "hf_quant_config.json").read_text())
    hfq["quantization"].update(quant_algo="MIXED_PRECISION", quantized_layers=layers)
    (dst / "hf_quant_config.json").write_text(json.dumps(hfq, indent=1))
    cfg = json.loads((dst / "config.json").read_text())
    qc = cfg["quantization_config"]
    qc.pop("config_groups", None)
    qc.update(quant_algo="MIXED_PRECISION", quantized_layers=layers)
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    return dst


def shard_tensors(ckpt_tensors: dict, layer: str, rank: int, tp: int):
    """[(packed, linear scale, weight_scale_2, input_scale|None)] of each shard of ``layer`` on ``rank``."""
    base, proj = layer.rsplit(".", 1)
    out = []
    for name in FUSED.get(proj, (proj,)):
        p = f"{base}.{name}"
        w, s = ckpt_tensors[f"{p}.weight"], ckpt_tensors[f"{p}.weight_scale"]
        if proj in ROW_PARALLEL:  # K split across ranks
            kr = w.shape[1] * 2 // tp
            w, s = w[:, rank * kr // 2:(rank + 1) * kr // 2], s[:, rank * kr // 16:(rank + 1) * kr // 16]
        else:  # N split across ranks, shard by shard (2 KV heads over 2 ranks: no replication)
            w, s = w.chunk(tp)[rank], s.chunk(tp)[rank]
        ins = ckpt_tensors.get(f"{p}.input_scale")
        out.append((w, s, ckpt_tensors[f"{p}.weight_scale_2"].float(), None if ins is None else ins.float()))
    return out


def reference_call(x: torch.Tensor, shards) -> tuple[torch.Tensor, torch.Tensor]:
    """The checkpoint's math, fp64: per shard deq(q(x, input_scale)) @ deq(W).T * input_scale * weight_scale_2."""
    x2 = x.reshape(-1, x.shape[-1])
    ys, mags = [], []
    for w, s, ws2, ins in shards:
        a = x2.double() if ins is None else dequantize(*quantize_activation(x2, ins.reshape(()))).double()
        wd = dequantize(w, s).double()
        alpha = ws2.double() * (1.0 if ins is None else ins.double())
        ys.append((a @ wd.t()) * alpha)
        mags.append((a.abs() @ wd.abs().t()) * alpha.abs())
    return torch.cat(ys, -1), torch.cat(mags, -1)


def nvgemm_logprobs(ckpt: Path, results: list) -> list[torch.Tensor]:
    """nvgemm's own model (its ModelOpt loader + transformers), teacher-forced on the engine's tokens."""
    from nvgemm.integrations.modelopt import load_modelopt_checkpoint

    model = load_modelopt_checkpoint(ckpt)
    out = []
    with torch.no_grad():
        for r in results:
            ids = torch.tensor([r["prompt"] + r["token_ids"]])
            out.append(torch.log_softmax(model(input_ids=ids).logits[0].float(), -1))
    return out


def max_logprob_diff(results: list, lps: list[torch.Tensor]) -> float:
    """Max |engine logprob - nvgemm's model logprob| over every step's returned top tokens."""
    worst = 0.0
    for r, lp in zip(results, lps):
        p = len(r["prompt"])
        for t, step in enumerate(r["logprobs"]):
            for tok, v in step.items():
                worst = max(worst, abs(v - float(lp[p - 1 + t, int(tok)])))
    return worst


def common_steps_diff(a: list, b: list) -> tuple[float, int]:
    """Max |logprob difference| over the steps where both runs had generated the same prefix."""
    worst, steps = 0.0, 0
    for ra, rb in zip(a, b):
        for t, (sa, sb) in enumerate(zip(ra["logprobs"], rb["logprobs"])):
            if ra["token_ids"][:t] != rb["token_ids"][:t]:
                break
            for tok in set(sa) & set(sb):
                worst = max(worst, abs(sa[tok] - sb[tok]))
            steps += 1
    return worst, steps


#: Tiny MoE exports for the engines' CPU runs: hidden 128, 8 routed experts top-2, expert I = 64 (32 per rank
#: at TP=2, a multiple of 16). DeepSeek-V3: layer 0 dense, layer 1 MoE with one shared expert, grouped
#: sigmoid routing with correction bias and routed_scaling_factor 2.5; vLLM's CPU MLA kernel only
#: compiles kv_lora_rank + qk_rope_head_dim = 576, hence 512 + 64.
MOE_CONFIGS = {
    "qwen3_moe": dict(
        model_type="qwen3_moe", arch="Qwen3MoeForCausalLM", vocab_size=512, hidden_size=128, intermediate_size=256,
        moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=256,
        tie_word_embeddings=False),
    "deepseek_v3": dict(
        model_type="deepseek_v3", arch="DeepseekV3ForCausalLM", vocab_size=512, hidden_size=128,
        intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=2, first_k_dense_replace=1,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
        n_group=2, topk_group=1, routed_scaling_factor=2.5, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=32,
        qk_rope_head_dim=64, v_head_dim=32, max_position_embeddings=256, tie_word_embeddings=False,
        # the keys DeepSeek-V3's own config.json has (vLLM creates e_score_correction_bias only for noaux_tc)
        topk_method="noaux_tc", scoring_func="sigmoid"),
}


def build_moe_model(kind: str, seed: int = 0):
    """A random tiny MoE causal LM (bf16, eval, eager experts so ModelOpt can quantize them); routers and
    the DeepSeek correction bias get spread-out values so routing is not a tie."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(MOE_CONFIGS[kind])
    model_type, arch = spec.pop("model_type"), spec.pop("arch")
    config = AutoConfig.for_model(model_type, **spec)
    config.architectures = [arch]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, experts_implementation="eager").eval()
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith("e_score_correction_bias"):
                p.normal_(0, 0.1)
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0, 0.5)
    return model


def expert_tensors(t: dict, layer: str, rank: int, tp: int, expert_map=None):
    """The op's stacked tensors for ``layer`` on ``rank``, from the checkpoint's per-expert tensors: every
    expert's gate/up rows and down_proj K sliced by tensor-parallel rank, or (expert parallelism) the
    unsliced experts ``expert_map`` places on this rank, in local-slot order."""
    e = 0
    while f"{layer}.{e}.down_proj.weight" in t:
        e += 1
    experts = list(range(e))
    if expert_map is not None:
        local = {int(l): g for g, l in enumerate(expert_map.tolist()) if l >= 0}
        experts = [local[j] for j in range(len(local))]
    w13, s13, g13, i13, w2, s2, g2, i2 = ([] for _ in range(8))
    for x in experts:
        p = f"{layer}.{x}"
        gw, uw = t[f"{p}.gate_proj.weight"].chunk(tp)[rank], t[f"{p}.up_proj.weight"].chunk(tp)[rank]
        gs, us = t[f"{p}.gate_proj.weight_scale"].chunk(tp)[rank], t[f"{p}.up_proj.weight_scale"].chunk(tp)[rank]
        w13.append(torch.cat([gw, uw]))
        s13.append(to_blocked(torch.cat([gs, us])))
        gg, ug = t[f"{p}.gate_proj.weight_scale_2"].float(), t[f"{p}.up_proj.weight_scale_2"].float()
        g13.append(torch.cat([gg.expand(gw.shape[0]), ug.expand(uw.shape[0])]))
        dw, ds = t[f"{p}.down_proj.weight"], t[f"{p}.down_proj.weight_scale"]
        kr = dw.shape[1] * 2 // tp  # down_proj K split across ranks
        w2.append(dw[:, rank * kr // 2:(rank + 1) * kr // 2].contiguous())
        s2.append(to_blocked(ds[:, rank * kr // 16:(rank + 1) * kr // 16].contiguous()))
        g2.append(t[f"{p}.down_proj.weight_scale_2"].float().reshape(()))
        if f"{p}.gate_proj.input_scale" in t:
            assert torch.equal(t[f"{p}.gate_proj.input_scale"], t[f"{p}.up_proj.input_scale"])
            i13.append(t[f"{p}.gate_proj.input_scale"].float().reshape(()))
            i2.append(t[f"{p}.down_proj.input_scale"].float().reshape(()))
    g13 = torch.stack(g13)
    if bool((g13 == g13[:, :1]).all()):
        g13 = g13[:, 0].contiguous()  # equal gate/up scales: the per-expert scalar (same values)
    return (torch.stack(w13), torch.stack(s13), g13, torch.stack(i13) if i13 else None, torch.stack(w2),
            torch.stack(s2), torch.stack(g2), torch.stack(i2) if i2 else None)


def moe_checkpoint(seed: int, experts: int, hidden: int, inter: int, weight_only: bool = False) -> dict:
    """Per-expert ModelOpt-style tensors ``{(expert, "w1"|"w3"|"w2"): {weight, weight_scale, weight_scale_2[,
    input_scale]}}`` with unequal gate/up weight_scale_2 and per-expert input scales (for the in-process
    MoE method tests: each engine's own expert loader fills nvgemm's parameters from them)."""
    from nvgemm.core.formats import quantize_weight

    g = torch.Generator().manual_seed(seed)
    ck = {}
    for x in range(experts):
        for name, rows, k in (("w1", inter, hidden), ("w3", inter, hidden), ("w2", hidden, inter)):
            q = quantize_weight(torch.randn(rows, k, generator=g) * (1.0 + 0.5 * (name == "w3")))
            ck[x, name] = dict(weight=q.packed, weight_scale=q.scale, weight_scale_2=q.global_scale.reshape(()))
            if not weight_only:
                ins = torch.tensor((1.0 + 0.25 * x) / 448 if name != "w2" else (0.5 + 0.1 * x) / 448)
                ck[x, name]["input_scale"] = ins
    return ck


def moe_fp64_reference(ck: dict, x_in: torch.Tensor, ids: torch.Tensor, wts: torch.Tensor, experts) -> torch.Tensor:
    """The checkpoint's MoE math in fp64 per token and slot over the global expert ids ``ids`` that are in
    ``experts`` (the rank's): silu(gate) * up rounded to bf16 (the op's one intermediate rounding), down."""
    out = torch.zeros(x_in.shape, dtype=torch.float64)
    for t in range(x_in.shape[0]):
        for s in range(ids.shape[1]):
            g = int(ids[t, s])
            if g not in experts:
                continue

            def lin(a, name):
                c = ck[g, name]
                ins = c.get("input_scale")
                aq = a.double() if ins is None else dequantize(*quantize_activation(a, ins)).double()
                w = dequantize(c["weight"], c["weight_scale"]).double()
                return (aq @ w.t()) * c["weight_scale_2"].double() * (1.0 if ins is None else ins.double())

            xt = x_in[t:t + 1]
            h = (torch.nn.functional.silu(lin(xt, "w1")) * lin(xt, "w3")).to(torch.bfloat16)
            out[t] += float(wts[t, s]) * lin(h, "w2")[0]
    return out
