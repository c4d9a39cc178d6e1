"""tests/vllm_engine: a real vLLM engine (CPU build) serving tiny ModelOpt exports through nvgemm's plugin.

Every test module here starts with ``pytest.importorskip("vllm")``: the main suite (no vLLM) skips
them; ``.ci/vllm_e2e`` runs them in their own environment and fails if any was skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent

#: The CPU engine's environment (checked on a 2-core machine): 1 GiB KV cache, one OpenMP thread per
#: tensor-parallel rank, and nvgemm's opt-in.
ENGINE_ENV = {
    "NVGEMM_VLLM": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "0|1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in the script's process (one import less)
}

#: Tiny exports: Llama-style, hidden 128, 4 heads (2 KV), 2 layers. intermediate_size 224 makes the
#: per-rank K of down_proj 112 at TP=2 (a multiple of 16, not of 32) and gate_up per-rank N 2 x 112.
TINY = dict(intermediate_size=224)


def make_checkpoints(root: Path) -> dict[str, Path]:
    from nvgemm.testing import build_tiny_model, quantize_and_export

    out = {}
    for algo in ("NVFP4", "W4A16_NVFP4"):
        out[algo] = quantize_and_export(build_tiny_model("llama", 0, **TINY), root / algo, algo, 0)
    out["MIXED_PRECISION"] = make_mixed(out["NVFP4"], out["W4A16_NVFP4"], root / "MIXED_PRECISION")
    return out


def make_mixed(w4a4: Path, w4a16: Path, dst: Path) -> Path:
    """A ModelOpt MIXED_PRECISION export: layer 0 NVFP4 (W4A4), layer 1 W4A16_NVFP4, built from the
    two ModelOpt exports of the same model (ModelOpt's own tensors, per-layer quantized_layers map)."""
    import shutil

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


def serve(ckpt: Path, tp: int, work: Path) -> tuple[list, Path, str]:
    """Run tests/vllm_engine/_serve.py; returns (results, dump folder, engine log)."""
    tag = f"{ckpt.name}_tp{tp}"
    dump, out = work / f"dump_{tag}", work / f"{tag}.json"
    env = dict(os.environ, **ENGINE_ENV, NVGEMM_VLLM_DUMP=str(dump))
    proc = subprocess.run([sys.executable, str(HERE / "_serve.py"), str(ckpt), str(tp), str(out)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    (work / f"{tag}.log").write_text(proc.stdout)
    if proc.returncode != 0:
        raise AssertionError(f"vLLM ({tag}) failed with exit code {proc.returncode}:\n{proc.stdout[-6000:]}")
    return json.loads(out.read_text()), dump, proc.stdout


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    return make_checkpoints(tmp_path_factory.mktemp("ckpts"))


@pytest.fixture(scope="session")
def served(checkpoints, tmp_path_factory):
    """``served(algo, tp)``: the engine's results, run once per (algo, tp) in this session."""
    work = tmp_path_factory.mktemp("vllm")
    cache: dict = {}

    def get(algo: str, tp: int):
        if (algo, tp) not in cache:
            cache[(algo, tp)] = serve(checkpoints[algo], tp, work)
        return cache[(algo, tp)]

    return get
