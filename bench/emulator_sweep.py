"""The PTX emulator's full sweep (opt-in; default CI runs a subset in tests/emulator):

1. every sm90 config (``mma`` and ``wgmma``) the runtime picks for the preset Llama shapes (M = 1..64,
   plain and ``silu_mul``), scaled down to N <= 2 tiles and K <= 2048, run on the emulator through its real
   AOT artifact and compared with the emulated backend (bit for bit on exact data; ``silu_mul``
   within ``RANDOM_RTOL``), split-K counters checked back at zero;
2. the launch recorder for every config the policy emits for the preset shapes on sm_90a and
   sm_100a (grid / block / cluster / smem / PDL / parameter ABI vs the launcher);
3. (``--only moe``) every grouped MoE config the two grouped policies emit (``sm90_moe``: H200,
   ``sm100_moe``: B200) for the MoE presets at M = 1..256, per GEMM role: each config runs, paired
   with an emitted config of the other role and the same token tile, on a tiny routing that
   exercises its token tile (one expert with two tiles, the last partial), its split-K (K stages
   for every split plus a K tail), an expert without tokens, ``-1`` ids and an expert picked twice
   by a token, through the real AOT artifacts on the emulator (the production host path
   ``moe_forward``), compared bit for bit with the emulated ``nvfp4_moe`` on exactness-preserving
   data (``tests/emulator/_sm90_moe_emu.py`` / ``_sm100_moe_emu.py``); ``--variants`` adds GEMM1 with
   per-row alpha and fp16 activations (:data:`MOE_VARIANTS`).

Writes ``bench/results/emulator_sweep.md`` (one row per kernel: verdict, seconds, warp-instructions;
the committed file joins ``--only picks`` with ``--only recorder``).

    python bench/emulator_sweep.py [--only picks|recorder] [--limit N] [--families mma,wgmma]
    python bench/emulator_sweep.py --only moe [--families sm90_moe,sm100_moe] [--variants bf16,...] [--limit N]
        [--out F]

``--only moe`` writes its own section (rewritten after every row, so an interrupted run keeps what
finished); the committed file joins it with the other parts.
"""

from __future__ import annotations

import argparse
import math
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
    from nvgemm.cli import sass_tool
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


MOE_FAMILIES = ("sm90_moe", "sm100_moe")
MOE_MS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # the M buckets' bounds (every bucket up to 256 and more)


def _moe_policy(family):
    from nvgemm.templates.sm90_moe import policy as moe_sm90
    from nvgemm.templates.sm100_moe import policy as moe_sm100

    return (moe_sm90, "H200") if family == "sm90_moe" else (moe_sm100, "B200")


def token_tile(family, c) -> int:
    return c.tile_m if family == "sm90_moe" else c.tile_n


def moe_emitted(family, ms=MOE_MS):
    """{role: {config: [(layer, M), ...]}}: every config the grouped policy of ``family`` emits (all
    candidates) for the MoE presets at ``ms``, per GEMM role (13 = gate/up, 2 = down)."""
    from nvgemm.templates.sm90_moe.policy import MOE_LAYERS

    mod, gpu = _moe_policy(family)
    out = {13: {}, 2: {}}
    for shape in MOE_LAYERS.values():
        for m in ms:
            for c in mod.moe_candidates(shape, m, gpu):
                out[13].setdefault(c.config13, []).append((shape.name, m))
                out[2].setdefault(c.config2, []).append((shape.name, m))
    return out


def moe_runs(family, ms=MOE_MS):
    """Emulator runs (config13, config2) that cover every emitted config of each role at least once:
    per token tile, GEMM1 configs by decreasing split-K zipped with GEMM2 configs by increasing
    split-K (the scaled-down H grows with GEMM1's split, I with GEMM2's: the zip keeps the emulated
    work small), the shorter list padded with its cheapest config (least split-K, then tile)."""
    em = moe_emitted(family, ms)

    def key(c):
        return (c.split_k, getattr(c, "tile_n", 0), c.name())

    runs = []
    for t in sorted({token_tile(family, c) for r in em.values() for c in r}):
        a = sorted((c for c in em[13] if token_tile(family, c) == t), key=key, reverse=True)
        b = sorted((c for c in em[2] if token_tile(family, c) == t), key=key)
        if not a or not b:
            raise AssertionError(f"{family}: token tile {t} emitted for one GEMM role only")
        cheap_a = min(a, key=key)
        for i in range(max(len(a), len(b))):
            runs.append((a[i] if i < len(a) else cheap_a, b[i] if i < len(b) else b[0]))
    return runs


