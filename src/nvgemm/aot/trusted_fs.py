"""Trusted-directory walking for the kernel cache: no symlinks, no foreign or shared-writable files.

The kernel cache holds shared libraries that nvgemm loads into the process, so anyone who can
write into it can run code as the user. A directory or file below the cache root is used only if

* it is not a symbolic link (every component is opened relative to its parent's descriptor with
  ``O_NOFOLLOW``, so a link swapped in after a check is refused too, never followed);
* it is owned by the current user or by root (a root-owned read-only cache shipped in a serving
  image stays loadable);
* it is not writable by group or others (``mode & 0o022 == 0``);
* a file is a regular file (a FIFO, device or directory named like a cache file is refused:
  ``O_NONBLOCK`` keeps a FIFO from blocking the open).

The root itself is opened through the path the caller configured (a symlinked ``$HOME`` is fine);
the directory that open yields must pass the same owner and mode rule. Everything else is checked
on the open descriptor (``fstat``), so what was checked is what is read. Directories and files
nvgemm creates are 0700 / 0600 whatever the umask (the mode is given to ``mkdir`` / ``open``, which
the umask can only narrow). A refusal raises :class:`UntrustedCacheError` naming the path, what is
wrong and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Iterator

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class UntrustedCacheError(PermissionError):
    """A kernel cache path is a symlink, owned by another user, writable by others, or not a regular file."""


def _fix_hint(path: str) -> str:
    return (f"fix: `chmod go-w {path}` if it is yours, or point NVGEMM_CACHE_DIR (nvgemm precompile "
            "--cache-dir) at a directory only you can write")


def check_trusted(st: os.stat_result, path: str | os.PathLike, *, want_dir: bool) -> None:
    """Raise UntrustedCacheError unless ``st`` (an fstat/lstat result of ``path``) may be trusted."""
    path = str(path)
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedCacheError(f"nvgemm kernel cache: {path} is a symbolic link; nvgemm never follows links "
                                  f"inside the cache; fix: remove it (`rm {path}`) and let nvgemm rebuild")
    if want_dir and not stat.S_ISDIR(st.st_mode):
        raise UntrustedCacheError(f"nvgemm kernel cache: {path} is not a directory; fix: remove it")
    if not want_dir and not stat.S_ISREG(st.st_mode):
        raise UntrustedCacheError(f"nvgemm kernel cache: {path} is not a regular file; fix: remove it")
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise UntrustedCacheError(
            f"nvgemm kernel cache: {path} is owned by uid {st.st_uid}, not by you (uid {me}) or root; "
            f"nvgemm loads code from its cache only from your own or root's files; "
            f"fix: point NVGEMM_CACHE_DIR at a directory of your own (or `chown -R {me} {path}`)"
        )
    if st.st_mode & 0o022:
        who = "group and others" if st.st_mode & 0o022 == 0o022 else ("group" if st.st_mode & 0o020 else "others")
        raise UntrustedCacheError(
            f"nvgemm kernel cache: {path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}), so anyone "
            f"could plant code in it; {_fix_hint(path)}"
        )


def _ensure_root_chain(root: Path) -> None:
    """Create the missing components of ``root`` with mode 0700 (``os.makedirs`` would use the umask)."""
    missing = []
    p = root
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for q in reversed(missing):
        try:
            os.mkdir(q, 0o700)
        except FileExistsError:
            pass


def open_root(root: str | os.PathLike, *, create: bool = False) -> int:
    """A descriptor of the cache root (checked); ``create`` makes it (0700) when missing.

    Raises FileNotFoundError when it is missing and ``create`` is false."""
    root = Path(root)
    if create:
        _ensure_root_chain(root)
    # the configured path is followed (a symlinked $HOME is fine); the directory it yields is checked
    return _open_checked(None, str(root), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, root, want_dir=True)


def _open_checked(dir_fd: int | None, name: str, flags: int, path: str | os.PathLike, *, want_dir: bool) -> int:
    """``openat(dir_fd, name, flags)`` whose result passes :func:`check_trusted` (else closed and
    raised); a symlink or wrong type refused by the open itself is reported the same way."""
    try:
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):  # a symlink (O_NOFOLLOW) or not a directory
            check_trusted(os.stat(name, dir_fd=dir_fd, follow_symlinks=False), path, want_dir=want_dir)
        raise
    try:
        check_trusted(os.fstat(fd), path, want_dir=want_dir)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_dir(parent_fd: int, name: str, path: str | os.PathLike, *, create: bool = False) -> int:
    """A checked descriptor of directory ``name`` under ``parent_fd`` (``path`` names it in errors);
    ``create`` makes it (0700) when missing, else FileNotFoundError."""
    try:
        return _open_checked(parent_fd, name, _DIR_FLAGS, path, want_dir=True)
    except FileNotFoundError:
        if not create:
            raise
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        pass
    return _open_checked(parent_fd, name, _DIR_FLAGS, path, want_dir=True)


def read_file(dir_fd: int, name: str, path: str | os.PathLike, *, limit: int | None = None) -> bytes:
    """The bytes of regular file ``name`` under ``dir_fd``, checked on the open descriptor.

    FileNotFoundError when absent; UntrustedCacheError when it is a link, foreign, shared-writable
    or not a regular file; ValueError when larger than ``limit``."""
    fd = _open_checked(dir_fd, name, _FILE_FLAGS, path, want_dir=False)
    try:
        size = os.fstat(fd).st_size
        if limit is not None and size > limit:
            raise ValueError(f"{path}: {size} bytes, more than the {limit} expected")
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def create_file(dir_fd: int, name: str, data: bytes) -> None:
    """Write a new file ``name`` (0600, ``O_EXCL``: never through an existing link) under ``dir_fd``."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def open_lock_file(dir_fd: int, name: str, path: str | os.PathLike) -> int:
    """A descriptor of lock file ``name`` (created 0600; an existing one must pass the checks)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    return _open_checked(dir_fd, name, flags, path, want_dir=False)


def restrict_tree(path: str | os.PathLike) -> None:
    """Make a freshly built private tree 0700 (dirs) / 0600 (files); links are removed, not followed."""
    for dirpath, dirnames, filenames in os.walk(path):
        os.chmod(dirpath, 0o700)
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            if os.path.islink(p):  # a link the tools left: dropped, never followed
                os.unlink(p)
            elif n in filenames:
                os.chmod(p, 0o600)  # subdirectories are made 0700 when the walk reaches them


@contextlib.contextmanager
def closing_fd(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


__all__ = ["UntrustedCacheError", "check_trusted", "closing_fd", "create_file", "open_dir", "open_lock_file",
           "open_root", "read_file", "restrict_tree", "write_all"]
