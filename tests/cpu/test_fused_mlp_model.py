"""A loaded ModelOpt NVFP4 model with ``fuse_gated_mlp=True``: every W4A4 gated MLP runs the fused requant
chain (``nvgemm::nvfp4_linear_requant`` -> ``nvfp4_linear_prequant``; the ops are counted), bit-exact with
the plain chain ``down(gate_up(x))`` on the emulated backend (the requant contract is exact), and close to
the unpatched transformers MLP (which rounds gate, up, silu and the product separately)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("modelopt")

import nvgemm  # noqa: E402
from nvgemm.integrations.modelopt import NVFP4GatedMLP, fuse_gated_mlps, load_modelopt_checkpoint  # noqa: E402
from nvgemm.testing import make_tiny_checkpoint  # noqa: E402


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "nvgemm":
            self.calls[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def llama_ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "llama", "llama", "NVFP4")


def _logits(model, ids):
    with torch.no_grad(), CountOps() as c:
        out = model(ids).logits
    return out, c.calls


def test_patched_model_runs_the_fused_chain_bit_exact(llama_ckpt, monkeypatch):
    ids = torch.randint(0, 512, (2, 9), generator=torch.Generator().manual_seed(5))
    fused = load_modelopt_checkpoint(llama_ckpt, fuse_gated_mlp=True, fuse_shards=False)
    assert fused.nvgemm_fused_mlps == ["model.layers.0.mlp", "model.layers.1.mlp"]
    mlp = fused.model.layers[0].mlp
    assert isinstance(mlp, NVFP4GatedMLP) and mlp.gate_up_proj.activation == "silu_mul"
    assert mlp.gate_up_proj.out_features == 2 * mlp.down_proj.in_features == 512
    got, calls = _logits(fused, ids)
    # 2 layers: one requant + one prequant each; the 4 attention projections stay nvfp4_linear
    assert calls["nvfp4_linear_requant"] == 2 and calls["nvfp4_linear_prequant"] == 2, calls
    assert calls["nvfp4_linear"] == 8, calls
    # the plain chain down(gate_up(x)) on the same layers: equal bit for bit
    monkeypatch.setattr("nvgemm.ops.fused.fused_chain_reason", lambda device: "plain chain (test)")
    plain, calls = _logits(fused, ids)
    assert calls["nvfp4_linear_requant"] == 0 and calls["nvfp4_linear"] == 12, calls
    assert torch.equal(got, plain)
    # the unpatched transformers MLP: same weights, four roundings of h instead of one. h differs by bf16
    # ulps (measured 0.5% of its range), but down re-quantizes h to FP4, where a 1-ulp move across a code
    # boundary changes that element by up to a third of its block's amax: measured 4% of the MLP output
    # range and 9% of the logit range after two layers. Bound 15%; swapping gate and up, a wrong scale or
    # a wrong layout is O(100%).
    monkeypatch.undo()
    ref, calls = _logits(load_modelopt_checkpoint(llama_ckpt, fuse_shards=False), ids)
    assert calls["nvfp4_linear_requant"] == 0
    assert (got.float() - ref.float()).abs().max() <= 0.15 * ref.float().abs().max()
    assert not torch.equal(got, ref)  # the patch changed the computation


def test_not_patched_with_reasons(llama_ckpt):
    model = load_modelopt_checkpoint(llama_ckpt, fuse_shards=False)
    mlp = model.model.layers[1].mlp
    with torch.no_grad():
        mlp.up_proj.input_scale.mul_(2)  # one activation quantization cannot serve gate and up
    mlp0 = model.model.layers[0].mlp
    mlp0.act_fn = torch.nn.GELU()
    got = fuse_gated_mlps(model)
    assert "unequal input_scale" in got["model.layers.1.mlp"]
    assert "GELU is not SiLU" in got["model.layers.0.mlp"]
    assert not any(isinstance(m, NVFP4GatedMLP) for m in model.modules())


def test_w4a16_mlp_is_patched_and_runs_the_plain_chain(tmp_path):
    ckpt = make_tiny_checkpoint(tmp_path / "q", "qwen2", "W4A16_NVFP4")
    model = load_modelopt_checkpoint(ckpt, fuse_gated_mlp=True)
    assert len(model.nvgemm_fused_mlps) == 2
    x = torch.randn(3, 128).to(torch.bfloat16)
    mlp = model.model.layers[0].mlp
    assert "W4A16" in mlp.fused_reason(x)
    with torch.no_grad(), CountOps() as c:
        y = mlp(x)
    assert c.calls["nvfp4_linear_requant"] == 0 and c.calls["nvfp4_linear"] == 2
    assert torch.equal(y, mlp.down_proj(mlp.gate_up_proj(x)))
    assert nvgemm.NVFP4Linear  # noqa: B018
