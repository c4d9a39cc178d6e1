"""nvgemm.dispatch.serving_plan: the GEMMs a vLLM serve runs per rank, the kernel each M dispatches to,
and ``nvgemm precompile --checkpoint --vllm --tp`` listing exactly those kernels."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from nvgemm.dispatch.registry import LinearProblem
from nvgemm.dispatch.serving_plan import ServedGemm, plan, shard_runs, vllm_gemms


def write_ckpt(path, *, hidden=128, inter=224, heads=4, kv_heads=2, ws2=None, ins=None, w4a16=False, bias=False):
    """A ModelOpt-layout folder (headers and scales are all the planner reads; codes are zeros)."""
    path.mkdir(parents=True, exist_ok=True)
    hd = hidden // heads
    shapes = {"self_attn.q_proj": (heads * hd, hidden), "self_attn.k_proj": (kv_heads * hd, hidden),
              "self_attn.v_proj": (kv_heads * hd, hidden), "self_attn.o_proj": (hidden, heads * hd),
              "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
    ws2, ins = ws2 or {}, ins or {}
    t = {}
    for name, (n, k) in shapes.items():
        p = f"model.layers.0.{name}"
        t[f"{p}.weight"] = torch.zeros(n, k // 2, dtype=torch.uint8)
        t[f"{p}.weight_scale"] = torch.ones(n, k // 16).to(torch.float8_e4m3fn)
        t[f"{p}.weight_scale_2"] = torch.tensor(ws2.get(name, 0.01))
        if not w4a16:
            t[f"{p}.input_scale"] = torch.tensor(ins.get(name, 0.002))
        if bias and name.endswith(("q_proj", "k_proj", "v_proj", "o_proj")):
            t[f"{p}.bias"] = torch.zeros(n, dtype=torch.bfloat16)
    save_file(t, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(dict(hidden_size=hidden, num_attention_heads=heads,
                                                      num_key_value_heads=kv_heads, intermediate_size=inter)))
    return path


def by_layer(gemms):
    out = {}
    for g in gemms:
        out.setdefault(g.layer.rsplit(".", 1)[-1], []).append(g)
    return out


def test_shard_runs():
    assert shard_runs([1.0, 1.0, 1.0], [2.0, 2.0, 2.0]) == [([0, 1, 2], False)]
    assert shard_runs([1.0, 3.0, 1.0], [2.0, 2.0, 2.0]) == [([0, 1, 2], True)]
    assert shard_runs([1.0, 3.0], None) == [([0, 1], True)]
    assert shard_runs([1.0, 1.0, 5.0], [2.0, 4.0, 4.0]) == [([0], False), ([1, 2], True)]


def test_vllm_fuses_and_shards_like_the_engine(tmp_path):
    ckpt = write_ckpt(tmp_path / "c")
    g1 = by_layer(vllm_gemms(ckpt, 1))
    assert g1["qkv_proj"] == [ServedGemm("model.layers.0.self_attn.qkv_proj", 256, 128, False, "scalar", False)]
    assert g1["gate_up_proj"] == [ServedGemm("model.layers.0.mlp.gate_up_proj", 448, 128, False, "scalar", False)]
    assert [(g.n, g.k) for g in g1["down_proj"]] == [(128, 224)]
    g2 = by_layer(vllm_gemms(ckpt, 2))
    assert [(g.n, g.k) for g in g2["qkv_proj"]] == [(128, 128)]  # column-parallel: N/2
    assert [(g.n, g.k) for g in g2["gate_up_proj"]] == [(224, 128)]
    assert [(g.n, g.k) for g in g2["down_proj"]] == [(128, 112)]  # row-parallel: K/2 = 112 (not 32-aligned)
    assert [(g.n, g.k) for g in g2["o_proj"]] == [(128, 64)]


def test_kv_heads_replicate_and_row_bias_is_rank0s(tmp_path):
    ckpt = write_ckpt(tmp_path / "c", kv_heads=2, bias=True, inter=256)
    g4 = by_layer(vllm_gemms(ckpt, 4))
    assert [g.n for g in g4["qkv_proj"]] == [32 + 32 + 32]  # 1 q head + one replicated k and v head
    assert {g.bias for g in g4["o_proj"]} == {True, False}  # rank 0 adds the bias, ranks 1-3 do not
    assert {g.bias for g in g4["qkv_proj"]} == {True}


def test_unequal_shard_scales(tmp_path):
    ckpt = write_ckpt(tmp_path / "a", ws2={"self_attn.k_proj": 0.03})
    assert [(g.n, g.alpha) for g in by_layer(vllm_gemms(ckpt))["qkv_proj"]] == [(256, "vector")]
    ckpt = write_ckpt(tmp_path / "b", ins={"mlp.up_proj": 0.004})
    assert [(g.n, g.alpha) for g in by_layer(vllm_gemms(ckpt))["gate_up_proj"]] == [(224, "scalar"), (224, "scalar")]
    w = by_layer(vllm_gemms(write_ckpt(tmp_path / "w", w4a16=True)))
    assert all(g.weight_only for gs in w.values() for g in gs)


def test_tp_that_splits_a_scale_block_is_refused(tmp_path):
    ckpt = write_ckpt(tmp_path / "c", inter=224)
    with pytest.raises(ValueError, match="whole 16-element blocks"):
        vllm_gemms(ckpt, 4)  # 224 / 4 = 56, not a multiple of 16


def problem(m, n, k, cap, weight_only=False):
    return LinearProblem(m, n, k, "cuda", cap, weight_only, torch.bfloat16, torch.bfloat16, "scalar", False, "none", False)


def test_unaligned_per_rank_k_falls_back_to_a_backend_that_accepts_it():
    c = plan(problem(1, 128, 112, (10, 0)))
    assert c.backend != "cutedsl_sm100"
    assert any(b == "cutedsl_sm100" and "K=112 is not a multiple of 32" in r for b, r in c.passed_over)
    c = plan(problem(1, 128, 112, (9, 0), weight_only=True))
    assert c.backend != "cutedsl_sm90" and any(b == "cutedsl_sm90" for b, _ in c.passed_over)
    c = plan(problem(1, 128, 128, (10, 0)))
    assert c.backend == "cutedsl_sm100" and c.spec is not None and c.config.name() in c.spec.name()


def test_precompile_vllm_lists_exactly_the_dispatched_kernels(tmp_path, capsys):
    from nvgemm.cli import main

    ckpt = write_ckpt(tmp_path / "c")
    want = set()
    for g in vllm_gemms(ckpt, 2):
        for m in range(1, 33):
            for cap in ((10, 0), (9, 0)):
                p = LinearProblem(m, g.n, g.k, "cuda", cap, g.weight_only, torch.bfloat16, torch.bfloat16, g.alpha,
                                  g.bias, "none", False)
                c = plan(p, 148 if cap[0] == 10 else 132)
                if c.spec is not None:
                    want.add(c.spec.name())
    rc = main(["precompile", "--checkpoint", str(ckpt), "--vllm", "--tp", "2", "--arch", "sm_100a,sm_90a",
               "--max-m", "32", "--dry-run", "--cache-dir", str(tmp_path / "cache")])
    assert rc == 0
    listed = {line.split()[2] for line in capsys.readouterr().out.splitlines() if line.startswith("  missing")}
    assert listed == want and len(want) > 2
    assert any("_sm_90a" in s for s in want) and any("_sm_100a" in s for s in want)


@pytest.mark.parametrize("text", ["[1, 2]", '"llama"', "null"])
def test_a_config_that_is_not_an_object_is_refused_by_name(tmp_path, text):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError, match=r"config\.json: holds a .*expected a JSON object"):
        vllm_gemms(tmp_path)
