"""The engine-agnostic part of serving ModelOpt NVFP4 / W4A16_NVFP4 routed experts on ``nvgemm::nvfp4_moe``,
shared by nvgemm's vLLM and SGLang fused-MoE methods (pure torch: no engine import).

Both engines hand the routed experts of one MoE layer to their quant method as stacked per-expert
tensors with the same names and shapes (SGLang's fused-MoE layer descends from vLLM's): ``w13_weight``
``[E, 2I, H/2]`` ([gate; up] rows per expert), ``w2_weight`` ``[E, H, I/2]``, their e4m3 block scales,
``w13_weight_scale_2 [E, 2]`` / ``w2_weight_scale_2 [E]`` and the per-expert input scales
``w13_input_scale [E, 2]`` / ``w2_input_scale [E]``, each indexed by *local* expert (an expert-parallel
rank holds its own experts). The engine keeps the router, shared experts, tensor and expert parallelism;
this module keeps every checkpoint scale exact:

* ``w13_weight_scale_2`` stays a per-expert scalar when an expert's gate and up scales are equal and becomes
  the exact per-row alpha ``[E, 2I]`` otherwise (both engines' own kernels keep one of the two);
* the input scales stay per expert (the engines' FlashInfer paths take one maximum over experts); an
  expert's gate and up input scales must be equal (they quantize the same input), else loading stops;
* block scales are checked with the dense loaders' byte rule and swizzled per expert once.

An adapter (``nvgemm.integrations.vllm.moe``, ``nvgemm.integrations.sglang.moe``) supplies its engine's
parameter classes and loader (:func:`create_moe_weights`), the activation dtype, the token counts to warm
up, the router's id convention (:func:`resolve_moe`) and the rank for dumps (:func:`dump_moe_call`).
"""

from __future__ import annotations

import itertools
import logging
import os

import torch

from nvgemm.core.formats import check_block_scales, to_blocked
from nvgemm.dispatch.moe import select_moe_backend
from nvgemm.integrations.serving import dump_call
from nvgemm.ops.moe import check_moe_args

log = logging.getLogger("nvgemm_cutedsl.serving")

#: the nvgemm buffers :func:`finish_moe_weights` leaves on the layer, in ``nvfp4_moe`` argument order
#: (``w13_weight`` / ``w2_weight`` stay parameters)
_SCALE_PARAMS = ("w13_weight_scale", "w2_weight_scale", "w13_weight_scale_2", "w2_weight_scale_2")

_DUMP_COUNTER = itertools.count()


def _nan(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=torch.float32).to(dtype)


