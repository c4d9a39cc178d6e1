"""Triton activation quantizer and device helpers under the interpreter, byte for byte.

Reference: ``nvgemm.core.formats.quantize_activation`` (+ ``to_blocked`` for the 128x4 swizzle). There
is no tolerance anywhere in this file: codes, scale bytes and the swizzle padding must be equal.
Output buffers are pre-filled with garbage so the kernel must write every byte, padding included.
"""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings, strategies as st

from nvgemm.core.formats import blocked_numel, e2m1_decode, e2m1_encode, quantize_activation, to_blocked
from nvgemm.templates.triton._common import e2m1_decode as tk_e2m1_decode
from nvgemm.templates.triton._common import e2m1_encode as tk_e2m1_encode
from nvgemm.templates.triton._common import e4m3_rne, e4m3_to_f32, f32_to_bf16_rne, is_interpreted
from nvgemm.templates.triton.quantize import quantize_nvfp4_kernel, quantize_nvfp4_triton
from nvfp4_cases import BOUNDS, adversarial

assert os.environ.get("TRITON_INTERPRET") == "1"

def test_kernel_is_interpreted():
    assert is_interpreted(quantize_nvfp4_kernel)


# --------------------------------------------------------------------------- device helpers


@triton.jit
def _helpers_kernel(v_ptr, sf_ptr, sfval_ptr, code_ptr, dec_ptr, bf_ptr, N, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < N
    v = tl.load(v_ptr + o, mask=m, other=0.0)
    sf = e4m3_rne(tl.minimum(tl.abs(v), 448.0))
    tl.store(sf_ptr + o, sf.to(tl.uint8), mask=m)
    tl.store(sfval_ptr + o, e4m3_to_f32(sf), mask=m)
    c = tk_e2m1_encode(v)
    tl.store(code_ptr + o, c.to(tl.uint8), mask=m)
    tl.store(dec_ptr + o, tk_e2m1_decode(c), mask=m)
    tl.store(bf_ptr + o, f32_to_bf16_rne(v), mask=m)


def _neighbours(v: torch.Tensor) -> torch.Tensor:
    """v, and the fp32 values one ulp below and above it."""
    return torch.cat([v, torch.nextafter(v, torch.zeros_like(v)), torch.nextafter(v, torch.full_like(v, 1e30))])


def test_device_helpers_match_torch():
    """e4m3 RNE (+ decode), e2m1 encode/decode and fp32->bf16 RNE against torch on all ties."""
    e4m3 = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # every finite value
    mids = (e4m3[1:] + e4m3[:-1]) / 2  # exact ties (fp32 holds them)
    bf = torch.randn(512).bfloat16().float()
    bf_ties = bf + (bf.abs() * 2.0**-8).clamp(min=2.0**-126)  # some exact bf16 ties, odd and even
    g = torch.Generator().manual_seed(0)
    rand = torch.exp2(torch.rand(512, generator=g) * 22 - 13)
    v = torch.cat([
        _neighbours(e4m3), _neighbours(mids), _neighbours(torch.tensor(BOUNDS)), _neighbours(-torch.tensor(BOUNDS)),
        torch.tensor([0.0, -0.0, 6.0, -6.0, 7.0, 448.0, 464.0, 1e30, -1e30, 2.0**-10, 2.0**-11, 1e-40]),
        rand, -rand, bf_ties, -bf_ties, torch.randn(512) * 4,
    ]).float().contiguous()
    n = v.numel()
    sf = torch.empty(n, dtype=torch.uint8)
    sfval = torch.empty(n)
    code = torch.empty(n, dtype=torch.uint8)
    dec = torch.empty(n)
    bfo = torch.empty(n, dtype=torch.bfloat16)
    _helpers_kernel[(triton.cdiv(n, 8192),)](v, sf, sfval, code, dec, bfo, n, BLOCK=8192)
    ref_sf = v.abs().clamp(max=448).to(torch.float8_e4m3fn)
    assert torch.equal(sf, ref_sf.view(torch.uint8))
    assert torch.equal(sfval, ref_sf.float())
    ref_code = e2m1_encode(v)
    assert torch.equal(code, ref_code)
    assert torch.equal(dec, e2m1_decode(ref_code))
    assert torch.equal(bfo.view(torch.int16), v.to(torch.bfloat16).view(torch.int16))


@triton.jit
def _bf16_kernel(v_ptr, o_ptr, N, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(o_ptr + o, f32_to_bf16_rne(tl.load(v_ptr + o, mask=o < N)), mask=o < N)


def test_bf16_rounding_keeps_inf_and_nan():
    v = torch.tensor([float("inf"), -float("inf"), float("nan"), -float("nan"), 3.4e38, -3.4e38])
    nan_bits = torch.tensor([0x7F800001, 0xFFFFFFFF, 0x7FFFFFFF], dtype=torch.int64).to(torch.int32).view(torch.float32)
    v = torch.cat([v, nan_bits])
    out = torch.empty(v.numel(), dtype=torch.bfloat16)
    _bf16_kernel[(1,)](v, out, v.numel(), BLOCK=16)
    ref = v.to(torch.bfloat16)
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out[~ref.isnan()], ref[~ref.isnan()])


# --------------------------------------------------------------------------- quantizer


def ref_bytes(x, gs, swizzle):
    p, s = quantize_activation(x, gs)
    return p, (to_blocked(s).reshape(-1) if swizzle else s).view(torch.uint8)


def run_kernel(x, gs, swizzle, config=None):
    m, k = x.shape
    packed = torch.full((m, k // 2), 0xAB, dtype=torch.uint8)  # garbage: every byte must be written
    shape = (blocked_numel(m, k // 16),) if swizzle else (m, k // 16)
    scale = torch.full(shape, 0xCD, dtype=torch.uint8)
    p, s = quantize_nvfp4_triton(x, gs, swizzle, config=config, out=(packed, scale))
    assert s.dtype == torch.float8_e4m3fn and p.data_ptr() == packed.data_ptr()
    return p, s.view(torch.uint8)


def assert_same_bytes(x, gs, swizzle, config=None):
    p, s = run_kernel(x, gs, swizzle, config)
    rp, rs = ref_bytes(x, gs, swizzle)
    bad_p = (p != rp).nonzero()
    assert bad_p.numel() == 0, f"{bad_p.shape[0]} packed bytes differ, first at {bad_p[:4].tolist()}"
    bad_s = (s != rs).nonzero()
    assert bad_s.numel() == 0, f"{bad_s.shape[0]} scale bytes differ, first at {bad_s[:4].tolist()}"


SHAPES = [(1, 16), (1, 64), (2, 48), (7, 80), (37, 96), (129, 32), (130, 272)]


@pytest.mark.parametrize("swizzle", [True, False], ids=["swz", "linear"])
@pytest.mark.parametrize("m,k", SHAPES, ids=[f"m{m}-k{k}" for m, k in SHAPES])
def test_random_bf16(m, k, swizzle, seed):
    x = (torch.randn(m, k) * torch.exp2(torch.randint(-6, 7, (m, k // 16))).repeat_interleave(16, 1)).bfloat16()
    assert_same_bytes(x, torch.tensor(0.01), swizzle)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("m,k", [(1, 32), (5, 48), (130, 64)])
def test_random_other_dtypes(m, k, dtype, seed):
    x = (torch.randn(m, k) * 3).to(dtype)
    assert_same_bytes(x, torch.tensor(1.0 / 2688), True)


TILINGS = [((32, 32, 4), True), ((64, 16, 4), True), ((4, 16, 4), False), ((1, 64, 4), False)]


@pytest.mark.parametrize("config,swizzle", TILINGS, ids=[f"{c[0]}x{c[1]}-{'swz' if s else 'linear'}" for c, s in TILINGS])
def test_tilings(config, swizzle, seed):
    """Several programs along M and K; swizzled tiles straddle the K/16-to-4 and row-to-128 padding."""
    x = torch.randn(9, 80).bfloat16()
    assert_same_bytes(x, torch.tensor(0.02), swizzle, config)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("swizzle", [True, False], ids=["swz", "linear"])
def test_adversarial(dtype, swizzle):
    x, gs = adversarial(dtype)
    assert_same_bytes(x, gs, swizzle)
    # the ties really are ties: the reference rounds each to the even code
    p, _ = ref_bytes(x[4:5, :16], gs, False)
    codes = torch.stack([p & 0xF, p >> 4], -1).reshape(-1)
    assert codes[1:8].tolist() == [0, 2, 2, 4, 4, 6, 6]  # 0.25->0, .75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4


def test_outliers_and_odd_global_scales(seed):
    x = torch.randn(3, 64)
    x[0, 5] = 3e4
    x[1, ::7] = -2e-6
    x[2, 16:32] = 0
    for gs in (1e-4, 0.3, 17.0):
        assert_same_bytes(x.bfloat16(), torch.tensor(gs, dtype=torch.float32), True)


@settings(max_examples=8, deadline=None, derandomize=True, database=None)
@given(m=st.integers(1, 40), kb=st.integers(1, 10), log2_scale=st.integers(-12, 6),
       fp16=st.booleans(), zero_frac=st.sampled_from([0.0, 0.3]), s=st.integers(0, 2**31 - 1))
def test_hypothesis(m, kb, log2_scale, fp16, zero_frac, s):
    g = torch.Generator().manual_seed(s)
    x = torch.randn(m, kb * 16, generator=g) * 2.0**log2_scale
    x = x * (torch.rand(m, kb, 1, generator=g) >= zero_frac).float().expand(m, kb, 16).reshape(m, kb * 16)
    gs = torch.tensor(float(x.abs().max()) / 2688 + 1e-30)
    assert_same_bytes(x.to(torch.float16 if fp16 else torch.bfloat16), gs, True)


# --------------------------------------------------------------------------- errors


def test_errors_name_the_problem():
    gs = torch.tensor(1.0)
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_nvfp4_triton(torch.randn(2, 24).bfloat16(), gs)
    with pytest.raises(TypeError, match="bfloat16, float16 or float32"):
        quantize_nvfp4_triton(torch.randn(2, 32).double(), gs)
    with pytest.raises(ValueError, match="2-D"):
        quantize_nvfp4_triton(torch.randn(2, 2, 32).bfloat16(), gs)
    with pytest.raises(ValueError, match="input_scale"):
        quantize_nvfp4_triton(torch.randn(2, 32).bfloat16(), torch.ones(2))
    with pytest.raises(ValueError, match="out\\[1\\]"):
        quantize_nvfp4_triton(torch.randn(2, 32).bfloat16(), gs,
                              out=(torch.empty(2, 16, dtype=torch.uint8), torch.empty(7, dtype=torch.uint8)))


# --------------------------------------------------------------------------- one-kernel qdq (W4A4 on Hopper)


def _qdq_ref(x: torch.Tensor, gs: torch.Tensor) -> torch.Tensor:
    from nvgemm.core.formats import dequantize

    q, s = quantize_activation(x, gs)
    return dequantize(q, s)  # E2M1 * s in fp32 (exact in bf16 / fp16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_qdq_matches_quantize_then_dequantize_bitwise(dtype, seed):
    """``qdq_nvfp4_triton`` = ``formats.quantize_activation`` + ``dequantize``, bit for bit, in one
    kernel: random rows across binades, an all-zero block, the adversarial rounding ties, and an
    output buffer pre-filled with NaN (every element must be written)."""
    from nvgemm.templates.triton.quantize import qdq_nvfp4_triton

    x = (torch.randn(37, 96) * torch.exp2(torch.randint(-6, 7, (37, 6))).repeat_interleave(16, 1)).to(dtype)
    x[3, 16:32] = 0
    gs = torch.tensor(0.01)
    out = torch.full_like(x, float("nan"))
    y = qdq_nvfp4_triton(x, gs, out=out)
    assert y is out and torch.equal(y.float(), _qdq_ref(x, gs))
    xa, gsa = adversarial(dtype)
    assert torch.equal(qdq_nvfp4_triton(xa, gsa).float(), _qdq_ref(xa, gsa))


def test_qdq_errors_name_the_problem():
    from nvgemm.templates.triton.quantize import qdq_nvfp4_triton

    gs = torch.tensor(1.0)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        qdq_nvfp4_triton(torch.randn(2, 32), gs)
    with pytest.raises(ValueError, match="K % 16"):
        qdq_nvfp4_triton(torch.randn(2, 24).bfloat16(), gs)
    with pytest.raises(ValueError, match="input_scale"):
        qdq_nvfp4_triton(torch.randn(2, 32).bfloat16(), torch.ones(2))
    with pytest.raises(ValueError, match="out must be"):
        qdq_nvfp4_triton(torch.randn(2, 32).bfloat16(), gs, out=torch.empty(2, 32))
