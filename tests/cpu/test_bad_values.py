"""Bad values and ambiguous layouts at the public entry points: a clear error, never a silent wrong result."""

from __future__ import annotations

import pytest
import torch
from _reference import ref_linear_fp64

import nvgemm  # noqa: F401  (registers the ops)
from nvgemm import NVFP4Linear
from nvgemm.formats import blocked_shape, from_blocked, quantize_weight, to_blocked

# [128, 128]: N % 128 == 0 and K % 64 == 0, so the linear [N, K/16] scales flattened to 1-D have
# exactly the swizzled size (every Llama/Qwen layer has this property).
N, K = 128, 128


@pytest.fixture
def layer(seed):
    g = torch.Generator().manual_seed(seed)
    q = quantize_weight(torch.randn(N, K, generator=g))
    x = torch.randn(3, K, generator=g).bfloat16()
    return q, x


# ----------------------------------------------------------------------- item 1: swizzled layout


def test_swizzled_scales_have_a_tiled_shape(layer):
    q, x = layer
    sw = to_blocked(q.scale)
    assert tuple(sw.shape) == blocked_shape(N, K // 16) == (1, 2, 32, 4, 4)
    assert torch.equal(from_blocked(sw, N, K // 16).view(torch.uint8), q.scale.view(torch.uint8))


def test_op_refuses_flattened_linear_scales(layer):
    q, x = layer
    flat = q.scale.reshape(-1)  # a flattened linear matrix: as many bytes as the swizzled layout
    with pytest.raises(ValueError, match="ambiguous"):
        torch.ops.nvgemm.nvfp4_linear(x, q.packed, flat, q.global_scale, None, None, None, "none", None)
    with pytest.raises(ValueError, match="linear \\[N, K/16\\] scales"):
        torch.ops.nvgemm.nvfp4_linear(x, q.packed, q.scale, q.global_scale, None, None, None, "none", None)
    # the tiled shape is the one accepted, and it gives the reference's values (the bytes equal the
    # 1-D layout the op took before, so this is the same data, unmistakably labelled)
    out = torch.ops.nvgemm.nvfp4_linear(x, q.packed, to_blocked(q.scale), q.global_scale, None, None, None,
                                        "none", None)
    want, mag = ref_linear_fp64(x, q, q.global_scale, None, None, None, "none", torch.bfloat16)
    tol = 2.0**-8 * want.abs() + 2 * K * 2.0**-24 * mag + 1e-30
    assert bool(((out.double() - want).abs() <= tol).all())


def test_from_tensors_refuses_flattened_linear_scales(layer):
    q, _ = layer
    with pytest.raises(ValueError, match="1-D scales are ambiguous"):
        NVFP4Linear.from_tensors(q.packed, q.scale.reshape(-1), q.global_scale)
    a = NVFP4Linear.from_tensors(q.packed, q.scale, q.global_scale)  # linear 2-D: swizzled here
    b = NVFP4Linear.from_tensors(q.packed, to_blocked(q.scale), q.global_scale)  # already tiled
    assert torch.equal(a.weight_scale.view(torch.uint8), b.weight_scale.view(torch.uint8))
