"""The mutation runner's list (``bench/mutations.py``) stays applicable to this tree: every mutation's ``old``
text occurs exactly once in its file (so an edit of a kernel source that moves the text fails here, not as a
silent no-op mutation), the list covers every kernel family, each mutation gets a non-empty derived test
subset with value tests in it, and the CLI refuses unknown names. Runs no mutation (no pytest, no compile)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "mutations.py"


@pytest.fixture(scope="module")
def mut():
    spec = importlib.util.spec_from_file_location("nvgemm_bench_mutations", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve the module of a class while it is built
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


def test_every_old_text_occurs_exactly_once(mut):
    assert mut.check_mutations(REPO, mut.MUTATIONS) == []


def test_list_size_names_and_descriptions(mut):
    names = [m.name for m in mut.MUTATIONS]
    assert len(names) >= 15
    assert len(set(names)) == len(names)
    for m in mut.MUTATIONS:
        assert m.bug and "\n" not in m.bug, m.name
        for old, new in m.hunks():
            assert old and old != new, m.name


def test_every_family_and_shared_piece_is_mutated(mut):
    files = {m.file for m in mut.MUTATIONS}
    for fam in mut.FAMILIES:
        assert any(f.startswith(f"src/nvgemm/templates/{fam}/") for f in files), fam
    for piece in ("src/nvgemm/epilogues/cute_apply.py", "src/nvgemm/epilogues/requant.py",
                  "src/nvgemm/templates/sm100_w4a4/requant.py", "src/nvgemm/templates/sm100_moe/prep_triton.py",
                  "src/nvgemm/templates/sm90_moe/prep_triton.py", "src/nvgemm/templates/sm90_moe/finalize_triton.py",
                  "src/nvgemm/templates/sm90_w4a16/mma.py", "src/nvgemm/templates/sm90_w4a16/wgmma.py",
                  "src/nvgemm/templates/triton/quantize.py", "src/nvgemm/templates/triton/fused.py",
                  "src/nvgemm/templates/triton/gemm_w4a16.py", "src/nvgemm/templates/triton/moe.py"):
        assert piece in files, piece


def test_each_subset_is_derived_and_holds_value_tests(mut):
    for m in mut.MUTATIONS:
        subset = mut.subset_for(REPO, m)
        ids = [i for folder in subset.values() for i in folder]
        assert ids, m.name
        assert any(mut.kill_kind(i) == "value" for i in ids), m.name
        for i in ids:
            path = i.split("::")[0]
            assert (REPO / path).is_file(), i
            assert path.split("/")[1] in ("emulator", "cpu", "compile"), i
    # a kernel's own tests are in its subset; the grouped kernel inherits the dense one's mutations
    by = {m.name: mut.subset_for(REPO, m) for m in mut.MUTATIONS}
    assert "tests/emulator/test_isa_sm100_kernel.py" in by["sm100-splitk-uneven-drops-leftover"]["tests/emulator"]
    assert "tests/emulator/test_sm100_moe_emu.py" in by["sm100-splitk-uneven-drops-leftover"]["tests/emulator"]
    assert "tests/emulator/test_sm90_mma_emu.py" in by["sm90-mma-token-groups-read-first-8"]["tests/emulator"]
    assert f"{mut.INTERP_TEST}[interp_quantize.py]" in by["triton-quantize-k-mask-dropped"]["tests/cpu"]


def test_families_follow_imports(mut):
    assert mut.affected_families(REPO, "src/nvgemm/templates/sm100_moe/kernel.py") == ("sm100_moe",)
    assert set(mut.affected_families(REPO, "src/nvgemm/templates/sm100_w4a4/kernel.py")) == {"sm100_w4a4",
                                                                                            "sm100_moe"}
    assert {"sm100_w4a4", "sm90_w4a16"} <= set(mut.affected_families(REPO, "src/nvgemm/epilogues/cute_apply.py"))


def test_kill_kind_classification(mut):
    assert mut.kill_kind("tests/emulator/test_sm90_mma_emu.py::test_mutations_of_the_real_ptx_fail") == "value"
    assert mut.kill_kind("tests/compile/test_sm100_compile.py::test_pdl") == "text"
    assert mut.kill_kind("tests/compile/test_fused_requant_ownership.py::test_x") == "value"
    assert mut.kill_kind(f"{mut.INTERP_TEST}[interp_gemm.py]") == "value"
    assert mut.kill_kind("tests/cpu/test_emu_isa_wgmma.py::test_nvgemm_wgmma_constant_decodes_to_sw128") == "text"
    assert mut.kill_kind("tests/cpu/test_fused_requant.py::test_lane_model") == "value"


def test_a_rotted_mutation_is_reported(mut, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "k.py").write_text("x = a + a\n")
    twice = mut.Mutation("twice", "src/k.py", "a", "b", "bug")
    gone = mut.Mutation("gone", "src/k.py", "c", "d", "bug")
    missing = mut.Mutation("missing", "src/nope.py", "a", "b", "bug")
    problems = mut.check_mutations(tmp_path, [twice, gone, missing])
    assert any(p.startswith("twice:") and "2 times" in p for p in problems)
    assert any(p.startswith("gone:") and "0 times" in p for p in problems)
    assert any(p.startswith("missing:") and "does not exist" in p for p in problems)


def test_apply_edits_the_copy_only(mut, tmp_path):
    m = next(x for x in mut.MUTATIONS if x.extra)
    dst = tmp_path / m.file
    dst.parent.mkdir(parents=True)
    src_text = (REPO / m.file).read_text()
    dst.write_text(src_text)
    mut.apply(tmp_path, m)
    text = dst.read_text()
    for old, new in m.hunks():
        assert new in text
    assert text != src_text and (REPO / m.file).read_text() == src_text


def test_cli_rejects_unknown_names_and_has_help():
    bad = subprocess.run([sys.executable, str(SCRIPT), "--only", "no-such-mutation"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode != 0
    assert "no-such-mutation" in bad.stderr
    ok = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "--src-tree" in ok.stdout and "--timeout" in ok.stdout
