"""Every SGLang name nvgemm's plugin touches, in one place, with the SGLang versions it was checked against.

Checked by reading the source of 0.5.23 and by running its Python engine on CPU end to end
(tests/sglang_engine, ``.ci/sglang_e2e``). Any other release fails in :func:`check_version` with a
clear error when the plugin registers, before a model is built, so a changed internal can never
produce wrong output silently.

Names used (module -> name: why; public = documented extension point):

* distribution ``sglang`` -> its version (``importlib.metadata``: no import of SGLang needed).
* entry-point group ``sglang.srt.plugins`` and the ``SGLANG_PLUGINS`` allow-list (public, the
  "Multi platform Plugin" interface): SGLang calls ``register`` in every process it starts.
* ``sglang.srt.layers.quantization`` -> ``QUANTIZATION_METHODS`` (dict; replaced in place: the
  model config and the weight loader import this same object), ``CPU_QUANTIZATION_METHODS`` (the
  registry consulted instead on an AMX CPU).
* ``sglang.srt.layers.quantization.modelopt_quant`` -> ``ModelOptFp4Config`` and
  ``ModelOptMixedPrecisionConfig`` (subclassed: checkpoint parsing, exclusions, KV cache, embeddings,
  FP8 layers and the MoE layers nvgemm declines stay SGLang's), ``ModelOptFp4LinearMethod`` / ``ModelOptNvFp4A16LinearMethod``
  (the stock methods whose layers nvgemm takes over), ``ModelOptNvFp4FusedMoEMethod`` (what SGLang keeps for
  the MoE layers nvgemm declines).
* ``sglang.srt.layers.quantization.utils`` -> ``_FALLBACK_FUSED_SHARDS`` (private; SGLang's standard fused-layer
  -> shard names, which MIXED_PRECISION resolution needs for models without ``packed_modules_mapping``).
* ``sglang.srt.layers.linear`` -> ``LinearBase``, ``WEIGHT_LOADER_V2_SUPPORTED`` (a list of method
  class names: listing nvgemm's method gives its fused shards the per-shard scale loader).
* ``sglang.srt.layers.quantization.base_config`` -> ``LinearMethodBase`` (public base of quant methods).
* ``sglang.srt.layers.parameter`` -> ``ModelWeightParameter``, ``PerTensorScaleParameter`` (the
  parameter classes SGLang's own NVFP4 methods register; same names, shapes and loaders).
* ``sglang.srt.layers.moe.fused_moe_triton`` -> ``FusedMoE`` (the layer whose routed experts nvgemm's MoE
  method serves: read at ``get_quant_method`` time are ``moe_runner_config`` (``activation``, ``is_gated``,
  ``top_k``, ``num_experts``, ``params_dtype``, ``apply_router_weight_on_input``, ``num_fused_shared_experts``,
  the gemm1 / swiglu options), ``with_bias``; at load and call time ``moe_tp_rank`` / ``moe_tp_size`` /
  ``moe_ep_rank`` / ``moe_ep_size``), ``FusedMoeWeightScaleSupported`` (the ``quant_method`` tags of
  SGLang's generic expert loader: ``block`` scales are sliced like weights, ``tensor`` ones written per
  gate / up slot). That loader routes methods whose *class name* contains ``ModelOpt`` through a
  ModelOpt-by-name branch (block scales loaded as per-tensor unless the method is SGLang's own
  ``ModelOptNvFp4FusedMoEMethod``), so nvgemm's MoE method is named without it, and it writes an input
  scale into both gate / up slots of an expert, so nvgemm hands it one slot at a time. SGLang's
  ``FusedMoE`` keys FlashInfer / TRT-LLM layouts, routed-scaling fusion into top-k and deferred finalize
  on ``isinstance(method, ModelOptNvFp4FusedMoEMethod)``: with nvgemm's method all of those stay off,
  which is what a direct kernel wants.
* ``sglang.srt.layers.quantization.base_config`` -> ``FusedMoEMethodBase`` (public base of MoE quant
  methods: ``create_weights``, ``create_moe_runner``, ``get_moe_runner_backend`` -- ``None``, "a direct
  kernel consuming standard top-k with local expert ids" -- and ``apply(layer, dispatch_output)``).
* ``sglang.srt.layers.moe`` -> ``get_moe_a2a_backend``, ``get_moe_runner_backend`` (the user's
  ``--moe-a2a-backend`` / ``--moe-runner-backend``: nvgemm serves the default ``none`` / ``auto`` only).
* ``sglang.srt.layers.moe.topk`` -> ``TopKOutputChecker`` (standard top-k output: ``topk_ids``,
  ``topk_weights``); ``sglang.srt.layers.moe.token_dispatcher.standard`` -> ``StandardCombineInput`` (what
  ``apply`` returns; the standard dispatcher has mapped the router's ids to local ones, -1 elsewhere).
* ``sglang.srt.layers.quantization.modelopt_quant`` -> ``ModelOptMixedPrecisionConfig._resolve_quant_algo``
  (private; a MIXED_PRECISION layer's algorithm) and its ``nvfp4_config`` / ``nvfp4a16_config``,
  ``ModelOptFp4Config.is_w4a16`` / ``is_checkpoint_nvfp4_serialized`` / ``is_layer_excluded`` / ``group_size``:
  nvgemm decides a ``FusedMoE`` layer before SGLang would construct ``ModelOptNvFp4FusedMoEMethod``, whose
  constructor raises on every device but Blackwell and Marlin-capable GPUs.
* ``sglang.srt.distributed.utils`` -> ``get_group_rank_size`` (a linear layer's ``tp_group`` -> rank,
  size; for dumps).
* ``sglang.srt.utils`` -> ``is_cpu``, ``cpu_has_amx_support`` (when both hold, SGLang reads
  ``CPU_QUANTIZATION_METHODS``, so nvgemm's configs go there too).
* ``sglang.srt.runtime_context`` -> ``get_exec().graph.cuda_graph_config`` (``decode`` / ``prefill``
  phases: ``backend``, ``bs``) and ``get_schedule().chunked_prefill_size``: the graph sizes and token
  budget warm-up covers.
"""

