"""The compile-cache identity of ``nvgemm.fused_requant_pass``, the pass vLLM takes by qualified name.

vLLM wraps a pass that is not its own ``InductorPass`` in ``CallableInductorPass``, whose ``uuid()`` -- the
value in vLLM's compile-cache key and in Inductor's FX-graph cache key -- is the sha256 of the pass's source
text (``inspect.getsource``). These tests compute that value the same way and check that it changes with the
rewrite's sources and with nvgemm's version, and stays put otherwise (the vLLM-side key itself is checked in
tests/vllm_engine/test_vllm_fused_requant.py)."""

from __future__ import annotations

import hashlib
import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import nvgemm

PACKAGE = Path(nvgemm.__file__).parent


def source_hash(fn) -> str:
    """What vLLM's CallableInductorPass uses as the pass's uuid (InductorPass.hash_source of a function)."""
    return hashlib.sha256(inspect.getsource(fn).encode("utf-8")).hexdigest()


@pytest.fixture
def package_copy(tmp_path):
    dst = tmp_path / "src" / "nvgemm"
    shutil.copytree(PACKAGE, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def _source_hash_in_subprocess(src_root: Path) -> str:
    code = ("import hashlib, inspect, nvgemm; f = nvgemm.fused_requant_pass; assert nvgemm.__file__.startswith("
            f"{str(src_root)!r}); print(hashlib.sha256(inspect.getsource(f).encode()).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(src_root)),
                         capture_output=True, text=True, check=True).stdout.split()
    return out[0]


@pytest.fixture
def rp():
    from nvgemm.integrations import requant_pass

    return requant_pass


def test_source_text_carries_version_and_rewrite_digest(rp):
    fn = nvgemm.fused_requant_pass
    uuid = fn.uuid()
    assert uuid == rp.pass_uuid(nvgemm.__version__)
    assert uuid.startswith(f"nvgemm-{nvgemm.__version__}-fused-requant-")
    assert uuid in inspect.getsource(fn)  # the text vLLM hashes names the identity
    assert (fn.__module__, fn.__qualname__) == ("nvgemm", "fused_requant_pass")  # pickles by name
    import pickle

    assert pickle.loads(pickle.dumps(fn)) is fn


def test_every_rewrite_source_folder_exists(rp):
    """A renamed folder would silently drop out of the identity."""
    for d in rp.REWRITE_SOURCES:
        assert list((PACKAGE / d).glob("*.py")), f"{d}: no .py files under the package"
    names = {p.relative_to(PACKAGE).as_posix() for p in rp.rewrite_sources()}
    assert {"integrations/inductor/requant.py", "integrations/inductor/capture.py",
            "integrations/requant_pass.py"} <= names


@pytest.mark.parametrize("edit", ["integrations/inductor/requant.py", "ops/fused.py", "core/formats.py"])
def test_identity_changes_with_the_rewrite_sources(rp, package_copy, edit):
    before = rp.pass_uuid("0.1.0", package_copy)
    with open(package_copy / edit, "a") as f:
        f.write("\n# a changed rewrite\n")
    after = rp.pass_uuid("0.1.0", package_copy)
    assert before != after
    assert source_hash(rp.make_fused_requant_pass(before)) != source_hash(rp.make_fused_requant_pass(after))


def test_identity_changes_with_the_version_only(rp, package_copy):
    assert rp.pass_uuid("0.1.0", package_copy) != rp.pass_uuid("0.2.0", package_copy)
    same = rp.pass_uuid("0.1.0", package_copy)
    with open(package_copy / "cli" / "model.py", "a") as f:  # not part of the rewrite
        f.write("\n# a CLI change\n")
    assert rp.pass_uuid("0.1.0", package_copy) == same
    assert rp.pass_uuid("0.1.0", package_copy) == rp.pass_uuid("0.1.0", PACKAGE)  # location-independent


def test_a_new_nvgemm_with_a_changed_rewrite_gets_a_new_source_hash(package_copy):
    """End to end through ``import nvgemm``: the value vLLM would key on differs after a rewrite change."""
    root = package_copy.parent
    before = _source_hash_in_subprocess(root)
    assert before == source_hash(nvgemm.fused_requant_pass)
    with open(package_copy / "integrations" / "inductor" / "requant.py", "a") as f:
        f.write("\n# a changed rewrite\n")
    assert _source_hash_in_subprocess(root) != before
