"""The ``cutedsl_sm100`` backends (``nvfp4_linear`` and the fused requant / prequant ops) of the sm100 NVFP4 family.

Family code (config, validity rule, kernel, host launcher) lives in :mod:`nvgemm.templates.sm100_w4a4`;
this module adds what belongs to the runtime: the device predicate (``supports``: a CUDA device of
the sm_100 family, capability 10.x, so on CPU and other GPUs the backend is never selected),
config selection through the candidate policy, the hardware cluster-occupancy query
(:mod:`nvgemm.templates.common.occupancy`), and fetching the compiled kernel from the kernel cache
(``nvgemm.aot.cache``), compiled for an explicit arch with explicit hardware numbers.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable, Optional

import torch

from nvgemm.core.validation import LinearProblem, alignment_reason, linear_spec
from nvgemm.core.epilogue import EpilogueSpec
from nvgemm.templates.sm100_w4a4.config import TEMPLATE_ID, Sm100Nvfp4GemmConfig, config_from_name
from nvgemm.core.formats import NVFP4, blocked_numel
from nvgemm.templates.sm100_w4a4.launch import (
    WORKSPACES, _aligned16, device_scalar, splitk_workspace_shape, without_quant, check_problem, launch_sm100,
    prepare_sm100_args, prepare_sm100_requant_args, requant_config,
)
from nvgemm.templates.sm100_w4a4.validity import can_implement_problem
from nvgemm.core.backend import Backend
from nvgemm.templates.triton.fused_ops import bind_quantize_nvfp4_cuda, quantize_nvfp4_cuda
from nvgemm.aot import cache as cache_mod
from nvgemm.aot.abi import HardwareSpec
from nvgemm.aot.compile_spec import make_spec
from nvgemm.core.problem import GemmProblem, Target
from nvgemm.heuristics import candidates
from nvgemm.templates.sm100_w4a4.occupancy import resolve_max_active_clusters


def compile_spec_for(config: Sm100Nvfp4GemmConfig, spec: EpilogueSpec, arch: str, sm_count: int,
                     occupancy_query: Optional[Callable[[int], int]] = None):
    """The kernel cache's compile spec for one config on one device.

    ``occupancy_query(cluster_size) -> clusters`` (the driver query at run time; None ahead of
    time) decides ``hw.max_active_clusters``: the device's count, or 0 -- the template's per-arch
    AOT value, i.e. the key a precompiled kernel has -- when they agree
    (:func:`nvgemm.templates.sm100_w4a4.occupancy.resolve_max_active_clusters`)."""
    mac = resolve_max_active_clusters(arch, sm_count, config.cluster_m * config.cluster_n, occupancy_query)
    return make_spec(TEMPLATE_ID, config, arch, epilogue=spec,
                     hw=HardwareSpec(sm_count=sm_count, max_active_clusters=mac))


_AOT_FALLBACK_WARNED: set = set()


def kernel_for(cspec, cache=None):
    """The loaded kernel of ``cspec``; a device-sized spec (``hw.max_active_clusters`` set) that
    is not in the cache and cannot be built here (no cutlass-dsl) runs the precompiled AOT kernel
    instead, with one warning per spec (correct either way; the grid is then sized by the
    guaranteed count)."""
    import dataclasses

    cache = cache or cache_mod.default_cache()
    if not cspec.hw.max_active_clusters:
        return cache.get(cspec)
    try:
        return cache.get(cspec, build=cache_mod._dsl_available())
    except cache_mod.CacheMiss:
        aot = dataclasses.replace(cspec, hw=dataclasses.replace(cspec.hw, max_active_clusters=0))
        k = cache.get(aot, build=False)
        if cspec not in _AOT_FALLBACK_WARNED:
            _AOT_FALLBACK_WARNED.add(cspec)
            warnings.warn(
                f"nvgemm_cutedsl sm100: {cspec.name()}: this device holds {cspec.hw.max_active_clusters} clusters, "
                "the precompiled kernel's persistent grid is sized for the guaranteed count; run `nvgemm precompile` "
                "where cutlass-dsl can build the device-sized kernel (or install it here)", RuntimeWarning, stacklevel=2)
        return k


def arch_of(capability: tuple[int, int]) -> str:
    major, minor = capability
    if major != 10:
        raise ValueError(f"nvgemm_cutedsl sm100: capability {major}.{minor} is not the sm_100 family")
    return {0: "sm_100a", 3: "sm_103a"}.get(minor, "sm_100f")


#: operands the kernel reads in place (the launcher quantizes x into new buffers and copies alpha, bias
#: and the residual when they are not aligned); ``packed`` / ``scales`` are ``nvfp4_linear_prequant``'s
IN_PLACE_OPERANDS = ("weight", "weight_scale", "packed", "scales")


def _device_rule(p: LinearProblem) -> Optional[str]:
    """What every sm100 W4A4 launch needs: an sm_100-family GPU, an input_scale, bias in the output dtype,
    16-byte aligned operands where the kernel reads them in place."""
    if p.device_type != "cuda":
        return f"needs a CUDA device (got {p.device_type})"
    if p.capability is None or p.capability[0] != 10:
        return f"needs an sm_100-family GPU (capability 10.x), got {p.capability}"
    if p.weight_only:
        return "W4A16 (no input_scale) is not the sm100 W4A4 kernel"
    if p.bias and p.x_dtype != p.out_dtype:
        return "bias/residual must be in the output dtype"
    return alignment_reason(p, IN_PLACE_OPERANDS)


def supports(p: LinearProblem) -> Optional[str]:
    why = _device_rule(p)
    if why is not None:
        return why
    ob = torch.empty((), dtype=p.out_dtype).element_size()
    # the template's own rule for the problem (any config: shapes and alignment only)
    st = can_implement_problem(Sm100Nvfp4GemmConfig(), m=1, n=p.n, k=p.k, out_bytes=ob, activation=p.activation)
    if not st:
        return st.reason
    # the same predicate the policy uses (sm_count only ranks candidates; 148 = B200)
    if _policy_config(p.m, p.n, p.k, p.out_dtype, p.activation, arch_of(p.capability), 148) is None:
        return f"the sm100 candidate policy has no implementable config (M={p.m} N={p.n} K={p.k} {p.activation})"
    return None


_OUT_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


@functools.lru_cache(maxsize=4096)
def _policy_config(m, n, k, out_dtype, activation, arch, sm_count) -> Optional[Sm100Nvfp4GemmConfig]:
    """The policy's first candidate (deterministic; nvMatmulHeuristics off on the eager path)."""
    prob = GemmProblem(n=n, k=k, m=m, out_dtype=_OUT_NAMES[out_dtype], epilogue=activation,
                       target=Target(arch=arch, sm_count=sm_count))
    cands = candidates(prob, use_nvmmh=False)
    return cands[0].config if cands else None


