"""Foundation benchmarks (CPU): weight quantization speed and checkpoint-loading peak memory.

    python bench/bench_formats.py [--size 8192] [--out bench/results/formats_cpu.md]

1. Quantize an NxN bf16 weight with nvgemm's ModelOpt-exact recipe (goal: 8192x8192 in <= 2 s).
2. Load a synthetic Llama-shaped NVFP4 checkpoint (hidden 4096, intermediate 14336, one layer,
   vocab 32000) in a fresh process and measure the peak resident memory above the loaded
   model keeps resident (goal: no more than two full-size fp32 temporaries of the largest layer).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HIDDEN, INTER, VOCAB = 4096, 14336, 32000


def bench_quantize(size: int, repeats: int) -> dict:
    from nvgemm.core.formats import quantize_weight

    w = torch.randn(size, size).to(torch.bfloat16)
    quantize_weight(w[:256])  # warm-up (lookup tables, allocator)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        quantize_weight(w)
        times.append(time.perf_counter() - t0)
    return {"size": size, "median_s": statistics.median(times), "min_s": min(times), "repeats": repeats,
            "threads": torch.get_num_threads()}


def write_synthetic_checkpoint(folder: Path) -> None:
    from safetensors.torch import save_file

    from nvgemm.core.formats import blocked_numel  # noqa: F401  (import check)

    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTER, "num_hidden_layers": 1, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": VOCAB, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head"]},
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": {
        "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"], "kv_cache_quant_algo": None}}))
    sd = {
        "model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN).to(torch.bfloat16),
        "lm_head.weight": torch.randn(VOCAB, HIDDEN).to(torch.bfloat16),
        "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        "model.layers.0.post_attention_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
    }
    kv = HIDDEN // 32 * 8
    shapes = {"self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (kv, HIDDEN), "self_attn.v_proj": (kv, HIDDEN),
              "self_attn.o_proj": (HIDDEN, HIDDEN), "mlp.gate_proj": (INTER, HIDDEN), "mlp.up_proj": (INTER, HIDDEN),
              "mlp.down_proj": (HIDDEN, INTER)}
    for name, (n, k) in shapes.items():
        p = f"model.layers.0.{name}"
        sd[f"{p}.weight"] = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
        sd[f"{p}.weight_scale"] = (torch.rand(n, k // 16) * 400 + 1).to(torch.float8_e4m3fn)
        sd[f"{p}.weight_scale_2"] = torch.tensor(1e-3)
        sd[f"{p}.input_scale"] = torch.tensor(1e-2)
    save_file(sd, str(folder / "model.safetensors"))


_CHILD = r"""
import sys, torch, transformers, accelerate, safetensors
import nvgemm, nvgemm.integrations.modelopt
def rss(k):
    for line in open('/proc/self/status'):
        if line.startswith(k): return int(line.split()[1]) * 1024
base = rss('VmRSS:')
m = nvgemm.load_modelopt_checkpoint(sys.argv[1])
size = sum(t.numel() * t.element_size() for t in list(m.parameters()) + list(m.buffers()))
print(base, rss('VmHWM:'), rss('VmRSS:'), size)
"""


def bench_load() -> dict:
    with tempfile.TemporaryDirectory() as d:
        write_synthetic_checkpoint(Path(d))
        out = subprocess.run([sys.executable, "-c", _CHILD, d], check=True, capture_output=True, text=True).stdout
    base, peak, final, model_bytes = map(int, out.split()[-4:])
    largest_fp32 = INTER * HIDDEN * 4
    # transient memory: the high-water mark during loading minus what the loaded model keeps
    # resident right after (safetensors maps the file, so untouched pages are not counted in either)
    over = max(peak - final, 0)
    return {"model_bytes": model_bytes, "peak_above_base": peak - base, "peak_above_model": over,
            "largest_layer_fp32_bytes": largest_fp32, "ratio_to_largest_fp32": over / largest_fp32}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="write a markdown result file")
    args = ap.parse_args()
    q = bench_quantize(args.size, args.repeats)
    ld = bench_load()
    mib = 2**20
    lines = [
        "# Foundation benchmarks (CPU)", "",
        f"- date: {datetime.date.today()}  machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__} ({q['threads']} threads)",
        f"- command: `python bench/bench_formats.py --size {args.size} --repeats {args.repeats}`", "",
        "| what | measured | goal |", "|---|---|---|",
        f"| quantize {args.size}x{args.size} bf16 (ModelOpt recipe), median of {args.repeats} | "
        f"{q['median_s']:.2f} s (min {q['min_s']:.2f} s) | <= 2 s |",
        f"| load synthetic Llama layer (hidden {HIDDEN}, inter {INTER}): transient peak RSS (high-water mark minus RSS after load) | "
        f"{ld['peak_above_model'] / mib:.0f} MiB = {ld['ratio_to_largest_fp32']:.2f} x largest layer's fp32 "
        f"({ld['largest_layer_fp32_bytes'] / mib:.0f} MiB) | <= 2 x |",
        f"| loaded model size | {ld['model_bytes'] / mib:.0f} MiB | |",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
