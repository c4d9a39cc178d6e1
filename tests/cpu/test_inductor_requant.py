"""The capture pass's gated-MLP rewrite (:mod:`nvgemm.integrations.inductor.requant`): ``down(silu_mul(gate_up(x)))`` of
``nvgemm::nvfp4_linear`` ops becomes ``nvfp4_linear_requant -> nvfp4_linear_prequant`` when valid.

End to end under ``torch.compile`` on CPU (the emulated backend): the fused ops are in the compiled code and
the result equals eager bit for bit for gate_up's ``silu_mul`` epilogue (the requant contract is exact), and
for a separate ``silu(h[..., :I]) * h[..., I:]`` equals the eager fused chain (``gated_mlp``) bit for bit
(the rewrite's one documented numerics change: one rounding of h instead of three). Graph level
(``make_fx`` + the pass, fast): a second user of the intermediate, a W4A16 layer, an fp32 gate_up output,
the rewrite switched off, and a Hopper device are all left alone."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache, run_and_get_code
from torch.fx.experimental.proxy_tensor import make_fx

import nvgemm
from nvgemm.ops.fused import gated_mlp
from nvgemm.integrations.inductor.capture import capture_nvfp4_linears
from nvgemm.integrations.inductor.demo import _rms

H, I = 64, 48
CPU_PATCH = {"emulate_precision_casts": True, "cpp.vec_isa_ok": False}


def _lin(n, k, act="none", ins=0.002, bias=False, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(k, n, bias=bias).to(torch.bfloat16)
    return nvgemm.NVFP4Linear.from_linear(lin, input_scale=ins, activation=act)


class FusedEpilogueMLP(torch.nn.Module):
    """gate_up with silu_mul in its epilogue (nvgemm's NVFP4GatedMLP / gated layers)."""

    def __init__(self, down_ins=0.0005, bias=False):
        super().__init__()
        self.gu = _lin(2 * I, H, "silu_mul", bias=bias, seed=1)
        self.down = _lin(H, I, ins=down_ins, bias=bias, seed=2)

    def forward(self, x):
        return self.down(self.gu(x))


class SiluMulMLP(torch.nn.Module):
    """gate_up without activation, then silu(h[..., :I]) * h[..., I:] (vLLM's SiluAndMul native forward)."""

    def __init__(self, other_user=False):
        super().__init__()
        self.gu = _lin(2 * I, H, seed=1)
        self.down = _lin(H, I, ins=0.0005, seed=2)
        self.other_user = other_user

    def forward(self, x):
        h = self.gu(x)
        y = self.down(torch.nn.functional.silu(h[..., :I]) * h[..., I:])
        return (y, h.sum(-1)) if self.other_user else y


def _x(shape=(2, 5, H), seed=3):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2).to(torch.bfloat16)


def _compiled(model, x):
    torch._dynamo.reset()
    counters.clear()
    with fresh_cache(), torch._inductor.config.patch(CPU_PATCH), nvgemm.enabled():
        out, codes = run_and_get_code(torch.compile(model, fullgraph=True), x)
    return out, "\n".join(codes), dict(counters["nvgemm_cutedsl"])


def test_compiled_fused_epilogue_mlp_runs_requant_chain_bit_exact():
    model, x = FusedEpilogueMLP(bias=True), _x()
    out, code, c = _compiled(model, x)
    assert c.get("requant_fused") == 1, c
    assert "nvgemm.nvfp4_linear_requant" in code and "nvgemm.nvfp4_linear_prequant" in code
    assert "nvgemm.nvfp4_linear.default" not in code
    assert torch.equal(out, model(x))


def test_compiled_silu_mul_mlp_equals_the_eager_fused_chain():
    model, x = SiluMulMLP(), _x()
    out, code, c = _compiled(model, x)
    assert c.get("requant_fused") == 1, c
    assert "nvgemm.nvfp4_linear_requant" in code
    gu = nvgemm.NVFP4Linear.from_tensors(model.gu.weight, model.gu.weight_scale, model.gu.weight_scale_2,
                                         model.gu.input_scale, activation="silu_mul")
    assert torch.equal(out, gated_mlp(gu, model.down, x))
    # against the graph's own semantics (h, silu and the product each rounded to bf16): down re-quantizes
    # h to FP4, where a 1-ulp move of h can flip one code (up to a third of its block's amax); 10% of the
    # output range, measured 1.2%; a wrong layer or swapped halves is O(100%)
    want = model(x).float()
    assert (out.float() - want).abs().max() <= 0.1 * want.abs().max()


