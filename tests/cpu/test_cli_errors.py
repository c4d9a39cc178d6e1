"""Every bad command line: a nonzero exit and one stderr line naming the problem, never a traceback
(issue 22 item 10). Run through ``nvgemm.cli.main(argv)`` in-process (argparse errors exit with
SystemExit(2)); the commands stop before any kernel is built (``--dry-run``) or model is loaded."""

from __future__ import annotations

import json
import os

import pytest

from nvgemm import cli


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    (d / "short.safetensors").write_bytes(b"abc")  # under 8 bytes
    short = d / "shortck"
    short.mkdir()
    (short / "model.safetensors").write_bytes(b"abc")
    badjson = d / "badjson"
    badjson.mkdir()
    (badjson / "config.json").write_text('{"model_type": "llama",')
    (badjson / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")
    strgs = d / "strgs"
    strgs.mkdir()
    (strgs / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (strgs / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4", "group_size": "16"}}))
    (d / "afile").write_text("x")
    fifo = d / "fifock"
    fifo.mkdir()
    os.mkfifo(fifo / "model.safetensors")
    return d


S = ["--shape", "4096,4096", "--dry-run"]
CASES = [
    # (argv with {d} = the fixture folder, words the message must contain)
    (["demo", "--checkpoint", "{d}/missing"], ["no config.json"]),
    (["demo", "--checkpoint", "{d}/badjson"], ["badjson/config.json", "invalid JSON", "line 1"]),
    (["demo", "--checkpoint", "{d}/strgs"], ["group_size '16' (str)", "integer 16"]),
    (["demo", "--batch", "0"], ["--batch", "positive integer"]),
    (["demo", "--batch", "-3"], ["--batch", "positive integer"]),
    (["demo", "--prompt-len", "0"], ["--prompt-len", "positive integer"]),
    (["demo", "--tokens", "-1"], ["--tokens", "positive integer"]),
    (["demo", "--device", "foo"], ["--device", "'foo'"]),
    (["precompile", "--checkpoint", "{d}/shortck", "--dry-run", "--arch", "sm_100a"], ["3 bytes, too short"]),
    (["precompile", "--checkpoint", "{d}/short.safetensors", "--dry-run", "--arch", "sm_100a"], ["not a directory"]),
    (["precompile", "--checkpoint", "{d}/fifock", "--dry-run", "--arch", "sm_100a"], ["is a FIFO"]),
    (["precompile", "--vllm", "--checkpoint", "{d}/badjson", "--dry-run", "--arch", "sm_100a"],
     ["badjson/config.json", "invalid JSON"]),
    (["precompile", "--vllm", "--checkpoint", "{d}/shortck", "--dry-run", "--arch", "sm_100a"], ["config.json"]),
    (["precompile", *S, "--arch", "sm_100a", "--template-module", "no_such_module_xyz"], ["--template-module",
                                                                                           "no_such_module_xyz"]),
    (["precompile", *S, "--arch", "sm_100a", "--cache-dir", "{d}/afile"], ["--cache-dir", "not a directory"]),
    (["precompile", *S, "--arch", "sm_75"], ["--arch sm_75", "not an arch"]),
    (["precompile", *S, "--arch", "sm_75", "--gpu", "B200"], ["--arch sm_75", "not an arch"]),
    (["precompile", *S, "--arch", "sm_100a", "--gpu", "H100"], ["--gpu H100", "--arch sm_100a"]),
    (["precompile", *S, "--arch", "sm_100a", "--sm-count", "0"], ["--sm-count"]),
    (["precompile", *S, "--arch", "sm_100a", "--gpu", "Z999"], ["unknown GPU 'Z999'"]),
    (["precompile", *S, "--arch", ""], ["--arch ''", "names no arch", "sm_100a"]),
    (["precompile", *S, "--arch", " , "], ["--arch ' , '", "names no arch"]),
    (["precompile", "--selftest", "--dry-run", "--arch", ""], ["--arch ''", "names no arch"]),
    (["precompile", "--selftest", "--dry-run", "--arch", "sm_75"], ["--arch sm_75", "no selftest kernel", "sm_90a"]),
    (["precompile", "--shape", "3,5", "--dry-run", "--arch", "sm_100a"], ["no kernel to build", "N=3 K=5"]),
    (["plan", "--shape", "4096,4096", "--m-range", "256,1"], ["--m-range", "LO <= HI"]),
    (["plan", "--shape", "4096,4096", "--sm-count", "0"], ["--sm-count"]),
    (["plan", "--model", "NoSuchModel"], ["unknown model preset"]),
    (["plan", "--shape", "4096"], ["--shape", "two comma-separated"]),
    (["model", "--config", "nonsense_config", "--shape", "4096,4096"], ["nonsense_config"]),
    (["model", "--best", "nope.family", "--shape", "4096,4096"], ["'nope.family'", "not a known family",
                                                                  "sm100.nvfp4", "sm90.mma", "sm90.wgmma"]),
    (["model", "--best", "sm90.mma,nope", "--shape", "4096,4096"], ["'nope'", "not a known family"]),
    (["model", "--best", ",", "--shape", "4096,4096"], ["--best ','", "not a known family"]),
]


@pytest.mark.parametrize("argv,words", CASES, ids=[" ".join(a).replace("{d}/", "") for a, _ in CASES])
def test_bad_command_line_is_one_clear_line(files, capsys, argv, words):
    argv = [a.replace("{d}", str(files)) for a in argv]
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("usage:") and not ln.startswith(" ")]
    assert rc not in (0, None), f"exit 0 on {argv}"
    assert "Traceback" not in err
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_unexpected_errors_are_one_line_too(monkeypatch, capsys):
    import nvgemm.cli.plan as plan_cli

    def boom(args):
        raise RuntimeError("something deep\nwith a second line")

    monkeypatch.setattr(plan_cli, "run", boom)  # main() builds the parser, which binds plan_cli.run
    assert cli.main(["plan", "--shape", "4096,4096"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "nvgemm plan: error: RuntimeError: something deep (set NVGEMM_DEBUG=1 for the traceback)"
    monkeypatch.setenv("NVGEMM_DEBUG", "1")
    with pytest.raises(RuntimeError, match="something deep"):
        cli.main(["plan", "--shape", "4096,4096"])
    monkeypatch.setenv("NVGEMM_DEBUG", "maybe")  # a bad value: one line naming it, before the command runs
    assert cli.main(["plan", "--shape", "4096,4096"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("nvgemm plan: error: NVGEMM_DEBUG='maybe': expected 1 or 0 (also true/false, yes/no, "
                           "on/off)")

