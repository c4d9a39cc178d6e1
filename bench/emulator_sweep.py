"""The PTX emulator's full sweep (opt-in; default CI runs a subset in tests/emulator):

1. every sm90 config (``mma`` and ``wgmma``) the runtime picks for the preset Llama shapes (M = 1..64,
   plain and ``silu_mul``), scaled down to N <= 2 tiles and K <= 2048, run on the emulator through its real
   AOT artifact and compared with the emulated backend (bit for bit on exact data; ``silu_mul``
   within ``RANDOM_RTOL``), split-K counters checked back at zero;
2. the launch recorder for every config the policy emits for the preset shapes on sm_90a and
   sm_100a (grid / block / cluster / smem / PDL / parameter ABI vs the launcher).

Writes ``bench/results/emulator_sweep.md`` (one row per kernel: verdict, seconds, warp-instructions;
the committed file joins ``--only picks`` with ``--only recorder``).

    python bench/emulator_sweep.py [--only picks|recorder] [--limit N] [--families mma,wgmma]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "emulator"))

import torch  # noqa: E402


def sweep_picks(limit: int | None, rows: list, families: tuple[str, ...]) -> None:
    from test_sm90_mma_emu import _all_picks, _run_pick, _scaled_down

    picks = [p for p in _all_picks() if p[0][0].family in families][:limit]
    for (cfg, act), (m, n0, k0) in picks:
        t0 = time.perf_counter()
        shape = _scaled_down(cfg, act, m)
        try:
            r = _run_pick(cfg, act, m)
            verdict, instr = "match" if act == "none" else "within tol", r.launch.stats["warp_instructions"]
        except Exception as e:
            verdict, instr = f"FAIL {type(e).__name__}: {str(e)[:160]}", 0
            traceback.print_exc()
        rows.append(("run", cfg.name(), act, f"M,N,K={shape} (pick for {m}x{n0}x{k0})", verdict,
                     time.perf_counter() - t0, instr))
        print(rows[-1], flush=True)


def sweep_recorder(limit: int | None, rows: list) -> None:
    from nvgemm.perfmodel import sass_tool
    from test_launch_recorder import _small_problem, check_sm90, check_sm100

    for arch in ("sm_90a", "sm_100a"):
        for cfg in sass_tool.policy_configs(arch)[:limit]:
            t0 = time.perf_counter()
            shape = _small_problem(cfg, arch)
            try:
                (check_sm90 if arch == "sm_90a" else check_sm100)(cfg, *shape)
                verdict = "launch matches"
            except Exception as e:
                verdict = f"FAIL {type(e).__name__}: {str(e)[:160]}"
            rows.append(("record", cfg.name(), arch, f"M,N,K={shape}", verdict, time.perf_counter() - t0, 0))
            print(rows[-1], flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=("picks", "recorder"))
    ap.add_argument("--limit", type=int, help="at most this many kernels per part (and per arch)")
    ap.add_argument("--families", default="mma,wgmma", help="sm90 families of the picks part (default mma,wgmma)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "emulator_sweep.md"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows: list = []
    t0 = time.perf_counter()
    if a.only in (None, "picks"):
        sweep_picks(a.limit, rows, tuple(a.families.split(",")))
    if a.only in (None, "recorder"):
        sweep_recorder(a.limit, rows)
    fails = [r for r in rows if r[4].startswith("FAIL")]
    cmd = " ".join(["python bench/emulator_sweep.py"] + sys.argv[1:])
    lines = ["# PTX emulator sweep", "", f"Command: `{cmd}` ({time.strftime('%Y-%m-%d')}, CPU only, 2 shared cores; "
             "seconds are wall time and include the AOT build + keep_ptx compile of a kernel not yet cached).", "",
             f"{len(rows)} kernels, {len(fails)} failures, {time.perf_counter() - t0:.0f} s total.", "",
             "| kind | kernel | variant | problem | result | s | warp-instr |", "|---|---|---|---|---|---:|---:|"]
    lines += [f"| {k} | {n} | {v} | {p} | {r} | {s:.1f} | {i} |" for k, n, v, p, r, s, i in rows]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {a.out}: {len(rows)} kernels, {len(fails)} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
