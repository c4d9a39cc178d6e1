"""bench/run_nvidia_examples.py without a CUTLASS checkout (and without importing cutlass): the example list, the
refusals, the per-example child's report for a checkout that lacks the example, and the results table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[2] / "bench" / "run_nvidia_examples.py"


@pytest.fixture(scope="module")
def h():
    spec = importlib.util.spec_from_file_location("run_nvidia_examples_t", HARNESS)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_list_names_every_example_with_its_arch(h, capsys):
    assert h.main(["--list"]) == 0
    out = capsys.readouterr().out
    for ex in h.EXAMPLES.values():
        assert ex.name in out and ex.path in out
        assert ex.arch in ("sm_80", "sm_90a", "sm_100a", "sm_120a", "sm_121a")
    assert {"ampere/tensorop_gemm", "hopper/dense_gemm", "blackwell/dense_blockscaled_gemm_persistent",
            "blackwell_geforce/blockscaled_gemm_cooperative", "blackwell_geforce/dense_gemm"} <= set(h.EXAMPLES)


def test_every_example_runs_on_the_device_profile_of_its_arch(h):
    """The emulator device profile of each example has the compute capability of its arch: an sm_120a / sm_121a
    example runs on a GeForce-Blackwell profile (99 KB of shared memory per CTA, the limit its kernels are sized
    for), never on a datacenter profile that would hide an oversized launch."""
    from nvgemm.emulator.ptx.machine import DEVICES

    for ex in h.EXAMPLES.values():
        digits = ex.arch[3:].rstrip("af")
        assert DEVICES[ex.device].cc == (int(digits[:-1]), int(digits[-1])), ex.name


def test_refusals(h, tmp_path, capsys):
    with pytest.raises(SystemExit):
        h.main([])  # --cutlass is required
    with pytest.raises(SystemExit):
        h.main(["--cutlass", str(tmp_path)])  # not a checkout
    (tmp_path / "examples/python/CuTeDSL").mkdir(parents=True)
    with pytest.raises(SystemExit):
        h.main(["--cutlass", str(tmp_path), "--only", "no/such_example"])
    assert "no/such_example" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        h.main(["--cutlass", str(tmp_path), "--schedules", "serial,sideways"])
    assert "sideways" in capsys.readouterr().err


def test_schedules_are_valid_and_distinct(h):
    from nvgemm.emulator.ptx.schedule import Schedule

    made = [Schedule(*v) for v in h.SCHEDULES.values()]
    assert list(h.SCHEDULES) == ["serial", "2-resident", "all-resident"]
    assert made[0].resident == 1 and made[1].resident == 2 and made[2].resident >= 1 << 20
    assert len({(s.order, s.preferred) for s in made}) == 3


class _FakeHostFunction:
    """Stands in for EmulatedHostFunction: writes into the output what a schedule-dependent kernel would."""

    calls = []

    def __init__(self, compiled, device):
        pass

    def __call__(self, out, memory, order):
        type(self).calls.append((order, out.clone()))  # what the call found in memory
        out.add_(1.0)  # reads its output: must start from the initial contents every time
        if order.resident == 2:
            out[0] = 99.0  # a race only the 2-resident schedule shows
        return []


def test_every_schedule_starts_from_the_initial_memory_and_must_match_the_first(h, monkeypatch):
    import torch

    import nvgemm.emulator.cute_host as cute_host

    monkeypatch.setattr(cute_host, "EmulatedHostFunction", _FakeHostFunction)
    _FakeHostFunction.calls = []
    hh = h.Harness(h.EXAMPLES["hopper/dense_gemm"], tuple(h.SCHEDULES))
    out = torch.zeros(4)
    hh.emulate(None, out, memory=[out])
    assert [c[0].resident for c in _FakeHostFunction.calls] == [1, 2, 1 << 20]
    assert all(torch.equal(c[1], torch.zeros(4)) for c in _FakeHostFunction.calls)
    assert hh.schedule_mismatch == ["2-resident"]
    assert torch.equal(out, torch.ones(4))  # the first schedule's memory is left for the reference check
    assert set(hh.canceled) == set(h.SCHEDULES)


def test_child_reports_an_example_missing_from_the_checkout(h, tmp_path):
    r = h.child_main(tmp_path, "hopper/dense_gemm")
    assert r["ok"] is False and "not in this checkout" in r["result"]


def test_results_table_rows(h):
    rows = [
        {"example": "a/x", "path": "p/x.py", "arch": "sm_90a", "size": "M=1", "tolerance": "bit-exact", "ok": True,
         "result": "bit-exact", "emulate_s": 1.234, "compile_s": 5.0, "schedules": {"serial": 3, "2-resident": 2},
         "launches": [{"grid": [1, 1, 1], "block": [128, 1, 1], "cluster": [1, 1, 1], "dyn_smem": 1024,
                       "stats": {"int_div_by_zero": 2}}]},
        {"example": "a/y", "path": "p/y.py", "arch": "sm_80", "size": "M=2", "tolerance": "t", "ok": "finding",
         "result": "out-of-bounds | read"},
        {"example": "a/z", "path": "p/z.py", "arch": "sm_100a", "size": "M=3", "tolerance": "t", "ok": False,
         "result": "emulator error: UnknownOpcodeError: foo"},
    ]
    md = h.markdown(rows, "abc123", "/x")
    assert "abc123" in md
    lines = [ln for ln in md.splitlines() if ln.startswith("| `a/")]
    assert len(lines) == 3
    assert "PASS: bit-exact" in lines[0] and "1.23" in lines[0] and "(int_div_by_zero: 2)" in lines[0]
    assert "| serial 3 / 2-resident 2 |" in lines[0]
    assert "FINDING: out-of-bounds \\| read" in lines[1]
    assert "FAIL: emulator error: UnknownOpcodeError: foo" in lines[2]
