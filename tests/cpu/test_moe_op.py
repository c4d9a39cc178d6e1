"""nvgemm::nvfp4_moe: the emulated op against an independent fp64 reference, the contract's
slot-order sum, opcheck, NVFP4Experts construction, the backend registry, and clear errors."""

from __future__ import annotations

import warnings

import pytest
import torch

import nvgemm  # noqa: F401  (registers the ops)
from _moe_reference import Q, RefExpert, moe_tolerance, ref_moe_fp64
from nvgemm.core.formats import from_blocked, quantize_weight
from nvgemm.core.formats import global_scale_from_amax
from nvgemm.nn.linear import NVFP4Linear
from nvgemm.nn.experts import NVFP4Experts
from nvgemm.dispatch import moe as mb
from nvgemm.dispatch import registry as reg

E, H, I, M, K = 4, 64, 32, 6, 2


def make_experts(e=E, h=H, i=I, activation="silu_mul", w4a4=True, per_expert_ins=False, row_alpha=False):
    """Per-expert NVFP4Linears (gate, up, down), possibly with unequal gate/up weight_scale_2."""
    layers = []
    for j in range(e):
        ins1 = (0.01 * (1 + 0.3 * j if per_expert_ins else 1.0)) if w4a4 else None
        ins2 = (0.02 * (1 + 0.2 * j if per_expert_ins else 1.0)) if w4a4 else None
        wu, wg = _lin(h, i, 1.0).weight.detach(), _lin(h, i, 3.0 if row_alpha else 1.0).weight.detach()
        # ModelOpt quantizes gate and up with one amax (equal weight_scale_2); row_alpha: independently
        gs = None if row_alpha else global_scale_from_amax(torch.cat([wu, wg]).abs().amax())
        up = _nvfp4(wu, gs, ins1)
        gate = _nvfp4(wg, gs, ins1) if activation == "silu_mul" else None
        down = NVFP4Linear.from_linear(_lin(i, h, 1.0), ins2)
        layers.append((gate, up, down))
    return layers


def _nvfp4(w, gs, ins):
    q = quantize_weight(w, gs)
    return NVFP4Linear.from_tensors(q.packed, q.scale, q.global_scale, None if ins is None else torch.tensor(ins))


def _lin(k, n, amp):
    lin = torch.nn.Linear(k, n, bias=False)
    with torch.no_grad():
        lin.weight.normal_(0, amp * 0.3)
    return lin


