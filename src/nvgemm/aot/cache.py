"""On-disk kernel cache: AOT-linked kernels keyed by CompileSpec, safe across processes.

Layout (``root`` = ``NVGEMM_CACHE_DIR``, else the repo checkout's top-level ``kernels_cache/`` when
it exists, else ``$XDG_CACHE_HOME/nvgemm/kernels``)::

    root/<fingerprint id>/fingerprint.json      versions + kernel-source hash behind the id
    root/<fingerprint id>/<key>/kernel.so       linked library (only needs libcudart.so.13)
                               /kernel.o, kernel.h, shim.c   export_to_c output + shim (for audits)
                               /meta.json       ABI, symbols, spec, timings, sha256 of every file,
                                                and a sha256 of itself (the commit marker)
    root/<fingerprint id>/<key>.lock            per-key flock

Writers build into a private temp dir next to the entry and ``os.rename`` it into place while
holding the per-key exclusive lock, re-checking inside the lock, so N processes asking for the same
key compile it once. Readers need no lock: a published entry is immutable. A truncated or
bit-flipped file fails its checksum: it is reported once per process (``warnings`` + log), moved
aside and rebuilt. An entry from another toolchain / nvgemm source version lives under another
fingerprint id, so it is simply a miss. Warm loads never import cutlass.

Trust: the entries are shared libraries loaded into the process, so every directory and file is
opened through descriptors that refuse symlinks, other users' files and group/other-writable
modes, and what is created is 0700 / 0600 (:mod:`.trusted_fs`). ``kernel.so`` is read once, its
bytes are checked against ``meta.json`` and exactly those bytes are loaded
(:func:`nvgemm.aot.artifact.load_image`): no constructor of an unverified or swapped file runs.
The ``meta.json`` digest detects damage only; it needs no key, since only the cache's owner (or
root) can write it.

When cutlass-dsl is not installed (a serving box), lookups accept entries from any fingerprint whose
kernel-source hash matches this nvgemm (the DSL version that built them cannot be known here, and
the linked library does not depend on it); misses raise instead of compiling.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from nvgemm import settings
from nvgemm.aot.abi import CompileSpec, abi_from_json

from nvgemm.aot.compile_spec import KEY_VERSION, compile_key, fingerprint, spec_json
from nvgemm.aot.trusted_fs import (
    UntrustedCacheError,
    closing_fd,
    create_file,
    open_dir,
    open_lock_file,
    open_root,
    read_file,
    restrict_tree,
)
from nvgemm.aot.artifact import AOT_ABI_VERSION

log = logging.getLogger("nvgemm_cutedsl.cache")

ENTRY_FILES = ("kernel.so", "kernel.o", "kernel.h", "shim.c")
_REPORTED: set[str] = set()
_REPO_ROOT = Path(__file__).resolve().parents[3]


def default_cache_dir() -> Path:
    if settings.NVGEMM_CACHE_DIR is not None:
        return settings.NVGEMM_CACHE_DIR
    repo_cache = _REPO_ROOT / "kernels_cache"
    if repo_cache.is_dir() and (_REPO_ROOT / "pyproject.toml").is_file():
        return repo_cache
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nvgemm" / "kernels"


def _sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _meta_digest(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class CacheMiss(LookupError):
    pass


class CorruptEntry(Exception):
    pass


@dataclass
class CacheResult:
    key: str
    status: str  # "cached" | "compiled" | "failed"
    path: Path | None = None
    meta: dict | None = None
    error: str = ""
    seconds: float = 0.0


def _dsl_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("cutlass") is not None


class KernelCache:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.fid, self.fingerprint_info = fingerprint()
        self._mem: dict[str, Any] = {}
        self._by_spec: dict[CompileSpec, Any] = {}
        self._mem_lock = threading.Lock()
        self.stats = {"compiled": 0, "loaded": 0, "corrupt": 0, "miss": 0}

    # ---- paths -------------------------------------------------------------------------
    def fp_dir(self, fid: str | None = None) -> Path:
        return self.root / (fid or self.fid)

    def key(self, spec: CompileSpec, fid: str | None = None) -> str:
        return compile_key(spec, fid or self.fid)

    def entry_dir(self, spec: CompileSpec) -> Path:
        return self.fp_dir() / self.key(spec)

    @contextlib.contextmanager
    def _fp_fd(self, fid: str, *, create: bool) -> Iterator[int]:
        """A checked descriptor of ``root/<fid>`` (see :mod:`.trusted_fs`); created 0700 when asked."""
        with closing_fd(open_root(self.root, create=create)) as rfd:
            with closing_fd(open_dir(rfd, fid, self.root / fid, create=create)) as fd:
                yield fd

    @contextlib.contextmanager
    def _lock(self, fid: str, key: str) -> Iterator[None]:
        with self._fp_fd(fid, create=True) as dfd:
            fd = open_lock_file(dfd, f"{key}.lock", self.fp_dir(fid) / f"{key}.lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _write_fingerprint(self) -> None:
        with self._fp_fd(self.fid, create=True) as dfd:
            try:
                os.stat("fingerprint.json", dir_fd=dfd, follow_symlinks=False)
                return
            except FileNotFoundError:
                pass
            tmp = f".fingerprint.{os.getpid()}.{threading.get_ident()}.tmp"
            create_file(dfd, tmp, json.dumps(self.fingerprint_info, indent=1, sort_keys=True).encode())
            os.replace(tmp, "fingerprint.json", src_dir_fd=dfd, dst_dir_fd=dfd)

    # ---- verification --------------------------------------------------------------------
    def read_entry(self, d: Path, key: str, fid: str, *, full: bool = False) -> dict:
        """Metadata of a published entry ``d`` (= ``root/<fid>/<key>``); CacheMiss if absent or from
        another version, CorruptEntry if damaged, UntrustedCacheError if not safe to load from."""
        return self._verified(Path(d), key, fid, ENTRY_FILES if full else ("kernel.so",))[0]

    def _verified(self, d: Path, key: str, fid: str, names: tuple[str, ...]) -> tuple[dict, dict[str, bytes]]:
        """(payload, {name: bytes}) of an entry whose files ``names`` were read once through checked
        descriptors and matched ``meta.json``: the returned bytes are the verified bytes."""
        if d != self.fp_dir(fid) / key:
            raise ValueError(f"{d} is not the entry {key} of {self.fp_dir(fid)}")
        try:
            with self._fp_fd(fid, create=False) as ffd, closing_fd(open_dir(ffd, key, d)) as dfd:
                try:
                    raw = read_file(dfd, "meta.json", d / "meta.json", limit=1 << 24)
                except ValueError as e:
                    raise CorruptEntry(str(e)) from None
                payload = self._check_meta(raw, key, fid)
                blobs = {}
                for name in names:
                    want = payload["files"].get(name)
                    if want is None:
                        raise CorruptEntry(f"{name} not recorded in meta.json")
                    try:
                        data = read_file(dfd, name, d / name, limit=want["size"])
                    except FileNotFoundError:
                        raise CorruptEntry(f"{name} missing") from None
                    except ValueError as e:  # larger than recorded: not read any further
                        raise CorruptEntry(str(e)) from None
                    if len(data) != want["size"]:
                        raise CorruptEntry(f"{name} size {len(data)} != recorded {want['size']} (truncated?)")
                    if hashlib.sha256(data).hexdigest() != want["sha256"]:
                        raise CorruptEntry(f"{name} checksum mismatch")
                    blobs[name] = data
        except FileNotFoundError:
            raise CacheMiss(key) from None
        return payload, blobs

    @staticmethod
    def _check_meta(raw: bytes, key: str, fid: str) -> dict:
        try:
            doc = json.loads(raw)
            payload, digest = doc["payload"], doc["sha256"]
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptEntry(f"meta.json unreadable ({type(e).__name__})") from None
        if _meta_digest(payload) != digest:
            raise CorruptEntry("meta.json checksum mismatch")
        if payload.get("key_version") != KEY_VERSION or payload.get("fingerprint") != fid or payload.get("key") != key:
            raise CacheMiss(f"{key}: entry from another nvgemm/toolchain version")

        if payload.get("abi_version") != AOT_ABI_VERSION:
            raise CacheMiss(f"{key}: AOT ABI version {payload.get('abi_version')} != {AOT_ABI_VERSION}")
        return payload

    def _report_corrupt(self, key: str, d: Path, why: str, action: str = "rebuilding it") -> None:
        self.stats["corrupt"] += 1
        if str(d) not in _REPORTED:  # once per entry per process, however many caches point at it
            _REPORTED.add(str(d))
            msg = f"nvgemm_cutedsl: corrupt kernel cache entry {d}: {why}; {action}"
            log.warning(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=3)

    def _quarantine(self, d: Path) -> None:
        trash = d.with_name(f".trash-{d.name}-{os.getpid()}-{time.monotonic_ns()}")
        try:
            os.rename(d, trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    # ---- lookup / build ------------------------------------------------------------------
    def _candidate_fids(self) -> list[str]:
        if self.fingerprint_info.get("cutlass_dsl") is not None:
            return [self.fid]
        # No DSL here: accept any fingerprint built from these kernel sources (newest first).
        out = [self.fid]
        try:
            rfd = open_root(self.root)
        except FileNotFoundError:
            return out
        cands = []
        with closing_fd(rfd):
            for name in os.listdir(rfd):
                st = os.stat(name, dir_fd=rfd, follow_symlinks=False)
                if name == self.fid or not (stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    continue  # e.g. the checkout cache's README.md
                try:
                    with closing_fd(open_dir(rfd, name, self.root / name)) as fd:
                        raw = read_file(fd, "fingerprint.json", self.root / name / "fingerprint.json", limit=1 << 20)
                        mtime = os.stat("fingerprint.json", dir_fd=fd, follow_symlinks=False).st_mtime
                    info = json.loads(raw)
                except (FileNotFoundError, ValueError):
                    continue
                if (
                    isinstance(info, dict)
                    and info.get("kernel_sources") == self.fingerprint_info["kernel_sources"]
                    and info.get("key_version") == KEY_VERSION
                ):
                    cands.append((mtime, name))
        return out + [f for _, f in sorted(cands, reverse=True)]

    def lookup(self, spec: CompileSpec) -> tuple[str, Path, dict] | None:
        """(key, entry dir, meta) of a valid entry, or None. Corrupt entries are reported and removed."""
        hit = self._lookup(spec, ("kernel.so",))
        return None if hit is None else hit[:3]

    def _lookup(self, spec: CompileSpec, names: tuple[str, ...]) -> tuple[str, Path, dict, dict[str, bytes]] | None:
        for fid in self._candidate_fids():
            key = self.key(spec, fid)
            d = self.fp_dir(fid) / key
            try:
                return (key, d, *self._verified(d, key, fid, names))
            except CacheMiss:
                continue
            except CorruptEntry as e:
                with contextlib.ExitStack() as stack:
                    try:
                        stack.enter_context(self._lock(fid, key))
                    except OSError as le:  # a read-only cache (a serving image): report, cannot repair
                        if le.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                            raise
                        self._report_corrupt(key, d, str(e), action="the cache is read-only: not used")
                        continue
                    try:  # re-check: another process may have rebuilt or removed it meanwhile
                        return (key, d, *self._verified(d, key, fid, names))
                    except CacheMiss:
                        continue
                    except CorruptEntry as e2:
                        self._report_corrupt(key, d, str(e2))
                        self._quarantine(d)
        return None

    def ensure(self, spec: CompileSpec) -> CacheResult:
        """Make sure ``spec`` has a valid entry: 'cached' if it had, 'compiled' if built now, or 'failed'."""
        t0 = time.perf_counter()
        hit = self.lookup(spec)
        if hit is not None:
            return CacheResult(hit[0], "cached", hit[1], hit[2], seconds=time.perf_counter() - t0)
        key = self.key(spec)
        d = self.fp_dir() / key
        if not _dsl_available():
            return CacheResult(
                key, "failed", error="not in the kernel cache and cutlass-dsl is not installed: run `nvgemm precompile`"
            )
        with self._lock(self.fid, key):
            try:
                meta = self.read_entry(d, key, self.fid)
                return CacheResult(key, "cached", d, meta, seconds=time.perf_counter() - t0)
            except CacheMiss:
                pass
            except CorruptEntry as e:
                self._report_corrupt(key, d, str(e))
                self._quarantine(d)
            try:
                meta = self._build_locked(spec, key, d)
            except Exception as e:  # a kernel that cannot build is reported, not fatal to the caller
                log.warning("nvgemm_cutedsl: building %s failed: %s", spec.name(), e)
                return CacheResult(key, "failed", error=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - t0)
        self.stats["compiled"] += 1
        return CacheResult(key, "compiled", d, meta, seconds=time.perf_counter() - t0)

    def _build_locked(self, spec: CompileSpec, key: str, d: Path) -> dict:
        # lazy: looked up at call time (tests patch artifact.build_artifacts)
        from nvgemm.aot.artifact import build_artifacts

        self._write_fingerprint()
        tmp = Path(tempfile.mkdtemp(prefix=f".build-{key[:16]}-", dir=self.fp_dir()))
        try:
            info = build_artifacts(spec, tmp, key)
            restrict_tree(tmp)  # 0700 / 0600 whatever the umask or the tools that wrote the files
            files = {n: {"size": (tmp / n).stat().st_size, "sha256": _sha256_file(tmp / n)} for n in ENTRY_FILES}
            payload = {
                "key_version": KEY_VERSION,
                "fingerprint": self.fid,
                "key": key,
                "spec": json.loads(spec_json(spec)),
                "files": files,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **info,
            }
            doc = {"payload": payload, "sha256": _meta_digest(payload)}
            with closing_fd(os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)) as tfd:
                create_file(tfd, "meta.json", json.dumps(doc, indent=1, sort_keys=True).encode())
            try:
                os.rename(tmp, d)
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                self._quarantine(d)  # a stale/invalid dir we hold the lock for
                os.rename(tmp, d)
            return payload
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def get(self, spec: CompileSpec, *, build: bool = True):
        """The loaded :class:`~nvgemm.aot.artifact.AotKernel` for ``spec`` (compiling on a miss if allowed)."""
        # lazy: looked up at call time (tests patch artifact.AotKernel)
        from nvgemm.aot.artifact import AotKernel

        k = self._by_spec.get(spec)  # warm calls: one dict lookup, no hashing of the spec
        if k is not None:
            return k
        key = self.key(spec)
        k = self._mem.get(key)
        if k is not None:
            self._by_spec[spec] = k
            return k
        hit = self._lookup(spec, ("kernel.so",))
        if hit is None:
            if not build:
                self.stats["miss"] += 1
                raise CacheMiss(f"{spec.name()} is not in the kernel cache {self.root}")
            r = self.ensure(spec)
            if r.status == "failed":
                raise RuntimeError(f"nvgemm_cutedsl: no kernel for {spec.name()}: {r.error}")
            hit = (r.key, r.path, *self._verified(r.path, r.key, r.path.parent.name, ("kernel.so",)))
        _, d, meta, blobs = hit
        # load exactly the bytes that were just verified (never the path again: it could change)
        kern = AotKernel(d / "kernel.so", abi_from_json(meta["abi"]), name=meta.get("kernel_name", ""),
                         image=blobs["kernel.so"])
        self.stats["loaded"] += 1
        with self._mem_lock:
            kern = self._mem.setdefault(key, kern)
            self._by_spec[spec] = kern
        return kern


_DEFAULT: KernelCache | None = None


def default_cache() -> KernelCache:
    global _DEFAULT
    root = default_cache_dir()
    if _DEFAULT is None or _DEFAULT.root != root:
        _DEFAULT = KernelCache(root)
    return _DEFAULT


__all__ = ["CacheMiss", "CacheResult", "CorruptEntry", "KernelCache", "UntrustedCacheError", "default_cache",
           "default_cache_dir"]
