"""``nvgemm::rope_kv_write`` on CPU: the op (its torch reference path), its checks, its fake, and the capture
pass's rewrite of a decode layer's RoPE + KV-cache write into it, compiled by Inductor against the eager layer.

The kernel itself is checked bit for bit under the Triton interpreter (``triton_interp/interp_rope.py``) and
from its sm_90a / sm_100a PTX on the emulator (``tests/emulator/_triton_emu_cases.py``).

TOLERANCES: the op vs the fp32 formula: exact (same fp32 operations, one rounding). The op vs the eager
bf16 chain (``x * cos + rotate_half(x) * sin`` with each product and the sum rounded to bf16): within
2 bf16 ulps of the value plus 2**-8 of the row's max (three bf16 roundings against one; the absolute part
covers cancellation in the sum). The compiled layer vs the eager layer: v bit for bit and k exactly the op's
rotation of the same qkv (the fused norm quantizer gives the graph's codes, the GEMM is the same), the eager k
within the bound above; the layer output within the rewrites' rounding changes (the RoPE's one rounding, the
residual added before one rounding) -- 2**-6 relative to the output's max.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch._subclasses.fake_tensor import FakeTensorMode

import nvgemm
from nvgemm.cli import decode_step as ds
from nvgemm.templates.triton.reference import rope_ref

T, HQ, HKV, D, S = 3, 8, 2, 32, 16


def _inputs(seed=0, t=T, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(t, (HQ + 2 * HKV) * D, generator=g) * 2).to(dtype)
    cos, sin = ds.rope_tables(S + 4, D, theta=10000.0)
    pos = torch.randperm(S, generator=g)[:t]
    kc = torch.randn(1, HKV, S, D, generator=g).to(dtype)
    return qkv, cos.to(dtype), sin.to(dtype), pos, kc, torch.randn(1, HKV, S, D, generator=g).to(dtype)


def _hf_bf16(x, c, s):
    h = x.shape[-1] // 2
    return x * c + torch.cat((-x[..., h:], x[..., :h]), -1) * s


def test_op_writes_the_cache_and_returns_roped_q():
    qkv, cos, sin, pos, kc, vc = _inputs()
    kc0, vc0 = kc.clone(), vc.clone()
    q = torch.ops.nvgemm.rope_kv_write(qkv, cos, sin, pos, kc, vc, HQ, HKV)
    qr, kr, vr = qkv.split([HQ * D, HKV * D, HKV * D], -1)
    c, s = cos[pos][:, None], sin[pos][:, None]
    h = D // 2
    xf = qr.reshape(T, HQ, D).float()
    want = torch.cat((xf[..., :h] * c[..., :h].float() - xf[..., h:] * s[..., :h].float(),
                      xf[..., h:] * c[..., h:].float() + xf[..., :h] * s[..., h:].float()), -1).bfloat16()
    assert torch.equal(q, want)
    assert torch.equal(kc[0, :, pos].transpose(0, 1), rope_ref(kr.reshape(T, HKV, D), c, s))
    assert torch.equal(vc[0, :, pos].transpose(0, 1), vr.reshape(T, HKV, D))
    keep = torch.ones(S, dtype=torch.bool)
    keep[pos] = False
    assert torch.equal(kc[0, :, keep], kc0[0, :, keep]) and torch.equal(vc[0, :, keep], vc0[0, :, keep])
    # against the bf16 chain the model code runs: a few ulps apart (three roundings against one)
    hf = _hf_bf16(qr.reshape(T, HQ, D), c, s).float()
    err = (q.float() - hf).abs()
    assert bool((err <= 2 * 2.0**-7 * hf.abs() + 2.0**-8 * hf.abs().amax(-1, keepdim=True)).all())
    assert float(err.max()) > 0  # the chains do differ: the bound is not vacuous


@pytest.mark.parametrize("pos,match", [
    (torch.tensor([0, 3, 16]), r"positions out of range: values in \[0, 16\].*valid: 0\.\.15"),
    (torch.tensor([-1, 3, 4]), "positions out of range"),
    (torch.tensor([2, 5, 2]), "distinct"),
])
def test_bad_positions_are_named(pos, match):
    qkv, cos, sin, _, kc, vc = _inputs()
    kc0 = kc.clone()
    with pytest.raises(ValueError, match=match):
        torch.ops.nvgemm.rope_kv_write(qkv, cos, sin, pos, kc, vc, HQ, HKV)
    assert torch.equal(kc, kc0)  # nothing written


def test_short_tables_bound_the_positions():
    qkv, cos, sin, _, kc, vc = _inputs()
    with pytest.raises(ValueError, match="tables hold 4 positions"):
        torch.ops.nvgemm.rope_kv_write(qkv, cos[:4], sin[:4], torch.tensor([1, 2, 5]), kc, vc, HQ, HKV)


@pytest.mark.parametrize("bad,match", [
    (dict(qkv=lambda t: t[:, :-D]), "columns"),
    (dict(qkv=lambda t: t.half()), "dtype"),  # caches stay bf16
    (dict(k_cache=lambda t: t[..., :-2]), "differ in shape"),
    (dict(sin_cache=lambda t: t[:-1]), "differ"),
    (dict(positions=lambda t: t.int()[:2]), "one entry per token"),
    (dict(k_cache=lambda t: t.transpose(2, 3).contiguous().transpose(2, 3)), "contiguous"),
])
def test_bad_arguments_are_named_by_the_op_and_its_fake(bad, match):
    qkv, cos, sin, pos, kc, vc = _inputs()
    a = dict(qkv=qkv, cos_cache=cos, sin_cache=sin, positions=pos, k_cache=kc, v_cache=vc)
    for k, f in bad.items():
        a[k] = f(a[k])
    with pytest.raises((ValueError, TypeError), match=match):
        torch.ops.nvgemm.rope_kv_write(*a.values(), HQ, HKV)
    with FakeTensorMode() as fm, pytest.raises((ValueError, TypeError), match=match):
        torch.ops.nvgemm.rope_kv_write(*[fm.from_tensor(t) for t in a.values()], HQ, HKV)


def test_fake_gives_q_shape():
    with FakeTensorMode() as fm:
        q = torch.ops.nvgemm.rope_kv_write(*[fm.from_tensor(t) for t in _inputs()], HQ, HKV)
    assert q.shape == (T, HQ, D) and q.dtype == torch.bfloat16


# --------------------------------------------------------------------------- the decode layer, compiled

TINY = ds.DecodePreset("tiny", hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=32, vocab=64, layers=1,
                       source="test", context=16)


@pytest.fixture(autouse=False)
def cpu_attention(monkeypatch):
    """SDPA's flash op is CUDA-only: the layer attends with the math SDPA on CPU (eager and compiled alike)."""
    monkeypatch.setattr(ds, "attention", lambda q, k, v, scale: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, scale=scale))


