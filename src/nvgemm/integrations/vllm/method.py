"""nvgemm's vLLM quant method and quantization configs (imported only after the version check).

:class:`NvgemmNvFp4LinearMethod` serves one NVFP4 (W4A4) or W4A16_NVFP4 linear layer through
``torch.ops.nvgemm.nvfp4_linear``:

* ``create_weights`` registers the parameters vLLM's own NVFP4 scheme registers (same names,
  shapes, dtypes and parameter classes), so vLLM's loaders fill them unchanged, including fused
  q/k/v and gate/up shards and tensor-parallel slices: ``weight`` uint8 [N, K/2], ``weight_scale``
  e4m3 [N, K/16], ``weight_scale_2`` and (W4A4) ``input_scale`` with one value per shard.
* ``process_weights_after_loading`` keeps each shard's scales (:func:`nvgemm.integrations.serving.plan_gemms`:
  scalar alpha when shards agree, per-column alpha or separate GEMMs when they do not), swizzles
  the block scales once, warms up every kernel the layer will use (before vLLM captures CUDA
  graphs) and logs once which backend serves the layer and why a faster one does not. On Hopper,
  when the sm90 kernels serve every (GEMM, M), the weight is replaced by their layout first
  (:func:`nvgemm.integrations.serving.hold_sm90`: one copy on the GPU; ``NVGEMM_SM90_ONE_COPY=0`` keeps the
  checkpoint layout and the kernels' copy beside it); the log line states the bytes held.
* ``apply`` is one ``nvfp4_linear`` per GEMM: traceable by torch.compile (the op has a fake
  implementation) and free of allocations other than the op's own output.

All of that is the engine-agnostic :class:`nvgemm.integrations.serving.ServedLinear`, shared with the SGLang
plugin; this module supplies what vLLM decides (parameter classes, loader, model dtype, CUDA-graph sizes, rank).

The configs subclass vLLM's ModelOpt configs, so checkpoint parsing, exclusions and KV-cache handling
stay vLLM's; the linear layers vLLM resolves to NVFP4 are swapped, and NVFP4 / W4A16_NVFP4 routed-expert
(``RoutedExperts``) layers get nvgemm's fused-MoE method (:mod:`nvgemm.integrations.vllm.moe`).
"""

from __future__ import annotations

import logging

import torch

from nvgemm import settings
from nvgemm.integrations.serving import ServedLinear, note_unserved_checkpoint
from nvgemm.integrations.vllm import _compat
from nvgemm.integrations.vllm.engine import model_dtype as _model_dtype, warmup_token_counts

log = logging.getLogger("nvgemm_cutedsl.vllm")

V = _compat.load()


@V.register_weight_loader_v2_supported_method
class NvgemmNvFp4LinearMethod(V.LinearMethodBase):
    """NVFP4 / W4A16_NVFP4 linear layer served by ``nvgemm::nvfp4_linear`` (see the module docstring):
    the engine-agnostic layer is :class:`nvgemm.integrations.serving.ServedLinear`; this class supplies
    vLLM's parameter classes and loader, the model dtype, the warm-up sizes and the rank for dumps."""

    def __init__(self, weight_only: bool, prefix: str, group_size: int = 16):
        if group_size != 16:
            raise ValueError(f"nvgemm: layer {prefix} has NVFP4 group_size {group_size}; NVFP4 uses 16")
        self.served = ServedLinear("vLLM", prefix, weight_only, log, settings.NVGEMM_VLLM_DUMP)

    @property
    def prefix(self) -> str:
        return self.served.prefix

    @property
    def weight_only(self) -> bool:
        return self.served.weight_only

    @property
    def gemms(self):
        return self.served.gemms

    @property
    def sm90(self):
        """The layer's :class:`~nvgemm.integrations.serving.Sm90Held` when its weight is held once, in the sm90 layout."""
        return self.served.sm90

    @property
    def tracker(self):
        return self.served.tracker

    def create_weights(self, layer, input_size_per_partition: int, output_partition_sizes: list[int],
                       input_size: int, output_size: int, params_dtype: torch.dtype, **extra_weight_attrs):
        del input_size, output_size
        k, widths = int(input_size_per_partition), [int(w) for w in output_partition_sizes]
        layer.logical_widths = widths
        layer.input_size_per_partition = k
        layer.output_size_per_partition = sum(widths)
        self.served.create_weights(layer, k, widths, extra_weight_attrs.get("weight_loader"),
                                   V.ModelWeightParameter, V.PerTensorScaleParameter)

    def process_weights_after_loading(self, layer) -> None:
        bias = getattr(layer, "bias", None)
        x_dtype = bias.dtype if bias is not None and bias.dtype in (torch.bfloat16, torch.float16) else \
            _model_dtype()
        self.served.finish(layer, x_dtype, warmup_token_counts(layer.weight.device))

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.served.apply(layer, x, bias, int(getattr(layer, "tp_rank", 0)), int(getattr(layer, "tp_size", 1)))


