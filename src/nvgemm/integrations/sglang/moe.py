"""nvgemm's SGLang fused-MoE method: ModelOpt NVFP4 / W4A16_NVFP4 routed experts on ``nvgemm::nvfp4_moe``.

:class:`NvgemmSglNvFp4FusedMoEMethod` is what nvgemm's ``modelopt_fp4`` / ``modelopt_mixed`` configs return
for SGLang's ``FusedMoE`` layers whose checkpoint algorithm is NVFP4 or W4A16_NVFP4 (:func:`moe_method_for`).
It is an ordinary ``FusedMoEMethodBase`` (SGLang's public base of MoE quant methods), not a subclass of
SGLang's ``ModelOptNvFp4FusedMoEMethod``: that class's constructor refuses every device but Blackwell and
Marlin-capable GPUs, and SGLang's fused-MoE layer keys FlashInfer / TRT-LLM layouts and runner choices on
it. nvgemm's method takes the generic paths instead:

* ``create_weights`` registers the parameters SGLang's ModelOpt method registers (same names, shapes,
  dtypes, SGLang's parameter classes and the layer's own weight loader), tagged the way SGLang's generic
  loader expects (block scales ``quant_method="block"``, per-tensor scales ``"tensor"``), so SGLang loads
  them with its expert mapping, tensor-parallel slicing and expert-parallel placement unchanged, indexed
  by *local* expert. Input scales are loaded per gate / up slot (SGLang's loader writes one value per
  expert), so an expert whose gate and up input scales differ is refused, not silently collapsed.
* ``create_moe_runner`` builds no SGLang runner: ``get_moe_runner_backend`` stays ``None``, which SGLang
  defines as "a direct kernel consuming standard top-k with local expert ids". So SGLang's router runs
  as for any such method (standard top-k output, routed scaling applied by the model), and under expert
  parallelism SGLang's dispatcher maps the router's global ids to this rank's local ids (-1 elsewhere),
  which ``nvfp4_moe`` skips. Shared experts, the all-reduce and EP placement stay SGLang's.
* ``process_weights_after_loading`` keeps every scale exact and warms up
  (:mod:`nvgemm.integrations.serving_moe`, shared with the vLLM plugin) and logs the layer's backend.
* ``apply`` is one ``torch.ops.nvgemm.nvfp4_moe`` call, returned as SGLang's standard combine input.
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
from nvgemm.integrations.serving import warmup_sizes
from nvgemm.integrations.sglang import _compat

log = logging.getLogger("nvgemm_cutedsl.sglang")

S = _compat.load()

#: (SGLang MoE activation, gated) -> nvfp4_moe activation (others stay with SGLang).
ACTIVATIONS = {("silu", True): "silu_mul", ("silu", False): "silu", ("relu2", False): "relu2",
               ("gelu_tanh", False): "gelu_tanh"}


def unsupported_reason(layer, quant_config=None) -> str | None:
    """Why nvgemm leaves this ``FusedMoE`` layer to SGLang (None: nvgemm serves it). Read at
    ``get_quant_method`` time, when SGLang has built the layer's runner config but no weights."""
    if getattr(quant_config, "is_awq", False):
        return "NVFP4_AWQ (pre_quant_scale)"
    if getattr(quant_config, "use_per_token_activation", False):
        return "per-token activation scales (SGLANG_FLASHINFER_NVFP4_PER_TOKEN_ACTIVATION)"
    rc = layer.moe_runner_config
    if (rc.activation, bool(rc.is_gated)) not in ACTIVATIONS:
        return f"activation {rc.activation!r} ({'gated' if rc.is_gated else 'not gated'})"
    for name in ("gemm1_alpha", "gemm1_beta", "gemm1_clamp_limit", "swiglu_limit"):
        if getattr(rc, name, None) is not None:
            return f"{name} is set"
    if getattr(layer, "with_bias", False):
        return "expert biases"
    if int(getattr(rc, "num_fused_shared_experts", 0) or 0):
        return "shared experts fused into the routed experts (SGLang's shared-experts fusion)"
    if not S.get_moe_a2a_backend().is_none():
        return f"all-to-all expert-parallel backend {S.get_moe_a2a_backend().value!r} (nvgemm serves TP and EP " \
               "with SGLang's standard dispatcher)"
    runner = S.get_moe_runner_backend()
    if not runner.is_auto():
        return f"--moe-runner-backend {runner.value} was chosen"
    if getattr(layer, "is_shared_fused_moe", False):
        return "a shared-expert FusedMoE layer"
    return None


_DECLINED: list = []


def moe_method_for(quant_config, layer, prefix: str, weight_only: bool, group_size: int):
    """nvgemm's method for ``layer`` if it can serve it, else None (the caller returns SGLang's own)."""
    reason = unsupported_reason(layer, quant_config)
    if reason is not None:
        if not _DECLINED:  # one warning per process, naming the first layer and the reason
            _DECLINED.append(prefix)
            log.warning("nvgemm_cutedsl: SGLang MoE layer %s (and any like it) stays with SGLang's "
                        "ModelOptNvFp4FusedMoEMethod: %s", prefix, reason)
        return None
    if group_size != 16:
        raise ValueError(f"nvgemm: SGLang MoE layer {prefix} has NVFP4 group_size {group_size}; NVFP4 uses 16")
    return NvgemmSglNvFp4FusedMoEMethod(quant_config, weight_only, prefix)


