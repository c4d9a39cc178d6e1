"""Test folders run together in one pytest process, in either order, pass as they pass alone.

CuTeDSL takes its target arch from ``CUTE_DSL_ARCH`` once, when its first module is imported, and the
test modules pin that variable for their own arch before importing cutlass (``sm_90a`` for the sm90
emulator tests, ``sm_100a`` for the sm100 compile tests). Whichever module pytest imports first would
fix the arch for the whole process unless every nvgemm compile and trace sets its target itself
(:func:`nvgemm.aot.abi.cute_compile`); a trace of the tcgen05 MMA then fails with "got sm_90a".

Each order runs in a subprocess of its own (the import order is per process): one sm_90a-pinned
emulator test (a CuTe WGMMA program compiled and run on the emulator) and one sm_100a compile-only
trace (the sm100 epilogue's thread ownership, a tcgen05 tiled MMA), ~15-25 s per order on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cutlass")

pytestmark = pytest.mark.compile_only

ROOT = Path(__file__).resolve().parents[2]
#: (folder, node id): a test of each folder whose module pins CUTE_DSL_ARCH to its own arch
SM90_EMULATOR = "tests/emulator/test_isa_cute_programs.py::test_cute_wgmma_ss_tile_matches_torch"
SM100_COMPILE = ("tests/compile/test_sm100_layouts.py::test_epilogue_thread_ownership"
                 "[nvgemm_cutedsl_sm100_nvfp4_t128x8x256_c1x1_pdl-none-bfloat16]")


@pytest.mark.parametrize("order", [(SM90_EMULATOR, SM100_COMPILE), (SM100_COMPILE, SM90_EMULATOR)],
                         ids=["emulator-first", "compile-first"])
def test_folders_pass_in_one_process_in_either_order(order, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("CUTE_DSL_ARCH", "PYTEST_ADDOPTS")}
    env["CUTE_DSL_DUMP_DIR"] = str(tmp_path / "dump")
    os.makedirs(env["CUTE_DSL_DUMP_DIR"])
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore", *order],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    tail = (r.stdout + r.stderr)[-3000:]
    assert r.returncode == 0, f"{' then '.join(order)} in one process failed:\n{tail}"
    assert "2 passed" in r.stdout, tail
