"""Shared Triton device helpers for nvgemm's NVFP4 kernels, plus host-side launch helpers.

Every rounding step is written so that the compiled GPU kernel and the Triton CPU interpreter
(``TRITON_INTERPRET=1``) compute the *same bits* as the pure-torch reference
:mod:`nvgemm.core.formats`:

* **Division**: ``tl.math.div_rn`` (PTX ``div.rn.f32``, IEEE round-to-nearest). Plain ``/`` on
  fp32 compiles to ``div.approx.f32`` in Triton 3.9 (checked in the PTX), which is what makes
  peers disagree with the reference on ~0.2% of codes.
* **fp32 -> e4m3**: integer bit manipulation (round to nearest, ties to even). Triton's own
  ``.to(tl.float8e4nv)`` is RNE on sm_89+ (``cvt.rn.satfinite.e4m3x2.f32``) but unsupported on
  sm_80 and *not* RNE in the interpreter, so nvgemm does not use it.
* **fp32 -> bf16**: integer RNE for the same reason (the interpreter truncates ``.to(bf16)``).
  fp32 -> fp16 uses ``.to(tl.float16)`` (``cvt.rn`` on GPU, numpy RNE in the interpreter).
* **E2M1 encode**: the reference's seven comparisons, strict ``>`` where a tie goes down to the
  even code and ``>=`` where it goes up.

Kernels are compiled with ``enable_fp_fusion=False`` so no ``mul``/``add`` pair is contracted
into an FMA (the references round after every operation).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from nvgemm import settings

__all__ = [
    "KIND_FP32",
    "KIND_BF16",
    "KIND_FP16",
    "dtype_kind",
    "is_interpreted",
    "runs_on_cpu",
    "launch_options",
    "use_gdc",
]

# Integer codes for float dtypes passed to kernels as constexprs.
KIND_FP32 = 0
KIND_BF16 = 1
KIND_FP16 = 2

_KINDS = {torch.float32: KIND_FP32, torch.bfloat16: KIND_BF16, torch.float16: KIND_FP16}


def dtype_kind(dtype: torch.dtype) -> int:
    try:
        return _KINDS[dtype]
    except KeyError:
        raise TypeError(f"nvgemm triton kernels support float32/bfloat16/float16, got {dtype}") from None


# --------------------------------------------------------------------------- device: rounding


@triton.jit
def f32_to_bf16_rne(y):
    """fp32 -> bf16, round to nearest even (inf stays inf, NaN stays a quiet NaN), identical on
    GPU and interpreter."""
    bits = y.to(tl.uint32, bitcast=True)
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (tl.where(is_nan, bits | 0x400000, bits + 0x7FFF + ((bits >> 16) & 1))) >> 16
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def round_to_kind(y, KIND: tl.constexpr):
    """fp32 ``y`` rounded (RNE) to the dtype ``KIND`` and returned as fp32 (exact value)."""
    if KIND == 1:
        return f32_to_bf16_rne(y).to(tl.float32)
    elif KIND == 2:
        return y.to(tl.float16).to(tl.float32)
    else:
        return y


@triton.jit
def cast_to_kind(y, KIND: tl.constexpr):
    """fp32 ``y`` -> a tensor of dtype ``KIND`` (RNE), for stores."""
    if KIND == 1:
        return f32_to_bf16_rne(y)
    elif KIND == 2:
        return y.to(tl.float16)
    else:
        return y


@triton.jit
def e4m3_rne(v):
    """fp32 ``v`` in [0, 448] -> e4m3fn byte value (int32 0..126), round to nearest even.

    Normal range (v >= 2**-6): drop 20 of fp32's 23 mantissa bits with RNE (a carry into the
    exponent is the correct rounding) and rebias the exponent 127 -> 7.
    Subnormal range (v < 2**-6): the code is rne(v * 2**9), an integer 0..8 (8 encodes 2**-6).
    """
    bits = v.to(tl.int32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20) - (120 << 3)
    exp = (bits >> 23) & 0xFF
    mant = (bits & 0x7FFFFF) | 0x800000
    # v * 2**9 = mant * 2**(exp - 141): shift right by 141 - exp (>= 21 in this range) with RNE
    shift = tl.minimum(141 - exp, 31)
    half_m1 = (1 << (shift - 1)) - 1
    sub = (mant + half_m1 + ((mant >> shift) & 1)) >> shift
    return tl.where(v < 0.015625, sub, normal)


@triton.jit
def e4m3_to_f32(c):
    """e4m3fn byte value (int32 0..255, NaN code not handled) -> fp32 (exact)."""
    e = (c >> 3) & 0xF
    m = c & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * 0.001953125
    mag = tl.where(e == 0, sub, normal)
    return tl.where((c & 0x80) != 0, -mag, mag)


@triton.jit
def e2m1_encode(q):
    """fp32 (already divided by its scale) -> E2M1 code (int32 0..15); RNE, ties to even, sat 6.

    Boundaries and tie directions exactly as ``nvgemm.core.formats.e2m1_encode``; the sign bit is set
    for every q < 0.
    """
    a = tl.abs(q)
    code = (a > 0.25).to(tl.int32)
    code += (a >= 0.75).to(tl.int32)
    code += (a > 1.25).to(tl.int32)
    code += (a >= 1.75).to(tl.int32)
    code += (a > 2.5).to(tl.int32)
    code += (a >= 3.5).to(tl.int32)
    code += (a > 5.0).to(tl.int32)
    return code | ((q < 0).to(tl.int32) << 3)


@triton.jit
def e2m1_decode(c):
    """E2M1 code (int32 0..15) -> fp32 value 0, .5, 1, 1.5, 2, 3, 4, 6 with sign bit 3."""
    mag = c & 7
    e = mag >> 1
    m = mag & 1
    normal = (((e + 126) << 23) | (m << 22)).to(tl.float32, bitcast=True)
    val = tl.where(e == 0, m.to(tl.float32) * 0.5, normal)
    return tl.where((c & 8) != 0, -val, val)


# --------------------------------------------------------------------------- device: NVFP4 tile


@triton.jit
def nvfp4_block_scales(h3, gs):
    """Per-16-block scale of an fp32 tile [BM, BKB, 16] with global scale ``gs``.

    Returns (sf: e4m3 byte value int32 [BM, BKB], step: float(sf) * gs fp32 [BM, BKB]), the
    reference's ``sf = e4m3(min(amax / (6 * gs), 448))``, ``S = float(sf) * gs``.
    """
    amax = tl.max(tl.abs(h3), axis=2)
    v = tl.minimum(tl.math.div_rn(amax, 6.0 * gs), 448.0)
    sf = e4m3_rne(v)
    return sf, e4m3_to_f32(sf) * gs


@triton.jit
def nvfp4_codes(h3, step):
    """E2M1 codes (int32 [BM, BKB, 16]) of ``h3 / step`` (true division; step 0 -> code 0)."""
    s3 = step[:, :, None]
    zero = s3 == 0.0
    q = tl.math.div_rn(h3, tl.where(zero, 1.0, s3))
    q = tl.where(zero, 0.0, q)
    return e2m1_encode(q)


@triton.jit
def nvfp4_quantize_tile(h, gs, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 tile [BM, BK] -> (packed uint8 [BM, BK/2] (even K in the low nibble), sf int32 [BM, BK/16])."""
    h3 = tl.reshape(h, (BLOCK_M, BLOCK_K // 16, 16))
    sf, step = nvfp4_block_scales(h3, gs)
    codes = tl.reshape(nvfp4_codes(h3, step), (BLOCK_M, BLOCK_K // 2, 2))
    lo, hi = tl.split(codes)
    return (lo | (hi << 4)).to(tl.uint8), sf


@triton.jit
def nvfp4_qdq_tile(h, gs, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Quantize-dequantize an fp32 tile [BM, BK] to ``E2M1[q] * float(sf)`` (no global scale).

    Same codes and scales as :func:`nvfp4_quantize_tile`; the result is exact in bf16 and fp16
    (<= 6 significant bits, |v| in [2**-10, 2688]).
    """
    h3 = tl.reshape(h, (BLOCK_M, BLOCK_K // 16, 16))
    sf, step = nvfp4_block_scales(h3, gs)
    vals = e2m1_decode(nvfp4_codes(h3, step)) * e4m3_to_f32(sf)[:, :, None]
    return tl.reshape(vals, (BLOCK_M, BLOCK_K))


@triton.jit
def store_nvfp4_tile(q_ptr, sf_ptr, packed, sf, rows, pid_k, M, K, stride_qm,
                     SWIZZLE: tl.constexpr, BLOCK_K: tl.constexpr):
    """Store a quantized tile: codes for rows < M, and the tile's scale bytes.

    ``rows`` [BM] are global row ids; the tile covers columns ``pid_k * BLOCK_K + [0, BLOCK_K)``.
    Swizzled scales go to the 128x4 layout (``nvgemm.core.formats.blocked_offset``); every byte of the
    padding (rows up to a multiple of 128, K/16 up to a multiple of 4) this tile covers is written
    (with 0, because padded inputs load as 0), so callers need no memset.
    """
    pcols = pid_k * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    r = rows[:, None]
    tl.store(q_ptr + r.to(tl.int64) * stride_qm + pcols[None, :], packed,
             mask=(r < M) & (pcols[None, :] < K // 2))
    kb = (pid_k * (BLOCK_K // 16) + tl.arange(0, BLOCK_K // 16))[None, :]
    n_kb = K // 16
    if SWIZZLE:
        kb_tiles = (n_kb + 3) // 4
        off = ((r // 128) * kb_tiles + kb // 4).to(tl.int64) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + kb % 4
        mask = (r < ((M + 127) // 128) * 128) & (kb < kb_tiles * 4)
    else:
        off = r.to(tl.int64) * n_kb + kb
        mask = (r < M) & (kb < n_kb)
    tl.store(sf_ptr + off, sf.to(tl.uint8), mask=mask)


@triton.jit
def pdl_wait(USE_GDC: tl.constexpr):
    """``griddepcontrol.wait`` before the first read of a predecessor's output (PDL)."""
    if USE_GDC:
        gdc_wait()


@triton.jit
def pdl_launch_dependents(USE_GDC: tl.constexpr):
    """``griddepcontrol.launch_dependents`` once this program has read its inputs (PDL)."""
    if USE_GDC:
        gdc_launch_dependents()


# --------------------------------------------------------------------------- host helpers


def is_interpreted(kernel) -> bool:
    """True when ``kernel`` was built by the Triton interpreter (``TRITON_INTERPRET=1`` at import)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def runs_on_cpu(kernel) -> bool:
    """True when ``kernel`` takes CPU tensors: the Triton interpreter, or a stand-in that runs the kernel's
    compiled PTX elsewhere (the PTX emulator's ``EmuTritonKernel``, which has ``runs_on_cpu`` and the
    ``capability`` of the GPU it compiles for)."""
    return is_interpreted(kernel) or bool(getattr(kernel, "runs_on_cpu", False))


def use_gdc(kernel, device: torch.device, pdl: bool | None) -> bool:
    """Whether to launch with PDL (``launch_pdl``) and compile the ``gdc_*`` calls in.

    ``pdl=None`` means: on when the GPU is sm_90+ and ``NVGEMM_PDL`` is not ``0``. Never in the
    interpreter (it has no grid dependency control) or below sm_90 (no ``griddepcontrol``). A kernel
    stand-in with a ``capability`` (the emulator's) is treated as a GPU of that capability.
    """
    cap = getattr(kernel, "capability", None)
    if cap is None:
        if is_interpreted(kernel) or device.type != "cuda":
            return False  # a plain launch computes the same bytes
        cap = _capability(device.index if device.index is not None else torch.cuda.current_device())
    if cap < (9, 0):
        if pdl:
            raise RuntimeError(f"nvgemm: PDL (griddepcontrol) needs sm_90+, this GPU is sm_{cap[0]}{cap[1]}")
        return False
    if pdl is None:
        return settings.NVGEMM_PDL
    return bool(pdl)


def launch_options(gdc: bool) -> dict:
    """Extra kwargs for ``kernel[grid](...)``: PDL launch, and no FMA contraction."""
    return {"launch_pdl": gdc, "enable_fp_fusion": False}


def check_device(kernel, *tensors: torch.Tensor, op: str) -> torch.device:
    """Tensors must share one device: CUDA for compiled kernels, any for the interpreter."""
    dev = tensors[0].device
    for t in tensors:
        if t is not None and t.device != dev:
            raise ValueError(f"{op}: all tensors must be on {dev}, got one on {t.device}")
    if dev.type != "cuda" and not runs_on_cpu(kernel):
        raise ValueError(
            f"{op}: the Triton kernel needs CUDA tensors, got {dev} (set TRITON_INTERPRET=1 before "
            "importing triton to run it on CPU, or use the torch reference)"
        )
    return dev


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
