"""The emulator's PTX source: ``keep_ptx`` compiles of different configs write the same file name
into the dump dir (kernel names do not depend on the config), so ``ptx_for`` compiles and reads
under an exclusive lock on the dump dir. Regression test for a sweep that ran two processes on one
dump dir and got a 4-warp kernel's PTX for an 8-warp launch (the interpreter's ``.reqntid`` check
caught it)."""

from __future__ import annotations

import fcntl
import os
import types

import pytest

from nvgemm.emulator import runner

pytestmark = pytest.mark.emulator


def test_keep_ptx_compile_holds_the_dump_dir_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_DSL_DUMP_DIR", str(tmp_path / "dump"))
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    seen = []

    class FakeTemplate:
        def compile(self, spec, keep_ptx=False):
            with open(tmp_path / "dump" / ".nvgemm_keep_ptx.lock", "a+") as f:  # another open file description
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    seen.append("unlocked")
                    fcntl.flock(f.fileno(), fcntl.LOCK_UN)
                except BlockingIOError:
                    seen.append("locked")
            return types.SimpleNamespace(__ptx__=".version 9.4\n.visible .entry k()\n{\nret;\n}\n")

    import nvgemm.templates.registry as registry
    import nvgemm.templates.sm90.common as common

    monkeypatch.setattr(registry, "get_template", lambda tid: FakeTemplate())
    monkeypatch.setattr(common, "embedded_cubin", lambda compiled: b"fatbin")
    spec = types.SimpleNamespace(template_id="x", name=lambda: "spec")
    ptx, sha, entry = runner.ptx_for(spec, "key0")
    assert seen == ["locked"] and entry == "k" and os.path.exists(tmp_path / "cache" / "emulator" / "ptx" / "key0")
