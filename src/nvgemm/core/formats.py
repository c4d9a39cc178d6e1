"""NVFP4: bit-exact pure-torch reference of the format nvgemm's kernels consume.

Everything here is vectorised torch, runs on CPU and CUDA tensors, imports nothing but
torch, and makes no kernel choice. The contract is ``shared/nvfp4_format.md``:

* element: E2M1, codes 0..7 = 0, .5, 1, 1.5, 2, 3, 4, 6, bit 3 = sign; round to nearest,
  ties to the even code, saturating at 6 (``cvt.rn.satfinite.e2m1x2.f32``);
* packing: two codes per byte, **even K index in the low nibble**;
* scales: float8_e4m3fn per 16 elements along K, times one fp32 global scale;
* swizzle: the 128x4 block layout that tcgen05 / cuBLASLt block-scaled MMA reads, held in
  its own tiled shape ``blocked_shape(rows, K/16)`` = (rows/128, K/64, 32, 4, 4) so that a
  linear [rows, K/16] matrix -- or one flattened to 1-D, which has the same size whenever
  rows % 128 == 0 and K % 64 == 0 -- can never be mistaken for it.

Division convention for activations (``quantize_activation``): ``q = e2m1(x / S)`` with
``S = float(sf) * input_scale`` computed in fp32 and a true IEEE division, exactly like
ModelOpt's weight recipe.  Every nvgemm kernel that quantizes activations must match it
bit for bit; none may multiply by an approximate reciprocal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = [
    "NVFP4",
    "Nvfp4Format",
    "Nvfp4Tensor",
    "E2M1_VALUES",
    "E2M1_MAX",
    "E4M3_MAX",
    "e2m1_encode",
    "e2m1_decode",
    "pack_e2m1",
    "unpack_e2m1",
    "fp8_e4m3_rne",
    "quantize_weight",
    "quantize_activation",
    "dequantize",
    "decode_packed",
    "to_blocked",
    "from_blocked",
    "blocked_offset",
    "blocked_numel",
    "blocked_shape",
    "is_blocked",
    "check_block_scales",
    "check_k",
    "check_input_scale_value",
    "ceil_to",
    "GLOBAL_DIVISOR",
]

E2M1_MAX = 6.0
E4M3_MAX = 448.0
#: amax / (E2M1_MAX * E4M3_MAX) is ModelOpt's per-tensor scale (weight_scale_2, input_scale).
GLOBAL_DIVISOR = E2M1_MAX * E4M3_MAX  # 2688
#: smallest block scale ModelOpt keeps for a non-zero block (its clamp), 2**-9 = e4m3's min subnormal.
MIN_BLOCK_SCALE = 2.0**-9

# Codes 0..15 -> value.  Code 8 is -0.
_E2M1_POS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
E2M1_VALUES = torch.tensor(_E2M1_POS + [-v for v in _E2M1_POS], dtype=torch.float32)

# Rounding boundaries between consecutive magnitudes and, for each, whether a tie goes up
# (ties go to the even code: 0.75 -> 1.0 (code 2), 1.75 -> 2.0 (code 4), 3.5 -> 4.0 (code 6)).
_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_UP = (False, True, False, True, False, True, False)


@dataclass(frozen=True)
class Nvfp4Format:
    """Frozen description of NVFP4 as nvgemm stores and consumes it."""

    element: str = "e2m1"
    element_bits: int = 4
    elements_per_byte: int = 2
    low_nibble_first: bool = True  # even K index in the low nibble
    block_size: int = 16  # elements per e4m3 scale, along K
    scale_dtype: torch.dtype = torch.float8_e4m3fn
    global_scale_dtype: torch.dtype = torch.float32
    swizzle_rows: int = 128  # scale rows per swizzle tile
    swizzle_cols: int = 4  # scale columns per swizzle tile
    packed_dtype: torch.dtype = torch.uint8

    def packed_shape(self, rows: int, k: int) -> tuple[int, int]:
        check_k(k)
        return (rows, k // self.elements_per_byte)

    def scale_shape(self, rows: int, k: int) -> tuple[int, int]:
        check_k(k)
        return (rows, k // self.block_size)

    def bytes_per_element(self) -> float:
        """Weight bytes per logical element: 0.5 for the code + 1/16 for its scale = 0.5625."""
        return 0.5 + 1.0 / self.block_size


NVFP4 = Nvfp4Format()


class Nvfp4Tensor(NamedTuple):
    """A quantized NVFP4 matrix: packed codes, linear (un-swizzled) block scales, global scale."""

    packed: torch.Tensor  # uint8 [..., K/2]
    scale: torch.Tensor  # float8_e4m3fn [..., K/16], row-major, not swizzled
    global_scale: torch.Tensor  # float32, 0-dim

    @property
    def k(self) -> int:
        return self.packed.shape[-1] * 2


# --------------------------------------------------------------------------- checks


def check_k(k: int, what: str = "K") -> None:
    if k % NVFP4.block_size != 0:
        raise ValueError(
            f"NVFP4 needs {what} to be a multiple of {NVFP4.block_size} (one e4m3 scale per "
            f"{NVFP4.block_size} elements along K); got {what}={k}"
        )


def _check_float(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"{name} must be float32/float16/bfloat16/float64, got {x.dtype}")


def _check_dtype(x: torch.Tensor, dtype: torch.dtype, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {x.dtype}")


def _check_finite(x: torch.Tensor, name: str) -> None:
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or Inf; NVFP4 has neither")


def check_input_scale_value(input_scale: torch.Tensor, where: str) -> None:
    """Refuse a NaN, infinite, zero or negative activation global scale (``input_scale``) held on the host.

    Quantizing with such a scale returns garbage (zero gives all-zero codes and scales, a negative
    one negative scales). Reading a value forces a device sync, so a CUDA scalar is not read per
    call: it is checked where it is built (``NVFP4Linear``, the checkpoint and vLLM loaders)."""
    if input_scale.device.type != "cpu":
        return
    v = input_scale.item() if input_scale.numel() == 1 else input_scale.reshape(-1)[0].item()
    if not (v > 0 and v != float("inf")):
        raise ValueError(f"{where}: input_scale is {v}; it must be finite and > 0")


# --------------------------------------------------------------------------- element


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32 values (already divided by their scale) -> E2M1 codes (uint8 0..15).

    Round to nearest, ties to the even code, saturating at +-6; the sign bit is set for
    every x < 0 (so -0.1 encodes as 0x8, -0), matching ModelOpt's ``_cast_fp4``.
    """
    _check_float(x, "x")
    x = x.float()
    # code magnitude = number of boundaries crossed: a > b, or a >= b where ties go up; in fp32
    # a >= b is a > nextafter(b, 0), so every test is one strict comparison
    a = x.abs()
    bounds = _bucket_bounds(x.device).tolist()
    code = (a > bounds[0]).to(torch.uint8)
    for b in bounds[1:]:
        code.add_(a > b)
    return code.bitwise_or_((x < 0).to(torch.uint8) << 3)


