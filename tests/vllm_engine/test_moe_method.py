"""nvgemm's vLLM fused-MoE method in process (no engine): vLLM's own expert weight loader fills nvgemm's
parameters, and the scales stay exact -- the anchors' MoE loading bugs (shared/research/moe_nvfp4.md §6):

* NeMo-RL PR #2983: vLLM's ``_load_single_value`` writes ``param[expert_id]`` and so clobbers the w1/w3
  slots of ``w13_input_scale`` -> both shards are kept (the loader's ModelOpt branch, selected by the
  method's class name);
* vLLM ``ModelOptNvFp4FusedMoE``: unequal w1/w3 ``weight_scale_2`` collapsed to w1's with a warning ->
  nvgemm keeps them exact (per-row alpha) and the layer equals the fp64 checkpoint math;
* vLLM PR #26135 / sglang#36597: per-expert input scales collapsed to one max, or not sliced to the
  local experts under expert parallelism -> each local expert keeps its own checkpoint scale;
* unequal w1/w3 input scales of one expert (inconsistent checkpoint) -> a clear error.
"""

from __future__ import annotations

import os
import types

import pytest
import torch

pytest.importorskip("vllm")
os.environ.setdefault("NVGEMM_VLLM", "1")
from vllm.model_executor.layers.fused_moe import RoutedExperts  # noqa: E402
from vllm.model_executor.layers.fused_moe.activation import MoEActivation  # noqa: E402

from nvgemm.integrations.vllm.moe import NvgemmModelOptNvFp4FusedMoE  # noqa: E402

from _engine_reference import moe_checkpoint, moe_fp64_reference  # noqa: E402

pytestmark = pytest.mark.vllm

H, I, E_GLOBAL = 64, 32, 4