def moe_problem(family, c13, c2):
    """The tiny MoE problem of one run: (M, top_k, E, H, I, ids). t = the token tile; E = 3 experts:
    expert 0 gets every token's slot 0 plus token 0's slot 1 (M + 1 = t + 4 pairs: two work tiles, the
    last partial, one token routed to it twice), expert 1 none, expert 2 every odd token's slot 1, the
    other slots ``-1``. H (GEMM1's K, GEMM2's rows) holds GEMM1's split-K stages of 256 plus a tail
    of 160; I (GEMM2's K; GEMM1 has 2I gate/up rows) GEMM2's plus a tail of 96."""
    t = token_tile(family, c13)
    m, top_k, e = t + 3, 2, 3
    h = 256 * (c13.split_k - 1) + 160 if c13.split_k > 1 else 416
    i = 256 * (c2.split_k - 1) + 96
    ids = torch.full((m, top_k), -1, dtype=torch.int32)
    ids[:, 0] = 0
    ids[1::2, 1] = 2
    ids[0, 1] = 0
    mod = _moe_config_module(family)
    for c, rows, k, gated in ((c13, 2 * i, h, True), (c2, h, i, False)):
        why = mod.moe_shape_problem(c, rows, k, gated)
        if why:
            raise AssertionError(f"{c.name()}: scaled-down problem rejected: {why}")
    return m, top_k, e, h, i, ids


def _moe_config_module(family):
    if family == "sm90_moe":
        from nvgemm.templates.sm90_moe import config
    else:
        from nvgemm.templates.sm100_moe import config
    return config


#: GEMM1 epilogue / activation variants of a run (each its own compiled kernels): per-expert alpha in
#: bf16 (the default), per-row alpha (gate and up ``weight_scale_2`` differ), fp16 activations (per-row
#: alpha, as the helpers force for fp16's range).
MOE_VARIANTS = {"bf16": ("expert", torch.bfloat16), "bf16-rowalpha": ("row", torch.bfloat16),
                "fp16-rowalpha": ("row", torch.float16)}


def run_moe(family, c13, c2, variant="bf16", seed=0):
    """One emulated ``nvfp4_moe`` with (c13, c2) on :func:`moe_problem` in ``variant``
    (:data:`MOE_VARIANTS`): (None or (number of differing elements, first index, got, want),
    warp-instructions of all kernel launches, (M, top_k, E, H, I), pairs per expert)."""
    from nvgemm.ops.moe import nvfp4_moe_emulated

    if family == "sm90_moe":
        from _sm90_moe_emu import FP16_SAFE_K, exact_moe_operands, run_moe_emu
    else:
        from _sm100_moe_emu import FP16_SAFE_K, exact_moe_operands, run_moe_emu
    m, top_k, e, h, i, ids = moe_problem(family, c13, c2)
    alpha13, x_dtype = MOE_VARIANTS[variant]
    # fp16: the helpers' up-row scales keep h and the output finite for K <= FP16_SAFE_K; each doubling
    # of K past it may double both GEMM1 sums (h = gate x up): 4x smaller up scales per doubling (exact)
    shift = 2 * max(0, math.ceil(math.log2(h / FP16_SAFE_K))) if x_dtype == torch.float16 else 0
    ops = exact_moe_operands(m, top_k, e, h, i, ids=ids, seed=seed, shared=True, residual=True, alpha13=alpha13,
                             x_dtype=x_dtype, up_shift=shift)
    stats, keep = [], {}
    got = run_moe_emu(ops, c13, c2, keep, stats)
    want = nvfp4_moe_emulated(*ops)
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"output {tuple(got.shape)} {got.dtype} vs reference {tuple(want.shape)} {want.dtype}")
    if not want.float().isfinite().all():
        raise AssertionError("reference output is not finite (the data's range is too large for the problem)")
    if not float(want.float().abs().amax()) > 0:
        raise AssertionError("reference output is all zero (the problem tests nothing)")
    bad = (got.float() != want.float()).nonzero()
    first = None
    if bad.numel():
        idx = tuple(bad[0].tolist())
        first = (bad.shape[0], idx, float(got[idx]), float(want[idx]))
    return first, sum(stats), (m, top_k, e, h, i), keep["work_list"].counts.tolist()