@functools.lru_cache(maxsize=64)
def device_target(index: int) -> tuple[str, int]:
    """(arch, SM count) of CUDA device ``index``, read from the driver once."""
    props = torch.cuda.get_device_properties(index)
    return arch_of((props.major, props.minor)), props.multi_processor_count


def _device_index(dev: torch.device) -> int:
    return dev.index if dev.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=1024)
def launch_plan(m: int, n: int, k: int, spec: EpilogueSpec, index: int,
                config: Optional[Sm100Nvfp4GemmConfig] = None) -> tuple[Sm100Nvfp4GemmConfig, object]:
    """(config, loaded kernel) of one problem on device ``index``, decided once: the policy's pick (or the
    given ``config``), the template's problem rule for it (ValueError naming the reason), its compile spec for the device (cluster occupancy from the driver) and the kernel
    cache lookup. Bounded (least recently used problems drop out)."""
    # lazy: looked up when a plan is made (tests patch occupancy.query_max_active_clusters)
    from nvgemm.templates.common.occupancy import query_max_active_clusters

    arch, sm_count = device_target(index)
    if config is None:
        config = _policy_config(m, n, k, spec.out_dtype, spec.activation, arch, sm_count)
        if config is None:
            raise RuntimeError(f"nvgemm_cutedsl sm100: no implementable config for M={m} N={n} K={k}")
    check_problem(config, m, n, k, without_quant(spec) if spec.out_quant else spec)
    cspec = compile_spec_for(config, spec, arch, sm_count, functools.partial(query_max_active_clusters, index))
    return config, kernel_for(cspec)


def run_sm100(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype,
              config=None):
    """Eager implementation for the ``cutedsl_sm100`` backend (CUDA, sm_100 family only), of a call the
    op has validated.

    ``config`` (a config or its name; autotuned code passes one) overrides the policy's first pick. The
    config and kernel come from the per-problem :func:`launch_plan`; per call the host prepares the
    arguments (:func:`~nvgemm.templates.sm100_w4a4.launch.prepare_sm100_args`) and launches.
    """
    spec = linear_spec(x.dtype, weight_scale_2, bias, residual, activation, out_dtype)
    dev = x.device
    if isinstance(config, str):
        config = config_from_name(config)
    config, kernel = launch_plan(x.numel() // x.shape[-1], weight.shape[0], weight.shape[1] * 2, spec,
                                 _device_index(dev), config)
    stream = torch.cuda.current_stream(dev)
    args = prepare_sm100_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, spec, config,
                              stream_id=stream.cuda_stream, quantize=quantize_nvfp4_cuda, checked=True)
    launch_sm100(args, kernel, stream)
    return args.out if x.dim() == 2 else args.out.reshape(*x.shape[:-1], args.out.shape[-1])


