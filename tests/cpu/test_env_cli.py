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
