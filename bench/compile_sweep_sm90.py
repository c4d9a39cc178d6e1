"""Compile every (config, epilogue) variant the sm90 policy emits for the preset models (no GPU) and
read its spills from the SASS.

    nice -n 10 python bench/compile_sweep_sm90.py [--out bench/results/sm90_spill_sweep.md]

Problems: every preset model's layer shapes (``nvgemm.heuristics.presets``) x M in {1, 2, 4, 8,
16, 32, 64, 128, 256} x activation none / silu_mul on H200 (132 SMs), nvMatmulHeuristics off. Every
distinct (config, activation) the policy lists (all its candidates, not only the first) is
compiled for sm_90a with two epilogues -- ``ref`` (scalar alpha) and ``full`` (per-column alpha +
bias + residual) -- and its SASS read with cuobjdump: ``LDL``/``STL`` (local memory: ptxas spills,
which PTX ``.local`` cannot show) in the kernel and in its main loop, and the tensor-core
instructions (HMMA for mma, HGMMA for wgmma). The records go into the ``spills`` section of
``src/nvgemm/heuristics/perfmodel/sass_facts.json``, which the policy reads to drop spilling variants; the
sweep repeats until the policy emits no unrecorded pair (dropping a spiller brings in another
candidate). Writes a markdown table of the final pairs.

Before issue 23 this script checked PTX for ``.local`` (which cannot see ptxas' spills) and wrote
``bench/results/sm90_compile_sweep.md``; that file stays as the record of those compile times.
The full sweep (``--shapes presets --top 8``, ~400 pairs x 2 compiles) takes hours on the shared
2-core machine; ``--shapes llama --top 1`` (the first choices, ~60 pairs) is its minimum, which
``tests/cpu/test_perfmodel.py`` requires.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.mkdtemp(prefix="nvgemm_cute_dump_"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sm90_spill_sweep.md"))
    ap.add_argument("--shapes", choices=("presets", "llama"), default="presets",
                    help="layer shapes: every preset model's (default) or Llama-3.1-8B / 3.3-70B only")
    ap.add_argument("--top", type=int, default=8, help="candidates per problem, by rank (default: all 8)")
    ap.add_argument("--arch", default="sm_90a", choices=("sm_90a", "sm_80", "sm_86", "sm_89", "sm_120a", "sm_121a"),
                    help="target arch (default sm_90a; the others: the mma kernel on the arch's default GPU, "
                         "perfmodel.hardware.DEFAULT_GPU_OF_ARCH)")
    ap.add_argument("--timing", action="store_true",
                    help="also recompile recorded pairs whose records lack the variant's timing facts")
    args = ap.parse_args()
    from importlib.metadata import version

    from nvgemm.heuristics.perfmodel.hardware import DEFAULT_GPU_OF_ARCH
    from nvgemm.heuristics.perfmodel.table import load_table, spill_status
    from nvgemm.cli import sass_tool as T

    from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config as W

    shapes = T.preset_shapes() if args.shapes == "presets" else list(T.LLAMA_SHAPES)
    # the two variants issue 23 found spilling (4096 x 14336 at M = 32) are recorded first
    named = [(W("mma", tile_m=32, tile_n=128, tile_k=256, split_k=s, num_warps=8, stages=3, pdl=True), "none")
             for s in (7, 4)]
    t0 = time.time()
    arch = args.arch
    if arch != "sm_90a":
        named = []
    pairs, rows = T.sweep_spills(arch, shapes=shapes, top=args.top, first=named, timing=args.timing,
                                 log=lambda s: print(s, flush=True))
    total = time.time() - t0
    rec = load_table()["spills"][arch]
    # every recorded spilling variant (this run's and earlier runs')
    dropped = sorted((c, a) for c, per in rec.items() for a in per if spill_status(_cfg(c), a, arch))
    lines = [
        f"# W4A16 ({arch}): every (config, epilogue) variant the policy emits, compiled for {arch} (no GPU)",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs, no GPU; "
        f"python {platform.python_version()}, nvidia-cutlass-dsl {version('nvidia-cutlass-dsl')}",
        f"- command: `nice -n 10 python bench/compile_sweep_sm90.py --arch {arch} --out {Path(args.out).name} "
        f"--shapes {args.shapes} --top {args.top}"
        f"{' --timing' if args.timing else ''}` "
        "(records: the `spills` section of `src/nvgemm/heuristics/perfmodel/sass_facts.json`; the full sweep is "
        "`--shapes presets --top 8`)",
        f"- problems: {len(shapes)} layer shapes ({args.shapes}) x M in {list(T.SM90_M)} x activation "
        f"{' / '.join(T.SWEEP_ACTIVATIONS)} ({DEFAULT_GPU_OF_ARCH[arch]}, nvMatmulHeuristics off, candidates ranked "
        f"1..{args.top})",
        "- variants per (config, activation): `ref` = scalar alpha; `full` = per-column alpha + bias + residual",
        f"- this run: {len(rows)} compiles in {total:.0f} s; recorded in all runs: {len(rec)} configs, "
        f"{len(dropped)} spilling (config, activation) pairs, which the policy drops (below)",
        f"- result: the policy now emits {len(pairs)} (config, activation) pairs; "
        f"{sum(1 for c, a in pairs if spill_status(c, a, arch) is False)} of them spill-free in both variants",
        "",
    ]
    if dropped:
        lines += ["## Spilling variants (the policy drops them)", "", "| config | activation | ref LDL/STL (loop) | full LDL/STL (loop) |",
                  "|---|---|---|---|"]
        for c, a in dropped:
            r = rec[c][a]
            lines.append(f"| {c.replace('nvgemm_cutedsl_sm90_w4a16_', '')} | {a} | "
                         + " | ".join(_cell(r.get(v, {})) for v in ("ref", "full")) + " |")
        lines.append("")
    lines += ["## Pairs the policy emits", "", "| config | activation | ref regs, LDL/STL | full regs, LDL/STL | tensor-core ops | problems |",
              "|---|---|---|---|---|---|"]
    for (c, a), probs in sorted(pairs.items(), key=lambda kv: (kv[0][0].name(), kv[0][1])):
        r = rec.get(c.name(), {}).get(a, {})
        mma = r.get("ref", {}).get("mma", "?")
        lines.append(f"| {c.name().replace('nvgemm_cutedsl_sm90_w4a16_', '')} | {a} | "
                     + " | ".join(f"{r.get(v, {}).get('regs', '?')}, {_cell(r.get(v, {}))}" for v in ("ref", "full"))
                     + f" | {mma} | {len(probs)} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    bad = [p for p in pairs if spill_status(*p, arch) is not False]
    print(f"{len(pairs)} pairs, {len(bad)} not spill-free / unrecorded -> {args.out}")
    return 1 if bad else 0


def _cfg(name: str):
    from nvgemm.heuristics.perfmodel.table import parse_config_name

    return parse_config_name(name)


def _cell(f: dict) -> str:
    if "error" in f:
        return f"error: {f['error'][:60]}"
    return f"{f.get('ldl', '?')}/{f.get('stl', '?')} ({f.get('ldl_loop', '?')}/{f.get('stl_loop', '?')})"


if __name__ == "__main__":
    raise SystemExit(main())
