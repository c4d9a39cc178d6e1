"""MoE backend ``cutedsl_sm90_moe`` of ``nvgemm::nvfp4_moe``: the sm_90a grouped W4A16 kernels.

Thin wiring of :mod:`nvgemm.templates.sm90_moe` into the MoE op's dispatch
(:mod:`nvgemm.dispatch.moe`): which problems it takes (:func:`supports`), which configs a call runs
(:func:`~nvgemm.templates.sm90_moe.policy.pick_moe_configs`: the policy's first (GEMM1, GEMM2) pair for
the call's M bucket, ranked by the performance model), where the compiled kernels come from (the
kernel cache; precompiled artifacts where cutlass-dsl is absent) and the eager op (:func:`run`),
whose host work is :func:`nvgemm.templates.sm90_moe.launch.moe_forward`.

Supports: CUDA tensors on an sm_90 device, W4A16 (no input scales), ``silu_mul`` / ``silu`` /
``gelu_tanh``, bf16/fp16 activations, H and I multiples of 32. Everything else (W4A4 on Hopper,
``relu2``, other GPUs) is left to the next backend (the emulated op as the last resort, with its
one warning).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from nvgemm.core.backend import Backend, MoeProblem
from nvgemm.aot.abi import HardwareSpec
from nvgemm.aot.cache import default_cache
from nvgemm.aot.compile_spec import make_spec
from nvgemm.templates.common.grouped_moe import grouped_moe_shape_reason, problem_call_args
from nvgemm.templates.sm90_moe.launch import call_kernels, moe_forward
from nvgemm.templates.sm90_moe.policy import MoeShape, moe_candidates, pick_moe_configs
from nvgemm.templates.sm90_w4a16.operand import kind_of

BACKEND_NAME = "cutedsl_sm90_moe"
PRIORITY = 90
ARCH = "sm_90a"
ACTIVATIONS = ("silu_mul", "silu", "gelu_tanh")


def supports(p: MoeProblem) -> Optional[str]:
    if p.device_type != "cuda":
        return f"needs a CUDA device (got {p.device_type})"
    if p.capability is None or tuple(p.capability) != (9, 0):
        return f"needs an sm_90 GPU (capability 9.0), got {p.capability}"
    if not p.weight_only:
        return "W4A4 MoE on sm_90 is not implemented by the grouped kernel (W4A16 only)"
    if p.activation not in ACTIVATIONS:
        return f"activation {p.activation!r} is not one of {ACTIVATIONS}"
    return grouped_moe_shape_reason(p)


def compile_spec_for(config, spec, x_dtype: torch.dtype, sm_count: int):
    """The kernel-cache key of one grouped GEMM (``config`` as launched, epilogue ``spec``, activations ``x_dtype``)."""
    return make_spec("sm90_moe_mma", config, ARCH, epilogue=spec, hw=HardwareSpec(sm_count=sm_count),
                     a_format=kind_of(x_dtype), b_format="nvfp4")


@functools.lru_cache(maxsize=1024)
def _kernel_for(config, spec, x_dtype: torch.dtype, sm_count: int):
    return default_cache().get(compile_spec_for(config, spec, x_dtype, sm_count))


def picked_configs(p: MoeProblem, sm_count: int):
    """The (GEMM1, GEMM2) configs :func:`run` picks for problem ``p`` on a GPU of ``sm_count`` SMs."""
    return pick_moe_configs(p.m, p.num_experts, p.top_k, p.hidden, p.intermediate, p.activation == "silu_mul",
                            sm_count)


def candidate_configs(p: MoeProblem, sm_count: int, max_candidates: int) -> list:
    """The policy's ranked (GEMM1, GEMM2) configs for ``p``'s layer at ``p.m`` tokens (the first is
    :func:`picked_configs` at the upper M of a bucket)."""
    shape = MoeShape("plan", p.num_experts, p.top_k, p.hidden, p.intermediate)
    cands = moe_candidates(shape, p.m, sm_count=sm_count, max_candidates=max_candidates,
                           gated=p.activation == "silu_mul")
    return [(c.config13, c.config2) for c in cands]


def call_specs(p: MoeProblem, configs, sm_count: int) -> tuple:
    """The kernel-cache keys :func:`run` loads for problem ``p`` with (GEMM1, GEMM2) ``configs`` (routing ids
    int32 and contiguous, as the serving plugins pass them)."""
    kernels = call_kernels(p.m, p.top_k, configs[0], configs[1], p.x_dtype, p.activation, p.out_dtype,
                           expert_map=p.expert_map, **problem_call_args(p))
    return tuple(compile_spec_for(c, e, p.x_dtype, sm_count) for c, e in kernels)


def run(x, topk_ids, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale, w2_scale_2,
        w2_input_scale, activation="silu_mul", router_weight_on_input=False, expert_map=None, shared_out=None,
        residual=None, out_dtype=None, configs=None):
    """Eager implementation (CUDA sm_90 only); ``configs`` = (GEMM1, GEMM2) overrides the policy."""
    if w13_input_scale is not None or w2_input_scale is not None:
        raise ValueError("nvgemm cutedsl_sm90_moe: W4A16 only (input scales given)")
    sm = torch.cuda.get_device_properties(x.device).multi_processor_count
    m, h = x.shape
    if configs is None:
        configs = pick_moe_configs(m, w13.shape[0], topk_ids.shape[1], h, w2.shape[2] * 2, activation == "silu_mul",
                                   sm)
    stream = torch.cuda.current_stream(x.device)

    def launch(args):
        _kernel_for(args.config, args.spec, args.x.dtype, sm).launch(*args.abi_values(), stream)

    return moe_forward(x, topk_ids, expert_map, topk_weights, w13, w13_scale, w13_scale_2, w2, w2_scale,
                       w2_scale_2, activation, router_weight_on_input, shared_out, residual, out_dtype, configs[0],
                       configs[1], launch, stream_id=stream.cuda_stream)


BACKEND = Backend(name=BACKEND_NAME, priority=PRIORITY, supports=supports, run=run)

__all__ = ["ARCH", "BACKEND", "BACKEND_NAME", "call_specs", "candidate_configs", "compile_spec_for", "picked_configs",
           "run", "supports"]
