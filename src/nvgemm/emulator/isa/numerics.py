"""Element codes to values for the MMA input types (bf16, f16, e2m1, e4m3/ue4m3, ue8m0), written from the
PTX ISA's type definitions (5.2.5 "Alternate floating point data formats"), and the one fp32 rounding the MMA
semantics use.

Every input value is exactly representable in float64, and so is every product of two inputs and two scale
factors (at most 8 + 8 or 2 + 2 + 4 + 4 significant bits), so MMA products are formed exactly in float64.
"""

from __future__ import annotations

import numpy as np

from nvgemm.emulator.isa.errors import IsaError


def _e2m1_table() -> np.ndarray:
    # s.ee.m: exponent bias 1, no inf/nan; 0b0001 is the subnormal 0.5
    vals = []
    for code in range(16):
        s, e, m = code >> 3, (code >> 1) & 3, code & 1
        mag = m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)
        vals.append(-mag if s else mag)
    return np.array(vals, dtype=np.float64)


def _e4m3_table(signed: bool) -> np.ndarray:
    # e4m3 (fn): bias 7, 0x7f / 0xff are NaN, no inf; ue4m3 is the same code without the sign bit (7 bits used)
    vals = []
    for code in range(256):
        s, e, m = code >> 7, (code >> 3) & 0xF, code & 7
        if (code & 0x7F) == 0x7F:
            mag = np.nan
        else:
            mag = m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        if signed:
            vals.append(-mag if s else mag)
        else:
            vals.append(np.nan if s else mag)
    return np.array(vals, dtype=np.float64)


E2M1 = _e2m1_table()
E4M3 = _e4m3_table(signed=True)
UE4M3 = _e4m3_table(signed=False)
UE8M0 = np.array([np.nan if c == 255 else 2.0 ** (c - 127) for c in range(256)], dtype=np.float64)


def values(codes, dtype: str) -> np.ndarray:
    """float64 values of raw element codes of ``dtype`` (``bf16``, ``f16``, ``e2m1``, ``e4m3``, ``e5m2``,
    ``ue4m3``, ``ue8m0``, ``f32``)."""
    c = np.asarray(codes)
    if dtype == "bf16":
        return (c.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype == "f16":
        return c.astype(np.uint16).view(np.float16).astype(np.float64)
    if dtype == "f32":
        return c.astype(np.uint32).view(np.float32).astype(np.float64)
    if dtype == "e5m2":  # 1-5-2 with bias 15, inf and NaN as in IEEE: the high byte of an fp16
        return (c.astype(np.uint16) << np.uint16(8)).view(np.float16).astype(np.float64)
    table = {"e2m1": E2M1, "e4m3": E4M3, "ue4m3": UE4M3, "ue8m0": UE8M0}.get(dtype)
    if table is None:
        raise IsaError(f"element type {dtype!r} is not modelled")
    mask = 0xF if dtype == "e2m1" else 0xFF
    return table[c.astype(np.int64) & mask]


def round_f32(x: np.ndarray) -> np.ndarray:
    """Round float64 values to fp32, round-to-nearest-even (IEEE ``cvt.rn.f32.f64``)."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float64).astype(np.float32)


def f32_bits(x) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32)


def bits_f32(u) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(u, dtype=np.uint32)).view(np.float32)


def dot_f32(a: np.ndarray, b: np.ndarray, d: np.ndarray | None) -> np.ndarray:
    """``D' = A @ B^T (+ D)`` as the emulator's MMAs model it: ``a`` (M, K) and ``b`` (N, K) float64 values.

    Model (the hardware's internal order and precision are implementation-defined): every product is exact,
    the products are added in K order in float64, ``D`` is added last, and the sum is rounded once to fp32
    (nearest even). On data whose partial sums are exact in fp32 (the tests' data) every summation order
    gives the same bits, so this model and the hardware agree there; elsewhere they may differ in the last
    bits of fp32.
    """
    acc = np.zeros((a.shape[0], b.shape[0]), dtype=np.float64)
    for k in range(a.shape[1]):
        acc += a[:, k, None] * b[None, :, k]
    if d is not None:
        acc += np.asarray(d, dtype=np.float32).astype(np.float64)
    return round_f32(acc)
