"""`nvgemm env`: versions against the supported ranges, and the Inductor piece table."""

from __future__ import annotations

from nvgemm.cli import env as env_cli
from nvgemm.cli import main


def test_env_reports_pieces_and_versions(capsys):
    rc = main(["env"])
    out = capsys.readouterr().out
    assert rc == 0, out  # CI installs inside the supported ranges
    for dist, *_ in env_cli.SUPPORTED:
        assert dist in out
    for piece in ("custom_op_autotuning", "post_grad_pre_pass", "pdl_hook", "scaled_mm_fold"):
        assert piece in out


def test_env_flags_a_version_below_the_floor(monkeypatch, capsys):
    real = env_cli._version
    monkeypatch.setattr(env_cli, "_version", lambda d: "4.7.1" if d == "nvidia-cutlass-dsl" else real(d))
    rows = {d: ok for d, _have, _floor, ok in env_cli.check_versions()}
    assert rows["nvidia-cutlass-dsl"] is False and rows["torch"] is True
    assert main(["env"]) == 1
    assert "outside the range" in capsys.readouterr().out


def test_env_prints_every_setting_with_value_source_and_tag(monkeypatch, capsys):
    from nvgemm import settings

    monkeypatch.setenv("NVGEMM_BACKEND", "emulated")
    monkeypatch.delenv("NVGEMM_SELFCHECK", raising=False)
    monkeypatch.setenv("NVGEMM_PDLL", "0")  # a typo: not a setting
    lines, ok = env_cli.settings_report()
    assert ok
    rows = {ln.split()[0]: ln.split() for ln in lines[1:] if ln.split()[0].startswith("NVGEMM_")}
    assert set(rows) == set(settings.SETTINGS)
    assert rows["NVGEMM_BACKEND"][1:] == ["emulated", "environment", "runtime"]
    assert rows["NVGEMM_SELFCHECK"][1:] == ["1", "default", "runtime"]
    assert lines[-1] == "  not nvgemm settings, ignored: NVGEMM_PDLL"
    main(["env"])
    assert "NVGEMM_BACKEND" in capsys.readouterr().out


def test_env_flags_a_setting_that_does_not_parse(monkeypatch, capsys):
    monkeypatch.setenv("NVGEMM_PDL", "maybe")
    lines, ok = env_cli.settings_report()
    assert not ok
    assert any(ln.split()[0] == "NVGEMM_PDL" and "<-- NVGEMM_PDL='maybe': expected 1 or 0" in ln for ln in lines)
    assert main(["env"]) == 1


def test_env_markdown_is_the_settings_reference(capsys):
    from nvgemm import settings

    assert main(["env", "--markdown"]) == 0
    assert capsys.readouterr().out == settings.markdown()


def test_env_names_the_kernel_backends_of_each_capability():
    """The GPU line lists the backends whose own rules take a decode linear on the device: the W4A16 mma
    kernel's backend on sm_120 / sm_121 / sm_89 / sm_86 / sm_80, Hopper's on sm_90, sm_100's for W4A4."""
    for cap in ((12, 0), (12, 1), (8, 9), (8, 6), (8, 0)):
        got = env_cli.kernel_backends(cap)
        assert "cutedsl_mma_w4a16" in got.split("(W4A4);")[1] and "cutedsl_sm90" not in got, (cap, got)
    assert "cutedsl_sm90" in env_cli.kernel_backends((9, 0)) and "mma_w4a16" not in env_cli.kernel_backends((9, 0))
    assert env_cli.kernel_backends((10, 0)).startswith("cutedsl_sm100")
    assert env_cli.kernel_backends((7, 5)) == "emulated"
