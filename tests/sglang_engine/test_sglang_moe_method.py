"""nvgemm's SGLang fused-MoE method in process (no engine): which method SGLang's ModelOpt configs hand a
``FusedMoE`` layer once the plugin is registered, and SGLang's own expert weight loader
(``FusedMoE.weight_loader``, with its expert-parallel placement) filling nvgemm's parameters with every
scale exact:

* SGLang's ``_load_single_value`` writes an input scale into both gate / up slots of ``w13_input_scale``
  -> nvgemm hands the loader one slot at a time, so an expert's unequal gate / up input scales are seen
  (and refused: they quantize the same input) instead of the later one silently winning;
* SGLang's ``ModelOptNvFp4FusedMoEMethod`` uses the gate's ``weight_scale_2`` for both halves on its
  single-alpha backends -> nvgemm keeps unequal ones exact (per-row alpha);
* per-expert input scales stay per expert, sliced to the rank's local experts under expert parallelism;
* W4A16_NVFP4 experts (no input scales) take the same path; the engine test serves the NVFP4 export only.

With the plugin off SGLang instantiates its own ``ModelOptNvFp4FusedMoEMethod``, which cannot be built on a
CPU (the last test).
"""

from __future__ import annotations

import json
import logging
import os
import types

import pytest
import torch

pytest.importorskip("sglang")
os.environ.setdefault("NVGEMM_SGLANG", "1")

from nvgemm.integrations import sglang as plugin  # noqa: E402

from _engine_reference import moe_checkpoint, moe_fp64_reference  # noqa: E402

pytestmark = pytest.mark.sglang

H, I, E_GLOBAL = 64, 32, 4


@pytest.fixture(autouse=True)
def _registered(monkeypatch):
    """The plugin registered for this test only (SGLang's registry entries restored afterwards)."""
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS

    for key in ("modelopt_fp4", "modelopt_mixed"):
        monkeypatch.setitem(QUANTIZATION_METHODS, key, QUANTIZATION_METHODS[key])
    monkeypatch.setattr(plugin, "_REGISTERED", False)
    monkeypatch.setenv("NVGEMM_SGLANG", "1")
    plugin.register()


def _fused_moe(local_of_global: list[int] | None = None, activation: str = "silu", is_gated: bool = True,
               quant_config=None):
    """A FusedMoE carrying what SGLang's weight loader and nvgemm's method read (no __init__: building a
    real one needs SGLang's published runtime context); expert parallelism places contiguous blocks."""
    from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig

    local_of_global = local_of_global or list(range(E_GLOBAL))
    e = sum(1 for x in local_of_global if x >= 0)
    first = next(g for g, x in enumerate(local_of_global) if x >= 0)
    ep = E_GLOBAL // e
    layer = FusedMoE.__new__(FusedMoE)
    torch.nn.Module.__init__(layer)
    rc = MoeRunnerConfig(num_experts=E_GLOBAL, num_local_experts=e, hidden_size=H, intermediate_size_per_partition=I,
                         top_k=2, num_fused_shared_experts=0, params_dtype=torch.bfloat16, activation=activation,
                         is_gated=is_gated)
    for k, v in dict(moe_runner_config=rc, quant_config=quant_config or types.SimpleNamespace(get_name=lambda: "modelopt_fp4"),
                     uses_expert_location=False, _expert_storage_rank=first // e, _num_local_routed=e,
                     _has_fused_shared=False, _num_global_routed=E_GLOBAL, num_local_experts=e, num_experts=E_GLOBAL,
                     num_fused_shared_experts=0, weight_load_method=None, use_flashinfer_trtllm_moe=False,
                     use_triton_kernels=False, moe_tp_rank=0, moe_tp_size=1, moe_ep_rank=first // e, moe_ep_size=ep,
                     use_presharded_weights=False, with_bias=False).items():
        object.__setattr__(layer, k, v)
    return layer


def _served(local_of_global: list[int], weight_only: bool = False):
    from nvgemm.integrations.sglang.moe import NvgemmSglNvFp4FusedMoEMethod

    layer = _fused_moe(local_of_global)
    method = NvgemmSglNvFp4FusedMoEMethod(layer.quant_config, weight_only, "test.experts")
    layer.quant_method = method
    method.create_weights(layer, layer.num_local_experts, H, I, torch.bfloat16, weight_loader=layer.weight_loader)
    method.create_moe_runner(layer, layer.moe_runner_config)
    return layer, method


