"""The sm_120a / sm_121a grouped W4A4 MoE kernel run on the PTX emulator through its real AOT artifacts
(the production host path :func:`nvgemm.templates.sm120_moe.launch.moe_forward`: work list, per-slot
NVFP4 activations with per-expert input scales, GEMM1 with the fused SwiGLU + NVFP4 requant epilogue
writing GEMM2's operand, GEMM2, the deterministic finalize), compared **bit for bit** with the emulated
``nvfp4_moe`` (the numerics contract) on exactness-preserving data (``_sm100_moe_emu``: every fp32 sum
exact in any order, the SiLU saturated, one rounding of the same value on both sides), and GEMM1's
fused output byte for byte with the contract's quantizer of the unfused SwiGLU.

Default cases: an expert without tokens, ``-1`` ids and empty work slots, a K tail in GEMM1 (H = 96:
half a slab); every token on one expert (3 slots, split-K in GEMM1, per-row alpha, shared_out +
residual); 2I = 128 and 256 over three routed experts; tile_n = 32 with 20 tokens in one slot on
sm_121a (the GB10 profile), split-K in GEMM2. Each checks the PDL record (nothing but the stacked
weights touched before ``griddepcontrol.wait``: here nothing at all). ``-m emulator_full`` adds the
policy's picks for Qwen3-30B-A3B scaled down (``bench/results/sm120_moe_emulator_sweep.md``).
"""

from __future__ import annotations

import pytest
import torch
from isa_env import kernel_test_env

kernel_test_env("sm_120a")

from _pdl import check_pdl_prologue  # noqa: E402
from _sm100_moe_emu import exact_moe_operands, random_moe_operands  # noqa: E402
from _sm120_moe_emu import run_moe_emu  # noqa: E402

from nvgemm.core.formats import NVFP4, quantize_activation, to_blocked  # noqa: E402
from nvgemm.ops.moe import nvfp4_moe_emulated  # noqa: E402
from nvgemm.templates.sm120_moe.config import Sm120MoeConfig as C  # noqa: E402

pytestmark = pytest.mark.emulator

G1 = C(tile_n=8, tile_rows=64, tile_k=256, num_warps=2, stages=3)
G2 = C(tile_n=8, tile_rows=64, tile_k=128, num_warps=2, stages=3)


