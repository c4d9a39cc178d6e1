"""q/k/v and gate/up held as one NVFP4 GEMM each (:mod:`nvgemm.nn.shards`) and the loader's default decode layout.

The fused layout computes the split layers' numbers bit for bit (the activation is quantized once with the shared
``input_scale``; unequal ``weight_scale_2`` are a per-column alpha), runs one GEMM per group eagerly and, compiled
with nvgemm, one GEMM call in the generated code (the capture pass merges the shards' identical calls)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache, run_and_get_code
from torch.utils._python_dispatch import TorchDispatchMode

import nvgemm
from nvgemm.nn.shards import NVFP4FusedShards, NVFP4LinearShard, fuse_linear_shards

H = 64


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "nvgemm":
            self.calls[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


def _lin(n, ins, seed, weight_only=False):
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(H, n, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, H, generator=g) * (0.05 * (seed + 1)))  # unequal weight_scale_2
    return nvgemm.NVFP4Linear.from_linear(lin, input_scale=None if weight_only else ins)


class Block(torch.nn.Module):
    """The shape of a transformers attention block + gated MLP: the forward calls each projection by name."""

    def __init__(self, ins=(0.004, 0.004, 0.004), weight_only=False):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (_lin(n, i, s, weight_only) for n, i, s in zip((64, 32, 32), ins, (0, 1, 2)))
        self.gate_proj, self.up_proj = _lin(96, 0.003, 3, weight_only), _lin(96, 0.003, 4, weight_only)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        h = torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x)
        return q.sum(-1) + k.sum(-1) * v.mean(-1) + h.sum(-1), q.view(*x.shape[:-1], 4, 16)


def _x(m=5):
    return (torch.randn(2, m, H, generator=torch.Generator().manual_seed(m)) * 2).to(torch.bfloat16)


@pytest.mark.parametrize("weight_only", [False, True])
def test_fused_shards_equal_the_split_layers_with_one_gemm_per_group(weight_only):
    split, x = Block(weight_only=weight_only), _x()
    fused = Block(weight_only=weight_only)
    report = fuse_linear_shards(fused)
    assert report == {":qkv_proj": None, ":gate_up_proj": None}
    assert isinstance(fused.q_proj, NVFP4LinearShard) and isinstance(fused.qkv_proj, NVFP4FusedShards)
    assert fused.qkv_proj.fused.weight_scale_2.dim() == 1  # unequal global scales: per-column alpha
    with CountOps() as c:
        got = fused(x)
    assert c.calls["nvfp4_linear"] == 2, c.calls  # qkv and gate_up
    want = split(x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # nothing is held between steps, and a changed input is recomputed
    assert fused.qkv_proj._out is None and fused.gate_up_proj._out is None
    assert torch.equal(fused(x * 2)[0], split(x * 2)[0])
    keys = set(fused.state_dict())
    assert "qkv_proj.fused.weight" in keys and not any(k.startswith(("q_proj", "k_proj", "v_proj")) for k in keys)


def test_unequal_input_scales_stay_split():
    block = Block(ins=(0.004, 0.002, 0.004))
    report = fuse_linear_shards(block)
    assert "unequal input_scale" in report[":qkv_proj"] and report[":gate_up_proj"] is None
    assert isinstance(block.q_proj, nvgemm.NVFP4Linear) and not hasattr(block, "qkv_proj")


def test_compiled_shards_run_one_gemm_per_group():
    fused, x = Block(), _x()
    fuse_linear_shards(fused)
    want = fused(x)
    torch._dynamo.reset()
    counters.clear()
    patch = {"emulate_precision_casts": True, "cpp.vec_isa_ok": False}
    with fresh_cache(), torch._inductor.config.patch(patch), nvgemm.enabled():
        got, codes = run_and_get_code(torch.compile(fused, fullgraph=True), x)
    code = "\n".join(codes)
    assert counters["nvgemm_cutedsl"]["nvfp4_linear_merged"] == 3  # q/k/v: 2 merged, gate/up: 1
    # qkv, and gate_up with SwiGLU + requant in its epilogue (the next GEMM is not nvgemm's: no prequant)
    assert code.count("torch.ops.nvgemm.nvfp4_linear_choice.default(") == 2, code
    assert "'silu_mul'" in code
    assert torch.equal(got[1], want[1])  # q: the same GEMM, bit for bit
    # the sum reads gate_up through silu(g) * u computed in fp32 from the unrounded GEMM output and rounded once
    # (the SwiGLU rewrite's documented change): the graph rounds g, u, silu(g) and the product to bf16, each
    # within 2^-8 relative; the sum over 48 products (|h| <= 0.3 here) moves by far less than 1e-2 of its size.
    torch.testing.assert_close(got[0], want[0], rtol=1e-2, atol=1e-2 * float(want[0].abs().max()))


def test_loader_default_layout_is_fused_and_bit_exact(tmp_path_factory):
    pytest.importorskip("modelopt")
    from nvgemm.integrations.modelopt import load_modelopt_checkpoint
    from nvgemm.testing import make_tiny_checkpoint

    ck = make_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "llama", "llama", "NVFP4")
    model = load_modelopt_checkpoint(ck)
    assert model.nvgemm_fused_shards == ["model.layers.0.self_attn:qkv_proj", "model.layers.0.mlp:gate_up_proj",
                                         "model.layers.1.self_attn:qkv_proj", "model.layers.1.mlp:gate_up_proj"]
    split = load_modelopt_checkpoint(ck, fuse_shards=False)
    assert split.nvgemm_fused_shards == [] and isinstance(split.model.layers[0].self_attn.q_proj, nvgemm.NVFP4Linear)
    ids = torch.randint(0, 512, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad(), CountOps() as c:
        got = model(ids).logits
    assert c.calls["nvfp4_linear"] == 2 * 4, c.calls  # per layer: qkv, o, gate_up, down
    with torch.no_grad():
        want = split(ids).logits
    assert torch.equal(got, want)