_BUCKET_BOUNDS: dict[torch.device, torch.Tensor] = {}
_PAIR_LUT: dict[torch.device, torch.Tensor] = {}


def _bucket_bounds(device: torch.device) -> torch.Tensor:
    if device not in _BUCKET_BOUNDS:
        b = torch.tensor(_BOUNDS, dtype=torch.float32)
        down = torch.nextafter(b, torch.zeros_like(b))
        _BUCKET_BOUNDS[device] = torch.where(torch.tensor(_TIE_UP), down, b).to(device)
    return _BUCKET_BOUNDS[device]


def _pair_lut(device: torch.device) -> torch.Tensor:
    """[256, 2] fp32: a packed byte -> (value of its low nibble, value of its high nibble)."""
    if device not in _PAIR_LUT:
        byte = torch.arange(256)
        _PAIR_LUT[device] = torch.stack((E2M1_VALUES[byte & 0xF], E2M1_VALUES[byte >> 4]), dim=-1).to(device)
    return _PAIR_LUT[device]


def decode_packed(packed: torch.Tensor) -> torch.Tensor:
    """packed uint8 [..., K/2] -> fp32 E2M1 values [..., K] (one table lookup per byte)."""
    if packed.dtype == getattr(torch, "float4_e2m1fn_x2", None):
        packed = packed.view(torch.uint8)
    _check_dtype(packed, torch.uint8, "packed")
    vals = _pair_lut(packed.device)[packed.int()]
    return vals.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8 0..15) -> fp32 values."""
    _check_dtype(codes, torch.uint8, "codes")
    return E2M1_VALUES.to(codes.device)[codes.long() & 0xF]


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """codes uint8 [..., K] -> packed uint8 [..., K/2], even K index in the low nibble."""
    _check_dtype(codes, torch.uint8, "codes")
    if codes.dim() < 1 or codes.shape[-1] % 2:
        raise ValueError(f"pack_e2m1 needs an even last dimension, got shape {tuple(codes.shape)}")
    return (codes[..., 0::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """packed uint8 [..., K/2] -> codes uint8 [..., K]."""
    if packed.dtype == getattr(torch, "float4_e2m1fn_x2", None):
        packed = packed.view(torch.uint8)
    _check_dtype(packed, torch.uint8, "packed")
    lo = packed & 0xF
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def fp8_e4m3_rne(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> float8_e4m3fn, round to nearest even. Caller clamps to [0, 448] first."""
    return x.float().to(torch.float8_e4m3fn)


