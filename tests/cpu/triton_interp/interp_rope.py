"""The fused RoPE + KV-cache write kernel (``nvgemm.templates.triton.rope``) under the interpreter.

TOLERANCES: none -- the kernel and the test's formula do the same fp32 operations (``x * cos``,
``rotate_half(x) * sin``, their sum, each rounded in fp32, no FMA) and one RNE rounding to x's dtype, so q,
the written k and v must be **bit-identical**. The formula here is written independently of
``reference.rope_kv_write_ref`` (explicit half indexing, not ``cat``); both are checked. An fp64 evaluation
bounds the result by one ulp of x's dtype (the fp32 steps add at most a few fp32 ulps before the final
rounding), so a formula shared by a wrong kernel and a wrong reference would still fail.
"""

from __future__ import annotations

import os

import pytest
import torch

from nvgemm.templates.triton import reference as ref
from nvgemm.templates.triton.rope import rope_kv_write_triton

assert os.environ.get("TRITON_INTERPRET") == "1"

ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


def _tables(p, d, dtype, seed):
    """Llama-style tables: angle = pos * theta**(-2i/d), rows cat(f, f); with random scaling folded in."""
    g = torch.Generator().manual_seed(seed)
    inv = 500000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d) * (1 + torch.rand(d // 2, generator=g,
                                                                                          dtype=torch.float64))
    ang = torch.arange(p, dtype=torch.float64)[:, None] * inv[None]
    ang = torch.cat((ang, ang), -1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def _formula(x, c, s, dtype):
    """fp32, op by op: y[i] = x[i] c[i] - x[i+h] s[i] (i < h), x[i] c[i] + x[i-h] s[i] (i >= h)."""
    h = x.shape[-1] // 2
    xf, cf, sf = x.float(), c.float(), s.float()
    lo = xf[..., :h] * cf[..., :h] + (-xf[..., h:]) * sf[..., :h]
    hi = xf[..., h:] * cf[..., h:] + xf[..., :h] * sf[..., h:]
    return torch.cat((lo, hi), -1).to(dtype)


def _inputs(t, hq, hkv, d, s_len, dtype, table_dtype, seed, pad=0):
    g = torch.Generator().manual_seed(seed)
    w = (hq + 2 * hkv) * d
    qkv = (torch.randn(t, w + pad, generator=g) * 2).to(dtype)[:, :w]  # row stride w + pad
    cos, sin = _tables(s_len + 3, d, table_dtype, seed)
    pos = torch.randperm(s_len, generator=g)[:t]
    kc = torch.randn(1, hkv, s_len, d, generator=g).to(dtype)
    vc = torch.randn(1, hkv, s_len, d, generator=g).to(dtype)
    return qkv, cos, sin, pos, kc, vc


CASES = [  # (tokens, Hq, Hkv, D, cache slots, dtype, table dtype)
    (1, 32, 8, 128, 64, torch.bfloat16, torch.bfloat16),   # Llama-3.1-8B decode (GQA 4)
    (5, 8, 2, 64, 16, torch.bfloat16, torch.float32),      # several tokens, fp32 tables
    (3, 4, 4, 32, 8, torch.float16, torch.float16),        # MHA, fp16
    (2, 6, 1, 96, 12, torch.bfloat16, torch.bfloat16),     # MQA, head_dim not a power of two
]


@pytest.mark.parametrize("t,hq,hkv,d,s_len,dtype,tdt", CASES, ids=[f"t{c[0]}-hq{c[1]}-hkv{c[2]}-d{c[3]}-"
                                                                  f"{str(c[5])[6:]}-cos{str(c[6])[6:]}" for c in CASES])
@pytest.mark.parametrize("pad", [0, 16])
def test_rope_kv_write_matches_the_fp32_formula_bit_for_bit(t, hq, hkv, d, s_len, dtype, tdt, pad):
    qkv, cos, sin, pos, kc, vc = _inputs(t, hq, hkv, d, s_len, dtype, tdt, seed=t * 7 + d + pad, pad=pad)
    kc0, vc0 = kc.clone(), vc.clone()
    q = rope_kv_write_triton(qkv, cos, sin, pos, kc, vc, hq, hkv)
    qr, kr, vr = qkv.split([hq * d, hkv * d, hkv * d], -1)
    c, s = cos[pos][:, None], sin[pos][:, None]
    want_q = _formula(qr.reshape(t, hq, d), c, s, dtype)
    want_k = _formula(kr.reshape(t, hkv, d), c, s, dtype)
    assert q.shape == (t, hq, d) and q.dtype == dtype and q.is_contiguous()
    assert torch.equal(q, want_q)
    assert pos.min() > 0 or t > 1  # a position > 0 is written in every case
    assert torch.equal(kc[0, :, pos].transpose(0, 1), want_k)
    assert torch.equal(vc[0, :, pos].transpose(0, 1), vr.reshape(t, hkv, d))
    other = torch.ones(s_len, dtype=torch.bool)
    other[pos] = False  # every other slot untouched
    assert torch.equal(kc[0, :, other], kc0[0, :, other]) and torch.equal(vc[0, :, other], vc0[0, :, other])
    # the shared reference (cat form) agrees, caches included
    kc2, vc2 = kc0.clone(), vc0.clone()
    assert torch.equal(ref.rope_kv_write_ref(qkv, cos, sin, pos, kc2, vc2, hq, hkv), q)
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)
    # fp64 rotation: within one ulp of x's dtype
    x64 = qr.reshape(t, hq, d).double()
    h = d // 2
    rot = torch.cat((-x64[..., h:], x64[..., :h]), -1)
    exact = x64 * c.double() + rot * s.double()
    assert bool(((q.double() - exact).abs() <= ULP[dtype] * exact.abs() + 2.0**-24).all())


