"""The PTX emulator builds shared libraries (the fake CUDA runtime, relinked kernels) into a cache
and loads them: the same trust rules as the kernel cache (issue 22 item 6). A library planted by
someone else, or in a directory others can write, is refused with an error naming it."""

from __future__ import annotations

import hashlib
import os

import pytest

from nvgemm.aot.trusted_fs import UntrustedCacheError
from nvgemm.emulator import cuda as emu_cuda


def _lib_dir(root):
    sha = hashlib.sha256(emu_cuda.SOURCE.read_bytes()).hexdigest()[:16]
    return root / "emulator" / sha


def _plant(root, lib_mode=0o600, dir_mode=0o700):
    d = _lib_dir(root)
    d.mkdir(parents=True, mode=0o700)
    so = d / emu_cuda.LIB_NAME
    so.write_bytes(b"not a library: must never be returned for loading")
    os.chmod(so, lib_mode)
    os.chmod(d, dir_mode)
    return so


@pytest.mark.parametrize("lib_mode,dir_mode,what", [
    (0o666, 0o700, "writable by group and others"),
    (0o600, 0o777, "writable by group and others"),
    (0o620, 0o700, "writable by group"),
])
def test_planted_fake_runtime_is_refused(tmp_path, monkeypatch, lib_mode, dir_mode, what):
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    _plant(tmp_path / "cache", lib_mode, dir_mode)
    with pytest.raises(UntrustedCacheError, match=what):
        emu_cuda.build_fake_runtime()


def test_symlinked_fake_runtime_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    elsewhere = tmp_path / "evil.so"
    elsewhere.write_bytes(b"planted")
    d = _lib_dir(tmp_path / "cache")
    d.mkdir(parents=True, mode=0o700)
    (d / emu_cuda.LIB_NAME).symlink_to(elsewhere)
    with pytest.raises(UntrustedCacheError, match="symbolic link"):
        emu_cuda.build_fake_runtime()


def test_own_private_library_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    so = _plant(tmp_path / "cache")
    assert emu_cuda.build_fake_runtime() == so
