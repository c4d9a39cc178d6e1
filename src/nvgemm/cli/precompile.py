"""``nvgemm precompile``: build every kernel the policy would try, ahead of time, into the kernel cache.

Examples::

    nvgemm precompile --model Llama-3.1-8B --arch sm_100a,sm_90a
    nvgemm precompile --checkpoint ./Llama-3.1-8B-NVFP4 --arch sm_100a --m-buckets 8,16,32,64,128,256
    nvgemm precompile --model Qwen3-32B --arch sm_100a --jobs 4 --cache-dir /srv/kernels_cache
    nvgemm precompile --selftest --arch sm_90a,sm_100a      # toolchain check with a tiny kernel
    nvgemm precompile --model Mistral-7B --dry-run           # list the kernels, compile nothing
    nvgemm precompile --checkpoint ./Llama-NVFP4 --vllm --tp 2 --arch sm_100a --max-m 8192
    nvgemm precompile --checkpoint ./Llama-NVFP4 --sglang --tp 2 --arch sm_100a --max-m 8192
    nvgemm precompile --model Qwen3-30B-A3B --arch sm_100a,sm_90a,sm_120a --dry-run   # MoE: grouped kernels too

With ``--vllm`` (needs ``--checkpoint``) the list is exactly what ``vllm serve`` with nvgemm's plugin
runs: vLLM's fused q/k/v and gate/up layers, per-rank shapes for ``--tp``, each layer's epilogue
(scalar or per-column alpha, bias), and for every token count 1..``--max-m`` (set it to vLLM's
``--max-num-batched-tokens``) the one kernel the runtime dispatch picks (no autotuning candidates).
``--sglang`` is the same for SGLang with nvgemm's plugin, which builds the same fused layers and per-rank
shapes: set ``--max-m`` to SGLang's ``--chunked-prefill-size``; every CUDA-graph size SGLang captures (decode
batch sizes, prefill token buckets) is at most that, so the set covers the plugin's warm-up.

For each arch, layer GEMM (N, K) and M bucket, the candidate policy (``nvgemm.heuristics``) names
up to ``--max-candidates`` configs; each becomes a :class:`~nvgemm.aot.abi.CompileSpec`
(duplicates across layers/buckets collapse: shapes are dynamic, not part of the key). Specs already
in the cache are skipped; the rest compile in ``--jobs`` worker processes. No GPU is needed: the
arch is explicit and SM counts come from ``--gpu`` (default: B200 for sm_100a, H100 for sm_90a; for
sm_120a / sm_121a, which have no named GPU, the arch's default: RTX 5090's 170 / GB10's 48 SMs).

MoE models -- a MoE preset (``nvgemm.heuristics.presets.MOE_PRESETS``), or a checkpoint whose headers hold
routed experts (:func:`nvgemm.core.experts_layout.find_experts`; experts per token from ``config.json``'s
``num_experts_per_tok``) -- also get the grouped MoE kernels of the arch's family: ``sm100_moe`` (sm_100a,
sm_100f: the runtime loads sm_100a builds), ``sm90_moe`` (sm_90a, W4A16) and ``sm120_moe`` (sm_120a,
sm_121a); an arch or format without one (sm_103a; W4A4 experts on sm_90a) is reported with the backend that
serves the experts. Per M bucket, the family policy's first ``--max-candidates`` (GEMM1, GEMM2) pairs at the
bucket's upper M, each in the variants its launcher runs for the bucket's token counts (``call_kernels``:
GEMM2 running the top-k finalize for calls of at most 2 tokens, sm90's one-token direct kernels); with
``--vllm`` / ``--sglang`` exactly the pair the MoE dispatch picks for every token count, per rank (``I / tp``;
with ``--expert-parallel`` whole experts spread over the ``--tp`` ranks). The MoE path's Triton prep and
finalize kernels are JIT-compiled by Triton at first use; precompile does not build them. ``--dry-run`` lists
the grouped kernels with their family, GEMM and M bucket; the summary and ``--json`` (``moe_kernels``) count
them per family.

Exit status: 0 when every kernel is compiled or cached, 3 when some failed (listed with reasons),
2 on bad arguments, including a request that names no arch or whose every GEMM has no kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from nvgemm import settings
from nvgemm.cli import int_list, int_pair
from nvgemm.aot.abi import CompileSpec, DEFAULT_HW, HardwareSpec, template_id_for_config
from nvgemm.aot.cache import CacheResult, KernelCache, default_cache_dir
from nvgemm.aot.compile_spec import capture_codegen_env
from nvgemm.aot.selftest import SELFTEST_TEMPLATE_ID, SelftestConfig
from nvgemm.core.backend import MoeProblem
from nvgemm.core.experts_layout import expert_tensors, find_experts
from nvgemm.core.family import family_of_config
from nvgemm.core.files import checkpoint_tensors
from nvgemm.dispatch.registry import LinearProblem
from nvgemm.dispatch.serving_plan import (MOE_KERNEL_BACKENDS, checkpoint_top_k, moe_candidate_specs, moe_plan, plan,
                                          served_moe_layers, vllm_gemms)
from nvgemm.core.epilogue import EpilogueSpec
from nvgemm.heuristics import GemmProblem, Target, candidates, m_buckets, problem_status
from nvgemm.templates.sm90_moe.policy import one_token_apart
from nvgemm.heuristics.presets import get_moe_preset, get_preset

ARCH_DEFAULT_GPU = {"sm_100a": "B200", "sm_100f": "B200", "sm_103a": "B300", "sm_90a": "H100"}




def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "precompile",
        help="compile every kernel candidate for a model ahead of time (no GPU needed)",
        description="Compile, export and link every kernel the candidate policy would try for a model's "
        "GEMMs -- dense layers and, for MoE models, the routed experts' grouped MoE kernels (sm100_moe / "
        "sm90_moe / sm120_moe; their Triton prep / finalize kernels are JIT, not built here) -- into the kernel "
        "cache, so serving never compiles. Re-running on a full cache compiles nothing.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model preset (see `nvgemm plan --help`); a MoE preset adds its grouped MoE "
                     "kernels")
    src.add_argument("--checkpoint", type=Path, help="NVFP4 checkpoint directory (safetensors); shapes are read "
                     "from the tensor headers only (routed experts: grouped MoE kernels, top-k from config.json)")
    src.add_argument("--shape", action="append", type=int_pair, metavar="N,K", help="ad-hoc GEMM shape (repeatable)")
    src.add_argument("--selftest", action="store_true", help="build the tiny AOT selftest kernel (toolchain check)")
    p.add_argument("--arch", default="sm_100a,sm_90a",
                   help="comma-separated target arches: sm_100a, sm_100f, sm_103a, sm_90a, sm_120a, sm_121a (default sm_100a,sm_90a)")
    p.add_argument("--gpu", default=None, help="named GPU for SM counts (default per arch: B200 / B300 / H100)")
    p.add_argument("--sm-count", type=int, default=None, help="override the SM count")
    p.add_argument("--m-buckets", type=int_list, default=None, metavar="B1,B2,...",
                   help="upper bounds of the M buckets (default: the policy's buckets up to --max-m)")
    p.add_argument("--max-m", type=int, default=256, help="largest token count to serve (default 256)")
    p.add_argument("--out-dtype", choices=("bf16", "fp16"), default="bf16",
                   help="output (with --vllm also activation) dtype (default bf16)")
    p.add_argument("--vllm", action="store_true",
                   help="with --checkpoint: exactly the kernels `vllm serve` with nvgemm's plugin runs (see above)")
    p.add_argument("--sglang", action="store_true",
                   help="with --checkpoint: exactly the kernels SGLang with nvgemm's plugin runs (see above)")
    p.add_argument("--tp", type=int, default=1,
                   help="with --vllm / --sglang: the engine's tensor-parallel size (default 1)")
    p.add_argument("--expert-parallel", action="store_true",
                   help="with --vllm / --sglang: the routed experts are spread over the --tp ranks (vLLM "
                        "--enable-expert-parallel, SGLang --ep-size = --tp) instead of split tensor-parallel")
    p.add_argument("--max-candidates", type=int, default=8)
    p.add_argument("--no-nvmmh", action="store_true", help="decode rules only (skip nvMatmulHeuristics)")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: min(4, CPUs))")
    p.add_argument("--cache-dir", type=Path, default=None, help="cache root (default NVGEMM_CACHE_DIR or kernels_cache/)")
    p.add_argument("--template-module", action="append", default=[],
                   help="extra module that registers kernel templates (imported in every worker)")
    p.add_argument("--dry-run", action="store_true", help="list the kernels and whether they are cached; compile nothing")
    p.add_argument("--json", type=Path, default=None,
                   help="also write the summary (with --dry-run: the kernel list) as JSON to this file")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


# ---- which kernels -------------------------------------------------------------------------


def checkpoint_shapes(ckpt: Path) -> list[tuple[str, int, int]]:
    """(name, N, K) of the NVFP4 linears in a safetensors checkpoint, from the headers only.

    A linear is NVFP4 when its ``.weight`` is uint8 [N, K/2] with a sibling ``.weight_scale``; routed experts
    (:func:`nvgemm.core.experts_layout.find_experts`) are not linears. Identical (N, K) shapes are reported
    once, named after the first layer that has them. An experts-only checkpoint has none.
    """
    tensors = checkpoint_tensors(ckpt)  # regular files only: a FIFO would hang
    layouts = find_experts(tensors)
    experts = expert_tensors(layouts)
    seen: dict[tuple[int, int], str] = {}
    for name in sorted(tensors):
        if not name.endswith(".weight") or experts(name):
            continue
        t = tensors[name]
        base = name[: -len(".weight")]
        if t.get("dtype") != "U8" or len(t.get("shape", ())) != 2 or f"{base}.weight_scale" not in tensors:
            continue
        nk = (int(t["shape"][0]), int(t["shape"][1]) * 2)
        short = ".".join(p for p in base.split(".") if not p.isdigit() and p not in ("model", "layers"))
        seen.setdefault(nk, short)
    if not seen and not layouts:
        raise ValueError(f"no NVFP4 linear weights (uint8 .weight + .weight_scale) found in {ckpt}")
    return [(name, n, k) for (n, k), name in seen.items()]


def _short(prefix: str) -> str:
    return ".".join(p for p in prefix.split(".") if not p.isdigit() and p not in ("model", "layers"))


def moe_layers(args) -> list[tuple]:
    """The routed-experts layers of ``--model`` (a MoE preset) or ``--checkpoint`` (headers + config.json's
    ``num_experts_per_tok``) as ``(name, experts, top_k, hidden, intermediate, gated, weight_only)``, identical
    ones once (``weight_only`` None for a preset: the arch's own format); [] for dense models and ``--shape``."""
    out: dict = {}
    if args.model:
        moe = get_moe_preset(args.model)
        if moe is not None:
            out[(moe.num_experts, moe.top_k, moe.hidden, moe.expert_intermediate, True, None)] = "experts"
    elif args.checkpoint:
        layouts = find_experts(checkpoint_tensors(args.checkpoint))
        top_k = checkpoint_top_k(args.checkpoint) if layouts else 0
        for lay in layouts:
            out.setdefault((lay.num_experts, top_k, lay.hidden, lay.intermediate, lay.gated, lay.weight_only),
                           _short(lay.prefix))
    return [(name, *key) for key, name in out.items()]


def _layers(args) -> tuple[str, list[tuple[str, int, int]]]:
    if args.model:
        moe = get_moe_preset(args.model)
        if moe is not None:  # the layer's attention and shared-expert GEMMs; the routed experts: moe_layers()
            return moe.name, [(lg.name, lg.n, lg.k) for lg in moe.dense_gemms()]
        preset = get_preset(args.model)
        return preset.name, [(lg.name, lg.n, lg.k) for lg in preset.layers]
    if args.checkpoint:
        return str(args.checkpoint), checkpoint_shapes(args.checkpoint)
    return "ad-hoc shapes", [(f"shape{i}", n, k) for i, (n, k) in enumerate(args.shape)]


def _buckets(args) -> list[tuple[int, int]]:
    if not args.m_buckets:
        return m_buckets(args.max_m)
    out, lo = [], 1
    for hi in sorted(set(args.m_buckets)):
        out.append((lo, hi))
        lo = hi + 1
    return out


def plan_specs(args) -> tuple[str, list[tuple[str, object]], list[tuple[str, str]]]:
    """(title, [(label, CompileSpec)], [(label, reason) of problems without candidates])."""
    arches = [a.strip() for a in args.arch.split(",") if a.strip()]
    if not arches:
        raise ValueError(f"--arch {args.arch!r} names no arch; use one or more of {sorted(ARCH_CAPABILITY)}")
    env = capture_codegen_env()
    import torch

    epi = EpilogueSpec(alpha="scalar", out_dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[args.out_dtype])
    specs: dict[object, str] = {}
    skipped: list[tuple[str, str]] = []
    if args.selftest:
        for arch in arches:
            if arch not in DEFAULT_HW:
                raise ValueError(f"--arch {arch}: no selftest kernel for it; use one of {sorted(DEFAULT_HW)}")
            for threads in (128, 256):
                s = CompileSpec(SELFTEST_TEMPLATE_ID, SelftestConfig(threads=threads), EpilogueSpec(),
                                arch, DEFAULT_HW[arch], a_format="bf16", b_format="bf16", codegen_env=env)
                specs.setdefault(s, f"selftest t{threads} {arch}")
        return "selftest", list((lbl, s) for s, lbl in specs.items()), skipped
    if getattr(args, "vllm", False) or getattr(args, "sglang", False):
        return _vllm_specs(args, arches)
    if getattr(args, "expert_parallel", False):
        raise ValueError("--expert-parallel describes a serving engine's ranks: it needs --vllm or --sglang")
    title, layers = _layers(args)
    moes = moe_layers(args)
    buckets = _buckets(args)
    for arch in arches:
        check_arch_gpu(arch, args.gpu)
        gpu = args.gpu or ARCH_DEFAULT_GPU.get(arch)
        if gpu is None:  # an arch without a named GPU (sm_120a / sm_121a): its default SM count
            target = Target(arch, args.sm_count or DEFAULT_HW[arch].sm_count)
        else:
            target = Target.from_gpu(gpu, args.sm_count)
        if target.arch != arch:
            target = Target(arch, target.sm_count, target.gpu)
        a_format = "bf16" if target.family == "sm90" else "nvfp4"
        hw = HardwareSpec(sm_count=target.sm_count)
        for layer, n, k in layers:
            base = GemmProblem(n=n, k=k, m=1, a_format=a_format, out_dtype=args.out_dtype, target=target)
            for lo, hi in buckets:
                prob = base.with_m_range(lo, hi)
                label = f"{layer} N={n} K={k} M={lo}..{hi} {arch}"
                st = problem_status(prob)
                if not st:
                    skipped.append((label, st.reason))
                    continue
                for c in candidates(prob, args.max_candidates, use_nvmmh=not args.no_nvmmh):
                    s = CompileSpec(
                        template_id_for_config(c.config), c.config, epi, arch, hw,
                        a_format=a_format, b_format="nvfp4", codegen_env=env,
                    )
                    specs.setdefault(s, label)
        dtype = epi.out_dtype
        for name, e, top_k, h, i, gated, weight_only in moes:
            label = f"{name} E={e} top-{top_k} H={h} I={i} {arch}"
            if not gated:
                skipped.append((label, "non-gated experts: their activation is not in the checkpoint headers; "
                                       "no grouped kernel listed"))
                continue
            wo = target.family == "sm90" if weight_only is None else weight_only
            for lo, hi in one_token_apart(buckets):  # the MoE policies' buckets: one token on its own
                p = MoeProblem(m=hi, top_k=top_k, num_experts=e, num_global_experts=e, hidden=h, intermediate=i,
                               activation="silu_mul", weight_only=wo, alpha13="expert", x_dtype=dtype,
                               out_dtype=dtype, device_type="cuda", capability=ARCH_CAPABILITY[arch],
                               router_weight_on_input=False, expert_map=False, shared_out=False, residual=False)
                backend, found = moe_candidate_specs(p, range(lo, hi + 1), target.sm_count, args.max_candidates)
                if not found:
                    why = _NO_AOT.get(backend, "no grouped CuTeDSL kernel")
                    skipped.append((label, f"routed experts served by {backend}: {why}"))
                    break
                fam = _family(backend)
                for idx, g, spec in found:
                    specs.setdefault(spec, f"{fam} GEMM{g + 1} {label} M={lo}..{hi} #{idx + 1}")
    if not specs:  # every problem was refused: the request itself cannot be served
        if not skipped:
            raise ValueError(f"no kernel to build for {title} on {', '.join(arches)}")
        label, reason = skipped[0]
        more = f" (and {len(skipped) - 1} more problems)" if len(skipped) > 1 else ""
        raise ValueError(f"no kernel to build: no candidates for {label}: {reason}{more}")
    return title, list((lbl, s) for s, lbl in specs.items()), skipped


#: MoE backends without AOT kernels: what serves the experts instead
_NO_AOT = {"triton_moe": "JIT Triton kernels (compiled by Triton at first use, not by nvgemm precompile)",
           "emulated": "the emulated op (dequantize + torch matmul; no kernel to build)"}


def _family(backend: str) -> str:
    """The kernel family of a grouped MoE backend (``cutedsl_sm100_moe`` -> ``sm100_moe``)."""
    return backend.removeprefix("cutedsl_")


ARCH_CAPABILITY = {"sm_100a": (10, 0), "sm_100f": (10, 0), "sm_103a": (10, 3), "sm_90a": (9, 0), "sm_120a": (12, 0),
                   "sm_121a": (12, 1)}


def check_arch_gpu(arch: str, gpu: str | None) -> None:
    """ValueError unless ``arch`` is one nvgemm builds for and ``gpu`` (if named) is of its family."""
    if arch not in ARCH_CAPABILITY:
        raise ValueError(f"--arch {arch}: not an arch nvgemm builds kernels for; use one of {sorted(ARCH_CAPABILITY)}")
    if gpu is not None:
        t = Target.from_gpu(gpu)
        if t.family != Target(arch, 1).family:
            raise ValueError(f"--gpu {gpu} is a {t.arch} GPU but --arch {arch} targets another family; name a "
                             f"GPU of that family or build one arch per run")


def _vllm_specs(args, arches):
    """The kernels nvgemm's vLLM or SGLang plugin dispatches for a checkpoint (``--vllm`` / ``--sglang``:
    both engines build the same fused layers and tensor-parallel shapes)."""
    import torch

    engine = "SGLang" if getattr(args, "sglang", False) else "vLLM"
    if getattr(args, "sglang", False) and getattr(args, "vllm", False):
        raise ValueError("--vllm and --sglang: name one engine")
    if not args.checkpoint:
        raise ValueError(f"--{engine.lower()} needs --checkpoint")
    if args.tp < 1:
        raise ValueError("--tp must be >= 1")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.out_dtype]
    gemms = vllm_gemms(args.checkpoint, args.tp)
    ep = getattr(args, "expert_parallel", False)
    moes = served_moe_layers(args.checkpoint, args.tp, ep, engine.lower())
    specs: dict[object, str] = {}
    skipped: list[tuple[str, str]] = []
    for arch in arches:
        check_arch_gpu(arch, args.gpu)
        gpu = args.gpu or ARCH_DEFAULT_GPU.get(arch)
        sm_count = args.sm_count or (Target.from_gpu(gpu).sm_count if gpu else DEFAULT_HW[arch].sm_count)
        for g in dict.fromkeys(gemms):
            label = f"{g.layer} N={g.n} K={g.k} tp={args.tp} {arch}"
            backends_used = set()
            for m in range(1, args.max_m + 1):
                p = LinearProblem(m=m, n=g.n, k=g.k, device_type="cuda", capability=ARCH_CAPABILITY[arch],
                                  weight_only=g.weight_only, x_dtype=dtype, out_dtype=dtype, alpha=g.alpha,
                                  bias=g.bias, activation="none", residual=False)
                choice = plan(p, sm_count)
                backends_used.add(choice.backend)
                if choice.spec is not None:
                    specs.setdefault(choice.spec, f"{label} M={m}")
            if backends_used <= {"emulated", "triton_w4a16"}:
                skipped.append((label, f"served by {', '.join(sorted(backends_used))} (no CuTeDSL kernel to build)"))
        for mo in moes:
            label = f"{_short(mo.layer)} E={mo.num_experts}/{mo.num_global_experts} top-{mo.top_k} H={mo.hidden} " \
                    f"I={mo.intermediate} tp={args.tp}{' ep' if ep else ''} {arch}"
            if not mo.gated:
                skipped.append((label, "non-gated experts: their activation is not in the checkpoint headers; "
                                       "no grouped kernel listed"))
                continue
            backends_used = set()
            for m in range(1, args.max_m + 1):
                choice = moe_plan(mo.problem(m, ARCH_CAPABILITY[arch], dtype), sm_count)
                backends_used.add(choice.backend)
                for g, spec in enumerate(choice.specs):
                    specs.setdefault(spec, f"{_family(choice.backend)} GEMM{g + 1} {label} M={m}")
            if not backends_used & set(MOE_KERNEL_BACKENDS):
                skipped.append((label, "routed experts served by " + "; ".join(
                    f"{b}: {_NO_AOT.get(b, 'no grouped CuTeDSL kernel')}" for b in sorted(backends_used))))
    return f"{args.checkpoint} ({engine}, tp={args.tp})", list((lbl, s) for s, lbl in specs.items()), skipped