class _Slot:
    """One gate / up column of a per-expert ``[E, 2]`` input-scale parameter, handed to SGLang's loader, which
    writes an input scale into ``param.data[local expert]`` whole (both slots); everything else is the
    parameter's."""

    def __init__(self, param, idx: int):
        object.__setattr__(self, "_param", param)
        object.__setattr__(self, "data", param.data[:, idx])

    def __getattr__(self, name):
        return getattr(self._param, name)


def _per_slot_loader(loader):
    if loader is None:
        return None

    def load(param, loaded_weight, *args, **kwargs):
        shard = kwargs.get("shard_id", args[1] if len(args) > 1 else None)
        if param.data.dim() == 2 and param.data.shape[1] == 2 and shard in ("w1", "w3"):
            param = _Slot(param, 0 if shard == "w1" else 1)
        return loader(param, loaded_weight, *args, **kwargs)

    return load


class NvgemmSglNvFp4FusedMoEMethod(S.FusedMoEMethodBase):
    """Routed NVFP4 / W4A16_NVFP4 experts served by ``nvgemm::nvfp4_moe`` (see the module docstring).

    The class name must not contain ``ModelOpt``: SGLang's fused-MoE loader sends methods whose class name
    does through its ModelOpt-by-name branch, which loads an NVFP4 block scale as a per-tensor one unless
    the method is SGLang's own ``ModelOptNvFp4FusedMoEMethod`` (``_compat``)."""

    def __init__(self, quant_config, weight_only: bool, prefix: str):
        super().__init__()
        self.quant_config = quant_config
        self.weight_only = weight_only
        self.prefix = prefix
        self.activation: str | None = None
        self.dump_dir = settings.NVGEMM_SGLANG_DUMP or None

    def create_weights(self, layer, num_experts: int, hidden_size: int, intermediate_size_per_partition: int,
                       params_dtype: torch.dtype, **extra_weight_attrs):
        rc = layer.moe_runner_config
        self.activation = ACTIVATIONS[(rc.activation, bool(rc.is_gated))]
        layer.params_dtype = params_dtype
        wl = extra_weight_attrs.get("weight_loader")
        create_moe_weights(layer, self.prefix, "SGLang", num_experts, hidden_size, intermediate_size_per_partition,
                           bool(rc.is_gated), wl, S.ModelWeightParameter, S.PerTensorScaleParameter,
                           block_attrs={"quant_method": S.FusedMoeWeightScaleSupported.BLOCK.value},
                           tensor_attrs={"quant_method": S.FusedMoeWeightScaleSupported.TENSOR.value},
                           input_scale_loader=_per_slot_loader(wl))

    def create_moe_runner(self, layer, moe_runner_config) -> None:
        self.runner = None  # apply() runs nvgemm's op: no SGLang runner (runner backend None)

    def process_weights_after_loading(self, layer) -> None:
        finish_moe_weights(layer, self.prefix, "SGLang", self.weight_only, log)
        rc = layer.moe_runner_config
        dtype = rc.params_dtype if rc.params_dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        e = layer.w13_weight.shape[0]
        resolve_moe(layer, self.prefix, "SGLang", self.weight_only, self.activation, dtype,
                    warmup_sizes(*_compat.graph_sizes_and_budget(), layer.w13_weight.device), int(rc.top_k), e, int(rc.num_experts),
                    bool(rc.apply_router_weight_on_input), None, log)

    def apply(self, layer, dispatch_output):
        topk = dispatch_output.topk_output
        if not S.TopKOutputChecker.format_is_standard(topk):
            raise RuntimeError(f"nvgemm SGLang MoE layer {self.prefix}: SGLang routed with {topk.format!r}; nvgemm's "
                               "method takes standard top-k output")
        if getattr(dispatch_output, "hidden_states_scale", None) is not None:
            raise RuntimeError(f"nvgemm SGLang MoE layer {self.prefix}: SGLang dispatched pre-quantized "
                               "activations; nvgemm's method takes bf16 / fp16 ones")
        x = dispatch_output.hidden_states
        ids, wts = routing_operands(topk.topk_ids, topk.topk_weights)
        rwoi = bool(layer.moe_runner_config.apply_router_weight_on_input)
        out = run_moe(layer, x, ids, wts, self.activation, rwoi)
        if self.dump_dir is not None:
            ep = int(layer.moe_ep_size)
            dump_moe_call(self.dump_dir, self.prefix, int(layer.moe_ep_rank if ep > 1 else layer.moe_tp_rank),
                          int(layer.moe_tp_size), ep, x, ids, wts, None, self.activation, rwoi, out)
        return S.StandardCombineInput(hidden_states=out)