def _nvgemm_method(method, layer, prefix: str):
    """Swap vLLM's NVFP4 linear method for nvgemm's; anything else is returned unchanged."""
    if not isinstance(method, V.ModelOptLinearMethod) or not isinstance(layer, V.LinearBase):
        return method
    spec = method.spec
    if spec.weight != V.kNvfp4Static or spec.activation not in (None, V.kNvfp4Dynamic):
        return method
    return NvgemmNvFp4LinearMethod(weight_only=spec.activation is None, prefix=prefix,
                                   group_size=method.ctx.group_size or 16)


_MOE_WARNED = []


def _moe_method(config, layer, prefix: str, algo: str | None, sub_config):
    """nvgemm's fused-MoE method for an NVFP4 / W4A16_NVFP4 ``RoutedExperts`` layer, or None (vLLM's)."""
    if not isinstance(layer, V.RoutedExperts) or algo not in ("NVFP4", "W4A16_NVFP4") or sub_config is None:
        return None
    if not _compat.moe_supported():
        if not _MOE_WARNED:
            _MOE_WARNED.append(True)
            log.warning("nvgemm_cutedsl: nvgemm's MoE method was checked against vLLM %s only; MoE layers stay with "
                        "vLLM's own method on this vLLM", ", ".join(_compat.MOE_TESTED_VERSIONS))
        return None
    if config.is_layer_excluded(prefix):
        return None
    # lazy: imported only on a vLLM whose fused-MoE names were checked (_compat.moe_supported above)
    from nvgemm.integrations.vllm.moe import moe_method_for

    return moe_method_for(config, layer, prefix, weight_only=algo == "W4A16_NVFP4",
                          group_size=int(getattr(sub_config, "group_size", None) or 16))


class NvgemmModelOptNvFp4Config(V.ModelOptNvFp4Config):
    """``modelopt_fp4`` (NVFP4, W4A16_NVFP4) with linear and routed-expert layers served by nvgemm."""

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, *args, **kwargs):
        # vLLM asks every registered config whether it claims the checkpoint (ModelConfig's
        # _verify_quantization loop); nvgemm claims nothing new here, it only says when an NVFP4
        # checkpoint will not be served by nvgemm
        note_unserved_checkpoint(hf_quant_cfg)
        return super().override_quantization_method(hf_quant_cfg, user_quant, *args, **kwargs)

    def get_quant_method(self, layer, prefix: str):
        moe = _moe_method(self, layer, prefix, self.quant_method, self)
        if moe is not None:
            return moe
        return _nvgemm_method(super().get_quant_method(layer, prefix), layer, prefix)


class NvgemmModelOptMixedPrecisionConfig(V.ModelOptMixedPrecisionConfig):
    """``modelopt_mixed`` (MIXED_PRECISION) with its NVFP4 / W4A16_NVFP4 linear and routed-expert layers
    served by nvgemm."""

    def get_quant_method(self, layer, prefix: str):
        if isinstance(layer, V.RoutedExperts):
            algo = self._resolve_quant_algo(prefix)
            sub = {"NVFP4": getattr(self, "nvfp4_config", None),
                   "W4A16_NVFP4": getattr(self, "w4a16_nvfp4_config", None)}.get(algo)
            moe = _moe_method(self, layer, prefix, algo, sub)
            if moe is not None:
                return moe
        return _nvgemm_method(super().get_quant_method(layer, prefix), layer, prefix)


def register_configs() -> None:
    V.register_quantization_config("modelopt_fp4")(NvgemmModelOptNvFp4Config)
    V.register_quantization_config("modelopt_mixed")(NvgemmModelOptMixedPrecisionConfig)
