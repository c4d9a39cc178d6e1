"""The CLI's SGLang pieces: ``nvgemm precompile --sglang`` and the SGLang plugin line of ``nvgemm env``
(no SGLang needed)."""

from __future__ import annotations

import pytest

from nvgemm.cli import main
from test_serving_plan import write_ckpt


def _listed(capsys) -> tuple[str, set[str]]:
    cap = capsys.readouterr()
    return cap.err, {line.split()[2] for line in cap.out.splitlines() if line.startswith("  missing")}


def test_precompile_sglang_lists_the_kernels_the_plugin_dispatches(tmp_path, capsys):
    """SGLang builds the same fused q/k/v and gate/up layers and per-rank shapes as vLLM (QKVParallelLinear,
    MergedColumnParallelLinear, RowParallelLinear; KV heads replicated below one per rank), and the plugin
    plans them with the same serving layer, so the kernel set equals --vllm's for every token count up to
    --max-m (the prefill chunk size, which bounds every graph size SGLang captures)."""
    ckpt = write_ckpt(tmp_path / "c")
    args = ["precompile", "--checkpoint", str(ckpt), "--tp", "2", "--arch", "sm_100a,sm_90a", "--max-m", "32",
            "--dry-run", "--cache-dir", str(tmp_path / "cache")]
    assert main([*args, "--vllm"]) == 0
    _, vllm = _listed(capsys)
    assert main([*args, "--sglang"]) == 0
    err, sglang = _listed(capsys)
    assert sglang == vllm and len(sglang) > 2
    assert "(SGLang, tp=2)" in err


def test_precompile_names_one_engine(tmp_path, capsys):
    ckpt = write_ckpt(tmp_path / "c")
    rc = main(["precompile", "--checkpoint", str(ckpt), "--vllm", "--sglang", "--arch", "sm_100a", "--dry-run",
               "--cache-dir", str(tmp_path / "cache")])
    assert rc == 2 and "--vllm and --sglang: name one engine" in capsys.readouterr().err


@pytest.mark.parametrize("env,want", [
    ({}, "plugin off (opt in with NVGEMM_SGLANG=1 or SGLANG_PLUGINS=nvgemm)"),
    ({"NVGEMM_SGLANG": "1"}, "plugin opted in"),
])
def test_env_reports_the_sglang_plugin(monkeypatch, capsys, env, want):
    from nvgemm.integrations.sglang import _compat

    monkeypatch.delenv("NVGEMM_SGLANG", raising=False)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(_compat, "installed_version", lambda: "0.5.23")
    main(["env"])
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("SGLang plugin")]
    assert line == [f"SGLang plugin (nvgemm.integrations.sglang): SGLang 0.5.23 (tested), {want}"]
    monkeypatch.setattr(_compat, "installed_version", lambda: "not installed")
    main(["env"])
    assert "SGLang plugin (nvgemm.integrations.sglang): SGLang not installed (plugin inactive)" in capsys.readouterr().out
