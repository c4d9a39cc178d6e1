"""torch.compile of NVFP4 MoE with nvgemm enabled (CPU: the emulated MoE backend, plus a slow test backend).

* A tiny MoE model (router, routed NVFP4 experts, a shared expert, two layers) compiles once with
  ``mode="max-autotune"`` and a dynamic batch, and serves batch 1, 3, 8 and 17 without recompiling.
  The MoE op itself is bit-identical to eager (same emulated backend, same operands); the whole
  model is compared to eager within a tolerance because Inductor fuses the router's fp32
  softmax / normalisation differently (ulp-level weight differences, see the test).
* ``nvgemm::nvfp4_moe`` is autotuned per M range like ``nvfp4_linear``: with a second, correct but
  deliberately slow MoE backend registered, each range benchmarks both, the emulated one wins, and a
  runtime ``torch.cond`` over M dispatches the ranges.
"""

from __future__ import annotations

import time

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache, run_and_get_code

import nvgemm
from nvgemm.nn.experts import NVFP4Experts
from nvgemm.dispatch.registry import Backend, register_backend, unregister_backend
from nvgemm.ops.moe import nvfp4_moe_emulated

E, H, I, TOPK = 4, 64, 32, 2
BATCHES = (1, 3, 8, 17)
#: as tests/cpu/test_inductor_llama.py: Inductor CPU code rounding like eager
CPU_PATCH = {"max_autotune_gemm_backends": "ATEN", "emulate_precision_casts": True, "cpp.vec_isa_ok": False}


def _experts(seed: int, w4a4: bool = True) -> NVFP4Experts:
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(E, 2 * I, H, generator=g) * 0.1
    w2 = torch.randn(E, H, I, generator=g) * 0.1
    return NVFP4Experts.from_float(w13, w2, 4.0 / 2688 if w4a4 else None, 0.5 / 2688 if w4a4 else None)


