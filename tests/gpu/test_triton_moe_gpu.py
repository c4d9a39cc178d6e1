"""nvgemm's Triton grouped MoE on a real GPU (marked ``gpu``): the CPU interpreter contract
(tests/cpu/triton_interp/interp_moe.py) at decode sizes, through the op's backend registry, and CUDA-graph
capture (the prep has no host synchronisation).

* ``nvgemm::nvfp4_moe`` picks ``triton_moe`` on sm_80+ (after its first-use self-check) and agrees
  with the emulated op: >= 90 % of outputs bit-equal, ||out - ref|| / ||ref|| <= 2^-7 (tensor-core fp32
  accumulation order can move h's bf16 rounding and then one FP4 code of its requantization);
* bit-exact with the emulated op on exact data (every fp32 sum exact in any order);
* deterministic: two runs, and a CUDA-graph replay, give identical bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu" / "triton_interp"))
from moe_cases import make_moe  # noqa: E402

from nvgemm.dispatch.moe import last_moe_selected  # noqa: E402
from nvgemm.ops.moe import nvfp4_moe_emulated  # noqa: E402

DEV = "cuda"


def _args(e, h, i, m, k, w4a4, seed, exact=False, expert_map=None):
    w = {n: (None if t is None else t.to(DEV)) for n, t in make_moe(e, h, i, w4a4=w4a4, seed=seed, exact=exact).items()}
    g = torch.Generator().manual_seed(seed)
    eg = e if expert_map is None else expert_map.numel()
    if exact:
        x = (torch.randint(-4, 5, (m, h), generator=g).float() * 0.25).bfloat16()
    else:
        x = (torch.randn(m, h, generator=g) * 2).bfloat16()
    ids = torch.stack([torch.randperm(eg, generator=g)[:k] for _ in range(m)]).to(torch.int32)
    wts = torch.rand(m, k, generator=g)
    return (x.to(DEV), ids.to(DEV), wts.to(DEV), w["w13"], w["w13_scale"], w["w13_scale_2"], w["w13_input_scale"],
            w["w2"], w["w2_scale"], w["w2_scale_2"], w["w2_input_scale"], "silu_mul", False,
            None if expert_map is None else expert_map.to(DEV), None, None, None)


@pytest.mark.parametrize("m", [1, 7, 64])
@pytest.mark.parametrize("w4a4", [True, False])
def test_op_runs_triton_and_matches_emulated(m, w4a4):
    args = _args(16, 256, 128, m, 4, w4a4, seed=m)
    out = torch.ops.nvgemm.nvfp4_moe(*args)
    assert last_moe_selected() == "triton_moe"
    ref = nvfp4_moe_emulated(*args)
    same = float((out == ref).float().mean())
    rel = float((out.float() - ref.float()).norm() / ref.float().norm())
    assert same >= 0.9 and rel <= 2.0**-7, (same, rel)


def test_exact_data_bit_exact_and_expert_map():
    emap = torch.tensor([-1, 0, 3, -1, 1, 2, -1, -1], dtype=torch.int32)
    args = _args(4, 64, 32, 9, 2, True, seed=3, exact=True, expert_map=emap)
    from nvgemm.templates.triton.moe import nvfp4_moe_triton

    assert torch.equal(nvfp4_moe_triton(*args), nvfp4_moe_emulated(*args))


def test_deterministic_and_cuda_graph_replay():
    from nvgemm.templates.triton.moe import nvfp4_moe_triton

    args = _args(16, 256, 128, 8, 4, True, seed=5)
    a = nvfp4_moe_triton(*args)
    b = nvfp4_moe_triton(*args)
    assert torch.equal(a, b)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = nvfp4_moe_triton(*args)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(c, a)
