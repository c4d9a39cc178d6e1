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
  FP8 layers and MoE stay SGLang's), ``ModelOptFp4LinearMethod`` / ``ModelOptNvFp4A16LinearMethod``
  (the stock methods whose layers nvgemm takes over), ``ModelOptNvFp4FusedMoEMethod`` (named in the
  MoE warning).
* ``sglang.srt.layers.quantization.utils`` -> ``_FALLBACK_FUSED_SHARDS`` (private; SGLang's standard fused-layer
  -> shard names, which MIXED_PRECISION resolution needs for models without ``packed_modules_mapping``).
* ``sglang.srt.layers.linear`` -> ``LinearBase``, ``WEIGHT_LOADER_V2_SUPPORTED`` (a list of method
  class names: listing nvgemm's method gives its fused shards the per-shard scale loader).
* ``sglang.srt.layers.quantization.base_config`` -> ``LinearMethodBase`` (public base of quant methods).
* ``sglang.srt.layers.parameter`` -> ``ModelWeightParameter``, ``PerTensorScaleParameter`` (the
  parameter classes SGLang's own NVFP4 methods register; same names, shapes and loaders).
* ``sglang.srt.layers.moe.fused_moe_triton`` -> ``FusedMoE`` (recognised to leave it to SGLang).
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
    from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
    from sglang.srt.layers.parameter import ModelWeightParameter, PerTensorScaleParameter
    from sglang.srt.layers.quantization import CPU_QUANTIZATION_METHODS, QUANTIZATION_METHODS
    from sglang.srt.layers.quantization.base_config import LinearMethodBase
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
