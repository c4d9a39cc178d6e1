"""Opt-in registration: nothing at import, enable/disable/enabled restore PyTorch's own state."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import nvgemm
import nvgemm.integrations.inductor as ni
from nvgemm.integrations.inductor import choices as ch
from nvgemm.dispatch.registry import LinearProblem


def test_import_does_not_touch_inductor():
    code = (
        "import sys, nvgemm, nvgemm.integrations.inductor; "
        "bad = [m for m in sys.modules if m.startswith('torch._inductor')]; "
        "assert not bad, bad[:5]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _inductor_state():
    from torch._inductor import config
    from torch._inductor.scheduler import Scheduler

    from nvgemm.integrations.inductor import compat

    try:
        from torch._inductor.codegen.nv_universal_gemm.nv_universal_gemm_scheduling import NVUniversalGemmScheduling

        pdl_pred = NVUniversalGemmScheduling.__dict__.get("is_pdl_enabled_template")
    except ImportError:  # torch < 2.14 has no in-tree NVGEMM scheduling
        pdl_pred = None
    return (
        config.post_grad_custom_pre_pass,
        compat.lowering_table().get(torch.ops.nvgemm.nvfp4_linear.default),
        pdl_pred,
        Scheduler.__dict__.get("codegen_extern_call"),
        "previous_node" in Scheduler.__dict__,
    )


def test_enable_disable_roundtrip_and_context_manager():
    before = _inductor_state()
    assert not ni.is_enabled()
    nvgemm.enable()
    nvgemm.enable()  # idempotent
    st = _inductor_state()
    assert ni.is_enabled()
    from nvgemm.integrations.inductor import compat

    assert st[0] is not None and st[1] is not None and st[4] == compat.available("pdl_hook")
    assert st[1].__name__ == "nvgemm_cutedsl_lowering"
    nvgemm.disable()
    nvgemm.disable()
    assert _inductor_state() == before
    with nvgemm.enabled():
        assert ni.is_enabled()
    assert not ni.is_enabled() and _inductor_state() == before


def test_user_pass_is_kept_and_ours_runs_first():
    from torch._inductor import config

    calls = []

    def user_pass(graph):
        calls.append(graph)

    with torch._inductor.config.patch(post_grad_custom_pre_pass=user_pass):
        with nvgemm.enabled():
            p = config.post_grad_custom_pre_pass
            assert isinstance(p, list) and p[1] is user_pass and type(p[0]).__name__ == "NvgemmCapturePass"
            assert isinstance(p[0].uuid(), bytes)
        assert config.post_grad_custom_pre_pass is user_pass


def _fake_missing(monkeypatch, **reasons):
    """Make the named compat pieces probe as missing (the rest probe the running torch)."""
    from nvgemm.integrations.inductor import compat

    real = compat.Piece.missing

    def missing(self):
        return reasons[self.name] if self.name in reasons else real(self)

    monkeypatch.setattr(compat.Piece, "missing", missing)


def test_missing_required_piece_is_refused_by_name(monkeypatch):
    before = _inductor_state()
    _fake_missing(monkeypatch, custom_op_autotuning="no range dispatch (simulated)")
    with pytest.raises(RuntimeError, match=r"custom_op_autotuning .*torch >= 2\.11 has it.*simulated"):
        nvgemm.enable()
    assert not ni.is_enabled() and _inductor_state() == before
    # the rest of nvgemm keeps working on such a torch
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    lin = nvgemm.NVFP4Linear.from_linear(torch.nn.Linear(64, 32, dtype=torch.bfloat16))
    assert lin(x).shape == (3, 32)


def test_missing_optional_pdl_hook_warns_once_and_enables_without_it(monkeypatch):
    from torch._inductor.scheduler import Scheduler

    from nvgemm.integrations.inductor import registration

    monkeypatch.setattr(registration, "_WARNED", set())
    _fake_missing(monkeypatch, pdl_hook="no selective PDL (simulated)")
    prev_node = Scheduler.__dict__.get("previous_node")
    with pytest.warns(RuntimeWarning, match=r"no PDL chain .*torch >= 2\.15.*simulated"):
        nvgemm.enable()
    try:
        assert ni.is_enabled() and registration._STATE["pdl"] is False
        assert Scheduler.__dict__.get("previous_node") is prev_node  # PDL hook not installed
    finally:
        nvgemm.disable()


def test_probes_match_the_documented_first_release():
    """Each piece is present exactly on the torch releases the compat table says (runs per CI torch)."""
    from packaging.version import Version

    from nvgemm.integrations.inductor import compat

    rel = Version(torch.__version__.split("+")[0]).release[:2]
    state = compat.probe()
    for p in compat.PIECES:
        since = tuple(int(v) for v in p.since.split("."))
        assert (state[p.name] is None) == (rel >= since), (p.name, torch.__version__, state[p.name])
    assert "custom_op_autotuning" in compat.report()


def test_scaled_mm_claim_defaults_to_where_pytorch_folds(monkeypatch):
    from nvgemm.integrations.inductor import compat, registration

    with nvgemm.enabled():
        assert registration._STATE["claim_scaled_mm"] is compat.available("scaled_mm_fold")
    _fake_missing(monkeypatch, scaled_mm_fold="no fold (simulated)")
    with nvgemm.enabled():
        assert registration._STATE["claim_scaled_mm"] is False
    nvgemm.enable(claim_scaled_mm=True)
    try:
        assert registration._STATE["claim_scaled_mm"] is True
    finally:
        nvgemm.disable()


def _problem(**kw):
    base = dict(m=4, n=256, k=128, device_type="cpu", capability=None, weight_only=False,
                x_dtype=torch.bfloat16, out_dtype=torch.bfloat16, alpha="scalar", bias=False,
                activation="none", residual=False)
    base.update(kw)
    return LinearProblem(**base)


def test_candidates_policy():
    cpu = ch.candidates(_problem())
    assert cpu[-1].key == ch.EMULATED  # always present, always last
    assert all(c.key != ch.CUBLASLT for c in cpu)
    b200 = _problem(device_type="cuda", capability=(10, 0))
    assert ch.cublaslt_supported(b200) is None
    assert "W4A4" in ch.cublaslt_supported(_problem(device_type="cuda", capability=(10, 0), weight_only=True))
    assert "sm_100" in ch.cublaslt_supported(_problem(device_type="cuda", capability=(9, 0)))
    assert ch.CUBLASLT in [c.key for c in ch.candidates(b200)]
    assert [c.key for c in ch.candidates(b200, allowed={"emulated"})] == [ch.EMULATED]


def test_forced_only_backends_are_not_autotune_choices():
    """The PTX emulator's backends support CPU problems but run only when forced: inside
    torch.compile they were benchmarked as choices (seconds per call, and 2-CTA picks the emulator
    then refused). Named in ``allowed`` they are still offered."""
    from nvgemm import emulator
    from nvgemm.dispatch.registry import backends

    emulator.enable()  # opt-in: registered only when asked for
    names = {b.name for b in backends()}
    assert {"emu_sm90", "emu_sm100"} <= names
    keys = [c.key for c in ch.candidates(_problem())]
    assert not any(k.startswith("backend:emu_") for k in keys), keys
    assert any(k.startswith("backend:emu_sm100") for k in
               (c.key for c in ch.candidates(_problem(), allowed={"emu_sm100", "emulated"})))


def test_choice_keys_and_arg_rebuild():
    c = ch.Candidate("backend:cutedsl_sm100:nvgemm_cutedsl_sm100_nvfp4_t128x8x256_c1x1_swapab_pdl")
    assert (c.kind, c.backend, c.config) == ("backend", "cutedsl_sm100", "nvgemm_cutedsl_sm100_nvfp4_t128x8x256_c1x1_swapab_pdl")
    x, w, ws, ws2, b, r = (torch.empty(1) for _ in range(6))
    # W4A16 with a bias: the packed form puts the bias first, no None before a present tensor
    full = [x, w, ws, ws2, None, b, None, "silu", None]
    packed = ch.pack_linear_args(full)
    assert packed[4] is b and packed[5] is None and packed[6] is None and packed[7] == "bias"
    # what the autotuner passes: present tensors positionally, the rest by name
    args = ch.linear_args_from((x, w, ws, ws2, b), {"t1": None, "t2": None, "slots": "bias", "activation": "silu",
                                                    "out_dtype": None})
    assert args[0] is x and args[4] is None and args[5] is b and args[6] is None and args[7] == "silu"
    assert ch.unpack_linear_args(*ch.pack_linear_args([x, w, ws, ws2, None, None, r, "none", None])) == \
        [x, w, ws, ws2, None, None, r, "none", None]
    with pytest.raises(ValueError, match="unexpected tensor"):
        ch.linear_args_from((x, w, ws, ws2, b, b, b, b), {"slots": "input_scale,bias,residual", "activation": "none",
                                                          "out_dtype": None})
    with pytest.raises(ValueError, match="bad slots"):
        ch.unpack_linear_args(x, w, ws, ws2, b, None, None, "bias,bias", "none", None)


def test_autotune_op_eager_matches_the_linear_with_gapped_optionals():
    """The op torch < 2.15 benchmarks as its fallback: present optionals packed, gaps (W4A16 + bias) exact."""
    from nvgemm.core.formats import quantize_weight, to_blocked

    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    q = quantize_weight(torch.randn(32, 64, generator=g) * 0.1)
    bias = torch.randn(32, generator=g).to(torch.bfloat16)
    res = torch.randn(3, 32, generator=g).to(torch.bfloat16)
    for ins, b, r in ((None, bias, None), (torch.tensor(0.002), None, res), (None, bias, res)):
        full = [x, q.packed, to_blocked(q.scale), q.global_scale, ins, b, r, "silu", None]
        want = torch.ops.nvgemm.nvfp4_linear(*full)
        got = torch.ops.nvgemm.nvfp4_linear_autotune(*ch.pack_linear_args(full), choice=ch.EMULATED)
        assert torch.equal(got, want)
        # Inductor's 2.11-2.14 fallback call: tensors positionally, every other argument by name
        packed = ch.pack_linear_args(full)
        tensors = [a for a in packed[:7] if a is not None]
        kw = {n: a for n, a in zip(ch.AUTOTUNE_ARG_NAMES, packed) if not isinstance(a, torch.Tensor)}
        assert torch.equal(torch.ops.nvgemm.nvfp4_linear_autotune(*tensors, **kw, choice=ch.EMULATED), want)


def test_split_points_follow_heuristics_buckets():
    from nvgemm.integrations.inductor.lowering import DEFAULT_SPLIT_POINTS, split_points

    pts = split_points()
    assert pts == sorted(pts) and pts[0] >= 1
    try:
        from nvgemm.heuristics import m_buckets
    except ImportError:
        assert pts == list(DEFAULT_SPLIT_POINTS)
    else:
        assert pts == [hi for _, hi in m_buckets()]


def test_choice_op_runs_named_backend_and_rejects_unknown():
    from nvgemm.core.formats import quantize_weight, to_blocked
    from nvgemm.ops.linear import nvfp4_linear_emulated

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    q = quantize_weight(torch.randn(32, 64, generator=g))
    ins = torch.tensor(0.002)
    args = (x, q.packed, to_blocked(q.scale), q.global_scale, ins, None, None, "none", None)
    out = torch.ops.nvgemm.nvfp4_linear_choice(*args, "backend:emulated")
    assert torch.equal(out, nvfp4_linear_emulated(*args))
    with pytest.raises(RuntimeError, match="not registered"):
        torch.ops.nvgemm.nvfp4_linear_choice(*args, "backend:no_such_backend")
    with pytest.raises(ValueError, match="unknown choice"):
        torch.ops.nvgemm.nvfp4_linear_choice(*args, "bogus")


def test_dynamic_compile_with_weights_as_graph_inputs(tmp_path):
    """torch.compile(dynamic=True) with the weight as a graph input makes N and K symbolic on the second
    weight shape; the lowering raised 'Cannot convert symbols to int'. N and K are now specialised with
    a guard (the kernel is chosen per weight shape), M stays dynamic."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache

    from nvgemm.core.formats import quantize_weight, to_blocked
    from nvgemm.ops.linear import nvfp4_linear_emulated

    def f(x, w, ws, ws2, ins):
        return torch.ops.nvgemm.nvfp4_linear(x, w, ws, ws2, ins, None, None, "none", None)

    torch._dynamo.reset()
    counters.clear()
    g = torch.Generator().manual_seed(0)
    with fresh_cache(dir=str(tmp_path), delete=False), nvgemm.enabled():
        cf = torch.compile(f, dynamic=True)
        for (n, k), m in (((64, 64), 3), ((64, 64), 5), ((96, 128), 4), ((32, 256), 7)):
            q = quantize_weight(torch.randn(n, k, generator=g))
            args = (torch.randn(m, k, generator=g).bfloat16(), q.packed, to_blocked(q.scale), q.global_scale,
                    torch.tensor(0.01))
            assert torch.equal(cf(*args), nvfp4_linear_emulated(*args, None, None, "none", None))
    assert counters["nvgemm_cutedsl"]["lowered"] >= 2  # the nvgemm lowering ran for the symbolic shapes
    torch._dynamo.reset()
