"""keep_ptx compiles never share a dump file with another process (the emulator registers that PTX)."""

from __future__ import annotations

import os
import types

import pytest

cutlass = pytest.importorskip("cutlass")
cute = pytest.importorskip("cutlass.cute")

pytestmark = pytest.mark.compile_only


def test_keep_ptx_compile_writes_nothing_into_the_shared_dump_dir():
    """CuTeDSL writes <dump dir>/<kernel name>.<arch>.ptx and reads it back during cute.compile; kernel
    names do not depend on nvgemm's config, so a shared dump dir let one process read another's PTX for
    an emulator launch. compile_for_target gives each keep_ptx compile a private dump dir and removes it.
    Before the fix the PTX file was left in CUTE_DSL_DUMP_DIR (this test failed)."""
    from cutlass.cute.runtime import make_fake_compact_tensor

    from nvgemm.aot.abi import compile_for_target

    @cute.kernel
    def bump(x: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        x[tidx] = x[tidx] + 1.0

    @cute.jit
    def host(x: cute.Tensor):
        bump(x).launch(grid=[1, 1, 1], block=[32, 1, 1])

    shared = os.environ["CUTE_DSL_DUMP_DIR"]  # set by tests/conftest.py before CuTeDSL reads it
    os.makedirs(shared, exist_ok=True)
    before = set(os.listdir(shared))
    t = make_fake_compact_tensor(cutlass.Float32, (32,))
    for _ in range(2):  # a second compile of the same function must read its own PTX again
        ptx = compile_for_target(host, [t], types.SimpleNamespace(arch="sm_90a"), "--keep-ptx").__ptx__
        assert isinstance(ptx, str) and ".entry" in ptx and ".target sm_90a" in ptx
    assert set(os.listdir(shared)) == before
