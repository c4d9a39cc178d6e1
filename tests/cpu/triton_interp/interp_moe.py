"""Triton grouped NVFP4 MoE (``nvgemm.templates.triton.moe``) vs the MoE numerics contract.

Reference: the emulated op ``nvgemm.ops.moe.nvfp4_moe_emulated`` (the numerics contract), itself
checked here bit for bit against :func:`moe_cases.pair_reference` (the contract evaluated one
(token, slot) pair at a time with ``nvfp4_linear_emulated``, no MoE code). Both sides quantize identical operands; the kernel may
only sum each GEMM in another fp32 order. Hence:

* on *exact* data (few significant bits, every fp32 sum exact in any order; W4A4 so GEMM2's input is
  requantized to e2m1 * e4m3) the outputs are **bit-identical** for activations without ``exp``
  (``relu2``; ``silu_mul`` too on this data, where numpy's and torch's exp agree) -- no tolerance;
* on random data the order can move h's rounding to x's dtype by one ulp on a few elements and then
  one FP4 code of its requantization: we require >= 90 % of outputs bit-equal to the reference and
  ||out - ref|| / ||ref|| <= 2**-7 (a wrong expert, slot, scale or weight is off by O(1)).
"""

from __future__ import annotations

import os

import pytest
import torch

from moe_cases import make_moe, pair_reference
from nvgemm.ops.moe import nvfp4_moe_emulated
from nvgemm.templates.triton.moe import moe_align, nvfp4_moe_triton

assert os.environ.get("TRITON_INTERPRET") == "1"


def _run(x, ids, wts, w, activation="silu_mul", **kw):
    return nvfp4_moe_triton(x, ids, wts, w["w13"], w["w13_scale"], w["w13_scale_2"], w["w13_input_scale"],
                            w["w2"], w["w2_scale"], w["w2_scale_2"], w["w2_input_scale"], activation,
                            kw.pop("router_weight_on_input", False), kw.pop("expert_map", None),
                            kw.pop("shared_out", None), kw.pop("residual", None), kw.pop("out_dtype", None), **kw)


def _emulated(x, ids, wts, w, activation="silu_mul", router_weight_on_input=False, expert_map=None,
              shared_out=None, residual=None, out_dtype=None):
    ref = nvfp4_moe_emulated(x, ids, wts, w["w13"], w["w13_scale"], w["w13_scale_2"], w["w13_input_scale"],
                             w["w2"], w["w2_scale"], w["w2_scale_2"], w["w2_input_scale"], activation,
                             router_weight_on_input, expert_map, shared_out, residual, out_dtype)
    per_pair = pair_reference(x, ids, wts, w, activation, router_weight_on_input, expert_map, shared_out, residual,
                              out_dtype)
    assert torch.equal(ref, per_pair), "the emulated op and the per-pair contract disagree"
    return ref


def _close(out, ref, what=""):
    assert out.shape == ref.shape and out.dtype == ref.dtype
    same = float((out == ref).float().mean())
    rel = float((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))
    assert same >= 0.9 and rel <= 2.0**-7, f"{what}: {same:.3f} bit-equal, relative error {rel:.3g}"


def _routing(m, k, e, g, weights_dtype=torch.float32):
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(m)]).to(torch.int32)
    wts = torch.rand(m, k, generator=g).to(weights_dtype)
    return ids, wts


