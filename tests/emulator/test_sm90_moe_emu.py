"""The sm90 grouped W4A16 MoE kernel run on the PTX emulator through its real AOT artifact (the
production host path :func:`nvgemm.templates.sm90_moe.launch.moe_forward`: work list, stacked
prepared weights, both grouped GEMMs, finalize), compared **bit for bit** with the emulated
``nvfp4_moe`` (the numerics contract) on exactness-preserving data (``_sm90_moe_emu``: every
kernel sum is exact or one rounding of the same fp32 value), and for batch invariance on random
data (a token's output at M = 1 equals its row inside a larger batch with the same configs).

Default run: six routings (odd M with an expert without tokens and empty slots; the same with
per-row alpha; one expert with every token, split-K, per-row alpha, shared_out + residual; GEMM1
with 2I = 128 and 256 over three routed experts; random data batch invariance) -- about 5 kernels
to build and 16 emulated launches; every exact call checks each launch's PDL record (before
``griddepcontrol.wait``: GEMM1 touches nothing, GEMM2 its routing and first weight stages, never the
activations). The sweep (``pytest -m emulator_full``; results in
``bench/results/sm90_moe_emu_sweep.txt``) adds tile_m 16/32, expert_map with router-weight-on-input,
fp16, and batch invariance inside M = 64.
"""

from __future__ import annotations

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
if "CUTE_DSL_DUMP_DIR" not in os.environ:
    import tempfile

    os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="nvgemm_cute_dump_")

import pytest
import torch

pytest.importorskip("cutlass")

from _pdl import check_pdl_prologue, check_signals_after_wait  # noqa: E402
from _sm90_moe_emu import exact_moe_operands, random_moe_operands, run_moe_emu  # noqa: E402

from nvgemm.ops.moe import nvfp4_moe_emulated  # noqa: E402
from nvgemm.templates.sm90_moe.config import Sm90MoeConfig as C  # noqa: E402

pytestmark = pytest.mark.emulator

# PDL on, as the policy emits them: GEMM2 then reads its routing and issues its first weight stages before the wait
G1 = C(tile_m=8, tile_n=128, tile_k=128, num_warps=4, stages=3, pdl=True)  # gated: 64 features per CTA
G2 = C(tile_m=8, tile_n=64, tile_k=128, num_warps=4, stages=3, pdl=True)  # 64 rows per CTA (H=96: a tail block)
G1_SK = C(tile_m=8, tile_n=64, tile_k=128, num_warps=2, stages=2, split_k=2, pdl=True)
G2_SK = C(tile_m=8, tile_n=64, tile_k=128, num_warps=4, stages=2, split_k=2, pdl=True)


def check_pdl(launches, keep):
    """Before its griddepcontrol.wait GEMM1 touches nothing (its routing is its own producer's output); GEMM2
    reads its routing -- the work list (mTiles), or the ids with ``direct`` (mYRows), and the identity row
    table (mRows): written by grids that completed before GEMM1's wait, and GEMM1 signals only after that
    wait -- and issues its first weight and scale stages (mW, mS), nothing else: its activations (mX:
    GEMM1's output) only after the wait."""
    assert len(launches) == 2
    a1, a2 = launches
    check_pdl_prologue(a1, weights=set(), prefetch=False)
    check_signals_after_wait(a1)  # the premise of GEMM2's early routing read
    routing = {"mYRows", "mRows"} if keep["args2"].config.direct else {"mTiles", "mRows"}
    assert keep["args2"].config.early_weights
    check_pdl_prologue(a2, weights={"mW", "mS"}, routing=routing, prefetch=False, early_weights=True)


def _check_exact(ops, c1, c2, order="forward"):
    keep, launches = {}, []
    got = run_moe_emu(ops, c1, c2, keep, order=order, launches=launches)
    if c1.pdl and c2.pdl:
        check_pdl(launches, keep)
    want = nvfp4_moe_emulated(*ops)
    assert got.dtype == want.dtype and got.shape == want.shape
    bad = (got.float() != want.float()).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} elements differ, first {bad[:4].tolist()}: {got[tuple(bad[0])]} vs " \
                             f"{want[tuple(bad[0])]}"
    assert want.float().abs().amax() > 0
    return keep


