"""Backends ``emu_sm90``, ``emu_sm100`` and ``emu_sm120`` of ``nvgemm::nvfp4_linear``: the real sm_90a /
sm_100a / sm_120a kernels, executed on the CPU by the PTX emulator (``NVGEMM_BACKEND=emu_sm90`` /
``emu_sm100`` / ``emu_sm120``; never chosen automatically: their priority is below the emulated reference,
which supports everything).

Each call runs the production host path of the family (``prepare_sm90_args`` / ``prepare_sm100_args``,
the kernel cache's AOT artifact, ``AotKernel`` argument packing) on CPU tensors, with the artifact
relinked against the fake CUDA runtime and its PTX interpreted (:mod:`nvgemm.emulator.runner`; the
wgmma, TMA, mbarrier and tcgen05 opcodes come from :mod:`nvgemm.emulator.isa`). The config is the
runtime's own pick (``pick_config`` of the sm90 backend, the sm100 / sm120 policy's first candidate) for the
device profile (H200: 132 SMs, B200: 148, RTX 5090: 170). ``emu_sm120`` runs what an sm_120 GPU runs: the
sm120_w4a4 kernel for W4A4 (``prepare_sm120_args``), the W4A16 ``mma`` kernel compiled for sm_120a for
W4A16. Slow (about 0.5-30 s per call on one core): a correctness tool, not a compute path. ``emu_sm100_moe``
(``NVGEMM_MOE_BACKEND=emu_sm100_moe``) and ``emu_sm120_moe`` (``NVGEMM_MOE_BACKEND=emu_sm120_moe``) do the same
for ``nvgemm::nvfp4_moe`` with the sm_100a / sm_120a grouped W4A4 kernels, and ``emu_sm100`` / ``emu_sm120``
also serve the fused requant / prequant ops (``nvfp4_linear_requant``, ``nvfp4_linear_prequant_requant``,
``nvfp4_linear_prequant``) through the sm_100a / sm_120a kernels' fused requant epilogue and W4A4 launch.
The activation quantizer the GPU backend is given (the Triton kernel) is given here too: on CPU tensors it runs
from its PTX (for the emulated arch) on the emulator once :func:`nvgemm.emulator.enable` installed the Triton
stand-in (else the torch reference, the same bytes).

Importing this module registers nothing: :func:`nvgemm.emulator.enable` registers :data:`BACKENDS`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
from typing import Optional

import torch

from nvgemm import settings
from nvgemm.core.backend import MOE, PREQUANT, REQUANT, Backend
from nvgemm.core.validation import LinearProblem, linear_spec
from nvgemm.aot.abi import HardwareSpec
from nvgemm.aot.compile_spec import make_spec
from nvgemm.emulator.runner import prepare
from nvgemm.templates.sm100_moe.launch import moe_forward
from nvgemm.templates.sm100_moe.policy import pick_moe_configs
from nvgemm.templates.sm100_w4a4 import backend as sm100_backend
from nvgemm.templates.sm100_w4a4.backend import requant_spec
from nvgemm.templates.sm100_w4a4.launch import prepare_sm100_args, prepare_sm100_requant_args, requant_config
from nvgemm.templates.sm90_w4a16 import backend as sm90_backend
from nvgemm.templates.sm90_w4a16.backend import compile_spec_for, pick_config
from nvgemm.templates.sm90_w4a16.launch import cached_sm90_weight, prepare_sm90_args
from nvgemm.templates.sm90_w4a16.operand import kind_of
from nvgemm.templates.sm100_moe import backend as sm100_moe_backend
from nvgemm.templates.sm120_moe import backend as sm120_moe_backend
from nvgemm.templates.sm120_moe.launch import moe_forward as sm120_moe_forward
from nvgemm.templates.sm120_moe.policy import pick_moe_configs as pick_sm120_moe_configs
from nvgemm.templates.sm120_w4a4 import backend as sm120_backend
from nvgemm.templates.sm120_w4a4.launch import check_problem as sm120_check_problem
from nvgemm.templates.sm120_w4a4.launch import prepare_sm120_args, prepare_sm120_requant_args
from nvgemm.templates.triton.fused_ops import quantize_nvfp4_cuda

BACKEND_NAME = "emu_sm90"
SM100_BACKEND_NAME = "emu_sm100"
PRIORITY = -2000  # below the emulated reference (which supports everything): only ever forced

_SM_COUNT = 132  # the H100 / H200 device profile


def _tooling() -> Optional[str]:
    if importlib.util.find_spec("cutlass") is None:
        return "needs nvidia-cutlass-dsl (the PTX comes from compiling the kernel with keep_ptx)"
    if shutil.which("gcc") is None:
        return "needs gcc (builds the fake CUDA runtime and relinks the kernel)"
    return None


def _as_on_gpu(p, capability: tuple[int, int], rules) -> Optional[str]:
    """Why an emulator twin cannot run ``p``: it runs CPU tensors only, then ``rules`` (the GPU backend's own
    ``supports``) decide as for a device of ``capability``, then the emulator's tooling."""
    if p.device_type != "cpu":
        return f"the PTX emulator runs CPU tensors (got {p.device_type})"
    return rules(dataclasses.replace(p, device_type="cuda", capability=capability)) or _tooling()


