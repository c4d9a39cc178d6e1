"""`nvgemm precompile` builds the grouped MoE kernels (sm100_moe / sm90_moe / sm120_moe) of MoE models.

Each test reads what ``--dry-run --json`` lists and compares it with the family's policy called directly
(``moe_candidates`` / ``pick_moe_configs``): the listed configs are those candidates, as the launchers run
them -- GEMM2 with the finalize fused for calls of at most 2 tokens (sm100 / sm90), sm90's one-token
``direct`` variant. Configs are compared by name after dropping those per-call flags (``fin``, ``ew``,
``dir``); the flags are checked on their own. Real compiles: tests/compile/test_precompile_moe_compile.py.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file

from nvgemm.cli import main
from nvgemm.core.experts_layout import find_experts
from nvgemm.cli.precompile import checkpoint_shapes
from nvgemm.templates.sm90_moe.policy import moe_buckets
from nvgemm.heuristics.presets import MOE_PRESETS
from nvgemm.templates.sm100_moe import policy as p100
from nvgemm.templates.sm120_moe import policy as p120
from nvgemm.templates.sm90_moe import policy as p90

FLAGS = {"fin", "ew", "dir"}  # per-call variants of one config (finalize fused, early weights, direct)
QWEN = MOE_PRESETS["Qwen3-30B-A3B"]
#: family, arch, default SM count of the arch's default GPU (B200 / H100 / RTX 5090)
FAMILIES = (("sm100_moe", "sm_100a", 148), ("sm90_moe", "sm_90a", 132), ("sm120_moe", "sm_120a", 170))


def base(name: str) -> str:
    return "_".join(t for t in name.split("_") if t not in FLAGS)


def dry_run(tmp_path, *argv) -> dict:
    out = tmp_path / "plan.json"
    rc = main(["precompile", *argv, "--dry-run", "--cache-dir", str(tmp_path / "kc"), "--json", str(out)])
    assert rc == 0
    return json.loads(out.read_text())


def listed(doc, family):
    """{GEMM1 | GEMM2: {config names}} of ``family``'s kernels in a --dry-run --json document."""
    got = {"GEMM1": set(), "GEMM2": set()}
    for k in doc["kernels"].values():
        if k["family"] == family:
            got[k["label"].split()[1]].add(k["config"])
    return got


def policy_pairs(family, m, e, top_k, h, i, sms, n=8):
    """The family's ranked (GEMM1, GEMM2) candidates at ``m`` tokens, straight from its policy."""
    if family == "sm100_moe":
        return [(c.config13, c.config2) for c in p100.moe_candidates(p90.MoeShape("t", e, top_k, h, i), m,
                                                                     sm_count=sms, max_candidates=n)]
    if family == "sm90_moe":
        return [(c.config13, c.config2) for c in p90.moe_candidates(p90.MoeShape("t", e, top_k, h, i), m,
                                                                    sm_count=sms, max_candidates=n)]
    return [pair for pair, _ in p120.moe_candidates(m, e, top_k, h, i, "sm_120a", sms, n)]


