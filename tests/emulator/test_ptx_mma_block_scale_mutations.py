"""Mutations of the block-scaled ``mma.sync`` semantics (nvgemm.emulator.ptx.ops.mma) must fail the ISA unit
tests (tests/emulator/test_ptx_mma_block_scale.py) and NVIDIA's sm_120 example runs: each mutation is a
plausible single edit of the emulator source -- the scale bytes read high byte first, rows 8..15 of scale_A taken
from the thread-id-1 lanes, scale_B column n taken from lane n, A registers a1 / a2 swapped (K + K/2 read as
row + 8), the two B registers swapped -- applied to a scratch copy of ``src/`` that a child process imports.
The unmutated copy must pass (so a kill is the edit's doing, not the harness's)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.emulator

REPO = Path(__file__).resolve().parents[2]
MMA = "src/nvgemm/emulator/ptx/ops/mma.py"
UNIT = "tests/emulator/test_ptx_mma_block_scale.py"

MUTATIONS = {
    "scale_byte_order": (
        "return (reg[lanes][:, None] >> (np.uint32(8) * sbytes[None, :])) & np.uint32(0xFF)",
        "return (reg[lanes][:, None] >> (np.uint32(8) * (np.uint32(3) - sbytes)[None, :])) & np.uint32(0xFF)"),
    "scale_a_lane_rows_8_15": (
        "SFA_LANE = (4 * (np.arange(16) % 8) + np.arange(16) // 8).astype(np.int64)",
        "SFA_LANE = (4 * (np.arange(16) % 8) + 2 * (np.arange(16) // 8)).astype(np.int64)"),
    "scale_b_lane_per_column": (
        "SFB_LANE = (4 * np.arange(8)).astype(np.int64)",
        "SFB_LANE = np.arange(8, dtype=np.int64)"),
    "a_register_order": (
        "a_pos[i] = (_G + 8 * (r % 2)) * k + _Q * epr + j + (k // 2) * (r // 2)",
        "a_pos[i] = (_G + 8 * (r // 2)) * k + _Q * epr + j + (k // 2) * (r % 2)"),
    "b_register_order": (
        "b_pos[i] = _G * k + _Q * epr + j + (k // 2) * r",
        "b_pos[i] = _G * k + _Q * epr + j + (k // 2) * (1 - r)"),
}


def mutated_src(tmp: Path, name: str | None) -> Path:
    """A copy of ``src/`` with mutation ``name`` applied (None: unmutated); its ``old`` text must occur once."""
    dst = tmp / "src"
    shutil.copytree(REPO / "src", dst, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"))
    if name is not None:
        old, new = MUTATIONS[name]
        f = dst / MMA.removeprefix("src/")
        text = f.read_text()
        assert text.count(old) == 1, f"mutation {name}: its text occurs {text.count(old)} times in {MMA}"
        f.write_text(text.replace(old, new))
    return dst


def child_env(src: Path, tmp: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src))
    for var in ("NVGEMM_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUTE_DSL_CACHE_DIR"):
        env[var] = str(tmp / var.lower())
    return env


def run_unit_tests(src: Path, tmp: Path) -> subprocess.CompletedProcess:
    probe = "import nvgemm.emulator.ptx.ops.mma as m; print('MMA_FROM', m.__file__)"
    cmd = [sys.executable, "-c", probe + "; import pytest, sys; sys.exit(pytest.main(['-q', '-x', '-p', "
           f"'no:cacheprovider', {str(REPO / UNIT)!r}]))"]
    return subprocess.run(cmd, cwd=REPO, env=child_env(src, tmp), capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("name", [None, *MUTATIONS])
def test_isa_unit_tests_kill_each_mutation(name, tmp_path):
    src = mutated_src(tmp_path, name)
    r = run_unit_tests(src, tmp_path)
    out = r.stdout + r.stderr
    assert f"MMA_FROM {src}" in out, out[-2000:]  # the child ran the scratch copy
    if name is None:
        assert r.returncode == 0, out[-3000:]
    else:
        assert r.returncode == 1 and " failed" in out, out[-3000:]  # a failed assertion, not an error


CHECKOUT = os.environ.get("NVGEMM_CUTLASS_DIR")


@pytest.mark.slow
@pytest.mark.skipif(not CHECKOUT, reason="set NVGEMM_CUTLASS_DIR to a CUTLASS checkout to run NVIDIA's examples")
@pytest.mark.parametrize("name", list(MUTATIONS))
def test_nvidia_sm120_example_fails_under_each_mutation(name, tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_nvidia_examples_mut", REPO / "bench" / "run_nvidia_examples.py")
    h = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = h
    spec.loader.exec_module(h)
    src = mutated_src(tmp_path, name)
    for k, v in child_env(src, tmp_path).items():
        monkeypatch.setenv(k, v)
    r = h.run_child(Path(CHECKOUT), h.EXAMPLES["blackwell_geforce/blockscaled_gemm_cooperative"], timeout=900,
                    schedules=("serial",))
    assert r.get("ok") is False and "outside" in r["result"], r
