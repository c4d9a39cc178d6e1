"""Kernel-cache timings on this machine: cold compile per kernel, warm re-run, warm load per kernel.

    python bench/bench_cache.py --model Llama-3.1-8B --m 1,8,32,128 --arch sm_100a,sm_90a

Kernels: the AOT selftest kernels plus the candidate policy's top config per (arch, layer, M).
Each is built into a fresh temporary cache, sequentially in this process (so compile times are not
contended by parallel workers; the first compile in a process also pays CuTeDSL's one-time
initialisation). A second pass over the same specs must compile nothing. Loads are timed in a fresh
process in which ``import cutlass`` fails (the serving situation). Writes
``bench/results/cache_<date>.md`` and ``.json`` (or ``--out PREFIX``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from nvgemm.bench_cli import _int_list, cache_timings, cache_timings_markdown, environment_header


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="Llama-3.1-8B")
    p.add_argument("--m", type=_int_list, default=[1, 8, 32, 128])
    p.add_argument("--arch", default="sm_100a,sm_90a")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    arches = [a.strip() for a in args.arch.split(",") if a.strip()]
    out = args.out or Path(__file__).parent / "results" / f"cache_{time.strftime('%Y-%m-%d', time.gmtime())}"
    res = cache_timings(args.model, args.m, arches)
    cmd = "python bench/bench_cache.py " + " ".join(sys.argv[1:])
    md = cache_timings_markdown(res, "# nvgemm kernel cache: compile and warm-load timings\n\n" + environment_header(cmd))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(md)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    print(md)
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.json')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
