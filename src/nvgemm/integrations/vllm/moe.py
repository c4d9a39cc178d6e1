"""nvgemm's vLLM fused-MoE quant method: ModelOpt NVFP4 / W4A16_NVFP4 routed experts on ``nvgemm::nvfp4_moe``.

:class:`NvgemmModelOptNvFp4FusedMoE` is returned by nvgemm's ``modelopt_fp4`` / ``modelopt_mixed``
configs for vLLM's ``RoutedExperts`` layers whose checkpoint algorithm is NVFP4 or W4A16_NVFP4 (see
:func:`moe_method_for`). vLLM keeps everything around the experts: the router (``topk_ids`` /
``topk_weights``, grouped top-k, correction bias, scaling), the shared experts (run by vLLM's MoE
runner and added by it), tensor parallelism (each rank holds ``I / tp`` of every expert; vLLM
all-reduces) and expert parallelism (``layer.expert_map``: global id -> local slot or -1).

* ``create_weights`` registers the parameters vLLM's own ``ModelOptNvFp4FusedMoE`` registers (same
  names, shapes, dtypes, parameter classes), so vLLM's expert-mapping loader fills them unchanged,
  with per-expert input scales indexed by *local* expert (an EP rank holds its own experts' scales).
* ``process_weights_after_loading`` keeps every scale exact: ``w13_weight_scale_2 [E, 2]`` stays a
  per-expert scalar when gate == up and becomes the exact per-row alpha ``[E, 2I]`` otherwise (vLLM
  keeps the gate's only); per-expert input scales stay per expert (vLLM's FlashInfer paths take one
  max); gate and up input scales of one expert must be equal (same input). Block scales are swizzled
  per expert. It then resolves (and on a GPU warms up) the backend for each token count and logs
  which backend serves the layer.
* ``apply`` is one ``torch.ops.nvgemm.nvfp4_moe`` call (traceable: the op has a fake implementation).

The parameters, the exact-scale conversion, the warm-up and log line, the call and the dump are
engine-agnostic, shared with the SGLang plugin (:mod:`nvgemm.integrations.serving_moe`); this module
supplies vLLM's parameter classes and loader, its layer attributes, graph sizes and expert map.
"""

from __future__ import annotations

import logging

import torch

from nvgemm import settings
from nvgemm.integrations.serving_moe import (
    create_moe_weights,
    dump_moe_call,
    finish_moe_weights,
    resolve_moe,
    routing_operands,
    run_moe,
)
from nvgemm.integrations.vllm import _compat
from nvgemm.integrations.vllm.engine import model_dtype as _model_dtype, warmup_token_counts

log = logging.getLogger("nvgemm_cutedsl.vllm")

V = _compat.load()

#: vLLM MoE activation -> nvfp4_moe activation (others stay with vLLM).
ACTIVATIONS = {"silu": "silu_mul", "silu_no_mul": "silu", "relu2_no_mul": "relu2", "gelu_tanh_no_mul": "gelu_tanh"}


def unsupported_reason(layer) -> str | None:
    """Why nvgemm cannot serve this ``RoutedExperts`` layer (None: it can)."""
    act = getattr(getattr(layer, "activation", None), "value", None)
    if act not in ACTIVATIONS:
        return f"activation {act!r} (nvgemm serves {sorted(ACTIVATIONS)})"
    for name in ("swiglu_limit", "swiglu_alpha", "swiglu_beta"):
        if getattr(layer, name, None) is not None:
            return f"{name} is set"
    mc = layer.moe_config
    if getattr(mc, "has_bias", False):
        return "expert biases"
    if getattr(mc.moe_parallel_config, "use_all2all_kernels", False):
        return "all-to-all expert-parallel kernels (nvgemm serves TP and EP through expert_map)"
    return None


def moe_method_for(config, layer, prefix: str, weight_only: bool, group_size: int):
    """nvgemm's method for ``layer`` if it can serve it, else None (the caller falls back to vLLM's)."""
    reason = unsupported_reason(layer)
    if reason is not None:
        log.info("nvgemm_cutedsl: vLLM MoE layer %s stays with vLLM: %s", prefix, reason)
        return None
    if group_size != 16:
        raise ValueError(f"nvgemm: MoE layer {prefix} has NVFP4 group_size {group_size}; NVFP4 uses 16")
    return NvgemmModelOptNvFp4FusedMoE(layer.moe_config, weight_only, prefix)


class NvgemmModelOptNvFp4FusedMoE(V.FusedMoEMethodBase):
    """Routed NVFP4 / W4A16_NVFP4 experts served by ``nvgemm::nvfp4_moe`` (see the module docstring).

    The class name contains ``ModelOpt`` on purpose: vLLM's FusedMoE weight loader selects its
    per-shard handling of ``weight_scale_2`` / ``input_scale`` by that substring (``_compat``).
    """

    def __init__(self, moe_config, weight_only: bool, prefix: str):
        super().__init__(moe_config)
        self.weight_only = weight_only
        self.prefix = prefix
        self.use_global_sf = False  # input scales are loaded per *local* expert
        self.dump_dir = settings.NVGEMM_VLLM_DUMP
        self.activation = None

    def uses_weight_scale_2_pattern(self) -> bool:
        return True

    def create_weights(self, layer, num_experts: int, hidden_size: int, intermediate_size_per_partition: int,
                       params_dtype: torch.dtype, **extra_weight_attrs):
        layer.num_experts = int(num_experts)
        layer.params_dtype = params_dtype
        create_moe_weights(layer, self.prefix, "vLLM", num_experts, hidden_size, intermediate_size_per_partition,
                           self.moe.is_act_and_mul, extra_weight_attrs.get("weight_loader"), V.ModelWeightParameter,
                           V.PerTensorScaleParameter)

    def process_weights_after_loading(self, layer) -> None:
        self.activation = ACTIVATIONS[layer.activation.value]
        finish_moe_weights(layer, self.prefix, "vLLM", self.weight_only, log)
        self._resolve(layer)

    def _expert_map(self, layer):
        em = layer.expert_map
        return None if em is None else (em if em.dtype == torch.int32 else em.to(torch.int32))

    def _resolve(self, layer) -> None:
        """Select (and on a GPU warm up) the backend for every token count; log the choice once."""
        resolve_moe(layer, self.prefix, "vLLM", self.weight_only, self.activation, _model_dtype(),
                    warmup_token_counts(layer.w13_weight.device), int(layer.top_k), int(layer.global_num_experts),
                    int(layer.global_num_experts), bool(layer.apply_router_weight_on_input), self._expert_map(layer),
                    log)

    def get_fused_moe_quant_config(self, layer):
        return None  # no vLLM modular kernel: apply() runs nvgemm's op

    def apply(self, layer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, shared_experts,
              shared_experts_input):
        del shared_experts, shared_experts_input  # vLLM's runner runs and adds the shared experts
        ids, wts = routing_operands(topk_ids, topk_weights)
        em = self._expert_map(layer)
        rwoi = bool(layer.apply_router_weight_on_input)
        out = run_moe(layer, x, ids, wts, self.activation, rwoi, em)
        if self.dump_dir is not None:
            mc = layer.moe_config
            dump_moe_call(self.dump_dir, self.prefix, int(mc.tp_rank) if not mc.use_ep else int(mc.ep_rank),
                          int(mc.tp_size), int(mc.ep_size) if mc.use_ep else 1, x, ids, wts, em, self.activation,
                          rwoi, out)
        return out
