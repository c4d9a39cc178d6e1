"""The committed table of per-kernel SASS facts (``sass_facts.json`` next to this module).

Layout::

    {"header": {"cutlass_dsl": "4.8.1", "cuobjdump": "...", "epilogue": "...", "generated": "...",
                "command": "nvgemm model --regen-table"},
     "entries": {"sm_90a": {"<config name>": {KernelFacts fields}}, "sm_100a": {...}},
     "spills": {"sm_90a": {"<config name>": {"<activation>": {"ref": {"ldl", "stl", "ldl_loop",
                                                                    "stl_loop", "regs", "mma",
                                                                    "loop": {timing facts}},
                                                             "full": {...}}}}}}

``entries`` hold the timing facts of each main loop, compiled with the reference epilogue;
``spills`` the LDL/STL counts of every (config, activation) variant the sm90 policy emits for the
preset shapes, compiled with the reference and the fullest epilogue of that activation
(``bench/compile_sweep_sm90.py``; :func:`spill_status`), and -- in records written with
``--timing`` -- the variant's own main-loop timing facts (``"loop"``), which :func:`lookup` with an
``activation`` uses for that variant instead of its main loop's entry (:func:`variant_facts`).

Lookup order (:func:`lookup`): the exact config name; else an entry of the same family whose
config has the same :meth:`~nvgemm.heuristics.perfmodel.facts.FamilyFacts.loop_key` (same main loop, e.g. a
different tile_n or split_k; ptxas schedules such twins within ~1 % of each other's instructions,
which ``tests/compile/test_perfmodel_table.py`` checks on a pair), marked ``source="table (same
main loop as ...)"``; else the
family's arithmetic estimate (``source="estimate"``); else None. Loading is lazy and cached, so
the policy pays the JSON parse once per process (~ms) and nothing per call.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import replace
from pathlib import Path

from nvgemm.heuristics.perfmodel.facts import KernelFacts, family_for, registered_families

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


def lookup(config, arch: str | None = None, table: dict | None = None, *, estimate: bool = True,
           activation: str | None = None, own_arch: str | None = None) -> KernelFacts | None:
    """Static facts of ``config`` (see the module docstring for the order); with ``activation``,
    the facts of the variant compiled for it where its ``spills`` record holds its own timing
    facts (:func:`variant_facts`). ``own_arch``: the arch the kernel is compiled for when it is not
    ``arch`` (the W4A16 ``mma`` kernel on sm_120a / sm_89 / ..., whose table entries are sm_90a's): the
    variant's timing facts come from that arch's own record where its sweep made one (ptxas schedules
    the same source differently per arch), else from ``arch``'s."""
    fam = family_for(config)
    if fam is None:
        return None
    arch = arch or fam.arch
    own_arch = None if own_arch == arch else own_arch
    t = table if table is not None else load_table()
    name = config.name()
    memo = t.setdefault("_facts", {})  # KernelFacts are frozen: one per (arch, config) per table
    key = (arch, name, estimate, activation, own_arch)
    if key not in memo:
        base = _lookup(fam, config, name, arch, t, estimate)
        if activation is None or base is None:
            memo[key] = base
        else:
            own = variant_facts(base, activation, own_arch, t) if own_arch else base
            memo[key] = own if own is not base else variant_facts(base, activation, arch, t)
    return memo[key]


#: the main-loop timing facts a variant's own record replaces (registers too: they set the
#: occupancy). Not the per-pass / fixed instruction counts: those count the epilogue's code
#: statically (the split-K reduction of the last CTA included: 364 -> 3076 instructions with
#: split-K 8), which the model charges per CTA -- kept from the main loop's entry (see
#: ``bench/results/model_calibration.md``)
_VARIANT_FIELDS = ("loop_instrs", "loop_issue_cycles", "chain_base", "round_trips", "stream_loads")


def variant_facts(base: KernelFacts, activation: str, arch: str = "sm_90a", table: dict | None = None) -> KernelFacts:
    """``base`` (a config's main-loop facts) with the timing facts of the (config, activation)
    variant's own SASS where its ``spills`` record holds them (``"loop"``, written by the spill
    sweep since issue 23): split-K and the epilogue move ptxas' schedule (measured: the same main
    loop's chain base 921 -> 872 cycles with split-K 8, wgmma loop 653 -> 671 instructions with
    split-K 2 and silu_mul; ``bench/results/model_calibration.md``). The record's epilogues
    (``ref``, ``full``) bracket the runtime's, so each field is the larger of the two (the slower
    variant), registers included; ``source`` says so. Without such a record: ``base``."""
    t = table if table is not None else load_table()
    rec = t.get("spills", {}).get(arch, {}).get(base.config, {}).get(activation)
    if not rec or any("loop" not in f for f in rec.values()):
        return base
    loops = [f["loop"] for f in rec.values()]
    new = {k: max(lp[k] for lp in loops) for k in _VARIANT_FIELDS if all(k in lp for lp in loops)}
    new["regs"] = max(f.get("regs", 0) for f in rec.values())
    for k in ("ldl", "stl", "ldl_loop", "stl_loop"):
        new[k] = max(f.get(k, 0) for f in rec.values())
    return replace(base, **new, source=f"variant ({activation}; {' / '.join(sorted(rec))} epilogues, the larger; {arch})")


def _lookup(fam, config, name: str, arch: str, t: dict, estimate: bool) -> KernelFacts | None:
    entries = t["entries"].get(arch, {})
    if name in entries:
        return KernelFacts.from_json(entries[name])
    twin = _loop_index(t, arch).get(fam.loop_key(config))
    if twin is not None:
        return KernelFacts.from_json({**entries[twin], "config": name}, source=f"table (same main loop as {twin})")
    return fam.estimate_static(config) if estimate else None


def spill_status(config, activation: str = "none", arch: str = "sm_90a", table: dict | None = None) -> bool | None:
    """Whether the compiled variant of ``config`` for ``activation`` spills to local memory, from
    its own SASS: the ``spills`` record of that exact (config, activation) -- True if either
    recorded epilogue has an LDL or STL (or failed to compile) --, else the exact config's own
    table entry (reference epilogue), else None (never compiled: unknown). Entries of a twin with
    the same main loop are never used to call a variant spill-free: spills depend on split-K and
    the epilogue. They are used the other way: an unrecorded split-K variant (``split_k > 1``) of a
    config whose other split-K variants were recorded spilling for ``activation`` is taken to spill
    too (the split-K epilogue's registers are what push those kernels over; conservative)."""
    t = table if table is not None else load_table()
    memo = t.setdefault("_spill_memo", {})
    key = (config, activation, arch)
    try:
        return memo[key]
    except KeyError:
        pass
    except TypeError:  # unhashable config: no memo
        return _spill_status(t, config, activation, arch)
    memo[key] = out = _spill_status(t, config, activation, arch)
    return out


def _spill_status(t: dict, config, activation: str, arch: str) -> bool | None:
    name = config.name()
    sp = t.get("spills", {}).get(arch, {})
    rec = sp.get(name, {}).get(activation)
    if rec is not None:
        return _spills(rec)
    entry = t["entries"].get(arch, {}).get(name)
    if entry is not None and (entry.get("ldl", 0) or entry.get("stl", 0)):
        return True
    if getattr(config, "split_k", 1) > 1 and _split_siblings_spill(t, sp, config, activation, arch):
        return True
    if entry is not None:
        return False
    return None


def _spills(rec: dict) -> bool:
    return any("error" in f or f.get("ldl", 0) or f.get("stl", 0) for f in rec.values())


def _split_siblings_spill(t: dict, sp: dict, config, activation: str, arch: str) -> bool:
    """Whether a recorded split-K sibling of ``config`` (same name up to ``_skN``) spills."""
    idx = t.setdefault("_split_spill", {})
    key = (arch, activation)
    if key not in idx:
        idx[key] = {_SPLIT_RE.sub("", n) for n, per in sp.items()
                    if "_sk" in n and activation in per and _spills(per[activation])}
    return _SPLIT_RE.sub("", config.name()) in idx[key]


_SPLIT_RE = re.compile(r"_sk\d+")


def table_header(table: dict | None = None) -> dict:
    return dict((table or load_table()).get("header", {}))


__all__ = ["TABLE_PATH", "clear_cache", "load_table", "lookup", "parse_config_name", "spill_status", "table_header",
           "variant_facts"]
