"""Reading checkpoint files: regular files only (a FIFO or device would block forever), errors name the file.

Used by every reader of a checkpoint folder (the ModelOpt loader, ``precompile``, the serving plan).
"""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path
from typing import Any

#: Largest safetensors JSON header nvgemm reads (the format's own limit is 100 MB).
MAX_HEADER_BYTES = 100_000_000


def regular_file(path: str | os.PathLike, error: type[Exception] = ValueError) -> Path:
    """``path`` if it is a regular file (symlinks followed); else ``error`` naming it and what it is."""
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise error(f"{p}: cannot read it ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode)
                or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise error(f"{p}: is {kind}, not a regular file; nvgemm reads checkpoint files only from regular files")
    return p


def safetensors_files(folder: str | os.PathLike, error: type[Exception] = ValueError) -> list[Path]:
    """The ``*.safetensors`` files of a checkpoint folder, sorted; each must be a regular file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise error(f"{folder}: no *.safetensors files (not a directory; expected a checkpoint folder)")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise error(f"{folder}: no *.safetensors files")
    return [regular_file(f, error) for f in files]


def read_json(path: str | os.PathLike, error: type[Exception] = ValueError) -> Any:
    """Parse a JSON file; ``error`` names the file and the position of a syntax error."""
    p = regular_file(path, error)
    try:
        return json.loads(p.read_text())
    except UnicodeDecodeError as e:
        raise error(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise error(f"{p}: invalid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None


def safetensors_header(path: str | os.PathLike, error: type[Exception] = ValueError) -> dict:
    """The JSON header of a safetensors file (tensor name -> dtype/shape/offsets), checked."""
    p = regular_file(path, error)
    size = p.stat().st_size
    with open(p, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise error(f"{p}: {size} bytes, too short for a safetensors file (8-byte header length missing)")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, MAX_HEADER_BYTES):
            raise error(f"{p}: header length {n} exceeds the file ({size} bytes); not a safetensors file")
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{p}: the safetensors header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise error(f"{p}: the safetensors header is not a JSON object")
    return header


def checkpoint_tensors(folder: str | os.PathLike, error: type[Exception] = ValueError) -> dict[str, dict]:
    """Every tensor's header entry (name -> dtype/shape/offsets) over a checkpoint folder's safetensors files."""
    tensors: dict[str, dict] = {}
    for f in safetensors_files(folder, error):  # regular files only: a FIFO would hang
        header = safetensors_header(f, error)
        tensors.update({k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)})
    return tensors
