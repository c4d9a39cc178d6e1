"""Compile every sm90 config the policy emits (no GPU) and check the instructions that matter.

    python bench/compile_sweep_sm90.py [--out bench/results/sm90_compile_sweep.md]

Problems: the Llama-3.1-8B / 3.3-70B layer shapes (bench/sm90_suite.py) at M in {1, 2, 4, 8, 16,
32, 64, 128, 256}, epilogue none and silu_mul (bf16 activations, bf16 out). Every distinct
(config, epilogue) the policy lists (``nvgemm.heuristics.candidates``) is compiled for sm_90a;
mma kernels must stream weights with evict-first ``cp.async.cg`` and wgmma kernels must
contain ``wgmma.mma_async``; no kernel may use local memory. Writes a markdown table.
"""

from __future__ import annotations

import argparse
import importlib.util
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

M_VALUES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sm90_compile_sweep.md"))
    args = ap.parse_args()
    import torch

    from nvgemm.epilogues import EpilogueSpec
    from nvgemm.heuristics import candidates
    from nvgemm.heuristics.problem import GemmProblem, Target
    from nvgemm.aot.compile_spec import make_spec
    from nvgemm.runtime.sm90_backend import template_id_of
    from nvgemm.templates.registry import check_spec, get_template

    spec_ = importlib.util.spec_from_file_location("sm90_suite", ROOT / "bench" / "sm90_suite.py")
    suite = importlib.util.module_from_spec(spec_)
    sys.modules["sm90_suite"] = suite
    spec_.loader.exec_module(suite)

    uses: dict = {}
    for m in M_VALUES:
        for shape, (n, k) in suite.LLAMA_SHAPES.items():
            for act in ("none", "silu_mul"):
                p = GemmProblem(n=n, k=k, m=m, a_format="bf16", b_format="nvfp4", epilogue=act,
                                target=Target(arch="sm_90a", sm_count=132))
                for c in candidates(p, use_nvmmh=False):
                    uses.setdefault((c.config, act), []).append(f"{shape}.m{m}")
    rows, fails = [], 0
    t_all = time.time()
    for (cfg, act), probs in sorted(uses.items(), key=lambda kv: (kv[0][0].name(), kv[0][1])):
        tid = template_id_of(cfg)
        spec = make_spec(tid, cfg, "sm_90a", epilogue=EpilogueSpec(alpha="scalar", activation=act), a_format="bf16")
        st = check_spec(spec)
        t0 = time.time()
        if not st:
            rows.append((cfg.name(), act, "REJECTED", st.reason, 0.0, len(probs)))
            fails += 1
            continue
        try:
            ptx = get_template(tid).compile(spec, keep_ptx=True).__ptx__
            need = "wgmma.mma_async" if cfg.family == "wgmma" else "cp.async.cg.shared.global.L2::cache_hint"
            ok = need in ptx and ".local" not in ptx
            why = "" if ok else f"missing {need} or uses local memory"
        except Exception as e:  # noqa: BLE001  (record and continue)
            ok, why = False, f"{type(e).__name__}: {str(e)[:120]}"
        fails += not ok
        rows.append((cfg.name(), act, "ok" if ok else "FAIL", why, time.time() - t0, len(probs)))
        print(f"{rows[-1][2]:4s} {rows[-1][4]:5.1f}s {cfg.name()} {act} {why}", flush=True)
    total = time.time() - t_all
    import cutlass  # noqa: F401  (version for the record)
    from importlib.metadata import version

    lines = [
        "# sm90 W4A16: every config the policy emits, compiled for sm_90a (no GPU)",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {platform.node()} "
        f"({os.cpu_count()} CPUs, no GPU); python {platform.python_version()}, torch {torch.__version__}, "
        f"nvidia-cutlass-dsl {version('nvidia-cutlass-dsl')}",
        "- command: `python bench/compile_sweep_sm90.py`",
        f"- problems: Llama-3.1-8B / 3.3-70B layer shapes x M in {list(M_VALUES)} x epilogue none / silu_mul",
        f"- result: {len(rows) - fails}/{len(rows)} (config, epilogue) pairs compile with the expected "
        f"instructions (mma: evict-first `cp.async.cg ... L2::cache_hint`; wgmma: `wgmma.mma_async`; "
        f"no local memory); {total:.0f} s in total",
        "",
        "| config | epilogue | result | compile s | problems using it |",
        "|---|---|---|---|---|",
    ]
    for name, act, res, why, secs, nprob in rows:
        lines.append(f"| {name.replace('nvgemm_cutedsl_sm90_w4a16_', '')} | {act} | {res} {why} | {secs:.1f} | {nprob} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"{len(rows) - fails}/{len(rows)} ok in {total:.0f}s -> {args.out}")
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