def _graph(model, x):
    """(graph module of ``model`` with its buffers as inputs, traced on fake tensors, the buffers)."""
    from torch.func import functional_call

    bufs = dict(model.named_buffers())
    gm = make_fx(lambda x, b: functional_call(model, b, (x,)), tracing_mode="fake")(x, bufs)
    return gm, bufs


def _targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _rewrite(model, x, **kw):
    gm, bufs = _graph(model, x)
    counters.clear()
    capture_nvfp4_linears(gm.graph, claim_scaled_mm=False, **kw)
    gm.recompile()
    return (lambda x: gm(x, bufs)), gm, dict(counters["nvgemm_cutedsl"])


class Fp32GateUp(FusedEpilogueMLP):
    """gate_up rounds to fp32 (no bf16/fp16 rounding for the requant to reproduce)."""

    def forward(self, x):
        h = torch.ops.nvgemm.nvfp4_linear(x, self.gu.weight, self.gu.weight_scale, self.gu.weight_scale_2,
                                          self.gu.input_scale, None, None, "silu_mul", torch.float32)
        return self.down(h.to(torch.bfloat16))


def test_graph_rewrite_aten_silu_spelling_and_runs():
    model, x = SiluMulMLP(), _x((7, H))
    run, gm, c = _rewrite(model, x)
    t = _targets(gm)
    assert "nvgemm.nvfp4_linear_requant.default" in t and "aten.silu.default" not in t, t
    assert c.get("requant_fused") == 1
    gu = nvgemm.NVFP4Linear.from_tensors(model.gu.weight, model.gu.weight_scale, model.gu.weight_scale_2,
                                         model.gu.input_scale, activation="silu_mul")
    assert torch.equal(run(x), gated_mlp(gu, model.down, x))


@pytest.mark.parametrize("case", ["other_user", "w4a16_down", "fp32_gate_up", "switched_off", "hopper"])
def test_graph_rewrite_refuses(case, monkeypatch):
    kw = {}
    if case == "other_user":
        model = SiluMulMLP(other_user=True)
    elif case == "w4a16_down":
        model = FusedEpilogueMLP(down_ins=None)
    elif case == "fp32_gate_up":
        model = Fp32GateUp()
    elif case == "switched_off":
        model, kw = FusedEpilogueMLP(), {"fuse_requant": False}
    else:  # a CUDA device other than sm_100: the dense kernels serve the plain chain
        model = FusedEpilogueMLP()
        monkeypatch.setattr("nvgemm.dispatch.fused.fused_chain_reason",
                            lambda device: "sm_90 (test)")
    x = _x((4, H))
    run, gm, c = _rewrite(model, x, **kw)
    t = _targets(gm)
    assert "nvgemm.nvfp4_linear_requant.default" not in t and c.get("requant_fused") is None, t
    assert t.count("nvgemm.nvfp4_linear.default") == 2
    if case not in ("switched_off", "fp32_gate_up"):  # (a cast between the two is not a gated chain at all)
        assert c.get("requant_not_fused") == 1, c
    want = model(x)
    got = run(x)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(g, w)


def test_compiled_dynamic_batch_one_graph_for_every_m():
    """Symbolic M (decode sizes and past one 128-token tile): one graph, fused, bit-exact each time."""
    model = FusedEpilogueMLP()
    torch._dynamo.reset()
    counters.clear()
    with fresh_cache(), torch._inductor.config.patch(CPU_PATCH), nvgemm.enabled():
        f = torch.compile(model, fullgraph=True, dynamic=True)
        for m in (3, 130):
            x = _x((m, H), seed=m)
            assert torch.equal(f(x), model(x))
    assert counters["stats"]["unique_graphs"] == 1 and counters["nvgemm_cutedsl"]["requant_fused"] == 1