def supports(p: LinearProblem) -> Optional[str]:
    """The sm90 backend's own rules, for CPU tensors on the H200 profile."""
    return _as_on_gpu(p, (9, 0), sm90_backend.supports)


def config_for(m: int, n: int, k: int, x_dtype: torch.dtype, activation: str):
    """The sm90 runtime's pick for the H200 profile (mma or wgmma family)."""
    return pick_config(m, n, k, x_dtype, activation, _SM_COUNT)


def run_emu_sm90(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype):
    spec = linear_spec(x.dtype, weight_scale_2, bias, residual, activation, out_dtype)
    if residual is not None and residual.dtype != spec.out_dtype:  # supports() refuses such a call
        raise ValueError(f"emu_sm90: residual dtype {residual.dtype} != output dtype {spec.out_dtype}")
    n, k = weight.shape[0], weight.shape[1] * 2
    m = x.numel() // k
    cfg = config_for(m, n, k, x.dtype, activation)
    prepared = cached_sm90_weight(weight, weight_scale, weight_scale_2, kind_of(x.dtype))
    args = prepare_sm90_args(x, prepared, input_scale, bias, residual, activation, out_dtype, cfg)
    kernel = prepare(compile_spec_for(cfg, args.spec, x.dtype, _SM_COUNT))
    kernel.launch(*args.abi_values(), 0)
    return args.out.reshape(*x.shape[:-1], args.out.shape[-1])


_SM100_SM_COUNT = 148  # the B200 profile


def supports_sm100(p: LinearProblem) -> Optional[str]:
    """The sm100 backend's own rules, for CPU tensors on the B200 profile."""
    return _as_on_gpu(p, (10, 0), sm100_backend.supports)


def run_emu_sm100(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype):
    spec = linear_spec(x.dtype, weight_scale_2, bias, residual, activation, out_dtype)
    m, n, k = x.numel() // x.shape[-1], weight.shape[0], weight.shape[1] * 2
    cfg = sm100_backend._policy_config(m, n, k, spec.out_dtype, spec.activation, "sm_100a", _SM100_SM_COUNT)
    if cfg is None:
        raise RuntimeError(f"nvgemm emulator sm100: no implementable config for M={m} N={n} K={k}")
    args = prepare_sm100_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, spec, cfg,
                              quantize=quantize_nvfp4_cuda)
    kernel = prepare(sm100_backend.compile_spec_for(cfg, spec, "sm_100a", _SM100_SM_COUNT), device="B200")
    z = 0
    kernel.launch(args.a, args.b, args.sfa, args.sfb, args.out, args.alpha if args.alpha is not None else z,
                  args.bias if args.bias is not None else z, args.residual if args.residual is not None else z,
                  args.workspace if args.workspace is not None else z, args.counters if args.counters is not None else z,
                  args.m, args.n, args.k, 0)
    return args.out.reshape(*x.shape[:-1], args.out.shape[-1])


