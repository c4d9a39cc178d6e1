"""nvgemm.integrations.serving (pure torch, no engine; shared by the vLLM and SGLang plugins): fused shards stay exact, tensor-parallel shards are correct,
and warm-up resolves every (GEMM, M) before serving."""

from __future__ import annotations

import pytest
import torch
from _reference import ref_linear_fp64

from nvgemm.core.formats import quantize_weight
from nvgemm.ops.linear import nvfp4_linear_emulated
from nvgemm.dispatch.registry import Backend, LinearProblem, register_backend, unregister_backend
from nvgemm.integrations.serving import describe_choices, plan_gemms, run_gemms, warm_up

# Tolerance: the emulated op and the fp64 reference decode identical codes and scales; they differ by
# the fp32 summation order (<= K * 2^-24 of sum |a*b|) and the op's single bf16 rounding (<= 2^-9
# relative; 2^-8 allowed). A wrong shard scale, row range or layout is off by O(1).
BF16_REL = 2.0**-8


def assert_matches(got, want, mag, k):
    bound = BF16_REL * want.abs() + k * 2.0**-24 * mag + 1e-30
    err = (got.double() - want).abs()
    assert bool((err <= bound).all()), f"max excess {float((err - bound).max()):.3g}"


def shard(n, k, gen, scale=1.0):
    """An independently quantized shard (its own ModelOpt weight_scale_2)."""
    return quantize_weight(torch.randn(n, k, generator=gen) * scale)


def fuse(shards):
    return (torch.cat([q.packed for q in shards]), torch.cat([q.scale for q in shards]),
            torch.stack([q.global_scale.reshape(()) for q in shards]))


def per_shard_reference(x, shards, input_scales, bias):
    """The checkpoint's math, shard by shard (what each unfused layer computes)."""
    ys, mags, off = [], [], 0
    for q, ins in zip(shards, input_scales):
        n = q.packed.shape[0]
        y, mag = ref_linear_fp64(x, q, q.global_scale, ins, None if bias is None else bias[off:off + n],
                                 None, "none", x.dtype)
        ys.append(y), mags.append(mag)
        off += n
    return torch.cat(ys, -1), torch.cat(mags, -1)


@pytest.mark.parametrize("weight_only", [False, True], ids=["w4a4", "w4a16"])
def test_independently_quantized_shards_are_exact(seed, weight_only):
    gen = torch.Generator().manual_seed(seed)
    k, widths = 64, [48, 16, 16]  # q, k, v of different magnitudes -> different weight_scale_2
    shards = [shard(n, k, gen, s) for n, s in zip(widths, (1.0, 3.0, 0.2))]
    w, s, ws2 = fuse(shards)
    assert len(set(ws2.tolist())) == 3
    x = torch.randn(5, k, generator=gen).bfloat16()
    ins = None if weight_only else torch.full((3,), float(x.float().abs().amax()) / 2688)
    bias = torch.randn(sum(widths), generator=gen).bfloat16()
    gemms = plan_gemms(w, s, ws2, ins, widths)
    assert len(gemms) == 1 and gemms[0].alpha == "vector"  # one GEMM, exact per-column alpha
    got = run_gemms(x, w, gemms, bias)
    want, mag = per_shard_reference(x, shards, [None if ins is None else ins[0]] * 3, bias)
    assert_matches(got, want, mag, k)
    # what vLLM's own loader computes (one max weight_scale_2 for the fused layer) is measurably wrong
    approx = torch.ops.nvgemm.nvfp4_linear(x, w, gemms[0].weight_scale, ws2.max().reshape(()),
                                           None if ins is None else ins[0].reshape(()), bias)
    assert float((approx.double() - want).abs().max()) > 0.1 * float(want.abs().max())


