"""MoE backend ``cutedsl_sm100_moe`` of ``nvgemm::nvfp4_moe``: the sm_100a grouped W4A4 kernels.

Thin wiring of :mod:`nvgemm.templates.sm100_moe` into the MoE op's dispatch
(:mod:`nvgemm.dispatch.moe`): which problems it takes (:func:`supports`), which configs a call runs
(:func:`~nvgemm.templates.sm100_moe.policy.pick_moe_configs`: the policy's first (GEMM1, GEMM2) pair for
the call's M bucket, ranked by the performance model), where the compiled kernels come from (the
kernel cache) and the eager op (:func:`run`), whose host work is
:func:`nvgemm.templates.sm100_moe.launch.moe_forward`. On CPU the same host path runs the real AOT
artifacts on the PTX emulator (``tests/emulator/test_sm100_moe_emu.py``, as for the sm90 grouped kernel).

Supports: CUDA tensors on an sm_100 device, W4A4 (both input scales), ``silu_mul`` (GEMM1's fused
NVFP4 requant writes GEMM2's input), bf16/fp16 activations, H and I multiples of 32. Everything else
(W4A16, non-gated experts, other GPUs) is left to the next backend (the emulated op as the last
resort, with its one warning).
"""

from __future__ import annotations

import functools

import torch

from nvgemm.templates.common.grouped_moe import problem_call_args, w4a4_moe_problem_reason
from nvgemm.core.backend import Backend, MoeProblem
from nvgemm.aot.abi import HardwareSpec
from nvgemm.aot.cache import default_cache
from nvgemm.aot.compile_spec import make_spec
from nvgemm.templates.sm100_moe.launch import call_kernels, moe_forward
from nvgemm.templates.sm100_moe.policy import MoeShape, moe_candidates, pick_moe_configs

BACKEND_NAME = "cutedsl_sm100_moe"
PRIORITY = 90
ARCH = "sm_100a"


def supports(p: MoeProblem):
    if p.device_type != "cuda":
        return f"needs a CUDA device (got {p.device_type})"
    if p.capability is None or tuple(p.capability) != (10, 0):
        return f"needs an sm_100 GPU (capability 10.0), got {p.capability}"
    return w4a4_moe_problem_reason(p, "TMA rows")


def compile_spec_for(config, spec, sm_count: int):
    """The kernel-cache key of one grouped GEMM (``config`` as launched, epilogue ``spec``)."""
    return make_spec("sm100_moe_nvfp4", config, ARCH, epilogue=spec, hw=HardwareSpec(sm_count=sm_count))


@functools.lru_cache(maxsize=1024)
def _kernel_for(config, spec, sm_count: int):
    return default_cache().get(compile_spec_for(config, spec, sm_count))


def picked_configs(p: MoeProblem, sm_count: int):
    """The (GEMM1, GEMM2) configs :func:`run` picks for problem ``p`` on a GPU of ``sm_count`` SMs."""
    return pick_moe_configs(p.m, p.num_experts, p.top_k, p.hidden, p.intermediate, sm_count)


def candidate_configs(p: MoeProblem, sm_count: int, max_candidates: int) -> list:
    """The policy's ranked (GEMM1, GEMM2) configs for ``p``'s layer at ``p.m`` tokens (the first is
    :func:`picked_configs` at the upper M of a bucket)."""
    shape = MoeShape("plan", p.num_experts, p.top_k, p.hidden, p.intermediate)
    return [(c.config13, c.config2) for c in moe_candidates(shape, p.m, sm_count=sm_count,
                                                           max_candidates=max_candidates)]


def call_specs(p: MoeProblem, configs, sm_count: int) -> tuple:
    """The kernel-cache keys :func:`run` loads for problem ``p`` with (GEMM1, GEMM2) ``configs`` (on CUDA)."""
    kernels = call_kernels(p.m, p.top_k, configs[0], configs[1], p.x_dtype, p.out_dtype, **problem_call_args(p))
    return tuple(compile_spec_for(c, e, sm_count) for c, e in kernels)


def run(x, topk_ids, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale, w2_scale_2,
        w2_input_scale, activation="silu_mul", router_weight_on_input=False, expert_map=None, shared_out=None,
        residual=None, out_dtype=None, configs=None):
    """Eager implementation (CUDA sm_100 only); ``configs`` = (GEMM1, GEMM2) overrides the policy."""
    sm = torch.cuda.get_device_properties(x.device).multi_processor_count
    m, h = x.shape
    if configs is None:
        configs = pick_moe_configs(m, w13.shape[0], topk_ids.shape[1], h, w2.shape[2] * 2, sm)
    stream = torch.cuda.current_stream(x.device)

    def launch(args):
        _kernel_for(args.config, args.spec, sm).launch(*args.abi_values(), stream)

    return moe_forward(x, topk_ids, expert_map, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2,
                       w2_scale, w2_scale_2, w2_input_scale, activation, router_weight_on_input, shared_out, residual,
                       out_dtype, configs[0], configs[1], launch, stream_id=stream.cuda_stream)


BACKEND = Backend(name=BACKEND_NAME, priority=PRIORITY, supports=supports, run=run)

__all__ = ["ARCH", "BACKEND", "BACKEND_NAME", "call_specs", "candidate_configs", "compile_spec_for", "picked_configs",
           "run", "supports"]
