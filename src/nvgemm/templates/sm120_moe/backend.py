"""MoE backend ``cutedsl_sm120_moe`` of ``nvgemm::nvfp4_moe``: the sm_120a / sm_121a grouped W4A4 kernels.

Thin wiring of :mod:`nvgemm.templates.sm120_moe` into the MoE op's dispatch (:mod:`nvgemm.dispatch.moe`):
which problems it takes (:func:`supports`), which configs a call runs
(:func:`~nvgemm.templates.sm120_moe.policy.pick_moe_configs`: the policy's first (GEMM1, GEMM2) pair for
the call's M bucket, a MODEL ranking), where the compiled kernels come from (the kernel cache, compiled
for the device's explicit arch) and the eager op (:func:`run`), whose host work is
:func:`nvgemm.templates.sm120_moe.launch.moe_forward`.

Supports: CUDA tensors on a capability 12.0 / 12.1 device (RTX 50xx / RTX PRO Blackwell, DGX Spark
GB10), W4A4 (both input scales), ``silu_mul`` (GEMM1's fused NVFP4 requant writes GEMM2's input),
bf16 / fp16 activations, H and I multiples of 32. Everything else is left to the next backend (the
emulated op as the last resort, with its one warning).
"""

from __future__ import annotations

import functools

import torch

from nvgemm.templates.common.grouped_moe import problem_call_args, w4a4_moe_problem_reason
from nvgemm.aot.abi import DEFAULT_HW
from nvgemm.aot.cache import default_cache
from nvgemm.aot.compile_spec import make_spec
from nvgemm.core.backend import Backend, MoeProblem
from nvgemm.templates.sm120_moe.config import TEMPLATE_ID
from nvgemm.templates.sm120_moe.launch import call_kernels, moe_forward
from nvgemm.templates.sm120_moe.policy import moe_candidates, pick_moe_configs

BACKEND_NAME = "cutedsl_sm120_moe"
#: below the data-center grouped kernels' (sm100: 90); capabilities never overlap
PRIORITY = 85
ARCH_OF_CAPABILITY = {(12, 0): "sm_120a", (12, 1): "sm_121a"}


def supports(p: MoeProblem):
    if p.device_type != "cuda":
        return f"needs a CUDA device (got {p.device_type})"
    if p.capability is None or tuple(p.capability) not in ARCH_OF_CAPABILITY:
        return f"needs an sm_120 / sm_121 GPU (capability 12.0 or 12.1), got {p.capability}"
    return w4a4_moe_problem_reason(p, "rows")


def compile_spec_for(config, spec, arch: str):
    # the AOT key does not depend on the SM count (the grid is sized at launch): the arch's default
    return make_spec(TEMPLATE_ID, config, arch, epilogue=spec, hw=DEFAULT_HW[arch])


def picked_configs(p: MoeProblem, sm_count: int):
    """The (GEMM1, GEMM2) configs :func:`run` picks for problem ``p`` on a GPU of ``sm_count`` SMs."""
    arch = ARCH_OF_CAPABILITY[tuple(p.capability)]
    return pick_moe_configs(p.m, p.num_experts, p.top_k, p.hidden, p.intermediate, arch, sm_count)


def candidate_configs(p: MoeProblem, sm_count: int, max_candidates: int) -> list:
    """The policy's ranked (GEMM1, GEMM2) configs for ``p``'s layer at ``p.m`` tokens (the first is
    :func:`picked_configs` at the upper M of a bucket)."""
    arch = ARCH_OF_CAPABILITY[tuple(p.capability)]
    return [pair for pair, _ in moe_candidates(p.m, p.num_experts, p.top_k, p.hidden, p.intermediate, arch, sm_count,
                                               max_candidates)]


def call_specs(p: MoeProblem, configs, sm_count: int) -> tuple:
    """The kernel-cache keys :func:`run` loads for problem ``p`` with (GEMM1, GEMM2) ``configs`` (``sm_count``
    is not part of them)."""
    del sm_count
    arch = ARCH_OF_CAPABILITY[tuple(p.capability)]
    kernels = call_kernels(configs[0], configs[1], p.x_dtype, problem_call_args(p)["alpha13"])
    return tuple(compile_spec_for(c, e, arch) for c, e in kernels)


@functools.lru_cache(maxsize=1024)
def _kernel_for(config, spec, arch: str):
    return default_cache().get(compile_spec_for(config, spec, arch))


def run(x, topk_ids, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale, w2_scale_2,
        w2_input_scale, activation="silu_mul", router_weight_on_input=False, expert_map=None, shared_out=None,
        residual=None, out_dtype=None, configs=None):
    """Eager implementation (CUDA capability 12.x only); ``configs`` = (GEMM1, GEMM2) overrides the policy."""
    props = torch.cuda.get_device_properties(x.device)
    arch = ARCH_OF_CAPABILITY[(props.major, props.minor)]
    m, h = x.shape
    if configs is None:
        configs = pick_moe_configs(m, w13.shape[0], topk_ids.shape[1], h, w2.shape[2] * 2, arch,
                                   props.multi_processor_count)
    stream = torch.cuda.current_stream(x.device)

    def launch(args):
        _kernel_for(args.config, args.spec, arch).launch(*args.abi_values(), stream)

    return moe_forward(x, topk_ids, expert_map, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2,
                       w2_scale, w2_scale_2, w2_input_scale, activation, router_weight_on_input, shared_out, residual,
                       out_dtype, configs[0], configs[1], launch, stream_id=stream.cuda_stream)


BACKEND = Backend(name=BACKEND_NAME, priority=PRIORITY, supports=supports, run=run)

__all__ = ["ARCH_OF_CAPABILITY", "BACKEND", "BACKEND_NAME", "call_specs", "candidate_configs", "compile_spec_for",
           "picked_configs", "run", "supports"]