def _load(layer, ck):
    """As SGLang's model ``load_weights`` calls it: checkpoint ``experts.<e>.<gate|up|down>_proj.<suffix>`` ->
    parameter ``w13_<suffix>`` / ``w2_<suffix>``, shard id w1 / w3 / w2, the *global* expert id."""
    for (x, shard), ts in ck.items():
        for suffix, t in ts.items():
            stem = "w2" if shard == "w2" else "w13"
            param = getattr(layer, f"{stem}_{suffix}")
            param.weight_loader(param, t, f"model.layers.0.mlp.experts.{stem}_{suffix}", shard_id=shard, expert_id=x)


@pytest.mark.parametrize("local_of_global,weight_only", [([0, 1, 2, 3], False), ([-1, -1, 0, 1], False),
                                                         ([0, 1, 2, 3], True), ([-1, -1, 0, 1], True)],
                         ids=["all-local", "ep-rank1", "all-local-w4a16", "ep-rank1-w4a16"])
def test_sglang_loader_keeps_every_scale_exact(local_of_global, weight_only):
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    layer, method = _served(local_of_global, weight_only)
    ck = moe_checkpoint(0, E_GLOBAL, H, I, weight_only)
    _load(layer, ck)
    experts = [g for g, x in enumerate(local_of_global) if x >= 0]
    for l, g in enumerate(experts):  # both gate / up input-scale slots, per *local* expert
        if not weight_only:
            assert float(layer.w13_input_scale[l, 0]) == float(ck[g, "w1"]["input_scale"])
            assert float(layer.w13_input_scale[l, 1]) == float(ck[g, "w3"]["input_scale"])
            assert float(layer.w2_input_scale[l]) == float(ck[g, "w2"]["input_scale"])
        assert float(layer.w13_weight_scale_2[l, 0]) != float(layer.w13_weight_scale_2[l, 1])
    method.process_weights_after_loading(layer)
    assert layer.nvgemm_w13_scale_2.shape == (len(experts), 2 * I)  # unequal gate/up: exact per-row alpha
    assert (layer.nvgemm_w13_input_scale is None) is weight_only
    for l, g in enumerate(experts if not weight_only else []):
        assert float(layer.nvgemm_w13_input_scale[l]) == float(ck[g, "w1"]["input_scale"])  # no max-collapse
    assert method.get_moe_runner_backend(layer) is None  # SGLang: "direct kernel, standard top-k, local ids"
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, H, generator=gen).bfloat16()
    ids = torch.randint(0, E_GLOBAL, (5, 2), generator=gen, dtype=torch.int32)
    wts = torch.rand(5, 2, generator=gen)
    emap = torch.tensor(local_of_global, dtype=torch.int32)  # what SGLang's standard dispatcher does under EP
    local = torch.where(emap[ids.long()] >= 0, emap[ids.long()], -1).to(torch.int32)
    topk = StandardTopKOutput(topk_weights=wts, topk_ids=local, router_logits=torch.zeros(5, E_GLOBAL))
    out = method.apply(layer, StandardDispatchOutput(hidden_states=x, hidden_states_scale=None, topk_output=topk))
    ref = moe_fp64_reference(ck, x, ids, wts, experts)
    # the op's emulated backend and this fp64 reference see the same quantized operands; they differ by
    # fp32 vs fp64 accumulation and rounding h / the output to bf16: 2^-7 of the output scale (one bf16
    # ulp of the largest value); a collapsed (max) or wrong-expert scale is off by >= 10 %
    err = float((out.hidden_states.double() - ref).abs().max() / ref.abs().max())
    assert err <= 2.0**-7, err


def test_unequal_gate_up_input_scale_is_a_clear_error():
    layer, method = _served([0, 1, 2, 3])
    ck = moe_checkpoint(2, E_GLOBAL, H, I)
    ck[1, "w3"]["input_scale"] = ck[1, "w3"]["input_scale"] * 2
    _load(layer, ck)
    with pytest.raises(ValueError, match="nvgemm SGLang MoE layer test.experts: expert 1 has gate input_scale .* != up"):
        method.process_weights_after_loading(layer)


def test_an_unloaded_expert_scale_is_refused():
    layer, method = _served([0, 1, 2, 3], weight_only=True)
    ck = moe_checkpoint(3, E_GLOBAL, H, I, weight_only=True)
    del ck[2, "w2"]["weight_scale_2"]
    _load(layer, ck)
    with pytest.raises(ValueError, match="w2_weight_scale_2 was not \\(fully\\) loaded"):
        method.process_weights_after_loading(layer)