# --------------------------------------------------------------------------- quantize


def _blocks(x: torch.Tensor) -> torch.Tensor:
    k = x.shape[-1]
    check_k(k)
    return x.float().reshape(*x.shape[:-1], k // NVFP4.block_size, NVFP4.block_size)


def quantize_weight(w: torch.Tensor, global_scale: torch.Tensor | None = None) -> Nvfp4Tensor:
    """ModelOpt's NVFP4 weight recipe, bit for bit (all fp32).

    1. ``ws2 = amax(W) / 2688`` (unless ``global_scale`` is given);
    2. ``ws = e4m3(clamp(block_amax / (6 * ws2), 2**-9, 448))``, where a quotient that is 0
       (an all-zero block, or one that underflows) is replaced by 1.0 before the clamp;
    3. ``code = e2m1(W / (float(ws) * ws2))``.

    One deliberate deviation: when the global scale is 0 (an all-zero tensor, or one whose
    amax / 2688 underflows fp32), ModelOpt divides by it and exports NaN or saturated codes;
    nvgemm returns codes 0, block scales 1.0 and a global scale of 0 (both dequantize to 0).
    """
    _check_float(w, "weight")
    if w.dim() != 2:
        raise ValueError(f"weight must be 2-D [N, K], got shape {tuple(w.shape)}")
    blocks = _blocks(w)
    mag = blocks.abs()
    block_amax = mag.amax(dim=-1)
    _check_finite(block_amax, "weight")  # amax propagates NaN and Inf
    if global_scale is None:
        global_scale = block_amax.amax() / GLOBAL_DIVISOR
    else:
        global_scale = torch.as_tensor(global_scale, dtype=torch.float32, device=w.device).reshape(())
    if bool(global_scale == 0):
        # All-zero tensor (or amax/2688 underflowed). ModelOpt divides by 0 here and exports NaN
        # or saturated codes; nvgemm deliberately emits codes 0, scales 1.0, global scale 0.
        n, kb = blocks.shape[:2]
        scale = torch.ones((n, kb), device=w.device).to(torch.float8_e4m3fn)
        codes = torch.zeros(w.shape, dtype=torch.uint8, device=w.device)
        return Nvfp4Tensor(pack_e2m1(codes), scale, global_scale.reshape(()))
    sf = block_amax / (E2M1_MAX * global_scale)
    sf = torch.where(sf == 0, torch.ones_like(sf), sf)  # ModelOpt's rule: a zero scale becomes 1.0
    scale = fp8_e4m3_rne(sf.clamp(min=MIN_BLOCK_SCALE, max=E4M3_MAX))
    step = scale.float() * global_scale
    # |W| / step encoded, then the sign: the same codes as e2m1_encode(W / step), where a negative
    # quotient that underflows to -0.0 gets no sign bit (ModelOpt's `x < 0` on the quotient)
    q = mag.div_(step.unsqueeze(-1))
    codes = e2m1_encode(q)
    codes.bitwise_or_(((blocks < 0) & (q > 0)).to(torch.uint8) << 3)
    return Nvfp4Tensor(pack_e2m1(codes.reshape(w.shape)), scale, global_scale.reshape(()))


def quantize_activation(x: torch.Tensor, input_scale: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
    """Run-time activation quantization (W4A4) with a static global scale.

    Per 16-block along K: ``sf = e4m3(min(block_amax / (6 * gs), 448))``,
    ``S = float(sf) * gs``, ``q = e2m1(x / S)`` (true fp32 division). An all-zero block gets
    sf = 0 and q = 0 (what GPU kernels emit; dequantizes to the same zeros as ModelOpt).

    ``input_scale`` is one value, or one per row (shape ``x.shape[:-1]``: rows routed to
    different MoE experts, each quantized with its expert's scale -- the same formula row by row).

    Returns (packed uint8 [..., K/2], scale float8_e4m3fn [..., K/16], linear layout).
    """
    _check_float(x, "x")
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension [..., K]")
    gs = torch.as_tensor(input_scale, dtype=torch.float32, device=x.device)
    if gs.numel() == 1:
        gs = gs.reshape(())
    elif tuple(gs.shape) == tuple(x.shape[:-1]):
        gs = gs.unsqueeze(-1)
    else:
        raise ValueError(f"input_scale must be one value or one per row {tuple(x.shape[:-1])}, got shape "
                         f"{tuple(gs.shape)}")
    blocks = _blocks(x)
    block_amax = blocks.abs().amax(dim=-1)
    scale = fp8_e4m3_rne((block_amax / (E2M1_MAX * gs)).clamp(max=E4M3_MAX))
    step = scale.float() * gs
    q = blocks / step.unsqueeze(-1)
    q = torch.where(step.unsqueeze(-1) == 0, torch.zeros_like(q), q)
    codes = e2m1_encode(q).reshape(x.shape)
    return pack_e2m1(codes), scale


def dequantize(
    packed: torch.Tensor,
    scale: torch.Tensor,
    global_scale: torch.Tensor | float | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``E2M1[code] * (float(sf) * gs)`` in fp32 (scales multiplied first), then cast.

    ``scale`` is the linear [..., K/16] layout; ``global_scale`` may be None (=1), a scalar,
    a 0-dim tensor, or a per-row tensor of shape [rows] (per-N-segment scales of fused shards).
    """
    vals = decode_packed(packed)
    _check_dtype(scale, torch.float8_e4m3fn, "scale")
    k = vals.shape[-1]
    check_k(k)
    if tuple(scale.shape) != (*vals.shape[:-1], k // NVFP4.block_size):
        raise ValueError(
            f"scale shape {tuple(scale.shape)} does not match packed shape {tuple(packed.shape)}: "
            f"expected {(*vals.shape[:-1], k // NVFP4.block_size)}"
        )
    step = scale.float()
    if global_scale is not None:
        gs = torch.as_tensor(global_scale, dtype=torch.float32, device=packed.device)
        if gs.dim() == 1:
            gs = gs.unsqueeze(-1)
        step = step * gs
    shape = vals.shape
    vals = vals.reshape(*shape[:-1], k // NVFP4.block_size, NVFP4.block_size)
    return (vals * step.unsqueeze(-1)).reshape(shape).to(dtype)


# --------------------------------------------------------------------------- swizzle


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def blocked_numel(rows: int, k_blocks: int) -> int:
    """Bytes of a [rows, k_blocks] scale matrix in the 128x4 layout (padding included)."""
    return _ceil_div(rows, 128) * 128 * _ceil_div(k_blocks, 4) * 4


def blocked_shape(rows: int, k_blocks: int) -> tuple[int, int, int, int, int]:
    """The tiled shape swizzled scales have: (row tiles of 128, K/16 tiles of 4, 32, 4, 4).

    Element [i, j, a, b, c] is S[128*i + 32*b + a, 4*j + c]; the memory is the 128x4 byte
    layout (the shape only makes it unmistakable; ``.reshape(-1)`` is the flat byte view)."""
    return (_ceil_div(rows, 128), _ceil_div(k_blocks, 4), 32, 4, 4)


def is_blocked(t: torch.Tensor, rows: int, k_blocks: int) -> bool:
    """True when ``t`` has the tiled swizzled shape of a [rows, k_blocks] scale matrix."""
    return tuple(t.shape) == blocked_shape(rows, k_blocks)


def blocked_offset(r, kb, k_blocks: int):
    """Byte offset of S[r, kb] in the 128x4 swizzled layout (works on ints and tensors)."""
    return (
        ((r // 128) * _ceil_div(k_blocks, 4) + kb // 4) * 512
        + (r % 32) * 16
        + ((r // 32) % 4) * 4
        + kb % 4
    )


def to_blocked(scale: torch.Tensor) -> torch.Tensor:
    """Linear [R, Kb] scales -> 128x4 swizzled scales of shape ``blocked_shape(R, Kb)``, padding zero."""
    if scale.dim() != 2:
        raise ValueError(f"to_blocked expects a 2-D [rows, K/16] scale matrix, got shape {tuple(scale.shape)}")
    rows, kb = scale.shape
    rp, kp = _ceil_div(rows, 128) * 128, _ceil_div(kb, 4) * 4
    raw = scale.view(torch.uint8) if scale.element_size() == 1 else scale
    padded = torch.zeros((rp, kp), dtype=raw.dtype, device=scale.device)
    padded[:rows, :kb] = raw
    out = padded.reshape(rp // 128, 4, 32, kp // 4, 4).permute(0, 3, 2, 1, 4).contiguous()
    return out.view(scale.dtype) if scale.element_size() == 1 else out


def from_blocked(blocked: torch.Tensor, rows: int, k_blocks: int) -> torch.Tensor:
    """Exact inverse of :func:`to_blocked`: swizzled scales -> linear [rows, k_blocks].

    ``blocked`` has the tiled shape ``blocked_shape(rows, k_blocks)``, or is the flat 1-D byte
    view of it (what the activation quantizers hand the kernels); the caller asserts that flat
    bytes are swizzled -- a flattened *linear* matrix of the same size would be decoded wrongly,
    which is why the public entry points accept only the tiled shape."""
    expected = blocked_numel(rows, k_blocks)
    if not (is_blocked(blocked, rows, k_blocks) or (blocked.dim() == 1 and blocked.numel() == expected)):
        raise ValueError(
            f"swizzled scales for a [{rows}, {k_blocks}] matrix must have shape {blocked_shape(rows, k_blocks)} "
            f"(or be its flat 1-D bytes, {expected} elements); got shape {tuple(blocked.shape)}"
        )
    rp, kp = _ceil_div(rows, 128) * 128, _ceil_div(k_blocks, 4) * 4
    raw = blocked.view(torch.uint8) if blocked.element_size() == 1 else blocked
    lin = raw.reshape(rp // 128, kp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(rp, kp)
    lin = lin[:rows, :k_blocks].contiguous()
    return lin.view(blocked.dtype) if blocked.element_size() == 1 else lin


def check_block_scales(scale: torch.Tensor, name: str) -> None:
    """Raise ValueError unless every e4m3 block-scale byte is a finite, non-negative value.

    NVFP4 block scales are unsigned (the MMA reads them as UE4M3): a set sign bit (0x80..0xFF) or
    the NaN codes (0x7F, 0xFF) are never produced by an exporter and would decode to wrong
    numbers. One pass over the bytes (host or device); call it at load time, not per GEMM."""
    raw = scale.view(torch.uint8) if scale.element_size() == 1 else None
    if raw is None or scale.dtype not in (torch.uint8, torch.float8_e4m3fn):
        raise ValueError(f"{name}: block scales must be float8_e4m3fn (or raw uint8 bytes), got {scale.dtype}")
    bad = raw >= 0x7F  # 0x7F = +NaN; 0x80..0xFF have the sign bit (negatives, -0, -NaN)
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0].tolist())
        byte = int(raw[idx])
        what = "NaN" if byte in (0x7F, 0xFF) else "negative (sign bit set)"
        raise ValueError(f"{name}: block scale at index {list(idx)} is {what} (byte 0x{byte:02X}); NVFP4 block "
                         "scales are unsigned finite e4m3 (the checkpoint is corrupt or not NVFP4)")


def ceil_to(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


def global_scale_from_amax(amax: torch.Tensor | float) -> torch.Tensor:
    return torch.as_tensor(amax, dtype=torch.float32) / GLOBAL_DIVISOR