# ---- workers -------------------------------------------------------------------------------

_WORKER_CACHE = None


def _init_worker(root: str, modules: list[str]) -> None:
    global _WORKER_CACHE
    import importlib

    for m in modules:
        importlib.import_module(m)

    _WORKER_CACHE = KernelCache(root)


def _build_one(spec):
    return _WORKER_CACHE.ensure(spec)


def run(args) -> int:
    if args.max_candidates < 1 or (args.jobs is not None and args.jobs < 1) or args.max_m < 1:
        print("nvgemm precompile: --max-candidates, --jobs and --max-m must be >= 1", file=sys.stderr)
        return 2
    if args.sm_count is not None and args.sm_count < 1:
        print(f"nvgemm precompile: --sm-count must be >= 1, got {args.sm_count}", file=sys.stderr)
        return 2
    for m in args.template_module:  # fail before planning, not in a worker after the build started
        import importlib.util

        try:
            found = importlib.util.find_spec(m) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            print(f"nvgemm precompile: --template-module {m}: no such importable module", file=sys.stderr)
            return 2
    try:
        title, specs, skipped = plan_specs(args)
    except KeyError as e:
        print(f"nvgemm precompile: unknown name {e.args[0]!r}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"nvgemm precompile: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    root = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    if root.exists() and not root.is_dir():
        print(f"nvgemm precompile: --cache-dir {root}: exists and is not a directory", file=sys.stderr)
        return 2
    try:
        cache = KernelCache(root)
        for _, spec in specs[:1]:
            cache.lookup(spec)  # an unreadable / unusable cache root fails here, with its path
    except OSError as e:
        print(f"nvgemm precompile: cache {root}: {e.strerror or e} ({e.filename or root})", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    results: dict[str, object] = {}
    todo = []
    for label, spec in specs:
        hit = cache.lookup(spec)
        if hit is not None:
            results[spec.name()] = ("cached", label, "", 0.0, None)
        else:
            todo.append((label, spec))
    moe_counts = Counter(f for f in (moe_family(spec) for _, spec in specs) if f)
    moe_line = (f"grouped MoE kernels: {', '.join(f'{f} {n}' for f, n in sorted(moe_counts.items()))} (their Triton "
                "prep / finalize kernels are JIT: Triton compiles them at first use)") if moe_counts else ""
    print(f"nvgemm precompile: {title}: {len(specs)} kernels for {args.arch} -> {cache.fp_dir()}"
          f" ({len(specs) - len(todo)} cached, {len(todo)} to build){'; ' + moe_line if moe_line else ''}",
          file=sys.stderr)
    if args.dry_run:
        for label, spec in specs:
            state = "cached" if spec.name() in results else "missing"
            print(f"  {state:7s} {spec.template_id:18s} {spec.name()}  [{label}]")
        for label, reason in skipped:
            print(f"  no kernel for {label}: {reason}")
        if args.json:
            _write_json(args.json, title, args.arch, cache, 0.0, Counter(), skipped, moe_counts,
                        {spec.name(): {"status": "cached" if spec.name() in results else "missing", "label": label,
                                       "family": _family_name(spec), "config": _config_name(spec), "arch": spec.arch}
                         for label, spec in specs})
        return 0
    if todo:
        jobs = args.jobs or settings.NVGEMM_PRECOMPILE_JOBS or min(4, os.cpu_count() or 1)
        jobs = min(jobs, len(todo))
        bar = None
        if not args.quiet:
            try:
                from tqdm import tqdm

                bar = tqdm(total=len(todo), desc="precompile", unit="kernel", file=sys.stderr)
            except ImportError:
                bar = None
        modules = list(args.template_module)
        if args.selftest:
            modules.append("nvgemm.aot.selftest")

        def record(label, spec, r):
            meta = r.meta or {}
            t = meta.get("timings_s")
            results[spec.name()] = (r.status, label, r.error, r.seconds,
                                    {**t, "compile_cpu": (meta.get("cpu_s") or {}).get("compile")} if t else None)
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(f"{spec.name()[:48]} {r.status}")
            elif not args.quiet:
                print(f"  [{len(results)}/{len(specs)}] {r.status:8s} {spec.name()}", file=sys.stderr)

        if jobs == 1:
            _init_worker(str(root), modules)
            for label, spec in todo:
                record(label, spec, _build_one(spec))
        else:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                                     initargs=(str(root), modules)) as ex:
                futs = {ex.submit(_build_one, spec): (label, spec) for label, spec in todo}
                for f in as_completed(futs):
                    label, spec = futs[f]
                    try:
                        r = f.result()
                    except Exception as e:  # a crashed worker: report the kernel as failed

                        r = CacheResult("", "failed", error=f"worker crashed: {type(e).__name__}: {e}")
                    record(label, spec, r)
        if bar is not None:
            bar.close()
    counts = Counter(v[0] for v in results.values())
    failed = {k: v for k, v in results.items() if v[0] == "failed"}
    by_reason: dict[str, list[str]] = defaultdict(list)
    for name, v in failed.items():
        by_reason[v[2].splitlines()[0] if v[2] else "unknown"].append(name)
    compile_times = sorted(v[4]["compile"] for v in results.values() if v[0] == "compiled" and v[4])
    wall = time.perf_counter() - t_start
    print(f"\nnvgemm precompile summary ({title}, {args.arch}, {wall:.1f} s):")
    print(f"  compiled {counts['compiled']}, cached {counts['cached']}, failed {counts['failed']}")
    if compile_times:
        med = compile_times[len(compile_times) // 2]
        cpu = sorted(v[4]["compile_cpu"] for v in results.values()
                     if v[0] == "compiled" and v[4] and v[4].get("compile_cpu") is not None)
        cpu_txt = f"; CPU time median {cpu[len(cpu) // 2]:.2f} s, max {cpu[-1]:.2f} s" if cpu else ""
        print(f"  compile time per kernel: wall median {med:.2f} s, max {compile_times[-1]:.2f} s{cpu_txt}")
    for reason, names in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        print(f"  failed x{len(names)}: {reason}")
        for nm in names[:3]:
            print(f"      {nm}")
        if len(names) > 3:
            print(f"      ... and {len(names) - 3} more")
    if moe_line:
        print(f"  {moe_line}")
    for label, reason in skipped[:5]:
        print(f"  no candidates for {label}: {reason}")
    if len(skipped) > 5:
        print(f"  ... {len(skipped) - 5} more problems without candidates")
    if args.json:
        by_name = {spec.name(): spec for _, spec in specs}
        _write_json(args.json, title, args.arch, cache, wall, counts, skipped, moe_counts,
                    {k: {"status": v[0], "label": v[1], "error": v[2], "seconds": v[3], "timings_s": v[4],
                         "family": _family_name(by_name[k]), "config": _config_name(by_name[k]),
                         "arch": by_name[k].arch} for k, v in results.items()})
    return 3 if failed else 0


def _family_name(spec) -> str | None:
    fam = family_of_config(spec.config)
    return fam.name if fam is not None else None


def _config_name(spec) -> str:
    return spec.config.name() if hasattr(spec.config, "name") else type(spec.config).__name__


def moe_family(spec) -> str | None:
    """The grouped MoE family building ``spec`` (a family registering a ``moe`` backend), else None."""
    fam = family_of_config(spec.config)
    return fam.name if fam is not None and any(kind == "moe" for kind, _ in fam.backends) else None


def _write_json(path, title, arch, cache, wall, counts, skipped, moe_counts, kernels) -> None:
    doc = {"title": title, "arch": arch, "cache": str(cache.fp_dir()), "wall_s": wall, "counts": dict(counts),
           "moe_kernels": dict(moe_counts), "skipped": skipped, "kernels": kernels}
    Path(path).write_text(json.dumps(doc, indent=1))
