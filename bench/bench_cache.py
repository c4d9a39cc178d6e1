"""Kernel-cache timings on this machine: cold compile per kernel, warm re-run, warm load per kernel.

    python bench/bench_cache.py --model Llama-3.1-8B --m 1,8,32,128 --arch sm_100a,sm_90a

Kernels: the AOT selftest kernels plus the candidate policy's top config per (arch, layer, M).
Each is built into a fresh temporary cache, sequentially in this process (so compile times are not
contended by parallel workers; the first compile in a process also pays CuTeDSL's one-time
initialisation). A second pass over the same specs must compile nothing. Loads are timed in a fresh
process in which ``import cutlass`` fails (the serving situation). Writes
``bench/results/cache_<date>.md`` and ``.json`` (or ``--out PREFIX``).

``--warm-load CACHE_DIR`` instead times loading *every* kernel ``nvgemm precompile --model M``
planned (same --model / --arch) from an already filled cache, in a fresh cutlass-blocked process,
and prints JSON (a serving process's cold start over a full model).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from nvgemm.cli.bench import _int_list, cache_timings, cache_timings_markdown, environment_header


WARM_LOAD = textwrap.dedent(
    """
    import argparse, json, statistics, sys, time
    for m in ("cutlass", "nvidia_cutlass_dsl"):
        sys.modules[m] = None  # serving: the DSL compiler cannot be imported
    t0 = time.perf_counter()
    import torch
    from nvgemm.aot.artifact import preload_cudart
    from nvgemm.aot.cache import KernelCache
    from nvgemm.cli.precompile import plan_specs
    t_imp = time.perf_counter() - t0
    args = argparse.Namespace(model=sys.argv[2], checkpoint=None, shape=None, selftest=False, arch=sys.argv[3], gpu=None,
                              sm_count=None, m_buckets=None, max_m=256, out_dtype="bf16", max_candidates=8, no_nvmmh=False)
    t0 = time.perf_counter(); _, specs, _ = plan_specs(args); t_plan = time.perf_counter() - t0
    t0 = time.perf_counter(); kc = KernelCache(sys.argv[1]); preload_cudart(); t_init = time.perf_counter() - t0
    ms = []
    for _, s in specs:
        t0 = time.perf_counter(); kc.get(s, build=False); ms.append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter()
    for _, s in specs:
        kc.get(s, build=False)
    memo_us = (time.perf_counter() - t0) / len(specs) * 1e6
    ms.sort()
    print(json.dumps({"kernels": len(specs), "import_s": t_imp, "plan_s": t_plan, "cache_init_s": t_init,
                      "load_ms_median": statistics.median(ms), "load_ms_p90": ms[int(0.9 * len(ms))], "load_ms_max": ms[-1],
                      "load_ms_total": sum(ms), "memoized_get_us": memo_us, "stats": kc.stats,
                      "cutlass_imported": [k for k, v in sys.modules.items() if "cutlass" in k and v is not None]}))
    """
)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="Llama-3.1-8B")
    p.add_argument("--m", type=_int_list, default=[1, 8, 32, 128])
    p.add_argument("--arch", default="sm_100a,sm_90a")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--warm-load", type=Path, default=None, metavar="CACHE_DIR",
                   help="time loading every precompiled kernel of --model from CACHE_DIR (cutlass blocked)")
    args = p.parse_args()
    if args.warm_load:
        r = subprocess.run([sys.executable, "-c", WARM_LOAD, str(args.warm_load), args.model, args.arch],
                           capture_output=True, text=True)
        print(r.stdout.strip() or r.stderr[-3000:])
        return r.returncode
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