def test_unequal_input_scales_become_separate_gemms(seed):
    gen = torch.Generator().manual_seed(seed)
    k, widths = 64, [32, 32]  # gate, up quantized with different static activation scales
    shards = [shard(n, k, gen) for n in widths]
    w, s, ws2 = fuse(shards)
    x = torch.randn(3, k, generator=gen).bfloat16()
    amax = float(x.float().abs().amax())
    ins = torch.tensor([amax / 2688, 4 * amax / 2688])
    gemms = plan_gemms(w, s, ws2, ins, widths)
    assert [(g.start, g.stop) for g in gemms] == [(0, 32), (32, 64)]
    got = run_gemms(x, w, gemms, None)
    want, mag = per_shard_reference(x, shards, list(ins), None)
    assert_matches(got, want, mag, k)


def test_modelopt_equal_scales_take_scalar_alpha(seed):
    """ModelOpt exports equalize weight_scale_2 / input_scale over fused shards: one scalar-alpha GEMM."""
    gen = torch.Generator().manual_seed(seed)
    k, widths = 32, [16, 16]
    full = torch.randn(32, k, generator=gen)
    q = quantize_weight(full)  # one global scale for both halves, as ModelOpt's export does
    ws2 = q.global_scale.reshape(1).expand(2).clone()
    gemms = plan_gemms(q.packed, q.scale, ws2, torch.full((2,), 0.01), widths)
    assert len(gemms) == 1 and gemms[0].alpha == "scalar" and gemms[0].weight_scale_2.dim() == 0


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("weight_only", [False, True], ids=["w4a4", "w4a16"])
def test_tensor_parallel_shards(seed, tp, weight_only):
    """Column-parallel (fused q/k/v split per rank) and row-parallel (K split per rank) layers, with
    per-rank K and N that are multiples of 16 but not of 32 (K=112/tp... N=24/tp), reassemble the
    unsharded layer's output: concatenation for column-parallel, sum for row-parallel."""
    gen = torch.Generator().manual_seed(seed)
    k = 16 * 7 * tp  # per-rank K of the row-parallel layer: 112 (not 32-aligned)
    widths = [48 * tp, 16 * tp, 16 * tp]
    shards = [shard(n, k, gen, sc) for n, sc in zip(widths, (1.0, 2.0, 0.5))]
    x = torch.randn(4, k, generator=gen).bfloat16()
    ins = None if weight_only else torch.tensor(float(x.float().abs().amax()) / 2688)
    want, mag = per_shard_reference(x, shards, [ins] * 3, None)

    # column-parallel: rank r holds rows [r*n/tp, (r+1)*n/tp) of each shard, fused
    outs = []
    for r in range(tp):
        rank_shards = [(q.packed.chunk(tp)[r], q.scale.chunk(tp)[r], q.global_scale) for q in shards]
        w = torch.cat([p for p, _, _ in rank_shards])
        s = torch.cat([sc for _, sc, _ in rank_shards])
        ws2 = torch.stack([g.reshape(()) for _, _, g in rank_shards])
        gemms = plan_gemms(w, s, ws2, None if ins is None else ins.expand(3), [p.shape[0] for p, _, _ in rank_shards])
        outs.append(run_gemms(x, w, gemms, None))
    # rank outputs are [q_r, k_r, v_r]; the unsharded layout is [q, k, v]
    cols = [torch.cat([o.split([n // tp for n in widths], -1)[i] for o in outs], -1) for i in range(3)]
    assert_matches(torch.cat(cols, -1), want, mag, k)

    # row-parallel: rank r holds K columns [r*k/tp, (r+1)*k/tp); vLLM all-reduces the bf16 partials
    q = shards[0]
    kr = k // tp
    assert kr % 32 != 0 and kr % 16 == 0
    partial = []
    for r in range(tp):
        w = q.packed[:, r * kr // 2:(r + 1) * kr // 2].contiguous()
        s = q.scale[:, r * kr // 16:(r + 1) * kr // 16].contiguous()
        gemms = plan_gemms(w, s, q.global_scale.reshape(1), None if ins is None else ins.reshape(1), [q.packed.shape[0]])
        partial.append(run_gemms(x[:, r * kr:(r + 1) * kr].contiguous(), w, gemms, None).double())
    want0, mag0 = per_shard_reference(x, [q], [ins], None)
    # tp bf16 roundings (one per partial) instead of one: tp * 2^-8 of the partials' magnitude
    err = (sum(partial) - want0).abs()
    assert bool((err <= tp * BF16_REL * mag0 + 1e-30).all())


def test_bad_layers_are_named(seed):
    gen = torch.Generator().manual_seed(seed)
    q = shard(32, 32, gen)
    with pytest.raises(ValueError, match="never loaded"):
        plan_gemms(q.packed, torch.full_like(q.scale.float(), float("nan")).to(q.scale.dtype),
                   q.global_scale.reshape(1), None, [32], "model.layers.0.mlp.down_proj")
    with pytest.raises(ValueError, match="do not add up"):
        plan_gemms(q.packed, q.scale, q.global_scale.reshape(1), None, [16], "x")
    neg = q.scale.view(torch.uint8).clone()
    neg[3, 1] |= 0x80  # a sign bit: the MMA reads block scales as unsigned, the loader must refuse it
    with pytest.raises(ValueError, match=r"block scale at index \[3, 1\] is negative"):
        plan_gemms(q.packed, neg.view(torch.float8_e4m3fn), q.global_scale.reshape(1), None, [32], "x")
    with pytest.raises(ValueError, match="not a positive finite scale"):
        plan_gemms(q.packed, q.scale, torch.zeros(1), None, [32], "x")
    with pytest.raises(ValueError, match="weight_scale must be"):
        plan_gemms(q.packed, q.scale.float(), q.global_scale.reshape(1), None, [32], "x")


def test_warm_up_resolves_every_gemm_and_m_before_serving(seed):
    """A kernel backend is selected (first-use check) and run for every (GEMM, M) during warm-up, so
    serving at those M never resolves a kernel (nothing compiles inside a CUDA-graph capture)."""
    gen = torch.Generator().manual_seed(seed)
    shards = [shard(16, 32, gen), shard(16, 32, gen, 5.0)]
    w, s, ws2 = fuse(shards)
    gemms = plan_gemms(w, s, ws2, torch.tensor([0.01, 0.02]), [16, 16])  # two GEMMs
    runs = []

    def fake_run(x, weight, *args):
        runs.append((x.shape[0], weight.shape[0]))
        return nvfp4_linear_emulated(x, weight, *args)

    register_backend(Backend("test_cpu_kernel", 500, lambda p: None if p.device_type == "cpu" else "cpu only", fake_run))
    try:
        chosen = warm_up("layer", w, gemms, None, torch.bfloat16, [1, 4, 8])
        assert {(gi, p.m, name) for gi, p, name in chosen} == {(g, m, "test_cpu_kernel") for g in (0, 1) for m in (1, 4, 8)}
        # the first-use check ran the backend once per problem, warm-up once more per (GEMM, M)
        for gi in (0, 1):
            for m in (1, 4, 8):
                assert (m, 16) in runs
        assert "M=1..8: test_cpu_kernel" in describe_choices(chosen)
    finally:
        unregister_backend("test_cpu_kernel")


def test_describe_choices():
    p = [LinearProblem(m, 8, 32, "cuda", (9, 0), True, torch.bfloat16, torch.bfloat16, "scalar", False, "none", False)
         for m in (1, 2, 4, 64)]
    chosen = [(0, p[0], "a"), (0, p[1], "a"), (0, p[2], "b"), (0, p[3], "b")]
    assert describe_choices(chosen) == "M=1..2: a; M=4..64: b"


def _fake_vllm_layer(widths, k, tracker):
    """What NvgemmNvFp4LinearMethod.create_weights registers (weight is torch.empty, as in vLLM), with
    vLLM's fused-layer loader semantics: one call per checkpoint tensor, a shard id per fused shard."""
    from nvgemm.integrations.serving import LoadTracker  # noqa: F401  (documented type of tracker)

    n, shards = sum(widths), len(widths)
    offsets = dict(zip("qkv", [0, widths[0], widths[0] + widths[1]]))
    sizes = dict(zip("qkv", widths))

    def vllm_loader(param, loaded_weight, shard_id=None):  # vLLM's weight_loader_v2, simplified
        if shard_id is None:
            param.data.copy_(loaded_weight)
        elif param.data.dim() == 1:  # per-shard scalars
            param.data["qkv".index(shard_id)] = loaded_weight.reshape(())
        else:
            param.data[offsets[shard_id]:offsets[shard_id] + sizes[shard_id]].copy_(loaded_weight)

    params = {
        "weight": torch.nn.Parameter(torch.empty(n, k // 2, dtype=torch.uint8), requires_grad=False),
        "weight_scale": torch.nn.Parameter(torch.full((n, k // 16), float("nan")).to(torch.float8_e4m3fn),
                                           requires_grad=False),
        "weight_scale_2": torch.nn.Parameter(torch.full((shards,), float("nan")), requires_grad=False),
        "input_scale": torch.nn.Parameter(torch.full((shards,), float("nan")), requires_grad=False),
    }
    loaders = {name: tracker.wrap(name, vllm_loader) for name in params}
    return params, loaders


@pytest.mark.parametrize("skip", [None, ("weight", "k"), ("weight_scale_2", "v"), ("input_scale", "q")])
def test_unloaded_shard_is_detected_before_serving(seed, skip):
    """A shard missing from the checkpoint leaves torch.empty memory in ``weight`` (any byte is a valid
    FP4 code pair, so nothing downstream can tell); the tracker names it before the layer serves."""
    from nvgemm.integrations.serving import LoadTracker

    gen = torch.Generator().manual_seed(seed)
    widths, k = [32, 16, 16], 64
    shards = [shard(w, k, gen) for w in widths]
    tracker = LoadTracker("model.layers.0.self_attn.qkv_proj", len(widths))
    params, loaders = _fake_vllm_layer(widths, k, tracker)
    for sid, q in zip("qkv", shards):  # the checkpoint's per-shard tensors, in vLLM's order
        for name, t in (("weight", q.packed), ("weight_scale", q.scale), ("weight_scale_2", q.global_scale),
                        ("input_scale", torch.tensor(0.01))):
            if (name, sid) != skip:
                loaders[name](params[name], t, sid)
    required = ("weight", "weight_scale", "weight_scale_2", "input_scale")
    if skip is None:
        tracker.check(required)
        gemms = plan_gemms(params["weight"].data, params["weight_scale"].data, params["weight_scale_2"].data,
                           params["input_scale"].data, widths)
        assert len(gemms) == 1
    else:
        with pytest.raises(ValueError, match=f"never loaded from the checkpoint: {skip[0]} \\(loaded shards"):
            tracker.check(required)


def test_prefused_checkpoint_tensor_counts_as_every_shard():
    from nvgemm.integrations.serving import LoadTracker

    tracker = LoadTracker("x", 2)
    load = tracker.wrap("weight", lambda p, w, *a: p.copy_(w))
    load(torch.empty(4, 2, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.uint8))  # no shard id
    tracker.check(["weight"])
    with pytest.raises(ValueError, match="never loaded from the checkpoint: weight_scale;"):
        tracker.check(["weight", "weight_scale"])


@pytest.mark.parametrize("cfg,logged", [
    ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}, True),
    ({"quant_method": "compressed_tensors", "format": "nvfp4-pack-quantized"}, True),
    ({"quant_method": "compressed-tensors", "format": "float-quantized"}, False),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, False),
    (None, False),
])
def test_compressed_tensors_nvfp4_fallback_is_logged(caplog, cfg, logged):
    from nvgemm.integrations.serving import note_unserved_checkpoint

    with caplog.at_level("WARNING", logger="nvgemm_cutedsl.vllm"):
        msg = note_unserved_checkpoint(cfg)
    lines = [r.getMessage() for r in caplog.records if "compressed-tensors NVFP4" in r.getMessage()]
    assert (msg is not None) == logged and len(lines) == (1 if logged else 0)
    if logged:
        assert "not nvgemm" in lines[0]
