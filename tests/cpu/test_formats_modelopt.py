"""nvgemm's weight quantization is byte-exact with ModelOpt's NVFP4QTensor (the producer of the checkpoints)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from nvgemm.core.formats import dequantize, quantize_weight

NVFP4QTensor = pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor").NVFP4QTensor


def modelopt_quantize(w: torch.Tensor):
    qt, scale, ws2 = NVFP4QTensor.quantize(w.clone(), 16)
    return qt, scale, ws2


def assert_same_as_modelopt(w: torch.Tensor):
    qt, scale, ws2 = modelopt_quantize(w)
    ours = quantize_weight(w)
    assert torch.equal(ours.packed, qt._quantized_data), "packed E2M1 bytes differ from ModelOpt"
    assert torch.equal(ours.scale.view(torch.uint8), scale.view(torch.uint8)), "e4m3 block-scale bytes differ"
    assert ours.global_scale.dtype == torch.float32
    assert ours.global_scale.view(torch.int32).item() == ws2.float().reshape(()).view(torch.int32).item()
    # dequantization, bit for bit
    theirs = qt.dequantize(dtype=torch.float32, scale=scale, double_scale=ws2, block_sizes={-1: 16})
    mine = dequantize(ours.packed, ours.scale, ours.global_scale)
    # equal values (==): the only bit-level difference is code 0x8, which nvgemm decodes as -0.0
    # (the hardware's reading) and ModelOpt's table as +0.0
    assert torch.equal(mine, theirs)
    differs = mine.view(torch.int32) != theirs.view(torch.int32)
    assert bool((mine[differs] == 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 16), (3, 48), (64, 256), (130, 96)])
def test_random(shape, dtype, seed):
    w = (torch.randn(shape) * torch.rand(shape[0], 1) * 4).to(dtype)
    assert_same_as_modelopt(w)


def test_heavy_tails(seed):
    w = torch.distributions.StudentT(2.0).sample((96, 128))
    assert_same_as_modelopt(w)


def adversarial_weights() -> dict[str, torch.Tensor]:
    cases = {}
    # exact ties at every e2m1 boundary: global amax 6*448*step so the block scale is 448 -> step 1
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, -6.0])
    cases["ties"] = ties.reshape(1, 16).repeat(4, 1) * torch.tensor([[1.0], [2.0], [0.5], [2.0**-6]])
    z = torch.randn(8, 64)
    z[2] = 0
    z[5, 16:32] = 0
    cases["zero_blocks"] = z
    cases["near_448x6"] = torch.full((4, 32), 448.0 * 6) * torch.linspace(0.9, 1.0, 32)
    big = torch.randn(4, 64)
    big[0, 0] = 1e6  # single outlier: most blocks' scales fall under 2**-9 -> clamped
    cases["single_outlier"] = big
    tiny = torch.randn(4, 64) * 1e-3
    tiny[0, :16] = 1e-9  # a block tiny relative to the global amax
    tiny[3, 5] = 50.0
    cases["tiny_blocks"] = tiny
    cases["subnormal_quotients"] = torch.tensor([[3e38] + [1e-30] * 15, [1e-30] * 16])  # block scale underflows to 0 -> 1.0
    cases["one_element"] = torch.zeros(2, 16).index_fill_(1, torch.tensor([3]), -2.5)
    cases["negative_small"] = -torch.rand(3, 32) * 1e-2
    return cases


@pytest.mark.parametrize("name", sorted(adversarial_weights()))
def test_adversarial(name):
    assert_same_as_modelopt(adversarial_weights()[name])


@given(
    st.integers(1, 6),
    st.integers(1, 4),
    st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=1, max_size=64),
)
def test_hypothesis(rows, kblocks, vals):
    n = rows * kblocks * 16
    t = torch.tensor((vals * (n // len(vals) + 1))[:n], dtype=torch.float32).reshape(rows, kblocks * 16)
    if float(t.abs().max().float() / 2688) == 0:
        # a global scale of 0 (all-zero tensor, or amax/2688 underflowing fp32) is a documented
        # deviation: ModelOpt divides by it and exports NaN/saturated codes, nvgemm exports zeros
        t[0, 0] = 1.0
    assert_same_as_modelopt(t)


def test_given_global_scale_matches_modelopt_shard_rule(seed):
    # export sets fused shards' global scale to the group max: quantize with an external scale
    w = torch.randn(32, 64)
    ws2 = torch.tensor(w.abs().max().item() * 3 / 2688, dtype=torch.float32)
    qt, scale, _ = NVFP4QTensor.quantize(w.clone(), 16, weights_scaling_factor_2=ws2)
    ours = quantize_weight(w, global_scale=ws2)
    assert torch.equal(ours.packed, qt._quantized_data)
    assert torch.equal(ours.scale.view(torch.uint8), scale.view(torch.uint8))


def test_underflowing_global_scale_dequantizes_to_zero_like_modelopt():
    w = torch.full((1, 16), 1.401298464324817e-45)  # amax / 2688 underflows to 0 in fp32
    qt, scale, ws2 = modelopt_quantize(w)
    theirs = qt.dequantize(dtype=torch.float32, scale=scale, double_scale=ws2, block_sizes={-1: 16})
    q = quantize_weight(w)
    assert q.global_scale.item() == 0.0 and int(q.packed.count_nonzero()) == 0
    assert torch.equal(dequantize(q.packed, q.scale, q.global_scale), theirs)  # both all zeros


def test_all_zero_documented_deviation():
    # ModelOpt: 0/0 -> NaN scales (documented in nvgemm.core.formats.quantize_weight); nvgemm: zeros
    _, scale, _ = modelopt_quantize(torch.zeros(2, 16))
    assert bool(torch.isnan(scale.float()).all())
    q = quantize_weight(torch.zeros(2, 16))
    assert not bool(torch.isnan(q.scale.float()).any())
