"""vLLM's torch.compile with nvgemm's fused requant pass named in the compilation config
(``inductor_passes={"post_grad_custom_pre_pass": "nvgemm.fused_requant_pass"}``, vLLM's public way to add an
Inductor pass): every W4A4 gated MLP of the served model (``gate_up_proj`` -> vLLM's ``SiluAndMul`` native
forward ``silu(h[..., :I]) * h[..., I:]`` -> ``down_proj``) is rewritten to ``nvfp4_linear_requant ->
nvfp4_linear_prequant``, and the engine's log-probabilities stay within the W4A4 end-to-end tolerance of the
eager engine's.

Why a pass and not the plugin's linear method: vLLM's ``LinearMethodBase.apply`` sees one layer at a time,
and the activation between gate_up_proj and down_proj is a separate module (``SiluAndMul``); no public vLLM
extension point sees both layers, but the compiled graph does.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("vllm")

from conftest import compiled_facts, serve  # noqa: E402
from test_vllm_e2e import LOGPROB_TOL, common_steps_diff  # noqa: E402

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