def sweep_moe(limit, rows: list, families, write=None, ms=MOE_MS, variants=("bf16",)) -> None:
    for family in families:
        em = moe_emitted(family, ms)
        runs = [(v, c13, c2) for v in variants for c13, c2 in moe_runs(family, ms)[:limit]]
        done13, done2 = set(), set()
        for variant, c13, c2 in runs:
            t0 = time.perf_counter()
            try:
                first, instr, prob, counts = run_moe(family, c13, c2, variant)
                verdict = "bit-exact" if first is None else \
                    f"FAIL {first[0]} elements differ, first {first[1]}: {first[2]} vs {first[3]}"
            except Exception as e:
                verdict, instr, prob, counts = f"FAIL {type(e).__name__}: {str(e)[:160]}", 0, None, None
                traceback.print_exc()
            dt = time.perf_counter() - t0
            p = "-" if prob is None else f"M={prob[0]} top{prob[1]} E={prob[2]} H={prob[3]} I={prob[4]} pairs/expert={counts}"
            for role, c, other, done in ((13, c13, c2, done13), (2, c2, c13, done2)):
                if (variant, c) in done:
                    continue
                done.add((variant, c))
                where = em[role][c]
                rows.append((variant, family, f"GEMM{'1' if role == 13 else '2'}", c.name(), other.name(), p, verdict, dt,
                             instr, f"{len(where)} (layer, M), e.g. {where[0][0]} M={where[0][1]}"))
                print(rows[-1], flush=True)
            if write:
                write()


def moe_totals(families, ms=MOE_MS) -> int:
    return sum(len(moe_emitted(f, ms)[r]) for f in families for r in (13, 2))


def write_moe(path, rows, families, cmd, t0, variants) -> None:
    total = moe_totals(families) * len(variants)
    fails = [r for r in rows if r[6].startswith("FAIL")]
    ok = len(rows) - len(fails)
    lines = ["## Every grouped MoE config the policies emit, run on the emulator", "",
             f"Command: `{cmd}` ({time.strftime('%Y-%m-%d')}, CPU only, 2 shared cores, nice -n 10; seconds are wall "
             "time of the run (both GEMMs, the host path and the reference) and include the AOT build + keep_ptx "
             "compile of kernels not yet cached; warp-instr sums both grouped GEMM launches of the run).", "",
             f"Emitted: every candidate of the sm90 (H200) / sm100 (B200) grouped policy for {', '.join(_layer_names())} "
             f"at M = {', '.join(map(str, MOE_MS))} (one row per distinct config per GEMM role; a run pairs it with an "
             "emitted config of the other role and the same token tile).", "",
             f"**{ok}/{len(rows)} bit-exact** of {len(rows)} (config, role, variant) rows run; {total} = emitted configs "
             f"per role x variants {', '.join(variants)} in total"
             + ("" if len(rows) == total else f" -- **{total - len(rows)} not run** (interrupted or --limit)")
             + f"; {time.perf_counter() - t0:.0f} s.", "",
             "| family | variant | role | config | paired with | problem | result | s | warp-instr | emitted for |",
             "|---|---|---|---|---|---|---|---:|---:|---|"]
    lines += [f"| {f} | {v} | {role} | {n} | {o} | {p} | {r} | {s:.1f} | {i} | {w} |"
              for v, f, role, n, o, p, r, s, i, w in rows]
    Path(path).write_text("\n".join(lines) + "\n")


def _layer_names():
    from nvgemm.templates.sm90_moe.policy import MOE_LAYERS

    return list(MOE_LAYERS)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=("picks", "recorder", "moe"))
    ap.add_argument("--limit", type=int, help="at most this many kernels per part (and per arch)")
    ap.add_argument("--families", help="picks: sm90 families (default mma,wgmma); moe: sm90_moe,sm100_moe (default both)")
    ap.add_argument("--variants", default="bf16", help=f"moe: GEMM1 variants, of {', '.join(MOE_VARIANTS)}")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "emulator_sweep.md"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows: list = []
    t0 = time.perf_counter()
    cmd = " ".join(["python bench/emulator_sweep.py"] + sys.argv[1:])
    if a.only == "moe":
        fams = tuple((a.families or ",".join(MOE_FAMILIES)).split(","))
        if set(fams) - set(MOE_FAMILIES):
            ap.error(f"--families for moe: {', '.join(MOE_FAMILIES)}")
        out = a.out if a.out != ap.get_default("out") else str(ROOT / "bench" / "results" / "emulator_sweep_moe.md")
        variants = tuple(a.variants.split(","))
        if set(variants) - set(MOE_VARIANTS):
            ap.error(f"--variants: {', '.join(MOE_VARIANTS)}")
        sweep_moe(a.limit, rows, fams, lambda: write_moe(out, rows, fams, cmd, t0, variants), variants=variants)
        write_moe(out, rows, fams, cmd, t0, variants)
        fails = [r for r in rows if r[6].startswith("FAIL")]
        print(f"wrote {out}: {len(rows)} configs, {len(fails)} failures")
        return 1 if fails else 0
    if a.only in (None, "picks"):
        sweep_picks(a.limit, rows, tuple((a.families or "mma,wgmma").split(",")))
    if a.only in (None, "recorder"):
        sweep_recorder(a.limit, rows)
    fails = [r for r in rows if r[4].startswith("FAIL")]
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