@pytest.fixture(autouse=True)
def _single_rank(monkeypatch):
    """vLLM's parameter classes ask the (here absent) tensor-parallel group for rank and size."""
    import vllm.model_executor.parameter as vp

    monkeypatch.setattr(vp, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(vp, "get_tensor_model_parallel_world_size", lambda: 1)


def _layer(local_of_global: list[int], weight_only: bool = False):
    """A RoutedExperts carrying only what vLLM's weight_loader and nvgemm's method read (no __init__:
    building a real one needs a running vLLM config)."""
    e = sum(1 for x in local_of_global if x >= 0)
    moe = types.SimpleNamespace(is_act_and_mul=True, tp_rank=0, tp_size=1, ep_rank=0, ep_size=1, use_ep=False,
                                tp_shard_with_padding=False, intermediate_size=I, intermediate_size_per_partition=I,
                                hidden_dim=H, num_experts=E_GLOBAL, has_bias=False,
                                moe_parallel_config=types.SimpleNamespace(tp_size=1, use_all2all_kernels=False))
    layer = RoutedExperts.__new__(RoutedExperts)
    torch.nn.Module.__init__(layer)
    method = NvgemmModelOptNvFp4FusedMoE.__new__(NvgemmModelOptNvFp4FusedMoE)
    torch.nn.Module.__init__(method) if isinstance(method, torch.nn.Module) else None
    method.moe, method.weight_only, method.prefix, method.use_global_sf = moe, weight_only, "test.experts", False
    method.dump_dir, method.activation, method.moe_quant_config, method.moe_kernel = None, None, None, None
    object.__setattr__(layer, "quant_method", method)
    for k, v in dict(moe_config=moe, quant_config=None, _fused_shared_expert_quantizer=None, top_k=1,
                     global_num_experts=E_GLOBAL, apply_router_weight_on_input=False, activation=MoEActivation.SILU,
                     _loaded_expert_biases=set()).items():
        object.__setattr__(layer, k, v)
    emap = torch.tensor(local_of_global, dtype=torch.int32)
    layer.expert_map_manager = types.SimpleNamespace(map_global_to_local=lambda g: int(emap[g]))
    layer.register_buffer("_expert_map", emap if min(local_of_global) < 0 else None, persistent=False)
    method.create_weights(layer, e, H, I, torch.bfloat16, weight_loader=layer.weight_loader)
    return layer, method


def _checkpoint(seed: int, weight_only: bool = False):
    return moe_checkpoint(seed, E_GLOBAL, H, I, weight_only)


def _load(layer, ck):
    for (x, shard), ts in ck.items():
        for suffix, t in ts.items():
            pname = {"weight": "weight", "weight_scale": "weight_scale", "weight_scale_2": "weight_scale_2",
                     "input_scale": "input_scale"}[suffix]
            stem = "w2" if shard == "w2" else "w13"
            param = getattr(layer, f"{stem}_{pname}")
            layer.weight_loader(param, t, f"experts.{x}.{stem}_{pname}", shard, x)


def _fp64_reference(ck, x_in, ids, wts, experts):
    return moe_fp64_reference(ck, x_in, ids, wts, experts)


@pytest.mark.parametrize("local_of_global", [[0, 1, 2, 3], [-1, 0, -1, 1]], ids=["all-local", "ep-rank1"])
def test_loader_keeps_every_scale_exact(local_of_global):
    layer, method = _layer(local_of_global)
    ck = _checkpoint(0)
    _load(layer, ck)
    experts = [g for g, l in enumerate(local_of_global) if l >= 0]
    # both w1/w3 input-scale slots loaded, per *local* expert, from that expert's checkpoint value
    for l, g in enumerate(experts):
        assert float(layer.w13_input_scale[l, 0]) == float(ck[g, "w1"]["input_scale"])
        assert float(layer.w13_input_scale[l, 1]) == float(ck[g, "w3"]["input_scale"])
        assert float(layer.w2_input_scale[l]) == float(ck[g, "w2"]["input_scale"])
        assert float(layer.w13_weight_scale_2[l, 0]) != float(layer.w13_weight_scale_2[l, 1])
    method.process_weights_after_loading(layer)
    assert layer.nvgemm_w13_scale_2.shape == (len(experts), 2 * I)  # unequal gate/up: exact per-row alpha
    for l, g in enumerate(experts):
        assert float(layer.nvgemm_w13_input_scale[l]) == float(ck[g, "w1"]["input_scale"])  # no max-collapse
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, H, generator=gen).bfloat16()
    ids = torch.randint(0, E_GLOBAL, (5, 2), generator=gen, dtype=torch.int32)
    wts = torch.rand(5, 2, generator=gen)
    out = method.apply(layer, x, wts, ids, None, None)
    ref = _fp64_reference(ck, x, ids, wts, experts)
    # the op's emulated backend and this fp64 reference see the same quantized operands; they differ by
    # fp32 vs fp64 accumulation and rounding h / the output to bf16: 2^-7 of the output scale (one bf16
    # ulp of the largest value); a collapsed (max) or wrong-expert scale is off by >= 10 %
    err = float((out.double() - ref).abs().max() / ref.abs().max())
    assert err <= 2.0**-7, err


def test_unequal_gate_up_input_scale_is_a_clear_error():
    layer, method = _layer([0, 1, 2, 3])
    ck = _checkpoint(2)
    ck[1, "w3"]["input_scale"] = ck[1, "w3"]["input_scale"] * 2
    _load(layer, ck)
    with pytest.raises(ValueError, match="expert 1 has gate input_scale .* != up input_scale"):
        method.process_weights_after_loading(layer)


@pytest.mark.parametrize("byte", [0x7F, 0xB8], ids=["nan", "negative"])
def test_nan_or_negative_expert_block_scale_is_refused(byte):
    """Issue 22 item 2: the MoE method applies the dense loaders' byte rule to expert block scales."""
    layer, method = _layer([0, 1, 2, 3])
    ck = _checkpoint(3)
    bad = ck[2, "w2"]["weight_scale"].clone()
    bad.view(torch.uint8)[1, 0] = byte
    ck[2, "w2"]["weight_scale"] = bad
    _load(layer, ck)
    with pytest.raises(ValueError, match="w2_weight_scale"):
        method.process_weights_after_loading(layer)


def test_moe_names_are_gated_to_checked_vllm_releases():
    from nvgemm.integrations.vllm import _compat

    assert _compat.moe_supported("0.32.0") and _compat.moe_supported("0.32.0+cpu")
    assert not _compat.moe_supported("0.33.0")  # linear layers only there; MoE stays vLLM's