from __future__ import annotations

#: SGLang releases whose internals listed above were checked (0.5.23 by source and the CPU engine).
TESTED_VERSIONS = ("0.5.23",)


class UnsupportedSglangError(RuntimeError):
    """The installed SGLang is not one nvgemm's plugin was checked against."""


def installed_version() -> str:
    import importlib.metadata as md

    try:
        return md.version("sglang")
    except md.PackageNotFoundError:
        return "not installed"


def _release(version: str) -> str:
    return version.split("+", 1)[0]


def check_version(version: str | None = None) -> str:
    """The installed SGLang's release if it is tested; otherwise raise :class:`UnsupportedSglangError`."""
    if version is None:
        version = installed_version()
    if _release(version) not in TESTED_VERSIONS:
        raise UnsupportedSglangError(
            f"nvgemm's SGLang plugin supports SGLang {' and '.join(TESTED_VERSIONS)}, found SGLang {version}. "
            "It replaces SGLang internals that change between releases, so it refuses to run rather than risk "
            "wrong output. Install a tested SGLang (pip install \"nvgemm[sglang]\"), or unset NVGEMM_SGLANG "
            "(and leave nvgemm out of SGLANG_PLUGINS) to serve without nvgemm.")
    return _release(version)


def load():
    """Import the SGLang names above (after :func:`check_version`); returns a namespace."""
    from types import SimpleNamespace

    from sglang.srt.distributed.utils import get_group_rank_size
    from sglang.srt.layers.linear import WEIGHT_LOADER_V2_SUPPORTED, LinearBase
    from sglang.srt.layers.moe import get_moe_a2a_backend, get_moe_runner_backend
    from sglang.srt.layers.moe.fused_moe_triton import FusedMoE, FusedMoeWeightScaleSupported
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardCombineInput
    from sglang.srt.layers.moe.topk import TopKOutputChecker
    from sglang.srt.layers.parameter import ModelWeightParameter, PerTensorScaleParameter
    from sglang.srt.layers.quantization import CPU_QUANTIZATION_METHODS, QUANTIZATION_METHODS
    from sglang.srt.layers.quantization.base_config import FusedMoEMethodBase, LinearMethodBase
    from sglang.srt.layers.quantization.utils import _FALLBACK_FUSED_SHARDS as FALLBACK_FUSED_SHARDS
    from sglang.srt.layers.quantization.modelopt_quant import (
        ModelOptFp4Config,
        ModelOptFp4LinearMethod,
        ModelOptMixedPrecisionConfig,
        ModelOptNvFp4A16LinearMethod,
        ModelOptNvFp4FusedMoEMethod,
    )
    from sglang.srt.runtime_context import get_exec, get_schedule
    from sglang.srt.utils import cpu_has_amx_support, is_cpu

    return SimpleNamespace(**{k: v for k, v in locals().items() if k != "SimpleNamespace"})  # noqa: the names above


def graph_sizes_and_budget() -> tuple[list[int], int]:
    """(every batch / token size SGLang captures a CUDA graph for, the prefill chunk size); ([], 256)
    before SGLang has published its runtime configuration (e.g. a layer built outside an engine)."""
    from sglang.srt.runtime_context import get_exec, get_schedule

    sizes: list[int] = []
    try:
        cg = get_exec().graph.cuda_graph_config
    except ValueError:  # "not published"
        return sizes, 256
    if cg is not None:
        for phase in (cg.decode, cg.prefill):
            if str(getattr(phase.backend, "value", phase.backend)) != "disabled":
                sizes.extend(int(b) for b in (phase.bs or []))
    try:
        budget = int(get_schedule().chunked_prefill_size or 0)
    except ValueError:
        budget = 0
    return sizes, budget if budget > 0 else 8192
