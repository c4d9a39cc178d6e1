"""The plugin's entry point, opt-in and version gate (in-process; no engine)."""

from __future__ import annotations

import importlib.metadata as md

import pytest

pytest.importorskip("vllm")

from nvgemm.integrations import vllm as plugin  # noqa: E402
from nvgemm.integrations.vllm import _compat  # noqa: E402

pytestmark = pytest.mark.vllm


def test_entry_point_is_installed():
    eps = {ep.name: ep.value for ep in md.entry_points(group="vllm.general_plugins")}
    assert eps.get("nvgemm") == "nvgemm.integrations.vllm:register"


@pytest.mark.parametrize("env,expected", [
    ({}, False),  # installing nvgemm changes nothing by itself
    ({"VLLM_PLUGINS": "lora_filesystem_resolver"}, False),
    ({"VLLM_PLUGINS": "lora_filesystem_resolver, nvgemm"}, True),
    ({"NVGEMM_VLLM": "1"}, True),
    ({"NVGEMM_VLLM": "0", "VLLM_PLUGINS": "nvgemm"}, False),
])
def test_opt_in(env, expected):
    assert plugin.opted_in(env) is expected


def test_opt_in_rejects_garbage():
    with pytest.raises(ValueError, match="NVGEMM_VLLM"):
        plugin.opted_in({"NVGEMM_VLLM": "maybe"})


@pytest.mark.parametrize("version", ["0.31.2", "0.33.1", "0.34.0", "unknown"])
def test_untested_vllm_is_a_clear_error(version):
    with pytest.raises(_compat.UnsupportedVllmError, match=rf"0\.32\.0 and 0\.33\.0, found vLLM {version}"):
        _compat.check_version(version)


def test_tested_versions_pass():
    assert _compat.check_version("0.32.0+cpu") == "0.32.0"
    assert _compat.check_version("0.33.0") == "0.33.0"
    assert _compat.check_version() in _compat.TESTED_VERSIONS  # the installed vLLM


def test_register_swaps_only_the_modelopt_nvfp4_configs(monkeypatch):
    from vllm.model_executor.layers.quantization import get_quantization_config

    monkeypatch.delenv("NVGEMM_VLLM", raising=False)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    plugin.register()  # not opted in: vLLM untouched
    assert get_quantization_config("modelopt_fp4").__module__.startswith("vllm.")
    monkeypatch.setenv("NVGEMM_VLLM", "1")
    plugin.register()
    from nvgemm.integrations.vllm.method import NvgemmModelOptMixedPrecisionConfig, NvgemmModelOptNvFp4Config

    assert get_quantization_config("modelopt_fp4") is NvgemmModelOptNvFp4Config
    assert get_quantization_config("modelopt_mixed") is NvgemmModelOptMixedPrecisionConfig
    assert get_quantization_config("modelopt").__module__.startswith("vllm.")  # FP8 stays vLLM's


def test_warmup_covers_every_cuda_graph_size_and_bucket(monkeypatch):
    """On a GPU, warm-up resolves each capture size vLLM will graph and each M-bucket bound up to the
    token budget; with enforce_eager no graph is captured, so only the buckets."""
    from types import SimpleNamespace

    import torch

    from nvgemm.heuristics import m_buckets
    from nvgemm.integrations.vllm import method

    def cfg(eager):
        return SimpleNamespace(compilation_config=SimpleNamespace(cudagraph_capture_sizes=[1, 2, 4, 24, 48, 200]),
                               model_config=SimpleNamespace(enforce_eager=eager),
                               scheduler_config=SimpleNamespace(max_num_batched_tokens=2048))

    buckets = {hi for _, hi in m_buckets(2048)}
    monkeypatch.setattr(method.V, "get_current_vllm_config_or_none", lambda: cfg(False))
    assert method.warmup_token_counts(torch.device("cuda")) == sorted(buckets | {1, 2, 4, 24, 48, 200})
    monkeypatch.setattr(method.V, "get_current_vllm_config_or_none", lambda: cfg(True))
    assert method.warmup_token_counts(torch.device("cuda")) == sorted(buckets)
    assert method.warmup_token_counts(torch.device("cpu")) == [1]


