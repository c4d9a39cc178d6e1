"""``nvgemm model``: modelled time of kernel configs on decode shapes (a MODEL, not a measurement).

Examples::

    nvgemm model --config nvgemm_cutedsl_sm90_w4a16_mma_t8x128x256_w4_s4_pdl --shape 28672,4096 --m 1,4
    nvgemm model --policy --shape 28672,4096 --m 1,8 --gpu H200      # the policy's candidates, ranked
    nvgemm model --best sm90.mma,sm90.wgmma --shape 4096,14336 --m 16  # the model's best config
    nvgemm model --config NAME --shape 6144,4096 --m 1 --sass          # compile now, read the SASS
    nvgemm model --regen-table                                         # rewrite sass_facts.json

Static kernel facts come from the committed SASS table (``nvgemm/heuristics/perfmodel/sass_facts.json``)
unless ``--sass`` compiles the config now (cutlass-dsl, no GPU). A GPU measurement overrides
every number printed here.
"""

from __future__ import annotations

import argparse
import json
import sys

from nvgemm.cli import int_list, int_pair
from nvgemm.cli.sass_tool import regenerate_table
from nvgemm.core.problem import GemmProblem, Target
from nvgemm.heuristics import candidates
from nvgemm.heuristics.perfmodel import bf16_baseline, estimate, estimate_with, get_hardware, why_not
from nvgemm.heuristics.perfmodel.facts import family_for, registered_families
from nvgemm.heuristics.perfmodel.hardware import DEFAULT_GPU_OF_ARCH
from nvgemm.heuristics.perfmodel.model import best as model_best
from nvgemm.heuristics.perfmodel.table import parse_config_name