def run_emu_sm100_requant(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, spec,
                          config=None, quantized=None):
    """``nvgemm::nvfp4_linear_requant`` through the sm_100a kernel's fused requant epilogue on the emulator
    (CPU tensors; ``spec`` has ``out_quant=True``). Config: ``config`` or the smallest 1-CTA swap-AB tile
    that holds every token in one N tile. Returns (packed codes, swizzled e4m3 scales)."""
    why = _tooling()
    if why:
        raise RuntimeError(f"nvgemm emulator sm100 (fused requant): {why}")
    m = x.shape[0] if quantized is None else quantized[0].shape[0]
    if config is None:
        config = requant_config(m)
        if config is None:
            raise ValueError(f"nvgemm emulator sm100 (fused requant): M={m} tokens > 128 (one swap-AB N tile)")
    args = prepare_sm100_requant_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale,
                                      spec, config, quantize=quantize_nvfp4_cuda, quantized=quantized)
    kernel = prepare(sm100_backend.compile_spec_for(config, spec, "sm_100a", _SM100_SM_COUNT), device="B200")
    z = lambda t: t if t is not None else 0  # noqa: E731
    kernel.launch(args.a, args.b, args.sfa, args.sfb, args.out, args.alpha, z(args.bias), args.residual,
                  z(args.workspace), z(args.counters), args.m, args.n, args.k, 0)
    return args.out, args.residual.view(torch.float8_e4m3fn)


def supports_sm100_requant(p: LinearProblem) -> Optional[str]:
    """The sm100 fused requant launch's rules, for CPU tensors on the B200 profile."""
    return _as_on_gpu(p, (10, 0), sm100_backend.supports_requant)


def run_emu_sm100_requant_op(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale,
                             out_dtype=None, quantized=None):
    """``nvgemm::nvfp4_linear_requant``'s arguments (``quantized`` with ``x`` None:
    ``nvfp4_linear_prequant_requant``'s) -> :func:`run_emu_sm100_requant`."""
    spec = requant_spec(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_dtype, quantized)
    return run_emu_sm100_requant(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, spec,
                                 quantized=quantized)


def run_emu_sm100_prequant(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, residual,
                           out_dtype):
    """``nvgemm::nvfp4_linear_prequant`` through the sm_100a W4A4 kernel on the emulator, fed the given
    activation codes and scales (the GPU backend's host path: ``sm100_backend.prequant_args``)."""
    why = _tooling()
    if why:
        raise RuntimeError(f"nvgemm emulator sm100 (prequant): {why}")
    args, cfg = sm100_backend.prequant_args(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias,
                                            residual, out_dtype, "sm_100a", _SM100_SM_COUNT)
    kernel = prepare(sm100_backend.compile_spec_for(cfg, args.spec, "sm_100a", _SM100_SM_COUNT), device="B200")
    z = lambda t: t if t is not None else 0  # noqa: E731
    kernel.launch(args.a, args.b, args.sfa, args.sfb, args.out, z(args.alpha), z(args.bias), z(args.residual),
                  z(args.workspace), z(args.counters), args.m, args.n, args.k, 0)
    return args.out


SM120_BACKEND_NAME = "emu_sm120"
_SM120_SM_COUNT = 170  # the RTX 5090 profile (sm_120a)


def supports_sm120(p: LinearProblem) -> Optional[str]:
    """The rules of the GPU backend an sm_120 device would run ``p`` on, for CPU tensors on the RTX 5090
    profile: ``cutedsl_sm120`` for W4A4, ``cutedsl_mma_w4a16`` for W4A16."""
    return _as_on_gpu(p, (12, 0), sm90_backend.supports_mma if p.weight_only else sm120_backend.supports)


