"""Gate/up GEMM with the fused SwiGLU + NVFP4 requant epilogue, and the W4A4 gated-MLP chain.

* ``torch.ops.nvgemm.nvfp4_linear_requant(x, weight, weight_scale, weight_scale_2, input_scale, bias,
  out_input_scale, out_dtype=None) -> (packed uint8 [M, I/2], swizzled e4m3 scales)``: the gate_up
  GEMM (checkpoint order ``[gate; up]``, N = 2I) whose epilogue quantizes its SwiGLU output for the
  next W4A4 layer. Bit-exact contract::

      packed, scales == quantize_nvfp4(nvfp4_linear(x, ..., activation="silu_mul", out_dtype=d), out_input_scale)

  (epilogue order acc*alpha -> +bias -> silu_mul -> one rounding to ``d`` -> quantize).
* ``torch.ops.nvgemm.nvfp4_linear_prequant(packed, scales, weight, weight_scale, weight_scale_2,
  input_scale, bias, residual, out_dtype)``: a W4A4 linear on an already-quantized activation (the
  down projection fed by the op above); same result as ``nvfp4_linear`` on the dequantized input.
* ``torch.ops.nvgemm.nvfp4_linear_prequant_requant(packed, scales, weight, weight_scale, weight_scale_2,
  input_scale, bias, out_input_scale, out_dtype)``: the requant op on an already-quantized activation (a
  gate_up GEMM fed by the fused RMSNorm quantizer); the ``requant`` backends run it with
  ``quantized=(packed, scales)`` and ``x=None``.
* :func:`gated_mlp`: ``down(silu_mul(gate_up(x)))`` for two :class:`~nvgemm.NVFP4Linear` layers, through
  the two ops above when both are W4A4 (one activation round trip less), else the plain chain.

Backends (:mod:`nvgemm.dispatch.fused`: selection, first-use check, overrides):

* ``cutedsl_sm100`` (:mod:`nvgemm.templates.sm100_w4a4.backend`, sm_100-family GPUs): requant = the sm_100a kernel
  with ``EpilogueSpec(out_quant=True)`` (fused epilogue modelled lane by lane in
  :mod:`nvgemm.epilogues.requant`), prequant = the W4A4 kernel fed the given codes and scales (no
  re-quantization). Compiles and its host logic is tested; never run on a GPU here;
* ``emu_sm100`` / ``emu_sm120`` (forced with ``NVGEMM_BACKEND=emu_sm100`` / ``emu_sm120``, CPU tensors): the
  sm_100a / sm_120a kernels (``cutedsl_sm100`` / ``cutedsl_sm120``) on the PTX emulator;
* ``unfused`` (requant, other CUDA GPUs): ``nvfp4_linear(..., "silu_mul")`` on the dense backends, then
  ``quantize_nvfp4`` (Triton) -- the contract itself, one warning;
* ``emulated`` (everything; the reference): torch, below.

:func:`gated_mlp` runs the plain chain where no kernel takes a pre-quantized activation (CUDA GPUs other
than sm_100: :func:`nvgemm.dispatch.fused.fused_chain_reason`).
"""

from __future__ import annotations

import functools
from threading import get_ident
from typing import Optional

import torch

from nvgemm import settings

from nvgemm.epilogues import epilogue_ref
from nvgemm.epilogues.requant import fused_requant_reference
from nvgemm.core.formats import NVFP4, blocked_numel, dequantize, from_blocked, quantize_activation
from nvgemm.core.validation import (X_DTYPES, LinearProblem, alpha_of, call_key, call_meta, check_linear_args,
                                    check_scale_values, linear_spec, misaligned_operands, problem_of)
from nvgemm.core.backend import PREQUANT, REQUANT, Backend, warn_once
from nvgemm.dispatch.fused import fused_chain_reason, remember_fused, select_fused_backend
from nvgemm.dispatch.registry import bind_call, bound_call, call_plan, register_backend

__all__ = ["nvfp4_linear_requant", "nvfp4_linear_prequant", "nvfp4_linear_prequant_requant", "gated_mlp",
           "fused_mlp_reason"]


