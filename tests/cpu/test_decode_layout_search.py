"""The decode-layout search behind the README's "no 8-instruction decode" statement
(``bench/decode_layout_search.py``) must admit the layouts nvgemm ships: otherwise its "none
found" would say nothing about them. Also checks it rejects a layout whose sources collide."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from nvgemm.templates.sm90.operand import SCHEMES

_PATH = Path(__file__).resolve().parents[2] / "bench" / "decode_layout_search.py"


def _search():
    spec = importlib.util.spec_from_file_location("decode_layout_search", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("kind", ["bf16", "fp16"])
def test_shipped_scheme_is_in_the_searched_space(kind):
    s = _search()
    sch = SCHEMES[kind]
    P = s.field_positions(kind)
    assert P == [p + h for h in (0, 16) for p in sch.field]
    assert s.feasible(P, sch.rot, (sch.rot_clean,), (None, 0, 0, 0))
    # the same rotations with a clean register one bit off draw some word bit twice
    assert not s.feasible(P, sch.rot, (sch.rot_clean + 1,), (None, 0, 0, 0))
    # masks alone (no clean register) cannot tile the word with these rotations
    assert not s.feasible(P, sch.rot, (), (None, None, None, None))
