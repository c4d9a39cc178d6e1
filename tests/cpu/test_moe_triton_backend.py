"""The Triton grouped MoE is registered as ``nvfp4_moe`` backend ``triton_moe`` and chosen only where it can run."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from nvgemm.dispatch.moe import MoeProblem  # noqa: E402
from nvgemm.dispatch.registry import backends  # noqa: E402

BASE = MoeProblem(m=4, top_k=2, num_experts=8, num_global_experts=8, hidden=64, intermediate=32,
                  activation="silu_mul", weight_only=False, alpha13="expert", x_dtype=torch.bfloat16,
                  out_dtype=torch.bfloat16, device_type="cuda", capability=(8, 0), router_weight_on_input=False,
                  expert_map=False, shared_out=False, residual=False)


def _triton():
    names = {b.name: b for b in backends("moe")}
    assert "triton_moe" in names and names["triton_moe"].priority > names["emulated"].priority
    return names["triton_moe"]


@pytest.mark.parametrize("change,reason", [
    ({}, None),
    ({"capability": (12, 0), "expert_map": True, "router_weight_on_input": True, "top_k": 1, "shared_out": True,
      "residual": True, "alpha13": "row", "weight_only": True, "activation": "relu2"}, None),
    ({"device_type": "cpu", "capability": None}, "needs a CUDA device"),
    ({"capability": (7, 5)}, "needs sm_80 or newer"),
    ({"x_dtype": torch.float32}, "bfloat16 or float16"),
])
def test_supports(change, reason):
    got = _triton().supports(dataclasses.replace(BASE, **change))
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got