def _fused_gemm1_ref(ops, keep):
    """GEMM1's expected output per non-empty slot: the unfused SwiGLU of the slot's activations (decoded),
    rounded to the activation dtype, quantized with the expert's w2 input scale (the contract's quantizer)."""
    from nvgemm.core.formats import dequantize, from_blocked

    a1 = keep["args13"]
    x, w13, s13, g13, i2 = ops[0], ops[3], ops[4], ops[5], ops[10]
    tn, h = a1.config.tile_n, x.shape[1]
    i = w13.shape[1] // 2
    tiles = keep["work_list"].tiles.view(-1, 4)
    xs = a1.x_scale.view(torch.float8_e4m3fn).view(-1, 512 * (-(-(h // 16) // 4)))
    for j, (e, _p0, cnt, _z) in enumerate(tiles.tolist()):
        if cnt == 0:
            continue
        xd = dequantize(a1.x[j * tn:(j + 1) * tn], from_blocked(xs[j], 128, h // 16)[:tn])
        wd = dequantize(w13[e], from_blocked(s13[e].view(torch.float8_e4m3fn).reshape(-1), 2 * i, h // 16))
        acc = xd @ wd.t()
        al = g13[e].float() * ops[6][e].float()
        y = acc * al
        hh = (torch.nn.functional.silu(y[:, :i]) * y[:, i:]).to(x.dtype).float()
        q, sc = quantize_activation(hh, i2[e].float().expand(tn))
        yield j, tn, q, to_blocked(sc).view(torch.uint8).reshape(-1)


def _check_exact(ops, c1, c2, arch="sm_120a"):
    keep, launches = {}, []
    got = run_moe_emu(ops, c1, c2, keep, arch=arch, launches=launches)
    want = nvfp4_moe_emulated(*ops)
    assert got.dtype == want.dtype and got.shape == want.shape
    bad = (got.float() != want.float()).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} elements differ, first {bad[:4].tolist()}: {got[tuple(bad[0])]} vs " \
                             f"{want[tuple(bad[0])]}"
    assert want.float().abs().amax() > 0
    # GEMM1's fused requant output, byte for byte, slot by slot (codes and the slot's scale atom)
    a1 = keep["args13"]
    atom = a1.out_scale.numel() // keep["work_list"].slots
    for j, tn, q, sc in _fused_gemm1_ref(ops, keep):
        assert torch.equal(a1.out[j * tn:(j + 1) * tn], q), f"slot {j}: requantized codes differ"
        assert torch.equal(a1.out_scale[j * atom:(j + 1) * atom], sc[:atom]), f"slot {j}: scale atom differs"
    assert len(launches) == 2
    for launch in launches:
        check_pdl_prologue(launch, weights={"mW", "mWS"}, prefetch=False)
    if c1.split_k > 1 or c2.split_k > 1:
        for a in (keep["args13"], keep["args2"]):
            assert not a.count.any(), "split-K counters left non-zero"
    return keep


def test_exact_empty_expert_invalid_ids_ktail():
    """M=5, top-2 over 4 experts: expert 1 gets no token, two -1 slots, an expert picked twice by one
    token, empty work slots; H=96 (GEMM1's K tail: half a slab), I=32 (2I = 64 rows padded to 128)."""
    ids = torch.tensor([[0, 2], [2, -1], [0, 0], [3, 2], [-1, 0]], dtype=torch.int32)
    keep = _check_exact(exact_moe_operands(5, 2, 4, 96, 32, ids=ids, seed=1), G1, G2)
    wl = keep["work_list"]
    assert wl.counts.tolist() == [4, 0, 3, 1]
    assert wl.tiles.view(-1, 4)[:, 2].tolist() == [4, 3, 1, 0, 0]


def test_exact_one_expert_all_tokens_split_k_row_alpha():
    """M=19 top-1, every token on expert 2 (3 work slots of 8, 8, 3), split-K 2 in GEMM1 (K=512), per-row
    alpha (gate and up scales differ), shared_out and residual added in the finalize."""
    ids = torch.full((19, 1), 2, dtype=torch.int32)
    ops = exact_moe_operands(19, 1, 3, 512, 32, ids=ids, alpha13="row", shared=True, residual=True, seed=2)
    keep = _check_exact(ops, C(tile_n=8, tile_rows=64, tile_k=256, num_warps=2, stages=2, split_k=2), G2)
    assert keep["work_list"].tiles.view(-1, 4)[:3, 2].tolist() == [8, 8, 3]


@pytest.mark.parametrize("i", [64, 128], ids=["2i128", "2i256"])
def test_exact_gemm1_several_experts(i):
    """2I = 128 (one 128-row CTA per expert) and 256 (two): M=6 top-2 over 3 experts, every expert
    routed, so each slot reads expert e's block e * rows_padded of the stack."""
    ids = torch.tensor([[0, 1], [2, 1], [1, 2], [0, 2], [2, 0], [1, 0]], dtype=torch.int32)
    c1 = C(tile_n=8, tile_rows=128, tile_k=256, num_warps=4, stages=3)
    keep = _check_exact(exact_moe_operands(6, 2, 3, 64, i, ids=ids, seed=10 + i), c1, G2)
    assert keep["work_list"].counts.tolist() == [4, 4, 4]


def test_exact_tile32_sm121a_split_k_gemm2():
    """tile_n = 32: 20 tokens of M=24 on expert 1 in one slot, on sm_121a (the GB10 profile); GEMM2
    (K = I = 288: two stages of 256, the second partial) with split-K 2."""
    ids = torch.zeros((24, 1), dtype=torch.int32)
    ids[:20] = 1
    c1 = C(tile_n=32, tile_rows=64, tile_k=128, num_warps=2, stages=3)
    c2 = C(tile_n=32, tile_rows=64, tile_k=256, num_warps=2, stages=2, split_k=2)
    keep = _check_exact(exact_moe_operands(24, 1, 2, 64, 288, ids=ids, seed=12), c1, c2, arch="sm_121a")
    assert keep["work_list"].tiles.view(-1, 4)[:2, 2].tolist() == [4, 20]


def test_batch_invariance_random_data():
    """Gaussian W4A4 operands (unequal per-expert input scales), M=10 top-2 over 4 experts: the last
    token's output alone (M=1) equals its row inside the batch bit for bit (its B rows, its experts'
    weights, the same configs and K split); the batch agrees with the contract within the first-use
    check's bound (another summation order may move one bf16 rounding of h, then one FP4 code)."""
    ops = random_moe_operands(10, 2, 4, 64, 32, seed=3)
    big = run_moe_emu(ops, G1, G2)
    one = list(ops)
    one[0], one[1], one[2] = ops[0][9:10], ops[1][9:10], ops[2][9:10]
    assert torch.equal(run_moe_emu(one, G1, G2)[0], big[9]), "token 9: M=1 differs from its row in M=10"
    want = nvfp4_moe_emulated(*ops).float()
    err = float((big.float() - want).norm() / want.norm())
    assert err < 2.0**-6, err


def _qwen3_picks():
    """The distinct (GEMM1, GEMM2, arch) picks of the policy for Qwen3-30B-A3B (E=128, top-8, H=2048,
    I=768) over M = 1..256, per arch."""
    from nvgemm.templates.sm120_moe.policy import pick_moe_configs

    seen = {}
    for arch in ("sm_120a", "sm_121a"):
        for m in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            c1, c2 = pick_moe_configs(m, 128, 8, 2048, 768, arch)
            seen.setdefault((c1, c2, arch), m)
    return [(c1, c2, arch, m) for (c1, c2, arch), m in seen.items()]


@pytest.mark.emulator_full
@pytest.mark.parametrize("pick", _qwen3_picks(), ids=lambda p: f"{p[0].name()}-{p[1].name()}-{p[2]}-m{p[3]}")
def test_policy_picks_qwen3_30b_scaled_down(pick):
    """Each policy pick, on the Qwen3-30B-A3B routing scaled down (M=12, top-8 over 16 experts, H=512,
    I=128: several slots per busy expert, idle experts, GEMM1 over two 256-deep stages), bit-exact."""
    c1, c2, arch, _m = pick
    g = torch.Generator().manual_seed(c1.tile_n)
    ids = torch.stack([torch.randperm(16, generator=g)[:8] for _ in range(12)]).to(torch.int32)
    ids[:, 0] = 3  # expert 3: 12 pairs -> more than one slot of 8
    _check_exact(exact_moe_operands(12, 8, 16, 512, 128, ids=ids, seed=c1.tile_n), c1, c2, arch=arch)
