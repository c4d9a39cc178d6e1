"""Host side of the sm100 NVFP4 family (nvgemm.templates.sm100_w4a4.launch / validity / occupancy and
the nvgemm.templates.sm100_w4a4.backend wiring), tested on CPU.

``prepare_sm100_args`` builds the kernel's arguments (activation quantization to swizzled
scales, swap-AB operand/scale roles and the transposed output view, alpha, split-K buffers);
``kernel_view_ref`` evaluates the kernel's math on exactly those arguments. Both must agree
with the emulated op (the reference every kernel is tested against).

Tolerance: both sides decode the same exact operands (E2M1 x e4m3 products are exact in
fp32) and sum K products in fp32; only the summation order differs (A@B^T vs (B@A^T)^T), a
difference <= K * 2^-24 * sum|a*b| — far below half an output ulp, so at most a one-ulp flip
of the final rounding: rtol = one ulp of the output dtype, atol = K*2^-24*max|acc| slack.
"""

import hashlib
import itertools

import pytest
import torch

import nvgemm  # noqa: F401  (registers the ops)
from nvgemm.epilogues import EpilogueSpec, epilogue_ref
from nvgemm.core.formats import quantize_weight, to_blocked
from nvgemm.ops.linear import nvfp4_linear_emulated
from nvgemm.dispatch.registry import LinearProblem
from nvgemm.core.validation import check_linear_args
from nvgemm.templates.sm100_w4a4.backend import supports
from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig
from nvgemm.templates.sm100_w4a4.launch import kernel_view_ref, splitk_workspace_shape
from nvgemm.templates.sm100_w4a4.launch import prepare_sm100_args as _prepare


def prepare_sm100_args(*call_and_cfg, **kw):
    """The launcher on one ``nvfp4_linear`` call (validated by the op's own checker first)."""
    *call, cfg = call_and_cfg
    spec = check_linear_args(*call)
    return _prepare(*call[:7], spec, cfg, **kw)

ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


@pytest.fixture
def seed(request):
    s = int(hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:8], 16)
    torch.manual_seed(s)
    return s


def make_call(m, n, k, *, vector_alpha, bias, residual, activation, out_dtype=torch.bfloat16):
    x = torch.randn(m, k).to(out_dtype)
    q = quantize_weight(torch.randn(n, k) * 0.1)
    ws2 = q.global_scale * (torch.linspace(0.5, 2.0, n) if vector_alpha else 1.0)
    ins = (x.float().abs().max() / 2688).reshape(())
    b = torch.randn(n).to(out_dtype) if bias else None
    n_out = n // 2 if activation == "silu_mul" else n
    r = torch.randn(m, n_out).to(out_dtype) if residual else None
    return (x, q.packed, to_blocked(q.scale), ws2.float(), ins, b, r, activation, out_dtype)


CONFIGS = [
    Sm100Nvfp4GemmConfig(tile_n=128),
    Sm100Nvfp4GemmConfig(tile_n=64, split_k=2),
    Sm100Nvfp4GemmConfig(tile_n=32, swap_ab=True),
    Sm100Nvfp4GemmConfig(tile_n=8, swap_ab=True, split_k=2),
    Sm100Nvfp4GemmConfig(tile_m=256, cluster_m=2, tile_n=128),
]
EPIS = list(itertools.product([False, True], [False, True], [False, True], ["none", "silu", "gelu_tanh", "silu_mul"]))


