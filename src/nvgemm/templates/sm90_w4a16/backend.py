"""Backends ``cutedsl_sm90`` and ``cutedsl_mma_w4a16`` of ``nvgemm::nvfp4_linear``: the W4A16 CuTeDSL
kernels of this folder -- on Hopper both families (``cutedsl_sm90``), on Ampere / Ada (sm_80, sm_86,
sm_89) and GeForce / workstation Blackwell / DGX Spark (sm_120a, sm_121a) the ``mma`` decode kernel
compiled for the device's arch (``cutedsl_mma_w4a16``; :data:`ARCH_OF_CAPABILITY`).

Thin wiring of :mod:`nvgemm.templates.sm90_w4a16` into the run time: which problems it takes
(:func:`supports`), which config a call runs (:func:`pick_config`: the policy's first candidate,
ranked by the performance model), where the compiled kernel comes from (the kernel cache,
``nvgemm.aot.cache``; on a box without cutlass-dsl the kernels must be precompiled), and the
eager op (:func:`run_sm90`). The host work per call lives in :mod:`nvgemm.templates.sm90_w4a16.launch`.

Supports: CUDA tensors on an sm_90 device (capability 9.0; ``cutedsl_mma_w4a16``: 8.0, 8.6, 8.9, 12.0,
12.1), K % 32 == 0, bf16/fp16 activations,
residual in the output dtype, and for ``silu_mul`` N/2 % 16 == 0 (others fall back to the emulated
op with a warning). W4A4 layers run weight-only on quantize-dequantized activations (exact; see
the launch module).
"""

from __future__ import annotations

import functools
import logging
from typing import Optional

import torch

from nvgemm.core.epilogue import EpilogueSpec
from nvgemm.templates.sm90_w4a16.config import (
    ARCH_CAPS,
    Sm90W4A16Config,
    arch_problem,
    config_from_name,
    shape_problem,
    template_id_of,
    validate_config,
)
from nvgemm.templates.sm90_w4a16.launch import (
    WORKSPACES, _aligned_rows, cached_sm90_weight, launch_sm90, prepare_sm90_args, qdq_activation, split_k_needs,
)
from nvgemm.templates.sm90_w4a16.operand import kind_of
from nvgemm.core.backend import Backend
from nvgemm.core.validation import LinearProblem, linear_spec
from nvgemm.aot.abi import HardwareSpec
from nvgemm.aot.cache import default_cache
from nvgemm.aot.compile_spec import make_spec

log = logging.getLogger("nvgemm_cutedsl.sm90")

ARCH = "sm_90a"
BACKEND_NAME = "cutedsl_sm90"
PRIORITY = 90
#: The ``mma`` kernel on every other arch it compiles for.
MMA_BACKEND_NAME = "cutedsl_mma_w4a16"
MMA_PRIORITY = 90
#: CUDA capability -> the target arch of its kernels. Arch-specific (``a``) cubins run only on their
#: own capability; an sm_80 / sm_86 cubin would also load on later 8.x parts, but only the listed
#: capabilities are served (others fall back with the registry's warning).
ARCH_OF_CAPABILITY = {(9, 0): "sm_90a", (8, 0): "sm_80", (8, 6): "sm_86", (8, 9): "sm_89", (12, 0): "sm_120a",
                      (12, 1): "sm_121a"}

_X_FORMAT = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def default_config(m: int, arch: str = ARCH) -> Sm90W4A16Config:
    """The config when the policy is unavailable: on sm_90a the decode kernel for M <= 32, the
    register-A WGMMA kernel (64 or 128 tokens x 256 rows per CTA) beyond; on the other archs the
    decode kernel at every M (32 tokens per CTA beyond 16), PDL where the arch has it, with the
    deepest ring of 4..2 stages that fits the arch's shared memory."""
    pdl = ARCH_CAPS[arch].pdl
    if m <= 32 or arch != ARCH:
        tm = 8 if m <= 8 else (16 if m <= 16 else 32)
        for st in (4, 3, 2):
            cfg = Sm90W4A16Config("mma", tile_m=tm, tile_n=128, tile_k=256, num_warps=4, stages=st, pdl=pdl)
            if arch_problem(cfg, arch) is None:
                return cfg
        return Sm90W4A16Config("mma", tile_m=tm, tile_n=128, tile_k=128, num_warps=4, stages=2, pdl=pdl)
    return Sm90W4A16Config("wgmma", tile_m=64 if m <= 64 else 128, tile_n=256, tile_k=128, num_warps=8, stages=4,
                           pdl=True)


