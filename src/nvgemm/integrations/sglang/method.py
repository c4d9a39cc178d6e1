"""nvgemm's SGLang linear method and quantization configs (imported only after the version check).

:class:`NvgemmSglNvFp4LinearMethod` serves one NVFP4 (W4A4) or W4A16_NVFP4 linear layer of a ModelOpt
checkpoint through ``torch.ops.nvgemm.nvfp4_linear``; everything engine-agnostic (parameters, exact
fused-shard plan, sm90 one-copy layout, warm-up, the load log line, ``apply``) is
:class:`nvgemm.integrations.serving.ServedLinear`, shared with the vLLM plugin. This module supplies
only what SGLang decides: its parameter classes and weight loader, the model dtype, the graph sizes
and token budget to warm up for, and each layer's tensor-parallel rank.

The configs subclass SGLang's ``ModelOptFp4Config`` (``modelopt_fp4``) and
``ModelOptMixedPrecisionConfig`` (``modelopt_mixed``) and override ``get_quant_method`` only: a
``LinearBase`` layer whose stock method is exactly ``ModelOptFp4LinearMethod`` (W4A4) or
``ModelOptNvFp4A16LinearMethod`` (W4A16_NVFP4) gets nvgemm's method, and a ``FusedMoE`` layer with NVFP4 /
W4A16_NVFP4 experts nvgemm's fused-MoE method (:mod:`.moe`); everything else (excluded and FP8 layers,
``ParallelLMHead``, NVFP4 embeddings, KV-cache scales, MoE layers nvgemm declines) keeps SGLang's, and every
NVFP4 layer nvgemm declines is logged with its reason.

nvgemm's method deliberately does not subclass ``ModelOptFp4LinearMethod``: SGLang's model code keys
fusions on that class (a SwiGLU-interleaved gate_up weight, a pre-quantized FP4 input handed to
down_proj) whose tensors nvgemm does not take; with another class those fusions stay off.
"""

from __future__ import annotations

import logging

import torch

from nvgemm import settings
from nvgemm.integrations.serving import ServedLinear, note_unserved_checkpoint, warmup_sizes
from nvgemm.integrations.sglang import _compat

log = logging.getLogger("nvgemm_cutedsl.sglang")

S = _compat.load()


def warmup_token_counts(device: torch.device) -> list[int]:
    """Every size SGLang captures a graph for (decode batch sizes; prefill token buckets unless that
    backend is disabled) plus the policy's M-bucket bounds up to the prefill chunk size; [1] off CUDA."""
    sizes, budget = _compat.graph_sizes_and_budget()
    return warmup_sizes(sizes, budget, device)


class NvgemmSglNvFp4LinearMethod(S.LinearMethodBase):
    """NVFP4 / W4A16_NVFP4 linear layer served by ``nvgemm::nvfp4_linear`` (see the module docstring)."""

    def __init__(self, weight_only: bool, prefix: str, group_size: int = 16):
        if group_size != 16:
            raise ValueError(f"nvgemm: SGLang layer {prefix} has NVFP4 group_size {group_size}; NVFP4 uses 16")
        self.served = ServedLinear("SGLang", prefix, weight_only, log, settings.NVGEMM_SGLANG_DUMP)
        self.params_dtype = torch.bfloat16

    @property
    def prefix(self) -> str:
        return self.served.prefix

    def create_weights(self, layer, input_size_per_partition: int, output_partition_sizes: list[int],
                       input_size: int, output_size: int, params_dtype: torch.dtype, **extra_weight_attrs):
        del input_size, output_size
        k, widths = int(input_size_per_partition), [int(w) for w in output_partition_sizes]
        layer.logical_widths = widths
        layer.input_size_per_partition = k
        layer.output_size_per_partition = sum(widths)
        layer.params_dtype = params_dtype
        if params_dtype in (torch.bfloat16, torch.float16):
            self.params_dtype = params_dtype
        self.served.create_weights(layer, k, widths, extra_weight_attrs.get("weight_loader"),
                                   S.ModelWeightParameter, S.PerTensorScaleParameter)

    def process_weights_after_loading(self, layer) -> None:
        self.served.finish(layer, self.params_dtype, warmup_token_counts(layer.weight.device))

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.served.dump_dir is None:
            return self.served.apply(layer, x, bias)
        rank, size = S.get_group_rank_size(getattr(layer, "tp_group", None))
        return self.served.apply(layer, x, bias, rank, size)


#: SGLang's stock NVFP4 linear methods nvgemm replaces -> weight-only?
def _replaced() -> dict:
    return {S.ModelOptFp4LinearMethod: False, S.ModelOptNvFp4A16LinearMethod: True}


def _decline_reason(method, config) -> str | None:
    """Why nvgemm leaves a layer SGLang resolved to a stock NVFP4 linear method with SGLang (None: it serves it)."""
    cfg = getattr(method, "quant_config", config)
    if not getattr(cfg, "is_checkpoint_nvfp4_serialized", True):
        return "online (non-serialized) NVFP4 quantization"
    if getattr(cfg, "is_awq", False):
        return "NVFP4_AWQ (pre_quant_scale)"
    if getattr(cfg, "use_per_token_activation", False):
        return "per-token activation scales (SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION)"
    if getattr(method, "quant_mode", "w4a4") != "w4a4":
        return f"SGLang's {method.quant_mode} mode of a W4A4 checkpoint (SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16)"
    return None