def run_emu_sm120(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype):
    """``nvgemm::nvfp4_linear`` on the emulator as an sm_120 GPU runs it: W4A4 through the sm120_w4a4 kernel
    (the ``cutedsl_sm120`` host path: policy pick, :func:`prepare_sm120_args` with the activation quantizer),
    W4A16 (no ``input_scale``) through the W4A16 ``mma`` kernel compiled for sm_120a (the
    ``cutedsl_mma_w4a16`` host path: prepared weight, the policy's pick for the arch)."""
    spec = linear_spec(x.dtype, weight_scale_2, bias, residual, activation, out_dtype)
    m, n, k = x.numel() // x.shape[-1], weight.shape[0], weight.shape[1] * 2
    if input_scale is None:
        cfg = pick_config(m, n, k, x.dtype, activation, _SM120_SM_COUNT, "sm_120a")
        prepared = cached_sm90_weight(weight, weight_scale, weight_scale_2, kind_of(x.dtype))
        args = prepare_sm90_args(x, prepared, input_scale, bias, residual, activation, out_dtype, cfg)
        kernel = prepare(compile_spec_for(cfg, args.spec, x.dtype, _SM120_SM_COUNT, "sm_120a"), device="RTX5090")
        kernel.launch(*args.abi_values(), 0)
        return args.out.reshape(*x.shape[:-1], args.out.shape[-1])
    cfg = sm120_backend.pick_config(m, n, k, spec.activation, "sm_120a", _SM120_SM_COUNT)
    if cfg is None:
        raise RuntimeError(f"nvgemm emulator sm120: no implementable config for M={m} N={n} K={k}")
    args = prepare_sm120_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, spec, cfg,
                              quantize=quantize_nvfp4_cuda)
    # the AOT key does not depend on the SM count (the grid is sized at launch): the arch's default, as on a GPU
    kernel = prepare(sm120_backend.compile_spec_for(cfg, spec, "sm_120a"), device="RTX5090")
    kernel.launch(*args.abi_values(), 0)
    return args.out.reshape(*x.shape[:-1], args.out.shape[-1])


def _sm120_plan(m: int, n: int, k: int, spec, what: str):
    """(config, emulated kernel) of one sm_120a W4A4 launch: the policy's pick for the RTX 5090 profile (what
    ``cutedsl_sm120``'s ``launch_plan`` decides on such a GPU) and its AOT artifact on the emulator."""
    cfg = sm120_backend.pick_config(m, n, k, spec.activation, "sm_120a", _SM120_SM_COUNT)
    if cfg is None:
        raise RuntimeError(f"nvgemm emulator sm120 ({what}): no implementable config for M={m} N={n} K={k}")
    sm120_check_problem(cfg, m, n, k, spec)
    # the AOT key does not depend on the SM count (the grid is sized at launch): the arch's default, as on a GPU
    return cfg, prepare(sm120_backend.compile_spec_for(cfg, spec, "sm_120a"), device="RTX5090")


def supports_sm120_requant(p: LinearProblem) -> Optional[str]:
    """The sm120 fused requant launch's rules (``cutedsl_sm120``'s), for CPU tensors on the RTX 5090 profile."""
    return _as_on_gpu(p, (12, 0), sm120_backend.supports_requant)


def run_emu_sm120_requant_op(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale,
                             out_dtype=None, quantized=None):
    """``nvgemm::nvfp4_linear_requant`` (``quantized`` with ``x`` None: ``nvfp4_linear_prequant_requant``)
    through the sm_120a W4A4 kernel's fused SwiGLU + NVFP4 requant epilogue on the emulator: the
    ``cutedsl_sm120`` host path (``prepare_sm120_requant_args`` with the activation quantizer). Returns
    (packed codes, swizzled e4m3 scales)."""
    spec = requant_spec(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_dtype, quantized)
    m = x.numel() // x.shape[-1] if quantized is None else quantized[0].shape[0]
    cfg, kernel = _sm120_plan(m, weight.shape[0], weight.shape[1] * 2, spec, "fused requant")
    args = prepare_sm120_requant_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale,
                                      spec, cfg, quantize=quantize_nvfp4_cuda, quantized=quantized)
    kernel.launch(*args.abi_values(), 0)
    return args.out, args.residual.view(torch.float8_e4m3fn)


