"""Autotuning over nvgemm candidates on CPU: benchmarking, M-range dispatch, winners persisted on disk.

CPU has one real candidate (the emulated reference). To exercise the autotuner, the tests
register a second, correct but deliberately slow backend (``test_slow``: the emulated op plus a
200 ms sleep, so it loses by far more than timing noise on a loaded 2-core box -- a sleep costs no
CPU, so other processes cannot shrink the margin; priority below the emulated one so eager dispatch
never picks it). The unbounded range is benchmarked at M = 64 (not 1024), where the emulated op
takes a few ms. The autotuner must
benchmark both, pick the emulated one, and record the result so a *second process* compiling the
same graph does not benchmark again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache, run_and_get_code

import nvgemm
from nvgemm.core.formats import quantize_weight, to_blocked
from nvgemm.ops.linear import nvfp4_linear_emulated

SLOW_BACKEND = textwrap.dedent(
    """
    import time
    from nvgemm.ops.linear import nvfp4_linear_emulated
    from nvgemm.dispatch.registry import Backend, register_backend
    CALLS = {"n": 0}
    def _slow(*args):
        CALLS["n"] += 1
        time.sleep(0.2)
        return nvfp4_linear_emulated(*args)
    register_backend(Backend(name="test_slow", priority=-2000, supports=lambda p: None, run=_slow))
    """
)


def _operands(m: int, n: int = 32, k: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    q = quantize_weight(torch.randn(n, k, generator=g) * 0.1)
    return x, q.packed, to_blocked(q.scale), q.global_scale, torch.tensor(0.002)


def _child_code() -> str:
    """The same compile as the test below, in a fresh process; prints what it benchmarked."""
    return textwrap.dedent(
        """
        import json, torch
        {slow}
        import nvgemm
        from nvgemm.integrations.inductor import lowering
        lowering.split_points = lambda: [8]
        lowering.RANGE_UPPER_BOUND = 64
        from torch._dynamo.utils import counters
        from torch._inductor.utils import run_and_get_code
        import sys; sys.path.insert(0, {here!r})
        from test_inductor_autotune import _operands
        x3, w, ws, ws2, ins = _operands(3)
        def f(x):
            return torch.ops.nvgemm.nvfp4_linear(x, w, ws, ws2, ins)
        patch = {{"max_autotune_gemm_backends": "ATEN"}}
        if hasattr(torch._inductor.config.test_configs, "force_no_impl_grouping"):
            patch["test_configs.force_no_impl_grouping"] = True
        with torch._inductor.config.patch(patch), nvgemm.enabled():
            torch._dynamo.mark_dynamic(x3, 0, min=2, max=256)
            out, codes = run_and_get_code(torch.compile(f, mode="max-autotune", fullgraph=True), x3)
        final = [c for c in codes if ("nvfp4_linear_choice" in c or "nvfp4_linear_autotune" in c)
                 and "benchmark_nvgemm_cutedsl" not in c and "nvgemm_cutedsl_nvfp4_linear_range" not in c]
        print(json.dumps({{"calls": CALLS["n"], "lowered": counters["nvgemm_cutedsl"]["lowered"],
                           "emulated": bool(final) and ("backend:emulated" in final[0]
                                                        or "nvfp4_linear_autotune.default(" in final[0]),
                           "slow": any("backend:test_slow" in c for c in final)}}))
        """
    ).format(slow=SLOW_BACKEND, here=os.path.dirname(os.path.abspath(__file__)))


def test_range_dispatch_autotunes_each_range_serves_all_m_and_persists(monkeypatch, tmp_path):
    """Dynamic M: one compile; each M range autotuned; a runtime torch.cond picks the range; the
    timings land in the on-disk autotune cache, so a second process does not benchmark again."""
    ns: dict = {}
    exec(SLOW_BACKEND, ns)
    from nvgemm.integrations.inductor import lowering
    from nvgemm.dispatch.registry import unregister_backend

    monkeypatch.setattr(lowering, "split_points", lambda: [8])  # two ranges: [1, 8], [9, inf)
    monkeypatch.setattr(lowering, "RANGE_UPPER_BOUND", 64)  # benchmark [9, inf) at M = 64
    try:
        torch._dynamo.reset()
        counters.clear()
        x3, w, ws, ws2, ins = _operands(3)

        def f(x):
            return torch.ops.nvgemm.nvfp4_linear(x, w, ws, ws2, ins)

        patch = dict(max_autotune_gemm_backends="ATEN")
        # Keep one branch per range even though both pick the same winner, so the torch.cond
        # dispatch itself is generated and exercised (torch < 2.12 has no grouping to turn off).
        if hasattr(torch._inductor.config.test_configs, "force_no_impl_grouping"):
            patch["test_configs.force_no_impl_grouping"] = True
        with fresh_cache(dir=str(tmp_path), delete=False), torch._inductor.config.patch(patch), nvgemm.enabled():
            cache_dir = os.environ["TORCHINDUCTOR_CACHE_DIR"]
            cf = torch.compile(f, mode="max-autotune", fullgraph=True)
            # Backed dynamic M (Inductor's subgraph autotuning cannot take unbacked sizes).
            torch._dynamo.mark_dynamic(x3, 0, min=2, max=256)
            out3, codes = run_and_get_code(cf, x3)
            assert ns["CALLS"]["n"] > 0  # the slow candidate was benchmarked
            stats_after_first = dict(counters["stats"])  # includes torch.cond's own branch tracing
            outs = {3: out3}
            for m in (17, 40, 8, 2):  # both ranges, both sides of the split
                xm = _operands(m)[0]
                torch._dynamo.mark_dynamic(xm, 0, min=2, max=256)
                outs[m] = cf(xm)
        # run_and_get_code also returns the candidates' benchmark modules; the graph is the one with
        # the per-range branches of the M dispatch.
        finals = [c for c in codes if ("nvfp4_linear_choice" in c or "nvfp4_linear_autotune" in c)
                  and "benchmark_nvgemm_cutedsl" not in c and "nvgemm_cutedsl_nvfp4_linear_range" not in c]
        assert len(finals) == 1, len(codes)
        code = finals[0]
        grouping_can_be_disabled = hasattr(torch._inductor.config.test_configs, "force_no_impl_grouping")
        assert any("backend:test_slow" in c for c in codes)  # it was a benchmarked candidate
        assert dict(counters["stats"]) == stats_after_first  # no recompile for M = 17, 40, 8, 2
        assert counters["nvgemm_cutedsl"]["lowered"] == 1, dict(counters["nvgemm_cutedsl"])  # no re-autotune
        # the winner: the emulated candidate, or -- on torch < 2.15, where Inductor adds the autotuned
        # op's eager implementation as one more choice -- that eager op (the emulated reference)
        assert "backend:emulated" in code or "nvfp4_linear_autotune.default(" in code
        assert "backend:test_slow" not in code
        if grouping_can_be_disabled:
            assert "cond" in code.lower()  # the M-range dispatch
        # (torch 2.11 always merges ranges with the same winner into one inlined call)
        # choice names say nvgemm_cutedsl, one autotune per M range
        for rng in ("range_1_8", "range_9_inf"):
            assert any(f"nvgemm_cutedsl_nvfp4_linear_{rng}_nvgemm_cutedsl_linear" in c for c in codes), rng
        for m, out in outs.items():
            xm = x3 if m == 3 else _operands(m)[0]
            assert torch.equal(out, nvfp4_linear_emulated(xm, w, ws, ws2, ins, None, None, "none", None)), m
    finally:
        unregister_backend("test_slow")

    # A second process with the same cache dir and the FX-graph cache off lowers the graph again;
    # the autotune cache answers both ranges, nothing is benchmarked, the same winner is compiled.
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir, TORCHINDUCTOR_FX_GRAPH_CACHE="0",
               TORCHINDUCTOR_AUTOGRAD_CACHE="0")
    p = subprocess.run([sys.executable, "-c", _child_code()], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    second = json.loads(p.stdout.strip().splitlines()[-1])
    assert second == {"calls": 0, "lowered": 1, "emulated": True, "slow": False}, second


def test_kernel_backends_offer_one_choice_per_policy_config():
    """On a (hypothetical) B200 / H200 the autotuner sees each policy config of the CuTeDSL backend."""
    import torch

    from nvgemm.integrations.inductor.choices import candidates as choice_candidates
    from nvgemm.dispatch.registry import LinearProblem
    from nvgemm.templates.sm90_w4a16.config import config_from_name as sm90_from_name
    from nvgemm.templates.sm100_w4a4.config import config_from_name as sm100_from_name

    for cap, name, parse, weight_only in (((10, 0), "cutedsl_sm100", sm100_from_name, False),
                                          ((9, 0), "cutedsl_sm90", sm90_from_name, True)):
        p = LinearProblem(m=4, n=4096, k=4096, device_type="cuda", capability=cap, weight_only=weight_only,
                          x_dtype=torch.bfloat16, out_dtype=torch.bfloat16, alpha="scalar", bias=False,
                          activation="none", residual=False)
        keys = [c for c in choice_candidates(p) if c.backend == name]
        assert len(keys) >= 2, keys
        for c in keys:
            assert c.config is not None
            parse(c.config)  # the backend can rebuild the exact config it is asked to run
        assert choice_candidates(p)[-1].key == "backend:emulated"


def test_prepared_weight_linear_is_autotuned_per_m_range(monkeypatch):
    """A layer held in the sm90 layout (what a loaded checkpoint calls on Hopper) is autotuned like
    nvfp4_linear: each M range benchmarked over its candidates (here the slow backend, named in ``choices``,
    against the emulated reference), one graph with the M dispatch, the winner in the compiled code, and every
    M equal to eager bit for bit (both the emulated op on the same re-encoded checkpoint layout)."""
    import warnings

    from torch._inductor.utils import fresh_cache, run_and_get_code

    from nvgemm.dispatch.registry import unregister_backend
    from nvgemm.integrations.inductor import lowering
    from nvgemm.nn.linear import NVFP4Linear

    ns: dict = {}
    exec(SLOW_BACKEND, ns)
    monkeypatch.setattr(lowering, "split_points", lambda: [8])
    monkeypatch.setattr(lowering, "RANGE_UPPER_BOUND", 64)
    x3, w, ws, ws2, _ins = _operands(3)
    mod = NVFP4Linear.from_tensors(w, ws, ws2, None, None)
    mod.prepare_for_sm90("bf16")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the checkpoint layout rebuilt per call off Hopper (warned once)
            torch._dynamo.reset()
            counters.clear()
            patch = dict(max_autotune_gemm_backends="ATEN")
            with fresh_cache(), torch._inductor.config.patch(patch), nvgemm.enabled(choices=["test_slow"]):
                cf = torch.compile(mod, mode="max-autotune", fullgraph=True)
                torch._dynamo.mark_dynamic(x3, 0, min=2, max=256)
                out3, codes = run_and_get_code(cf, x3)
                stats_after_first = dict(counters["stats"])  # includes torch.cond's own branch tracing
                outs = {3: out3}
                for m in (17, 40, 8):
                    xm = _operands(m)[0]
                    torch._dynamo.mark_dynamic(xm, 0, min=2, max=256)
                    outs[m] = cf(xm)
            wants = {m: mod(x3 if m == 3 else _operands(m)[0]) for m in outs}
        assert ns["CALLS"]["n"] > 0  # the slow candidate was benchmarked
        c = counters["nvgemm_cutedsl"]
        assert c["autotuned_nvfp4_linear_sm90_prepared"] == 1 and c["lowered"] == 1, dict(c)
        assert dict(counters["stats"]) == stats_after_first  # no recompile for M = 17, 40, 8
        for rng in ("range_1_8", "range_9_inf"):
            assert any(f"nvgemm_cutedsl_nvfp4_linear_sm90_prepared_{rng}" in code for code in codes), rng
        finals = [code for code in codes if ("nvfp4_linear_sm90_prepared_choice" in code
                                             or "nvfp4_linear_sm90_prepared_autotune" in code)
                  and "benchmark_nvgemm_cutedsl" not in code and "nvgemm_cutedsl_nvfp4_linear_sm90_prepared_range"
                  not in code]
        assert len(finals) == 1, [code[:3000] for code in codes]
        code = finals[0]
        assert "backend:test_slow" not in code
        # the winner: the emulated candidate, or on torch < 2.15 the autotuned op's eager body (the same)
        assert "backend:emulated" in code or "nvfp4_linear_sm90_prepared_autotune.default(" in code
        for m, out in outs.items():
            assert torch.equal(out, wants[m]), m
    finally:
        unregister_backend("test_slow")
