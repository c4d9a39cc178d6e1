"""``nvgemm plan``: print the candidate policy's answer per layer GEMM and token count.

Examples::

    nvgemm plan --model Llama-3.1-8B --gpu B200 --m 1,8,32,128
    nvgemm plan --shape 6144,4096 --shape 4096,14336 --gpu GB200 --m 1,64
    nvgemm plan --model Qwen3-32B --gpu B200 --m-range 1,256      # dynamic-batch buckets
    nvgemm plan --model Mistral-7B --gpu H100 --m 1,16            # W4A16 on Hopper
    nvgemm plan --model Llama-3.1-8B --m 8 --json
    nvgemm plan --model Qwen3-30B-A3B --gpu B200 --m 1,8,32,128   # MoE: routing table + per-expert GEMMs

MoE presets (DeepSeek-V3, Qwen3-30B-A3B, Qwen3-235B-A22B, Llama-4-Scout, Mixtral-8x7B) add a routing
table: expected active experts A(M) and tokens per active expert M*k/A(M) under uniform routing, the
NVFP4 bytes of the active (and shared) experts and their time at the GPU's achievable bandwidth (a
labelled model, not a measurement). The expert GEMM rows are planned at M = ceil(tokens per active expert).
On an sm90 target (``--gpu H200|H100``) the grouped W4A16 MoE kernels' ranked (GEMM1, GEMM2) candidates per
M follow (``nvgemm.templates.sm90_moe.policy``; ``--tp N`` divides the expert and shared intermediate sizes), on
an sm100 target (W4A4) those of the grouped swap-AB tcgen05 kernels (``nvgemm.templates.sm100_moe.policy``), on
sm_120a / sm_121a (W4A4: RTX5090, RTX5080, RTXPRO6000, GB10) those of the grouped sm120 kernels
(``nvgemm.templates.sm120_moe.policy``):

    nvgemm plan --model DeepSeek-V3 --tp 8 --gpu H200 --m 1,8,32
    nvgemm plan --model DeepSeek-V3 --tp 8 --gpu B200 --m 1,8,32
"""

from __future__ import annotations

import argparse
import json
import sys
from nvgemm.cli import int_list, int_pair
from nvgemm.core.family import families
from nvgemm.core.problem import GemmProblem, Target
from nvgemm.heuristics import nvmmh
from nvgemm.heuristics.perfmodel import estimate_us
from nvgemm.heuristics.perfmodel.hardware import DEFAULT_GPU_OF_ARCH, GPUS
from nvgemm.heuristics.policy import bucket_candidates, candidates, problem_status
from nvgemm.heuristics.presets import get_moe_preset, get_preset
from nvgemm.templates.sm100_moe.policy import format_plan as format_plan_sm100
from nvgemm.templates.sm120_moe.policy import format_plan as format_plan_sm120
from nvgemm.templates.sm90_moe.policy import format_plan, shape_from_preset




