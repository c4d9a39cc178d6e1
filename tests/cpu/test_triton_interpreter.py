"""Runs the real Triton kernels on CPU under ``TRITON_INTERPRET=1``, in a subprocess per file.

Triton decides between compiling and interpreting when a kernel is *defined* (at import), so the
interpreter tests (``tests/cpu/triton_interp/interp_*.py``) run in their own Python process with
``TRITON_INTERPRET=1`` set before triton is imported; nothing leaks into other test files. Run one
directly with::

    TRITON_INTERPRET=1 python -m pytest -o python_files='interp_*.py' tests/cpu/triton_interp/interp_quantize.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

INNER = Path(__file__).parent / "triton_interp"
FILES = sorted(p.name for p in INNER.glob("interp_*.py"))
REPO = Path(__file__).resolve().parents[2]


def test_interpreter_files_exist():
    assert {"interp_quantize.py", "interp_fused.py", "interp_gemm.py", "interp_moe.py"} <= set(FILES)


@pytest.mark.parametrize("name", FILES)
def test_triton_kernels_under_interpreter(name):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore::RuntimeWarning")
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider",
           "-o", "python_files=interp_*.py", str(INNER / name)]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    report = f"--- {' '.join(cmd)}\n{proc.stdout[-12000:]}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, report
    summary = proc.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary, report