# every epilogue combination for the native and the swap-AB layout; a spread for the rest
CASES = [(c, e) for c in (CONFIGS[0], CONFIGS[2]) for e in EPIS] + [
    (c, e) for c in (CONFIGS[1], CONFIGS[3], CONFIGS[4]) for e in (EPIS[0], EPIS[-1], EPIS[len(EPIS) // 2 + 1])
]


@pytest.mark.parametrize(
    "cfg,vector_alpha,bias,residual,activation", [(c, *e) for c, e in CASES],
    ids=[f"{c.name()}-{'-'.join(map(str, e))}" for c, e in CASES],
)
def test_prepared_args_match_emulated(cfg, vector_alpha, bias, residual, activation, seed):
    # ragged: M not a tile multiple, N=80 not a multiple of 64/128, K=288 not a multiple of 256
    m = 5  # <= every narrow tile_n used with swap-AB here
    n, k = 160, 288  # gated output width 80 (16-byte rows)
    call = make_call(m, n, k, vector_alpha=vector_alpha, bias=bias, residual=residual, activation=activation)
    args = prepare_sm100_args(*call, cfg)
    gated = activation == "silu_mul"
    weight_operand = args.a if cfg.swap_ab else args.b
    assert (args.m, args.n) == ((n, m) if cfg.swap_ab else (m, n))
    # the weight is passed through untouched, or (gated) as its cached interleaved copy
    assert (weight_operand.data_ptr() == call[1].data_ptr()) != gated
    want_view = ((args.m // 2, args.n) if cfg.swap_ab else (args.m, args.n // 2)) if gated else (args.m, args.n)
    assert args.kernel_c_view().shape == want_view
    got = kernel_view_ref(args)
    want = nvfp4_linear_emulated(*call)
    assert not torch.isnan(got).any()
    acc_scale = want.float().abs().max().item() + 1.0
    torch.testing.assert_close(got.float(), want.float(), rtol=ULP[torch.bfloat16], atol=k * 2.0**-24 * acc_scale * 4)


def test_alpha_is_input_scale_times_weight_scale_2(seed):
    call = make_call(3, 64, 256, vector_alpha=True, bias=False, residual=False, activation="none")
    args = prepare_sm100_args(*call, Sm100Nvfp4GemmConfig(tile_n=64))
    assert args.alpha.dtype == torch.float32 and args.alpha.shape == (64,)
    torch.testing.assert_close(args.alpha, call[4].float() * call[3], rtol=0, atol=0)
    call = make_call(3, 64, 256, vector_alpha=False, bias=False, residual=False, activation="none")
    args = prepare_sm100_args(*call, Sm100Nvfp4GemmConfig(tile_n=64))
    assert args.alpha.shape == (1,) and args.alpha.item() == (call[4] * call[3]).item()


def test_swap_ab_swaps_scale_roles(seed):
    call = make_call(2, 128, 256, vector_alpha=False, bias=False, residual=False, activation="none")
    plain = prepare_sm100_args(*call, Sm100Nvfp4GemmConfig(tile_n=128))
    swap = prepare_sm100_args(*call, Sm100Nvfp4GemmConfig(tile_n=8, swap_ab=True))
    assert torch.equal(plain.sfa.view(torch.uint8), swap.sfb.view(torch.uint8))  # activation scales
    assert torch.equal(plain.sfb.view(torch.uint8), swap.sfa.view(torch.uint8))  # weight scales
    assert swap.kernel_c_view().stride() == (1, 128)  # column-major C of the kernel


def test_splitk_buffers():
    cfg = Sm100Nvfp4GemmConfig(tile_n=64, split_k=4, cluster_m=2)
    ws, tiles = splitk_workspace_shape(130, 100, cfg)
    assert tiles == 2 * 2  # ceil(130/128)=2 (round to cluster_m 2), ceil(100/64)=2
    assert ws == tiles * 4 * 64 * 128
    call = make_call(130, 128, 1024, vector_alpha=False, bias=False, residual=False, activation="none")
    args = prepare_sm100_args(*call, Sm100Nvfp4GemmConfig(tile_n=64, split_k=4))
    assert args.counters.dtype == torch.int32 and int(args.counters.abs().sum()) == 0
    assert args.workspace.numel() >= splitk_workspace_shape(130, 128, args.config)[0]


class _FakeCapture:
    """Stands in for ``torch.cuda.is_current_stream_capturing`` (CPU tensors, no CUDA)."""

    def __init__(self):
        self.on = False

    def __call__(self):
        return self.on


def test_splitk_workspace_survives_growth_after_a_capture():
    """A graph captured with a workspace keeps its raw pointers; growing the workspace later
    must not free (or re-hand-out) the old buffers. Fails on the old per-(device, stream) cache,
    which replaced -- and so dropped the last reference to -- the captured buffers."""
    import gc
    import weakref

    from nvgemm.templates.sm100_w4a4.launch import SplitKWorkspaces

    cap = _FakeCapture()
    pool = SplitKWorkspaces(capturing=cap)
    dev = torch.device("cpu")
    ws1, cnt1 = pool.get(dev, 1000, 8, stream_id=7)  # eager warm-up before capture
    cap.on = True
    g_ws, g_cnt = pool.get(dev, 1000, 8, stream_id=7)  # "captured": the graph keeps raw pointers
    cap.on = False
    assert g_ws is ws1 and g_cnt is cnt1  # a large-enough pair is shared with the capture
    ptrs = (g_ws.data_ptr(), g_cnt.data_ptr())
    alive = [weakref.ref(ws1), weakref.ref(cnt1)]
    del ws1, cnt1, g_ws, g_cnt
    ws2, cnt2 = pool.get(dev, 5000, 20, stream_id=7)  # a later, larger eager call grows the pair
    gc.collect()
    assert all(r() is not None for r in alive), "a workspace a captured graph uses was freed"
    assert (ws2.data_ptr(), cnt2.data_ptr()) != ptrs and ws2.numel() >= 5000 and cnt2.numel() >= 20
    assert int(cnt2.abs().sum()) == 0
    # the retired pair is never handed out again, even for a small request
    again = pool.get(dev, 10, 1, stream_id=7)
    assert again[0] is ws2 and alive[0]() is not again[0]
    assert pool.held_bytes() >= (1000 + 8 + 5000 + 20) * 4


def test_splitk_workspace_capture_needing_more_gets_a_private_pair():
    from nvgemm.templates.sm100_w4a4.launch import SplitKWorkspaces

    cap = _FakeCapture()
    pool = SplitKWorkspaces(capturing=cap)
    dev = torch.device("cpu")
    eager = pool.get(dev, 100, 2)
    cap.on = True
    private = pool.get(dev, 4000, 16)  # too small: this capture gets its own, zeroed pair
    cap.on = False
    assert private[0] is not eager[0] and private[0].numel() >= 4000 and int(private[1].abs().sum()) == 0
    # ... which no later call receives: eager growth allocates anew, other captures too
    later = pool.get(dev, 4000, 16)
    assert later[0] is not private[0] and later[0] is not eager[0]
    cap.on = True
    other = pool.get(dev, 8000, 16)
    assert other[0] is not private[0]
    cap.on = False
    # streams (and devices) never share a pair
    assert pool.get(dev, 10, 1, stream_id=3)[0] is not pool.get(dev, 10, 1, stream_id=4)[0]
    assert pool.release_retired() >= 3


@pytest.mark.parametrize("k,split_k,ok", [(256, 1, True), (256, 2, False), (512, 2, True), (288, 2, True),
                                         (288, 4, False), (2048, 8, True), (2048, 16, False)])
def test_template_rule_refuses_split_k_beyond_k_tiles(k, split_k, ok):
    """split_k > number of 256-wide K tiles would leave a split without K tiles (it would commit
    a never-written accumulator): refused by the template's own rule, which the launcher
    applies too. (Uneven but non-empty splits, e.g. K=288 -> 2 tiles / 2 splits, are fine for the
    kernel; the policy additionally prefers equal slices.)"""
    from nvgemm.templates.sm100_w4a4.validity import can_implement_problem, k_tiles

    cfg = Sm100Nvfp4GemmConfig(tile_n=64, split_k=split_k)
    st = can_implement_problem(cfg, m=4, n=64, k=k, out_bytes=2)
    assert bool(st) == ok, st.reason
    if not ok:
        assert f"split_k={split_k} exceeds the {k_tiles(k)} K tiles" in st.reason
    if split_k > 1:
        call = make_call(4, 64, k, vector_alpha=False, bias=False, residual=False, activation="none")
        if ok:
            assert prepare_sm100_args(*call, cfg).counters is not None
        else:
            with pytest.raises(ValueError, match="exceeds"):
                prepare_sm100_args(*call, cfg)


def test_template_class_exposes_the_problem_rule():
    pytest.importorskip("cutlass")
    from nvgemm.aot.abi import get_template

    tpl = get_template("sm100_nvfp4_gemm")
    assert not tpl.can_implement_problem(Sm100Nvfp4GemmConfig(split_k=4), m=1, n=64, k=512, out_bytes=2)
    assert tpl.can_implement_problem(Sm100Nvfp4GemmConfig(split_k=2), m=1, n=64, k=512, out_bytes=2)


def test_cluster_occupancy_aot_values():
    """GPC-aware guaranteed cluster counts (module docstring of nvgemm.templates.sm100_w4a4.occupancy),
    worked by hand for B200's 148 SMs in 8 GPCs of an even SM count <= 20: c=4 -- a GPC with
    2 (mod 4) SMs wastes 2; at most six GPCs can be such (eight would sum to <= 8*18 = 144 < 148,
    and their number is even since 148 = 0 mod 4) -> (148 - 12) / 4 = 34; c=8 -- six GPCs of 20
    and two of 14 -> 6*2 + 2*1 = 14; c=16 -- the same split -> 6."""
    from nvgemm.templates.sm100_w4a4.occupancy import aot_max_active_clusters, guaranteed_clusters

    assert [guaranteed_clusters(148, c) for c in (1, 2, 4, 8, 16)] == [148, 74, 34, 14, 6]
    assert [guaranteed_clusters(160, c) for c in (1, 2, 4, 8, 16)] == [160, 80, 40, 16, 8]  # full dies
    # never more than the naive count, and never more than fits one cluster per GPC share
    for sm in range(2, 161, 2):
        for c in (1, 2, 4, 8, 16):
            g = guaranteed_clusters(sm, c)
            assert g <= sm // c and g * c <= sm
    assert aot_max_active_clusters("sm_100a", 148, 4) == 34
    assert aot_max_active_clusters("sm_103a", 148, 2) == 74
    assert aot_max_active_clusters("sm_100a", 200, 4) == 50  # not the sm_100 topology: SM count / size
    with pytest.raises(ValueError, match="do not fit"):
        guaranteed_clusters(170, 2)


def test_runtime_occupancy_resolution_uses_the_driver_count():
    """The run-time compile spec carries the driver's cluster count whenever it differs from the
    AOT (guaranteed) count -- more (a balanced B200: 37 clusters of 4 where 34 are guaranteed) or
    fewer; it equals the AOT spec when they agree; a failing query falls back to the AOT value
    with one warning."""
    import logging

    from nvgemm.templates.sm100_w4a4.occupancy import resolve_max_active_clusters
    from nvgemm.templates.sm100_w4a4.backend import compile_spec_for

    cfg = Sm100Nvfp4GemmConfig(tile_n=16, swap_ab=True, cluster_m=4)
    spec = EpilogueSpec(alpha="scalar")
    aot = compile_spec_for(cfg, spec, "sm_100a", 148)
    assert aot.hw.max_active_clusters == 0
    big = compile_spec_for(cfg, spec, "sm_100a", 148, lambda c: 37)  # balanced B200: 37 > 34 guaranteed
    assert big.hw.max_active_clusters == 37 and big != aot
    assert compile_spec_for(cfg, spec, "sm_100a", 148, lambda c: 34) == aot
    small = compile_spec_for(cfg, spec, "sm_100a", 148, lambda c: 20)  # e.g. an SM partition
    assert small.hw.max_active_clusters == 20 and small != aot
    assert resolve_max_active_clusters("sm_100a", 148, 2, lambda c: {2: 74}[c]) == 0
    with pytest.raises(RuntimeError, match="does not fit"):
        resolve_max_active_clusters("sm_100a", 148, 16, lambda c: 0)

    def broken(c):
        raise RuntimeError("no driver")

    records = []
    h = logging.Handler()
    h.emit = records.append
    lg = logging.getLogger("nvgemm_cutedsl")
    lg.addHandler(h)
    try:
        for _ in range(3):
            assert resolve_max_active_clusters("sm_103a", 148, 8, broken) == 0
    finally:
        lg.removeHandler(h)
    assert len([r for r in records if r.levelno == logging.WARNING]) == 1


def test_device_sized_kernel_falls_back_to_the_precompiled_one(monkeypatch):
    """A device-sized spec is built when cutlass-dsl is here; on a serving box without it, a
    missing device-sized kernel runs the precompiled AOT kernel with one warning."""
    import dataclasses
    import warnings

    from nvgemm.aot import cache as cache_mod
    from nvgemm.templates.sm100_w4a4.backend import compile_spec_for, kernel_for

    cfg = Sm100Nvfp4GemmConfig(tile_n=16, swap_ab=True, cluster_m=4)
    spec = EpilogueSpec(alpha="scalar")
    aot = compile_spec_for(cfg, spec, "sm_100a", 148)
    dev = compile_spec_for(cfg, spec, "sm_100a", 148, lambda c: 37)

    class FakeCache:
        def __init__(self, have):
            self.have, self.calls = set(have), []

        def get(self, s, build=True):
            self.calls.append((s.hw.max_active_clusters, build))
            if s in self.have or build:
                return ("kernel", s.hw.max_active_clusters)
            raise cache_mod.CacheMiss(s.name())

    monkeypatch.setattr(cache_mod, "_dsl_available", lambda: True)
    c = FakeCache([aot])
    assert kernel_for(dev, c) == ("kernel", 37) and c.calls == [(37, True)]
    monkeypatch.setattr(cache_mod, "_dsl_available", lambda: False)
    c = FakeCache([aot])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert kernel_for(dev, c) == ("kernel", 0)
        assert kernel_for(dev, c) == ("kernel", 0)
    assert c.calls == [(37, False), (0, False)] * 2
    assert sum("holds 37 clusters" in str(x.message) for x in w) == 1
    c = FakeCache([aot, dev])
    assert kernel_for(dev, c) == ("kernel", 37)
    with pytest.raises(cache_mod.CacheMiss):
        kernel_for(dataclasses.replace(dev, arch="sm_103a"), FakeCache([]))


def test_kernel_bakes_the_resolved_cluster_count():
    """The template turns hw.max_active_clusters=0 into the arch's guaranteed count, and keeps an
    explicit (measured) count."""
    pytest.importorskip("cutlass")
    from nvgemm.templates.sm100_w4a4.backend import compile_spec_for
    from nvgemm.aot.abi import get_template

    tpl = get_template("sm100_nvfp4_gemm")
    cfg = Sm100Nvfp4GemmConfig(tile_n=128, cluster_m=2, cluster_n=2)
    spec = EpilogueSpec(alpha="scalar")
    assert tpl.make_kernel(compile_spec_for(cfg, spec, "sm_100a", 148)).max_active_clusters == 34
    assert tpl.make_kernel(compile_spec_for(cfg, spec, "sm_100a", 148, lambda c: 30)).max_active_clusters == 30
    one = Sm100Nvfp4GemmConfig(tile_n=128)
    assert tpl.make_kernel(compile_spec_for(one, spec, "sm_100a", 148)).max_active_clusters == 148


@pytest.mark.parametrize(
    "mutate,cfg,match",
    [
        (lambda c: c.__setitem__(4, None), Sm100Nvfp4GemmConfig(), "needs input_scale"),
        (lambda c: None, Sm100Nvfp4GemmConfig(tile_n=8, swap_ab=True), "narrow tile_n=8"),
        (lambda c: None, Sm100Nvfp4GemmConfig(split_k=8), "split_k=8 exceeds"),
        (lambda c: c.__setitem__(5, torch.randn(64)), Sm100Nvfp4GemmConfig(), "bias dtype"),
        (lambda c: c.__setitem__(1, c[1][:60]) or c.__setitem__(2, to_blocked(torch.ones(60, 32).to(torch.float8_e4m3fn))),
         Sm100Nvfp4GemmConfig(), "multiple of 16 bytes"),
    ],
)
def test_prepare_rejects_with_reason(mutate, cfg, match, seed):
    call = list(make_call(16, 64, 512, vector_alpha=False, bias=False, residual=False, activation="none"))
    mutate(call)
    with pytest.raises(ValueError, match=match):
        prepare_sm100_args(*call, cfg)


def _lp(device_type, cap, **kw):
    d = dict(m=4, n=64, k=256, device_type=device_type, capability=cap, weight_only=False, x_dtype=torch.bfloat16,
             out_dtype=torch.bfloat16, alpha="scalar", bias=False, activation="none", residual=False)
    d.update(kw)
    return LinearProblem(**d)


def test_backend_only_on_sm100():
    assert "CUDA" in supports(_lp("cpu", None))
    assert "sm_100" in supports(_lp("cuda", (9, 0)))
    assert "sm_100" in supports(_lp("cuda", (12, 0)))
    assert supports(_lp("cuda", (10, 0))) is None
    assert supports(_lp("cuda", (10, 3))) is None
    assert "W4A16" in supports(_lp("cuda", (10, 0), weight_only=True))
    # silu_mul: the kernel implements it; the backend follows the candidate policy's verdict
    r = supports(_lp("cuda", (10, 0), n=256, activation="silu_mul"))
    from nvgemm.heuristics import candidates
    from nvgemm.core.problem import GemmProblem, Target

    has = bool(candidates(GemmProblem(n=256, k=256, m=4, epilogue="silu_mul", target=Target.from_gpu("B200")),
                          use_nvmmh=False))
    assert (r is None) == has, r
    assert "16 bytes" in supports(_lp("cuda", (10, 0), n=60))


def test_cpu_dispatch_never_selects_sm100(seed):
    from nvgemm.dispatch.registry import select_backend

    assert select_backend(_lp("cpu", None)).name == "emulated"


@pytest.mark.parametrize("alpha,bias,act,res", list(itertools.product(["none", "scalar", "vector"], [False, True],
                                                                        ["none", "silu", "gelu_tanh"], [False, True])))
def test_cute_apply_reference_is_epilogue_ref(alpha, bias, act, res, seed):
    cute_apply = pytest.importorskip("nvgemm.epilogues.cute_apply")
    spec = EpilogueSpec(alpha=alpha, bias=bias, activation=act, residual=res)
    acc = torch.randn(7, 24) * 10
    a = torch.rand(()) if alpha == "scalar" else torch.rand(24)
    b = torch.randn(24).to(torch.bfloat16)
    r = torch.randn(7, 24).to(torch.bfloat16)
    got = cute_apply.CuteEpilogue(spec).reference(acc, a, b, r)
    want = epilogue_ref(acc, spec, a if alpha != "none" else None, b, r)
    assert torch.equal(got, want)


def test_gate_up_interleave_roundtrip(seed):
    from nvgemm.core.formats import from_blocked
    from nvgemm.templates.sm100_w4a4.launch import gate_up_permutation, interleave_gate_up

    n, k = 256, 512
    q = quantize_weight(torch.randn(n, k))
    ws = to_blocked(q.scale)
    ws2 = torch.rand(n)
    bias = torch.randn(n).to(torch.bfloat16)
    w_i, s_i, w2_i, b_i = interleave_gate_up(q.packed, ws, ws2, bias)
    perm = gate_up_permutation(n)
    assert perm[:4].tolist() == [0, n // 2, 1, n // 2 + 1]
    assert torch.equal(w_i[2], q.packed[1]) and torch.equal(w_i[3], q.packed[n // 2 + 1])
    lin = from_blocked(s_i, n, k // 16)
    assert torch.equal(lin[1].view(torch.uint8), q.scale[n // 2].view(torch.uint8))
    assert torch.equal(w2_i[1], ws2[n // 2]) and torch.equal(b_i[0], bias[0])
    again = interleave_gate_up(q.packed, ws, ws2, bias)  # cached packed copy is reused
    assert again[0].data_ptr() == w_i.data_ptr()
    # a different weight object never hits another one's entry, even with equal storage ids
    other = q.packed.clone()
    assert interleave_gate_up(other, ws, ws2, bias)[0].data_ptr() != w_i.data_ptr()