def test_exact_odd_m_empty_expert_and_slots():
    """M=5, top-2 over 4 experts: expert 1 gets no token, two empty (-1) slots, an expert picked twice
    by one token; H=96 (K tail of GEMM1, N tail of GEMM2), I=32 (N tail of GEMM1)."""
    ids = torch.tensor([[0, 2], [2, -1], [0, 0], [3, 2], [-1, 0]], dtype=torch.int32)
    keep = _check_exact(exact_moe_operands(5, 2, 4, 96, 32, ids=ids, seed=1), G1, G2)
    wl = keep["work_list"]
    assert wl.counts.tolist() == [4, 0, 3, 1]


def test_exact_one_expert_all_tokens_split_k():
    """M=19 top-1, every token on expert 2 (3 work tiles, the last with 3 rows), split-K 2 in both GEMMs,
    per-row alpha (gate and up scales differ), shared_out and residual added in the finalize."""
    ids = torch.full((19, 1), 2, dtype=torch.int32)
    ops = exact_moe_operands(19, 1, 3, 64, 64, ids=ids, alpha13="row", shared=True, residual=True, seed=2)
    keep = _check_exact(ops, G1_SK, G2_SK)
    assert keep["work_list"].tiles.view(-1, 4)[:3, 2].tolist() == [8, 8, 3]


def test_exact_row_alpha_without_split_k():
    """Per-row alpha (gate and up ``weight_scale_2`` differ) with a GEMM1 without split-K: the unused
    split-K workspace argument was the 2-D ``[E, 2I]`` alpha, which the kernel's ABI refuses
    ("mWork: expected a 1-D tensor"); found by ``bench/emulator_sweep.py --only moe``."""
    ids = torch.tensor([[0, 2], [2, -1], [0, 0], [3, 2], [-1, 0]], dtype=torch.int32)
    _check_exact(exact_moe_operands(5, 2, 4, 96, 32, ids=ids, alpha13="row", seed=6), G1, G2)


@pytest.mark.parametrize("i", [64, 128], ids=["2i128", "2i256"])
def test_exact_gemm1_several_experts_whole_row_blocks(i):
    """GEMM1 with 2I = 128 (one CTA of 64 gated features per expert) and 2I = 256 (two): M=6 top-2 over 3
    experts, every expert routed, so each CTA's weight row tiles start at ``e * tiles_per_expert`` for
    e = 0, 1, 2; H=64 (a K tail of GEMM1's 128-deep stage)."""
    ids = torch.tensor([[0, 1], [2, 1], [1, 2], [0, 2], [2, 0], [1, 0]], dtype=torch.int32)
    keep = _check_exact(exact_moe_operands(6, 2, 3, 64, i, ids=ids, seed=10 + i), G1, G2)
    assert keep["work_list"].counts.tolist() == [4, 4, 4]


