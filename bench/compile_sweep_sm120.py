"""Compile the sm120 W4A4 policy's picks for the Llama shapes for sm_120a and sm_121a (no GPU), read their
SASS, and tabulate the family's modelled times.

    nice -n 10 python bench/compile_sweep_sm120.py [--out bench/results/sm120_compile_sweep.md] [--top 1]

Problems: ``nvgemm.cli.sass_tool.LLAMA_SHAPES`` (N, K) x M in {1, 2, 4, 8, 16, 32, 64} x activation none /
silu_mul, on the arch's default device (RTX 5090 for sm_120a, GB10 for sm_121a; :mod:`nvgemm.templates.sm120_w4a4.perf`).
Every distinct (config, activation) among the policy's first ``--top`` candidates is compiled with two
epilogues -- ``ref`` (scalar alpha) and ``full`` (per-feature alpha + bias + residual) -- and its SASS read
with cuobjdump: registers, ``LDL`` / ``STL`` (spills), ``OMMA.SF`` instructions. The model table is
**a model, not a measurement** (the kernel has never run on hardware).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("CUTE_DSL_ARCH", "sm_120a")
os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.mkdtemp(prefix="nvgemm_cute_dump_"))

MS = (1, 2, 4, 8, 16, 32, 64)
ARCHES = ("sm_120a", "sm_121a")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench/results/sm120_compile_sweep.md"))
    ap.add_argument("--top", type=int, default=1, help="candidates per problem (default: the first)")
    a = ap.parse_args()

    import torch

    from nvgemm.aot.abi import get_template
    from nvgemm.aot.compile_spec import make_spec
    from nvgemm.cli import sass_tool
    from nvgemm.core.epilogue import EpilogueSpec
    from nvgemm.templates.sm120_w4a4.config import TEMPLATE_ID, smem_bytes
    from nvgemm.templates.sm120_w4a4.perf import byte_floor_us, device_for
    from nvgemm.templates.sm120_w4a4.policy import ranked

    picks: dict = {}
    model_rows = []
    for arch in ARCHES:
        dev = device_for(arch)
        for n, k in sass_tool.LLAMA_SHAPES:
            for m in MS:
                for act in ("none", "silu_mul"):
                    r = ranked(m, n, k, act, arch, 0)
                    for c, _ in r[:a.top]:
                        picks.setdefault((arch, c, act), (m, n, k))
                    if act == "none" and r:
                        c, (lo, hi) = r[0]
                        model_rows.append((arch, dev.name, n, k, m, c.name(), lo, hi, byte_floor_us(m, n, k, dev)))
    epis = {"ref": lambda act: EpilogueSpec(alpha="scalar", activation=act),
            "full": lambda act: EpilogueSpec(alpha="vector", bias=True, residual=True, activation=act)}
    rows = []
    t0 = time.time()
    for (arch, c, act), (m, n, k) in sorted(picks.items(), key=lambda kv: (kv[0][0], kv[0][1].name(), kv[0][2])):
        for ename, mk in epis.items():
            spec = make_spec(TEMPLATE_ID, c, arch, epilogue=mk(act))
            t = time.time()
            compiled = get_template(TEMPLATE_ID).compile(spec)
            dt = time.time() - t
            sass, res = sass_tool.dump_sass(compiled)
            regs = max(int(x) for x in re.findall(r"REG:(\d+)", res))
            ldl, stl = len(re.findall(r"\bLDL\b", sass)), len(re.findall(r"\bSTL\b", sass))
            omma = len(re.findall(r"OMMA\.SF\.16864", sass))
            rows.append((arch, c.name(), act, ename, regs, ldl, stl, omma, smem_bytes(c), dt))
            print(f"{arch} {c.name()} {act} {ename}: {regs} regs, LDL {ldl} STL {stl}, {omma} OMMA.SF, {dt:.1f} s",
                  flush=True)
    spills = [r for r in rows if r[5] or r[6]]
    import cutlass

    lines = [
        "# sm120 W4A4: compile sweep of the policy's picks (sm_120a, sm_121a) and the family's model",
        "",
        f"Produced by `python bench/compile_sweep_sm120.py --top {a.top}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"cutlass-dsl {getattr(cutlass, '__version__', '?')}, Python {platform.python_version()}, torch {torch.__version__}; "
        f"CPU only, no GPU). Problems: the Llama shapes x M in {list(MS)} x none / silu_mul; each distinct "
        "(config, activation) compiled with the `ref` (scalar alpha) and `full` (per-feature alpha + bias + "
        "residual) epilogues, SASS read with cuobjdump.",
        "",
        f"**{len(rows)} compiles, {len(rows) - len(spills)} spill-free** (no LDL / STL); max registers "
        f"{max(r[4] for r in rows)}; total {time.time() - t0:.0f} s.",
        "",
        "| arch | config | activation | epilogue | regs | LDL | STL | OMMA.SF | smem (B) | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r[0]} | `{r[1]}` | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]} | {r[7]} | {r[8]} | {r[9]:.1f} |"
              for r in rows]
    lines += [
        "",
        "## Modelled time of the first pick (a MODEL, not a measurement)",
        "",
        "`nvgemm.templates.sm120_w4a4.perf.model_range_us` (optimistic - pessimistic end of every range; device "
        "profile: `nvgemm.heuristics.perfmodel.hardware`, which cites its sources); the byte floor is the NVFP4 weights read once at the "
        "optimistic achievable bandwidth.",
        "",
        "| arch | device | N | K | M | first pick | modelled us | byte floor us |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | `{r[5]}` | {r[6]:.1f} - {r[7]:.1f} | {r[8]:.1f} |"
              for r in model_rows]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {a.out}: {len(rows)} compiles, {len(spills)} spilling")
    return 1 if spills else 0


if __name__ == "__main__":
    raise SystemExit(main())
