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
"""

from __future__ import annotations

import itertools
import logging
import os

import torch

from nvgemm import settings
from nvgemm.integrations.vllm import _compat
from nvgemm.integrations.vllm.engine import model_dtype as _model_dtype, warmup_token_counts
from nvgemm.core.formats import check_block_scales, to_blocked
from nvgemm.dispatch.moe import select_moe_backend
from nvgemm.ops.moe import check_moe_args
from nvgemm.integrations.serving import dump_call

log = logging.getLogger("nvgemm_cutedsl.vllm")

V = _compat.load()

#: vLLM MoE activation -> nvfp4_moe activation (others stay with vLLM).
ACTIVATIONS = {"silu": "silu_mul", "silu_no_mul": "silu", "relu2_no_mul": "relu2", "gelu_tanh_no_mul": "gelu_tanh"}

_DUMP_COUNTER = itertools.count()


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


def _nan(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=torch.float32).to(dtype)


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
        e, h, i = int(num_experts), int(hidden_size), int(intermediate_size_per_partition)
        if h % 16 or i % 16:
            raise ValueError(
                f"nvgemm: MoE layer {self.prefix}: hidden {h} and per-rank intermediate {i} must be multiples of 16 "
                "(one NVFP4 scale block must not straddle two tensor-parallel ranks); use a tensor-parallel size "
                "that divides intermediate_size / 16")
        shards = 2 if self.moe.is_act_and_mul else 1
        wl = extra_weight_attrs.get("weight_loader")
        layer.num_experts = e
        layer.params_dtype = params_dtype
        reg = layer.register_parameter
        reg("w13_weight", V.ModelWeightParameter(data=torch.empty(e, shards * i, h // 2, dtype=torch.uint8),
                                                 input_dim=1, output_dim=2, weight_loader=wl))
        reg("w2_weight", V.ModelWeightParameter(data=torch.empty(e, h, i // 2, dtype=torch.uint8),
                                                input_dim=1, output_dim=2, weight_loader=wl))
        reg("w13_weight_scale", V.ModelWeightParameter(data=_nan(e, shards * i, h // 16, dtype=torch.float8_e4m3fn),
                                                       input_dim=1, output_dim=2, weight_loader=wl))
        reg("w2_weight_scale", V.ModelWeightParameter(data=_nan(e, h, i // 16, dtype=torch.float8_e4m3fn),
                                                      input_dim=1, output_dim=2, weight_loader=wl))
        reg("w13_weight_scale_2", V.PerTensorScaleParameter(data=_nan(e, shards), weight_loader=wl))
        reg("w2_weight_scale_2", V.PerTensorScaleParameter(data=_nan(e), weight_loader=wl))
        # W4A16 layers accept a (legacy) input scale too, as vLLM does; it is dropped after loading
        reg("w13_input_scale", V.PerTensorScaleParameter(data=_nan(e, shards), weight_loader=wl))
        reg("w2_input_scale", V.PerTensorScaleParameter(data=_nan(e), weight_loader=wl))

    def process_weights_after_loading(self, layer) -> None:
        name = self.prefix
        self.activation = ACTIVATIONS[layer.activation.value]
        w13, w2 = layer.w13_weight.data, layer.w2_weight.data
        e, r13 = w13.shape[0], w13.shape[1]
        for pname in ("w13_weight_scale", "w2_weight_scale", "w13_weight_scale_2", "w2_weight_scale_2"):
            if bool(torch.isnan(getattr(layer, pname).data.float()).any()):
                raise ValueError(f"nvgemm vLLM MoE layer {name}: {pname} was not (fully) loaded from the checkpoint "
                                 "(NaN): are these experts stored unquantized? list them in exclude_modules")
        g13 = layer.w13_weight_scale_2.data.float()
        if g13.shape[1] == 2 and not torch.equal(g13[:, 0], g13[:, 1]):
            half = r13 // 2  # unequal gate/up weight_scale_2: exact per-row alpha
            g13 = torch.cat([g13[:, :1].expand(e, half), g13[:, 1:].expand(e, r13 - half)], 1).contiguous()
            log.info("nvgemm_cutedsl: vLLM MoE layer %s: gate/up weight_scale_2 differ; kept exact as per-row alpha",
                     name)
        else:
            g13 = g13[:, 0].contiguous()
        g2 = layer.w2_weight_scale_2.data.float().reshape(e).contiguous()
        ins13 = ins2 = None
        if not self.weight_only:
            i13, i2 = layer.w13_input_scale.data.float(), layer.w2_input_scale.data.float().reshape(e)
            if bool(torch.isnan(i13).any()) or bool(torch.isnan(i2).any()):
                raise ValueError(f"nvgemm vLLM MoE layer {name}: an NVFP4 (W4A4) expert has no input_scale in the "
                                 "checkpoint")
            if i13.shape[1] == 2 and not torch.equal(i13[:, 0], i13[:, 1]):
                bad = int((i13[:, 0] != i13[:, 1]).nonzero()[0])
                raise ValueError(f"nvgemm vLLM MoE layer {name}: expert {bad} has gate input_scale "
                                 f"{float(i13[bad, 0])} != up input_scale {float(i13[bad, 1])}; both project the same "
                                 "input, so the checkpoint is inconsistent")
            ins13, ins2 = i13[:, 0].contiguous(), i2.contiguous()
        elif not bool(torch.isnan(layer.w13_input_scale.data).all()):
            log.warning("nvgemm_cutedsl: %s is W4A16_NVFP4 but its checkpoint has expert input scales; ignored", name)
        for pname in ("w13_weight_scale", "w2_weight_scale"):  # the dense loaders' byte rule (NaN, negative)
            check_block_scales(getattr(layer, pname).data, f"nvgemm vLLM MoE layer {name}: {pname}")
        s13 = torch.stack([to_blocked(s) for s in layer.w13_weight_scale.data])
        s2 = torch.stack([to_blocked(s) for s in layer.w2_weight_scale.data])
        for pname in ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale", "w13_weight_scale_2",
                      "w2_weight_scale_2", "w13_input_scale", "w2_input_scale"):
            delattr(layer, pname)
        layer.w13_weight = torch.nn.Parameter(w13.contiguous(), requires_grad=False)
        layer.w2_weight = torch.nn.Parameter(w2.contiguous(), requires_grad=False)
        for bname, t in (("nvgemm_w13_scale", s13), ("nvgemm_w13_scale_2", g13), ("nvgemm_w2_scale", s2),
                         ("nvgemm_w2_scale_2", g2), ("nvgemm_w13_input_scale", ins13),
                         ("nvgemm_w2_input_scale", ins2)):
            layer.register_buffer(bname, None if t is None else t.to(w13.device), persistent=False)
        self._resolve(layer)

    def _tensors(self, layer):
        return (layer.w13_weight, layer.nvgemm_w13_scale, layer.nvgemm_w13_scale_2, layer.nvgemm_w13_input_scale,
                layer.w2_weight, layer.nvgemm_w2_scale, layer.nvgemm_w2_scale_2, layer.nvgemm_w2_input_scale)

    def _expert_map(self, layer):
        em = layer.expert_map
        return None if em is None else (em if em.dtype == torch.int32 else em.to(torch.int32))

    def _resolve(self, layer) -> None:
        """Select (and on a GPU warm up) the backend for every token count; log the choice once."""
        dev = layer.w13_weight.device
        x_dtype = _model_dtype()
        top_k = int(layer.top_k)
        em = self._expert_map(layer)
        chosen = []
        for m in warmup_token_counts(dev):
            x = torch.zeros((m, layer.w2_weight.shape[1]), dtype=x_dtype, device=dev)
            ids = (torch.arange(m * top_k, device=dev, dtype=torch.int32) % int(layer.global_num_experts)).reshape(m, top_k)
            wts = torch.full((m, top_k), 1.0 / top_k, dtype=torch.float32, device=dev)
            args = (x, ids, wts, *self._tensors(layer), self.activation, bool(layer.apply_router_weight_on_input)
                    and top_k == 1, em, None, None, None)
            backend = select_moe_backend(check_moe_args(*args))
            chosen.append((m, backend.name))
            if backend.name != "emulated":
                torch.ops.nvgemm.nvfp4_moe(*args)  # compiles / loads the kernels before any graph capture
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        runs: list[list] = []
        for m, n in chosen:
            if runs and runs[-1][2] == n:
                runs[-1][1] = m
            else:
                runs.append([m, m, n])
        served = "; ".join(f"M={a}{'' if a == b else f'..{b}'}: {n}" for a, b, n in runs)
        e, r13 = layer.w13_weight.shape[:2]
        log.info("nvgemm_cutedsl: vLLM MoE layer %s (%s, %d local of %d experts, top-%d, H=%d, I=%d, %s, "
                 "alpha13 %s, input scales %s) served by %s", self.prefix, "W4A16" if self.weight_only else "W4A4",
                 e, int(layer.global_num_experts), top_k, layer.w2_weight.shape[1], layer.w2_weight.shape[2] * 2,
                 self.activation, "per-row" if layer.nvgemm_w13_scale_2.dim() == 2 else "per-expert",
                 "none" if self.weight_only else "per-expert", served)

    def get_fused_moe_quant_config(self, layer):
        return None  # no vLLM modular kernel: apply() runs nvgemm's op

    def apply(self, layer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, shared_experts,
              shared_experts_input):
        del shared_experts, shared_experts_input  # vLLM's runner runs and adds the shared experts
        ids = topk_ids if topk_ids.dtype == torch.int32 else topk_ids.to(torch.int32)
        wts = topk_weights if topk_weights.dtype == torch.float32 else topk_weights.float()
        em = self._expert_map(layer)
        out = torch.ops.nvgemm.nvfp4_moe(x, ids, wts, *self._tensors(layer), self.activation,
                                         bool(layer.apply_router_weight_on_input), em, None, None, None)
        if self.dump_dir is not None and not torch.compiler.is_compiling():
            self._dump(layer, x, ids, wts, em, out)
        return out

    def _dump(self, layer, x, ids, wts, em, out) -> None:
        mc = layer.moe_config
        rank = int(mc.tp_rank) if not mc.use_ep else int(mc.ep_rank)
        dump_call(self.dump_dir, f"{self.prefix}.rank{rank}.pid{os.getpid()}.moe{next(_DUMP_COUNTER)}",
                  {"layer": self.prefix, "kind": "moe", "rank": rank, "tp_size": int(mc.tp_size),
                   "ep_size": int(mc.ep_size) if mc.use_ep else 1,
                   "x": x.detach().cpu(), "topk_ids": ids.detach().cpu(), "topk_weights": wts.detach().cpu(),
                   "expert_map": None if em is None else em.detach().cpu(), "activation": self.activation,
                   "router_weight_on_input": bool(layer.apply_router_weight_on_input), "out": out.detach().cpu()})
