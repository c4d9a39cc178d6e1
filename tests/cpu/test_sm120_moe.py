"""The sm120 grouped MoE family on CPU: config validity and the shape rule (reasons), name round trip,
the policy's picks are implementable, and ``nvfp4_moe`` dispatch on a forced capability 12.0 / 12.1
device picks ``cutedsl_sm120_moe`` (refusing other devices / problems with a reason)."""

from __future__ import annotations

import pytest
import torch

from nvgemm.core.backend import MoeProblem
from nvgemm.templates.sm120_moe.config import (
    Sm120MoeConfig as C,
    moe_config_from_name,
    moe_shape_problem,
    validate_moe_config,
)


def _problem(**kw) -> MoeProblem:
    base = dict(m=4, top_k=8, num_experts=128, num_global_experts=128, hidden=2048, intermediate=768,
                activation="silu_mul", weight_only=False, alpha13="expert", x_dtype=torch.bfloat16,
                out_dtype=torch.bfloat16, device_type="cuda", capability=(12, 0), router_weight_on_input=False,
                expert_map=False, shared_out=False, residual=False)
    base.update(kw)
    return MoeProblem(**base)


@pytest.mark.parametrize("c,why", [
    (C(tile_n=64), "tile_n=64"),
    (C(split_k=3), "split_k=3"),
    (C(tile_rows=96), "tile_n=96"),  # the dense rule: 16 x row tiles x warps
    (C(tile_n=32, tile_rows=256, num_warps=4), "accumulator registers"),
])
def test_invalid_configs_have_a_reason(c, why):
    st = validate_moe_config(c)
    assert not st and why in st.reason, st.reason


@pytest.mark.parametrize("c,rows,k,gated,why", [
    (C(), 2 * 48, 2048, True, "multiple of 32"),  # I = 48
    (C(tile_rows=64), 2 * 64, 2048, True, "even number of row tiles"),  # 64 rows / 4 warps = 1 row tile
    (C(), 2048, 784, False, "multiple of 32"),
    (C(split_k=8), 2048, 768, False, "exceeds"),  # 3 stages of 256
    (C(), 2046, 768, False, "multiple of 4"),
])
def test_shape_rule_reasons(c, rows, k, gated, why):
    r = moe_shape_problem(c, rows, k, gated)
    assert r is not None and why in r, r


def test_name_round_trip_and_dense_twin():
    c = C(tile_n=16, tile_rows=64, tile_k=128, num_warps=2, stages=3, split_k=2, pdl=True)
    assert moe_config_from_name(c.name()) == c
    d = c.dense()
    assert (d.tile_m, d.tile_n, d.tile_k, d.split_k, d.num_warps, d.stages) == (16, 64, 128, 2, 2, 3)
    with pytest.raises(ValueError, match="not an sm120 MoE config name"):
        moe_config_from_name("nvgemm_cutedsl_sm100_moe_t128x8x256")


@pytest.mark.parametrize("m", [1, 4, 16, 64, 256])
@pytest.mark.parametrize("arch", ["sm_120a", "sm_121a"])
def test_policy_picks_are_implementable_for_qwen3_30b(m, arch):
    from nvgemm.templates.sm120_moe.policy import pick_moe_configs

    c1, c2 = pick_moe_configs(m, 128, 8, 2048, 768, arch)
    assert c1.tile_n == c2.tile_n
    assert moe_shape_problem(c1, 2 * 768, 2048, True) is None
    assert moe_shape_problem(c2, 2048, 768, False) is None


@pytest.mark.parametrize("cap", [(12, 0), (12, 1)])
def test_nvfp4_moe_on_capability_12_picks_the_sm120_grouped_backend(cap):
    from nvgemm.dispatch.moe import select_moe_backend

    b = select_moe_backend(_problem(capability=cap), check=False)
    assert b.name == "cutedsl_sm120_moe"


@pytest.mark.parametrize("kw,why", [
    (dict(device_type="cpu", capability=None), "CUDA device"),
    (dict(capability=(10, 0)), "capability 12.0 or 12.1"),
    (dict(weight_only=True), "W4A16"),
    (dict(activation="silu"), "silu_mul"),
    (dict(intermediate=784), "multiples of 32"),
])
def test_sm120_moe_backend_refuses_with_a_reason(kw, why):
    from nvgemm.templates.sm120_moe import backend

    r = backend.supports(_problem(**kw))
    assert r is not None and why in r, r


def test_other_capabilities_do_not_pick_it():
    from nvgemm.dispatch.moe import select_moe_backend

    assert select_moe_backend(_problem(capability=(10, 0)), check=False).name == "cutedsl_sm100_moe"
    assert select_moe_backend(_problem(capability=(9, 0)), check=False).name != "cutedsl_sm120_moe"
