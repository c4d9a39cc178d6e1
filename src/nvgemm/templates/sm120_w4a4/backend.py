"""Backend ``cutedsl_sm120`` of ``nvgemm::nvfp4_linear``: the sm_120a / sm_121a W4A4 decode kernel.

Thin wiring of :mod:`nvgemm.templates.sm120_w4a4` into the run time: which problems it takes
(:func:`supports`: a CUDA device of compute capability 12.x -- RTX 50xx / RTX PRO Blackwell 12.0,
DGX Spark GB10 12.1 -- a W4A4 call (``input_scale`` given), K % 32 == 0, the residual in the output
dtype), which config a call runs (:func:`pick_config`: the policy's first candidate), where the
compiled kernel comes from (the kernel cache, compiled for the device's explicit arch), and the
eager op (:func:`run_sm120`); the same kernel serves the fused gated-MLP ops: ``nvfp4_linear_requant``
(its SwiGLU + NVFP4 requant epilogue) and ``nvfp4_linear_prequant`` (an already-quantized activation).
The host work per call lives in :mod:`.launch`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import torch

from nvgemm.aot.abi import DEFAULT_HW, HardwareSpec
from nvgemm.aot.cache import default_cache
from nvgemm.aot.compile_spec import make_spec
from nvgemm.core.backend import Backend
from nvgemm.core.epilogue import EpilogueSpec
from nvgemm.core.validation import LinearProblem, linear_spec
from nvgemm.templates.sm120_w4a4.config import TEMPLATE_ID, Sm120W4A4Config, config_from_name
from nvgemm.templates.sm120_w4a4.launch import (
    check_problem, launch_sm120, prepare_sm120_args, prepare_sm120_requant_args,
)
from nvgemm.templates.sm120_w4a4.policy import pick_config
from nvgemm.templates.sm120_w4a4.validity import can_implement_problem

BACKEND_NAME = "cutedsl_sm120"
#: below the data-center kernels' (sm100: 100, sm90: 90); capabilities never overlap
PRIORITY = 95
#: compute capability -> the arch the kernel is compiled for
ARCH_OF_CAPABILITY = {(12, 0): "sm_120a", (12, 1): "sm_121a"}


def arch_of(capability: tuple[int, int]) -> str:
    arch = ARCH_OF_CAPABILITY.get(tuple(capability))
    if arch is None:
        raise ValueError(f"nvgemm_cutedsl sm120: capability {capability} is not sm_120 / sm_121")
    return arch


def supports(p: LinearProblem) -> Optional[str]:
    """The sm120 rules for ``p`` (operand alignment: the launcher copies an unaligned operand)."""
    if p.device_type != "cuda":
        return f"needs a CUDA device (got {p.device_type})"
    if p.capability is None or tuple(p.capability) not in ARCH_OF_CAPABILITY:
        return f"needs an sm_120 / sm_121 GPU (capability 12.0 or 12.1), got {p.capability}"
    if p.weight_only:
        return "W4A16 (no input_scale) is not the sm120 W4A4 kernel"
    if p.residual_cast:
        return "residual dtype differs from the output dtype (the kernel adds the residual in the output dtype)"
    st = can_implement_problem(Sm120W4A4Config(split_k=1), m=p.m, n=p.n, k=p.k, activation=p.activation,
                               arch=arch_of(p.capability))
    if not st:
        return st.reason
    if pick_config(p.m, p.n, p.k, p.activation, arch_of(p.capability), 0) is None:
        return f"the sm120 candidate policy has no implementable config (M={p.m} N={p.n} K={p.k} {p.activation})"
    return None


def compile_spec_for(config: Sm120W4A4Config, spec: EpilogueSpec, arch: str, sm_count: int = 0):
    hw = HardwareSpec(sm_count=sm_count) if sm_count else DEFAULT_HW[arch]
    return make_spec(TEMPLATE_ID, config, arch, epilogue=spec, hw=hw)


@functools.lru_cache(maxsize=64)
def device_target(index: int) -> tuple[str, int]:
    """(arch, SM count) of CUDA device ``index``, read from the driver once."""
    props = torch.cuda.get_device_properties(index)
    return arch_of((props.major, props.minor)), props.multi_processor_count


@functools.lru_cache(maxsize=1024)
def launch_plan(m: int, n: int, k: int, spec: EpilogueSpec, index: int,
                config: Optional[Sm120W4A4Config] = None) -> tuple[Sm120W4A4Config, object]:
    """(config, loaded kernel) of one problem on device ``index``, decided once."""
    arch, sm_count = device_target(index)
    if config is None:
        config = pick_config(m, n, k, spec.activation, arch, sm_count)
        if config is None:
            raise RuntimeError(f"nvgemm_cutedsl sm120: no implementable config for M={m} N={n} K={k}")
    check_problem(config, m, n, k, spec)
    # the AOT key does not depend on the SM count (the grid is sized at launch): the arch's default
    return config, default_cache().get(compile_spec_for(config, spec, arch))


def run_sm120(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype,
              config=None):
    """Eager implementation of ``cutedsl_sm120`` (CUDA capability 12.x only) of a call the op has validated.

    ``config`` (a config or its name) overrides the policy's pick."""
    # lazy: triton import cost
    from nvgemm.templates.triton.fused_ops import quantize_nvfp4_cuda

    spec = linear_spec(x.dtype, weight_scale_2, bias, residual, activation, out_dtype)
    if isinstance(config, str):
        config = config_from_name(config)
    dev = x.device
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    config, kernel = launch_plan(x.numel() // x.shape[-1], weight.shape[0], weight.shape[1] * 2, spec, index, config)
    stream = torch.cuda.current_stream(dev)
    args = prepare_sm120_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, spec, config,
                              stream_id=stream.cuda_stream, quantize=quantize_nvfp4_cuda, checked=True)
    launch_sm120(args, kernel, stream)
    return args.out if x.dim() == 2 else args.out.reshape(*x.shape[:-1], args.out.shape[-1])


