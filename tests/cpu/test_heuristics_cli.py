"""``nvgemm plan`` through the real CLI entry point (``nvgemm.cli.main``).

The expected layer shapes are the hand-computed preset values; the candidate lines are checked
against the policy called directly (same problem, same cap), so the CLI must print exactly what
the policy returns.
"""

from __future__ import annotations

import json

import pytest

from nvgemm import cli
from nvgemm.heuristics import GemmProblem, Target, candidates


@pytest.fixture
def plan_only_cli():
    # main() is the real entry point with the real COMMANDS list (all sub-commands' parsers)
    assert ("plan", "nvgemm.cli.plan") in cli.COMMANDS


def test_plan_model(plan_only_cli, capsys):
    rc = cli.main(["plan", "--model", "Llama-3.1-8B", "--gpu", "B200", "--m", "1,8,32,128"])
    out = capsys.readouterr().out
    assert rc == 0
    for layer, n, k in (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)):
        for m in (1, 8, 32, 128):
            assert f"[{layer}] M={m} N={n} K={k}" in out
    # the printed config names for one GEMM are exactly the policy's list, in order
    want = [c.name for c in candidates(GemmProblem(n=4096, k=14336, m=8, target=Target.from_gpu("B200")))]
    block = out.split("[down] M=8 N=4096 K=14336")[1].split("\n[")[0]
    got = [line.split()[1] for line in block.strip().splitlines()]
    assert got == want


def test_plan_shape_json_and_buckets(plan_only_cli, capsys):
    rc = cli.main(["plan", "--shape", "6144,4096", "--shape", "2112,7168", "--m", "1,64", "--json",
                   "--max-candidates", "3"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert [(r["n"], r["k"], r["m"]) for r in data["rows"]] == [(6144, 4096, "1"), (6144, 4096, "64"),
                                                                 (2112, 7168, "1"), (2112, 7168, "64")]
    assert all(1 <= len(r["candidates"]) <= 3 and r["status"] == "ok" for r in data["rows"])
    rc = cli.main(["plan", "--shape", "4096,4096", "--m-range", "1,100", "--json", "--no-nvmmh"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert [r["m"] for r in data["rows"]] == ["1..8", "9..16", "17..32", "33..64", "65..100"]
    assert all(c["est_runtime_us"] is None for r in data["rows"] for c in r["candidates"])


def test_plan_hopper_and_errors(plan_only_cli, capsys):
    assert cli.main(["plan", "--model", "Mistral-7B", "--gpu", "H100", "--m", "1"]) == 0
    out = capsys.readouterr().out
    assert "w4a16" in out and "nvgemm_cutedsl_sm90_w4a16_mma" in out
    assert cli.main(["plan", "--shape", "4096,4100", "--m", "1"]) == 0
    assert "no candidates: K=4100 is not a multiple of 32" in capsys.readouterr().out
    assert cli.main(["plan", "--model", "gpt-2"]) == 2
    assert "unknown model preset" in capsys.readouterr().err
    assert cli.main(["plan", "--model", "Qwen3-32B", "--gpu", "V100"]) == 2
    assert "unknown GPU" in capsys.readouterr().err


@pytest.mark.parametrize("gpu,fmt", [("RTX5090", "w4a4"), ("RTX5080", "auto"), ("GB10", "w4a4")])
def test_plan_sm120_w4a4_plans_with_the_sm120_family(plan_only_cli, capsys, gpu, fmt):
    """On sm_120a / sm_121a, ``--format w4a4`` (and ``auto``: a W4A4 family serves the arch) lists the sm120
    W4A4 family's candidates, first the policy's pick for that GPU's profile, each with a modelled time on it."""
    from nvgemm.heuristics.perfmodel import get_hardware
    from nvgemm.templates.sm120_w4a4.policy import pick_config

    rc = cli.main(["plan", "--model", "Llama-3.1-8B", "--gpu", gpu, "--m", "1,32", "--format", fmt, "--json",
                   "--no-nvmmh"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0 and data["format"] == "w4a4" and data["model_gpu"] == gpu
    hw = get_hardware(gpu)
    assert len(data["rows"]) == 8
    for r in data["rows"]:
        assert r["status"] == "ok" and r["candidates"]
        assert all(c["config"].startswith(f"nvgemm_cutedsl_sm120_w4a4_") and c["model_us"] for c in r["candidates"])
        want = pick_config(int(r["m"]), r["n"], r["k"], "none", hw.arch, hw.sm_count, gpu)
        assert r["candidates"][0]["config"] == want.name()
    assert cli.main(["plan", "--shape", "4096,4096", "--gpu", gpu, "--m", "1", "--format", "w4a16", "--json"]) == 0
    assert "sm90_w4a16_mma" in json.loads(capsys.readouterr().out)["rows"][0]["candidates"][0]["config"]
