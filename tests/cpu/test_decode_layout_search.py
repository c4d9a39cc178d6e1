"""The decode-layout searches behind the decode statements of ``src/nvgemm/templates/sm90_w4a16/README.md``
(``bench/decode_layout_search.py``) must admit the layouts they talk about -- otherwise their "none found"
would say nothing about them -- and reject broken ones."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from nvgemm.templates.sm90_w4a16.operand import SCHEMES

_PATH = Path(__file__).resolve().parents[2] / "bench" / "decode_layout_search.py"


def _search():
    spec = importlib.util.spec_from_file_location("decode_layout_search", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("kind", ["bf16", "fp16"])
def test_permutation_search_admits_the_nine_instruction_scheme(kind):
    s = _search()
    rs, rc = s.PERMUTATION_SCHEMES[kind]
    P = s.field_positions(kind)
    assert P == [p + h for h in (0, 16) for p in SCHEMES[kind].field]
    assert s.feasible(P, rs, (rc,), (None, 0, 0, 0))
    # the same rotations with a clean register one bit off draw some word bit twice
    assert not s.feasible(P, rs, (rc + 1,), (None, 0, 0, 0))
    # masks alone (no clean register) cannot tile the word with these rotations
    assert not s.feasible(P, rs, (), (None, None, None, None))


@pytest.mark.parametrize("kind", ["bf16", "fp16"])
def test_linear_search_admits_the_shipped_scheme_and_rejects_dependent_ones(kind):
    s = _search()
    sch = SCHEMES[kind]
    P = s.field_positions(kind)
    assert s.is_spanning_tree(P, sch.sources)
    assert len(sch.rotations) == 4 and sch.instructions() == 8
    # no output alone on one rotation: no equation reaches ground, the system is singular
    all_pairs = tuple(src if len(src) == 2 else (src[0], (src[0] + 1) % 32) for src in sch.sources)
    assert not s.is_spanning_tree(P, all_pairs)
    # an output repeated: dependent equations
    assert not s.is_spanning_tree(P, (sch.sources[0], sch.sources[2], sch.sources[2], sch.sources[3]))


def test_linear_search_finds_nothing_with_two_rotations():
    """The cheap end of the search's "7 is impossible" claim, rerun here (the 3-rotation part takes
    seconds per format and is recorded in bench/results/decode_layout_search.md)."""
    s = _search()
    for kind in ("bf16", "fp16"):
        assert s.linear_schemes(kind, 2, first_only=True) == []
