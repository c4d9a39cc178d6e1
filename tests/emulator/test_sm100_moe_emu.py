"""The sm_100a grouped W4A4 MoE kernel run on the PTX emulator through its real AOT artifacts (the
production host path :func:`nvgemm.templates.sm100_moe.launch.moe_forward`: work list, per-slot
NVFP4 activations with per-expert input scales, GEMM1 with the fused SwiGLU + NVFP4 requant
epilogue writing GEMM2's operand, GEMM2, the deterministic finalize), compared **bit for bit** with
the emulated ``nvfp4_moe`` (the numerics contract) on exactness-preserving data
(``_sm100_moe_emu``), and for batch invariance on random data (a token's output at M = 1 equals its
row inside a larger batch with the same configs).

Default run: six calls (odd M with an expert without tokens, ``-1`` ids and empty work slots,
K/N tails; one expert with every token, split-K, per-row alpha, shared_out + residual; GEMM1 with
2I = 128 and 256 over three routed experts; 36 tokens in one 64-token slot, so the fused requant
writes scale rows past 32; batch invariance at M = 12) -- 6 kernels to build, about 16 emulated
launches. Every exact call also checks each launch's PDL record (before ``griddepcontrol.wait``: GEMM1
touches nothing, GEMM2 its work list and the L2 prefetch of its expert's weights and scales, never the
activations). GEMM1 with ``prefetch_next`` (two more calls: one token top-8; split-K with an expert in two slots)
must also L2-prefetch exactly the routed experts' GEMM2 weight and scale bytes, each box once (the emulator's
``l2_prefetch_lines`` / ``l2_prefetch_boxes``). ``-m emulator_full`` adds
tile_n 16/32/64, expert_map with router-weight-on-input in fp16, and batch invariance inside M = 64.
"""

from __future__ import annotations

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_100a")
if "CUTE_DSL_DUMP_DIR" not in os.environ:
    import tempfile

    os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="nvgemm_cute_dump_")

import pytest
import torch

pytest.importorskip("cutlass")

from _pdl import check_pdl_prologue, check_signals_after_wait  # noqa: E402
from _sm100_moe_emu import exact_moe_operands, random_moe_operands, run_moe_emu  # noqa: E402

from nvgemm.ops.moe import nvfp4_moe_emulated  # noqa: E402
from nvgemm.templates.sm100_moe.config import Sm100MoeConfig as C  # noqa: E402

pytestmark = pytest.mark.emulator

T8 = C(tile_n=8)
T8_SK2 = C(tile_n=8, split_k=2)


def _check_exact(ops, c1, c2, order="forward"):
    keep, launches = {}, []
    got = run_moe_emu(ops, c1, c2, keep, launches=launches, order=order)
    want = nvfp4_moe_emulated(*ops)
    assert got.dtype == want.dtype and got.shape == want.shape
    bad = (got.float() != want.float()).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} elements differ, first {bad[:4].tolist()}: {got[tuple(bad[0])]} vs " \
                             f"{want[tuple(bad[0])]}"
    assert want.float().abs().amax() > 0
    # PDL: before its griddepcontrol.wait GEMM1 touches at most its stacked weights and their scales (it
    # prefetches nothing: the expert of a tile comes from the work list its own producer, the prep, writes);
    # GEMM2 reads its work list (tiles_ptr: written by the prep, which completed before GEMM1's wait, and GEMM1
    # signals only after that wait) and loads its expert's first weight and scale K tiles -- nothing else:
    # its activations (b_ptr, sfb_ptr: GEMM1's output) only after the wait
    assert len(launches) == 2
    check_pdl_prologue(launches[0], weights={"a_ptr", "sfa_ptr"}, prefetch=False)
    check_signals_after_wait(launches[0])  # the premise of GEMM2's early work-list read
    assert not launches[0].ext.get("pdl_pre_wait_reads") and not launches[0].ext.get("pdl_pre_wait_prefetches")
    check_pdl_prologue(launches[1], weights={"a_ptr", "sfa_ptr"}, routing={"tiles_ptr"}, prefetch=False,
                       early_weights=True)
    assert "a_ptr" in launches[1].ext["pdl_pre_wait_reads"]  # TMA loads into the smem ring, not an L2 prefetch
    assert keep["args2"].config.early_weights
    keep.update(launch13=launches[0], launch2=launches[1])
    return keep


