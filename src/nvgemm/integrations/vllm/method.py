"""nvgemm's vLLM quant method and quantization configs (imported only after the version check).

:class:`NvgemmNvFp4LinearMethod` serves one NVFP4 (W4A4) or W4A16_NVFP4 linear layer through
``torch.ops.nvgemm.nvfp4_linear``:

* ``create_weights`` registers the parameters vLLM's own NVFP4 scheme registers (same names,
  shapes, dtypes and parameter classes), so vLLM's loaders fill them unchanged, including fused
  q/k/v and gate/up shards and tensor-parallel slices: ``weight`` uint8 [N, K/2], ``weight_scale``
  e4m3 [N, K/16], ``weight_scale_2`` and (W4A4) ``input_scale`` with one value per shard.
* ``process_weights_after_loading`` keeps each shard's scales (:func:`nvgemm.integrations.vllm.layer.plan_gemms`:
  scalar alpha when shards agree, per-column alpha or separate GEMMs when they do not), swizzles
  the block scales once, warms up every kernel the layer will use (before vLLM captures CUDA
  graphs) and logs once which backend serves the layer and why a faster one does not. On Hopper,
  when the sm90 kernels serve every (GEMM, M), the weight is replaced by their layout first
  (:func:`nvgemm.integrations.vllm.layer.hold_sm90`: one copy on the GPU; ``NVGEMM_SM90_ONE_COPY=0`` keeps the
  checkpoint layout and the kernels' copy beside it); the log line states the bytes held.
* ``apply`` is one ``nvfp4_linear`` per GEMM: traceable by torch.compile (the op has a fake
  implementation) and free of allocations other than the op's own output.

The configs subclass vLLM's ModelOpt configs, so checkpoint parsing, exclusions and KV-cache handling
stay vLLM's; the linear layers vLLM resolves to NVFP4 are swapped, and NVFP4 / W4A16_NVFP4 routed-expert
(``RoutedExperts``) layers get nvgemm's fused-MoE method (:mod:`nvgemm.integrations.vllm.moe`).
"""

from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path

import torch

from nvgemm import settings
from nvgemm.integrations.vllm import _compat
from nvgemm.integrations.vllm.engine import model_dtype as _model_dtype, warmup_token_counts
from nvgemm.ops.prepared import one_copy_wanted
from nvgemm.templates.sm90_w4a16.operand import kind_of
from nvgemm.integrations.vllm.layer import (
    LoadTracker,
    describe_choices,
    hold_sm90,
    note_unserved_checkpoint,
    plan_gemms,
    run_gemms,
    sm90_serve_reason,
    warm_up,
    weight_memory,
)
from nvgemm.dispatch.registry import _CHECKED, backends
from nvgemm.dispatch.serving_plan import kernel_config

log = logging.getLogger("nvgemm_cutedsl.vllm")

V = _compat.load()

_DUMP_COUNTER = itertools.count()


def _passed_over(problem, chosen: str) -> list[str]:
    """Why each higher-priority backend does not serve ``problem``."""
    out = []
    for b in backends():
        if b.name == chosen:
            break
        reason = b.supports(problem) or _CHECKED.get((b.name, problem, str(_device_of(problem)))) or "first-use check"
        out.append(f"{b.name}: {reason}")
    return out


def _device_of(problem) -> torch.device:
    if problem.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(problem.device_type)


