"""NVIDIA's CuTeDSL example kernels on the emulator (bench/run_nvidia_examples.py; results in
bench/results/emulator_nvidia_examples.md). Needs a CUTLASS checkout: skipped unless NVGEMM_CUTLASS_DIR names one
(no network, nothing of the examples in this repository). Each example runs in a child process of its own."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.emulator

CHECKOUT = os.environ.get("NVGEMM_CUTLASS_DIR")
HARNESS = Path(__file__).resolve().parents[2] / "bench" / "run_nvidia_examples.py"
# a fast representative set: SIMT, mma.sync + ldmatrix, wgmma + TMA, tcgen05 (1-CTA f16, NVFP4 block-scaled), cluster
# launch control (the tutorial's CLC GEMM: every schedule must leave the same bits, try_cancel winning or failing)
FAST = ["ampere/elementwise_add", "ampere/tensorop_gemm", "hopper/dense_gemm", "blackwell/dense_gemm",
        "blackwell/dense_blockscaled_gemm_persistent", "blackwell/tutorial_fp16_gemm_3_1",
        "blackwell_geforce/blockscaled_gemm_cooperative"]
# the other sm_120a / sm_121a rows (block-scaled mma.sync: MXFP4, MXFP8, mixed E2M1 x E4M3, pingpong, two
# persistent CTAs, sm_121a; the dense fp16 GEMM): opt-in beside the fast cooperative NVFP4 row
GEFORCE_SLOW = [f"blackwell_geforce/{n}" for n in (
    "blockscaled_gemm_cooperative_2cta", "blockscaled_gemm_cooperative_mxfp4", "blockscaled_gemm_cooperative_mxfp8",
    "blockscaled_gemm_cooperative_mxf4_mxf8", "blockscaled_gemm_pingpong", "blockscaled_gemm_cooperative_sm121a",
    "dense_gemm")]


def _harness():
    spec = importlib.util.spec_from_file_location("run_nvidia_examples", HARNESS)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not CHECKOUT, reason="set NVGEMM_CUTLASS_DIR to a CUTLASS checkout to run NVIDIA's examples")
@pytest.mark.parametrize("name", FAST + [pytest.param(n, marks=pytest.mark.slow) for n in GEFORCE_SLOW])
def test_nvidia_example_matches_reference(name):
    h = _harness()
    r = h.run_child(Path(CHECKOUT), h.EXAMPLES[name], timeout=900)
    assert r.get("ok") is True, r
    assert r["result"] == "bit-exact", r