def test_exact_odd_m_empty_expert_and_slots():
    """M=5, top-2 over 4 experts: expert 1 gets no token, two empty (-1) slots, an expert picked twice
    by one token, an empty work slot; H=96 (K tail of GEMM1, M tail of GEMM2), I=32 (GEMM1's 64 rows
    padded to 128 per expert in the stack)."""
    ids = torch.tensor([[0, 2], [2, -1], [0, 0], [3, 2], [-1, 0]], dtype=torch.int32)
    keep = _check_exact(exact_moe_operands(5, 2, 4, 96, 32, ids=ids, seed=1), T8, T8)
    wl = keep["work_list"]
    assert wl.counts.tolist() == [4, 0, 3, 1]
    assert wl.tiles.view(-1, 4)[:, 2].tolist() == [4, 3, 1, 0, 0]  # two slots past the routing's tiles


def test_exact_one_expert_all_tokens_split_k():
    """M=19 top-1, every token on expert 2 (3 work slots, the last with 3 rows), split-K 2 in GEMM1
    (K=512), per-row alpha (gate and up scales differ), shared_out and residual added in the finalize."""
    ids = torch.full((19, 1), 2, dtype=torch.int32)
    ops = exact_moe_operands(19, 1, 3, 512, 32, ids=ids, alpha13="row", shared=True, residual=True, seed=2)
    keep = _check_exact(ops, T8_SK2, T8)
    assert keep["work_list"].tiles.view(-1, 4)[:3, 2].tolist() == [8, 8, 3]


@pytest.mark.parametrize("i", [64, 128], ids=["2i128", "2i256"])
def test_exact_gemm1_several_experts_whole_row_tiles(i):
    """GEMM1 with 2I = 128 (one whole 128-row A tile per expert, no padding) and 2I = 256 (two per expert):
    M=6 top-2 over 3 experts, every expert routed, so each work slot's A tile is ``e * tiles_per_expert + i``
    for e = 0, 1, 2; H=64 (one ragged K tile in GEMM1, GEMM2's 64 rows padded to 128)."""
    ids = torch.tensor([[0, 1], [2, 1], [1, 2], [0, 2], [2, 0], [1, 0]], dtype=torch.int32)
    keep = _check_exact(exact_moe_operands(6, 2, 3, 64, i, ids=ids, seed=10 + i), T8, T8)
    assert keep["work_list"].counts.tolist() == [4, 4, 4]


@pytest.mark.parametrize("order", ["reverse", 5], ids=["reverse", "shuffled"])
def test_fused_finalize_in_any_cta_order(order):
    """GEMM2 runs the top-k finalize (3 launches): whichever CTA of a row tile arrives last -- the real work
    slots after the empty ones (reverse) or in a shuffled order -- sums every token's slots in slot order,
    adds shared_out + residual; also after GEMM2's split-K reduction (I = 512: two K tiles). M=2 top-4 (the
    fused bound): an empty slot, an expert picked twice by one token, an expert without tokens."""
    ids = torch.tensor([[0, 2, -1, 3], [2, 0, 0, 3]], dtype=torch.int32)
    for i, c2 in ((32, T8), (512, T8_SK2)):
        ops = exact_moe_operands(2, 4, 5, 64, i, ids=ids, shared=True, residual=True, seed=14)
        keep = _check_exact(ops, T8, c2, order=order)
        assert keep["args2"].config.finalize and keep["args2"].fin is not None


def test_separate_finalize_when_the_output_dtype_differs():
    """out_dtype != x dtype: GEMM2 writes y only and the finalize is its own step (the torch reference on CPU)."""
    ids = torch.tensor([[0, 2], [2, -1], [0, 0], [3, 2], [-1, 0]], dtype=torch.int32)
    ops = exact_moe_operands(5, 2, 4, 96, 32, ids=ids, seed=15)
    ops[16] = torch.float16
    keep = _check_exact(ops, T8, T8)
    assert not keep["args2"].config.finalize and keep["args2"].fin is None


def test_exact_requant_past_32_tokens_in_a_slot():
    """M=40 top-1 over 2 experts, 36 tokens on expert 1: one 64-token slot holds 36 rows, so GEMM1's fused
    requant writes the scale bytes of slot rows 32-35 (the 32-row group term of the per-slot 128x4 swizzle)."""
    ids = torch.zeros((40, 1), dtype=torch.int32)
    ids[:36] = 1
    keep = _check_exact(exact_moe_operands(40, 1, 2, 64, 32, ids=ids, seed=12), C(tile_n=64), C(tile_n=64))
    assert keep["work_list"].tiles.view(-1, 4)[:2, 2].tolist() == [4, 36]


