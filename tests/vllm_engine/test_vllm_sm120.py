"""A real vLLM engine (CPU build) serves the tiny ModelOpt MIXED_PRECISION export (layer 0 NVFP4 W4A4, layer 1
W4A16 NVFP4) through nvgemm's plugin with every linear layer on the consumer-Blackwell kernels, forced by name: on
a CPU they run as their emulated twin ``emu_sm120`` (``NVGEMM_BACKEND=emu_sm120``: the real sm_120a AOT artifacts
executed by the PTX emulator behind ``nvgemm::nvfp4_linear``, the RTX 5090 device profile): W4A4 layers on
sm120_w4a4 (``cutedsl_sm120``, the activation quantizer from its sm_120a Triton PTX), W4A16 layers on the mma.sync
W4A16 kernel compiled for sm_120a (``cutedsl_mma_w4a16``). The emulator takes about a second per call, so the
engine serves one prompt, two tokens (a prefill of 8 rows and one decode step), a 16-token model length
(``_serve.py short``), at TP=1.

Checked, as for the emulated backend in test_vllm_e2e.py:
* each layer logged that emu_sm120 served it (forced), with the sm120 W4A4 or sm_120a W4A16 kernel config it ran;
* every linear call vLLM made equals the checkpoint's math (test_vllm_e2e's per-call bound);
* log-probabilities match nvgemm's own model within the MIXED_PRECISION end-to-end tolerance.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("vllm")

from _engine_reference import LAYERS, max_logprob_diff, nvgemm_logprobs  # noqa: E402
from conftest import serve  # noqa: E402
from test_vllm_e2e import LOGPROB_TOL, check_calls  # noqa: E402

pytestmark = pytest.mark.vllm

BACKEND = "emu_sm120"
ALGO = "MIXED_PRECISION"  # both sm_120 kernels in one engine run
TOKENS = 2  # _serve.py SHORT_TOKENS


@pytest.fixture(scope="module")
def served_sm120(checkpoints, tmp_path_factory):
    return serve(checkpoints[ALGO], 1, tmp_path_factory.mktemp("vllm_sm120"), backend=BACKEND, short=True)


def test_each_layer_logs_the_sm120_kernel(served_sm120):
    _, _, log = served_sm120
    lines = [line for line in log.splitlines() if "[nvgemm] nvgemm_cutedsl: vLLM layer" in line]
    for layer in LAYERS:
        mine = [line for line in lines if f"vLLM layer {layer} (" in line]
        assert len(mine) == 1, f"{layer}: {len(mine)} log lines"
        line = mine[0]
        w4a16 = ".layers.1." in layer  # the MIXED export's W4A16 layer
        assert re.search(rf"\({'W4A16' if w4a16 else 'W4A4'}, K=\d+", line), line
        assert f"served by M=1: {BACKEND}; forced (NVGEMM_BACKEND={BACKEND}); " in line, line
        assert "fallback" not in line, line  # chosen by name: no priority walk to report
        # the kernel config the policy picks on the RTX 5090 profile, as cutedsl_sm120 / cutedsl_mma_w4a16 would
        kernel = r"nvgemm_cutedsl_sm90_w4a16_mma_t\d+x\d+x\d+" if w4a16 else r"nvgemm_cutedsl_sm120_w4a4_t\d+x\d+x\d+"
        assert re.search(rf"configs {BACKEND}@M=1: {kernel}_w\d+_s\d+", line), line


def test_every_linear_call_matches_the_checkpoint(served_sm120, checkpoints):
    results, dump, _ = served_sm120
    assert all(len(r["token_ids"]) == TOKENS for r in results)
    n = check_calls(checkpoints[ALGO], dump, 1)
    assert n == len(LAYERS) * TOKENS  # every layer in the prefill and in each decode step after it


def test_logprobs_match_nvgemm_model(served_sm120, checkpoints):
    results, _, _ = served_sm120
    assert len(results) == 1 and len(results[0]["logprobs"]) == TOKENS
    diff = max_logprob_diff(results, nvgemm_logprobs(checkpoints[ALGO], results))
    print(f"{ALGO} {BACKEND} tp=1: max |logprob(vLLM) - logprob(nvgemm model)| = {diff:.4g}")
    assert diff <= LOGPROB_TOL[ALGO]
