"""Host side of the sm_90a NVFP4 weight-only (W4A16) CuTeDSL kernels: weight re-layout, argument
preparation, launch, and the ``cutedsl_sm90`` backend of ``nvgemm::nvfp4_linear``.

Everything here is pure torch (no cutlass import): it runs on CPU, where tests check it against the
emulated op, and in serving processes that load precompiled kernels from the kernel cache.

Weight preparation (once per weight; :func:`prepare_sm90_weight`, cached per weight tensor)
--------------------------------------------------------------------------------------------
* ``weight`` uint8 [N, K/2] -> :func:`relayout_weight`: the 8 codes of each 32-bit word are
  bit-permuted (:data:`~nvgemm.templates.sm90_config.WORD_LAYOUT`) so the kernel decodes a pair of
  elements with one or two shift/mask operations. Rows and bytes stay where they were, so the
  kernel's 16-byte loads of a row are contiguous across a warp. :func:`restore_weight` is the exact
  inverse (round-trip tested).
* ``weight_scale`` (1-D 128x4 swizzled e4m3, the op's contract) -> linear uint8 [N, K/16]: the two
  scales of a 16-byte weight vector become one aligned 2-byte load, contiguous across a warp.
* ``alpha`` fp32 (1,) or (N,) = ``weight_scale_2`` (times ``input_scale`` for W4A4 layers).

Loaders that own the weight (``NVFP4Linear``) can call :func:`prepare_sm90_weight` at load time and
keep the result; the op path caches it per weight tensor (keyed by identity, data pointer and
version counter, dropped when the weight is freed), so a decode step never re-lays-out weights.

W4A4 checkpoints on Hopper: quantize-dequantize (bit-faithful)
--------------------------------------------------------------
Hopper has no FP4 tensor cores, so a W4A4 layer (``input_scale`` given) runs the W4A16 kernel on
``x' = E2M1[q_x] * s_x`` where ``(q_x, s_x) = nvgemm::quantize_nvfp4(x, input_scale)`` — the same
quantizer and convention the emulated op and the Blackwell kernels use — and ``alpha =
input_scale * weight_scale_2``. ``E2M1 * e4m3`` needs at most 6 significant bits and lies in
[2**-10, 2688], so ``x'`` is **exact** in bf16 and in fp16: the kernel computes exactly the emulated
W4A4 op's products, and only the fp32 summation order differs. We chose this over running the
layer weight-only on unquantized activations because that would silently change the model's
numerics (the checkpoint was calibrated with quantized activations); the cost is one extra pass
over the activations (M x K elements, small at decode).

Backend ``cutedsl_sm90`` (priority 90): CUDA tensors on an sm_90 device (capability 9.0), K % 32 ==
0, bf16/fp16 activations; residual in the output dtype (others fall back to the emulated op with a
warning). Kernels come from the kernel cache (``nvgemm.runtime.cache``), compiled for ``sm_90a``
from ``nvgemm.templates.sm90_w4a16_gemv``; on a box without cutlass-dsl they must be precompiled.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Optional

import torch

from ..epilogues.spec import EpilogueSpec
from ..formats import NVFP4, dequantize, from_blocked
from ..templates.sm90_config import DECODE_UNSCALE, WORD_LAYOUT, Sm90W4A16Config, validate_config
from .backends import Backend, LinearProblem, register_backend, warn_once

log = logging.getLogger("nvgemm_cutedsl.sm90")

TEMPLATE_ID = "sm90_w4a16_gemv"  # the gemv family; template_id_of(config) in general
ARCH = "sm_90a"
BACKEND_NAME = "cutedsl_sm90"
PRIORITY = 90
GEMV_MAX_M_POLICY = 32  # the heuristics' gemv band; larger M runs the gemv kernel with tile_m=8

_X_FORMAT = {torch.bfloat16: "bf16", torch.float16: "fp16"}


# --------------------------------------------------------------------------- weight re-layout


def _check_packed(packed: torch.Tensor, what: str) -> tuple[int, int]:
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(f"nvgemm_cutedsl sm90: {what} must be uint8 [N, K/2], got {packed.dtype} {tuple(packed.shape)}")
    n, kh = packed.shape
    if (2 * kh) % 32:
        raise ValueError(f"nvgemm_cutedsl sm90: K={2 * kh} must be a multiple of 32 (16-byte weight vectors)")
    return n, 2 * kh


def _words_to_bytes(words: torch.Tensor) -> torch.Tensor:
    """int64 [..., W] holding 32-bit values -> uint8 [..., 4W] little-endian."""
    shifts = torch.arange(0, 32, 8, device=words.device, dtype=torch.int64)
    b = (words.unsqueeze(-1) >> shifts) & 0xFF
    return b.to(torch.uint8).reshape(*words.shape[:-1], words.shape[-1] * 4)


def _bytes_to_words(b: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 4W] -> int64 [..., W] (little-endian 32-bit words)."""
    w = b.reshape(*b.shape[:-1], b.shape[-1] // 4, 4).to(torch.int64)
    shifts = torch.arange(0, 32, 8, device=b.device, dtype=torch.int64)
    return (w << shifts).sum(-1)


def relayout_weight(packed: torch.Tensor) -> torch.Tensor:
    """Packed E2M1 uint8 [N, K/2] (even K in the low nibble) -> the gemv kernel's bit layout (same shape)."""
    n, k = _check_packed(packed, "weight")
    words = _bytes_to_words(packed.contiguous())  # [N, K/8]
    out = torch.zeros_like(words)
    for e, (mag_pos, sign_pos) in enumerate(WORD_LAYOUT):
        code = (words >> (4 * e)) & 0xF
        out |= (code & 0x7) << mag_pos
        out |= (code >> 3) << sign_pos
    return _words_to_bytes(out)


def restore_weight(relaid: torch.Tensor) -> torch.Tensor:
    """Exact inverse of :func:`relayout_weight`."""
    _check_packed(relaid, "re-laid-out weight")
    words = _bytes_to_words(relaid.contiguous())
    out = torch.zeros_like(words)
    for e, (mag_pos, sign_pos) in enumerate(WORD_LAYOUT):
        code = ((words >> mag_pos) & 0x7) | (((words >> sign_pos) & 0x1) << 3)
        out |= code << (4 * e)
    return _words_to_bytes(out)


def decode_relaid_ref(relaid: torch.Tensor) -> torch.Tensor:
    """The kernel's decode in torch: re-laid-out bytes -> fp32 E2M1 * 2**-14 [N, K], via the same
    shift/mask operations on 32-bit words and an fp16 reinterpretation (tests compare it bit for bit
    with ``E2M1 * 2**-14``)."""
    n, k = _check_packed(relaid, "re-laid-out weight")
    w = _bytes_to_words(relaid.contiguous())  # [N, K/8] int64 holding uint32
    m32 = 0xFFFFFFFF
    h = [
        w & 0x8E008E00,
        ((w << 3) & m32) & 0x8E008E00,
        (((w << 9) & m32) & 0x0E000E00) | (((w << 2) & m32) & 0x80008000),
        (((w << 6) & m32) & 0x0E000E00) | (((w << 1) & m32) & 0x80008000),
    ]
    pairs = torch.stack(h, dim=-1)  # [N, K/8, 4] fp16x2 as uint32
    lo = (pairs & 0xFFFF).to(torch.int32).to(torch.int16)
    hi = (pairs >> 16).to(torch.int32).to(torch.int16)
    f16 = torch.stack([lo, hi], dim=-1).view(torch.float16)  # [N, K/8, 4, 2] elements 2j, 2j+1
    return f16.float().reshape(n, k)


# --------------------------------------------------------------------------- prepared weight


@dataclass
class Sm90Weight:
    """One weight, prepared once for the sm90 gemv kernel (see the module docstring)."""

    weight: torch.Tensor  # uint8 [N, K/2], re-laid-out
    scale: torch.Tensor  # uint8 [N, K/16], linear e4m3 bytes
    weight_scale_2: torch.Tensor  # fp32 (1,) or (N,)
    n: int
    k: int


def prepare_sm90_weight(weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor) -> Sm90Weight:
    """The op's weight triple -> the kernel's layout (pure torch; on the weight's device)."""
    n, k = _check_packed(weight, "weight")
    kb = k // NVFP4.block_size
    ws = weight_scale.view(torch.float8_e4m3fn) if weight_scale.dtype == torch.uint8 else weight_scale
    scale_lin = from_blocked(ws.to(weight.device), n, kb).contiguous().view(torch.uint8)
    ws2 = weight_scale_2.to(device=weight.device, dtype=torch.float32).reshape(-1).contiguous()
    return Sm90Weight(relayout_weight(weight), scale_lin, ws2, n, k)


_PREP_CACHE: dict[int, tuple[tuple, Sm90Weight]] = {}
_PREP_LOCK = threading.Lock()


def _prep_key(*ts: torch.Tensor) -> tuple:
    return tuple((t.data_ptr(), t._version, tuple(t.shape), t.dtype, str(t.device)) for t in ts)


def cached_sm90_weight(weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor) -> Sm90Weight:
    """:func:`prepare_sm90_weight`, memoized per weight tensor (invalidated when any input changes)."""
    key = _prep_key(weight, weight_scale, weight_scale_2)
    wid = id(weight)
    with _PREP_LOCK:
        hit = _PREP_CACHE.get(wid)
        if hit is not None and hit[0] == key:
            return hit[1]
    prepared = prepare_sm90_weight(weight, weight_scale, weight_scale_2)
    with _PREP_LOCK:
        new = wid not in _PREP_CACHE
        _PREP_CACHE[wid] = (key, prepared)
    if new:
        weakref.finalize(weight, _PREP_CACHE.pop, wid, None)
    return prepared


# --------------------------------------------------------------------------- activations (W4A4 qdq)


def qdq_activation(x2: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    """W4A4 on Hopper: ``E2M1[q_x] * s_x`` in x's dtype (exact), quantized by ``nvgemm::quantize_nvfp4``."""
    packed, sx = torch.ops.nvgemm.quantize_nvfp4(x2, input_scale.to(x2.device), False)
    return dequantize(packed, sx).to(x2.dtype)


# --------------------------------------------------------------------------- arguments


@dataclass
class Sm90Args:
    """The kernel's arguments, in ABI order (``Sm90W4A16GemvTemplate.abi``)."""

    x: torch.Tensor  # [M, K] bf16/fp16, row stride % 8 == 0
    weight: torch.Tensor
    scale: torch.Tensor
    alpha: torch.Tensor  # fp32 (1,) | (N,)
    bias: torch.Tensor  # fp32 (N,) or a 1-element dummy
    residual: torch.Tensor  # [M, N_out] out dtype, or a [1, 1] dummy
    out: torch.Tensor  # [M, N_out]
    work: torch.Tensor  # fp32 (S*M*N,) or a 1-element dummy
    spec: EpilogueSpec

    def abi_values(self) -> tuple:
        return (self.x, self.weight, self.scale, self.alpha, self.bias, self.residual, self.out, self.work)


def _aligned_rows(x2: torch.Tensor) -> torch.Tensor:
    if x2.stride(-1) != 1 or x2.stride(0) % 8 or x2.data_ptr() % 16:
        x2 = x2.contiguous()
        if x2.data_ptr() % 16:
            x2 = x2.clone()
    return x2


def prepare_sm90_args(
    x: torch.Tensor,
    prepared: Sm90Weight,
    input_scale: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
    activation: str,
    out_dtype: Optional[torch.dtype],
    config: Sm90W4A16Config,
) -> Sm90Args:
    """One ``nvfp4_linear`` call -> kernel arguments (pure torch; works on CPU for tests)."""
    validate_config(config).raise_if_failed("sm90 config")
    if config.family == "wgmma" and prepared.k % 64:
        raise ValueError(f"nvgemm_cutedsl sm90: the wgmma family needs K % 64 == 0, got K={prepared.k}")
    if config.family == "mma" and prepared.k % 128:
        raise ValueError(f"nvgemm_cutedsl sm90: the mma family needs K % 128 == 0, got K={prepared.k}")
    if x.dtype not in _X_FORMAT:
        raise TypeError(f"nvgemm_cutedsl sm90: x must be bfloat16 or float16, got {x.dtype}")
    n, k = prepared.n, prepared.k
    if x.shape[-1] != k:
        raise ValueError(f"nvgemm_cutedsl sm90: x has K={x.shape[-1]}, the weight has K={k}")
    dev = x.device
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if input_scale is not None:
        x2 = qdq_activation(x2, input_scale)
    x2 = _aligned_rows(x2)
    alpha = prepared.weight_scale_2.to(dev)
    if input_scale is not None:
        alpha = (input_scale.to(device=dev, dtype=torch.float32).reshape(()) * alpha).contiguous()
    spec = EpilogueSpec(
        alpha="vector" if alpha.numel() > 1 else "scalar",
        bias=bias is not None,
        activation=activation,
        residual=residual is not None,
        out_dtype=out_dtype or x.dtype,
    )
    n_out = spec.out_features(n)
    out = torch.empty((m, n_out), device=dev, dtype=spec.out_dtype)
    b = bias.to(device=dev, dtype=torch.float32).contiguous() if bias is not None else torch.zeros(1, device=dev)
    if residual is not None:
        if residual.dtype != spec.out_dtype:
            raise TypeError(f"nvgemm_cutedsl sm90: residual must be {spec.out_dtype}, got {residual.dtype}")
        r = residual.reshape(m, n_out)
        if r.stride(-1) != 1:
            r = r.contiguous()
    else:
        r = torch.zeros((1, 1), device=dev, dtype=spec.out_dtype)
    work_numel = config.split_k * m * n if config.split_k > 1 else 1
    work = torch.empty(work_numel, device=dev, dtype=torch.float32)
    return Sm90Args(x2, prepared.weight, prepared.scale, alpha, b, r, out, work, spec)


def kernel_view_ref(args: Sm90Args, config: Sm90W4A16Config) -> torch.Tensor:
    """The kernel's arithmetic on the prepared arguments, in torch fp32/fp64 on any device.

    Decodes the re-laid-out weight with :func:`decode_relaid_ref` (E2M1 * 2**-14), forms per-block
    sums ``sum_k code * x`` and folds each with its e4m3 scale, sums the splits, multiplies by
    2**14 and runs the epilogue — i.e. what the kernel computes up to fp32 summation order.
    """
    from ..epilogues.spec import epilogue_ref

    m, k = args.x.shape
    n = args.weight.shape[0]
    codes = decode_relaid_ref(args.weight).double()  # [N, K]
    sc = args.scale.view(torch.float8_e4m3fn).float().double()  # [N, K/16]
    x = args.x.double()
    blocks = torch.einsum("mbe,nbe->mnb", x.reshape(m, k // 16, 16), codes.reshape(n, k // 16, 16))
    acc = (blocks * sc.unsqueeze(0)).sum(-1) * DECODE_UNSCALE  # [M, N]
    res = args.residual if args.spec.residual else None
    return epilogue_ref(acc.float(), args.spec, args.alpha if args.alpha.numel() > 1 else args.alpha.reshape(()),
                        args.bias if args.spec.bias else None, res)


# --------------------------------------------------------------------------- config / launch


def wgmma_config(m: int) -> Sm90W4A16Config:
    """The WGMMA family's default for M > 32 (the policy's first wgmma candidate): one warpgroup per
    64 rows, 128 columns, K step 64."""
    tm = 64 if m <= 64 else 128
    return Sm90W4A16Config(family="wgmma", tile_m=tm, tile_n=128, tile_k=64, num_warps=4 * tm // 64, stages=4)


@functools.lru_cache(maxsize=4096)
def pick_config(m: int, n: int, k: int, x_dtype: torch.dtype, activation: str, sm_count: int) -> Sm90W4A16Config:
    """The heuristics' first candidate this runtime can run (gemv for M <= 32, WGMMA above when
    K % 64 == 0); without the policy: :func:`wgmma_config` for M > 32, else a default gemv config."""
    try:
        from ..heuristics import candidates
        from ..heuristics.problem import GemmProblem, Target

        prob = GemmProblem(n=n, k=k, m=m, a_format=_X_FORMAT[x_dtype], b_format="nvfp4",
                           epilogue=activation, target=Target(arch=ARCH, sm_count=sm_count))
        for c in candidates(prob, use_nvmmh=False):
            cfg = c.config
            if not isinstance(cfg, Sm90W4A16Config) or not validate_config(cfg):
                continue
            if cfg.family == "wgmma" and (k % 64 or m <= GEMV_MAX_M_POLICY):
                continue
            if cfg.family == "mma":  # not chosen until measured on an H100/H200 (bench/gpu_check.py)
                continue
            if activation == "silu_mul" and cfg.tile_n % (32 if cfg.family == "wgmma" else 2):
                continue
            return cfg
    except (ImportError, ValueError, TypeError) as e:  # policy unavailable: fall back to the defaults
        log.info("nvgemm_cutedsl sm90: heuristics failed (%s); using the default config", e)
    if m > GEMV_MAX_M_POLICY and k % 64 == 0:
        return wgmma_config(m)
    tm = 1
    while tm < min(m, 8):
        tm *= 2
    return Sm90W4A16Config(family="gemv", tile_m=tm, tile_n=16, tile_k=4096, num_warps=4)


def template_id_of(config: Sm90W4A16Config) -> str:
    return f"sm90_w4a16_{config.family}"


def compile_spec_for(config: Sm90W4A16Config, spec: EpilogueSpec, x_dtype: torch.dtype, sm_count: int = 132):
    from ..templates.registry import HardwareSpec
    from .compile_spec import make_spec

    return make_spec(template_id_of(config), config, ARCH, epilogue=spec, hw=HardwareSpec(sm_count=sm_count),
                     a_format=_X_FORMAT[x_dtype], b_format="nvfp4")


def launch_sm90(args: Sm90Args, kernel, stream) -> torch.Tensor:
    """Launch a loaded kernel (an ``AotKernel`` from the cache) on ``stream``; returns ``args.out``."""
    kernel.launch(*args.abi_values(), stream)
    return args.out


# --------------------------------------------------------------------------- backend


def supports(p: LinearProblem) -> Optional[str]:
    if p.device_type != "cuda":
        return f"needs a CUDA device (got {p.device_type})"
    if p.capability is None or tuple(p.capability) != (9, 0):
        return f"needs an sm_90 GPU (capability 9.0), got {p.capability}"
    if p.x_dtype not in _X_FORMAT:
        return f"x must be bfloat16 or float16, got {p.x_dtype}"
    if p.k % 32:
        return f"K={p.k} is not a multiple of 32 (16-byte weight vectors)"
    if p.m < 1:
        return "empty input (M = 0)"
    return None


@functools.lru_cache(maxsize=1024)
def _kernel_for(config: Sm90W4A16Config, spec: EpilogueSpec, x_dtype: torch.dtype, sm_count: int):
    """The loaded kernel for one (config, epilogue, dtype): spec hashing and cache lookup once."""
    from .cache import default_cache

    return default_cache().get(compile_spec_for(config, spec, x_dtype, sm_count))


def run_sm90(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype,
             config=None):
    """Eager implementation of ``cutedsl_sm90`` (CUDA sm_90 only).

    ``config`` (a config or its name; autotuned code passes one) overrides the policy's first pick.
    """
    from ..ops import check_linear_args, nvfp4_linear_emulated

    spec = check_linear_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype)
    if residual is not None and residual.dtype != spec.out_dtype:
        warn_once("sm90-residual-dtype", f"nvgemm_cutedsl sm90: residual dtype {residual.dtype} != output dtype "
                  f"{spec.out_dtype}; this call uses the emulated op")
        return nvfp4_linear_emulated(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual,
                                     activation, out_dtype)
    dev = x.device
    props = torch.cuda.get_device_properties(dev)
    n, k = weight.shape[0], weight.shape[1] * 2
    m = x.numel() // k
    if config is None:
        config = pick_config(m, n, k, x.dtype, activation, props.multi_processor_count)
    elif isinstance(config, str):
        from ..templates.sm90_config import config_from_name

        config = config_from_name(config)
    prepared = cached_sm90_weight(weight, weight_scale, weight_scale_2)
    args = prepare_sm90_args(x, prepared, input_scale, bias, residual, activation, out_dtype, config)
    kernel = _kernel_for(config, args.spec, x.dtype, props.multi_processor_count)
    launch_sm90(args, kernel, torch.cuda.current_stream(dev))
    return args.out.reshape(*x.shape[:-1], args.out.shape[-1])


BACKEND = Backend(name=BACKEND_NAME, priority=PRIORITY, supports=supports, run=run_sm90)
register_backend(BACKEND)

__all__ = [
    "BACKEND",
    "Sm90Args",
    "Sm90Weight",
    "cached_sm90_weight",
    "compile_spec_for",
    "decode_relaid_ref",
    "kernel_view_ref",
    "launch_sm90",
    "pick_config",
    "prepare_sm90_args",
    "prepare_sm90_weight",
    "qdq_activation",
    "relayout_weight",
    "restore_weight",
    "run_sm90",
    "supports",
]