def _layer_and_inputs():
    layer = ds.random_layer(TINY, 1, weight_only=False, layout="fused", seed=0, device="cpu")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, TINY.hidden, generator=g).bfloat16()
    kc = torch.randn(1, TINY.kv_heads, TINY.context, TINY.head_dim, generator=g).bfloat16()
    vc = torch.randn(1, TINY.kv_heads, TINY.context, TINY.head_dim, generator=g).bfloat16()
    cos, sin = ds.rope_tables(TINY.context, TINY.head_dim)
    return layer, x, kc, vc, torch.tensor([7]), cos, sin


def _compiled(layer, *args, fuse_layer=True):
    torch._dynamo.reset()
    counters.clear()
    with torch._inductor.config.patch({"max_autotune_gemm_backends": "ATEN", "cpp.vec_isa_ok": False}), \
            nvgemm.enabled(fuse_layer=fuse_layer):
        out = torch.compile(layer, fullgraph=True)(*args)
    return out, dict(counters["nvgemm_cutedsl"])


def test_capture_pass_makes_the_layer_rope_one_op_and_matches_eager(cpu_attention):
    """The decode layer's torch RoPE + index_copy_ chain, compiled with nvgemm: the capture pass rewrites it to
    nvgemm::rope_kv_write (counter), one graph, the cache written in place. Against the eager layer: v bit for
    bit; k exactly the op's fp32 rotation of the same qkv (the fused norm quantizer gives the graph's codes), and
    within the bf16-chain bound of the eager k; the layer output within the layer rewrites' rounding changes."""
    layer, x, kc, vc, pos, cos, sin = _layer_and_inputs()
    ek, ev = kc.clone(), vc.clone()
    with torch.no_grad():
        eager = layer(x, ek, ev, pos, cos, sin)
        torch._dynamo.reset()
        with nvgemm.enabled():
            ex = torch._dynamo.explain(layer)(x, kc.clone(), vc.clone(), pos, cos, sin)
        assert ex.graph_break_count == 0 and ex.graph_count == 1, ex.break_reasons
        ck, cv = kc.clone(), vc.clone()
        out, c = _compiled(layer, x, ck, cv, pos, cos, sin)
        a = layer.self_attn
        qkv = a.qkv_proj(layer.input_layernorm(x))
    assert c.get("rope_kv_fused") == 1, c
    assert torch.equal(cv, ev)
    keep = torch.ones(TINY.context, dtype=torch.bool)
    keep[7] = False
    assert torch.equal(ck[0, :, keep], kc[0, :, keep])
    kpart = qkv[:, a.nh * a.d:(a.nh + a.kvh) * a.d].reshape(a.kvh, a.d)
    assert torch.equal(ck[0, :, 7], rope_ref(kpart, cos[7], sin[7]))
    k_c, k_e = ck[0, :, 7].float(), ek[0, :, 7].float()
    assert bool(((k_c - k_e).abs() <= 2 * 2.0**-7 * k_e.abs() + 2.0**-8 * k_e.abs().amax(-1, keepdim=True)).all())
    assert float((out - eager).abs().max()) <= 2.0**-6 * float(eager.abs().max())


