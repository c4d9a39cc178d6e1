"""vLLM's torch.compile with nvgemm's fused requant pass named in the compilation config
(``inductor_passes={"post_grad_custom_pre_pass": "nvgemm.fused_requant_pass"}``, vLLM's public way to add an
Inductor pass): every W4A4 gated MLP of the served model (``gate_up_proj`` -> vLLM's ``SiluAndMul`` native
forward ``silu(h[..., :I]) * h[..., I:]`` -> ``down_proj``) is rewritten to ``nvfp4_linear_requant ->
nvfp4_linear_prequant``, and the engine's log-probabilities stay within the W4A4 end-to-end tolerance of the
eager engine's. vLLM's compile-cache key, and the pass uuid Inductor's FX-graph cache keys on, change when
the pass is switched on and when nvgemm's rewrite changes (``nvgemm.integrations.requant_pass``).

Why a pass and not the plugin's linear method: vLLM's ``LinearMethodBase.apply`` sees one layer at a time,
and the activation between gate_up_proj and down_proj is a separate module (``SiluAndMul``); no public vLLM
extension point sees both layers, but the compiled graph does.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from conftest import compiled_facts, serve  # noqa: E402
from _engine_reference import common_steps_diff  # noqa: E402
from test_vllm_e2e import LOGPROB_TOL  # noqa: E402

pytestmark = pytest.mark.vllm


def test_compiled_engine_runs_the_fused_requant_chain(checkpoints, served, tmp_path_factory):
    work = tmp_path_factory.mktemp("vllm_compiled")
    results, _, log = serve(checkpoints["NVFP4"], 1, work, compiled=True)
    # the rewrite, from the engine process's nvgemm counters and from the compiled graphs' code (what ran)
    counters, code = compiled_facts(work)
    assert counters.get("requant_fused", 0) >= 2, (counters, log[-4000:])  # both layers' gate_up -> down
    assert code.count("torch.ops.nvgemm.nvfp4_linear_requant.default(") >= 2, code[-4000:]
    assert code.count("torch.ops.nvgemm.nvfp4_linear_prequant.default(") >= 2, code[-4000:]
    counts = [int(n) for n in re.findall(r"fused requant pass: (\d+) gated MLPs? rewritten", log)]
    assert sum(counts) == counters["requant_fused"], log[-4000:]
    assert all(len(r["token_ids"]) == 4 for r in results)
    # Same weights and kernels (emulated); the fused chain rounds h once where SiluAndMul rounds gate/up,
    # silu and the product, and down re-quantizes h to FP4 (a 1-ulp move can flip one code): the W4A4
    # end-to-end bound of test_vllm_e2e (measured here: see the printed value).
    diff, steps = common_steps_diff(served("NVFP4", 1)[0], results)
    print(f"compiled + fused requant vs eager: max |logprob diff| = {diff:.4g} over {steps} steps")
    assert steps >= 2 and diff <= LOGPROB_TOL["NVFP4"]


_KEYS = """
import json, nvgemm
from vllm.config import CompilationConfig
on = CompilationConfig(inductor_passes={"post_grad_custom_pre_pass": "nvgemm.fused_requant_pass"})
print(json.dumps({"file": nvgemm.__file__, "off": CompilationConfig().compute_hash(), "on": on.compute_hash(),
                  "uuid": on.inductor_compile_config["post_grad_custom_pre_pass"].uuid()}))
"""


def _vllm_keys(src_root: Path) -> dict:
    """vLLM's compile-cache key (``CompilationConfig.compute_hash``) with the pass off and on, and the uuid
    vLLM gives the pass (the one Inductor's FX-graph cache key takes), for the nvgemm under ``src_root``."""
    proc = subprocess.run([sys.executable, "-c", _KEYS], env=dict(os.environ, PYTHONPATH=str(src_root)),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    keys = json.loads(proc.stdout.strip().splitlines()[-1])
    assert keys["file"].startswith(str(src_root)), keys
    return keys


def test_vllm_compile_cache_key_follows_the_pass(tmp_path):
    """Through vLLM's real key: a graph compiled with the pass off is not reused with it on, and one compiled
    by an nvgemm whose rewrite changed is not reused by the new one."""
    import nvgemm

    copy = tmp_path / "src"
    shutil.copytree(Path(nvgemm.__file__).parent, copy / "nvgemm", ignore=shutil.ignore_patterns("__pycache__"))
    old = _vllm_keys(copy)
    assert old["off"] != old["on"]
    # vLLM's uuid for the pass is the sha256 of its source text, which names nvgemm's identity (the copy has the
    # same sources, so the same identity as this process's nvgemm)
    assert old["uuid"] == hashlib.sha256(inspect.getsource(nvgemm.fused_requant_pass).encode()).hexdigest()
    with open(copy / "nvgemm" / "integrations" / "inductor" / "requant.py", "a") as f:
        f.write("\n# a changed rewrite\n")
    new = _vllm_keys(copy)
    assert new["off"] == old["off"]  # the pass is the only thing that changed
    assert new["uuid"] != old["uuid"] and new["on"] != old["on"]