def test_align_tables():
    """Sorted pairs grouped by expert in (token, slot) order, runs padded to BLOCK_M, -1 ids dropped."""
    ids = torch.tensor([[2, 0], [2, -1], [3, 2], [0, 2]], dtype=torch.int32)
    pairs, bexp, local = moe_align(ids, 4, 4)
    p = ids.numel()
    assert local.tolist() == [2, 0, 2, -1, 3, 2, 0, 2]
    blocks = pairs.reshape(-1, 4).tolist()
    # expert 0: pairs 1, 7; expert 2: 0, 2, 5, 7?  (2 at flat 0, 2, 5, 7) ; expert 3: 4
    assert bexp.tolist()[:3] == [0, 2, 3] and all(b == -1 for b in bexp.tolist()[3:])
    assert blocks[0] == [1, 6, p, p]
    assert blocks[1] == [0, 2, 5, 7]
    assert blocks[2] == [4, p, p, p]
    # expert map: global 6 experts, local 0..1 are globals 4, 2
    emap = torch.tensor([-1, -1, 1, -1, 0, -1], dtype=torch.int32)
    pairs, bexp, local = moe_align(torch.tensor([[4, 2], [5, 4]], dtype=torch.int32), 2, 2, emap)
    assert local.tolist() == [0, 1, -1, 0]
    assert pairs[:4].tolist() == [0, 3, 1, p // 2] and bexp.tolist()[:2] == [0, 1]


@pytest.mark.parametrize("activation", ["relu2", "silu_mul"])
def test_bit_exact_on_exact_data(activation):
    e, h, i, m, k = 4, 64, 32, 6, 2
    w = make_moe(e, h, i, gated=activation == "silu_mul", exact=True, seed=1)
    g = torch.Generator().manual_seed(2)
    x = (torch.randint(-4, 5, (m, h), generator=g).float() * 0.25).bfloat16()
    ids, _ = _routing(m, k, e, g)
    wts = torch.tensor([0.5, 0.25]).repeat(m, 1)
    out = _run(x, ids, wts, w, activation)
    ref = _emulated(x, ids, wts, w, activation)
    assert torch.equal(out, ref), f"{float((out != ref).float().mean()):.3f} of outputs differ"


CASES = [  # e, h, i, m, k, activation, w4a4, row alpha, x dtype, config, routing
    (4, 64, 32, 5, 2, "silu_mul", True, False, torch.bfloat16, None, "random"),
    (4, 64, 32, 3, 2, "silu_mul", False, False, torch.float16, None, "random"),
    (8, 48, 16, 3, 2, "silu_mul", True, True, torch.bfloat16, None, "random"),  # zero-token experts, row alpha
    (4, 64, 32, 17, 1, "silu_mul", True, False, torch.bfloat16, None, "one_expert"),  # odd M, all tokens on one
    (4, 80, 48, 7, 2, "silu_mul", True, False, torch.bfloat16, (16, 32, 32, 4, 1), "random"),  # N and K tails
    (4, 80, 48, 7, 3, "relu2", False, False, torch.bfloat16, (16, 32, 32, 4, 1), "minus_one"),  # -1 ids
    (4, 64, 32, 9, 2, "silu", True, False, torch.float16, None, "random"),
]


def _cid(c):
    return f"e{c[0]}-h{c[1]}-i{c[2]}-m{c[3]}-k{c[4]}-{c[5]}-{'w4a4' if c[6] else 'w4a16'}" \
           f"{'-row' if c[7] else ''}-{str(c[8])[6:]}{'-tiled' if c[9] else ''}-{c[10]}"


@pytest.mark.parametrize("e,h,i,m,k,activation,w4a4,row,xdt,config,routing", CASES, ids=[_cid(c) for c in CASES])
def test_matches_contract(e, h, i, m, k, activation, w4a4, row, xdt, config, routing):
    w = make_moe(e, h, i, gated=activation == "silu_mul", w4a4=w4a4, row_alpha=row, seed=e + h + m)
    g = torch.Generator().manual_seed(m)
    x = (torch.randn(m, h, generator=g) * 2).to(xdt)
    x[0, :16] = 0  # an all-zero activation block
    ids, wts = _routing(m, k, e, g)
    if routing == "one_expert":
        ids.fill_(2)
    if routing == "minus_one":
        ids[::2, 1] = -1
        ids[1, :] = -1  # a token with no expert at all
    out = _run(x, ids, wts, w, activation, config=config)
    ref = _emulated(x, ids, wts, w, activation)
    _close(out, ref, _cid((e, h, i, m, k, activation, w4a4, row, xdt, config, routing)))
    if routing == "minus_one":
        assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_expert_map_shared_residual_and_out_dtype():
    """EP: 8 global experts, this rank holds globals 5, 1, 6 as locals 0..2; others contribute nothing."""
    e, h, i, m, k = 3, 64, 32, 6, 2
    w = make_moe(e, h, i, seed=7)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(m, h, generator=g).bfloat16()
    ids, wts = _routing(m, k, 8, g)
    emap = torch.full((8,), -1, dtype=torch.int32)
    emap[5], emap[1], emap[6] = 0, 1, 2
    shared = torch.randn(m, h, generator=g).bfloat16()
    res = torch.randn(m, h, generator=g).bfloat16()
    out = _run(x, ids, wts, w, expert_map=emap, shared_out=shared, residual=res, out_dtype=torch.float32)
    ref = _emulated(x, ids, wts, w, expert_map=emap, shared_out=shared, residual=res, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    rel = float((out - ref).norm() / ref.norm())
    assert rel <= 2.0**-7, rel
    # a token routed only to experts this rank does not hold gets exactly shared + residual
    ids[0] = torch.tensor([0, 2], dtype=torch.int32)
    out = _run(x, ids, wts, w, expert_map=emap, shared_out=shared, residual=res, out_dtype=torch.float32)
    assert torch.equal(out[0], shared[0].float() + res[0].float())


def test_router_weight_on_input_applied_once():
    """Llama-4 style top-1: the router weight scales x before quantization and is not applied again."""
    e, h, i, m = 4, 64, 32, 5
    w = make_moe(e, h, i, seed=11)
    g = torch.Generator().manual_seed(12)
    x = torch.randn(m, h, generator=g).bfloat16()
    ids, _ = _routing(m, 1, e, g)
    wts = torch.rand(m, 1, generator=g) * 0.5 + 0.25
    out = _run(x, ids, wts, w, router_weight_on_input=True)
    ref = _emulated(x, ids, wts, w, router_weight_on_input=True)
    _close(out, ref, "weight on input")
    twice = _emulated(x, ids, wts * wts, w, router_weight_on_input=True)  # what applying it twice gives
    assert float((out.float() - twice.float()).norm() / twice.float().norm()) > 0.1


def test_batch_invariance():
    """flashinfer#3559 (output depends on batch composition): a token's output is the same bytes alone
    (M = 1) and inside a batch of 17 with other tokens routed to the same experts."""
    e, h, i, m = 4, 64, 32, 17
    w = make_moe(e, h, i, seed=21)
    g = torch.Generator().manual_seed(22)
    x = torch.randn(m, h, generator=g).bfloat16()
    ids, wts = _routing(m, 2, e, g)
    full = _run(x, ids, wts, w)
    for t in (0, 5, 16):
        alone = _run(x[t:t + 1], ids[t:t + 1], wts[t:t + 1], w)
        assert torch.equal(alone[0], full[t]), t
