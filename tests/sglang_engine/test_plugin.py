"""The SGLang plugin in process (no engine): entry point, opt-in, version gate, registration, the layer's
parameters, its refusals, and what ``apply`` does (no host synchronisation, no allocation besides the output)."""

from __future__ import annotations

import importlib.metadata as md

import pytest
import torch

pytest.importorskip("sglang")

from nvgemm.integrations import sglang as plugin  # noqa: E402
from nvgemm.integrations.sglang import _compat  # noqa: E402

pytestmark = pytest.mark.sglang


def test_entry_point_is_installed():
    eps = {ep.name: ep.value for ep in md.entry_points(group="sglang.srt.plugins")}
    assert eps.get("nvgemm") == "nvgemm.integrations.sglang:register"


@pytest.mark.parametrize("env,expected", [
    ({}, False),  # installing nvgemm changes nothing by itself
    ({"SGLANG_PLUGINS": "other_plugin"}, False),
    ({"SGLANG_PLUGINS": "other_plugin, nvgemm"}, True),
    ({"NVGEMM_SGLANG": "1"}, True),
    ({"NVGEMM_SGLANG": "0", "SGLANG_PLUGINS": "nvgemm"}, False),
])
def test_opt_in(env, expected):
    assert plugin.opted_in(env) is expected


def test_opt_in_rejects_garbage_by_stopping():
    with pytest.raises(SystemExit, match="NVGEMM_SGLANG"):
        plugin.opted_in({"NVGEMM_SGLANG": "maybe"})


@pytest.mark.parametrize("version", ["0.5.22", "0.5.24", "0.6.0", "not installed"])
def test_untested_sglang_is_a_clear_error(version):
    with pytest.raises(_compat.UnsupportedSglangError, match=rf"supports SGLang 0\.5\.23, found SGLang {version}\."):
        _compat.check_version(version)


def test_tested_versions_pass():
    assert _compat.check_version("0.5.23") == "0.5.23"
    assert _compat.check_version() in _compat.TESTED_VERSIONS  # the installed SGLang


def test_status_line():
    assert plugin.status({}).endswith("plugin off (opt in with NVGEMM_SGLANG=1 or SGLANG_PLUGINS=nvgemm)")
    assert plugin.status({"NVGEMM_SGLANG": "1"}) == f"SGLang {md.version('sglang')} (tested), plugin opted in"


def test_register_swaps_only_the_modelopt_nvfp4_configs(monkeypatch):
    from sglang.srt.layers import linear
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

    registry = QUANTIZATION_METHODS
    monkeypatch.delenv("NVGEMM_SGLANG", raising=False)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    plugin.register()  # not opted in: SGLang untouched
    assert get_quantization_config("modelopt_fp4").__module__.startswith("sglang.")
    monkeypatch.setenv("NVGEMM_SGLANG", "1")
    plugin.register()
    from nvgemm.integrations.sglang.method import (NvgemmSglModelOptFp4Config, NvgemmSglModelOptMixedPrecisionConfig,
                                                   NvgemmSglNvFp4LinearMethod)

    assert QUANTIZATION_METHODS is registry  # replaced in place: every module holding the dict sees it
    assert get_quantization_config("modelopt_fp4") is NvgemmSglModelOptFp4Config
    assert get_quantization_config("modelopt_mixed") is NvgemmSglModelOptMixedPrecisionConfig
    assert get_quantization_config("modelopt").__module__.startswith("sglang.")  # FP8 stays SGLang's
    assert NvgemmSglNvFp4LinearMethod.__name__ in linear.WEIGHT_LOADER_V2_SUPPORTED


def test_a_failing_register_is_not_swallowed_by_sglang(monkeypatch):
    """SGLang's own plugin loader logs and swallows Exception; nvgemm's failure must stop it instead."""
    import sglang.srt.plugins as plugins

    def broken():
        raise RuntimeError("planted: a missing SGLang name")

    monkeypatch.setenv("NVGEMM_SGLANG", "1")
    monkeypatch.setenv("SGLANG_PLUGINS", "nvgemm")
    monkeypatch.setattr(plugin, "_REGISTERED", False)
    monkeypatch.setattr(plugin, "_install", broken)
    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    with pytest.raises(SystemExit, match="could not install itself.*Cause: RuntimeError: planted: a missing SGLang name"):
        plugins.load_plugins()


def _method(weight_only=False, prefix="model.layers.0.self_attn.qkv_proj"):
    from nvgemm.integrations.sglang.method import NvgemmSglNvFp4LinearMethod

    return NvgemmSglNvFp4LinearMethod(weight_only=weight_only, prefix=prefix)


def test_scales_are_fp32_nan_whatever_the_default_dtype():
    """SGLang builds models under the model dtype as default; a scale created without an explicit dtype
    would load 0.01 as 0.010009765625 (bf16). Unloaded slots stay NaN."""
    layer, m = torch.nn.Module(), _method()
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        m.create_weights(layer, 128, [64, 32, 32], 128, 128, torch.bfloat16, weight_loader=lambda *a, **k: None)
    finally:
        torch.set_default_dtype(old)
    for name in ("weight_scale_2", "input_scale"):
        p = getattr(layer, name)
        assert p.dtype == torch.float32 and p.shape == (3,) and bool(torch.isnan(p).all())
    assert layer.weight.dtype == torch.uint8 and layer.weight.shape == (128, 64)
    assert layer.weight_scale.dtype == torch.float8_e4m3fn and bool(torch.isnan(layer.weight_scale.float()).all())