class TinyMoE(torch.nn.Module):
    """Two MoE blocks: softmax top-2 router (renormalised), routed NVFP4 experts, a bf16 shared expert,
    the residual added by the op."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.routers = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(E, H, generator=g), requires_grad=False) for _ in range(2)])
        self.shared = torch.nn.ModuleList([torch.nn.Linear(H, H, bias=False).to(torch.bfloat16) for _ in range(2)])
        self.experts = torch.nn.ModuleList([_experts(1, True), _experts(2, False)])

    def forward(self, x):
        for router, shared, experts in zip(self.routers, self.shared, self.experts):
            logits = x.float() @ router.t()
            w, ids = torch.topk(torch.softmax(logits, -1), TOPK, -1)
            w = w / w.sum(-1, keepdim=True)
            x = experts(x, ids, w, shared_out=shared(x), residual=x)
        return x


def _mark(*ts):
    """Unbacked batch dim (M = 1 would otherwise specialise), as the Llama compile test does."""
    import inspect

    mark = torch._dynamo.decorators.mark_unbacked
    bounds = {"min": 1, "max": 256} if "min" in inspect.signature(mark).parameters else {}
    for t in ts:
        mark(t, 0, **bounds)


def _x(m: int, seed: int = 5) -> torch.Tensor:
    return torch.randn(m, H, generator=torch.Generator().manual_seed(seed + m)).bfloat16()


def test_moe_op_compiles_once_and_is_bit_exact():
    ex = _experts(3)
    g = torch.Generator().manual_seed(4)

    def f(x, ids, w, res):
        for t in (ids, w, res):  # separately marked unbacked sizes: tell the compiler they are all M
            torch._check(t.shape[0] == x.shape[0])
        return torch.ops.nvgemm.nvfp4_moe(x, ids, w, *ex.tensors(), "silu_mul", False, None, None, res, None)

    torch._dynamo.reset()
    counters.clear()
    with fresh_cache(), torch._inductor.config.patch(CPU_PATCH), nvgemm.enabled():
        cf = torch.compile(f, mode="max-autotune", fullgraph=True)
        for m in BATCHES:
            x = _x(m)
            ids = torch.stack([torch.randperm(E, generator=g)[:TOPK] for _ in range(m)]).to(torch.int32)
            w = torch.rand(m, TOPK, generator=g)
            res = _x(m, 9)
            _mark(x, ids, w, res)
            out = cf(x, ids, w, res)
            want = nvfp4_moe_emulated(x, ids, w, *ex.tensors(), "silu_mul", False, None, None, res, None)
            assert torch.equal(out, want), m
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert counters["nvgemm_cutedsl"]["moe_lowered"] == 1  # nvgemm's lowering served the op, once


def test_tiny_moe_model_compiles_once_and_matches_eager():
    model = TinyMoE().eval()
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad(), fresh_cache(), torch._inductor.config.patch(CPU_PATCH), nvgemm.enabled():
        cf = torch.compile(model, mode="max-autotune", fullgraph=True)
        for m in BATCHES:
            x = _x(m)
            ref = model(x)
            _mark(x)
            out = cf(x)
            # Inductor computes the router's softmax / renormalisation in a fused kernel whose fp32
            # results can differ from eager by an ulp; each MoE output moves by about that relative
            # amount before its bf16 rounding (one bf16 ulp = 2^-8 relative), and the second layer sees
            # those inputs: require >= 95 % identical outputs and a 2^-7 relative max-norm deviation
            # (a wrong expert, weight or missing residual is off by O(1)).
            same = float((out == ref).float().mean())
            rel = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
            assert same >= 0.95 and rel <= 2.0**-7, (m, same, rel)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert counters["nvgemm_cutedsl"]["moe_lowered"] == 2  # both MoE layers lowered by nvgemm


def test_moe_is_autotuned_per_m_range(monkeypatch):
    """A slow, correct backend is benchmarked in each M range and loses to the emulated op."""
    calls = {"n": 0}

    def slow(*args):
        calls["n"] += 1
        time.sleep(0.2)
        return nvfp4_moe_emulated(*args)

    from nvgemm.integrations.inductor import lowering

    monkeypatch.setattr(lowering, "split_points", lambda: [8])  # ranges [1, 8], [9, inf)
    monkeypatch.setattr(lowering, "RANGE_UPPER_BOUND", 32)
    register_backend(Backend(name="test_slow_moe", priority=-2000, supports=lambda p: None, run=slow), "moe")
    ex = _experts(6)
    try:
        def f(x, ids, w):
            return torch.ops.nvgemm.nvfp4_moe(x, ids, w, *ex.tensors(), "silu_mul", False, None, None, None, None)

        torch._dynamo.reset()
        counters.clear()
        patch = dict(max_autotune_gemm_backends="ATEN")
        if hasattr(torch._inductor.config.test_configs, "force_no_impl_grouping"):
            patch["test_configs.force_no_impl_grouping"] = True
        g = torch.Generator().manual_seed(7)

        def routing(m):
            return (torch.stack([torch.randperm(E, generator=g)[:TOPK] for _ in range(m)]).to(torch.int32),
                    torch.rand(m, TOPK, generator=g))

        with fresh_cache(), torch._inductor.config.patch(patch), nvgemm.enabled():
            cf = torch.compile(f, mode="max-autotune", fullgraph=True)
            x3, (ids3, w3) = _x(3), routing(3)
            for t in (x3, ids3, w3):
                torch._dynamo.mark_dynamic(t, 0, min=2, max=256)
            out3, codes = run_and_get_code(cf, x3, ids3, w3)
            benchmarked = calls["n"]
            outs = {3: (out3, x3, ids3, w3)}
            for m in (17, 8, 2):
                xm, (idm, wm) = _x(m), routing(m)
                for t in (xm, idm, wm):
                    torch._dynamo.mark_dynamic(t, 0, min=2, max=256)
                outs[m] = (cf(xm, idm, wm), xm, idm, wm)
        assert benchmarked > 0, "the slow candidate was never benchmarked"
        assert counters["nvgemm_cutedsl"]["moe_lowered"] == 1
        for rng in ("range_1_8", "range_9_inf"):
            assert any(f"nvgemm_cutedsl_nvfp4_moe_{rng}" in c for c in codes), rng
        final = [c for c in codes if "nvfp4_moe_choice" in c or "nvfp4_moe_autotune" in c]
        final = [c for c in final if "benchmark_nvgemm_cutedsl" not in c and "nvgemm_cutedsl_nvfp4_moe_range" not in c]
        assert len(final) == 1, len(codes)
        # the winner: the emulated candidate, or the autotuned op's eager body (the emulated reference) when
        # Inductor inlines it (as in test_inductor_autotune); never the slow candidate
        chosen = [line.strip() for line in final[0].splitlines() if "nvfp4_moe_choice.default(" in line
                  or "nvfp4_moe_autotune.default(" in line]
        assert chosen, "no MoE call in the compiled graph"
        assert all("backend:test_slow_moe" not in c for c in chosen), chosen
        assert all("backend:emulated" in c or "nvfp4_moe_autotune.default(" in c for c in chosen), chosen
        if hasattr(torch._inductor.config.test_configs, "force_no_impl_grouping"):
            assert "cond" in final[0].lower()  # the runtime M-range dispatch
        for m, (out, xm, idm, wm) in outs.items():
            want = nvfp4_moe_emulated(xm, idm, wm, *ex.tensors(), "silu_mul", False, None, None, None, None)
            assert torch.equal(out, want), m
    finally:
        unregister_backend("test_slow_moe", "moe")


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
