"""Backend ``emu_sm90`` of ``nvgemm::nvfp4_linear``: the real sm_90a kernels, executed on the CPU by
the PTX emulator (``NVGEMM_BACKEND=emu_sm90``; never chosen automatically).

Each call runs the production sm90 host path (:func:`~nvgemm.templates.sm90.launch.prepare_sm90_args`,
the kernel cache's AOT artifact, ``AotKernel`` argument packing) on CPU tensors, with the artifact
relinked against the fake CUDA runtime and its PTX interpreted (:mod:`nvgemm.emulator.runner`).
The config is the runtime's own pick (:func:`nvgemm.runtime.sm90_backend.pick_config`); where that
is a ``wgmma`` config (M > 32), whose ``wgmma`` instructions the interpreter does not run yet, the
``mma`` decode family's 32-token config serves the call instead (one warning). Slow (about 0.5-5 s
per call on one core): a correctness tool, not a compute path.

An ``emu_sm100`` backend needs the tcgen05 / TMA / mbarrier opcode families (``nvgemm.emulator.isa``)
wired into the interpreter; it is not registered until they are.
"""

from __future__ import annotations

import importlib.util
import shutil
from typing import Optional

import torch

from ..runtime.backends import Backend, LinearProblem, register_backend, warn_once

BACKEND_NAME = "emu_sm90"
PRIORITY = -2000  # below the emulated reference (which supports everything): only ever forced

_X = (torch.bfloat16, torch.float16)
_SM_COUNT = 132  # the H100 / H200 device profile


def supports(p: LinearProblem) -> Optional[str]:
    if p.device_type != "cpu":
        return f"the PTX emulator runs CPU tensors (got {p.device_type})"
    if p.x_dtype not in _X:
        return f"x must be bfloat16 or float16, got {p.x_dtype}"
    if p.k % 32:
        return f"K={p.k} is not a multiple of 32"
    if p.activation == "silu_mul" and (p.n % 2 or (p.n // 2) % 16):
        return f"silu_mul needs N/2 = {p.n // 2} to be a multiple of 16"
    if p.m < 1:
        return "empty input (M = 0)"
    if importlib.util.find_spec("cutlass") is None:
        return "needs nvidia-cutlass-dsl (the PTX comes from compiling the kernel with keep_ptx)"
    if shutil.which("gcc") is None:
        return "needs gcc (builds the fake CUDA runtime and relinks the kernel)"
    return None


def config_for(m: int, n: int, k: int, x_dtype: torch.dtype, activation: str):
    """The runtime's pick, or the mma family's 32-token config where the pick is a wgmma kernel."""
    from ..runtime.sm90_backend import pick_config
    from ..templates.sm90.config import Sm90W4A16Config

    cfg = pick_config(m, n, k, x_dtype, activation, _SM_COUNT)
    if cfg.family != "mma":
        warn_once(f"emu-wgmma-{cfg.name()}",
                  f"nvgemm emulator: the pick {cfg.name()} is a wgmma kernel, which the PTX emulator does not run "
                  "yet; emu_sm90 runs the mma family's t32x256x256 config for it")
        cfg = Sm90W4A16Config("mma", tile_m=32, tile_n=256, tile_k=256, num_warps=8, stages=3, pdl=True)
    return cfg


def run_emu_sm90(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype):
    from ..ops import check_linear_args, nvfp4_linear_emulated
    from ..runtime.sm90_backend import compile_spec_for
    from ..templates.sm90.launch import cached_sm90_weight, prepare_sm90_args, workspace_for
    from ..templates.sm90.operand import kind_of
    from .runner import prepare

    spec = check_linear_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype)
    if residual is not None and residual.dtype != spec.out_dtype:
        warn_once("emu-residual-dtype", f"nvgemm emulator: residual dtype {residual.dtype} != output dtype "
                  f"{spec.out_dtype}; this call uses the emulated op")
        return nvfp4_linear_emulated(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual,
                                     activation, out_dtype)
    n, k = weight.shape[0], weight.shape[1] * 2
    m = x.numel() // k
    cfg = config_for(m, n, k, x.dtype, activation)
    prepared = cached_sm90_weight(weight, weight_scale, weight_scale_2, kind_of(x.dtype))
    args = prepare_sm90_args(x, prepared, input_scale, bias, residual, activation, out_dtype, cfg,
                             workspace=workspace_for(x.device) if cfg.split_k > 1 else None)
    kernel = prepare(compile_spec_for(cfg, args.spec, x.dtype, _SM_COUNT))
    kernel.launch(*args.abi_values(), 0)
    return args.out.reshape(*x.shape[:-1], args.out.shape[-1])


BACKEND = Backend(name=BACKEND_NAME, priority=PRIORITY, supports=supports, run=run_emu_sm90)
register_backend(BACKEND)

__all__ = ["BACKEND", "BACKEND_NAME", "config_for", "run_emu_sm90", "supports"]