def _acc(a: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """fp32 [M, N] = a @ (E2M1*sw).T (weight_scale_2 goes to alpha, like nvfp4_linear_emulated)."""
    n, k = weight.shape[0], weight.shape[1] * 2
    w_scale = from_blocked(weight_scale.to(a.device).view(torch.float8_e4m3fn), n, k // NVFP4.block_size)
    return a @ dequantize(weight.to(a.device), w_scale).t()


def _check_requant(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype):
    if input_scale is None:
        raise ValueError("nvgemm.nvfp4_linear_requant: input_scale is required (W4A4 gate_up); "
                         "weight-only layers use nvfp4_linear + quantize_nvfp4")
    if out_input_scale.dtype != torch.float32 or out_input_scale.numel() != 1:
        raise ValueError("nvgemm.nvfp4_linear_requant: out_input_scale (the next layer's input_scale) must be a "
                         f"float32 scalar tensor, got {out_input_scale.dtype} {tuple(out_input_scale.shape)}")
    if x.dim() != 2:
        raise ValueError(f"nvgemm.nvfp4_linear_requant: x must be 2-D [M, K], got shape {tuple(x.shape)}")
    if out_dtype is not None and out_dtype not in X_DTYPES:
        raise ValueError(f"nvgemm.nvfp4_linear_requant: out_dtype (the rounding before requant) must be bf16 "
                         f"or fp16, got {out_dtype}")
    spec = check_linear_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, None, "silu_mul", out_dtype)
    i = weight.shape[0] // 2
    if i % NVFP4.block_size:
        raise ValueError(f"nvgemm.nvfp4_linear_requant: the gated width I = N/2 = {i} must be a multiple of 16 "
                         "(one NVFP4 block of the next layer's input)")
    return spec, i


@torch.library.custom_op("nvgemm::nvfp4_linear_requant", mutates_args=())
def nvfp4_linear_requant(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    out_input_scale: torch.Tensor,
    out_dtype: Optional[torch.dtype] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused gate_up GEMM + SwiGLU + NVFP4 requant (see the module docstring)."""
    token = settings.forcing_token()
    bkey = (REQUANT, id(weight), call_meta(x), out_dtype, token, get_ident())
    bound = bound_call(bkey, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale)
    if bound is not None:  # the same layer operands, unchanged, and a call of the same metadata: validated
        remember_fused(REQUANT, bound.backend)
        return bound.run(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype)
    key = (REQUANT, call_key(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale), out_dtype,
           token)

    def decide():
        spec, _i = _check_requant(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale,
                                  out_dtype)
        p = problem_of(x, weight, weight_scale, weight_scale_2, input_scale, bias, None, "silu_mul", spec)
        return spec, p, select_fused_backend(REQUANT, p, no_kernel=_vector_dtype_reason(spec.out_dtype, bias=bias))

    _spec, problem, backend = call_plan(key, decide, functools.partial(remember_fused, REQUANT))
    check_scale_values(weight_scale_2, input_scale, "nvgemm.nvfp4_linear_requant")
    check_scale_values(weight_scale_2, out_input_scale, "nvgemm.nvfp4_linear_requant (out_input_scale)")
    args = (x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype)
    out = backend.run(*args)
    bind_call(bkey, backend, problem, (weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale), args)
    return out


def requant_emulated(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype=None,
                     quantized=None):
    """The reference (of a call the op has validated): quantize x, dequantize, fp32 matmul, the epilogue and the
    lane model's requant. ``quantized`` = (packed codes, flat swizzled scales): the activation arrives quantized
    (``x`` is None; :func:`nvfp4_linear_prequant_requant`)."""
    if quantized is not None:
        packed, scales = quantized
        m, k = packed.shape[0], packed.shape[1] * 2
        dev = packed.device
        spec = linear_spec(out_dtype, weight_scale_2, bias, None, "silu_mul", out_dtype)
        a = dequantize(packed, from_blocked(scales.view(torch.float8_e4m3fn), m, k // NVFP4.block_size))
    else:
        dev = x.device
        spec = linear_spec(x.dtype, weight_scale_2, bias, None, "silu_mul", out_dtype)
        qx, sx = quantize_activation(x, input_scale.to(dev))
        a = dequantize(qx, sx)
    acc = _acc(a, weight, weight_scale)
    # alpha and bias (the "pre" part of the epilogue), fp32; activation + rounding + quantize follow
    pre = epilogue_ref(acc, type(spec)(alpha=spec.alpha, bias=spec.bias, out_dtype=torch.float32),
                       alpha_of(weight_scale_2, input_scale, dev), bias)
    return fused_requant_reference(pre, out_input_scale.to(dev), spec.out_dtype)


@nvfp4_linear_requant.register_fake
def _(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype=None):
    _spec, i = _check_requant(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype)
    m = x.shape[0]
    return (x.new_empty((m, i // 2), dtype=torch.uint8),
            x.new_empty((blocked_numel(m, i // NVFP4.block_size),), dtype=torch.float8_e4m3fn))


def _vector_dtype_reason(out_dtype, **tensors) -> Optional[str]:
    """Why no kernel takes these epilogue operands: the kernels read bias / residual in the output dtype
    (the emulated op takes any float dtype)."""
    for name, t in tensors.items():
        if t is not None and t.dtype != out_dtype:
            return f"{name} dtype {t.dtype} is not the output dtype {out_dtype}"
    return None


def _check_prequant(packed, scales, weight, out_dtype):
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(f"nvgemm.nvfp4_linear_prequant: packed must be uint8 [M, K/2], got {packed.dtype} "
                         f"{tuple(packed.shape)}")
    m, k = packed.shape[0], packed.shape[1] * 2
    if weight.dim() != 2 or weight.shape[1] * 2 != k:
        raise ValueError(f"nvgemm.nvfp4_linear_prequant: activation K={k} does not match weight {tuple(weight.shape)}")
    want = blocked_numel(m, k // NVFP4.block_size)
    if scales.dtype not in (torch.float8_e4m3fn, torch.uint8) or scales.dim() != 1 or scales.numel() != want:
        raise ValueError(f"nvgemm.nvfp4_linear_prequant: scales must be the 1-D swizzled e4m3 scales of a "
                         f"[{m}, {k // 16}] matrix ({want} elements), got {scales.dtype} {tuple(scales.shape)}")
    if out_dtype not in X_DTYPES:
        raise ValueError(f"nvgemm.nvfp4_linear_prequant: out_dtype must be bf16 or fp16, got {out_dtype}")


@torch.library.custom_op("nvgemm::nvfp4_linear_prequant", mutates_args=())
def nvfp4_linear_prequant(
    packed: torch.Tensor,
    scales: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """W4A4 linear whose activation arrives quantized (packed codes + swizzled scales)."""
    key = (PREQUANT, call_key(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, residual),
           out_dtype, settings.forcing_token())

    def decide():
        spec = _prequant_spec(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, residual,
                              out_dtype)
        dev = packed.device
        p = LinearProblem(m=packed.shape[0], n=weight.shape[0], k=packed.shape[1] * 2, device_type=dev.type,
                          capability=torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None,
                          weight_only=False, x_dtype=out_dtype, out_dtype=out_dtype, alpha=spec.alpha,
                          bias=bias is not None, activation="none", residual=residual is not None,
                          misaligned=misaligned_operands(packed=packed, scales=scales, weight=weight,
                                                         weight_scale=weight_scale, bias=bias, residual=residual))
        return spec, p, select_fused_backend(PREQUANT, p,
                                             no_kernel=_vector_dtype_reason(out_dtype, bias=bias, residual=residual))

    backend = call_plan(key, decide, functools.partial(remember_fused, PREQUANT))[2]
    check_scale_values(weight_scale_2, input_scale, "nvgemm.nvfp4_linear_prequant")
    return backend.run(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, residual, out_dtype)


def _prequant_spec(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, residual, out_dtype):
    _check_prequant(packed, scales, weight, out_dtype)
    m, k = packed.shape[0], packed.shape[1] * 2
    x_meta = torch.empty((m, k), dtype=out_dtype, device="meta")
    spec = check_linear_args(x_meta, weight.to("meta"), weight_scale.to("meta"), weight_scale_2.to("meta"),
                             input_scale.to("meta"), None if bias is None else bias.to("meta"),
                             None if residual is None else residual.to("meta"), "none", out_dtype)
    for name, t in (("weight", weight), ("weight_scale", weight_scale), ("bias", bias), ("residual", residual),
                    ("scales", scales)):
        if t is not None and t.device != packed.device:
            raise ValueError(f"nvgemm.nvfp4_linear_prequant: {name} is on {t.device} but packed is on {packed.device}")
    return spec


def prequant_emulated(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, residual, out_dtype):
    """The reference (of a call the op has validated): dequantize the given activation, fp32 matmul, the epilogue."""
    spec = linear_spec(out_dtype, weight_scale_2, bias, residual, "none", out_dtype)
    m, k = packed.shape[0], packed.shape[1] * 2
    sx = from_blocked(scales.view(torch.float8_e4m3fn), m, k // NVFP4.block_size)
    acc = _acc(dequantize(packed, sx), weight, weight_scale)
    return epilogue_ref(acc, spec, alpha_of(weight_scale_2, input_scale, packed.device), bias,
                        residual)


@nvfp4_linear_prequant.register_fake
def _(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, residual, out_dtype):
    _check_prequant(packed, scales, weight, out_dtype)
    return packed.new_empty((packed.shape[0], weight.shape[0]), dtype=out_dtype)


@torch.library.custom_op("nvgemm::nvfp4_linear_prequant_requant", mutates_args=())
def nvfp4_linear_prequant_requant(
    packed: torch.Tensor,
    scales: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    out_input_scale: torch.Tensor,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`nvfp4_linear_requant` whose activation arrives quantized (packed codes + swizzled scales, e.g. from
    ``nvgemm::rmsnorm_quantize_nvfp4``): the gate_up GEMM with SwiGLU + NVFP4 requant in its epilogue and no
    activation quantizer. Same result as ``nvfp4_linear_requant`` on an ``x`` that quantizes to these bytes;
    ``out_dtype`` (bf16 / fp16) is the rounding before the requant."""
    token = settings.forcing_token()
    # the same per-problem call plan and binding as nvfp4_linear_requant (tagged apart: other arguments)
    bkey = ("prequant_requant", id(weight), call_meta(packed), call_meta(scales), out_dtype, token, get_ident())
    bound = bound_call(bkey, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale)
    if bound is not None:  # the same layer operands, unchanged, and codes of the same metadata: validated
        remember_fused(REQUANT, bound.backend)
        return bound.run(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale,
                         out_dtype)
    key = ("prequant_requant", call_key(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias,
                                        out_input_scale), out_dtype, token)

    def decide():
        spec = prequant_requant_check(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias,
                                      out_input_scale, out_dtype)
        dev = packed.device
        p = LinearProblem(m=packed.shape[0], n=weight.shape[0], k=packed.shape[1] * 2, device_type=dev.type,
                          capability=torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None,
                          weight_only=False, x_dtype=out_dtype, out_dtype=out_dtype, alpha=spec.alpha,
                          bias=bias is not None, activation="silu_mul", residual=False,
                          misaligned=misaligned_operands(packed=packed, scales=scales, weight=weight,
                                                         weight_scale=weight_scale, bias=bias))
        return spec, p, select_fused_backend(REQUANT, p, no_kernel=_vector_dtype_reason(out_dtype, bias=bias))

    _spec, problem, backend = call_plan(key, decide, functools.partial(remember_fused, REQUANT))
    check_scale_values(weight_scale_2, input_scale, "nvgemm.nvfp4_linear_prequant_requant")
    check_scale_values(weight_scale_2, out_input_scale, "nvgemm.nvfp4_linear_prequant_requant (out_input_scale)")
    args = (None, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype)
    if backend.name == "unfused":  # its dense gate_up GEMM would re-quantize a bf16 input: not this contract
        warn_once(f"prequant-requant-unfused-{problem.capability}",
                  "nvgemm: nvfp4_linear_prequant_requant has no kernel on this device; it runs the emulated op")
        return requant_emulated(*args, quantized=(packed, scales))
    out = backend.run(*args, quantized=(packed, scales))

    def run_unbound(packed_, scales_, *rest):  # a backend with no bound launcher: the plan's backend, no checks
        return backend.run(None, *rest, quantized=(packed_, scales_))

    bind_call(bkey, backend, problem, (weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale),
              args, run=None if backend.bind is not None else run_unbound, bind_kwargs={"quantized": (packed, scales)})
    return out


def prequant_requant_check(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias,
                           out_input_scale, out_dtype):
    """Validate an ``nvfp4_linear_prequant_requant`` call (shapes, dtypes, devices); its epilogue spec."""
    _check_prequant(packed, scales, weight, out_dtype)
    m, k = packed.shape[0], packed.shape[1] * 2
    x_meta = torch.empty((m, k), dtype=out_dtype, device="meta")
    spec, _i = _check_requant(x_meta, weight.to("meta"), weight_scale.to("meta"), weight_scale_2.to("meta"),
                              input_scale.to("meta"), None if bias is None else bias.to("meta"),
                              out_input_scale, out_dtype)
    for name, t in (("weight", weight), ("weight_scale", weight_scale), ("bias", bias), ("scales", scales)):
        if t is not None and t.device != packed.device:
            raise ValueError(f"nvgemm.nvfp4_linear_prequant_requant: {name} is on {t.device} but packed is on "
                             f"{packed.device}")
    return spec


@nvfp4_linear_prequant_requant.register_fake
def _(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype):
    prequant_requant_check(packed, scales, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale,
                           out_dtype)
    m, i = packed.shape[0], weight.shape[0] // 2
    return (packed.new_empty((m, i // 2), dtype=torch.uint8),
            packed.new_empty((blocked_numel(m, i // NVFP4.block_size),), dtype=torch.float8_e4m3fn))


def requant_unfused(x, weight, weight_scale, weight_scale_2, input_scale, bias, out_input_scale, out_dtype=None):
    """The contract as two kernels: the gate_up GEMM with silu_mul (dense backends), then quantize_nvfp4."""
    h = torch.ops.nvgemm.nvfp4_linear(x, weight, weight_scale, weight_scale_2, input_scale, bias, None, "silu_mul",
                                      out_dtype)
    return torch.ops.nvgemm.quantize_nvfp4(h, out_input_scale.to(h.device), True)


def _cuda_only(p) -> Optional[str]:
    return None if p.device_type == "cuda" else f"the unfused fallback serves CUDA devices (got {p.device_type})"


register_backend(Backend(name="emulated", priority=-1000, supports=lambda p: None, run=requant_emulated), REQUANT)
register_backend(Backend(name="unfused", priority=-500, supports=_cuda_only, run=requant_unfused), REQUANT)
register_backend(Backend(name="emulated", priority=-1000, supports=lambda p: None, run=prequant_emulated), PREQUANT)


def gated_mlp(gate_up, down, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``down(silu_mul(gate_up(x)))`` for two :class:`~nvgemm.NVFP4Linear` (``gate_up`` with
    ``activation="silu_mul"``, checkpoint ``[gate; up]`` order). When both are W4A4 the gate_up GEMM
    emits down's NVFP4 input directly (fused requant); the result equals the unfused chain bit for bit."""
    if gate_up.activation != "silu_mul":
        raise ValueError(f"gated_mlp: gate_up must have activation='silu_mul', got {gate_up.activation!r}")
    if down.in_features * 2 != gate_up.out_features:
        raise ValueError(f"gated_mlp: down.in_features={down.in_features} is not gate_up.out_features/2 "
                         f"= {gate_up.out_features // 2}")
    if fused_mlp_reason(gate_up, down, x) is not None:
        return down(gate_up(x), residual=residual)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    packed, scales = torch.ops.nvgemm.nvfp4_linear_requant(
        x2, gate_up.weight, gate_up.weight_scale, gate_up.weight_scale_2, gate_up.input_scale, gate_up.bias,
        down.input_scale, x.dtype)
    res2 = None if residual is None else residual.reshape(-1, residual.shape[-1])
    out = torch.ops.nvgemm.nvfp4_linear_prequant(
        packed, scales, down.weight, down.weight_scale, down.weight_scale_2, down.input_scale, down.bias, res2,
        x.dtype)
    return out.reshape(*lead, out.shape[-1])


def fused_mlp_reason(gate_up, down, x: torch.Tensor) -> Optional[str]:
    """None if :func:`gated_mlp` runs ``gate_up`` -> ``down`` through the fused ops for input ``x``, else why
    it runs the plain chain (same result)."""
    if gate_up.weight_only or down.weight_only:
        return "a W4A16 layer (the fused chain needs W4A4 gate_up and down)"
    if gate_up.sm90_kind is not None or down.sm90_kind is not None:
        return "a layer held in the sm90 layout (Hopper: the dense kernels serve the chain)"
    if down.activation != "none":
        return f"down has activation {down.activation!r}"
    if down.in_features % NVFP4.block_size:
        return f"I = {down.in_features} is not a multiple of 16"
    if x.dtype not in X_DTYPES:
        return f"x dtype {x.dtype}"
    return fused_chain_reason(x.device)