def ref_experts(layers) -> list[RefExpert]:
    """Reference experts straight from the per-expert layers (linear scales, no stacking)."""
    def q(l):
        return Q(l.weight, from_blocked(l.weight_scale, l.out_features, l.in_features // 16))

    out = []
    for gate, up, down in layers:
        if gate is None:
            w13, g13 = q(up), up.weight_scale_2
        else:
            w13 = Q(torch.cat([gate.weight, up.weight]), torch.cat([q(gate).scale, q(up).scale]))
            g13 = torch.cat([gate.weight_scale_2.expand(gate.out_features), up.weight_scale_2.expand(up.out_features)])
        out.append(RefExpert(w13, g13, up.input_scale, q(down), down.weight_scale_2, down.input_scale))
    return out


def check(out, ref, out_dtype=torch.bfloat16):
    err = (out.double() - ref).abs()
    tol = moe_tolerance(ref, out_dtype)
    assert bool((err <= tol).all()), f"max err {err.max().item():.3g}, worst ratio {(err / tol).max().item():.3g}"


CASES = [
    # activation, w4a4, per-expert input scales, unequal gate/up scale_2
    ("silu_mul", True, False, False),
    ("silu_mul", True, True, True),
    ("silu_mul", False, False, True),
    ("relu2", True, True, False),
    ("silu", False, False, False),
]


@pytest.mark.parametrize("activation,w4a4,per_expert_ins,row_alpha", CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_emulated_matches_fp64_reference(activation, w4a4, per_expert_ins, row_alpha, seed):
    layers = make_experts(activation=activation, w4a4=w4a4, per_expert_ins=per_expert_ins, row_alpha=row_alpha)
    mod = NVFP4Experts.from_linears(layers, activation)
    assert (mod.w13_scale_2.dim() == 2) == row_alpha
    x = torch.randn(M, H).to(torch.bfloat16)
    ids = torch.randint(0, E, (M, K), dtype=torch.int32)
    ids[1, 1] = -1  # an empty slot
    wts = torch.rand(M, K)
    out = mod(x, ids, wts)
    assert out.dtype == torch.bfloat16 and out.shape == (M, H) and mod.last_path == "emulated"
    check(out, ref_moe_fp64(x, ids, wts, ref_experts(layers), activation))


def test_expert_map_shared_residual_out_dtype(seed):
    layers = make_experts(per_expert_ins=True)
    emap = torch.tensor([-1, 2, -1, 0, 1, 3, -1, -1], dtype=torch.int32)  # 8 global experts, 4 local
    mod = NVFP4Experts.from_linears(layers, expert_map=emap)
    x = torch.randn(M, H).to(torch.bfloat16)
    ids = torch.randint(0, 8, (M, 3), dtype=torch.int32)
    wts = torch.rand(M, 3)
    shared, res = torch.randn(M, H).to(torch.bfloat16), torch.randn(M, H).to(torch.bfloat16)
    for out_dtype in (torch.bfloat16, torch.float32):
        out = torch.ops.nvgemm.nvfp4_moe(x, ids, wts, *mod.tensors(), "silu_mul", False, emap, shared, res, out_dtype)
        assert out.dtype == out_dtype
        check(out, ref_moe_fp64(x, ids, wts, ref_experts(layers), "silu_mul", False, emap, shared, res), out_dtype)
    # EP slicing: experts not on this rank contribute nothing (sglang#36597: scales not sliced)
    only_off = torch.tensor([[0], [2], [6]], dtype=torch.int32).expand(3, 1).contiguous()
    z = torch.ops.nvgemm.nvfp4_moe(x[:3], only_off, torch.ones(3, 1), *mod.tensors(), "silu_mul", False, emap,
                                   None, None, None)
    assert bool((z == 0).all())


def test_expert_parallel_slices_sum_to_the_full_layer(seed):
    """EP: two ranks holding disjoint experts (with their own per-expert input scales, sliced with the
    weights; sglang#36597 forgot to slice them) reproduce the full layer. Top-1 with out_dtype fp32:
    each token's output comes from exactly one rank, so the sum is bitwise the full output."""
    full = NVFP4Experts.from_linears(make_experts(e=6, per_expert_ins=True))
    ranks = [full.slice_experts([0, 2, 4]), full.slice_experts([5, 3, 1])]
    assert torch.equal(ranks[1].w13_input_scale, full.w13_input_scale[[5, 3, 1]])
    x = torch.randn(9, H).to(torch.bfloat16)
    ids = torch.randint(0, 6, (9, 1), dtype=torch.int32)
    wts = torch.rand(9, 1)

    def run(m):
        return torch.ops.nvgemm.nvfp4_moe(x, ids, wts, *m.tensors(), "silu_mul", False, m.expert_map, None, None,
                                          torch.float32)

    assert torch.equal(run(ranks[0]) + run(ranks[1]), run(full))
    with pytest.raises(ValueError, match="must be distinct ids"):
        full.slice_experts([0, 0])


def test_batch_invariance(seed):
    """flashinfer#3559 (output depended on batch composition): a token's output is the same alone and
    inside a batch of 64. The emulated op is exactly batch-invariant; kernels must be within an M bucket."""
    mod = NVFP4Experts.from_linears(make_experts(e=8))
    x = torch.randn(64, H).to(torch.bfloat16)
    ids = torch.randint(0, 8, (64, 2), dtype=torch.int32)
    wts = torch.rand(64, 2)
    full = mod(x, ids, wts)
    for t in (0, 17, 63):
        assert torch.equal(mod(x[t : t + 1], ids[t : t + 1], wts[t : t + 1])[0], full[t])


def test_slot_order_sum_single_rounding(seed):
    """Contract step 5, bitwise: the K-slot output equals the fp32 sum over slots (in order) of the
    one-slot outputs computed with out_dtype=fp32 and weight 1, times the weights, rounded once."""
    mod = NVFP4Experts.from_linears(make_experts())
    x = torch.randn(M, H).to(torch.bfloat16)
    ids = torch.randint(0, E, (M, 3), dtype=torch.int32)
    wts = torch.rand(M, 3) * 2
    shared = torch.randn(M, H).to(torch.bfloat16)
    got = torch.ops.nvgemm.nvfp4_moe(x, ids, wts, *mod.tensors(), "silu_mul", False, None, shared, None, None)
    acc = torch.zeros(M, H)
    for s in range(3):
        y = torch.ops.nvgemm.nvfp4_moe(x, ids[:, s : s + 1].contiguous(), torch.ones(M, 1), *mod.tensors(),
                                       "silu_mul", False, None, None, None, torch.float32)
        acc = acc + wts[:, s : s + 1] * y
    assert torch.equal(got, (acc + shared.float()).to(torch.bfloat16))


def test_router_weight_on_input_applied_once_before_quantization(seed):
    """Llama-4: the top-1 weight scales the input (then rounded and quantized), and never the output
    (vLLM #43694: CUTLASS applied it twice; Marlin before #20457 ignored it)."""
    layers = make_experts()
    mod = NVFP4Experts.from_linears(layers, router_weight_on_input=True)
    x = torch.randn(M, H).to(torch.bfloat16)
    ids = torch.randint(0, E, (M, 1), dtype=torch.int32)
    wts = torch.rand(M, 1) * 0.5 + 0.1
    out = mod(x, ids, wts)
    ref = ref_moe_fp64(x, ids, wts, ref_experts(layers), router_weight_on_input=True)
    check(out, ref)
    twice = ref_moe_fp64((x.float() * wts).to(torch.bfloat16), ids, wts, ref_experts(layers))
    on_output = ref_moe_fp64(x, ids, wts, ref_experts(layers))
    for wrong in (twice, on_output):  # the alternatives are far outside the tolerance
        assert bool(((out.double() - wrong).abs() > moe_tolerance(wrong)).any())


def test_unequal_gate_up_input_scale_refused():
    gate = NVFP4Linear.from_linear(_lin(H, I, 1.0), 0.01)
    up = NVFP4Linear.from_linear(_lin(H, I, 1.0), 0.02)
    down = NVFP4Linear.from_linear(_lin(I, H, 1.0), 0.01)
    with pytest.raises(ValueError, match="expert 0 gate/up.*unequal input_scale"):
        NVFP4Experts.from_linears([(gate, up, down)])


def test_opcheck():
    mod = NVFP4Experts.from_linears(make_experts(row_alpha=True, per_expert_ins=True))
    t = list(mod.tensors())
    t[1], t[5] = t[1].view(torch.uint8), t[5].view(torch.uint8)  # fp8 lacks CPU compare kernels
    x = torch.randn(3, H).to(torch.bfloat16)
    ids = torch.tensor([[0, 3], [1, -1], [2, 2]], dtype=torch.int32)
    wts = torch.rand(3, 2)
    emap = torch.tensor([3, 2, 1, 0], dtype=torch.int32)
    for args in [(x, ids, wts, *t, "silu_mul", False, None, None, None, None),
                 (x, ids, wts, *t, "silu_mul", False, emap, x, x, torch.float32),
                 (x, ids[:, :1].contiguous(), wts[:, :1].contiguous(), *t, "silu_mul", True, None, None, None, None)]:
        torch.library.opcheck(torch.ops.nvgemm.nvfp4_moe.default, args)


# ----------------------------------------------------------------------------- backend registry


@pytest.fixture
def registry():
    saved = dict(reg._REGISTRY["moe"])
    mb._CHECKED.clear()
    yield
    reg._REGISTRY["moe"].clear()
    reg._REGISTRY["moe"].update(saved)
    mb._CHECKED.clear()


def _call(mod, x, ids, wts):
    return torch.ops.nvgemm.nvfp4_moe(x, ids, wts, *mod.tensors(), "silu_mul", False, None, None, None, None)


def test_registry_selfcheck_and_override(registry, monkeypatch):
    mod = NVFP4Experts.from_linears(make_experts())
    x = torch.randn(M, H).to(torch.bfloat16)
    ids = torch.randint(0, E, (M, K), dtype=torch.int32)
    wts = torch.rand(M, K)
    want = _call(mod, x, ids, wts)
    calls = []

    def wrong(*args):  # drops the top-k weights: a plausible kernel bug
        calls.append(1)
        return reg.registered("moe", "emulated").run(args[0], args[1], torch.ones_like(args[2]), *args[3:])

    reg.register_backend(reg.Backend("wrong", 10, lambda p: None, wrong), "moe")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = _call(mod, x, ids, wts)
    assert torch.equal(got, want) and mb.last_moe_selected() == "emulated" and calls
    assert any("MoE backend wrong disagrees with the emulated MoE op" in str(r.message) for r in w)
    # forced: the wrong backend runs (that is what forcing means) and an unknown name is an error
    monkeypatch.setenv("NVGEMM_MOE_BACKEND", "wrong")
    assert not torch.equal(_call(mod, x, ids, wts), want) and mb.last_moe_selected() == "wrong"
    monkeypatch.setenv("NVGEMM_MOE_BACKEND", "nope")
    with pytest.raises(RuntimeError, match="NVGEMM_MOE_BACKEND='nope' is not a registered MoE backend"):
        _call(mod, x, ids, wts)
    monkeypatch.delenv("NVGEMM_MOE_BACKEND")
    # NVGEMM_BACKEND forces a MoE backend of that name; a linear-only name leaves MoE selection alone
    monkeypatch.setenv("NVGEMM_BACKEND", "wrong")
    assert mb.select_moe_backend(mb_problem(mod, x, ids, wts)).name == "wrong"
    monkeypatch.setenv("NVGEMM_BACKEND", "triton_w4a16")
    assert mb.select_moe_backend(mb_problem(mod, x, ids, wts)).name == "emulated"
    # a correct backend passes the check and serves
    reg.register_backend(reg.Backend("good", 20, lambda p: None, reg.registered("moe", "emulated").run), "moe")
    monkeypatch.delenv("NVGEMM_BACKEND")
    assert torch.equal(_call(mod, x, ids, wts), want) and mb.last_moe_selected() == "good"


def mb_problem(mod, x, ids, wts):
    from nvgemm.ops.moe import check_moe_args

    return check_moe_args(x, ids, wts, *mod.tensors(), "silu_mul", False, None, None, None, None)


@pytest.mark.parametrize("kind", ["expert", "row"])
def test_selfcheck_inputs_are_valid(kind):
    """The first-use check's random problem is a valid call of the op for every problem kind."""
    p = mb.MoeProblem(m=3, top_k=2, num_experts=3, num_global_experts=5, hidden=32, intermediate=16,
                      activation="silu_mul", weight_only=False, alpha13=kind, x_dtype=torch.bfloat16,
                      out_dtype=torch.bfloat16, device_type="cpu", capability=None, router_weight_on_input=False,
                      expert_map=True, shared_out=True, residual=True)
    args = mb.selfcheck_inputs(p, torch.device("cpu"))
    from nvgemm.ops.moe import check_moe_args

    assert check_moe_args(*args) == p
    assert torch.isfinite(reg.registered("moe", "emulated").run(*args).float()).all()


# ----------------------------------------------------------------------------- bad input


def _good():
    mod = NVFP4Experts.from_linears(make_experts(e=3))
    x = torch.randn(2, H).to(torch.bfloat16)
    ids = torch.tensor([[0, 2], [1, 0]], dtype=torch.int32)
    return mod, x, ids, torch.rand(2, 2)


def _run(mod, x, ids, wts, tensors=None, act="silu_mul", rwoi=False, emap=None):
    return torch.ops.nvgemm.nvfp4_moe(x, ids, wts, *(tensors or mod.tensors()), act, rwoi, emap, None, None, None)


def test_bad_input_errors():
    mod, x, ids, wts = _good()
    t = list(mod.tensors())
    cases = [
        (dict(ids=ids.long()), TypeError, "topk_ids must be int32"),
        (dict(ids=torch.tensor([[0, 3], [1, 0]], dtype=torch.int32)), ValueError, r"topk_ids out of range.*3 experts"),
        (dict(ids=torch.tensor([[0, -2], [1, 0]], dtype=torch.int32)), ValueError, "topk_ids out of range"),
        (dict(wts=wts.bfloat16()), TypeError, "topk_weights must be float32"),
        (dict(wts=torch.rand(2, 3)), ValueError, "top-k mismatch"),
        (dict(wts=torch.rand(3, 2)), ValueError, "top-k mismatch"),
        (dict(ids=ids[:1]), ValueError, r"topk_ids must be \[M=2, top_k\]"),
        (dict(rwoi=True), ValueError, "router_weight_on_input needs top_k == 1"),
        (dict(tensors=[*t[:4], t[4][:2], *t[5:]]), ValueError, "expert count mismatch: w13 has 3 experts, w2 has 2"),
        (dict(tensors=[t[0][:, :-16], *t[1:]]), ValueError, "w13 has 48 rows per expert, expected 64"),
        (dict(tensors=[t[0], t[1][:, :-1], *t[2:]]), ValueError, r"w13_scale must have shape \(3, 1, 1, 32, 4, 4\)"),
        # flat per-expert bytes: a flattened linear scale has the same size, so only the tiled shape is taken
        (dict(tensors=[t[0], t[1].reshape(3, -1), *t[2:]]), ValueError, r"w13_scale must have shape"),
        (dict(tensors=[t[0], t[1].float(), *t[2:]]), TypeError, "w13_scale must be float8_e4m3fn"),
        (dict(tensors=[*t[:2], t[2][:2], *t[3:]]), ValueError, "w13_scale_2 must be float32 of shape"),
        (dict(tensors=[*t[:3], t[3][:1], *t[4:]]), ValueError, r"w13_input_scale must be float32 of shape \(3,\)"),
        (dict(tensors=[*t[:3], None, *t[4:]]), ValueError, "give both input scales"),
        (dict(tensors=[t[0].view(torch.int8), *t[1:]]), TypeError, "w13 must be packed uint8"),
        (dict(x=x.float()), TypeError, "x must be bfloat16 or float16"),
        (dict(act="gelu"), ValueError, "activation must be one of"),
        (dict(act="silu"), ValueError, "w13 has 64 rows per expert, expected 32"),
        (dict(emap=torch.tensor([0, 1, 2, 5], dtype=torch.int32)), ValueError, "expert_map values in"),
        (dict(emap=torch.tensor([0, 1, 2], dtype=torch.int64)), TypeError, "expert_map must be 1-D int32"),
    ]
    for kw, exc, msg in cases:
        args = dict(mod=mod, x=x, ids=ids, wts=wts)
        args.update(kw)
        with pytest.raises(exc, match=msg):
            _run(**args)
    with pytest.raises(ValueError, match=r"shared_out must have shape \(2, 64\)"):
        torch.ops.nvgemm.nvfp4_moe(x, ids, wts, *t, "silu_mul", False, None, x[:1], None, None)
    with pytest.raises(TypeError, match="topk_ids must be integers"):
        mod(x, ids.float(), wts)
