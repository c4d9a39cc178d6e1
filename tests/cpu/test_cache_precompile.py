"""`nvgemm precompile` on CPU with a stand-in builder: which kernels, dedupe, warm re-run, failures,
checkpoint header scan. (Real compiles: tests/compile/test_aot.py.)"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from nvgemm.cli import main
from nvgemm.heuristics import GemmProblem, Target, candidates, m_buckets
from nvgemm.heuristics.presets import get_preset
from nvgemm.aot import artifact as aot, cache as cache_mod
from nvgemm.cli.precompile import checkpoint_shapes, plan_specs
from nvgemm.aot.abi import template_id_for_config

from test_cache import fake_build  # noqa: E402  (tests/cpu is on sys.path under pytest rootdir conftest)


def _args(**kw):
    base = dict(model=None, checkpoint=None, shape=None, selftest=False, arch="sm_100a,sm_90a", gpu=None,
                sm_count=None, m_buckets=None, max_m=256, out_dtype="bf16", max_candidates=8, no_nvmmh=True)
    base.update(kw)
    return argparse.Namespace(**base)


def test_plan_specs_is_the_policy_deduplicated():
    title, specs, skipped = plan_specs(_args(model="Mistral-7B", arch="sm_100a", max_m=64))
    # Independent recomputation from the policy.
    want = set()
    target = Target.from_gpu("B200")
    for lg in get_preset("Mistral-7B").layers:
        for lo, hi in m_buckets(64):
            prob = GemmProblem(n=lg.n, k=lg.k, m_range=(lo, hi), target=target)
            want |= {c.config for c in candidates(prob, 8, use_nvmmh=False)}
    got = [s for _, s in specs]
    assert len(got) == len(set(got))  # no duplicate specs
    assert {s.config for s in got} == want
    assert {s.template_id for s in got} == {"sm100_nvfp4_gemm"}
    assert all(s.arch == "sm_100a" and s.hw.sm_count == 148 and s.a_format == "nvfp4" for s in got)
    assert all(s.epilogue.alpha == "scalar" and s.epilogue.out_dtype == torch.bfloat16 for s in got)
    assert title == "Mistral-7B" and skipped == []


def test_plan_specs_hopper_is_w4a16_and_maps_templates():
    _, specs, _ = plan_specs(_args(shape=[(4096, 4096)], arch="sm_90a", m_buckets=[8, 64]))
    assert specs and all(s.a_format == "bf16" and s.arch == "sm_90a" and s.hw.sm_count == 132 for _, s in specs)
    assert all(s.template_id == template_id_for_config(s.config) for _, s in specs)


def test_precompile_cli_builds_once_and_reports_failures(tmp_path, monkeypatch, capsys):
    built = []

    def builder(spec, out_dir, key):
        if spec.template_id.startswith("sm90"):
            raise aot.AotBuildError("no sm90 template in this test")
        built.append(key)
        return fake_build(spec, out_dir, key)

    monkeypatch.setattr(aot, "build_artifacts", builder)
    monkeypatch.setattr(cache_mod, "_dsl_available", lambda: True)
    argv = ["precompile", "--shape", "4096,4096", "--shape", "6144,4096", "--arch", "sm_100a,sm_90a",
            "--m-buckets", "8,32", "--no-nvmmh", "--jobs", "1", "--quiet", "--cache-dir", str(tmp_path / "kc"),
            "--json", str(tmp_path / "s.json")]
    assert main(argv) == 3  # some failed
    first = json.loads((tmp_path / "s.json").read_text())
    n_sm100 = first["counts"]["compiled"]
    assert n_sm100 == len(built) == len(set(built)) > 0
    assert first["counts"]["failed"] > 0
    out = capsys.readouterr().out
    assert "AotBuildError: no sm90 template in this test" in out
    assert main(argv) == 3
    second = json.loads((tmp_path / "s.json").read_text())
    assert second["counts"]["cached"] == n_sm100 and "compiled" not in second["counts"]
    assert len(built) == n_sm100  # the warm re-run compiled nothing


def test_precompile_rejects_bad_arguments(capsys):
    assert main(["precompile", "--model", "NoSuchModel", "--dry-run"]) == 2
    assert "unknown model preset" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["precompile", "--model", "Mistral-7B", "--m-buckets", "0,8"])


def test_checkpoint_shapes_from_safetensors_headers(tmp_path):
    from safetensors.torch import save_file

    t = {
        "model.layers.0.self_attn.q_proj.weight": torch.zeros(64, 32, dtype=torch.uint8),
        "model.layers.0.self_attn.q_proj.weight_scale": torch.zeros(64, 4, dtype=torch.uint8).view(torch.float8_e4m3fn),
        "model.layers.1.self_attn.q_proj.weight": torch.zeros(64, 32, dtype=torch.uint8),  # same shape: once
        "model.layers.1.self_attn.q_proj.weight_scale": torch.zeros(64, 4, dtype=torch.uint8).view(torch.float8_e4m3fn),
        "model.layers.0.mlp.down_proj.weight": torch.zeros(32, 96, dtype=torch.uint8),
        "model.layers.0.mlp.down_proj.weight_scale": torch.zeros(32, 12, dtype=torch.uint8).view(torch.float8_e4m3fn),
        "model.embed_tokens.weight": torch.zeros(10, 64, dtype=torch.bfloat16),  # not quantized
        "lm_head.weight": torch.zeros(10, 32, dtype=torch.uint8),  # uint8 but no weight_scale
    }
    save_file({k: v for k, v in t.items() if "layers.0" in k}, str(tmp_path / "a.safetensors"))
    save_file({k: v for k, v in t.items() if "layers.0" not in k}, str(tmp_path / "b.safetensors"))
    got = sorted(checkpoint_shapes(tmp_path), key=lambda x: x[1])
    assert got == [("mlp.down_proj", 32, 192), ("self_attn.q_proj", 64, 64)]
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        checkpoint_shapes(tmp_path / "missing")