@functools.lru_cache(maxsize=4096)
def pick_config(m: int, n: int, k: int, x_dtype: torch.dtype, activation: str, sm_count: int,
                arch: str = ARCH) -> Sm90W4A16Config:
    """The heuristics' first candidate this runtime can run on ``arch`` (the policy ranks them with the
    performance model); without the policy: :func:`default_config`."""
    gated = activation == "silu_mul"
    try:
        # lazy: optional here (the except ImportError below falls back)
        from nvgemm.heuristics import candidates
        from nvgemm.core.problem import GemmProblem, Target

        prob = GemmProblem(n=n, k=k, m=m, a_format=_X_FORMAT[x_dtype], b_format="nvfp4",
                           epilogue=activation, target=Target(arch=arch, sm_count=sm_count))
        for c in candidates(prob, use_nvmmh=False):
            cfg = c.config
            if isinstance(cfg, Sm90W4A16Config) and validate_config(cfg) and not shape_problem(cfg, m, n, k, gated) \
                    and arch_problem(cfg, arch) is None:
                return cfg
    except (ImportError, ValueError, TypeError) as e:  # policy unavailable: fall back to the default
        log.info("nvgemm_cutedsl sm90: heuristics failed (%s); using the default config", e)
    cfg = default_config(m, arch)
    if gated and cfg.family == "mma" and cfg.row_tiles % 2:
        cfg = Sm90W4A16Config("mma", tile_m=cfg.tile_m, tile_n=2 * cfg.tile_n, tile_k=cfg.tile_k,
                              num_warps=cfg.num_warps, stages=cfg.stages, pdl=cfg.pdl)
        if arch_problem(cfg, arch) is not None:  # the doubled rows need a shallower ring
            cfg = Sm90W4A16Config("mma", tile_m=cfg.tile_m, tile_n=cfg.tile_n, tile_k=128, num_warps=cfg.num_warps,
                                  stages=2, pdl=cfg.pdl)
    return cfg


def compile_spec_for(config: Sm90W4A16Config, spec: EpilogueSpec, x_dtype: torch.dtype, sm_count: int = 132,
                     arch: str = ARCH):
    return make_spec(template_id_of(config), config, arch, epilogue=spec, hw=HardwareSpec(sm_count=sm_count),
                     a_format=_X_FORMAT[x_dtype], b_format="nvfp4")


def arch_of(capability) -> Optional[str]:
    """The kernels' target arch for a CUDA capability (None: not served)."""
    return ARCH_OF_CAPABILITY.get(tuple(capability)) if capability is not None else None


def _device_arch_sms(device: torch.device) -> tuple[str, int]:
    """(kernel arch, SM count) of ``device`` (torch memoises the properties)."""
    props = torch.cuda.get_device_properties(device)
    arch = arch_of((props.major, props.minor))
    if arch is None:
        raise RuntimeError(f"nvgemm: no W4A16 kernel arch for capability {props.major}.{props.minor}")
    return arch, props.multi_processor_count


def supports(p: LinearProblem) -> Optional[str]:
    """The sm90 rules for ``p``. Operand alignment (``p.misaligned``) does not refuse: the launcher copies an
    unaligned x, the kernels read the prepared copy of the weight, and bias / residual need only element
    alignment (the ABI's ``assumed_align``)."""
    if p.device_type != "cuda":
        return f"needs a CUDA device (got {p.device_type})"
    if p.capability is None or tuple(p.capability) != (9, 0):
        return f"needs an sm_90 GPU (capability 9.0), got {p.capability}"
    return _common_rules(p)


