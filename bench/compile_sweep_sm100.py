"""Compile every sm100 NVFP4 config the candidate policy emits for a representative shape set
(plus nvgemm's own representative list), for sm_100a, without a GPU; time each compile and
check the PTX (block-scaled FP4 MMA; griddepcontrol iff PDL).

    python bench/compile_sweep_sm100.py [--out bench/results/sm100_compile_times.md] [--limit N]

Timing: wall time of ``cute.compile`` only (cutlass import and the first-call warm-up excluded;
the first compile of the process is reported separately).
"""

import argparse
import os
import platform
import re
import sys
import tempfile
import time

os.environ.setdefault("CUTE_DSL_ARCH", "sm_100a")
os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.mkdtemp(prefix="nvgemm_cute_dump_"))

SHAPES = [  # (M, N, K): Llama-3-8B / 70B-ish decode and prefill projections
    (1, 4096, 4096), (1, 6144, 4096), (1, 28672, 4096), (1, 4096, 14336),
    (8, 4096, 4096), (16, 8192, 8192), (32, 57344, 8192), (64, 4096, 4096),
    (128, 4096, 14336), (256, 6144, 4096), (1024, 4096, 4096), (4096, 8192, 8192),
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/sm100_compile_times.md")
    ap.add_argument("--limit", type=int, default=0)
    a = ap.parse_args()

    import cutlass
    import torch

    from nvgemm.epilogues import EpilogueSpec
    from nvgemm.heuristics import candidates
    from nvgemm.core.problem import GemmProblem, Target
    from nvgemm.aot.compile_spec import make_spec
    from nvgemm.aot.abi import check_spec, get_template
    from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig as C

    cfgs: list = []
    for m, n, k in SHAPES:
        for cand in candidates(GemmProblem(n=n, k=k, m=m, target=Target.from_gpu("B200")), use_nvmmh=True):
            if cand.config not in cfgs:
                cfgs.append(cand.config)
    for extra in (C(tile_n=128, pdl=False), C(tile_n=192), C(tile_n=16, swap_ab=True, split_k=4)):
        if extra not in cfgs:
            cfgs.append(extra)
    if a.limit:
        cfgs = cfgs[: a.limit]
    tpl = get_template("sm100_nvfp4_gemm")
    mma = re.compile(r"tcgen05\.mma\.cta_group::[12]\.kind::mxf4nvf4\.block_scale")
    rows, fails = [], []
    warm = None
    for i, cfg in enumerate(cfgs):
        spec = make_spec("sm100_nvfp4_gemm", cfg, "sm_100a", epilogue=EpilogueSpec(alpha="scalar"))
        st = check_spec(spec)
        if not st:
            fails.append((cfg.name(), f"rejected: {st.reason}"))
            continue
        t0 = time.perf_counter()
        c0 = time.process_time()
        try:
            f = tpl.compile(spec, keep_ptx=True)
        except Exception as e:  # report every failure, keep sweeping
            fails.append((cfg.name(), f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"))
            continue
        dt = time.perf_counter() - t0
        cpu = time.process_time() - c0
        ptx = f.__ptx__ or ""
        ok = bool(mma.search(ptx)) and (("griddepcontrol.wait" in ptx) == cfg.pdl)
        if warm is None:
            warm = dt
        rows.append((cfg.name(), dt, cpu, ok))
        print(f"[{i + 1}/{len(cfgs)}] {cfg.name()}: wall {dt:.2f} s cpu {cpu:.2f} s ptx_ok={ok}", flush=True)
        if not ok:
            fails.append((cfg.name(), "PTX check failed"))
    times = sorted(t for _, t, _, _ in rows[1:]) or [warm or 0.0]
    cpus = sorted(c for _, _, c, _ in rows[1:]) or [0.0]
    med = times[len(times) // 2]
    cmed = cpus[len(cpus) // 2]
    lines = [
        "# sm100 NVFP4 kernel: compile times (sm_100a, no GPU)",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPU cores, no GPU (shared with other jobs)",
        f"- versions: python {platform.python_version()}, nvidia-cutlass-dsl {cutlass.__version__ if hasattr(cutlass, '__version__') else '4.8.1'}, torch {torch.__version__}",
        f"- command: `python bench/compile_sweep_sm100.py{' --limit %d' % a.limit if a.limit else ''}`",
        f"- configs: every candidate of the policy (nvgemm.heuristics.candidates, nvMatmulHeuristics on) for {len(SHAPES)} shapes + 3 extras; epilogue alpha=scalar, bf16 out",
        f"- compiled: {len(rows)}, failed/rejected: {len(fails)}",
        f"- wall time per kernel: median {med:.2f} s, max {max(times):.2f} s (first compile of the process: {warm or 0:.2f} s)",
        f"- CPU time of the compiling process per kernel (robust to other jobs on the box): median {cmed:.2f} s, max {max(cpus):.2f} s",
        f"- load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (wall times include waiting for the CPU)",
        "",
        "| config | wall s | CPU s | PTX ok |",
        "|---|---|---|---|",
    ] + [f"| {n} | {t:.2f} | {c:.2f} | {'yes' if ok else 'NO'} |" for n, t, c, ok in rows]
    if fails:
        lines += ["", "## failures / rejections", ""] + [f"- {n}: {why}" for n, why in fails]
    open(a.out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines[:8]))
    return 1 if any(w != "PTX check failed" and not w.startswith("rejected") for _, w in fails) or any(
        not ok for _, _, _, ok in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
