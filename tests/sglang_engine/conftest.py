"""tests/sglang_engine: SGLang 0.5.23's Python engine on CPU serving tiny ModelOpt exports through nvgemm's plugin.

Every test module here starts with ``pytest.importorskip("sglang")``: the main suite (no SGLang) skips
them; ``.ci/sglang_e2e`` runs them in their own environment and fails if any was skipped.

The engine runs as SGLang documents for CPU (``SGLANG_USE_CPU_ENGINE=1``, ``device="cpu"``), with
torch_native attention, one OpenMP thread per rank, and the two test-only import stubs of
``stubs/sitecustomize.py`` (SGLang's CPU kernel library and torchvision; see that file).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent

# the same stubs in this (pytest) process, which imports SGLang for the in-process tests -- only where SGLang
# is installed: the main suite (no SGLang) must not see a stubbed torchvision
if importlib.util.find_spec("sglang") is not None:
    sys.path.insert(0, str(HERE / "stubs"))
    import _sglang_test_stubs  # noqa: F401

#: The CPU engine's environment (checked on a 2-core machine).
ENGINE_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "OMP_NUM_THREADS": "1",
    "SGLANG_CPU_OMP_THREADS_BIND": "0|1",  # one core per tensor-parallel rank (else: ranks > NUMA nodes)
    "PYTHONPATH": os.pathsep.join([str(HERE / "stubs")] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
}

#: Tiny exports: Llama-style, hidden 128, 4 heads (2 KV), 2 layers. intermediate_size 256 keeps down_proj's
#: per-rank K a multiple of 32 at TP=2 (SGLang's CPU engine pads intermediate_size up to a multiple of
#: 32 * tp, which would change the checkpoint's slicing).
TINY = dict(intermediate_size=256)


def make_checkpoints(root: Path) -> dict[str, Path]:
    from _engine_reference import make_mixed
    from nvgemm.testing import build_tiny_model, quantize_and_export

    out = {}
    for algo in ("NVFP4", "W4A16_NVFP4"):
        out[algo] = quantize_and_export(build_tiny_model("llama", 0, **TINY), root / algo, algo, 0)
    out["MIXED_PRECISION"] = make_mixed(out["NVFP4"], out["W4A16_NVFP4"], root / "MIXED_PRECISION")
    out["UNEQUAL"] = make_unequal(out["NVFP4"], root / "UNEQUAL")
    return out


#: The NVFP4 export with its fused shards' scales made unequal (as in independently quantized shards;
#: ModelOpt's own exports equalize them): (tensor, factor). k_proj's and up_proj's weights and v_proj's
#: activation quantization change; the checkpoint stays a valid NVFP4 checkpoint. nvgemm's plan then is:
#: layer 0 qkv 2 GEMMs ([q, k] per-column alpha, [v] its own input_scale), layer 0 gate_up 1 GEMM with
#: per-column alpha, layer 1 gate_up 2 GEMMs (unequal input_scale), layer 1 qkv unchanged (1 GEMM, scalar).
UNEQUAL_SCALES = {
    "model.layers.0.self_attn.k_proj.weight_scale_2": 2.0,
    "model.layers.0.self_attn.v_proj.input_scale": 1.5,
    "model.layers.0.mlp.up_proj.weight_scale_2": 0.5,
    "model.layers.1.mlp.up_proj.input_scale": 1.25,
}


def make_unequal(w4a4: Path, dst: Path) -> Path:
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(w4a4, dst, dirs_exist_ok=True)
    t = load_file(str(w4a4 / "model.safetensors"))
    for key, factor in UNEQUAL_SCALES.items():
        t[key] = (t[key].float() * factor).to(t[key].dtype)
    save_file(t, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def serve(ckpt: Path, tp: int, work: Path, tag: str | None = None, env: dict | None = None,
          expect_failure: bool = False, ep: bool = False) -> tuple[list | None, Path, str]:
    """Run tests/sglang_engine/_serve.py; returns (results, dump folder, engine log). ``ep``: expert
    parallelism over the ``tp`` ranks."""
    tag = tag or f"{ckpt.name}_tp{tp}{'_ep' if ep else ''}"
    dump, out = work / f"dump_{tag}", work / f"{tag}.json"
    full = dict(os.environ, **ENGINE_ENV, NVGEMM_SGLANG="1", NVGEMM_SGLANG_DUMP=str(dump))
    full.update(env or {})
    full = {k: v for k, v in full.items() if v is not None}
    proc = subprocess.run([sys.executable, str(HERE / "_serve.py"), str(ckpt), str(tp), str(out)] + (["ep"] if ep else []),
                          env=full,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    (work / f"{tag}.log").write_text(proc.stdout)
    if expect_failure:
        return None, dump, f"exit code {proc.returncode}\n{proc.stdout}"
    if proc.returncode != 0:
        raise AssertionError(f"SGLang ({tag}) failed with exit code {proc.returncode}:\n{proc.stdout[-6000:]}")
    return json.loads(out.read_text()), dump, proc.stdout


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    return make_checkpoints(tmp_path_factory.mktemp("ckpts"))


@pytest.fixture(scope="session")
def served(checkpoints, tmp_path_factory):
    """``served(name, tp)``: the engine's results, run once per (name, tp) in this session."""
    work = tmp_path_factory.mktemp("sglang")
    cache: dict = {}

    def get(name: str, tp: int):
        if (name, tp) not in cache:
            cache[(name, tp)] = serve(checkpoints[name], tp, work)
        return cache[(name, tp)]

    get.work = work
    return get


#: Tiny ModelOpt MoE export (tests/_engine_reference.MOE_CONFIGS: Qwen3-MoE, hidden 128, 8 routed experts
#: top-2, expert I = 64, i.e. 32 per rank at TP=2: a multiple of 16, and of 32 so SGLang's CPU engine pads
#: nothing; routers with spread-out weights so routing is not a tie). NVFP4 only, to keep the stage short:
#: W4A16_NVFP4 experts take the same code path with ``weight_only`` set and are checked in process, through
#: SGLang's own expert loader (test_sglang_moe_method.py).
MOE_ALGOS = ("NVFP4",)


@pytest.fixture(scope="session")
def moe_checkpoints(tmp_path_factory):
    from _engine_reference import build_moe_model
    from nvgemm.testing import quantize_and_export

    root = tmp_path_factory.mktemp("moe")
    return {f"qwen3_moe-{algo}": quantize_and_export(build_moe_model("qwen3_moe"), root / f"qwen3_moe-{algo}", algo, 0)
            for algo in MOE_ALGOS}


@pytest.fixture(scope="session")
def moe_served(moe_checkpoints, tmp_path_factory):
    """``moe_served(name, tp, ep=False)``: the engine's results for a tiny MoE export, run once per (name, tp, ep)
    in this session (``ep``: expert parallelism over the ``tp`` ranks, SGLang's ``ep_size``)."""
    work = tmp_path_factory.mktemp("sglang_moe")
    cache: dict = {}

    def get(name: str, tp: int, ep: bool = False):
        if (name, tp, ep) not in cache:
            cache[(name, tp, ep)] = serve(moe_checkpoints[name], tp, work, ep=ep)
        return cache[(name, tp, ep)]

    get.work = work
    return get