def supports_mma(p: LinearProblem) -> Optional[str]:
    """``cutedsl_mma_w4a16``'s rules: a capability of :data:`ARCH_OF_CAPABILITY` other than Hopper's (which
    ``cutedsl_sm90`` serves), then the rules both backends share."""
    if p.device_type != "cuda":
        return f"needs a CUDA device (got {p.device_type})"
    if arch_of(p.capability) in (None, ARCH):
        served = ", ".join(f"{a}.{b}" for a, b in ARCH_OF_CAPABILITY if (a, b) != (9, 0))
        return f"needs an sm_80 / sm_86 / sm_89 / sm_120 / sm_121 GPU (capability {served}), got {p.capability}"
    return _common_rules(p)


def _common_rules(p: LinearProblem) -> Optional[str]:
    """The rules of both backends after the device's."""
    if p.x_dtype not in _X_FORMAT:
        return f"x must be bfloat16 or float16, got {p.x_dtype}"
    if p.k % 32:
        return f"K={p.k} is not a multiple of 32 (16-byte rows of packed FP4)"
    if p.activation == "silu_mul" and (p.n % 2 or (p.n // 2) % 16):
        return f"silu_mul needs N/2 = {p.n // 2} to be a multiple of 16 (whole gate and up row tiles)"
    if p.m < 1:
        return "empty input (M = 0)"
    if p.residual_cast:
        return "residual dtype differs from the output dtype (the kernel adds the residual in the output dtype)"
    return None


@functools.lru_cache(maxsize=1024)
def _kernel_for(config: Sm90W4A16Config, spec: EpilogueSpec, x_dtype: torch.dtype, sm_count: int, arch: str = ARCH):
    """The loaded kernel for one (config, epilogue, dtype, arch): spec hashing and cache lookup once."""
    return default_cache().get(compile_spec_for(config, spec, x_dtype, sm_count, arch))


def run_sm90(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype,
             config=None):
    """Eager implementation of ``cutedsl_sm90`` (CUDA sm_90 only) of a call the op has validated.

    ``config`` (a config or its name; autotuned code passes one) overrides the policy's pick."""
    spec = linear_spec(x.dtype, weight_scale_2, bias, residual, activation, out_dtype)
    if residual is not None and residual.dtype != spec.out_dtype:  # supports() refuses such a call
        raise ValueError(f"cutedsl_sm90: residual dtype {residual.dtype} != output dtype {spec.out_dtype}")
    prepared = cached_sm90_weight(weight, weight_scale, weight_scale_2, kind_of(x.dtype))
    return run_prepared(x, prepared, input_scale, bias, residual, activation, out_dtype, config)


def run_prepared(x, prepared, input_scale, bias, residual, activation, out_dtype, config=None):
    """The kernel on an already prepared weight (:class:`~nvgemm.templates.sm90_w4a16.operand.Sm90Weight`);
    the caller has validated the call (residual in the output dtype, x of the prepared kind)."""
    arch, sms = _device_arch_sms(x.device)
    n, k = prepared.n, prepared.k
    m = x.numel() // k
    if config is None:
        config = pick_config(m, n, k, x.dtype, activation, sms, arch)
    elif isinstance(config, str):
        config = config_from_name(config)
    stream = torch.cuda.current_stream(x.device)
    args = prepare_sm90_args(x, prepared, input_scale, bias, residual, activation, out_dtype, config,
                             stream_id=stream.cuda_stream)
    kernel = _kernel_for(config, args.spec, x.dtype, sms, arch)
    launch_sm90(args, kernel, stream)
    return args.out if x.dim() == 2 else args.out.reshape(*x.shape[:-1], args.out.shape[-1])


#: ABI positions of the launch's per-call arguments (:meth:`~nvgemm.templates.sm90_w4a16.launch.Sm90Args.abi_values`
#: then the stream): x, residual (the output when there is none), out, split-K workspace and counters
_X, _RES, _OUT, _WORK, _COUNT, _STREAM = 0, 5, 6, 7, 8, 9


def bind_prepared(x, prepared, input_scale, bias, residual, activation, out_dtype):
    """The bound launcher of a :func:`run_prepared` call it has served: the prepared weight, alpha, bias and
    (when the call needs no pooled split-K workspace) the workspace packed into the kernel's argument array
    once; returns ``call(x, residual) -> out``, which prepares ``x`` (the W4A8 round trip when
    ``input_scale``), allocates the output and launches. The caller keys the binding on ``x``'s and
    ``residual``'s metadata and on the unchanged layer tensors."""
    dev = x.device
    arch, sms = _device_arch_sms(dev)
    n, k = prepared.n, prepared.k
    m = x.numel() // k
    config = pick_config(m, n, k, x.dtype, activation, sms, arch)
    stream = torch.cuda.current_stream(dev)
    args = prepare_sm90_args(x, prepared, input_scale, bias, residual, activation, out_dtype, config,
                             stream_id=stream.cuda_stream)
    kernel = _kernel_for(config, args.spec, x.dtype, sms, arch)
    need_w, need_c = split_k_needs(config, m, prepared, args.out.shape[1], args.spec.activation == "silu_mul")
    per_call = [_X, _RES, _OUT] + ([_WORK, _COUNT] if need_w else []) + [_STREAM]
    launch = kernel.bind((*args.abi_values(), stream), tuple(per_call))
    out_shape, odt = tuple(args.out.shape), args.out.dtype
    reshape = x.dim() != 2
    r_contig = residual is None or residual.reshape(out_shape).stride(-1) == 1
    current_stream, empty = torch.cuda.current_stream, torch.empty
    current_pair, dev_key, checked = WORKSPACES.current, str(dev), [None]

    def call(x, residual=None):
        x2 = x.reshape(-1, k) if reshape else x
        if input_scale is not None:
            x2 = qdq_activation(x2, input_scale)
        x2 = _aligned_rows(x2)
        out = empty(out_shape, dtype=odt, device=dev)
        r = out
        if residual is not None:
            r = residual.reshape(out_shape) if r_contig else residual.reshape(out_shape).contiguous()
        stream = current_stream(dev)
        if need_w:
            sid = stream.cuda_stream
            pair = current_pair(dev_key, sid)
            if pair is None or pair is not checked[0]:  # the pool's pair changed: take (and check) it anew
                pair = checked[0] = WORKSPACES.get(dev, need_w, need_c, sid)
            launch(stream, x2, r, out, pair[0], pair[1])
        else:
            launch(stream, x2, r, out)
        return out if not reshape else out.reshape(*x.shape[:-1], out_shape[1])

    return call


def bind_sm90(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype,
              config=None):
    """The bound launcher of an ``nvfp4_linear`` call :func:`run_sm90` has served (``Backend.bind``): the
    prepared weight looked up once, the launch bound by :func:`bind_prepared`."""
    if config is not None:
        return None
    prepared = cached_sm90_weight(weight, weight_scale, weight_scale_2, kind_of(x.dtype))
    call = bind_prepared(x, prepared, input_scale, bias, residual, activation, out_dtype)

    def run(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype):
        return call(x, residual)
    return run


BACKEND = Backend(name=BACKEND_NAME, priority=PRIORITY, supports=supports, run=run_sm90, bind=bind_sm90)
#: The same eager op and bound launcher: the device's arch picks the compiled kernel (and the policy
#: offers only the ``mma`` family off Hopper).
MMA_BACKEND = Backend(name=MMA_BACKEND_NAME, priority=MMA_PRIORITY, supports=supports_mma, run=run_sm90,
                      bind=bind_sm90)

__all__ = ["ARCH", "ARCH_OF_CAPABILITY", "BACKEND", "MMA_BACKEND", "MMA_BACKEND_NAME", "arch_of", "compile_spec_for",
           "default_config", "pick_config", "run_prepared", "run_sm90", "supports", "supports_mma",
           "template_id_of"]
