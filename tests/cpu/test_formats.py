"""nvgemm.core.formats against independent references (brute-force rounding, the byte-offset formula)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from nvgemm.core.formats import (
    NVFP4,
    E2M1_VALUES,
    blocked_numel,
    blocked_offset,
    blocked_shape,
    dequantize,
    e2m1_decode,
    e2m1_encode,
    fp8_e4m3_rne,
    from_blocked,
    pack_e2m1,
    quantize_activation,
    quantize_weight,
    to_blocked,
    unpack_e2m1,
)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
MAGS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_bruteforce(v: float) -> int:
    """Nearest magnitude by exhaustive search; ties to the even code; sign bit for v < 0."""
    a = min(abs(v), 6.0)
    dists = [abs(a - m) for m in MAGS]
    best = min(dists)
    cands = [i for i, d in enumerate(dists) if d == best]
    code = cands[0] if len(cands) == 1 else [c for c in cands if c % 2 == 0][0]
    return code | (8 if v < 0 else 0)


def test_e2m1_table_is_the_format():
    assert E2M1_VALUES[:8].tolist() == MAGS
    assert E2M1_VALUES[8:].tolist() == [-m for m in MAGS]
    codes = torch.arange(16, dtype=torch.uint8)
    # every non-negative-zero code round-trips; -0 (code 8) encodes as +0 since -0.0 < 0 is false
    rt = e2m1_encode(e2m1_decode(codes))
    assert rt.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 9, 10, 11, 12, 13, 14, 15]


@pytest.mark.parametrize("device", DEVICES)
def test_e2m1_ties_and_boundaries(device):
    pts = []
    for a, b in zip(MAGS, MAGS[1:]):
        mid = (a + b) / 2
        pts += [mid, torch.nextafter(torch.tensor(mid), torch.tensor(-1.0)).item(),
                torch.nextafter(torch.tensor(mid), torch.tensor(9.0)).item()]
    pts += MAGS + [6.5, 7.0, 1e30, 1e-30, 0.1, 5.999]
    vals = torch.tensor(pts + [-p for p in pts], dtype=torch.float32, device=device)
    got = e2m1_encode(vals).cpu().tolist()
    want = [e2m1_bruteforce(v) for v in vals.cpu().tolist()]
    assert got == want


@given(st.lists(st.floats(-20, 20, allow_nan=False, width=32), min_size=1, max_size=64))
def test_e2m1_matches_bruteforce_hypothesis(vals):
    x = torch.tensor(vals, dtype=torch.float32)
    assert e2m1_encode(x).tolist() == [e2m1_bruteforce(v) for v in x.tolist()]


def test_pack_low_nibble_first_and_roundtrip(seed):
    codes = torch.randint(0, 16, (5, 34), dtype=torch.uint8)
    packed = pack_e2m1(codes)
    assert packed.shape == (5, 17)
    for j in range(17):
        assert torch.equal(packed[:, j], codes[:, 2 * j] | (codes[:, 2 * j + 1] << 4))
    assert torch.equal(unpack_e2m1(packed), codes)
    if hasattr(torch, "float4_e2m1fn_x2"):
        assert torch.equal(unpack_e2m1(packed.view(torch.float4_e2m1fn_x2)), codes)


def test_fp8_rne_is_torch_rne():
    # e4m3 values around 1.0 are spaced by 1/8; 1 + 1/16 is an exact tie -> even (1.0)
    x = torch.tensor([1.0 + 1 / 16, 1.0 + 3 / 16, 448.0, 2.0**-9, 2.0**-10, 1.5 * 2.0**-10])
    got = fp8_e4m3_rne(x).float().tolist()
    assert got == [1.0, 1.25, 448.0, 2.0**-9, 0.0, 2.0**-9]


# ----------------------------------------------------------------------- swizzle


@pytest.mark.parametrize("rows,kb", [(1, 1), (7, 3), (128, 4), (129, 5), (200, 8), (300, 17), (256, 2)])
@pytest.mark.parametrize("device", DEVICES)
def test_swizzle_matches_offset_formula(rows, kb, device):
    s = (torch.rand(rows, kb, device=device) * 400 + 1).to(torch.float8_e4m3fn)
    b = to_blocked(s)
    assert b.dtype == torch.float8_e4m3fn and b.shape == blocked_shape(rows, kb) and b.numel() == blocked_numel(rows, kb)
    raw = b.view(torch.uint8).reshape(-1).cpu()
    want = torch.zeros(blocked_numel(rows, kb), dtype=torch.uint8)
    sc = s.view(torch.uint8).cpu()
    for r in range(rows):
        for k in range(kb):
            want[blocked_offset(r, k, kb)] = sc[r, k]
    assert torch.equal(raw, want)  # includes: every padding byte is zero
    written = torch.zeros_like(want, dtype=torch.bool)
    for r in range(rows):
        for k in range(kb):
            written[blocked_offset(r, k, kb)] = True
    assert int(raw[~written].count_nonzero()) == 0
    assert torch.equal(from_blocked(b, rows, kb).view(torch.uint8).cpu(), sc)


def test_swizzle_ints_and_bad_sizes():
    s = torch.arange(12, dtype=torch.uint8).reshape(3, 4)
    assert torch.equal(from_blocked(to_blocked(s), 3, 4), s)
    with pytest.raises(ValueError, match="flat 1-D bytes, 512 elements"):
        from_blocked(torch.zeros(100, dtype=torch.uint8), 3, 4)
    with pytest.raises(ValueError, match="2-D"):
        to_blocked(torch.zeros(4, dtype=torch.uint8))


# ----------------------------------------------------------------------- quantize


def test_quantize_weight_known_block():
    # one row, one block: amax 6 -> ws2 = 6/2688; block scale = 6/(6*ws2) = 448
    w = torch.tensor([[6.0, -3.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 0.1, -0.1, 0.0, 4.0, -6.0, 1.0]])
    q = quantize_weight(w)
    assert q.global_scale.item() == torch.tensor(6.0 / 2688, dtype=torch.float32).item()
    assert (q.scale.float() * q.global_scale).item() == 1.0  # so the codes below are exact ties
    assert q.scale.float().item() == 448.0
    codes = unpack_e2m1(q.packed)[0].tolist()
    assert codes == [7, 13, 0, 2, 2, 4, 4, 6, 6, 14, 0, 8, 0, 6, 15, 2]


@pytest.mark.parametrize("device", DEVICES)
def test_activation_quant_convention(device, seed):
    x = (torch.randn(5, 64, device=device) * 3).to(torch.bfloat16)
    x[1, 16:32] = 0  # an all-zero block -> sf 0, q 0
    gs = torch.tensor(x.float().abs().max().item() / 2688, device=device)
    packed, scale = quantize_activation(x, gs)
    # independent: per element, block scale and true division in fp32
    xb = x.float().reshape(5, 4, 16)
    sf = (xb.abs().amax(-1) / (6 * gs)).clamp(max=448).to(torch.float8_e4m3fn)
    assert torch.equal(scale.view(torch.uint8), sf.view(torch.uint8))
    S = sf.float() * gs
    q = torch.where(S[..., None] == 0, torch.zeros_like(xb), xb / S[..., None])
    want = [e2m1_bruteforce(v) for v in q.reshape(-1).cpu().tolist()]
    assert unpack_e2m1(packed).reshape(-1).cpu().tolist() == want
    assert scale[1, 1].float().item() == 0.0
    deq = dequantize(packed, scale, gs)
    assert bool((deq[1, 16:32] == 0).all())


def test_dequantize_per_row_global_scale():
    w = torch.randn(4, 32)
    q = quantize_weight(w)
    v = torch.tensor([1.0, 2.0, 0.5, 4.0]) * q.global_scale
    d = dequantize(q.packed, q.scale, v)
    d1 = dequantize(q.packed, q.scale, 1.0)
    assert torch.equal(d, d1 * v[:, None])  # exact: both are products of exact e2m1*e4m3 by one fp32


def test_all_zero_weight_is_zero_not_nan():
    q = quantize_weight(torch.zeros(3, 32))
    assert int(q.packed.count_nonzero()) == 0 and q.global_scale.item() == 0.0
    assert bool((q.scale.float() == 1.0).all())
    assert bool((dequantize(q.packed, q.scale, q.global_scale) == 0).all())


# ----------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "fn,args,exc,msg",
    [
        (quantize_weight, (torch.randn(4, 20),), ValueError, "multiple of 16"),
        (quantize_weight, (torch.randn(2, 4, 32),), ValueError, "2-D"),
        (quantize_weight, (torch.randint(0, 3, (4, 32)),), TypeError, "float32/float16/bfloat16"),
        (quantize_weight, (torch.tensor([[float("nan")] * 16]),), ValueError, "NaN or Inf"),
        (quantize_activation, (torch.randn(4, 24), 1.0), ValueError, "multiple of 16"),
        (e2m1_decode, (torch.zeros(3, dtype=torch.int32),), TypeError, "uint8"),
        (pack_e2m1, (torch.zeros(3, dtype=torch.uint8),), ValueError, "even last dimension"),
        (dequantize, (torch.zeros(2, 8, dtype=torch.uint8), torch.zeros(2, 2).to(torch.float8_e4m3fn)), ValueError, "does not match"),
        (dequantize, (torch.zeros(2, 8, dtype=torch.uint8), torch.zeros(2, 1)), TypeError, "float8_e4m3fn"),
    ],
)
def test_bad_inputs(fn, args, exc, msg):
    with pytest.raises(exc, match=msg):
        fn(*args)


def test_format_descriptor_frozen():
    assert NVFP4.bytes_per_element() == 0.5625
    assert NVFP4.packed_shape(3, 64) == (3, 32) and NVFP4.scale_shape(3, 64) == (3, 4)
    with pytest.raises(Exception):
        NVFP4.block_size = 32  # frozen
