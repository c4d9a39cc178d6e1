"""The emulator's ISA semantics (nvgemm.emulator.isa) against CuTe's own, hardware-validated atoms.

CuTe's MMA atoms carry thread-value layouts: (thread, value) -> column-major index in the operand tile
(``m + M k`` for A, ``m + M n`` for C). These are NVIDIA's, checked on hardware, so they are an oracle
independent of the ISA text the emulator was written from.
"""

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
if "CUTE_DSL_DUMP_DIR" not in os.environ:
    import tempfile

    os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="nvgemm_cute_dump_")

import ast
import re

import numpy as np
import pytest

pytest.importorskip("cutlass")
pytestmark = pytest.mark.compile_only

from nvgemm.emulator.isa.wgmma import a_fragment_coords, d_fragment_coords  # noqa: E402


def parse_layout(text: str):
    """'((4,8,4),(2,2,2)):((128,1,16),(64,8,512))' -> (shape, stride) nested tuples."""
    shape, stride = text.split(":")
    as_tuple = lambda s: ast.literal_eval(re.sub(r"(\d)\)", r"\1,)", s))  # noqa: E731 -- (4) -> (4,)
    return as_tuple(shape), as_tuple(stride)


def layout_eval(shape, stride, idx: int) -> int:
    def flat(t):
        return [x for e in t for x in flat(e)] if isinstance(t, tuple) else [t]
    off = 0
    for n, d in zip(flat(shape), flat(stride)):
        off += (idx % n) * d
        idx //= n
    return off


def tv_coords(text: str, rows: int, values: int):
    (ts, vs), (td, vd) = parse_layout(text)
    r = np.zeros((128, values), dtype=np.int64)
    c = np.zeros((128, values), dtype=np.int64)
    for t in range(128):
        for v in range(values):
            idx = layout_eval(ts, td, t) + layout_eval(vs, vd, v)
            r[t, v], c[t, v] = idx % rows, idx // rows
    return r, c


NS = (8, 32, 128, 256)

_QUERY = """
import json, sys
sys.path.insert(0, sys.argv[1])
from emu_isa_cute_atoms import wgmma_tv_layouts
res = {}
for n in map(int, sys.argv[2:]):
    out = {}
    wgmma_tv_layouts(out, n, True)
    res[n] = out
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def cute_layouts():
    """CuTe's TV layouts, queried in a fresh process pinned to sm_90a: CuTeDSL keeps the arch of the
    first compile in a process (another test module compiling for sm_100a first made the wgmma atom
    refuse to trace)."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a")
    res = subprocess.run([sys.executable, "-c", _QUERY, os.path.dirname(__file__), *map(str, NS)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return {int(k): v for k, v in json.loads(res.stdout.strip().splitlines()[-1]).items()}


@pytest.mark.parametrize("n", NS)
def test_wgmma_fragments_match_cute_tv_layouts(n, cute_layouts):
    out = cute_layouts[n]
    ra, ca = a_fragment_coords()
    np.testing.assert_array_equal(np.stack(tv_coords(out["A"], 64, 8)), np.stack([ra, ca]))
    rd, cd = d_fragment_coords(n)
    np.testing.assert_array_equal(np.stack(tv_coords(out["C"], 64, n // 2)), np.stack([rd, cd]))