def _stand_in_quantized(x2, input_scale, swizzle=True):
    """Buffers of the quantizer's output shapes (a binding's dry preparation: nothing is computed)."""
    m, k = x2.shape
    return (torch.empty((m, k // 2), dtype=torch.uint8, device=x2.device),
            torch.empty(blocked_numel(m, k // NVFP4.block_size), dtype=torch.float8_e4m3fn, device=x2.device))


#: ABI positions of the launch's arguments (:func:`~nvgemm.templates.sm100_w4a4.launch.launch_sm100`)
_A, _B, _SFA, _SFB, _OUT, _RES, _WS, _CNT, _STREAM = 0, 1, 2, 3, 4, 7, 8, 9, 13


def _bound_launcher(args, kernel, dev, config, x_shape, x_contiguous: bool, ins_dev, quantize, residual: bool,
                    requant: bool, prequant: bool = False):
    """The per-call remainder of a prepared sm100 launch (see :func:`bind_sm100`): quantize ``x``, allocate
    the outputs, write their pointers (and the stream's, the pooled split-K buffers') into the packed
    argument array, launch. Returns ``call(*op_args) -> out`` (the op's arguments in schema order; requant:
    ``(codes, scale bytes)``, its residual position holding the next input_scale, unused). ``prequant``: the
    activation arrives quantized (``nvfp4_linear_prequant_requant``: ``call(packed, scales, *rest)``)."""
    swap = config.swap_ab
    per_call = [_B, _SFB] if swap else [_A, _SFA]
    per_call.append(_OUT)
    if requant:
        per_call.append(_RES)
    elif residual:
        per_call.append(_RES)
    split = config.split_k > 1
    if split:
        per_call += [_WS, _CNT]
        ws_numel, n_cnt = splitk_workspace_shape(args.m, args.n, config)
    per_call.append(_STREAM)
    values = (args.a, args.b, args.sfa, args.sfb, args.out, args.alpha if args.alpha is not None else 0,
              args.bias if args.bias is not None else 0, args.residual if args.residual is not None else 0,
              args.workspace if args.workspace is not None else 0, args.counters if args.counters is not None else 0,
              args.m, args.n, args.k, torch.cuda.current_stream(dev))
    launch = kernel.bind(values, tuple(per_call))
    k = args.k
    xs_numel = (args.sfb if swap else args.sfa).numel()
    out_shape, out_dtype = tuple(args.out.shape), args.out.dtype
    res_shape = tuple(args.residual.shape) if args.residual is not None else None
    res_numel = args.residual.numel() if args.residual is not None else 0
    reshape = len(x_shape) != 2
    current_stream, empty = torch.cuda.current_stream, torch.empty
    current_pair, dev_key, checked = WORKSPACES.current, str(dev), [None]

    def call(x, _weight, _weight_scale, _weight_scale_2, _input_scale, _bias, res=None, *_rest):
        if prequant:  # (packed, scales, weight, ...): the codes as given (their metadata is the binding's key)
            xq, xs = x, _weight.view(torch.float8_e4m3fn)
        else:
            x2 = x.reshape(-1, k) if reshape else x
            if not x_contiguous:
                x2 = x2.contiguous()
            xq, xs = quantize(x2, ins_dev, True)
        if xs.numel() != xs_numel:  # as prepare_sm100_args checks (the codes follow x, whose shape is keyed)
            raise ValueError("nvgemm_cutedsl sm100: activation quantizer returned misshapen codes/scales")
        out = empty(out_shape, dtype=out_dtype, device=dev)
        stream = current_stream(dev)
        if split:
            sid = stream.cuda_stream
            pair = current_pair(dev_key, sid)
            if pair is None or pair is not checked[0]:  # the pool's pair changed: take (and check) it anew
                pair = checked[0] = WORKSPACES.get(dev, ws_numel, n_cnt, sid)
            ws, cnt = pair
            if requant:
                scales = empty(res_numel, dtype=torch.float8_e4m3fn, device=dev)
                launch(stream, xq, xs, out, scales, ws, cnt)
                return out, scales
            if residual:
                launch(stream, xq, xs, out, _aligned16(res.reshape(res_shape)), ws, cnt)
            else:
                launch(stream, xq, xs, out, ws, cnt)
        elif requant:
            scales = empty(res_numel, dtype=torch.float8_e4m3fn, device=dev)
            launch(stream, xq, xs, out, scales)
            return out, scales
        elif residual:
            launch(stream, xq, xs, out, _aligned16(res.reshape(res_shape)))
        else:
            launch(stream, xq, xs, out)
        return out if not reshape else out.reshape(*x.shape[:-1], out.shape[-1])

    return call


def bind_sm100(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype,
               config=None):
    """The bound launcher of an ``nvfp4_linear`` call :func:`run_sm100` has served (``Backend.bind``): the
    layer's operands prepared (derived alpha, gate/up interleaved copies, aligned bias) and packed into the
    kernel's argument array once; a call quantizes ``x``, allocates the output and launches."""
    if config is not None:
        return None
    spec = linear_spec(x.dtype, weight_scale_2, bias, residual, activation, out_dtype)
    dev = x.device
    config, kernel = launch_plan(x.numel() // x.shape[-1], weight.shape[0], weight.shape[1] * 2, spec,
                                 _device_index(dev))
    stream = torch.cuda.current_stream(dev)
    args = prepare_sm100_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, spec, config,
                              stream_id=stream.cuda_stream, quantize=_stand_in_quantized, checked=True)
    ins_dev = device_scalar(input_scale, dev)
    quantize = bind_quantize_nvfp4_cuda(x.numel() // x.shape[-1], x.shape[-1], x.dtype, dev, ins_dev)
    return _bound_launcher(args, kernel, dev, config, tuple(x.shape), x.is_contiguous(), ins_dev, quantize,
                           residual is not None, False)


BACKEND = Backend(name="cutedsl_sm100", priority=100, supports=supports, run=run_sm100, bind=bind_sm100)


# --------------------------------------------------------------------------- fused gated-MLP ops
# nvgemm::nvfp4_linear_requant (the out_quant epilogue) and nvgemm::nvfp4_linear_prequant (the W4A4 kernel fed
# the quantized activation): backends of the same name for those op kinds (the family's registration lists them).


def supports_requant(p: LinearProblem) -> Optional[str]:
    """The fused requant launch (``EpilogueSpec(out_quant=True)``, 1-CTA swap-AB, every token in one N tile)."""
    why = _device_rule(p)
    if why is not None:
        return why
    cfg = requant_config(p.m)
    if cfg is None:
        return f"M={p.m} > 128 tokens: the fused requant launch holds every token in one swap-AB N tile"
    ob = torch.empty((), dtype=p.out_dtype).element_size()
    st = can_implement_problem(cfg, m=p.m, n=p.n, k=p.k, out_bytes=ob, activation="silu_mul")
    return None if st else st.reason


def requant_spec(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_dtype, quantized=None) -> EpilogueSpec:
    """The fused requant launch's epilogue for a call the op has validated (``quantized``: x is None and the
    rounding dtype is ``out_dtype``)."""
    x_dtype = out_dtype if quantized is not None else x.dtype
    return _requant_spec(linear_spec(x_dtype, weight_scale_2, bias, None, "silu_mul", out_dtype))


@functools.lru_cache(maxsize=256)
def _requant_spec(gated: EpilogueSpec) -> EpilogueSpec:
    import dataclasses

    return dataclasses.replace(gated, out_quant=True)


def run_sm100_requant(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype=None,
                      quantized=None):
    """``nvgemm::nvfp4_linear_requant`` on an sm_100 GPU: (packed codes [M, I/2], swizzled e4m3 scales).
    ``quantized`` = (packed, scales) with ``x`` None: ``nvgemm::nvfp4_linear_prequant_requant`` (no quantizer)."""
    spec = requant_spec(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_dtype, quantized)
    m = x.shape[0] if quantized is None else quantized[0].shape[0]
    config = requant_config(m)
    if config is None:
        raise ValueError(f"nvgemm_cutedsl sm100: fused requant takes at most 128 tokens, got M={m}")
    dev = weight.device
    _config, kernel = launch_plan(m, weight.shape[0], weight.shape[1] * 2, spec, _device_index(dev), config)
    stream = torch.cuda.current_stream(dev)
    args = prepare_sm100_requant_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale,
                                      spec, config, quantize=quantize_nvfp4_cuda, checked=True, quantized=quantized)
    launch_sm100(args, kernel, stream)
    return args.out, args.residual.view(torch.float8_e4m3fn)


def prequant_spec(packed, weight, weight_scale, weight_scale_2, input_scale, bias, residual, out_dtype) -> EpilogueSpec:
    """The W4A4 launch's epilogue for an ``nvfp4_linear_prequant`` call the op has validated."""
    return linear_spec(out_dtype, weight_scale_2, bias, residual, "none", out_dtype)


def prequant_args(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, residual, out_dtype,
                  arch: str, sm_count: int, stream_id: int = 0, config=None):
    """(the W4A4 launch's arguments fed the given activation codes + scales, the config: ``config`` (a config or
    its name; autotuned code passes one) or the policy's pick)."""
    spec = prequant_spec(packed, weight, weight_scale, weight_scale_2, input_scale, bias, residual, out_dtype)
    m, n, k = packed.shape[0], weight.shape[0], weight.shape[1] * 2
    if isinstance(config, str):
        config = config_from_name(config)
    elif config is None:
        config = _policy_config(m, n, k, spec.out_dtype, "none", arch, sm_count)
    if config is None:
        raise RuntimeError(f"nvgemm_cutedsl sm100: no implementable config for M={m} N={n} K={k}")
    args = prepare_sm100_args(None, weight, weight_scale, weight_scale_2, input_scale, bias, residual, spec, config,
                              stream_id=stream_id, quantized=(packed, scales.view(torch.float8_e4m3fn)))
    return args, config


def run_sm100_prequant(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, residual, out_dtype,
                       config=None):
    """``nvgemm::nvfp4_linear_prequant`` on an sm_100 GPU: the W4A4 kernel, no activation quantization
    (``config``: a config or its name, as autotuned code passes; default the policy's pick)."""
    dev = packed.device
    spec = prequant_spec(packed, weight, weight_scale, weight_scale_2, input_scale, bias, residual, out_dtype)
    if isinstance(config, str):
        config = config_from_name(config)
    config, kernel = launch_plan(packed.shape[0], weight.shape[0], weight.shape[1] * 2, spec, _device_index(dev),
                                 config)
    stream = torch.cuda.current_stream(dev)
    args = prepare_sm100_args(None, weight, weight_scale, weight_scale_2, input_scale, bias, residual, spec, config,
                              stream_id=stream.cuda_stream, quantized=(packed, scales.view(torch.float8_e4m3fn)),
                              checked=True)
    launch_sm100(args, kernel, stream)
    return args.out


def bind_sm100_requant(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype=None,
                       quantized=None):
    """The bound launcher of an ``nvfp4_linear_requant`` call (``Backend.bind``; see :func:`bind_sm100`).
    ``quantized`` = (packed, scales) with ``x`` None: an ``nvfp4_linear_prequant_requant`` call, whose launcher
    takes ``(packed, scales, weight, ...)`` and launches on the given codes (no quantizer)."""
    if quantized is not None:
        return _bind_prequant_requant(quantized, weight, weight_scale, weight_scale_2, input_scale, bias,
                                      out_input_scale, out_dtype)
    spec = requant_spec(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_dtype)
    config = requant_config(x.shape[0])
    dev = x.device
    _config, kernel = launch_plan(x.shape[0], weight.shape[0], weight.shape[1] * 2, spec, _device_index(dev), config)
    args = prepare_sm100_requant_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale,
                                      spec, config, quantize=_stand_in_quantized, checked=True)
    ins_dev = device_scalar(input_scale, dev)
    quantize = bind_quantize_nvfp4_cuda(x.numel() // x.shape[-1], x.shape[-1], x.dtype, dev, ins_dev)
    return _bound_launcher(args, kernel, dev, config, tuple(x.shape), x.is_contiguous(), ins_dev, quantize, False,
                           True)


def _bind_prequant_requant(quantized, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale,
                           out_dtype):
    packed, scales = quantized
    m = packed.shape[0]
    spec = requant_spec(None, weight, weight_scale, weight_scale_2, input_scale, bias, out_dtype, quantized)
    config = requant_config(m)
    dev = weight.device
    _config, kernel = launch_plan(m, weight.shape[0], weight.shape[1] * 2, spec, _device_index(dev), config)
    args = prepare_sm100_requant_args(None, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale,
                                      spec, config, checked=True,
                                      quantized=(packed, scales.view(torch.float8_e4m3fn)))
    return _bound_launcher(args, kernel, dev, config, (m, weight.shape[1] * 2), True, None, None, False, True,
                           prequant=True)


REQUANT_BACKEND = Backend(name="cutedsl_sm100", priority=100, supports=supports_requant, run=run_sm100_requant,
                          bind=bind_sm100_requant)
PREQUANT_BACKEND = Backend(name="cutedsl_sm100", priority=100, supports=supports, run=run_sm100_prequant)
