"""Every grouped MoE config the two grouped policies emit (sm90 W4A16 on H200, sm100 W4A4 on B200,
all candidates for the MoE presets at M = 1..256), run on the PTX emulator through its real AOT
artifact and compared bit for bit with the emulated ``nvfp4_moe`` -- the enumeration, the scaled-down
problems and the run are those of ``bench/emulator_sweep.py --only moe`` (imported, not copied;
results in ``bench/results/emulator_sweep.md``).

Default run: only the enumeration's own checks (no kernel): every emitted config of each GEMM role
is in some run, both configs of a run share the token tile, and each run's routing has an expert
with two work tiles (the last partial), an expert without tokens and ``-1`` ids, and a K with a
stage for every split plus a tail. ``-m emulator_full``: one test per run and GEMM1 variant (per-expert
alpha in bf16, per-row alpha in bf16 and fp16: about 150 tests, 5-130 s each on this machine).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

if "CUTE_DSL_DUMP_DIR" not in os.environ:
    import tempfile

    os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="nvgemm_cute_dump_")

import pytest

pytest.importorskip("cutlass")

pytestmark = pytest.mark.emulator


def _sweep():
    path = Path(__file__).resolve().parents[2] / "bench" / "emulator_sweep.py"
    spec = importlib.util.spec_from_file_location("nvgemm_bench_emulator_sweep", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


S = _sweep()
RUNS = [(f, c13, c2) for f in S.MOE_FAMILIES for c13, c2 in S.moe_runs(f)]


@pytest.mark.parametrize("family", S.MOE_FAMILIES)
def test_runs_cover_every_emitted_config(family):
    em = S.moe_emitted(family)
    runs = S.moe_runs(family)
    assert {c for c, _ in runs} == set(em[13]) and {c for _, c in runs} == set(em[2])
    assert len(em[13]) >= 10 and len(em[2]) >= 10  # the policies emit more than one config per role
    for c13, c2 in runs:
        t = S.token_tile(family, c13)
        assert S.token_tile(family, c2) == t, (c13.name(), c2.name())
        m, top_k, e, h, i, ids = S.moe_problem(family, c13, c2)
        counts = [int((ids == x).sum()) for x in range(e)]
        assert t < counts[0] < 2 * t and counts[1] == 0 and counts[2] > 0 and (ids == -1).any()
        assert (ids[0] == 0).all()  # one token routed to the same expert twice
        for c, k in ((c13, h), (c2, i)):
            assert -(-k // 256) >= c.split_k and k % 256, (c.name(), k)  # a stage per split, and a K tail


@pytest.mark.emulator_full
@pytest.mark.parametrize("variant", list(S.MOE_VARIANTS))
@pytest.mark.parametrize("family,c13,c2", RUNS, ids=[f"{c13.name()}+{c2.name()}" for _, c13, c2 in RUNS])
def test_emitted_config_bit_exact(family, c13, c2, variant):
    first, instr, prob, counts = S.run_moe(family, c13, c2, variant)
    assert first is None, f"{c13.name()} + {c2.name()} on M,top_k,E,H,I={prob}: {first[0]} elements differ, " \
                          f"first {first[1]}: {first[2]} vs {first[3]}"
    assert instr > 0 and counts[1] == 0