def test_per_rank_k_not_multiple_of_16_names_the_layer():
    with pytest.raises(ValueError, match=r"SGLang layer model.layers.3.mlp.down_proj: per-rank in_features 56 is not "
                                         r"a multiple of 16"):
        _method(prefix="model.layers.3.mlp.down_proj").create_weights(torch.nn.Module(), 56, [64], 112, 64,
                                                                      torch.bfloat16, weight_loader=None)


def _loaded(widths, k, ins, ws2_factor=(1.0, 1.0, 1.0), skip=()):
    """A layer filled through each parameter's weight_loader as SGLang's loader calls it (shard by shard)."""
    from nvgemm.core.formats import quantize_weight

    gen = torch.Generator().manual_seed(34)
    qs = [quantize_weight(torch.randn(n, k, generator=gen)) for n in widths]
    layer, m = torch.nn.Module(), _method()

    def loader(param, loaded, shard_id=None):
        if shard_id is None:
            param.data.copy_(loaded)
        else:
            param.data[shard_id] = loaded

    m.create_weights(layer, k, widths, k, sum(widths), torch.bfloat16, weight_loader=loader)
    with torch.no_grad():
        for name, t in (("weight", torch.cat([q.packed for q in qs])), ("weight_scale", torch.cat([q.scale for q in qs]))):
            getattr(layer, name).weight_loader(getattr(layer, name), t)
        for i, q in enumerate(qs):
            if ("weight_scale_2", i) not in skip:
                layer.weight_scale_2.weight_loader(layer.weight_scale_2, q.global_scale.reshape(()) * ws2_factor[i], i)
            if ("input_scale", i) not in skip:
                layer.input_scale.weight_loader(layer.input_scale, ins[i].reshape(()), i)
    return layer, m, qs


def test_an_unloaded_scale_slot_is_refused():
    layer, m, _ = _loaded([64, 32, 32], 128, torch.full((3,), 0.01), skip={("input_scale", 2)})
    with pytest.raises(ValueError, match=r"never loaded from the checkpoint: input_scale \(loaded shards \['0', '1'\] of 3\)"):
        m.process_weights_after_loading(layer)


@pytest.mark.parametrize("ins,gemms", [((0.01, 0.01, 0.01), 1), ((0.01, 0.01, 0.02), 2)], ids=["one-gemm", "two-gemms"])
def test_apply_equals_the_shardwise_math_without_host_sync(ins, gemms):
    """Unequal weight_scale_2 (per-column alpha) and, in the second case, an unequal input_scale (a second
    GEMM): apply equals the emulated op run shard by shard on the checkpoint tensors bit for bit, and
    runs only nvgemm's op per GEMM (plus the concatenation of several GEMMs' outputs) -- no
    ``aten._local_scalar_dense`` (a host sync), no other allocation."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from nvgemm.core.formats import to_blocked
    from nvgemm.ops.linear import nvfp4_linear_emulated

    widths, k = [64, 32, 32], 128
    ins = torch.tensor(ins)
    layer, m, qs = _loaded(widths, k, ins, ws2_factor=(1.0, 2.0, 1.0))
    m.process_weights_after_loading(layer)
    assert len(m.served.gemms) == gemms
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(1)).bfloat16()
    want = torch.cat([nvfp4_linear_emulated(x, q.packed, to_blocked(q.scale),
                                            q.global_scale.reshape(()) * (2.0 if i == 1 else 1.0), ins[i].reshape(()),
                                            None, None, "none", None) for i, q in enumerate(qs)], -1)

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    with Ops() as rec:
        got = m.apply(layer, x)
    top = [op for op in rec.ops if op.startswith("nvgemm.") or op in ("aten.cat", "aten._local_scalar_dense")]
    assert "aten._local_scalar_dense" not in rec.ops
    assert top == ["nvgemm.nvfp4_linear"] * gemms + (["aten.cat"] if gemms > 1 else []), rec.ops
    assert torch.equal(got, want)


def test_warmup_covers_every_graph_size_and_bucket(monkeypatch):
    """On a GPU, warm-up resolves each decode / prefill graph size SGLang captures (not those of a disabled
    phase) and each M-bucket bound up to the prefill chunk size."""
    from types import SimpleNamespace

    import sglang.srt.runtime_context as rc

    from nvgemm.heuristics import m_buckets
    from nvgemm.integrations.sglang import method

    cg = SimpleNamespace(decode=SimpleNamespace(backend="full", bs=[1, 2, 4, 8, 24]),
                         prefill=SimpleNamespace(backend="breakable", bs=[4, 8, 512]))
    monkeypatch.setattr(rc, "get_exec", lambda: SimpleNamespace(graph=SimpleNamespace(cuda_graph_config=cg)))
    monkeypatch.setattr(rc, "get_schedule", lambda: SimpleNamespace(chunked_prefill_size=2048))
    buckets = {hi for _, hi in m_buckets(2048)}
    assert method.warmup_token_counts(torch.device("cuda")) == sorted(buckets | {1, 2, 4, 8, 24, 512})
    cg.prefill.backend = "disabled"
    assert method.warmup_token_counts(torch.device("cuda")) == sorted(buckets | {1, 2, 4, 8, 24})
    assert method.warmup_token_counts(torch.device("cpu")) == [1]