_MODEL_NOTE = "MODEL (not a measurement; a GPU measurement overrides it)"


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "model",
        help="modelled time of kernel configs on decode shapes (CPU performance model)",
        description="Modelled per-call time of nvgemm kernel configs for GEMM shapes: SASS facts (main-loop "
        "instructions per weight element, registers, spills, occupancy, bytes in flight, serial DRAM round "
        "trips) and max(byte floor, issue floor, tensor floor, latency chain) + launch costs, with the bf16 "
        "cuBLAS baseline. A model: a GPU measurement overrides it.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--config", action="append", metavar="NAME", help="kernel config name (repeatable)")
    what.add_argument("--policy", action="store_true", help="the candidate policy's configs for each shape and M")
    what.add_argument("--best", metavar="FAMILIES",
                      help="the model's best config over these families' search spaces (comma-separated, e.g. "
                      "sm90.mma,sm90.wgmma or sm100.nvfp4)")
    what.add_argument("--regen-table", action="store_true",
                      help="recompile every tabulated config and rewrite the SASS facts table (minutes)")
    p.add_argument("--shape", action="append", type=int_pair, metavar="N,K", help="GEMM shape (repeatable)")
    p.add_argument("--m", type=int_list, default=[1], help="token counts (default 1)")
    p.add_argument("--gpu", default=None, help="H200, H100, B200, GB200, B300 (default: H200 for sm90 configs, "
                   "B200 for sm100)")
    p.add_argument("--sass", action="store_true", help="compile the config(s) now and read the SASS instead of the table")
    p.add_argument("--arch", action="append", choices=("sm_90a", "sm_100a"),
                   help="with --regen-table: only these archs (default both)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)
    return p


def _gpu_for(config, gpu: str | None) -> str:
    if gpu:
        return gpu
    fam = family_for(config)
    return DEFAULT_GPU_OF_ARCH.get(fam.arch if fam else "sm_90a", "H200")


def _policy_configs(n: int, k: int, m: int, gpu: str) -> list:
    target = Target.from_gpu(gpu)
    a_format = "bf16" if target.family == "sm90" else "nvfp4"
    return [c.config for c in candidates(GemmProblem(n=n, k=k, m=m, a_format=a_format, target=target), use_nvmmh=False)]


def _r(t, d: int = 1) -> str:
    return f"{t[0]:.{d}f}-{t[1]:.{d}f}"


def format_estimate(e, base=None) -> list[str]:
    """Human-readable report lines of one :class:`~nvgemm.heuristics.perfmodel.model.Estimate`."""
    f, g, o = e.facts, e.geometry, e.occupancy
    lines = [f"{e.config}  M={e.m} N={e.n} K={e.k} on {e.gpu}   [{_MODEL_NOTE}]",
             f"  static facts: {f.source}; {f.regs} regs, {f.smem_bytes} B smem/CTA, local {f.local_bytes} B, "
             f"LDL/STL {f.ldl}/{f.stl} (in the main loop {f.ldl_loop}/{f.stl_loop})"]
    if e.family.startswith("sm100"):
        x = f.extra
        lines.append(f"  pipeline: {x.get('stages', '?')} stages x {x.get('stage_bytes', 0) / 1024:.1f} KB, "
                     f"TMEM {x.get('tmem_cols', '?')} cols, split-K reduce "
                     f"{'rolled' if x.get('rolled_reduce') else 'batched/none'}; {g.note}")
    else:
        ipe = f"{f.instr_per_elem:.2f}" if f.elems_per_thread_iter else "-"
        lines.append(f"  main loop: {f.loop_instrs} SASS instr/iteration = {ipe} per weight element, issue "
                     f"{f.loop_issue_cycles} cycles, {f.round_trips:.2f} serial DRAM round trips/iteration; "
                     f"{f.pass_instrs} per-pass + {f.fixed_instrs} fixed instr")
    lines.append(f"  occupancy {o.ctas_per_sm} CTAs/SM ({o.warps_per_sm} warps, limited by {o.limiter}); grid "
                 f"{g.ctas} CTAs, {g.iters_per_cta} main-loop iterations in the busiest CTA; {e.rounds} round(s) on "
                 f"{e.active_sms} SMs holding CTAs; fill {_r(e.fill_us, 2)} us, last tail {_r(e.tail_us, 2)} us")
    tf = f"{e.tensor_floor_us:.1f}" if e.tensor_floor_us else "-"
    isf = f"{e.issue_floor_us:.1f}" if e.issue_floor_us else "-"
    lines.append(f"  byte floor {e.byte_floor_us:.1f} us | issue floor {isf} | tensor floor {tf} | busiest SM alone "
                 f"{_r(e.chain_us)} -> kernel {_r(e.kernel_us)} us (first round limited by "
                 f"{e.limiter[0]}/{e.limiter[1]})")
    lines.append(f"  + launches {_r(e.launch_us)} + split-K reduce {_r(e.splitk_us)} + host helper kernels "
                 f"{_r(e.aux_us)} = {_r(e.total_us)} us per call")
    lines.append(f"  weight stream {e.weight_tbs[1]:.2f}-{e.weight_tbs[0]:.2f} TB/s = "
                 f"{e.pct_of_achievable[1]:.0f}-{e.pct_of_achievable[0]:.0f}% of achievable, "
                 f"{e.pct_of_peak[1]:.0f}-{e.pct_of_peak[0]:.0f}% of peak")
    avg = sorted(e.inflight_avg_per_sm)
    lines.append(f"  weight bytes in flight per SM: peak {e.inflight_peak_per_sm / 1024:.1f} KB, time-averaged "
                 f"{avg[0] / 1024:.1f}-{avg[1] / 1024:.1f} KB, Little's law needs "
                 f"{e.inflight_needed_per_sm[0] / 1024:.1f}-{e.inflight_needed_per_sm[1] / 1024:.1f} KB")
    if base is not None:
        # the same end of every hardware range on both sides (one efficiency assumption per ratio)
        r = sorted(base.total_us[i] / e.total_us[i] for i in range(2))
        lines.append(f"  bf16 cuBLAS (model) {_r(base.total_us)} us -> nvgemm is {r[0]:.2f}-{r[1]:.2f}x bf16 speed "
                     "(each end of the ranges on both sides)")
    for note in e.notes:
        lines.append(f"  note: {note}")
    if f.source == "sass":
        lines[1] = lines[1].replace("static facts: sass", "static facts: compiled now (SASS)")
    return lines


def run(args) -> int:
    if args.regen_table:
        archs = tuple(args.arch or ("sm_90a", "sm_100a"))
        table = regenerate_table(archs=archs, log=lambda s: print(s, flush=True))
        n = sum(len(v) for v in table["entries"].values())
        print(f"nvgemm model: wrote {n} entries ({', '.join(archs)}); header {table['header']}")
        return 0
    if not args.shape:
        print("nvgemm model: give at least one --shape N,K", file=sys.stderr)
        return 2
    try:
        configs = [parse_config_name(c) for c in args.config] if args.config else []
    except ValueError as e:
        print(f"nvgemm model: {e}", file=sys.stderr)
        return 2
    if args.best is not None:
        known = sorted(f.name for f in registered_families())
        names = [f.strip() for f in args.best.split(",") if f.strip()]
        unknown = [f for f in names if f not in known] if names else [args.best]
        if unknown:
            print(f"nvgemm model: --best {', '.join(map(repr, unknown))}: not a known family; "
                  f"use one or more of {', '.join(known)}", file=sys.stderr)
            return 2
        args.best = ",".join(names)
    rows, text = [], []
    sass_facts = {}
    for n, k in args.shape:
        for m in args.m:
            if args.policy:
                gpu = args.gpu or "H200"
                try:
                    cfgs = _policy_configs(n, k, m, gpu)
                except ValueError as e:
                    print(f"nvgemm model: {e}", file=sys.stderr)
                    return 2
            elif args.best:
                gpu0 = args.gpu or ("B200" if "sm100" in args.best else "H200")
                hit = model_best(tuple(args.best.split(",")), m, n, k, gpu0)
                cfgs = [hit[0]] if hit else []
                if not hit:
                    text.append(f"M={m} N={n} K={k}: no modelled config in {args.best}")
            else:
                cfgs = configs
            for cfg in cfgs:
                gpu = _gpu_for(cfg, args.gpu)
                try:
                    hw = get_hardware(gpu)
                except KeyError as e:
                    print(f"nvgemm model: {e.args[0]}", file=sys.stderr)
                    return 2
                why = why_not(cfg, m, n, k)
                if why:
                    text.append(f"{cfg.name()}  M={m} N={n} K={k}: no estimate: {why}")
                    continue
                if args.sass:
                    # lazy: looked up at call time (tests patch sass_tool.derive_facts)
                    from nvgemm.cli.sass_tool import derive_facts

                    if cfg not in sass_facts:
                        sass_facts[cfg] = derive_facts(cfg)[0]
                    e = estimate_with(cfg, m, n, k, hw, sass_facts[cfg], family_for(cfg))
                else:
                    e = estimate(cfg, m, n, k, gpu)
                if e is None:
                    text.append(f"{cfg.name()}  M={m} N={n} K={k}: no static facts (run with --sass)")
                    continue
                base = bf16_baseline(m, n, k, gpu)
                rows.append({**e.as_dict(), "bf16_us": base.total_us})
                text.extend(format_estimate(e, base))
                text.append("")
    if args.json:
        print(json.dumps({"note": _MODEL_NOTE, "rows": rows}, indent=1))
    else:
        print("\n".join(text).rstrip())
    return 0