@pytest.mark.parametrize("order", ["reverse", 5], ids=["reverse", "shuffled"])
def test_fused_finalize_in_any_cta_order(order):
    """GEMM2 runs the top-k finalize (3 launches): whichever CTA of a row block arrives last -- here the
    real work slots arrive after the empty ones (reverse) or in a shuffled order -- sums every token's
    slots in slot order, with shared_out + residual, through GEMM2's split-K reduction too. M=2 top-4 (the
    fused bound): an empty slot, an expert picked twice by one token, an expert without tokens."""
    ids = torch.tensor([[0, 2, -1, 3], [2, 0, 0, 3]], dtype=torch.int32)
    ops = exact_moe_operands(2, 4, 5, 96, 32, ids=ids, shared=True, residual=True, seed=12)
    for c2 in (G2, G2_SK):
        keep = _check_exact(ops, G1, c2, order=order)
        assert keep["args2"].config.finalize and keep["args2"].fin is not None


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_one_token_runs_without_a_work_list(order):
    """One token (``direct``): no prep, work slot j is pair j read from the ids -- an empty (-1) slot and an
    expert picked twice -- GEMM2 with the finalize (+ shared_out, residual), also through split-K."""
    ids = torch.tensor([[3, 0, -1, 3]], dtype=torch.int32)
    ops = exact_moe_operands(1, 4, 5, 96, 32, ids=ids, shared=True, residual=True, seed=16)
    for c2 in (G2, G2_SK):
        keep = _check_exact(ops, G1, c2, order=order)
        assert keep["args13"].config.direct and keep["args2"].config.direct and keep["args2"].config.finalize


def test_separate_finalize_when_the_output_dtype_differs():
    """out_dtype != x dtype: GEMM2 writes y only and the finalize is its own step (the torch reference on CPU)."""
    ids = torch.tensor([[0, 2], [2, -1], [0, 0], [3, 2], [-1, 0]], dtype=torch.int32)
    ops = exact_moe_operands(5, 2, 4, 96, 32, ids=ids, seed=13)
    ops[16] = torch.float16
    keep = _check_exact(ops, G1, G2)
    assert not keep["args2"].config.finalize and keep["args2"].fin is None


def _batch_invariance(m_big, c1, c2, seed):
    ops = random_moe_operands(m_big, 2, 4, 64, 32, seed=seed)
    big = run_moe_emu(ops, c1, c2)
    for t in (0, m_big - 1):
        one = list(ops)
        one[0], one[1], one[2] = ops[0][t:t + 1], ops[1][t:t + 1], ops[2][t:t + 1]
        single = run_moe_emu(one, c1, c2)
        assert torch.equal(single[0], big[t]), f"token {t}: M=1 differs from its row in M={m_big}"
    # and the batch agrees with the contract within the documented tolerance (random data)
    want = nvfp4_moe_emulated(*ops).float()
    err = float((big.float() - want).norm() / want.norm())
    assert err < 2.0**-6, err


def test_batch_invariance_m12():
    _batch_invariance(12, G1, G2, seed=3)


@pytest.mark.emulator_full
def test_batch_invariance_m64():
    _batch_invariance(64, G1, G2, seed=4)


@pytest.mark.emulator_full
@pytest.mark.parametrize("tm", [16, 32])
def test_exact_tile_m(tm):
    c1 = C(tile_m=tm, tile_n=128, tile_k=256, num_warps=4, stages=2, pdl=True)
    c2 = C(tile_m=tm, tile_n=128, tile_k=128, num_warps=8, stages=4, pdl=True)
    g = torch.Generator().manual_seed(tm)
    ids = torch.randint(-1, 6, (37, 4), generator=g, dtype=torch.int32)
    ids[:, 0] = 5  # expert 5: 37+ pairs -> several tiles
    _check_exact(exact_moe_operands(37, 4, 6, 160, 96, ids=ids, seed=tm), c1, c2)


@pytest.mark.emulator_full
def test_exact_expert_map_router_weight_on_input_fp16():
    """Expert parallelism (global ids mapped to 3 local experts, others -1) with Llama-4-style
    router weight on the input (top-1), fp16 activations."""
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, 8, (11, 1), generator=g, dtype=torch.int32)
    ops = exact_moe_operands(11, 1, 3, 64, 32, ids=ids, seed=9, x_dtype=torch.float16)
    emap = torch.full((8,), -1, dtype=torch.int32)
    emap[torch.tensor([1, 4, 6])] = torch.arange(3, dtype=torch.int32)
    ops[13] = emap
    ops[12] = True
    ops[2] = torch.pow(2.0, torch.randint(-2, 2, (11, 1), generator=g).float())  # exact x * w
    _check_exact(ops, G1, G2)
