"""Shared setup of the ISA kernel tests in this folder (imported before cutlass): the target arch pinned, a
private CuTe dump dir, and module-level skips without cutlass or gcc (the emulator relinks artifacts)."""

import os
import shutil
import tempfile

import pytest


def kernel_test_env(arch: str) -> None:
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    if "CUTE_DSL_DUMP_DIR" not in os.environ:
        os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="nvgemm_cute_dump_")
    pytest.importorskip("cutlass")
    if shutil.which("gcc") is None:
        pytest.skip("the emulator relinks artifacts with gcc", allow_module_level=True)
