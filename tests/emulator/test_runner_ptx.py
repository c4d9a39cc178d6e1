"""The emulator's PTX source: ``ptx_for`` compiles the spec with ``keep_ptx`` once and then serves the
PTX, the image hash and the entry from its owner-only cache. That no other process's PTX can be read
for the spec (kernel names do not depend on the config; a sweep once got a 4-warp kernel's PTX for an
8-warp launch) is guarded where the PTX is produced: every keep_ptx compile gets a private dump dir
(tests/compile/test_keep_ptx_private_dump.py)."""

from __future__ import annotations

import os
import types

import pytest

from nvgemm.emulator import runner

pytestmark = pytest.mark.emulator


def test_ptx_for_compiles_with_keep_ptx_once_then_reads_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    class FakeTemplate:
        def compile(self, spec, keep_ptx=False):
            calls.append(keep_ptx)
            return types.SimpleNamespace(__ptx__=".version 9.4\n.visible .entry k()\n{\nret;\n}\n")

    import nvgemm.aot.abi as registry
    import nvgemm.templates.sm90_w4a16.common as common

    monkeypatch.setattr(registry, "get_template", lambda tid: FakeTemplate())
    monkeypatch.setattr(common, "embedded_cubin", lambda compiled: b"fatbin")
    spec = types.SimpleNamespace(template_id="x", name=lambda: "spec")
    first = runner.ptx_for(spec, "key0")
    second = runner.ptx_for(spec, "key0")
    assert calls == [True] and first == second and first[2] == "k"
    d = tmp_path / "cache" / "emulator" / "ptx" / "key0"
    assert os.path.exists(d / "kernel.ptx") and os.stat(d / "kernel.ptx").st_mode & 0o777 == 0o600
