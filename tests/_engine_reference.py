"""What the engine end-to-end stages (``tests/vllm_engine``, ``tests/sglang_engine``) check a served model
against, shared by both: the tiny MIXED_PRECISION export built from two ModelOpt exports, each dumped linear
call's checkpoint math in fp64 (sliced the way tensor parallelism must slice it), and the log-probability
comparisons with nvgemm's own model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from nvgemm.core.formats import dequantize, quantize_activation

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
