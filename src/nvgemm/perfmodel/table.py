"""The committed table of per-kernel SASS facts (``sass_facts.json`` next to this module).

Layout::

    {"header": {"cutlass_dsl": "4.8.1", "cuobjdump": "...", "epilogue": "...", "generated": "...",
                "command": "nvgemm model --regen-table"},
     "entries": {"sm_90a": {"<config name>": {KernelFacts fields}}, "sm_100a": {...}}}

Lookup order (:func:`lookup`): the exact config name; else an entry of the same family whose
config has the same :meth:`~nvgemm.perfmodel.facts.FamilyFacts.loop_key` (same main loop, e.g. a
different tile_n or split_k; ptxas schedules such twins within ~1 % of each other's instructions,
which ``tests/compile/test_perfmodel_table.py`` checks on a pair), marked ``source="table (same
main loop as ...)"``; else the
family's arithmetic estimate (``source="estimate"``); else None. Loading is lazy and cached, so
the policy pays the JSON parse once per process (~ms) and nothing per call.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from .facts import KernelFacts, family_for, registered_families

TABLE_PATH = Path(__file__).with_name("sass_facts.json")
_LOCK = threading.Lock()
_CACHE: dict = {}


def load_table(path: Path | None = None) -> dict:
    """The parsed table (``{"header": ..., "entries": ...}``); an empty one if the file is absent."""
    p = Path(path) if path is not None else TABLE_PATH
    key = str(p)
    with _LOCK:
        if key not in _CACHE:
            if p.exists():
                _CACHE[key] = json.loads(p.read_text())
            else:
                _CACHE[key] = {"header": {}, "entries": {}}
            _CACHE[key]["_by_key"] = None
        return _CACHE[key]


def clear_cache() -> None:
    with _LOCK:
        _CACHE.clear()


def parse_config_name(name: str):
    """The kernel config a config name stands for (asks every registered family, later
    registrations first); ValueError if none owns it."""
    for fam in reversed(registered_families()):
        cfg = fam.parse_name(name)
        if cfg is not None:
            return cfg
    raise ValueError(f"not an nvgemm config name: {name!r}")


def _config_of(name: str):
    try:
        return parse_config_name(name)
    except ValueError:
        return None


def _loop_index(table: dict, arch: str) -> dict:
    """{loop_key: name} over one arch's entries (built once per table)."""
    if table.get("_by_key") is None:
        table["_by_key"] = {}
    idx = table["_by_key"].get(arch)
    if idx is None:
        idx = {}
        for name in sorted(table["entries"].get(arch, {})):
            cfg = _config_of(name)
            fam = family_for(cfg) if cfg is not None else None
            if fam is not None:
                idx.setdefault(fam.loop_key(cfg), name)
        table["_by_key"][arch] = idx
    return idx


def lookup(config, arch: str | None = None, table: dict | None = None, *, estimate: bool = True) -> KernelFacts | None:
    """Static facts of ``config`` (see the module docstring for the order)."""
    fam = family_for(config)
    if fam is None:
        return None
    arch = arch or fam.arch
    t = table if table is not None else load_table()
    name = config.name()
    memo = t.setdefault("_facts", {})  # KernelFacts are frozen: one per (arch, config) per table
    key = (arch, name, estimate)
    if key not in memo:
        memo[key] = _lookup(fam, config, name, arch, t, estimate)
    return memo[key]


def _lookup(fam, config, name: str, arch: str, t: dict, estimate: bool) -> KernelFacts | None:
    entries = t["entries"].get(arch, {})
    if name in entries:
        return KernelFacts.from_json(entries[name])
    twin = _loop_index(t, arch).get(fam.loop_key(config))
    if twin is not None:
        return KernelFacts.from_json({**entries[twin], "config": name}, source=f"table (same main loop as {twin})")
    return fam.estimate_static(config) if estimate else None


def table_header(table: dict | None = None) -> dict:
    return dict((table or load_table()).get("header", {}))


__all__ = ["TABLE_PATH", "clear_cache", "load_table", "lookup", "parse_config_name", "table_header"]