def test_without_the_layer_rewrites_the_chain_stays_inductors(cpu_attention):
    layer, x, kc, vc, pos, cos, sin = _layer_and_inputs()
    with torch.no_grad():
        _, c = _compiled(layer, x, kc, vc, pos, cos, sin, fuse_layer=False)
    assert not c.get("rope_kv_fused"), c


class _ChunkAttention(torch.nn.Module):
    """Several tokens of one sequence in the Hugging Face layout (``view(1, T, H, D).transpose(1, 2)``), RoPE with
    tables read at the positions, the static cache written with ``index_copy_``; returns q and the attention."""

    def __init__(self, hq=4, hkv=2, d=32, hidden=64, rope_q=True):
        super().__init__()
        lin = torch.nn.Linear(hidden, (hq + 2 * hkv) * d, bias=False, dtype=torch.bfloat16)
        torch.nn.init.normal_(lin.weight, std=0.1, generator=torch.Generator().manual_seed(5))
        from nvgemm.nn.linear import NVFP4Linear

        self.qkv = NVFP4Linear.from_linear(lin, 0.01)
        self.hq, self.hkv, self.d, self.rope_q = hq, hkv, d, rope_q

    def forward(self, x, k_cache, v_cache, pos, cos, sin):
        t, hq, hkv, d = x.shape[0], self.hq, self.hkv, self.d
        q, k, v = self.qkv(x).split([hq * d, hkv * d, hkv * d], -1)
        q = q.view(1, t, hq, d).transpose(1, 2)
        k = k.view(1, t, hkv, d).transpose(1, 2)
        v = v.view(1, t, hkv, d).transpose(1, 2)
        c, s = cos[pos][None, None], sin[pos][None, None]  # [1, 1, T, D]
        if self.rope_q:
            q = ds._rope(q, c, s)
        k = ds._rope(k, c, s)
        k_cache.index_copy_(2, pos, k)
        v_cache.index_copy_(2, pos, v)
        return q * 1, torch.nn.functional.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)


@pytest.mark.parametrize("rope_q", [True, False])
def test_several_tokens_in_the_hf_layout(rope_q):
    """T = 3 tokens (token stride = the qkv row in the q / k / v views): rewritten, and the compiled result equals
    the eager op chain -- q in the graph's transposed layout, the cache slots. Without a RoPE of q the rewrite
    does not apply (the op always ropes q)."""
    mod = _ChunkAttention(rope_q=rope_q)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 64, generator=g).bfloat16()
    kc = torch.randn(1, 2, 16, 32, generator=g).bfloat16()
    vc = torch.randn(1, 2, 16, 32, generator=g).bfloat16()
    cos, sin = ds.rope_tables(16, 32, theta=10000.0)
    pos = torch.tensor([9, 4, 11])
    ck, cv = kc.clone(), vc.clone()
    with torch.no_grad():
        (q_c, o_c), c = _compiled(mod, x, ck, cv, pos, cos, sin)
        ek, ev = kc.clone(), vc.clone()
        qkv = mod.qkv(x)
        q_op = torch.ops.nvgemm.rope_kv_write(qkv, cos, sin, pos, ek, ev, 4, 2)
    if not rope_q:
        assert not c.get("rope_kv_fused"), c
        return
    assert c.get("rope_kv_fused") == 1, c
    assert torch.equal(ck, ek) and torch.equal(cv, ev)
    assert torch.equal(q_c, q_op.view(3, 4, 32).transpose(0, 1).unsqueeze(0))
    o_e = torch.nn.functional.scaled_dot_product_attention(q_op.transpose(0, 1).unsqueeze(0), ek, ev, enable_gqa=True)
    torch.testing.assert_close(o_c, o_e, rtol=0, atol=2.0**-7 * float(o_e.abs().max()))
