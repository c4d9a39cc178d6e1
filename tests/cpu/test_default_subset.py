"""bench/default_subset.py (the default CI subset per kernel family, for mutation runs): every listed test file
and source path exists, the emulator lists hold emulator tests, and a source file maps to its families."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ds():
    spec = importlib.util.spec_from_file_location("default_subset", ROOT / "bench" / "default_subset.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[spec.name]
    return mod


def test_listed_paths_exist_and_emulator_lists_hold_emulator_tests(ds):
    for name, fam in ds.FAMILIES.items():
        for p in fam.sources:
            assert (ROOT / p).is_dir(), f"{name}: source {p} missing"
        for t in fam.tests:
            assert (ROOT / t).is_file(), f"{name}: test file {t} missing"
        for t in fam.emulator:
            assert "mark.emulator" in (ROOT / t).read_text(), f"{name}: {t} has no emulator test"


def test_every_kernel_family_folder_has_an_entry(ds):
    owned = {p for fam in ds.FAMILIES.values() for p in fam.sources}
    for d in (ROOT / "src/nvgemm/templates").iterdir():
        if d.is_dir() and d.name not in ("common", "__pycache__"):
            assert f"src/nvgemm/templates/{d.name}/" in owned, f"kernel family {d.name} not in FAMILIES"


def test_a_source_file_maps_to_its_families(ds):
    assert ds.families_of_source("src/nvgemm/templates/sm100_w4a4/kernel.py") == ["sm100_w4a4", "sm100_moe"]
    assert ds.families_of_source("src/nvgemm/templates/sm90_moe/kernel.py") == ["sm90_moe"]
    tests = ds.tests_for_source("src/nvgemm/templates/sm90_w4a16/common.py")
    assert tests[:3] == ["tests/emulator/test_sm90_mma_emu.py", "tests/emulator/test_isa_wgmma_kernel.py",
                         "tests/emulator/test_sm90_moe_emu.py"]
    assert len(tests) == len(set(tests))
    assert ds.families_of_source("src/nvgemm/cli/demo.py") == []
