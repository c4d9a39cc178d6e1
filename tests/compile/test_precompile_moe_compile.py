"""`nvgemm precompile` compiles a MoE layer's grouped kernels for real (sm_100a, no GPU) into a fresh kernel
cache, and a second run compiles nothing (slow: opt-in with ``pytest -m slow`` or ``NVGEMM_TEST_SLOW=1``).

The checkpoint holds routed experts only (no dense linear), so with ``--vllm --max-m 1`` the run builds
exactly what one decode token of the layer loads: GEMM1 and GEMM2 (which runs the finalize at one token).
"""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.compile_only
pytest.importorskip("cutlass")


def _experts_only_ckpt(path, e=4, h=64, i=64, top_k=2):
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    t = {}
    for j in range(e):
        for proj, n, k in (("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)):
            p = f"model.layers.0.mlp.experts.{j}.{proj}"
            t[f"{p}.weight"] = torch.zeros(n, k // 2, dtype=torch.uint8)
            t[f"{p}.weight_scale"] = torch.ones(n, k // 16).to(torch.float8_e4m3fn)
            t[f"{p}.weight_scale_2"] = torch.tensor(0.01)
            t[f"{p}.input_scale"] = torch.tensor(0.002)
    save_file(t, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"hidden_size": h, "num_experts": e, "num_experts_per_tok": top_k}))
    return path


@pytest.mark.slow
def test_precompile_builds_the_moe_kernels_then_a_warm_rerun_compiles_nothing(tmp_path, capsys):
    from nvgemm.cli import main

    ckpt = _experts_only_ckpt(tmp_path / "ckpt")
    argv = ["precompile", "--checkpoint", str(ckpt), "--vllm", "--arch", "sm_100a", "--max-m", "1", "--jobs", "1",
            "--quiet", "--cache-dir", str(tmp_path / "kc"), "--json", str(tmp_path / "s.json")]
    assert main(argv) == 0
    first = json.loads((tmp_path / "s.json").read_text())
    assert first["counts"] == {"compiled": 2} and first["moe_kernels"] == {"sm100_moe": 2}
    assert sorted(k["label"].split()[:2] for k in first["kernels"].values()) == [["sm100_moe", "GEMM1"],
                                                                                ["sm100_moe", "GEMM2"]]
    assert main(argv) == 0
    second = json.loads((tmp_path / "s.json").read_text())
    assert second["counts"] == {"cached": 2}
    assert "compiled 0, cached 2, failed 0" in capsys.readouterr().out
