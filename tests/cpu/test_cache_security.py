"""The kernel cache loads shared libraries: only its owner (or root) can put code in it.

Each test plays one attack from issue 22 against a cache filled by a stand-in builder whose
``kernel.so`` is a real (tiny, CUDA-free) shared library with a constructor: the constructor
appends the library's tag to a marker file, so a test sees exactly which bytes were loaded and
whether planted code ran. Ownership by another user is simulated with ``os.chown`` (root only).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from nvgemm.aot import artifact as aot, cache as cache_mod, trusted_fs
from test_cache import _spec, fake_build

LIB_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void mark(void) {
  const char *p = getenv("NVGEMM_TEST_MARKER");
  if (p) { FILE *f = fopen(p, "a"); if (f) { fputs("TAG\n", f); fclose(f); } }
}
__attribute__((visibility("default"))) int32_t nvgemm_aot_abi_version(void) { return ABI; }
__attribute__((visibility("default"))) int32_t nvgemm_aot_load(void) { return 0; }
__attribute__((visibility("default"))) int32_t nvgemm_aot_launch(void **a, int32_t n) { return 0; }
"""

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="simulating another user's files needs os.chown (root)")


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    if shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.skip("no C compiler to build the test libraries")
    d = tmp_path_factory.mktemp("libs")
    out = {}
    for tag in ("good", "evil"):
        src = d / f"{tag}.c"
        src.write_text(LIB_C.replace("TAG", tag).replace("ABI", str(aot.AOT_ABI_VERSION)))
        subprocess.run([os.environ.get("CC", "gcc"), "-shared", "-fPIC", "-o", str(d / f"{tag}.so"), str(src)],
                       check=True)
        out[tag] = (d / f"{tag}.so").read_bytes()
    return out


@pytest.fixture
def env(tmp_path, monkeypatch, libs):
    """(cache, spec, entry dir, marker path) with one published entry whose kernel.so is ``good``."""

    def build(spec, out_dir, key):
        info = fake_build(spec, out_dir, key)
        (Path(out_dir) / "kernel.so").write_bytes(libs["good"])
        return info

    monkeypatch.setattr(aot, "build_artifacts", build)
    monkeypatch.setattr(aot, "preload_cudart", lambda: None)
    monkeypatch.setattr(cache_mod, "_dsl_available", lambda: True)
    marker = tmp_path / "marker"
    monkeypatch.setenv("NVGEMM_TEST_MARKER", str(marker))
    kc = cache_mod.KernelCache(tmp_path / "kc")
    s = _spec()
    r = kc.ensure(s)
    assert r.status == "compiled"
    return kc, s, r.path, marker


def _ran(marker: Path) -> list[str]:
    return marker.read_text().split() if marker.exists() else []


