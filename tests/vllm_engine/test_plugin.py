"""The plugin's entry point, opt-in and version gate (in-process; no engine)."""

from __future__ import annotations

import importlib.metadata as md

import pytest

pytest.importorskip("vllm")

from nvgemm import vllm as plugin  # noqa: E402
from nvgemm.vllm import _compat  # noqa: E402

pytestmark = pytest.mark.vllm


def test_entry_point_is_installed():
    eps = {ep.name: ep.value for ep in md.entry_points(group="vllm.general_plugins")}
    assert eps.get("nvgemm") == "nvgemm.vllm:register"


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
    from nvgemm.vllm.method import NvgemmModelOptMixedPrecisionConfig, NvgemmModelOptNvFp4Config

    assert get_quantization_config("modelopt_fp4") is NvgemmModelOptNvFp4Config
    assert get_quantization_config("modelopt_mixed") is NvgemmModelOptMixedPrecisionConfig
    assert get_quantization_config("modelopt").__module__.startswith("vllm.")  # FP8 stays vLLM's


def test_warmup_covers_every_cuda_graph_size_and_bucket(monkeypatch):
    """On a GPU, warm-up resolves each capture size vLLM will graph and each M-bucket bound up to the
    token budget; with enforce_eager no graph is captured, so only the buckets."""
    from types import SimpleNamespace

    import torch

    from nvgemm.heuristics import m_buckets
    from nvgemm.vllm import method

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
