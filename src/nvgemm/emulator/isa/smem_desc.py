"""Shared-memory matrix descriptors of ``wgmma`` (sm_90a) and ``tcgen05.mma`` (sm_100a), the 32/64/128-byte
swizzles, and the gather of one MMA operand tile from shared memory through a descriptor.

Written from the PTX ISA: 9.7.15.5.1.2 "Shared Memory Matrix Layout" / "Matrix Descriptor Format" (wgmma) and
9.7.16.4.1 "Shared memory descriptor" (tcgen05). Addresses are byte addresses in the ``.shared`` window.

Descriptor fields (64 bits; ``encode(x) = (x & 0x3FFFF) >> 4``, so addresses and offsets are multiples of 16):

====================  ==================================  ======================================================
bits                  wgmma                               tcgen05
====================  ==================================  ======================================================
0-13                  start address >> 4                  start address >> 4
16-29                 leading dimension byte offset >> 4  same (or an absolute address when bit 52 is set)
32-45                 stride dimension byte offset >> 4   same
46-48                 reserved (0)                        fixed ``0b001``
49-51                 matrix base offset                  matrix base offset
52                    reserved (0)                        leading-dimension mode: 0 relative, 1 absolute
61-63 / 62-63         ``62-63``: 0 none, 1 128B,           ``61-63``: 0 none, 1 128B with 32B atoms, 2 128B,
                      2 64B, 3 32B                        4 64B, 6 32B (3, 5, 7 invalid)
====================  ==================================  ======================================================

Canonical layouts (the ISA's CuTe notation, in elements; ``T = 128 / element bits`` elements = 16 bytes,
``S`` = swizzle width in bytes, ``A = S / 16``)::

    K-major,  no swizzle:  ((8,m),(T,2k)) : ((1T,SBO),(1,LBO))
    K-major,  S swizzle:   ((8,m),(T,2k)) : ((A T,SBO),(1,T))
    MN-major, no swizzle:  ((T,1,m),(8,k)) : ((1,T,SBO),(1T,LBO))
    MN-major, S swizzle:   ((T,A,m),(8,k)) : ((1,T,LBO),(A T,SBO))

followed by ``Swizzle<log2 A, 4, 3>`` on the byte address: bits [4, 4 + log2 A) are XORed with bits
[7, 7 + log2 A). The swizzle is applied to the **absolute** shared address (the hardware sees only the
address), which is why a k-step may advance the start address by 32 bytes inside a 1024-byte 128B atom and
still read the right 16-byte units. The ISA's base offset exists for patterns that do not start on the
pattern boundary (1024/512/256 bytes); every descriptor CuTe and nvgemm build has base offset 0 and the ISA
does not spell out how the hardware folds a non-zero one into the XOR, so a non-zero base offset is
rejected (:class:`~.errors.IsaError`) instead of guessed. The same goes for tcgen05's absolute
leading-dimension mode and its "128B with 32B atomic" swizzle, which no kernel here emits.

The element order inside a byte for 4-bit types follows the memory order of packed data: element ``2i``
in the low nibble, ``2i + 1`` in the high nibble.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nvgemm.emulator.isa.errors import IsaError

_MASK64 = (1 << 64) - 1
SWIZZLE_WIDTHS = (0, 32, 64, 128)


def swizzle(addr, width: int) -> np.ndarray:
    """Apply the ``width``-byte swizzle (0 = none, 32, 64, 128) to absolute shared byte addresses."""
    a = np.asarray(addr, dtype=np.int64)
    if width == 0:
        return a
    try:
        bits = {32: 1, 64: 2, 128: 3}[width]
    except KeyError:
        raise IsaError(f"swizzle width {width} bytes: expected one of {SWIZZLE_WIDTHS}") from None
    return a ^ (((a >> 7) & ((1 << bits) - 1)) << 4)


@dataclass(frozen=True)
class SmemDescriptor:
    """A decoded shared-memory matrix descriptor (byte values, not the >> 4 encodings)."""

    start: int
    lbo: int
    sbo: int
    base_offset: int
    swizzle: int
    raw: int


def _field(v: int, lo: int, width: int) -> int:
    return (v >> lo) & ((1 << width) - 1)


def _reserved_zero(v: int, spans, what: str) -> None:
    for lo, hi in spans:
        if _field(v, lo, hi - lo + 1):
            raise IsaError(f"{what} descriptor {v:#018x}: reserved bits {lo}-{hi} are not zero")


def _common(v: int, swz: int, what: str) -> SmemDescriptor:
    d = SmemDescriptor(start=_field(v, 0, 14) << 4, lbo=_field(v, 16, 14) << 4, sbo=_field(v, 32, 14) << 4,
                       base_offset=_field(v, 49, 3), swizzle=swz, raw=v)
    if d.base_offset and swz:
        raise IsaError(f"{what} descriptor {v:#018x}: matrix base offset {d.base_offset} != 0 is not modelled "
                       "(the swizzle pattern must start on its 1024/512/256-byte boundary)")
    return d


def decode_wgmma_desc(value: int) -> SmemDescriptor:
    """Decode a ``wgmma.mma_async`` shared-memory matrix descriptor (PTX ISA 9.7.15.5.1.2.2)."""
    v = int(value) & _MASK64
    _reserved_zero(v, [(14, 15), (30, 31), (46, 48), (52, 61)], "wgmma")
    swz = (0, 128, 64, 32)[_field(v, 62, 2)]
    return _common(v, swz, "wgmma")


def decode_tcgen05_desc(value: int) -> SmemDescriptor:
    """Decode a ``tcgen05.mma`` shared-memory descriptor (PTX ISA 9.7.16.4.1)."""
    v = int(value) & _MASK64
    _reserved_zero(v, [(14, 15), (30, 31), (53, 60)], "tcgen05")
    if _field(v, 46, 3) != 0b001:
        raise IsaError(f"tcgen05 descriptor {v:#018x}: bits 46-48 are {_field(v, 46, 3):#05b}, "
                       "the ISA fixes them to 0b001")
    if _field(v, 52, 1):
        raise IsaError(f"tcgen05 descriptor {v:#018x}: absolute leading-dimension mode (bit 52) is not modelled")
    code = _field(v, 61, 3)
    if code == 1:
        raise IsaError(f"tcgen05 descriptor {v:#018x}: swizzle mode 1 (128B with 32B atoms) is not modelled")
    if code not in (0, 2, 4, 6):
        raise IsaError(f"tcgen05 descriptor {v:#018x}: swizzle mode {code} is invalid (ISA: 3, 5, 7 invalid)")
    return _common(v, {0: 0, 2: 128, 4: 64, 6: 32}[code], "tcgen05")


def operand_addresses(desc: SmemDescriptor, mn: int, k: int, elem_bits: int, major: str):
    """Byte address (after swizzling) and bit shift inside that byte of every element of an ``mn x k`` operand.

    ``major`` is ``"k"`` (K-major, the non-transposed operand) or ``"mn"`` (M/N-major). Returns two int64
    arrays of shape ``(mn, k)``: the absolute shared byte address and the bit position of the element's
    least significant bit in that byte (0 for 8/16-bit elements, 0 or 4 for 4-bit ones).
    """
    if elem_bits not in (4, 8, 16, 32):
        raise IsaError(f"element width {elem_bits} bits: expected 4, 8, 16 or 32")
    t = 128 // elem_bits
    i = np.arange(mn, dtype=np.int64)[:, None]
    kk = np.arange(k, dtype=np.int64)[None, :]
    sw = desc.swizzle
    if major == "k":
        chunk, within = kk // t, kk % t
        if sw == 0:
            off = (i % 8) * 16 + (i // 8) * desc.sbo + chunk * desc.lbo
        else:
            if k * elem_bits > sw * 8:
                raise IsaError(f"K-major operand of {k} x {elem_bits}-bit elements is wider than its "
                               f"{sw}-byte swizzle atom")
            off = (i % 8) * sw + (i // 8) * desc.sbo + chunk * 16
    elif major == "mn":
        if elem_bits != 16 and elem_bits != 32:
            raise IsaError(f"MN-major operands exist only for 16/32-bit types, not {elem_bits}-bit")
        within = i % t
        if sw == 0:
            off = (i // t) * desc.sbo + (kk % 8) * 16 + (kk // 8) * desc.lbo
        else:
            a = sw // 16
            off = ((i // t) % a) * 16 + (i // (t * a)) * desc.lbo + (kk % 8) * sw + (kk // 8) * desc.sbo
    else:
        raise IsaError(f"operand major {major!r}: expected 'k' or 'mn'")
    bit = within * elem_bits
    addr = swizzle(desc.start + off + bit // 8, sw)
    return np.broadcast_to(addr, (mn, k)), np.broadcast_to(bit % 8, (mn, k))


def read_operand(smem, desc: SmemDescriptor, mn: int, k: int, elem_bits: int, major: str,
                 *, window_base: int = 0) -> np.ndarray:
    """Raw element codes (uint16 for 16-bit, uint8 for 4/8-bit, uint32 for 32-bit) of an ``mn x k`` operand.

    ``smem`` is either the CTA's shared memory as a uint8 array whose index 0 is shared address
    ``window_base``, or a reader ``smem(addresses, width) -> uint8 array (n, width)`` (the emulator core's
    checked shared-memory read: bounds, poison, bytes still in flight).
    """
    addr, bit = operand_addresses(desc, mn, k, elem_bits, major)
    width = max(elem_bits // 8, 1)
    if callable(smem):
        raw = np.asarray(smem(addr.ravel(), width), dtype=np.uint8).reshape(*addr.shape, width)
    else:
        idx = addr - window_base
        if idx.min() < 0 or idx.max() + width > smem.size:
            bad = int(addr.min() if idx.min() < 0 else addr.max())
            raise IsaError(f"descriptor {desc.raw:#018x} reads shared address {bad:#x}, outside "
                           f"[{window_base:#x}, {window_base + smem.size:#x})")
        raw = np.asarray(smem, dtype=np.uint8)[idx[..., None] + np.arange(width)]
    if elem_bits == 4:
        return ((raw[..., 0] >> bit.astype(np.uint8)) & 0xF).astype(np.uint8)
    if elem_bits == 8:
        return raw[..., 0]
    out = np.zeros(addr.shape, dtype=np.uint32)
    for b in range(width):
        out |= raw[..., b].astype(np.uint32) << (8 * b)
    return out.astype(np.uint16) if elem_bits == 16 else out
