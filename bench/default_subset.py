"""The default CI subset (what ``python -m pytest -q`` runs) per kernel family, for mutation runs.

:data:`FAMILIES` maps each kernel family to the source paths it owns and to the test files of the default
subset that run its code: the emulator's value tests (the real AOT artifact on the PTX emulator against an
emulated reference), then the family's compile-only and CPU tests. :func:`tests_for_source` picks the
families a source file belongs to; :func:`default_node_ids` lists the test ids the default run executes in
the given files (collected, and not skipped at collection by the ``slow`` / ``emulator_full`` / ``gpu``
markers: ``tests/conftest.py``, ``tests/emulator/conftest.py``). A mutation run applies one edit and runs
those ids; the full default subset remains the reference run (a test file outside a family's list can
still fail on its mutation).

Usage::

    python bench/default_subset.py                       # every family: its files and default test ids
    python bench/default_subset.py --family sm100_w4a4   # one family
    python bench/default_subset.py --source src/nvgemm/templates/sm100_w4a4/kernel.py --json

Collection imports torch and cutlass (about 10-20 s on 2 cores); nothing runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Family:
    sources: tuple[str, ...]  # path prefixes, relative to the repository root
    emulator: tuple[str, ...]  # default emulator value tests (first: the kernel's own run on the emulator)
    companions: tuple[str, ...] = ()  # the family's compile-only and CPU tests

    @property
    def tests(self) -> tuple[str, ...]:
        return self.emulator + self.companions


FAMILIES: dict[str, Family] = {
    "sm100_w4a4": Family(
        sources=("src/nvgemm/templates/sm100_w4a4/",),
        emulator=("tests/emulator/test_isa_sm100_kernel.py", "tests/emulator/test_isa_sm100_requant.py",
                  "tests/emulator/test_isa_sm100_picks.py"),
        companions=("tests/compile/test_sm100_compile.py", "tests/compile/test_sm100_layouts.py",
                    "tests/compile/test_fused_requant_ownership.py", "tests/cpu/test_sm100_host.py",
                    "tests/cpu/test_fused_requant.py", "tests/cpu/test_splitk_workspace.py"),
    ),
    "sm90_w4a16": Family(
        sources=("src/nvgemm/templates/sm90_w4a16/",),
        emulator=("tests/emulator/test_sm90_mma_emu.py", "tests/emulator/test_isa_wgmma_kernel.py"),
        companions=("tests/compile/test_sm90_compile.py", "tests/cpu/test_sm90_host.py",
                    "tests/cpu/test_sm90_prepared.py", "tests/cpu/test_splitk_workspace.py"),
    ),
    "sm100_moe": Family(
        sources=("src/nvgemm/templates/sm100_moe/",),
        emulator=("tests/emulator/test_sm100_moe_emu.py",),
        companions=("tests/compile/test_sm100_moe_compile.py", "tests/compile/test_sm100_moe_prep_ptx.py",
                    "tests/cpu/test_sm100_moe_host.py"),
    ),
    "sm90_moe": Family(
        sources=("src/nvgemm/templates/sm90_moe/",),
        emulator=("tests/emulator/test_sm90_moe_emu.py",),
        companions=("tests/compile/test_sm90_moe_compile.py", "tests/cpu/test_sm90_moe_worklist.py",
                    "tests/cpu/test_sm90_moe_policy.py"),
    ),
    "sm120_w4a4": Family(
        sources=("src/nvgemm/templates/sm120_w4a4/",),
        emulator=("tests/emulator/test_sm120_w4a4_emu.py",),
        companions=("tests/compile/test_sm120_compile.py", "tests/cpu/test_sm120_w4a4.py"),
    ),
    "sm120_moe": Family(
        sources=("src/nvgemm/templates/sm120_moe/",),
        emulator=("tests/emulator/test_sm120_moe_emu.py",),
        companions=("tests/compile/test_sm120_moe_compile.py", "tests/cpu/test_sm120_moe.py"),
    ),
    "triton": Family(
        sources=("src/nvgemm/templates/triton/",),
        emulator=(),
        companions=("tests/cpu/test_triton_interpreter.py", "tests/cpu/test_triton_ops.py",
                    "tests/cpu/test_rope_kv_write.py", "tests/cpu/test_moe_triton_backend.py", "tests/compile/test_triton_ptx.py",
                    "tests/compile/test_triton_moe_ptx.py"),
    ),
    "epilogues": Family(
        sources=("src/nvgemm/epilogues/",),
        emulator=("tests/emulator/test_isa_sm100_kernel.py", "tests/emulator/test_isa_sm100_requant.py",
                  "tests/emulator/test_sm90_mma_emu.py", "tests/emulator/test_isa_wgmma_kernel.py",
                  "tests/emulator/test_sm100_moe_emu.py", "tests/emulator/test_sm90_moe_emu.py",
                  "tests/emulator/test_sm120_moe_emu.py"),
        companions=("tests/cpu/test_fused_requant.py", "tests/cpu/test_ops.py"),
    ),
}
# the sm100 MoE kernel subclasses the dense sm100 kernel, and the sm90 MoE kernel the sm90 mma kernel: a
# mutation of the dense source is also run against the grouped family's tests; the sm120 W4A4 kernel
# runs the sm90 decode kernel's epilogue and split-K reduce (sm90_w4a16/common.py); the sm120 grouped
# kernel is the sm120 main loop over the sm100 grouped family's operands, prep and requant conversions
_ALSO = {"sm100_w4a4": ("sm100_moe",), "sm90_w4a16": ("sm90_moe", "sm120_w4a4", "sm120_moe"),
         "sm120_w4a4": ("sm120_moe",), "sm100_moe": ("sm120_moe",)}


def families_of_source(path: str) -> list[str]:
    """The families owning ``path`` (relative to the repository root), plus those built on them."""
    rel = Path(path).resolve().relative_to(ROOT).as_posix() if Path(path).is_absolute() else Path(path).as_posix()
    own = [name for name, f in FAMILIES.items() if any(rel.startswith(p) for p in f.sources)]
    return own + [d for name in own for d in _ALSO.get(name, ()) if d not in own]


def tests_for_source(path: str) -> list[str]:
    """Test files of the default subset for a mutation of ``path`` (emulator value tests first, no repeats)."""
    out: list[str] = []
    fams = [FAMILIES[n] for n in families_of_source(path)]
    for f in [t for fam in fams for t in fam.emulator] + [t for fam in fams for t in fam.companions]:
        if f not in out:
            out.append(f)
    return out


class _DefaultRun:
    """pytest plugin: records the items the default run would execute (after the conftests' skips)."""

    def __init__(self):
        self.ids: list[str] = []

    def pytest_collection_modifyitems(self, config, items):  # runs after the conftests' hooks (trylast)
        self.ids = [it.nodeid for it in items if it.get_closest_marker("skip") is None]

    pytest_collection_modifyitems.trylast = True


def default_node_ids(files) -> list[str]:
    """Node ids the default ``python -m pytest -q`` run executes in ``files`` (collects in this process)."""
    import pytest

    plugin = _DefaultRun()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        rc = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *files], plugins=[plugin])
    finally:
        os.chdir(cwd)
    if rc not in (0, 5):
        raise RuntimeError(f"collection of {files} failed (pytest exit code {rc})")
    return plugin.ids


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=sorted(FAMILIES), action="append")
    ap.add_argument("--source", help="a source file: the test files of the families owning it")
    ap.add_argument("--json", action="store_true", help="print {family or source: [node ids]} as JSON")
    a = ap.parse_args(argv)
    if a.source:
        groups = {a.source: tests_for_source(a.source)}
        if not groups[a.source]:
            ap.error(f"{a.source} belongs to no family in FAMILIES")
    else:
        groups = {n: list(FAMILIES[n].tests) for n in (a.family or sorted(FAMILIES))}
    result = {}
    for name, files in groups.items():
        with open(os.devnull, "w") as null:  # pytest's own collection listing goes nowhere
            so = sys.stdout
            sys.stdout = null
            try:
                result[name] = default_node_ids(files)
            finally:
                sys.stdout = so
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        for name, ids in result.items():
            print(f"{name}: {len(ids)} default tests in {len(groups[name])} files")
            for i in ids:
                print(f"  {i}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