def test_position_zero_is_the_identity_rotation():
    """cos = 1, sin = 0 at position 0: q and k come back unchanged (a swapped cos/sin would not)."""
    qkv, cos, sin, _, kc, vc = _inputs(1, 4, 2, 64, 8, torch.bfloat16, torch.float32, seed=3)
    q = rope_kv_write_triton(qkv, cos, sin, torch.tensor([0]), kc, vc, 4, 2)
    assert torch.equal(q.reshape(1, -1), qkv[:, :4 * 64])
    assert torch.equal(kc[0, :, 0].reshape(1, -1), qkv[:, 4 * 64:6 * 64])


def test_zero_tokens_launch_nothing():
    qkv, cos, sin, _, kc, vc = _inputs(1, 4, 2, 64, 8, torch.bfloat16, torch.float32, seed=4)
    kc0 = kc.clone()
    q = rope_kv_write_triton(qkv[:0], cos, sin, torch.zeros(0, dtype=torch.long), kc, vc, 4, 2)
    assert q.shape == (0, 4, 64) and torch.equal(kc, kc0)


def test_out_of_range_position_writes_nothing_in_the_kernel():
    """The value check is the op's (skipped under CUDA-graph capture); the kernel alone masks the token."""
    qkv, cos, sin, _, kc, vc = _inputs(2, 4, 2, 64, 8, torch.bfloat16, torch.float32, seed=5)
    kc0, vc0 = kc.clone(), vc.clone()
    q = rope_kv_write_triton(qkv, cos, sin, torch.tensor([2, 8]), kc, vc, 4, 2)  # 8: one past the cache
    assert torch.equal(q[1], torch.zeros_like(q[1]))
    kc0[0, :, 2] = kc[0, :, 2]
    vc0[0, :, 2] = vc[0, :, 2]
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0)


@pytest.mark.parametrize("bad,match", [
    (lambda a: a.update(qkv=a["qkv"][:, :-64]), "columns"),
    (lambda a: a.update(qkv=a["qkv"].float()), "bfloat16 or float16"),
    (lambda a: a.update(k_cache=a["k_cache"].half()), "dtype"),
    (lambda a: a.update(v_cache=a["v_cache"][:, :1]), "num_kv_heads"),
    (lambda a: a.update(cos_cache=a["cos_cache"][:, :32]), "max_positions, head_dim"),
    (lambda a: a.update(positions=a["positions"].float()), "int32 or int64"),
    (lambda a: a.update(positions=a["positions"][:1]), "one entry per token"),
    (lambda a: a.update(num_heads=3), "multiple of num_kv_heads"),
])
def test_bad_arguments_are_named(bad, match):
    qkv, cos, sin, pos, kc, vc = _inputs(2, 4, 2, 64, 8, torch.bfloat16, torch.float32, seed=6)
    a = dict(qkv=qkv, cos_cache=cos, sin_cache=sin, positions=pos, k_cache=kc, v_cache=vc, num_heads=4,
             num_kv_heads=2)
    bad(a)
    with pytest.raises((ValueError, TypeError), match=match):
        rope_kv_write_triton(**a)