def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "plan",
        help="show the kernel candidates nvgemm would autotune for a model's GEMMs",
        description="Per layer GEMM and token count M, print the ranked candidate configs, why each was "
        "included, and its times, each labelled with its source: nvgemm's CPU performance model (a range, "
        "'model'; not a measurement) and nvMatmulHeuristics' runtime estimate where it has one ('nvMMH').",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model preset (Llama-3.1-8B, Llama-3.3-70B, Qwen3-32B, Mistral-7B, DeepSeek-V3-dense; "
                     "MoE: DeepSeek-V3, Qwen3-30B-A3B, Qwen3-235B-A22B, Llama-4-Scout, Mixtral-8x7B)")
    src.add_argument("--shape", action="append", type=int_pair, metavar="N,K", help="ad-hoc GEMM shape (repeatable)")
    p.add_argument("--gpu", default="B200", help="named GPU: B200, GB200, B300, H100, H200, RTX5090, RTX5080, RTXPRO6000, GB10 (DGX Spark), L40S, "
                   "RTX4090, A10, RTX3090, A100 (default B200)")
    p.add_argument("--sm-count", type=int, default=None, help="override the GPU's SM count")
    p.add_argument("--from-device", action="store_true", help="read arch and SM count from the live CUDA device")
    mm = p.add_mutually_exclusive_group()
    mm.add_argument("--m", type=int_list, default=[1, 8, 32, 128], help="token counts (default 1,8,32,128)")
    mm.add_argument("--m-range", type=int_pair, metavar="LO,HI", help="dynamic batch: candidates per M bucket of LO..HI")
    p.add_argument("--format", choices=("auto", "w4a4", "w4a16"), default="auto",
                   help="w4a4 = nvfp4 x nvfp4, w4a16 = bf16 x nvfp4 (auto: w4a4 where a W4A4 kernel family serves the "
                        "GPU's arch, else w4a16)")
    p.add_argument("--out-dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--max-candidates", type=int, default=8)
    p.add_argument("--tp", type=int, default=1, help="MoE presets: tensor-parallel ranks (divides the expert and "
                   "shared intermediate sizes; sm90 / sm100 grouped candidates)")
    p.add_argument("--no-nvmmh", action="store_true", help="decode rules only (skip nvMatmulHeuristics)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)
    return p


def _problems(args):
    target = Target.from_device() if args.from_device else Target.from_gpu(args.gpu, args.sm_count)
    fmt = args.format
    if fmt == "auto":  # W4A4 where a registered W4A4 family serves the arch (Blackwell), else W4A16
        fmt = "w4a4" if any(f.gemm_kind == "w4a4" and target.arch in f.archs for f in families()) else "w4a16"
    a_format = "nvfp4" if fmt == "w4a4" else "bf16"
    moe = get_moe_preset(args.model) if args.model else None
    if moe is not None:
        layers = [(lg.name, lg.n, lg.k) for lg in (*moe.dense_gemms(), *moe.expert_gemms())]
        title = f"{moe.name} MoE layer ({moe.source})"
    elif args.model:
        preset = get_preset(args.model)
        layers = [(lg.name, lg.n, lg.k) for lg in preset.layers]
        title = f"{preset.name} ({preset.source})"
    else:
        layers = [(f"shape{i}", n, k) for i, (n, k) in enumerate(args.shape)]
        title = "ad-hoc shapes"
    base = [
        (name, GemmProblem(n=n, k=k, m=1, a_format=a_format, out_dtype=args.out_dtype, target=target))
        for name, n, k in layers
    ]
    return title, target, fmt, base, moe


def _routing_rows(moe, ms, gpu) -> list[dict]:
    """Per M: uniform-routing statistics and the modelled weight-streaming floor of the MoE layer."""
    import math

    bw = GPUS[gpu].achievable_bw if gpu in GPUS else None
    rows = []
    for m in ms:
        a = moe.active_experts(m)
        tpe = moe.tokens_per_active_expert(m)
        nbytes = a * moe.expert_bytes() + moe.shared_bytes()
        rows.append({"m": m, "active_experts": round(a, 2), "tokens_per_active_expert": round(tpe, 3),
                     "expert_gemm_m": math.ceil(tpe - 1e-9), "weight_mb": round(nbytes / 1e6, 2),
                     "model_floor_us": None if bw is None else round(nbytes / bw * 1e6, 2)})
    return rows


def _model_gpu(target) -> str | None:
    """The performance model's hardware description for a plan target (None: none)."""
    if target.gpu and target.gpu.upper() in GPUS:
        return target.gpu.upper()
    return DEFAULT_GPU_OF_ARCH.get(target.arch)


def _model_us(config, pm, gpu, sm_count):
    """(low, high) modelled microseconds of ``config`` on ``pm`` (its largest M), or None."""
    if gpu is None:
        return None
    r = estimate_us(config, pm.m_hi, pm.n, pm.k, gpu, sm_count, getattr(pm, "epilogue", None))
    return [round(r[0], 2), round(r[1], 2)] if r is not None else None


def _time_column(c) -> str:
    """The model's range, labelled "(model)", and nvMatmulHeuristics' estimate, labelled
    "(nvMMH)", each only where that source gave a number (``est_runtime_us`` is the library's
    field; the policies never put a model time there)."""
    parts = []
    if c.get("model_us") is not None:
        lo, hi = c["model_us"]
        parts.append(f"{f'{lo:.1f}-{hi:.1f}':>11s} us (model)")
    else:
        parts.append(f"{'-':>11s} us        ")
    if c["est_runtime_us"] is not None:
        parts.append(f"{c['est_runtime_us']:8.2f} us (nvMMH)")
    return "  ".join(parts)


def run(args) -> int:
    try:
        title, target, fmt, base, moe = _problems(args)
    except (KeyError, ValueError, RuntimeError) as e:
        print(f"nvgemm plan: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    if args.max_candidates < 1:
        print("nvgemm plan: --max-candidates must be >= 1", file=sys.stderr)
        return 2
    if args.m_range and args.m_range[0] > args.m_range[1]:
        print(f"nvgemm plan: --m-range LO,HI needs LO <= HI, got {args.m_range[0]},{args.m_range[1]}", file=sys.stderr)
        return 2
    if target.sm_count < 1:
        print(f"nvgemm plan: --sm-count must be >= 1, got {target.sm_count}", file=sys.stderr)
        return 2
    use_nvmmh = not args.no_nvmmh
    model_gpu = _model_gpu(target)
    rows = []
    routing = None
    if moe is not None:
        routing = _routing_rows(moe, list(args.m_range) if args.m_range else args.m, model_gpu)
    for layer, prob in base:
        if moe is not None and layer.startswith("expert."):  # each expert GEMM sees its routed tokens only
            items = []
            for r in routing:
                pm = prob.with_m(r["expert_gemm_m"])
                items.append((f"{r['m']} ({r['expert_gemm_m']}/expert)", pm,
                              candidates(pm, args.max_candidates, use_nvmmh=use_nvmmh) if problem_status(pm) else []))
        elif args.m_range:
            per = bucket_candidates(prob.with_m_range(*args.m_range), args.max_candidates, use_nvmmh=use_nvmmh)
            items = [(f"{lo}..{hi}", prob.with_m_range(lo, hi), cands) for (lo, hi), cands in per]
            if not items:
                items = [(f"{args.m_range[0]}..{args.m_range[1]}", prob.with_m_range(*args.m_range), [])]
        else:
            items = []
            for m in args.m:
                pm = prob.with_m(m)
                items.append((str(m), pm, candidates(pm, args.max_candidates, use_nvmmh=use_nvmmh)
                              if problem_status(pm) else []))
        for mlabel, pm, cands in items:
            st = problem_status(pm)
            rows.append(
                {
                    "layer": layer,
                    "m": mlabel,
                    "n": pm.n,
                    "k": pm.k,
                    "status": "ok" if st else st.reason,
                    "candidates": [
                        {"rank": i + 1, "config": c.name, "est_runtime_us": c.est_runtime_us,
                         "model_us": _model_us(c.config, pm, model_gpu, target.sm_count), "reason": c.reason}
                        for i, c in enumerate(cands)
                    ],
                }
            )
    lib = "on" if use_nvmmh and nvmmh.available() else f"off ({nvmmh.unavailable_reason() or 'disabled by --no-nvmmh'})"
    if args.json:
        print(json.dumps({"title": title, "target": target.__dict__, "format": fmt, "nvmmh": lib,
                          "model_gpu": model_gpu, "model_note": "model_us: CPU performance model, not a measurement; "
                          "est_runtime_us: nvMatmulHeuristics' estimate (null without it)",
                          "moe_routing": routing, "rows": rows}, indent=1))
        return 0
    print(f"nvgemm plan: {title}")
    print(f"target {target.gpu or '?'} {target.arch} {target.sm_count} SMs, {fmt}, out {args.out_dtype}, "
          f"nvMatmulHeuristics {lib}, cap {args.max_candidates}")
    print(f"time: nvgemm's CPU performance model on {model_gpu or 'no modelled GPU'} (model: a low-high range "
          f"per call, not a measurement)" + ("; nvMatmulHeuristics' own estimate where it has one (nvMMH)"
                                             if use_nvmmh else ""))
    if routing is not None:
        print(f"\nrouting ({moe.num_experts} experts, top-{moe.top_k}, uniform): weight MB = active experts"
              f"{' + shared' if moe.shared_intermediate else ''} (NVFP4); floor = MB / achievable bandwidth of "
              f"{model_gpu or '?'} (model, not a measurement)")
        print(f"  {'M':>5} {'active':>8} {'tokens/active expert':>21} {'weight MB':>10} {'floor us':>9}")
        for r in routing:
            fl = "-" if r["model_floor_us"] is None else f"{r['model_floor_us']:.1f}"
            print(f"  {r['m']:>5} {r['active_experts']:>8.1f} {r['tokens_per_active_expert']:>21.2f} "
                  f"{r['weight_mb']:>10.1f} {fl:>9}")
    for r in rows:
        print(f"\n[{r['layer']}] M={r['m']} N={r['n']} K={r['k']}")
        if r["status"] != "ok":
            print(f"  no candidates: {r['status']}")
            continue
        for c in r["candidates"]:
            print(f"  {c['rank']:2d}. {c['config']:<62s} {_time_column(c)}  {c['reason']}")
    if moe is not None and target.family == "sm90":
        print()
        print(format_plan(shape_from_preset(moe, args.tp), list(args.m_range) if args.m_range else args.m,
                          model_gpu or "H200", args.max_candidates))
    elif moe is not None and target.family == "sm100" and fmt == "w4a4":
        print()
        print(format_plan_sm100(shape_from_preset(moe, args.tp), list(args.m_range) if args.m_range else args.m,
                                model_gpu or "B200", args.max_candidates))
    elif moe is not None and target.arch in ("sm_120a", "sm_121a") and fmt == "w4a4":
        print()
        print(format_plan_sm120(shape_from_preset(moe, args.tp), list(args.m_range) if args.m_range else args.m,
                                model_gpu or DEFAULT_GPU_OF_ARCH[target.arch], args.max_candidates))
    return 0