def _plant(entry: Path, data: bytes, *, as_link: bool = False) -> None:
    """What an attacker who can write the entry does: new kernel.so plus a consistent meta.json."""
    so = entry / "kernel.so"
    so.unlink()
    if as_link:
        target = entry.parent / "elsewhere.so"
        target.write_bytes(data)
        so.symlink_to(target)
    else:
        so.write_bytes(data)
    mp = entry / "meta.json"
    doc = json.loads(mp.read_text())
    doc["payload"]["files"]["kernel.so"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    doc["sha256"] = cache_mod._meta_digest(doc["payload"])  # the unkeyed digest is recomputed
    mp.write_text(json.dumps(doc))


def _fresh_get(kc, s):
    return cache_mod.KernelCache(kc.root).get(s, build=False)  # another process's first load


def test_verified_entry_loads_its_own_bytes(env):
    kc, s, entry, marker = env
    k = _fresh_get(kc, s)
    assert _ran(marker) == ["good"] and k._lib.nvgemm_aot_abi_version() == aot.AOT_ABI_VERSION


@pytest.mark.parametrize("where", ["root", "fingerprint", "entry"])
def test_planted_library_in_a_world_writable_directory_is_refused(env, libs, where):
    kc, s, entry, marker = env
    d = {"root": kc.root, "fingerprint": entry.parent, "entry": entry}[where]
    os.chmod(d, 0o777)
    _plant(entry, libs["evil"])
    with pytest.raises(PermissionError, match=rf"{d}.*writable by group and others.*chmod go-w"):
        _fresh_get(kc, s)
    assert _ran(marker) == []


@as_root
@pytest.mark.parametrize("what", ["root", "entry", "kernel.so", "meta.json"])
def test_files_of_another_user_are_refused(env, libs, what):
    kc, s, entry, marker = env
    _plant(entry, libs["evil"])
    p = {"root": kc.root, "entry": entry, "kernel.so": entry / "kernel.so", "meta.json": entry / "meta.json"}[what]
    os.chown(p, 4242, 4242)
    with pytest.raises(PermissionError, match=rf"{p} is owned by uid 4242, not by you"):
        _fresh_get(kc, s)
    assert _ran(marker) == []


def test_group_writable_library_is_refused(env, libs):
    kc, s, entry, marker = env
    _plant(entry, libs["evil"])
    os.chmod(entry / "kernel.so", 0o620)
    with pytest.raises(PermissionError, match=r"kernel.so is writable by group \(mode 0620\)"):
        _fresh_get(kc, s)
    assert _ran(marker) == []


@pytest.mark.parametrize("what", ["kernel.so", "entry", "fingerprint"])
def test_symlinks_are_never_followed(env, libs, what):
    kc, s, entry, marker = env
    if what == "kernel.so":
        _plant(entry, libs["evil"], as_link=True)
        link = entry / "kernel.so"
    else:  # the directory is moved away and a link to it left in its place
        src = entry if what == "entry" else entry.parent
        _plant(entry, libs["evil"])
        moved = src.with_name(src.name + "-real")
        src.rename(moved)
        src.symlink_to(moved)
        link = src
    with pytest.raises(PermissionError, match=rf"{link} is a symbolic link"):
        _fresh_get(kc, s)
    assert _ran(marker) == []


def test_fifo_named_like_a_cache_file_is_refused_without_hanging(env):
    kc, s, entry, marker = env
    (entry / "kernel.so").unlink()
    os.mkfifo(entry / "kernel.so", 0o600)
    with pytest.raises(PermissionError, match="not a regular file"):
        _fresh_get(kc, s)


def test_swap_between_hash_and_load_loads_the_hashed_bytes(env, libs, monkeypatch):
    """The file is replaced right after its hash was computed: what is loaded must be what was hashed."""
    kc, s, entry, marker = env
    want = hashlib.sha256(libs["good"]).hexdigest()
    evil = entry.parent / "evil.so"
    evil.write_bytes(libs["evil"])
    os.chmod(evil, 0o600)
    real_sha256 = hashlib.sha256
    swapped = []

    class Spy:
        def __init__(self, *a):
            self._h = real_sha256(*a)

        def update(self, b):
            self._h.update(b)

        def hexdigest(self):
            h = self._h.hexdigest()
            if h == want and not swapped:  # kernel.so was just hashed: swap it on disk now
                os.replace(evil, entry / "kernel.so")
                swapped.append(1)
            return h

    monkeypatch.setattr(cache_mod.hashlib, "sha256", Spy)
    k = _fresh_get(kc, s)
    assert swapped and (entry / "kernel.so").read_bytes() == libs["evil"]
    assert _ran(marker) == ["good"], "the swapped-in library ran instead of the verified one"
    assert k._lib.nvgemm_aot_abi_version() == aot.AOT_ABI_VERSION


def test_created_private_whatever_the_umask(env, tmp_path):
    kc, s, entry, marker = env
    old = os.umask(0)
    try:
        kc2 = cache_mod.KernelCache(tmp_path / "new" / "deeper")
        r = kc2.ensure(s)
    finally:
        os.umask(old)
    assert r.status == "compiled"
    modes = {}
    for p in [tmp_path / "new", kc2.root, *kc2.root.rglob("*")]:
        modes[str(p.relative_to(tmp_path))] = stat.S_IMODE(p.lstat().st_mode)
    bad = {p: f"{m:04o}" for p, m in modes.items() if m not in (0o700, 0o600)}
    assert not bad, bad
    assert any(p.endswith("kernel.so") for p in modes) and any(p.endswith(".lock") for p in modes)
    assert all(m == 0o600 for p, m in modes.items() if (tmp_path / p).is_file())


def test_root_owned_read_only_cache_of_a_serving_image_loads(env, monkeypatch):
    """An image ships the cache root-owned and read-only; the serving user (here uid 1000) loads it."""
    kc, s, entry, marker = env
    if os.geteuid() != 0:
        pytest.skip("needs root to make the cache root-owned")
    for p in [kc.root, *kc.root.rglob("*")]:
        os.chown(p, 0, 0)
        os.chmod(p, 0o555 if p.is_dir() else 0o444)
    monkeypatch.setattr(trusted_fs.os, "geteuid", lambda: 1000)
    k = _fresh_get(kc, s)
    assert _ran(marker) == ["good"] and k is not None
    os.chown(entry / "kernel.so", 1001, 1001)  # but not another user's file in it
    with pytest.raises(PermissionError, match="owned by uid 1001, not by you \\(uid 1000\\) or root"):
        _fresh_get(kc, s)


def test_untrusted_error_names_path_and_fix(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    with pytest.raises(trusted_fs.UntrustedCacheError) as e:
        cache_mod.KernelCache(d).lookup(_spec())
    msg = str(e.value)
    assert str(d) in msg and "chmod go-w" in msg and "NVGEMM_CACHE_DIR" in msg


def test_corrupt_entry_in_a_read_only_cache_is_reported_not_fatal(env, monkeypatch):
    """A damaged entry of a read-only (image) cache cannot be locked or removed: warned, a miss."""
    import errno
    import warnings

    kc, s, entry, marker = env
    (entry / "kernel.so").write_bytes(b"damaged")
    fresh = cache_mod.KernelCache(kc.root)

    def read_only(*a, **k):
        raise PermissionError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(fresh, "_lock", read_only)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert fresh.lookup(s) is None
    assert any("read-only: not used" in str(x.message) for x in w)
    assert (entry / "kernel.so").exists() and _ran(marker) == []


def test_without_memfd_the_verified_bytes_load_from_a_private_copy(env, libs, monkeypatch):
    kc, s, entry, marker = env

    def no_memfd(*a, **k):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "memfd_create", no_memfd)
    k = aot.AotKernel(entry / "kernel.so", (), image=libs["good"])
    assert _ran(marker) == ["good"] and k._lib.nvgemm_aot_abi_version() == aot.AOT_ABI_VERSION