@pytest.mark.parametrize("one_copy", ["1", "0"])
def test_hopper_layer_holds_its_weight_once(monkeypatch, one_copy):
    """Issue 22 item 14, at vLLM's interface: a fused q/k/v layer (two GEMMs: unequal input scales)
    served by the sm90 kernels (nvgemm.testing.sm90_stand_in: the registry selects cutedsl_sm90 on
    CPU by its real rules, the launch is the emulated op on what it is handed) holds its weight once,
    in the sm90 layout, after process_weights_after_loading; apply equals the emulated op on the
    checkpoint tensors bit for bit. NVGEMM_SM90_ONE_COPY=0 keeps the checkpoint layout, and the
    kernels' copy beside it. Bytes: the layer's parameter and buffer storages plus what the launchers
    derived, against the prepared size computed from the shapes (16-row tiles, K padded to 256,
    K/2 + K/16 bytes a row)."""
    import logging

    import torch

    from nvgemm.core.formats import quantize_weight, to_blocked
    from nvgemm.ops.linear import nvfp4_linear_emulated
    from nvgemm.templates.common.derived import derived_nbytes
    from nvgemm.testing import sm90_stand_in
    from nvgemm.integrations.vllm import method

    monkeypatch.setenv("NVGEMM_SM90_ONE_COPY", one_copy)
    monkeypatch.setattr("vllm.model_executor.parameter.get_tensor_model_parallel_rank", lambda: 0)  # no TP group
    monkeypatch.setattr("vllm.model_executor.parameter.get_tensor_model_parallel_world_size", lambda: 1)
    gen = torch.Generator().manual_seed(14)
    k, widths = 256, [64, 32, 24]
    qs = [quantize_weight(torch.randn(n, k, generator=gen)) for n in widths]
    x = torch.randn(3, k, generator=gen).bfloat16()
    a = float(x.float().abs().amax()) / 2688
    ins = torch.tensor([a, a, 2 * a])  # v quantized with its own activation scale: a second GEMM
    bias = torch.randn(sum(widths), generator=gen).bfloat16()
    want = torch.cat([nvfp4_linear_emulated(x, q.packed, to_blocked(q.scale), q.global_scale.reshape(()),
                                            ins[i].reshape(()), bias[sum(widths[:i]):sum(widths[:i + 1])], None,
                                            "none", None) for i, q in enumerate(qs)], -1)

    layer = torch.nn.Module()
    m = method.NvgemmNvFp4LinearMethod(weight_only=False, prefix="model.layers.0.self_attn.qkv_proj")
    m.create_weights(layer, k, widths, k, sum(widths), torch.bfloat16, weight_loader=lambda *a, **kw: None)
    layer.bias = torch.nn.Parameter(bias, requires_grad=False)  # as vLLM's linear layers hold it
    with torch.no_grad():  # through each parameter's weight_loader, as vLLM loads (the plugin tracks them)
        for p, t in ((layer.weight, torch.cat([q.packed for q in qs])),
                     (layer.weight_scale, torch.cat([q.scale for q in qs])),
                     (layer.weight_scale_2, torch.stack([q.global_scale.reshape(()) for q in qs])),
                     (layer.input_scale, ins)):
            p.copy_(t)
            p.weight_loader(p, t)
    ckpt = sum(t.numel() for t in (layer.weight, layer.weight_scale))
    one = sum(-(-n // 16) * 16 * (k // 2 + k // 16) for n in (96, 24))  # the two GEMMs' rows
    lines = []
    catch = logging.Handler(logging.INFO)
    catch.emit = lambda r: lines.append(r.getMessage())
    method.log.addHandler(catch)
    level = method.log.level
    method.log.setLevel(logging.INFO)
    with sm90_stand_in() as launched:
        try:
            m.process_weights_after_loading(layer)
        finally:
            method.log.removeHandler(catch)
            method.log.setLevel(level)
        n = len(launched)
        got = m.apply(layer, x, layer.bias)
        # both GEMMs on the (stand-in) kernel, reading the layer's weight (beside first-use checks at M=3)
        on = [p.weight.untyped_storage().data_ptr() == layer.weight.untyped_storage().data_ptr() for p in launched[n:]]
        assert sum(on) == (2 if one_copy == "1" else 0) and len(on) >= 2
    assert torch.equal(got, want)
    # weight bytes: the storages of the layer's code / block-scale tensors (not its fp32 / bf16 scales and
    # bias), plus what the launchers derived from its weight
    codes = [t for t in list(layer.parameters()) + list(layer.buffers())
             if t.dtype in (torch.uint8, torch.float8_e4m3fn)]
    held = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in codes}.values())
    held += derived_nbytes(layer.weight)
    (line,) = [x for x in lines if "vLLM layer model.layers.0.self_attn.qkv_proj" in x]
    if one_copy == "1":
        assert m.sm90 is not None and layer.weight.shape == (8, 4 * 512)  # 6 + 2 tiles of 4 chunks
        assert held == one and one <= 1.1 * ckpt
        assert line.endswith(f"weight memory: sm90 layout only {one / 2**20:.2f} MiB + nvgemm copies 0.00 MiB")
    else:
        assert m.sm90 is None and held >= ckpt + one
        assert f"weight memory: checkpoint {ckpt / 2**20:.2f} MiB + nvgemm copies " in line
        assert "copies 0.00 MiB" not in line