def test_named_pass_rewrites_the_graph():
    """``nvgemm.fused_requant_pass`` (the pass vLLM resolves by name) runs the same rewrite."""
    model, x = SiluMulMLP(), _x((7, H))
    gm, bufs = _graph(model, x)
    counters.clear()
    nvgemm.fused_requant_pass(gm.graph)
    gm.recompile()
    assert "nvgemm.nvfp4_linear_requant.default" in _targets(gm)
    assert counters["nvgemm_cutedsl"]["requant_fused"] == 1
    gu = nvgemm.NVFP4Linear.from_tensors(model.gu.weight, model.gu.weight_scale, model.gu.weight_scale_2,
                                         model.gu.input_scale, activation="silu_mul")
    assert torch.equal(gm(x, bufs), gated_mlp(gu, model.down, x))


# --------------------------------------------------------------------------- autotuned choices


def _slow_fused_backends(name: str, delay: float):
    """A correct but slow backend of each fused op kind (the emulated op + a sleep: it loses by far more than
    timing noise on a loaded box, and a sleep costs no CPU), and its call counts."""
    import time

    from nvgemm.core.backend import PREQUANT, REQUANT, Backend
    from nvgemm.dispatch.registry import register_backend
    from nvgemm.ops.fused import prequant_emulated, requant_emulated

    calls = {REQUANT: 0, PREQUANT: 0, "quantized": 0}

    def slow(kind, fn):
        def run(*args, **kwargs):  # requant backends also take quantized= (nvfp4_linear_prequant_requant)
            calls[kind] += 1
            calls["quantized"] += kwargs.get("quantized") is not None
            time.sleep(delay)
            return fn(*args, **kwargs)
        return run

    register_backend(Backend(name=name, priority=-2000, supports=lambda p: None,
                             run=slow(REQUANT, requant_emulated)), REQUANT)
    register_backend(Backend(name=name, priority=-2000, supports=lambda p: None,
                             run=slow(PREQUANT, prequant_emulated)), PREQUANT)
    return calls


def _drop_fused_backends(name: str):
    from nvgemm.core.backend import PREQUANT, REQUANT
    from nvgemm.dispatch.registry import unregister_backend

    unregister_backend(name, REQUANT)
    unregister_backend(name, PREQUANT)


def test_requant_and_prequant_are_autotuned_per_m_range(monkeypatch):
    """Under max-autotune, each fused op is benchmarked over its candidates per M range (dynamic M); the compiled
    code calls each op's choice op once with the winner (the emulated reference against a slow backend), the
    timing proxy's graph leaves no trace, and every M gives the eager result bit for bit."""
    from nvgemm.core.backend import PREQUANT, REQUANT
    from nvgemm.integrations.inductor import lowering

    monkeypatch.setattr(lowering, "split_points", lambda: [8])  # two ranges: [1, 8], [9, inf)
    monkeypatch.setattr(lowering, "RANGE_UPPER_BOUND", 16)  # benchmark [9, inf) at M = 16
    # 0.5 s: the emulated candidates take ~0.1 s here, and the box is shared; the slow one must lose every time
    calls = _slow_fused_backends("test_slow_fused", 0.5)
    try:
        model = FusedEpilogueMLP(bias=True)
        torch._dynamo.reset()
        counters.clear()
        x3 = _x((3, H))
        torch._dynamo.mark_dynamic(x3, 0, min=2, max=256)
        patch = dict(CPU_PATCH, max_autotune_gemm_backends="ATEN")
        with fresh_cache(), torch._inductor.config.patch(patch), nvgemm.enabled(choices=["test_slow_fused"]):
            f = torch.compile(model, mode="max-autotune", fullgraph=True)
            out, codes = run_and_get_code(f, x3)
            stats_after_first = dict(counters["stats"])
            outs = {3: out}
            for m in (17, 40, 8):
                xm = _x((m, H), seed=m)
                torch._dynamo.mark_dynamic(xm, 0, min=2, max=256)
                outs[m] = f(xm)
        assert calls[REQUANT] > 0 and calls[PREQUANT] > 0  # the slow candidates were benchmarked
        c = counters["nvgemm_cutedsl"]
        assert c["autotuned_nvfp4_linear_requant"] == 1 and c["autotuned_nvfp4_linear_prequant"] == 1, dict(c)
        assert dict(counters["stats"]) == stats_after_first  # no recompile for the other M
        # run_and_get_code also returns each candidate's benchmark module; the graph calls both ops
        final = [code for code in codes if "nvfp4_linear_requant_choice.default(" in code
                 and "nvfp4_linear_prequant_choice.default(" in code]
        assert len(final) == 1, len(codes)
        code = final[0]
        assert code.count("torch.ops.nvgemm.nvfp4_linear_requant_choice.default(") == 1
        assert code.count("torch.ops.nvgemm.nvfp4_linear_prequant_choice.default(") == 1
        assert "test_slow_fused" not in code, [l for l in code.splitlines() if "test_slow_fused" in l]
        assert code.count("'backend:emulated'") == 2
        for m, o in outs.items():
            xm = x3 if m == 3 else _x((m, H), seed=m)
            assert torch.equal(o, model(xm)), m
    finally:
        _drop_fused_backends("test_slow_fused")