def create_moe_weights(layer: torch.nn.Module, prefix: str, engine: str, num_experts: int, hidden: int,
                       intermediate: int, gated: bool, weight_loader, weight_param, scale_param,
                       block_attrs: dict | None = None, tensor_attrs: dict | None = None,
                       input_scale_loader=None) -> None:
    """Register the routed experts' parameters the engines' own ModelOpt NVFP4 MoE methods register (same
    names, shapes and dtypes, through the engine's ``weight_param(data=, input_dim=, output_dim=,
    weight_loader=)`` / ``scale_param(data=, weight_loader=)`` classes), scales NaN-filled so a slot no
    checkpoint tensor reached is refused by :func:`finish_moe_weights`. ``block_attrs`` / ``tensor_attrs``
    are set on the block-scale / per-tensor-scale parameters (the engine's loader may route on them);
    ``input_scale_loader`` loads the input scales (default ``weight_loader``)."""
    e, h, i = int(num_experts), int(hidden), int(intermediate)
    if h % 16 or i % 16:
        raise ValueError(
            f"nvgemm: {engine} MoE layer {prefix}: hidden {h} and per-rank intermediate {i} must be multiples of 16 "
            "(one NVFP4 scale block must not straddle two tensor-parallel ranks); use a tensor-parallel size "
            "that divides intermediate_size / 16")
    shards = 2 if gated else 1
    wl, il = weight_loader, input_scale_loader or weight_loader

    def add(name, param, attrs=None):
        for k, v in (attrs or {}).items():
            setattr(param, k, v)
        layer.register_parameter(name, param)

    add("w13_weight", weight_param(data=torch.empty(e, shards * i, h // 2, dtype=torch.uint8),
                                   input_dim=1, output_dim=2, weight_loader=wl))
    add("w2_weight", weight_param(data=torch.empty(e, h, i // 2, dtype=torch.uint8),
                                  input_dim=1, output_dim=2, weight_loader=wl))
    add("w13_weight_scale", weight_param(data=_nan(e, shards * i, h // 16, dtype=torch.float8_e4m3fn),
                                         input_dim=1, output_dim=2, weight_loader=wl), block_attrs)
    add("w2_weight_scale", weight_param(data=_nan(e, h, i // 16, dtype=torch.float8_e4m3fn),
                                        input_dim=1, output_dim=2, weight_loader=wl), block_attrs)
    add("w13_weight_scale_2", scale_param(data=_nan(e, shards), weight_loader=wl), tensor_attrs)
    add("w2_weight_scale_2", scale_param(data=_nan(e), weight_loader=wl), tensor_attrs)
    # W4A16 layers accept a (legacy) input scale too, as both engines do; it is dropped after loading
    add("w13_input_scale", scale_param(data=_nan(e, shards), weight_loader=il), tensor_attrs)
    add("w2_input_scale", scale_param(data=_nan(e), weight_loader=il), tensor_attrs)


def finish_moe_weights(layer: torch.nn.Module, prefix: str, engine: str, weight_only: bool,
                       logger: logging.Logger | None = None) -> None:
    """Check and convert the loaded parameters of :func:`create_moe_weights` into ``nvfp4_moe``'s operands
    (see the module docstring): ``w13_weight`` / ``w2_weight`` stay, the scales become the buffers
    ``nvgemm_w13_scale`` (swizzled), ``nvgemm_w13_scale_2`` ([E] or exact per-row [E, 2I]),
    ``nvgemm_w13_input_scale`` ([E] or None for W4A16) and the same for w2."""
    lg = logger or log
    name = f"nvgemm {engine} MoE layer {prefix}"
    w13, w2 = layer.w13_weight.data, layer.w2_weight.data
    e, r13 = w13.shape[0], w13.shape[1]
    for pname in _SCALE_PARAMS:
        if bool(torch.isnan(getattr(layer, pname).data.float()).any()):
            raise ValueError(f"{name}: {pname} was not (fully) loaded from the checkpoint (NaN): are these experts "
                             "stored unquantized? list them in exclude_modules")
    g13 = layer.w13_weight_scale_2.data.float()
    if g13.dim() == 2 and g13.shape[1] == 2 and not torch.equal(g13[:, 0], g13[:, 1]):
        half = r13 // 2  # unequal gate/up weight_scale_2: exact per-row alpha
        g13 = torch.cat([g13[:, :1].expand(e, half), g13[:, 1:].expand(e, r13 - half)], 1).contiguous()
        lg.info("nvgemm_cutedsl: %s MoE layer %s: gate/up weight_scale_2 differ; kept exact as per-row alpha",
                engine, prefix)
    else:
        g13 = g13.reshape(e, -1)[:, 0].contiguous()
    g2 = layer.w2_weight_scale_2.data.float().reshape(e).contiguous()
    ins13 = ins2 = None
    if not weight_only:
        i13 = layer.w13_input_scale.data.float().reshape(e, -1)
        i2 = layer.w2_input_scale.data.float().reshape(e)
        if bool(torch.isnan(i13).any()) or bool(torch.isnan(i2).any()):
            raise ValueError(f"{name}: an NVFP4 (W4A4) expert has no input_scale in the checkpoint")
        if i13.shape[1] == 2 and not torch.equal(i13[:, 0], i13[:, 1]):
            bad = int((i13[:, 0] != i13[:, 1]).nonzero()[0])
            raise ValueError(f"{name}: expert {bad} has gate input_scale {float(i13[bad, 0])} != up input_scale "
                             f"{float(i13[bad, 1])}; both project the same input, so the checkpoint is inconsistent")
        ins13, ins2 = i13[:, 0].contiguous(), i2.contiguous()
    elif not bool(torch.isnan(layer.w13_input_scale.data).all()):
        lg.warning("nvgemm_cutedsl: %s is W4A16_NVFP4 but its checkpoint has expert input scales; ignored", prefix)
    for pname in ("w13_weight_scale", "w2_weight_scale"):  # the dense loaders' byte rule (NaN, negative)
        check_block_scales(getattr(layer, pname).data, f"{name}: {pname}")
    s13 = torch.stack([to_blocked(s) for s in layer.w13_weight_scale.data])
    s2 = torch.stack([to_blocked(s) for s in layer.w2_weight_scale.data])
    for pname in ("w13_weight", "w2_weight", *_SCALE_PARAMS, "w13_input_scale", "w2_input_scale"):
        delattr(layer, pname)
    layer.w13_weight = torch.nn.Parameter(w13.contiguous(), requires_grad=False)
    layer.w2_weight = torch.nn.Parameter(w2.contiguous(), requires_grad=False)
    for bname, t in (("nvgemm_w13_scale", s13), ("nvgemm_w13_scale_2", g13), ("nvgemm_w2_scale", s2),
                     ("nvgemm_w2_scale_2", g2), ("nvgemm_w13_input_scale", ins13), ("nvgemm_w2_input_scale", ins2)):
        layer.register_buffer(bname, None if t is None else t.to(w13.device), persistent=False)


def moe_tensors(layer: torch.nn.Module) -> tuple:
    """The layer's ``nvfp4_moe`` weight operands (w13 .. w2_input_scale), after :func:`finish_moe_weights`."""
    return (layer.w13_weight, layer.nvgemm_w13_scale, layer.nvgemm_w13_scale_2, layer.nvgemm_w13_input_scale,
            layer.w2_weight, layer.nvgemm_w2_scale, layer.nvgemm_w2_scale_2, layer.nvgemm_w2_input_scale)


def resolve_moe(layer: torch.nn.Module, prefix: str, engine: str, weight_only: bool, activation: str,
                x_dtype: torch.dtype, m_values, top_k: int, num_ids: int, global_experts: int,
                router_weight_on_input: bool, expert_map: torch.Tensor | None = None,
                logger: logging.Logger | None = None) -> str:
    """Select (and on a GPU warm up: compile or load the kernels before any graph capture) the backend for
    every token count in ``m_values``; log the choice once. ``num_ids``: how many expert ids the router
    hands this layer (global ids with ``expert_map``, local ones without). Returns the log line."""
    dev = layer.w13_weight.device
    chosen = []
    for m in m_values:
        x = torch.zeros((m, layer.w2_weight.shape[1]), dtype=x_dtype, device=dev)
        ids = (torch.arange(m * top_k, device=dev, dtype=torch.int32) % int(num_ids)).reshape(m, top_k)
        wts = torch.full((m, top_k), 1.0 / top_k, dtype=torch.float32, device=dev)
        args = (x, ids, wts, *moe_tensors(layer), activation, bool(router_weight_on_input) and top_k == 1,
                expert_map, None, None, None)
        backend = select_moe_backend(check_moe_args(*args))
        chosen.append((m, backend.name))
        if backend.name != "emulated":
            torch.ops.nvgemm.nvfp4_moe(*args)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    runs: list[list] = []
    for m, n in chosen:
        if runs and runs[-1][2] == n:
            runs[-1][1] = m
        else:
            runs.append([m, m, n])
    served = "; ".join(f"M={a}{'' if a == b else f'..{b}'}: {n}" for a, b, n in runs)
    e = layer.w13_weight.shape[0]
    line = (f"nvgemm_cutedsl: {engine} MoE layer {prefix} ({'W4A16' if weight_only else 'W4A4'}, {e} local of "
            f"{int(global_experts)} experts, top-{top_k}, H={layer.w2_weight.shape[1]}, I={layer.w2_weight.shape[2] * 2}, "
            f"{activation}, alpha13 {'per-row' if layer.nvgemm_w13_scale_2.dim() == 2 else 'per-expert'}, input scales "
            f"{'none' if weight_only else 'per-expert'}) served by {served}")
    (logger or log).info("%s", line)
    return line


def routing_operands(topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's output as ``nvfp4_moe`` takes it: int32 ids, fp32 weights (cast only when they are not)."""
    ids = topk_ids if topk_ids.dtype == torch.int32 else topk_ids.to(torch.int32)
    wts = topk_weights if topk_weights.dtype == torch.float32 else topk_weights.float()
    return ids, wts


def run_moe(layer: torch.nn.Module, x: torch.Tensor, ids: torch.Tensor, wts: torch.Tensor, activation: str,
            router_weight_on_input: bool, expert_map: torch.Tensor | None = None) -> torch.Tensor:
    """One ``nvgemm::nvfp4_moe`` call on the layer's operands (``ids`` / ``wts`` from :func:`routing_operands`)."""
    return torch.ops.nvgemm.nvfp4_moe(x, ids, wts, *moe_tensors(layer), activation, bool(router_weight_on_input),
                                      expert_map, None, None, None)


def dump_moe_call(dump_dir: str, prefix: str, rank: int, tp_size: int, ep_size: int, x, topk_ids, topk_weights,
                  expert_map, activation: str, router_weight_on_input: bool, out) -> None:
    """Save one ``nvfp4_moe`` call (tests, debugging) as ``<dump_dir>/<prefix>.rank<r>.pid<p>.moe<n>.pt``."""
    if torch.compiler.is_compiling():
        return
    dump_call(dump_dir, f"{prefix}.rank{rank}.pid{os.getpid()}.moe{next(_DUMP_COUNTER)}",
              {"layer": prefix, "kind": "moe", "rank": int(rank), "tp_size": int(tp_size), "ep_size": int(ep_size),
               "x": x.detach().cpu(), "topk_ids": topk_ids.detach().cpu(), "topk_weights": topk_weights.detach().cpu(),
               "expert_map": None if expert_map is None else expert_map.detach().cpu(), "activation": activation,
               "router_weight_on_input": bool(router_weight_on_input), "out": out.detach().cpu()})
