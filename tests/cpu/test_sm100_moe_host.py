"""Host logic of the sm100 grouped W4A4 MoE path on CPU (no kernels): the stacked A operand, the
per-slot NVFP4 activations and scale atoms, the pair -> output-row map, the alpha table, the shape /
config rules and the backend's problem filter -- each against an independent construction from
``nvgemm.core.formats`` -- and the candidate policy (at most 8, valid, one pick per M bucket, token tile
from the pairs per active expert, split-K when few row tiles are active)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nvgemm.core.formats import from_blocked, pack_e2m1, quantize_activation, to_blocked, unpack_e2m1
from nvgemm.templates.sm100_moe.policy import MOE_LAYERS, bucket_of, moe_candidates, pick_moe_configs, token_tiles
from nvgemm.templates.sm100_moe.config import (Sm100MoeConfig as C, moe_config_from_name, moe_shape_problem,
                                               validate_moe_config)
from nvgemm.templates.sm100_moe.launch import (alpha_table, prepare_moe_stack, slot_activations,
                                               slot_rows_of_pairs)
from nvgemm.templates.sm90_moe.launch import build_work_list


def _weights(g, e, rows, k):
    codes = torch.randint(0, 16, (e, rows, k), generator=g, dtype=torch.uint8)
    sc = torch.rand(e, rows, k // 16, generator=g).mul(4).add(0.1).to(torch.float8_e4m3fn)
    return pack_e2m1(codes.reshape(e * rows, k)).reshape(e, rows, k // 2), torch.stack([to_blocked(s) for s in sc]), sc


@pytest.mark.parametrize("gated", [True, False])
def test_stack_is_the_2d_swizzle_of_the_padded_interleaved_experts(gated):
    g = torch.Generator().manual_seed(1)
    e, rows, k = 3, 96, 64  # 96 rows -> padded to 128 per expert
    w, s, lin = _weights(g, e, rows, k)
    st = prepare_moe_stack(w, s, gated)
    assert (st.rows, st.rows_padded, st.k, st.num_experts) == (rows, 128, k, e)
    perm = torch.cat([torch.stack([torch.arange(rows // 2), torch.arange(rows // 2) + rows // 2], 1).reshape(-1)]) \
        if gated else torch.arange(rows)
    want_w = torch.zeros(e, 128, k // 2, dtype=torch.uint8)
    want_w[:, :rows] = w[:, perm]
    assert torch.equal(st.weight, want_w.reshape(e * 128, k // 2))
    want_s = torch.zeros(e, 128, k // 16, dtype=torch.float8_e4m3fn)
    want_s[:, :rows] = lin[:, perm]
    got_s = from_blocked(st.scale, e * 128, k // 16)
    assert torch.equal(got_s.view(torch.uint8), want_s.reshape(e * 128, k // 16).view(torch.uint8))


def test_slot_activations_rows_scales_and_output_rows():
    g = torch.Generator().manual_seed(2)
    m, top_k, e, h, tn = 7, 3, 4, 64, 8
    ids = torch.randint(-1, e, (m, top_k), generator=g)
    ids[:, 0] = 2  # expert 2: 7+ pairs
    wl = build_work_list(ids, e, tn)
    x = torch.randn(m, h, generator=g).to(torch.bfloat16)
    ins = torch.tensor([0.01, 0.02, 0.005, 0.03])
    codes, atoms = slot_activations(x, wl, ins, tn)
    slots = wl.slots
    assert codes.shape == (slots * tn, h // 2) and atoms.numel() == slots * 128 * h // 16
    scales = from_blocked(atoms, slots * 128, h // 16).reshape(slots, 128, h // 16)
    assert (scales[:, tn:].float() == 0).all()  # rows past the slot's tokens: zero scales
    t4 = wl.tiles.view(-1, 4)
    seen = 0
    for j in range(slots):
        ex, p0, cnt = (int(v) for v in t4[j, :3])
        for t in range(tn):
            row = codes[j * tn + t]
            if t < cnt:
                tok = int(wl.rows[p0 + t])
                q, sc = quantize_activation(x[tok:tok + 1], ins[ex])
                assert torch.equal(row, q[0]) and torch.equal(scales[j, t].view(torch.uint8), sc[0].view(torch.uint8))
                seen += 1
            else:
                assert (unpack_e2m1(row[None]) == 0).all() and (scales[j, t].float() == 0).all()
    assert seen == int((ids >= 0).sum())
    # pair (t, s) -> GEMM2 output row: the slot row holding that pair's token
    yrow = slot_rows_of_pairs(wl, tn)
    for t in range(m):
        for s in range(top_k):
            if ids[t, s] >= 0:
                r = int(yrow[t, s])
                j, i = divmod(r, tn)
                assert int(t4[j, 0]) == int(ids[t, s]) and int(wl.rows[int(t4[j, 1]) + i]) == t


def test_alpha_table_per_expert_per_row_and_next_scale():
    g = torch.Generator().manual_seed(3)
    w, s, _ = _weights(g, 2, 64, 32)
    st = prepare_moe_stack(w, s, True)
    ins, ins2 = torch.tensor([0.5, 2.0]), torch.tensor([3.0, 5.0])
    kind, a = alpha_table(torch.tensor([4.0, 8.0]), ins, st, ins2)
    assert kind == "scalar" and a.tolist() == [2.0, 3.0, 16.0, 5.0]
    rows = torch.arange(128, dtype=torch.float32).reshape(2, 64)
    kind, a = alpha_table(rows, ins, st, ins2)
    a = a.reshape(2, 65)
    assert kind == "vector" and a[:, 64].tolist() == [3.0, 5.0]
    assert a[0, :4].tolist() == [0.0, 16.0, 0.5, 16.5]  # interleaved gate j / up j, times input_scale[e]
    kind, a = alpha_table(torch.tensor([4.0, 8.0]), ins, prepare_moe_stack(w, s, False))
    assert kind == "scalar" and a.tolist() == [2.0, 16.0]


def test_config_and_shape_rules():
    for c in (C(8), C(16, 2), C(32, 4), C(64, 8, False), C(8, finalize=True, early_weights=True),
              C(16, 2, early_weights=True), C(8, prefetch_next=True), C(8, 4, prefetch_next=True),
              C(16, 2, False, prefetch_next=True)):
        assert validate_moe_config(c) and moe_config_from_name(c.name()) == c
    assert C(8).name() == "nvgemm_cutedsl_sm100_moe_t128x8x256_pdl"  # names without the flag are unchanged
    assert C(8, 4, prefetch_next=True).name() == "nvgemm_cutedsl_sm100_moe_t128x8x256_sk4_pdl_pf2"
    for bad in (C(8, finalize=True, prefetch_next=True), C(8, early_weights=True, prefetch_next=True)):
        assert "prefetch_next" in validate_moe_config(bad).reason and "GEMM1" in validate_moe_config(bad).reason
    assert "needs pdl" in validate_moe_config(C(8, pdl=False, early_weights=True)).reason
    assert "tile_n" in validate_moe_config(C(128)).reason
    assert "split_k" in validate_moe_config(C(8, 3)).reason
    assert "multiple of 32" in moe_shape_problem(C(), 2 * 48, 256, True)
    assert "K=" in moe_shape_problem(C(), 64, 80, False)
    assert "split_k=4" in moe_shape_problem(C(8, 4), 64, 512, False)
    assert moe_shape_problem(C(8, 2), 2 * 32, 512, True) is None
    assert "spills" in moe_shape_problem(C(32, 8), 2 * 64, 4096, True)  # seen in the compile sweep
    assert moe_shape_problem(C(32, 8), 64, 4096, False) is None


def test_prefetch_next_has_its_own_kernel_and_cache_key():
    """The flag is codegen: another kernel name and AOT cache key; GEMM1's arguments carry GEMM2's stack (the ABI's
    last four values before the stream) exactly when it is set."""
    from nvgemm.aot.cache import compile_key
    from nvgemm.aot.compile_spec import make_spec
    from nvgemm.core.epilogue import EpilogueSpec

    epi = EpilogueSpec(alpha="scalar", activation="silu_mul", out_dtype=torch.bfloat16, out_quant=True)
    off, on = (make_spec("sm100_moe_nvfp4", C(8, prefetch_next=p), "sm_100a", epilogue=epi) for p in (False, True))
    assert off.name() != on.name() and "_pf2" in on.name()
    assert compile_key(off, "f") != compile_key(on, "f")
    from nvgemm.templates.sm100_moe.kernel import TEMPLATE

    names = [a.name for a in TEMPLATE.abi(on)]
    assert names[-5:] == ["next_a_ptr", "next_sfa_ptr", "next_m", "next_a_rows", "stream"]


def test_gemm1_args_carry_gemm2_stack_only_with_prefetch_next():
    from nvgemm.templates.sm100_moe.launch import gemm1_args

    g = torch.Generator().manual_seed(4)
    e, h, i, tn = 3, 64, 32, 8
    s13 = prepare_moe_stack(*_weights(g, e, 2 * i, h)[:2], True)
    s2 = prepare_moe_stack(*_weights(g, e, h, i)[:2], False)
    wl = build_work_list(torch.tensor([[0, 2]]), e, tn)
    x = torch.randn(1, h, generator=g).to(torch.bfloat16)
    b, sfb = slot_activations(x, wl, torch.full((e,), 0.01), tn)
    alpha = torch.ones(e * 2)
    args = gemm1_args(C(tn, prefetch_next=True), b, sfb, wl, s13, "scalar", alpha, x.dtype, next_stack=s2)
    v = args.abi_values()
    assert v[-4] is s2.weight and v[-3] is s2.scale and v[-2:] == (h, e * 128)
    assert gemm1_args(C(tn), b, sfb, wl, s13, "scalar", alpha, x.dtype).abi_values()[-4:] == (0, 0, 0, 0)
    with pytest.raises(ValueError, match="missing"):
        gemm1_args(C(tn, prefetch_next=True), b, sfb, wl, s13, "scalar", alpha, x.dtype)
    with pytest.raises(ValueError, match="without prefetch_next"):
        gemm1_args(C(tn), b, sfb, wl, s13, "scalar", alpha, x.dtype, next_stack=s2)
    with pytest.raises(ValueError, match="expected K = I = 32"):
        gemm1_args(C(tn, prefetch_next=True), b, sfb, wl, s13, "scalar", alpha, x.dtype, next_stack=s13)


def test_backend_problem_filter():
    from nvgemm.dispatch.moe import MoeProblem
    from nvgemm.templates.sm100_moe.backend import supports

    p = MoeProblem(m=4, top_k=2, num_experts=8, num_global_experts=8, hidden=256, intermediate=64,
                   activation="silu_mul", weight_only=False, alpha13="expert", x_dtype=torch.bfloat16,
                   out_dtype=torch.bfloat16, device_type="cuda", capability=(10, 0), router_weight_on_input=False,
                   expert_map=False, shared_out=False, residual=False)
    assert supports(p) is None
    assert "sm_100" in supports(dataclasses.replace(p, capability=(9, 0)))
    assert "W4A16" in supports(dataclasses.replace(p, weight_only=True))
    assert "silu_mul" in supports(dataclasses.replace(p, activation="relu2"))
    assert "multiples of 32" in supports(dataclasses.replace(p, intermediate=48))
    assert "CUDA" in supports(dataclasses.replace(p, device_type="cpu"))


@pytest.mark.parametrize("name", list(MOE_LAYERS))
@pytest.mark.parametrize("m", [1, 64])
def test_candidates_rules(name, m):
    s = MOE_LAYERS[name]
    cands = moe_candidates(s, m)
    assert 1 <= len(cands) <= 8
    mids = [sum(c.gemm_us) for c in cands]
    assert mids == sorted(mids)
    tiles = token_tiles(m, s.top_k, s.num_experts)
    for c in cands:
        assert c.config13.tile_n == c.config2.tile_n and c.config13.tile_n in tiles
        assert validate_moe_config(c.config13) and validate_moe_config(c.config2)
        assert moe_shape_problem(c.config13, 2 * s.inter, s.hidden, True) is None
        assert moe_shape_problem(c.config2, s.hidden, s.inter, False) is None


def test_token_tile_follows_pairs_per_active_expert_and_split_k_fills_the_sms():
    assert token_tiles(1, 8, 256, None) == (8, 16)  # 1 pair per active expert
    assert token_tiles(256, 2, 8, None) == (32, 64)  # 64 pairs per expert
    assert token_tiles(4, 2, 8, histogram=[0, 20, 3]) == (16, 32, 64)  # the busiest expert's count
    ds = MOE_LAYERS["DeepSeek-V3-TP8"]
    assert moe_candidates(ds, 1)[0].config13.split_k > 1  # 8 experts x 4 row tiles = 32 units on 148 SMs
    assert moe_candidates(ds, 64)[0].config2.split_k == 1  # ~222 active experts x 56 row tiles


def test_one_pick_per_bucket():
    s = MOE_LAYERS["Qwen3-30B-A3B"]
    for m in (1, 3, 9, 40, 100, 200):
        lo, hi = bucket_of(m)
        assert pick_moe_configs(m, s.num_experts, s.top_k, s.hidden, s.inter) == \
            pick_moe_configs(lo, s.num_experts, s.top_k, s.hidden, s.inter) == \
            pick_moe_configs(hi, s.num_experts, s.top_k, s.hidden, s.inter)


def test_plan_lists_the_grouped_candidates_on_blackwell(capsys):
    from nvgemm import cli

    assert cli.main(["plan", "--model", "DeepSeek-V3", "--tp", "8", "--gpu", "B200", "--m", "1,64", "--no-nvmmh",
                     "--max-candidates", "2"]) == 0
    out = capsys.readouterr().out
    assert "DeepSeek-V3-TP8: 256 experts, top-8, H=7168, I=256" in out and "sm100 grouped W4A4" in out
    assert "MODEL" in out and out.count("G1 t128x") == 4  # 2 candidates at each of 2 token counts
    assert cli.main(["plan", "--model", "DeepSeek-V3", "--gpu", "B200", "--format", "w4a16", "--m", "1",
                     "--no-nvmmh"]) == 0
    assert "sm100 grouped" not in capsys.readouterr().out  # the grouped kernel is W4A4 only


def test_emulator_moe_backend_only_when_forced(monkeypatch):
    """``emu_sm100_moe`` never serves (nor is an Inductor autotuning candidate for) an unforced CPU call."""
    from nvgemm.emulator.backend import supports_moe_sm100
    from nvgemm.dispatch.moe import MoeProblem

    p = MoeProblem(m=4, top_k=2, num_experts=8, num_global_experts=8, hidden=256, intermediate=64,
                   activation="silu_mul", weight_only=False, alpha13="expert", x_dtype=torch.bfloat16,
                   out_dtype=torch.bfloat16, device_type="cpu", capability=None, router_weight_on_input=False,
                   expert_map=False, shared_out=False, residual=False)
    monkeypatch.delenv("NVGEMM_MOE_BACKEND", raising=False)
    assert "forced" in supports_moe_sm100(p)
    monkeypatch.setenv("NVGEMM_MOE_BACKEND", "emu_sm100_moe")
    assert supports_moe_sm100(p) in (None, "needs gcc (builds the fake CUDA runtime and relinks the kernel)") or \
        "cutlass" in supports_moe_sm100(p)
    assert "W4A16" in supports_moe_sm100(dataclasses.replace(p, weight_only=True))


def test_prep_prefetch_arguments_are_checked():
    """GEMM1's stacked weight and scales to prefetch come together, contiguous, in whole 128-byte lines per
    expert; anything else is refused before a launch."""
    pytest.importorskip("triton")
    from nvgemm.templates.sm100_moe.prep_triton import moe_prep_triton

    class NeverLaunched:
        def __getitem__(self, grid):
            raise AssertionError("the prep launched with bad prefetch arguments")

    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    ids = torch.tensor([[0, 3]], dtype=torch.int32)
    w = torch.zeros(4 * 128, 32, dtype=torch.uint8)
    sc = torch.zeros(4 * 128 * 4, dtype=torch.uint8).view(torch.float8_e4m3fn)
    args = (x, ids, None, 4, torch.ones(4), 8, 32)
    with pytest.raises(ValueError, match="needs both w13 and w13_scale"):
        moe_prep_triton(*args, kernel=NeverLaunched(), w13=w)
    with pytest.raises(ValueError, match="stacked weight to prefetch must be contiguous"):
        moe_prep_triton(*args, kernel=NeverLaunched(), w13=w[:, :16], w13_scale=sc)
    with pytest.raises(ValueError, match="stacked scales to prefetch .* 4 blocks of whole 128-byte lines"):
        moe_prep_triton(*args, kernel=NeverLaunched(), w13=w, w13_scale=sc[:-4])