def run_emu_sm120_prequant(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, residual,
                           out_dtype):
    """``nvgemm::nvfp4_linear_prequant`` through the sm_120a W4A4 kernel on the emulator, fed the given
    activation codes and scales (``cutedsl_sm120``'s host path: ``prepare_sm120_args(quantized=...)``)."""
    spec = linear_spec(out_dtype, weight_scale_2, bias, residual, "none", out_dtype)
    cfg, kernel = _sm120_plan(packed.shape[0], weight.shape[0], weight.shape[1] * 2, spec, "prequant")
    args = prepare_sm120_args(None, weight, weight_scale, weight_scale_2, input_scale, bias, residual, spec, cfg,
                              quantized=(packed, scales))
    kernel.launch(*args.abi_values(), 0)
    return args.out


MOE_SM100_BACKEND_NAME = "emu_sm100_moe"


def supports_moe_sm100(p) -> Optional[str]:
    """The sm100 grouped MoE backend's own rules, for CPU tensors on the B200 profile -- and only when
    forced (``NVGEMM_MOE_BACKEND=emu_sm100_moe``): never an autotuning candidate (seconds per call)."""
    if settings.NVGEMM_MOE_BACKEND != MOE_SM100_BACKEND_NAME:
        return f"runs only when forced (NVGEMM_MOE_BACKEND={MOE_SM100_BACKEND_NAME})"
    return _as_on_gpu(p, (10, 0), sm100_moe_backend.supports)


def run_emu_moe_sm100(x, topk_ids, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale,
                      w2_scale_2, w2_input_scale, activation="silu_mul", router_weight_on_input=False, expert_map=None,
                      shared_out=None, residual=None, out_dtype=None, configs=None):
    """``nvgemm::nvfp4_moe`` through the sm_100a grouped kernels on the emulator
    (``NVGEMM_MOE_BACKEND=emu_sm100_moe``): the production host path
    (:func:`nvgemm.templates.sm100_moe.launch.moe_forward`), the policy's pick for the B200 profile."""
    m, h = x.shape
    if configs is None:
        configs = pick_moe_configs(m, w13.shape[0], topk_ids.shape[1], h, w2.shape[2] * 2, _SM100_SM_COUNT)

    def launch(args):
        spec = make_spec("sm100_moe_nvfp4", args.config, "sm_100a", epilogue=args.spec,
                         hw=HardwareSpec(sm_count=_SM100_SM_COUNT))
        prepare(spec, device="B200").launch(*args.abi_values(), 0)

    return moe_forward(x, topk_ids, expert_map, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2,
                       w2_scale, w2_scale_2, w2_input_scale, activation, router_weight_on_input, shared_out, residual,
                       out_dtype, configs[0], configs[1], launch)


MOE_SM120_BACKEND_NAME = "emu_sm120_moe"


def supports_moe_sm120(p) -> Optional[str]:
    """The sm120 grouped MoE backend's own rules, for CPU tensors on the RTX 5090 profile -- and only when
    forced (``NVGEMM_MOE_BACKEND=emu_sm120_moe``): never an autotuning candidate (seconds per call)."""
    if settings.NVGEMM_MOE_BACKEND != MOE_SM120_BACKEND_NAME:
        return f"runs only when forced (NVGEMM_MOE_BACKEND={MOE_SM120_BACKEND_NAME})"
    return _as_on_gpu(p, (12, 0), sm120_moe_backend.supports)