def _swap(method, config, layer, prefix: str):
    """Swap SGLang's NVFP4 linear method for nvgemm's; anything else is returned unchanged (with a log
    line when it is an NVFP4 layer nvgemm declines)."""
    weight_only = _replaced().get(type(method))
    if weight_only is None:
        return method
    if not isinstance(layer, S.LinearBase):  # ParallelLMHead: SGLang's logits path checks the class name
        log.info("nvgemm_cutedsl: SGLang layer %s stays with SGLang's %s: %s is not a LinearBase layer", prefix,
                 type(method).__name__, type(layer).__name__)
        return method
    reason = _decline_reason(method, config)
    if reason is not None:
        log.info("nvgemm_cutedsl: SGLang layer %s stays with SGLang's %s: %s", prefix, type(method).__name__,
                 reason)
        return method
    cfg = getattr(method, "quant_config", config)
    return NvgemmSglNvFp4LinearMethod(weight_only=weight_only, prefix=prefix,
                                      group_size=int(getattr(cfg, "group_size", None) or 16))


def _moe_method(config, layer, prefix: str, algo: str):
    """nvgemm's fused-MoE method for an NVFP4 / W4A16_NVFP4 ``FusedMoE`` layer, or None (SGLang's), decided
    before SGLang would construct its ``ModelOptNvFp4FusedMoEMethod``."""
    # lazy: the MoE module imports SGLang's fused-MoE names only when a model has MoE layers
    from nvgemm.integrations.sglang.moe import moe_method_for

    return moe_method_for(config, layer, prefix, weight_only=algo == "W4A16_NVFP4",
                          group_size=int(getattr(config, "group_size", None) or 16))


class NvgemmSglModelOptFp4Config(S.ModelOptFp4Config):
    """``modelopt_fp4`` (NVFP4, W4A16_NVFP4) with its linear layers served by nvgemm."""

    @classmethod
    def override_quantization_method(cls, hf_quant_config, user_quant, *args, **kwargs):
        note_unserved_checkpoint(hf_quant_config, "SGLang")
        return super().override_quantization_method(hf_quant_config, user_quant, *args, **kwargs)

    def get_quant_method(self, layer, prefix: str):
        if isinstance(layer, S.FusedMoE) and self.is_checkpoint_nvfp4_serialized and not self.is_layer_excluded(prefix):
            moe = _moe_method(self, layer, prefix, "W4A16_NVFP4" if getattr(self, "is_w4a16", False) else "NVFP4")
            if moe is not None:
                return moe
        return _swap(super().get_quant_method(layer, prefix), self, layer, prefix)


class NvgemmSglModelOptMixedPrecisionConfig(S.ModelOptMixedPrecisionConfig):
    """``modelopt_mixed`` (MIXED_PRECISION) with its NVFP4 / W4A16_NVFP4 linear layers served by nvgemm.

    The checkpoint's ``quantized_layers`` name the unfused projections (``q_proj``, ``gate_proj``, ...); SGLang
    resolves a fused layer (``qkv_proj``, ``gate_up_proj``) through the model class's
    ``packed_modules_mapping``, which some model classes (Llama) do not define: SGLang then builds those layers
    unquantized and fails loading their NVFP4 tensors. nvgemm adds SGLang's own standard fused-shard names
    for the fused layers the model does not map, so they resolve like the rest (all shards must agree, as
    SGLang requires)."""

    def get_quant_method(self, layer, prefix: str):
        mapping = dict(self.packed_modules_mapping or {})
        for fused, shards in S.FALLBACK_FUSED_SHARDS.items():
            mapping.setdefault(fused, list(shards))
        self.packed_modules_mapping = mapping
        if isinstance(layer, S.FusedMoE) and not self.is_layer_excluded(prefix):
            algo = self._resolve_quant_algo(prefix)
            if algo in ("NVFP4", "W4A16_NVFP4"):
                sub = self.nvfp4_config if algo == "NVFP4" else self.nvfp4a16_config
                moe = _moe_method(sub, layer, prefix, algo)
                if moe is not None:
                    return moe
        return _swap(super().get_quant_method(layer, prefix), self, layer, prefix)


def register_configs() -> None:
    """Replace the ``modelopt_fp4`` / ``modelopt_mixed`` registry entries in place and give nvgemm's
    method SGLang's per-shard (v2) weight loader."""
    for registry in (S.QUANTIZATION_METHODS, S.CPU_QUANTIZATION_METHODS):
        if registry is S.QUANTIZATION_METHODS or _amx_cpu():
            registry["modelopt_fp4"] = NvgemmSglModelOptFp4Config
            registry["modelopt_mixed"] = NvgemmSglModelOptMixedPrecisionConfig
    name = NvgemmSglNvFp4LinearMethod.__name__
    if name not in S.WEIGHT_LOADER_V2_SUPPORTED:
        S.WEIGHT_LOADER_V2_SUPPORTED.append(name)


def _amx_cpu() -> bool:
    """SGLang consults CPU_QUANTIZATION_METHODS instead of the main registry on an AMX CPU."""
    return bool(S.is_cpu() and S.cpu_has_amx_support())