def supports_requant(p: LinearProblem) -> Optional[str]:
    """The fused SwiGLU + NVFP4 requant launch: the dense rules for the gated GEMM (N = 2I, I % 16 == 0)."""
    return supports(dataclasses.replace(p, activation="silu_mul", residual=False))


@functools.lru_cache(maxsize=256)
def _requant_spec(gated: EpilogueSpec) -> EpilogueSpec:
    return dataclasses.replace(gated, out_quant=True)


def run_sm120_requant(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype=None,
                      quantized=None):
    """``nvgemm::nvfp4_linear_requant`` on capability 12.x: (packed codes [M, I/2], swizzled e4m3 scales).
    ``quantized`` = (packed, scales) with ``x`` None: ``nvgemm::nvfp4_linear_prequant_requant``."""
    # lazy: triton import cost
    from nvgemm.templates.triton.fused_ops import quantize_nvfp4_cuda

    x_dtype = out_dtype if quantized is not None else x.dtype
    spec = _requant_spec(linear_spec(x_dtype, weight_scale_2, bias, None, "silu_mul", out_dtype))
    m = x.numel() // x.shape[-1] if quantized is None else quantized[0].shape[0]
    dev = weight.device
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    config, kernel = launch_plan(m, weight.shape[0], weight.shape[1] * 2, spec, index)
    stream = torch.cuda.current_stream(dev)
    args = prepare_sm120_requant_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale,
                                      spec, config, stream_id=stream.cuda_stream, quantize=quantize_nvfp4_cuda,
                                      quantized=quantized, checked=True)
    launch_sm120(args, kernel, stream)
    return args.out, args.residual.view(torch.float8_e4m3fn)


def run_sm120_prequant(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, residual, out_dtype,
                       config=None):
    """``nvgemm::nvfp4_linear_prequant`` on capability 12.x: the W4A4 kernel on an already-quantized activation."""
    spec = linear_spec(out_dtype, weight_scale_2, bias, residual, "none", out_dtype)
    if isinstance(config, str):
        config = config_from_name(config)
    dev = packed.device
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    config, kernel = launch_plan(packed.shape[0], weight.shape[0], weight.shape[1] * 2, spec, index, config)
    stream = torch.cuda.current_stream(dev)
    args = prepare_sm120_args(None, weight, weight_scale, weight_scale_2, input_scale, bias, residual, spec, config,
                              stream_id=stream.cuda_stream, quantized=(packed, scales), checked=True)
    launch_sm120(args, kernel, stream)
    return args.out


BACKEND = Backend(name=BACKEND_NAME, priority=PRIORITY, supports=supports, run=run_sm120)
REQUANT_BACKEND = Backend(name=BACKEND_NAME, priority=PRIORITY, supports=supports_requant, run=run_sm120_requant)
PREQUANT_BACKEND = Backend(name=BACKEND_NAME, priority=PRIORITY, supports=supports, run=run_sm120_prequant)

__all__ = ["ARCH_OF_CAPABILITY", "BACKEND", "BACKEND_NAME", "PREQUANT_BACKEND", "REQUANT_BACKEND", "arch_of",
           "compile_spec_for", "launch_plan", "pick_config", "run_sm120", "run_sm120_prequant", "run_sm120_requant",
           "supports", "supports_requant"]
