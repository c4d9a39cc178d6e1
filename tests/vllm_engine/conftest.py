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
    from _engine_reference import make_mixed
    from nvgemm.testing import build_tiny_model, quantize_and_export

    out = {}
    for algo in ("NVFP4", "W4A16_NVFP4"):
        out[algo] = quantize_and_export(build_tiny_model("llama", 0, **TINY), root / algo, algo, 0)
    out["MIXED_PRECISION"] = make_mixed(out["NVFP4"], out["W4A16_NVFP4"], root / "MIXED_PRECISION")
    return out


def make_moe_checkpoints(root: Path) -> dict[str, Path]:
    from _engine_reference import MOE_CONFIGS, build_moe_model
    from nvgemm.testing import quantize_and_export

    out = {}
    for kind, algo in MOE_CASES:
        model = build_moe_model(kind)
        out[f"{kind}-{algo}"] = ckpt = quantize_and_export(model, root / f"{kind}-{algo}", algo, 0)
        cfg = json.loads((ckpt / "config.json").read_text())
        extra = {k: v for k, v in MOE_CONFIGS[kind].items() if k in ("topk_method", "scoring_func")}
        if extra:  # transformers does not write keys its config class does not know; vLLM reads them
            cfg.update(extra)
            (ckpt / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


MOE_CASES = [("qwen3_moe", "NVFP4"), ("qwen3_moe", "W4A16_NVFP4"), ("deepseek_v3", "NVFP4")]


def serve(ckpt: Path, tp: int, work: Path, ep: bool = False, compiled: bool = False, backend: str = "",
          short: bool = False) -> tuple[list, Path, str]:
    """Run tests/vllm_engine/_serve.py; returns (results, dump folder, engine log). ``compiled``: vLLM's
    torch.compile with nvgemm's fused requant pass (the plugin dumps eager calls only). ``backend``: forced
    for every nvgemm linear call (``NVGEMM_BACKEND``, e.g. an emulator backend); ``short``: one prompt,
    a few tokens (``_serve.py short``)."""
    tag = (f"{ckpt.name}_tp{tp}{'_ep' if ep else ''}{'_compiled' if compiled else ''}"
           f"{'_' + backend if backend else ''}{'_short' if short else ''}")
    dump, out = work / f"dump_{tag}", work / f"{tag}.json"
    env = dict(os.environ, **ENGINE_ENV, NVGEMM_VLLM_DUMP=str(dump))
    if backend:
        env["NVGEMM_BACKEND"] = backend
    if compiled:  # compile every time, into this run's own caches: a cached graph would skip the pass under test
        env["VLLM_DISABLE_COMPILE_CACHE"] = "1"
        env["TORCHINDUCTOR_CACHE_DIR"] = str(work / f"inductor_{tag}")
    flags = (["ep"] if ep else []) + (["compile"] if compiled else []) + (["short"] if short else [])
    proc = subprocess.run([sys.executable, str(HERE / "_serve.py"), str(ckpt), str(tp), str(out), *flags],
                          env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    (work / f"{tag}.log").write_text(proc.stdout)
    if proc.returncode != 0:
        raise AssertionError(f"vLLM ({tag}) failed with exit code {proc.returncode}:\n{proc.stdout[-6000:]}")
    return json.loads(out.read_text()), dump, proc.stdout


def compiled_facts(work: Path) -> tuple[dict, str]:
    """After ``serve(..., compiled=True)`` in ``work``: nvgemm's Inductor counters in the engine process
    (``_serve.py`` writes them) and the Python code Inductor generated for the compiled graphs (in the run's
    own Inductor cache, written there on a compile and on a cache hit alike)."""
    (counters_file,) = work.glob("*_compiled.json.counters")
    code = "\n".join(p.read_text() for d in work.glob("inductor_*_compiled") for p in sorted(d.rglob("*.py")))
    return json.loads(counters_file.read_text()), code


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    return make_checkpoints(tmp_path_factory.mktemp("ckpts"))


def _cached_serve(ckpts: dict, work: Path):
    """``get(name, tp, ep=False)``: the engine's results, served once per (name, tp, ep) in this session."""
    cache: dict = {}

    def get(name: str, tp: int, ep: bool = False):
        if (name, tp, ep) not in cache:
            cache[(name, tp, ep)] = serve(ckpts[name], tp, work, ep)
        return cache[(name, tp, ep)]

    return get


@pytest.fixture(scope="session")
def served(checkpoints, tmp_path_factory):
    """``served(algo, tp)``: the engine's results, run once per (algo, tp) in this session."""
    return _cached_serve(checkpoints, tmp_path_factory.mktemp("vllm"))


@pytest.fixture(scope="session")
def moe_checkpoints(tmp_path_factory):
    return make_moe_checkpoints(tmp_path_factory.mktemp("moe_ckpts"))


@pytest.fixture(scope="session")
def moe_served(moe_checkpoints, tmp_path_factory):
    """``moe_served(name, tp, ep)``: the engine's results for a tiny MoE export, run once per (name, tp, ep)."""
    return _cached_serve(moe_checkpoints, tmp_path_factory.mktemp("vllm_moe"))