def _config(algo: str):
    from nvgemm.integrations.sglang import method

    hfq = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": algo, "group_size": 16,
                                                              "exclude_modules": ["lm_head"]}}
    if algo == "MIXED_PRECISION":
        hfq["quantization"]["quantized_layers"] = {
            "model.layers.0.mlp.experts": {"quant_algo": "NVFP4", "group_size": 16},
            "model.layers.1.mlp.experts": {"quant_algo": "W4A16_NVFP4", "group_size": 16}}
        return method.NvgemmSglModelOptMixedPrecisionConfig.from_config(json.loads(json.dumps(hfq)))
    return method.NvgemmSglModelOptFp4Config.from_config(hfq)


@pytest.mark.parametrize("algo,layer_weight_only", [("NVFP4", [False, False]), ("W4A16_NVFP4", [True, True]),
                                                    ("MIXED_PRECISION", [False, True])])
def test_nvfp4_moe_layers_get_nvgemms_method(algo, layer_weight_only):
    from nvgemm.integrations.sglang.moe import NvgemmSglNvFp4FusedMoEMethod

    cfg = _config(algo)
    for i, weight_only in enumerate(layer_weight_only):
        m = cfg.get_quant_method(_fused_moe(), f"model.layers.{i}.mlp.experts")
        assert type(m) is NvgemmSglNvFp4FusedMoEMethod and m.weight_only is weight_only
        assert "ModelOpt" not in type(m).__name__  # SGLang's loader would take its ModelOpt-by-name branch


def test_a_moe_layer_nvgemm_cannot_serve_stays_sglangs_with_one_warning(monkeypatch):
    """An activation nvfp4_moe does not have (gated GELU) keeps SGLang's ModelOptNvFp4FusedMoEMethod, with one
    warning naming the first such layer and the reason. SGLang's method refuses to be constructed on a CPU,
    so here its constructor is reduced to storing the config, as it ends on a Blackwell GPU."""
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptNvFp4FusedMoEMethod

    from nvgemm.integrations.sglang import moe

    monkeypatch.setattr(ModelOptNvFp4FusedMoEMethod, "__init__", lambda self, qc: setattr(self, "quant_config", qc))
    monkeypatch.setattr(moe, "_DECLINED", [])
    cfg = _config("NVFP4")
    lines = []
    catch = logging.Handler(logging.INFO)
    catch.emit = lambda r: lines.append((r.levelno, r.getMessage()))
    moe.log.addHandler(catch)
    try:
        for i in range(2):
            m = cfg.get_quant_method(_fused_moe(activation="gelu"), f"model.layers.{i}.mlp.experts")
            assert type(m) is ModelOptNvFp4FusedMoEMethod
    finally:
        moe.log.removeHandler(catch)
    assert [m for level, m in lines if level == logging.WARNING] == [
        "nvgemm_cutedsl: SGLang MoE layer model.layers.0.mlp.experts (and any like it) stays with SGLang's "
        "ModelOptNvFp4FusedMoEMethod: activation 'gelu' (gated)"]


def test_plugin_off_sglang_instantiates_its_own_moe_method():
    """Plugin off, SGLang's ``modelopt_fp4`` config (the registry entry then: test_plugin.py) hands a FusedMoE
    layer its ``ModelOptNvFp4FusedMoEMethod``, whose constructor refuses this CPU (it serves Blackwell, or
    Marlin on sm80-9x): SGLang's stock NVFP4 MoE cannot run here at all, so this -- which class SGLang
    instantiates, and that it stops startup on a CPU -- is what the plugin-off path can show."""
    import traceback

    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config, ModelOptNvFp4FusedMoEMethod

    stock = ModelOptFp4Config.from_config({"producer": {"name": "modelopt"},
                                           "quantization": {"quant_algo": "NVFP4", "group_size": 16}})
    with pytest.raises(ValueError, match="Current platform does not support NVFP4 quantization with the selected "
                                         "MoE backend") as info:
        stock.get_quant_method(_fused_moe(), "model.layers.0.mlp.experts")
    frames = traceback.extract_tb(info.tb)
    assert frames[-1].name == "__init__" and frames[-1].filename.endswith("modelopt_quant.py")
    assert ModelOptNvFp4FusedMoEMethod.__init__.__code__.co_filename == frames[-1].filename
    assert frames[-1].lineno in range(ModelOptNvFp4FusedMoEMethod.__init__.__code__.co_firstlineno,
                                      ModelOptNvFp4FusedMoEMethod.__init__.__code__.co_firstlineno + 40)