@V.register_weight_loader_v2_supported_method
class NvgemmNvFp4LinearMethod(V.LinearMethodBase):
    """NVFP4 / W4A16_NVFP4 linear layer served by ``nvgemm::nvfp4_linear`` (see the module docstring)."""

    def __init__(self, weight_only: bool, prefix: str, group_size: int = 16):
        if group_size != 16:
            raise ValueError(f"nvgemm: layer {prefix} has NVFP4 group_size {group_size}; NVFP4 uses 16")
        self.weight_only = weight_only
        self.prefix = prefix
        self.gemms = []
        self.sm90 = None  # layer.Sm90Held when the weight is held once, in the sm90 layout
        self.tracker = None  # set by create_weights
        self.dump_dir = settings.NVGEMM_VLLM_DUMP

    def create_weights(self, layer, input_size_per_partition: int, output_partition_sizes: list[int],
                       input_size: int, output_size: int, params_dtype: torch.dtype, **extra_weight_attrs):
        del input_size, output_size
        k, widths = int(input_size_per_partition), [int(w) for w in output_partition_sizes]
        n = sum(widths)
        if k % 16:
            raise ValueError(
                f"nvgemm: layer {self.prefix}: per-rank in_features {k} is not a multiple of 16 (one NVFP4 scale "
                "block must not straddle two tensor-parallel ranks); use a tensor-parallel size that divides "
                "in_features / 16")
        wl = extra_weight_attrs.get("weight_loader")
        layer.logical_widths = widths
        layer.input_size_per_partition = k
        layer.output_size_per_partition = n
        shards = len(widths)
        # every loader call is recorded: process_weights_after_loading refuses a layer with a shard
        # that was never loaded (weight is torch.empty: it would serve uninitialised memory)
        self.tracker = tracker = LoadTracker(self.prefix, shards)
        layer.register_parameter("weight", V.ModelWeightParameter(
            data=torch.empty(n, k // 2, dtype=torch.uint8), input_dim=1, output_dim=0,
            weight_loader=tracker.wrap("weight", wl)))
        layer.register_parameter("weight_scale", V.ModelWeightParameter(
            data=torch.full((n, k // 16), float("nan"), dtype=torch.float32).to(torch.float8_e4m3fn),
            input_dim=1, output_dim=0, weight_loader=tracker.wrap("weight_scale", wl)))
        layer.register_parameter("weight_scale_2", V.PerTensorScaleParameter(
            data=torch.full((shards,), float("nan"), dtype=torch.float32),
            weight_loader=tracker.wrap("weight_scale_2", wl)))
        # W4A16 layers also accept a (legacy) input_scale, as vLLM does; it is dropped after loading
        layer.register_parameter("input_scale", V.PerTensorScaleParameter(
            data=torch.full((shards,), float("nan"), dtype=torch.float32),
            weight_loader=tracker.wrap("input_scale", wl)))

    def process_weights_after_loading(self, layer) -> None:
        required = ("weight", "weight_scale", "weight_scale_2") + (() if self.weight_only else ("input_scale",))
        self.tracker.check(required)
        weight = layer.weight.data
        ins = None
        if not self.weight_only:
            ins = layer.input_scale.data
        elif not bool(torch.isnan(layer.input_scale.data).all()):
            log.warning("nvgemm_cutedsl: %s is W4A16_NVFP4 but its checkpoint has an input_scale; ignored "
                        "(weight-only layers do not quantize activations)", self.prefix)
        self.gemms = plan_gemms(weight, layer.weight_scale.data, layer.weight_scale_2.data, ins,
                                layer.logical_widths, self.prefix)
        for name in ("weight_scale", "weight_scale_2", "input_scale"):
            delattr(layer, name)
        bias = getattr(layer, "bias", None)
        x_dtype = bias.dtype if bias is not None and bias.dtype in (torch.bfloat16, torch.float16) else \
            _model_dtype()
        m_values = warmup_token_counts(weight.device)
        self.sm90, why = None, "off (NVGEMM_SM90_ONE_COPY=0)"
        if one_copy_wanted():  # Hopper: hold the weight once, in the sm90 layout, when those kernels serve it all
            why = sm90_serve_reason(self.gemms, layer.input_size_per_partition, weight.device, x_dtype,
                                    bias is not None, m_values)
            if why is None:
                weight, self.sm90 = hold_sm90(weight, self.gemms, kind_of(x_dtype))  # the checkpoint layout goes
                layer.register_buffer("nvgemm_sm90_scale", self.sm90.scale, persistent=False)
        layer.weight = torch.nn.Parameter(weight, requires_grad=False)
        for i, g in enumerate(self.gemms):  # visible in named_buffers(), moved with the module
            if g.weight_scale is not None:
                layer.register_buffer(f"nvgemm_weight_scale_{i}", g.weight_scale, persistent=False)
            layer.register_buffer(f"nvgemm_weight_scale_2_{i}", g.weight_scale_2, persistent=False)
            if g.input_scale is not None:
                layer.register_buffer(f"nvgemm_input_scale_{i}", g.input_scale, persistent=False)
        chosen = warm_up(self.prefix, weight, self.gemms, bias, x_dtype, m_values, self.sm90)
        self._log(layer, weight, bias, x_dtype, chosen, why)

    def _log(self, layer, weight, bias, x_dtype, chosen, sm90_why=None) -> None:
        k = layer.input_size_per_partition
        kinds = ", ".join(f"N={g.stop - g.start} alpha {'per-column' if g.alpha == 'vector' else 'scalar'}"
                          + ("" if g.input_scale is None else f" input_scale {float(g.input_scale):.4g}")
                          for g in self.gemms)
        first = {}  # backend -> the first problem it serves
        for _gi, p, name in chosen:
            first.setdefault(name, p)
        fallbacks = []
        for name, p in first.items():
            passed = _passed_over(p, name)
            if passed:
                fallbacks.append(f"{name} because " + "; ".join(passed))
        config = _configs(first)
        memory = weight_memory(weight, [self.sm90.scale] if self.sm90 else [g.weight_scale for g in self.gemms],
                               "sm90 layout only" if self.sm90 else "checkpoint")
        if self.sm90 is None and sm90_why and _hopper(weight.device):
            memory += f" (not held once in the sm90 layout: {sm90_why})"
        log.info("nvgemm_cutedsl: vLLM layer %s (%s, K=%d, shards %s, %d GEMM%s: %s) served by %s%s%s; %s",
                 self.prefix, "W4A16" if self.weight_only else "W4A4", k, list(layer.logical_widths),
                 len(self.gemms), "" if len(self.gemms) == 1 else "s", kinds, describe_choices(chosen),
                 f"; configs {config}" if config else "", f"; fallback: {' | '.join(fallbacks)}" if fallbacks else "",
                 memory)

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = run_gemms(x, layer.weight, self.gemms, bias, self.sm90)
        if self.dump_dir is not None and not torch.compiler.is_compiling():
            self._dump(layer, x, bias, out)
        return out

    def _dump(self, layer, x, bias, out) -> None:
        d = Path(self.dump_dir)
        d.mkdir(parents=True, exist_ok=True)
        rank = int(getattr(layer, "tp_rank", 0))
        torch.save({"layer": self.prefix, "rank": rank, "tp_size": int(getattr(layer, "tp_size", 1)),
                    "x": x.detach().cpu(), "bias": None if bias is None else bias.detach().cpu(),
                    "out": out.detach().cpu()},
                   d / f"{self.prefix}.rank{rank}.pid{os.getpid()}.{next(_DUMP_COUNTER)}.pt")


def _hopper(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def _configs(first: dict) -> str:
    """Kernel config names the CuTeDSL backends pick (at the first M each backend serves)."""
    names = []
    for name, p in first.items():
        cfg = kernel_config(name, p)
        if cfg:
            names.append(f"{name}@M={p.m}: {cfg}")
    return ", ".join(names)


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