class NormFusedMLP(FusedEpilogueMLP):
    """RMSNorm (Hugging Face form, constant eps) feeding the fused MLP: the layer rewrites turn it into the fused
    norm quantizer -> ``nvfp4_linear_prequant_requant`` (gate_up, activation arriving quantized) -> prequant."""

    def __init__(self):
        super().__init__(bias=True)
        self.ln = torch.nn.Parameter((1 + 0.1 * torch.randn(H, generator=torch.Generator().manual_seed(5)))
                                     .to(torch.bfloat16), requires_grad=False)

    def forward(self, x):
        return super().forward(_rms(x, self.ln))


def test_prequant_requant_is_an_autotuned_choice_per_m_range(monkeypatch):
    """The gate_up GEMM fed by the fused norm quantizer is benchmarked over its candidates per M range like
    requant (a slow requant backend, run with ``quantized=``, against the emulated reference); the compiled code
    calls its choice op once with the winner and never the op itself, and every M gives the eager result bit for
    bit (the norm quantizer's codes are the graph's, the requant contract is exact)."""
    from nvgemm.integrations.inductor import lowering

    monkeypatch.setattr(lowering, "split_points", lambda: [8])
    monkeypatch.setattr(lowering, "RANGE_UPPER_BOUND", 16)
    calls = _slow_fused_backends("test_slow_fused", 0.5)
    try:
        model = NormFusedMLP()
        torch._dynamo.reset()
        counters.clear()
        x3 = _x((3, H))
        torch._dynamo.mark_dynamic(x3, 0, min=2, max=256)
        patch = dict(CPU_PATCH, max_autotune_gemm_backends="ATEN")
        with fresh_cache(), torch._inductor.config.patch(patch), nvgemm.enabled(choices=["test_slow_fused"]):
            f = torch.compile(model, mode="max-autotune", fullgraph=True)
            out, codes = run_and_get_code(f, x3)
            outs = {3: out}
            for m in (17, 8):
                xm = _x((m, H), seed=m)
                torch._dynamo.mark_dynamic(xm, 0, min=2, max=256)
                outs[m] = f(xm)
        assert calls["quantized"] > 0  # the slow candidate was benchmarked on the quantized activation
        c = counters["nvgemm_cutedsl"]
        assert c["norm_quant_fused"] == 1 and c["autotuned_nvfp4_linear_prequant_requant"] == 1, dict(c)
        # run_and_get_code also returns each candidate's benchmark module; the graph calls the quantizer and both ops
        final = [code for code in codes if "nvfp4_linear_prequant_requant_choice.default(" in code
                 and "nvfp4_linear_prequant_choice.default(" in code and "rmsnorm_quantize_nvfp4.default(" in code]
        assert len(final) == 1, len(codes)
        code = final[0]
        assert code.count("torch.ops.nvgemm.nvfp4_linear_prequant_requant_choice.default(") == 1
        assert "nvgemm.nvfp4_linear_prequant_requant.default(" not in code
        assert "test_slow_fused" not in code
        for m, o in outs.items():
            xm = x3 if m == 3 else _x((m, H), seed=m)
            assert torch.equal(o, model(xm)), m
    finally:
        _drop_fused_backends("test_slow_fused")