def run_emu_moe_sm120(x, topk_ids, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale,
                      w2_scale_2, w2_input_scale, activation="silu_mul", router_weight_on_input=False, expert_map=None,
                      shared_out=None, residual=None, out_dtype=None, configs=None):
    """``nvgemm::nvfp4_moe`` through the sm_120a grouped kernels on the emulator
    (``NVGEMM_MOE_BACKEND=emu_sm120_moe``): the production host path
    (:func:`nvgemm.templates.sm120_moe.launch.moe_forward`), the policy's pick for the RTX 5090 profile."""
    m, h = x.shape
    if configs is None:
        configs = pick_sm120_moe_configs(m, w13.shape[0], topk_ids.shape[1], h, w2.shape[2] * 2, "sm_120a",
                                         _SM120_SM_COUNT)

    def launch(args):
        spec = sm120_moe_backend.compile_spec_for(args.config, args.spec, "sm_120a")
        prepare(spec, device="RTX5090").launch(*args.abi_values(), 0)

    return sm120_moe_forward(x, topk_ids, expert_map, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale,
                             w2, w2_scale, w2_scale_2, w2_input_scale, activation, router_weight_on_input, shared_out,
                             residual, out_dtype, configs[0], configs[1], launch)


BACKEND = Backend(name=BACKEND_NAME, priority=PRIORITY, supports=supports, run=run_emu_sm90, autotune=False)
SM100_BACKEND = Backend(name=SM100_BACKEND_NAME, priority=PRIORITY, supports=supports_sm100, run=run_emu_sm100,
                        autotune=False)
SM120_BACKEND = Backend(name=SM120_BACKEND_NAME, priority=PRIORITY, supports=supports_sm120, run=run_emu_sm120,
                        autotune=False)
#: (op kind, backend) for every backend the emulator provides
BACKENDS = (
    ("linear", BACKEND),
    ("linear", SM100_BACKEND),
    ("linear", SM120_BACKEND),
    (REQUANT, Backend(name=SM100_BACKEND_NAME, priority=PRIORITY, supports=supports_sm100_requant,
                      run=run_emu_sm100_requant_op, autotune=False)),
    (PREQUANT, Backend(name=SM100_BACKEND_NAME, priority=PRIORITY, supports=supports_sm100,
                       run=run_emu_sm100_prequant, autotune=False)),
    (REQUANT, Backend(name=SM120_BACKEND_NAME, priority=PRIORITY, supports=supports_sm120_requant,
                      run=run_emu_sm120_requant_op, autotune=False)),
    (PREQUANT, Backend(name=SM120_BACKEND_NAME, priority=PRIORITY, supports=supports_sm120,
                       run=run_emu_sm120_prequant, autotune=False)),
    (MOE, Backend(name=MOE_SM100_BACKEND_NAME, priority=PRIORITY, supports=supports_moe_sm100, run=run_emu_moe_sm100)),
    (MOE, Backend(name=MOE_SM120_BACKEND_NAME, priority=PRIORITY, supports=supports_moe_sm120, run=run_emu_moe_sm120)),
)

__all__ = ["BACKEND", "BACKENDS", "BACKEND_NAME", "MOE_SM100_BACKEND_NAME", "MOE_SM120_BACKEND_NAME", "SM100_BACKEND",
           "SM100_BACKEND_NAME", "SM120_BACKEND", "SM120_BACKEND_NAME", "config_for", "run_emu_sm120",
           "supports_sm120", "run_emu_sm100", "run_emu_sm100_prequant", "run_emu_sm100_requant",
           "run_emu_sm100_requant_op", "supports_sm100_requant", "run_emu_sm90", "run_emu_moe_sm100",
           "run_emu_moe_sm120", "run_emu_sm120_prequant", "run_emu_sm120_requant_op", "supports",
           "supports_moe_sm100", "supports_moe_sm120", "supports_sm100", "supports_sm120_requant"]