def _lines(lo, hi):
    """128-byte lines of bytes [lo, hi)."""
    return set(range(lo // 128, (hi - 1) // 128 + 1))


def _check_prefetch_next(ids, e, h, i, c1, seed):
    """GEMM1 with ``prefetch_next``: bit-exact as always, and its L2 prefetches name exactly GEMM2's weight and
    weight-scale bytes of the routed experts (all rows padded to 128, all K) -- computed here from the ids and
    the stack layout ([E * H_p, I/2] bytes; scales H_p x 4 ceil(I/64) bytes per expert) -- each (row tile, K
    tile) box once, at most ceil(T2 / U) row tiles per CTA, nothing of any other allocation."""
    keep = _check_exact(exact_moe_operands(ids.shape[0], ids.shape[1], e, h, i, ids=ids, seed=seed), c1, T8)
    g1 = keep["launch13"]
    hp = -(-h // 128) * 128
    routed = sorted({int(x) for x in ids.reshape(-1).tolist() if x >= 0})
    w_row, s_exp = i // 2, hp * 4 * -(-i // 64)
    want_w = set().union(*(_lines(x * hp * w_row, (x + 1) * hp * w_row) for x in routed))
    want_s = set().union(*(_lines(x * s_exp, (x + 1) * s_exp) for x in routed))
    rec = g1.ext["l2_prefetch_lines"]
    assert set(rec) == {"next_a_ptr", "next_sfa_ptr"}, sorted(rec)
    assert rec["next_a_ptr"] == want_w, (sorted(rec["next_a_ptr"] - want_w)[:8], sorted(want_w - rec["next_a_ptr"])[:8])
    assert rec["next_sfa_ptr"] == want_s, (sorted(rec["next_sfa_ptr"] - want_s)[:8],
                                           sorted(want_s - rec["next_sfa_ptr"])[:8])
    # every box once: (row tile, K tile) x (weights, scales) of each routed expert
    t2, kt2 = hp // 128, -(-i // 256)
    boxes = g1.ext["l2_prefetch_boxes"]
    assert len(boxes) == 2 * len(routed) * t2 * kt2 and len(set(boxes)) == len(boxes)
    units = -(-2 * i // 128) * c1.split_k
    per_cta = {}
    for cta, _addr, _c in boxes:
        per_cta[cta] = per_cta.get(cta, 0) + 1
    assert max(per_cta.values()) <= 2 * kt2 * -(-t2 // units)
    assert not keep["launch2"].ext.get("l2_prefetch_lines")  # GEMM2 loads (early_weights), prefetches nothing
    return keep


def test_prefetch_next_one_token_top8():
    """Decode: 1 token, top-8 over 10 experts with an empty (-1) slot and an expert picked twice; GEMM1 has two
    128-row tiles per expert (I = 128: U = 2 work units per slot), GEMM2 three (H = 384), so unit 0 prefetches
    GEMM2 row tiles 0 and 2 and unit 1 row tile 1 of the slot's expert."""
    ids = torch.tensor([[3, 0, 9, -1, 7, 1, 3, 2]], dtype=torch.int32)
    keep = _check_prefetch_next(ids, 10, 384, 128, C(tile_n=8, prefetch_next=True), seed=21)
    assert keep["args13"].config.name().endswith("_pf2")


def test_prefetch_next_split_k_expert_in_several_slots():
    """M=11 top-2 over 5 experts, split-K 2 in GEMM1 (H = 512: U = 2 units per slot, I = 32: one row tile), expert
    1 on 10 pairs (two work slots: only its first prefetches), expert 4 without tokens, -1 ids; GEMM2 has four row
    tiles (H = 512)."""
    ids = torch.tensor([[1, 0], [1, 2], [1, -1], [1, 3], [1, 0], [1, 2], [1, 0], [1, 3], [1, -1], [1, 2], [0, 3]],
                       dtype=torch.int32)
    keep = _check_prefetch_next(ids, 5, 512, 32, C(tile_n=8, split_k=2, prefetch_next=True), seed=22)
    t4 = keep["work_list"].tiles.view(-1, 4)
    assert t4[:, 0][t4[:, 2] > 0].tolist().count(1) == 2  # expert 1 holds two slots


@pytest.mark.emulator_full
@pytest.mark.parametrize("h,i,sk,want", [(2048, 768, 1, {12: 32, 6: 64}), (7168, 256, 4, {8: 64, 6: 64})],
                         ids=["qwen3-30b-a3b", "deepseek-v3-tp8"])
def test_prefetch_next_per_cta_count_at_model_shapes(h, i, sk, want):
    """One token top-8 at a model's H / I (8 experts, all routed; GEMM2 not run): prefetch instructions per GEMM1
    CTA. Qwen3-30B-A3B (U = 12 units per slot, 16 GEMM2 row tiles, 3 K tiles): 32 CTAs issue 2 x 3 x 2 = 12, 64
    issue 6; DeepSeek-V3 TP8 with split-K 4 (U = 16, 56 row tiles, 1 K tile): 64 issue 4 x 2 = 8, 64 issue 6;
    the empty ninth slot's CTAs none."""
    from nvgemm.aot.compile_spec import make_spec
    from nvgemm.emulator.runner import prepare
    from nvgemm.templates.sm100_moe.launch import moe_forward

    ops = exact_moe_operands(1, 8, 8, h, i, ids=torch.tensor([[3, 0, 5, 1, 7, 2, 6, 4]], dtype=torch.int32), seed=1)
    got = []

    def launch(args):
        if not got:
            spec = make_spec("sm100_moe_nvfp4", args.config, "sm_100a", epilogue=args.spec)
            got.append(prepare(spec).launch(*args.abi_values(), 0))

    (x, ids, wts, w13, s13, g13, i13, w2, s2, g2, i2, act, rwi, emap, sh, res, odt) = ops
    moe_forward(x, ids, emap, wts, w13, s13, g13, i13, w2, s2, g2, i2, act, rwi, sh, res, odt,
                C(tile_n=8, split_k=sk, prefetch_next=True), T8, launch)
    boxes = got[0].ext["l2_prefetch_boxes"]
    per_cta = {}
    for cta, _a, _c in boxes:
        per_cta[cta] = per_cta.get(cta, 0) + 1
    hist = {}
    for v in per_cta.values():
        hist[v] = hist.get(v, 0) + 1
    assert hist == want and len(set(boxes)) == len(boxes) == 8 * 2 * (h // 128) * -(-i // 256)


def _batch_invariance(m_big, c1, c2, seed):
    ops = random_moe_operands(m_big, 2, 4, 64, 32, seed=seed)
    big = run_moe_emu(ops, c1, c2)
    for t in (0, m_big - 1):
        one = list(ops)
        one[0], one[1], one[2] = ops[0][t:t + 1], ops[1][t:t + 1], ops[2][t:t + 1]
        single = run_moe_emu(one, c1, c2)
        assert torch.equal(single[0], big[t]), f"token {t}: M=1 differs from its row in M={m_big}"
    # and the batch agrees with the contract within the first-use check's tolerance (random data:
    # another summation order may move one bf16 rounding of h and then one FP4 code of its requant)
    want = nvfp4_moe_emulated(*ops).float()
    err = float((big.float() - want).norm() / want.norm())
    assert err < 2.0**-6, err


def test_batch_invariance_m12():
    _batch_invariance(12, T8, T8, seed=3)


@pytest.mark.emulator_full
def test_batch_invariance_m64():
    _batch_invariance(64, C(tile_n=16), C(tile_n=16), seed=4)


@pytest.mark.emulator_full
@pytest.mark.parametrize("tn", [16, 32, 64])
def test_exact_tile_n(tn):
    g = torch.Generator().manual_seed(tn)
    ids = torch.randint(-1, 6, (37, 4), generator=g, dtype=torch.int32)
    ids[:, 0] = 5  # expert 5: 37+ pairs -> several slots
    _check_exact(exact_moe_operands(37, 4, 6, 160, 96, ids=ids, seed=tn), C(tile_n=tn), C(tile_n=tn, split_k=1))


@pytest.mark.emulator_full
def test_exact_expert_map_router_weight_on_input_fp16():
    """Expert parallelism (global ids mapped to 3 local experts, others -1) with Llama-4-style
    router weight on the input (top-1), fp16 activations, split-K in GEMM2 (I = 288: two K tiles)."""
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, 8, (11, 1), generator=g, dtype=torch.int32)
    ops = exact_moe_operands(11, 1, 3, 64, 288, ids=ids, seed=9, x_dtype=torch.float16)
    emap = torch.full((8,), -1, dtype=torch.int32)
    emap[torch.tensor([1, 4, 6])] = torch.arange(3, dtype=torch.int32)
    ops[13] = emap
    ops[12] = True
    ops[2] = torch.pow(2.0, torch.randint(-2, 2, (11, 1), generator=g).float())  # exact x * w
    _check_exact(ops, T8, T8_SK2)


def test_op_runs_the_grouped_kernel_via_the_emulator_backend(monkeypatch):
    """``NVGEMM_MOE_BACKEND=emu_sm100_moe``: ``torch.ops.nvgemm.nvfp4_moe`` dispatches to the grouped
    kernels (the policy's pick for the B200 profile) on the emulator, bit-exact with the emulated op."""
    import nvgemm.ops.moe  # noqa: F401  (registers the op)
    from nvgemm.dispatch.moe import last_moe_selected

    monkeypatch.setenv("NVGEMM_MOE_BACKEND", "emu_sm100_moe")
    ids = torch.tensor([[1, 3], [3, 0], [2, 3]], dtype=torch.int32)
    ops = exact_moe_operands(3, 2, 4, 64, 32, ids=ids, seed=5)
    got = torch.ops.nvgemm.nvfp4_moe(*ops)
    assert last_moe_selected() == "emu_sm100_moe"
    assert torch.equal(got, nvfp4_moe_emulated(*ops))