def test_prequant_requant_choice_runs_the_named_candidate():
    """``nvfp4_linear_prequant_requant_choice`` runs the named requant backend with ``quantized=(packed, scales)``
    (per M range for a range table) and equals the op; the unfused chain (it re-quantizes a bf16 x) is no choice."""
    from nvgemm.core.backend import REQUANT, Backend
    from nvgemm.dispatch.registry import LinearProblem, register_backend, unregister_backend
    from nvgemm.integrations.inductor.choices import prequant_requant_candidates, range_choice
    from nvgemm.ops.fused import requant_emulated

    seen = []
    for name in ("test_a", "test_b"):
        register_backend(Backend(name=name, priority=-2000, supports=lambda p: None,
                                 run=lambda *a, _n=name, **k: (seen.append((_n, "quantized" in k)),
                                                               requant_emulated(*a, **k))[1]), REQUANT)
    try:
        mlp = FusedEpilogueMLP(bias=True)
        gu, down = mlp.gu, mlp.down
        key = range_choice([(8, "backend:test_a"), (None, "backend:test_b")])
        for m, want in ((5, "test_a"), (12, "test_b")):
            x = _x((m, H), seed=m)
            q, scales = torch.ops.nvgemm.quantize_nvfp4(x, gu.input_scale, True)
            args = (q, scales, gu.weight, gu.weight_scale, gu.weight_scale_2, gu.input_scale, gu.bias,
                    down.input_scale, torch.bfloat16)
            seen.clear()
            packed, s = torch.ops.nvgemm.nvfp4_linear_prequant_requant_choice(*args, key)
            ref = torch.ops.nvgemm.nvfp4_linear_prequant_requant(*args)
            assert seen == [(want, True)]
            assert torch.equal(packed, ref[0]) and torch.equal(s.view(torch.uint8), ref[1].view(torch.uint8))
        with pytest.raises(ValueError, match="unknown choice"):
            torch.ops.nvgemm.nvfp4_linear_prequant_requant_choice(*args, "backend:unfused")
        cuda = LinearProblem(m=1, n=2 * I, k=H, device_type="cuda", capability=(9, 0), weight_only=False,
                             x_dtype=torch.bfloat16, out_dtype=torch.bfloat16, alpha="scalar", bias=False,
                             activation="silu_mul", residual=False)
        keys = [c.key for c in prequant_requant_candidates(cuda)]
        assert "backend:unfused" not in keys and keys[-1] == "backend:emulated", keys
    finally:
        for name in ("test_a", "test_b"):
            unregister_backend(name, REQUANT)


def test_range_table_choice_runs_each_ranges_candidate():
    """A range-table choice (per-range winners that differ) runs, for each M, the candidate of M's range."""
    from nvgemm.core.backend import PREQUANT, REQUANT, Backend
    from nvgemm.dispatch.registry import register_backend
    from nvgemm.integrations.inductor.choices import choice_keys, range_choice
    from nvgemm.integrations.inductor.pdl import _is_pdl_kernel
    from nvgemm.ops.fused import prequant_emulated, requant_emulated

    seen = []
    for name in ("test_a", "test_b"):
        register_backend(Backend(name=name, priority=-2000, supports=lambda p: None,
                                 run=lambda *a, _n=name: (seen.append(_n), requant_emulated(*a))[1]), REQUANT)
        register_backend(Backend(name=name, priority=-2000, supports=lambda p: None,
                                 run=lambda *a, _n=name: (seen.append(_n), prequant_emulated(*a))[1]), PREQUANT)
    try:
        key = range_choice([(8, "backend:test_a"), (None, "backend:test_b")])
        assert choice_keys(key) == ["backend:test_a", "backend:test_b"]
        assert not _is_pdl_kernel("backend:emulated") and _is_pdl_kernel("backend:cutedsl_sm100")
        mlp = FusedEpilogueMLP(bias=True)
        gu, down = mlp.gu, mlp.down
        for m, want in ((4, "test_a"), (8, "test_a"), (9, "test_b"), (130, "test_b")):
            x = _x((m, H), seed=m)
            args = (x, gu.weight, gu.weight_scale, gu.weight_scale_2, gu.input_scale, gu.bias, down.input_scale,
                    torch.bfloat16)
            seen.clear()
            packed, scales = torch.ops.nvgemm.nvfp4_linear_requant_choice(*args, key)
            ref = requant_emulated(*args)
            assert seen == [want] and torch.equal(packed, ref[0]) and torch.equal(scales.view(torch.uint8),
                                                                                  ref[1].view(torch.uint8))
            pargs = (packed, scales, down.weight, down.weight_scale, down.weight_scale_2, down.input_scale, down.bias,
                     None, torch.bfloat16)
            seen.clear()
            y = torch.ops.nvgemm.nvfp4_linear_prequant_choice(*pargs, key)
            assert seen == [want] and torch.equal(y, prequant_emulated(*pargs))
    finally:
        for name in ("test_a", "test_b"):
            _drop_fused_backends(name)
