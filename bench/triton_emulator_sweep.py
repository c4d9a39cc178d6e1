"""Every Triton kernel nvgemm ships, at each config its host code picks on a GPU, from its real sm_90a,
sm_100a and sm_120a PTX on the PTX emulator (opt-in; the default CI runs one shape per kernel in
``tests/emulator/test_triton_kernels_emu.py``, on sm_90a and sm_100a, and the quantizer and RMSNorm quantizer
on sm_120a).

The cases and their references are ``tests/emulator/_triton_emu_cases.py`` (``sweep_cases``): the quantizers
at the decode and prefill block shapes (swizzled and linear scales), RMSNorm one-tile and two-pass with and
without the residual add, ``silu_mul``, the fused RoPE + KV-cache write (decode GQA, several tokens, MHA,
MQA), the W4A16 GEMM at both GPU tile configs (decode 16x64 and the M > 16
tile; gated, W4A4 and W4A16, every activation), the Triton MoE at BLOCK_M 16 and 32, and the MoE prep /
finalize kernels. Each row: verdict, seconds (compile from Triton's cache + bind + emulate), emulated
warp-instructions, and the Triton version. Writes ``bench/results/triton_emulator_sweep.md`` (rewritten
after every row, so an interrupted run keeps what finished).

    python bench/triton_emulator_sweep.py [--archs sm_90a,sm_100a,sm_120a] [--only quantize,moe] [--limit N] [--out F]

Results: ``bench/results/triton_emulator_sweep.md`` (``--archs sm_90a,sm_100a``),
``bench/results/triton_emulator_sweep_sm120a.md`` (``--archs sm_120a``).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "emulator"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", default="sm_90a,sm_100a,sm_120a",
                    help="comma-separated targets whose PTX runs (sm_90a, sm_100a, sm_120a)")
    ap.add_argument("--only", default="", help="comma-separated substrings of kernel names")
    ap.add_argument("--limit", type=int, default=None, help="at most N cases")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "triton_emulator_sweep.md"))
    args = ap.parse_args()

    import _triton_emu_cases as C

    archs = args.archs.split(",")
    bad = [a for a in archs if a not in C.SWEEP_ARCHS]
    if bad:
        ap.error(f"--archs: unknown target(s) {bad}; choose from {','.join(C.SWEEP_ARCHS)}")

    import torch
    import triton

    from nvgemm.emulator import triton_ptx

    cases = C.sweep_cases()
    if args.only:
        keys = args.only.split(",")
        cases = [c for c in cases if any(k in c.name for k in keys)]
    cases = cases[:args.limit]
    command = "python bench/triton_emulator_sweep.py" + "".join(
        f" {flag} {v}" for flag, v in (("--archs", args.archs), ("--only", args.only)) if v)
    rows = []
    t_all = time.perf_counter()
    for case in cases:
        for arch in archs:
            n0 = len(triton_ptx.LAUNCHES)
            t0 = time.perf_counter()
            try:
                case.run(arch)
                verdict = _verdict(case)
            except Exception as e:  # noqa: BLE001 - a row per failure, the sweep goes on
                verdict = f"FAIL {type(e).__name__}: {str(e)[:200]}"
                traceback.print_exc()
            dt = time.perf_counter() - t0
            launches = triton_ptx.LAUNCHES[n0:]
            emu_s = sum(r.seconds for r in launches)
            instr = sum(r.warp_instructions for r in launches)
            grids = ", ".join(f"{r.kernel}{list(r.grid)}x{r.num_warps}w" for r in launches)
            rows.append((case.name, case.module, case.shape, arch, verdict, dt, emu_s, instr, grids))
            print(f"{case.name:28s} {case.shape:48s} {arch:8s} {dt:6.1f}s {verdict}", flush=True)
            _write(args.out, rows, triton.__version__, torch.__version__, time.perf_counter() - t_all, command)
    return 0 if all(not r[4].startswith("FAIL") for r in rows) else 1


def _verdict(case) -> str:
    """What a passing case asserted (``tests/emulator/_triton_emu_cases.py``, TOLERANCES)."""
    if case.name == "silu_mul_quantize_kernel" or (case.name == "w4a16_gemm_kernel" and
                                                   ("silu" in case.shape or "gelu" in case.shape)):
        return "bit-exact vs the kernel formula (ex2.approx model); torch within tolerance"
    if case.name == "rmsnorm_quantize_kernel":
        return "bit-exact vs the kernel formula; HF RMSNorm within 1 ulp"
    if case.name.startswith("moe_gemm") and "silu" in case.shape:
        return "within tolerance (2 ulps; exp)"
    return "bit-exact"


def _write(out: str, rows, triton_version: str, torch_version: str, total: float, command: str) -> None:
    ok = sum(not r[4].startswith("FAIL") for r in rows)
    lines = [
        "# Triton kernels on the PTX emulator (full sweep)",
        "",
        f"`{command}` -- Triton {triton_version}, torch {torch_version}, "
        "2-core CPU, no GPU. Each kernel compiled by Triton for the named target with the launch options "
        "its host code passes (GPU tile config, num_warps, num_stages, PDL on), its PTX run on "
        "`nvgemm.emulator` and compared with the reference in `tests/emulator/_triton_emu_cases.py` "
        "(bit-exact unless the row says otherwise; see TOLERANCES there).",
        "",
        f"**{ok}/{len(rows)} runs pass**, {total:.0f} s in all. `total s` includes Triton's compile (from its "
        "cache when warm) and the host code; `emulate s` is the emulator alone.",
        "",
        "| kernel | file | case | arch | verdict | total s | emulate s | warp-instr | launches (grid x warps) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, mod, shape, arch, verdict, dt, emu_s, instr, grids in rows:
        lines.append(f"| {name} | {mod} | {shape} | {arch} | {verdict} | {dt:.1f} | {emu_s:.1f} | {instr} | "
                     f"{grids} |")
    per = {}
    for name, _m, _s, arch, _v, dt, emu_s, _i, _g in rows:
        a = per.setdefault((name, arch), [0, 0.0, 0.0])
        a[0] += 1
        a[1] += dt
        a[2] += emu_s
    lines += ["", "## Run time per kernel", "", "| kernel | arch | cases | total s | emulate s |",
              "|---|---|---|---|---|"]
    for (name, arch), (n, dt, emu_s) in per.items():
        lines.append(f"| {name} | {arch} | {n} | {dt:.1f} | {emu_s:.1f} |")
    Path(out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