@pytest.mark.parametrize("family,arch,sms", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_dry_run_lists_the_policys_moe_candidates(tmp_path, capsys, family, arch, sms):
    doc = dry_run(tmp_path, "--model", "Qwen3-30B-A3B", "--arch", arch, "--max-m", "64")
    want = {"GEMM1": set(), "GEMM2": set()}
    for _, hi in moe_buckets(64):
        for c1, c2 in policy_pairs(family, hi, QWEN.num_experts, QWEN.top_k, QWEN.hidden, QWEN.expert_intermediate,
                                   sms):
            want["GEMM1"].add(c1.name())
            want["GEMM2"].add(c2.name())
    got = listed(doc, family)
    assert {g: {base(n) for n in names} for g, names in got.items()} == want and want["GEMM1"]
    assert all(k["arch"] == arch for k in doc["kernels"].values())
    assert doc["moe_kernels"] == {family: sum(map(len, got.values()))}  # the summary counts them
    head = capsys.readouterr().err
    assert f"grouped MoE kernels: {family} {doc['moe_kernels'][family]}" in head and "JIT" in head
    # the per-call variants of the policy's run-time picks are there: 1 token (GEMM2 runs the finalize; on
    # sm90 without a work list) and a batch above the finalize's 2 tokens
    e, k, h, i = QWEN.num_experts, QWEN.top_k, QWEN.hidden, QWEN.expert_intermediate
    if family == "sm100_moe":
        c1, c2 = p100.pick_moe_configs(1, e, k, h, i, sms)
        assert dataclasses.replace(c2, finalize=True, early_weights=c2.pdl).name() in got["GEMM2"]
        c1, c2 = p100.pick_moe_configs(64, e, k, h, i, sms)
        assert dataclasses.replace(c2, finalize=False, early_weights=c2.pdl).name() in got["GEMM2"]
    elif family == "sm90_moe":
        c1, c2 = p90.pick_moe_configs(1, e, k, h, i, True, sms)
        assert dataclasses.replace(c1, direct=True).name() in got["GEMM1"]
        assert dataclasses.replace(c2, finalize=True, direct=True, early_weights=c2.pdl).name() in got["GEMM2"]
    else:
        c1, c2 = p120.pick_moe_configs(1, e, k, h, i, "sm_120a", sms)
        assert {c1.name()} <= got["GEMM1"] and {c2.name()} <= got["GEMM2"]


def test_dense_model_lists_no_moe_kernel(tmp_path):
    doc = dry_run(tmp_path, "--model", "Mistral-7B", "--arch", "sm_100a,sm_90a,sm_120a", "--max-m", "16")
    assert doc["kernels"] and doc["moe_kernels"] == {}
    assert not any((k["family"] or "").endswith("_moe") for k in doc["kernels"].values())


def test_an_arch_without_a_grouped_family_says_what_serves_the_experts(tmp_path, capsys):
    doc = dry_run(tmp_path, "--model", "Qwen3-30B-A3B", "--arch", "sm_103a", "--max-m", "8")
    assert doc["moe_kernels"] == {}
    reasons = [r for lbl, r in doc["skipped"] if lbl.startswith("experts")]
    assert reasons and "triton_moe" in reasons[0] and "JIT" in reasons[0]
    assert "no kernel for experts" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------- checkpoints

E, TOPK, H, I = 4, 2, 64, 64


def write_moe_ckpt(path, *, w4a16=False, gate_up_ws2=(0.01, 0.01), stacked=False):
    """A ModelOpt-layout MoE checkpoint: one dense q_proj, E experts of Qwen3-MoE per-expert tensors (or
    stacked ``gate_up_proj`` / ``down_proj``), a router; values are zeros (headers and scales are all read)."""
    path.mkdir(parents=True, exist_ok=True)
    t = {}

    def linear(p, n, k):
        t[f"{p}.weight"] = torch.zeros(n, k // 2, dtype=torch.uint8)
        t[f"{p}.weight_scale"] = torch.ones(n, k // 16).to(torch.float8_e4m3fn)
        t[f"{p}.weight_scale_2"] = torch.tensor(0.01)
        if not w4a16:
            t[f"{p}.input_scale"] = torch.tensor(0.002)

    linear("model.layers.0.self_attn.q_proj", H, H)
    t["model.layers.0.mlp.gate.weight"] = torch.zeros(E, H, dtype=torch.bfloat16)
    ex = "model.layers.0.mlp.experts"
    if stacked:
        for proj, n, k in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
            t[f"{ex}.{proj}"] = torch.zeros(E, n, k // 2, dtype=torch.uint8)
            t[f"{ex}.{proj}_weight_scale"] = torch.ones(E, n, k // 16).to(torch.float8_e4m3fn)
            t[f"{ex}.{proj}_weight_scale_2"] = torch.full((E,), 0.01)
            if not w4a16:
                t[f"{ex}.{proj}_input_scale"] = torch.full((E,), 0.002)
    else:
        for j in range(E):
            for proj, n, k in (("gate_proj", I, H), ("up_proj", I, H), ("down_proj", H, I)):
                linear(f"{ex}.{j}.{proj}", n, k)
            t[f"{ex}.{j}.gate_proj.weight_scale_2"] = torch.tensor(gate_up_ws2[0])
            t[f"{ex}.{j}.up_proj.weight_scale_2"] = torch.tensor(gate_up_ws2[1])
    save_file(t, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(dict(hidden_size=H, num_attention_heads=2, num_key_value_heads=2,
                                                      head_dim=32, num_experts=E, num_experts_per_tok=TOPK,
                                                      moe_intermediate_size=I)))
    return path


@pytest.mark.parametrize("stacked", [False, True], ids=["per_expert", "stacked"])
def test_checkpoint_experts_are_found_from_headers_and_are_not_dense_linears(tmp_path, stacked):
    ckpt = write_moe_ckpt(tmp_path / "c", stacked=stacked)
    assert checkpoint_shapes(ckpt) == [("self_attn.q_proj", H, H)]  # expert projections are not linears
    from nvgemm.core.files import checkpoint_tensors

    (lay,) = find_experts(checkpoint_tensors(ckpt))
    assert (lay.prefix, lay.num_experts, lay.hidden, lay.intermediate, lay.gated, lay.weight_only, lay.stacked) == \
        ("model.layers.0.mlp.experts", E, H, I, True, False, stacked)


def test_transposed_stacked_experts_and_inconsistent_ones():
    def u8(*shape):
        return {"dtype": "U8", "shape": list(shape)}

    ex = "m.layers.3.feed_forward.experts"
    (lay,) = find_experts({f"{ex}.gate_up_proj": u8(E, H // 2, 2 * I), f"{ex}.gate_up_proj_weight_scale": u8(1),
                           f"{ex}.down_proj": u8(E, I // 2, H)})  # Llama-4's transposed layout
    assert (lay.hidden, lay.intermediate, lay.weight_only) == (H, I, True)
    with pytest.raises(ValueError, match="fit neither"):
        find_experts({f"{ex}.gate_up_proj": u8(E, 2 * I, H // 2), f"{ex}.gate_up_proj_weight_scale": u8(1),
                      f"{ex}.down_proj": u8(E, H, I)})
    per = {}
    for j in (0, 2):  # expert 1 missing
        for p in ("gate_proj", "up_proj", "down_proj"):
            per[f"{ex}.{j}.{p}.weight"], per[f"{ex}.{j}.{p}.weight_scale"] = u8(I, H // 2), u8(1)
    with pytest.raises(ValueError, match=r"expert ids \[1\] missing"):
        find_experts(per)


@pytest.mark.parametrize("family,arch,sms", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_checkpoint_dry_run_lists_the_policys_moe_candidates(tmp_path, family, arch, sms):
    ckpt = write_moe_ckpt(tmp_path / "c", w4a16=family == "sm90_moe")
    doc = dry_run(tmp_path, "--checkpoint", str(ckpt), "--arch", arch, "--max-m", "32")
    want = {"GEMM1": set(), "GEMM2": set()}
    for _, hi in moe_buckets(32):
        for c1, c2 in policy_pairs(family, hi, E, TOPK, H, I, sms):
            want["GEMM1"].add(c1.name())
            want["GEMM2"].add(c2.name())
    got = listed(doc, family)
    assert {g: {base(n) for n in names} for g, names in got.items()} == want and want["GEMM1"]
    assert any(k["family"] not in (None, family) for k in doc["kernels"].values())  # the dense q_proj's too


def test_w4a4_experts_on_hopper_have_no_grouped_kernel(tmp_path):
    ckpt = write_moe_ckpt(tmp_path / "c")
    doc = dry_run(tmp_path, "--checkpoint", str(ckpt), "--arch", "sm_90a", "--max-m", "8")
    assert doc["moe_kernels"] == {}
    assert any(lbl.startswith("mlp.experts") and "served by triton_moe" in r for lbl, r in doc["skipped"])


@pytest.mark.parametrize("engine", ["--vllm", "--sglang"])
@pytest.mark.parametrize("tp,ep", [(1, False), (2, False), (2, True)], ids=["tp1", "tp2", "ep2"])
def test_serving_lists_exactly_the_runtime_picks(tmp_path, engine, tp, ep):
    """--vllm / --sglang: every M in 1..--max-m runs the policy's pick for its bucket (pick_moe_configs), per
    rank: I / tp under tensor parallelism, E / tp whole experts under expert parallelism."""
    ckpt = write_moe_ckpt(tmp_path / "c")
    argv = ["--checkpoint", str(ckpt), engine, "--tp", str(tp), "--arch", "sm_100a", "--max-m", "24"]
    doc = dry_run(tmp_path, *argv, *(["--expert-parallel"] if ep else []))
    e, i = (E // tp, I) if ep else (E, I // tp)
    want = {"GEMM1": set(), "GEMM2": set()}
    for m in range(1, 25):
        c1, c2 = p100.pick_moe_configs(m, e, TOPK, H, i, 148)
        want["GEMM1"].add(c1.name())
        want["GEMM2"].add(c2.name())
    got = listed(doc, "sm100_moe")
    assert {g: {base(n) for n in names} for g, names in got.items()} == want
    # one kernel per distinct (config, call variant): GEMM2 fused for M <= 2, unfused above
    assert any("_fin" in n for n in got["GEMM2"]) and any("_fin" not in n for n in got["GEMM2"])


def test_serving_per_row_alpha_when_gate_and_up_scales_differ(tmp_path):
    ckpt = write_moe_ckpt(tmp_path / "c", gate_up_ws2=(0.01, 0.02))
    doc = dry_run(tmp_path, "--checkpoint", str(ckpt), "--vllm", "--arch", "sm_100a", "--max-m", "4")
    g1 = [n for n, k in doc["kernels"].items() if k["family"] == "sm100_moe" and k["label"].split()[1] == "GEMM1"]
    assert g1 and all("_avector-" in n for n in g1)


def test_expert_parallel_needs_a_serving_engine(tmp_path, capsys):
    ckpt = write_moe_ckpt(tmp_path / "c")
    assert main(["precompile", "--checkpoint", str(ckpt), "--expert-parallel", "--arch", "sm_100a", "--dry-run"]) == 2
    assert "--expert-parallel" in capsys.readouterr().err


def test_serving_needs_num_experts_per_tok(tmp_path, capsys):
    ckpt = write_moe_ckpt(tmp_path / "c")
    (ckpt / "config.json").write_text(json.dumps({"hidden_size": H}))
    assert main(["precompile", "--checkpoint", str(ckpt), "--vllm", "--arch", "sm_100a", "--dry-run"]) == 2
    assert "num_experts_per_tok" in capsys.readouterr().err


# --------------------------------------------------------------------- the launchers' call_kernels

@pytest.mark.parametrize("m", [1, 2, 3, 9])
@pytest.mark.parametrize("family", ["sm100_moe", "sm90_moe", "sm120_moe"])
def test_call_kernels_are_what_moe_forward_launches(family, m):
    """Each launcher's ``call_kernels`` (what precompile builds) names the (config, epilogue) its ``moe_forward``
    hands to ``launch``: the host path runs on CPU with a launch that only records (torch-path routing; the
    kernels' outputs are never read for this)."""
    import importlib

    from nvgemm.core.backend import MoeProblem
    from nvgemm.dispatch.moe import selfcheck_inputs

    launch_mod = importlib.import_module(f"nvgemm.templates.{family}.launch")
    p = MoeProblem(m=m, top_k=TOPK, num_experts=E, num_global_experts=E, hidden=H, intermediate=I,
                   activation="silu_mul", weight_only=family == "sm90_moe", alpha13="expert", x_dtype=torch.bfloat16,
                   out_dtype=torch.bfloat16, device_type="cpu", capability=None, router_weight_on_input=False,
                   expert_map=False, shared_out=False, residual=False)
    (x, ids, wts, w13, s13, g13, i13, w2, s2, g2, i2, act, rwoi, emap, shared, res, out_dtype) = \
        selfcheck_inputs(p, torch.device("cpu"))
    recorded = []

    def launch(a):
        recorded.append((a.config, a.spec))

    if family == "sm100_moe":
        c1, c2 = p100.pick_moe_configs(m, E, TOPK, H, I, 148)
        launch_mod.moe_forward(x, ids, emap, wts, w13, s13, g13, i13, w2, s2, g2, i2, act, rwoi, shared, res,
                               out_dtype, c1, c2, launch)
        want = launch_mod.call_kernels(m, TOPK, c1, c2, x.dtype, out_dtype)
    elif family == "sm90_moe":
        c1, c2 = p90.pick_moe_configs(m, E, TOPK, H, I, True, 132)
        launch_mod.moe_forward(x, ids, emap, wts, w13, s13, g13, w2, s2, g2, act, rwoi, shared, res, out_dtype,
                               c1, c2, launch)
        want = launch_mod.call_kernels(m, TOPK, c1, c2, x.dtype, act, out_dtype)
    else:
        c1, c2 = p120.pick_moe_configs(m, E, TOPK, H, I, "sm_120a", 170)
        launch_mod.moe_forward(x, ids, emap, wts, w13, s13, g13, i13, w2, s2, g2, i2, act, rwoi, shared, res,
                               out_dtype, c1, c2, launch)
        want = launch_mod.call_kernels(c1, c2, x.dtype)
    assert recorded == list(want)
    if family != "sm120_moe":  # GEMM2 runs the finalize for at most 2 tokens
        assert want[1][0].finalize == (m <= 2)
