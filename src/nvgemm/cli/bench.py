"""``nvgemm bench``: per-GEMM decode latency of a model's layer shapes, or compile/load timings on CPU.

Examples::

    nvgemm bench --model Llama-3.1-8B --m 1,8,32,128             # on a B200 / H100 / H200
    nvgemm bench --model Qwen3-32B --m 1,16 --out bench/results/decode_qwen3_32b
    nvgemm bench --model Llama-3.1-8B --arch sm_100a,sm_90a       # CPU-only box: compile + load timings
    nvgemm bench decode-step --model Llama-3.1-8B --gpu B200      # a whole decode step (nvgemm.cli.decode_step)

**On a GPU**, for every layer GEMM (N, K) of the preset and every M it times, with CUDA graphs
(``--iters`` calls per graph, best of ``--reps`` replays) cycling through enough rotated weight
copies to exceed twice the L2 cache (decode reads weights from HBM, not L2):

* ``nvgemm``: ``torch.ops.nvgemm.nvfp4_linear`` (the full op: activation quantization + GEMM on
  Blackwell W4A4; bf16 activations on Hopper W4A16), reporting which backend ran. When only the
  emulated reference backend is available the column says so instead of timing the reference;
* ``cublas_nvfp4``: ``torch._scaled_mm`` on pre-quantized NVFP4 operands, then ``* alpha`` (the
  global scales; eager PyTorch needs that second kernel), sm_100 only; activation quantization is
  not timed here, while the nvgemm column includes it;
* ``bf16``: ``torch.matmul(x, W.T)`` with the unquantized bf16 weight;
* ``fp8``: ``torch._scaled_mm`` with per-tensor-scaled e4m3 operands (Hopper only);
* ``roofline``: NVFP4 weight bytes (N*K/2 codes + N*K/16 scales) / measured HBM bandwidth
  (device-to-device copy of a 1 GiB buffer).

Writes ``<out>.json``, ``<out>.md`` and ``<out>.png`` (the PNG needs matplotlib; without it the
plot is skipped with a message).

**Without a GPU** it says so and instead measures, for the policy's best candidate per (arch,
layer, M) plus the AOT selftest kernels: compile time per kernel (cold cache, sequential), a warm
re-run (must compile nothing), and per-kernel warm load time in a fresh process where
``import cutlass`` fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from nvgemm.cli import decode_step, int_list
from nvgemm.aot.abi import CompileSpec, HardwareSpec, template_id_for_config
from nvgemm.aot.cache import KernelCache
from nvgemm.aot.compile_spec import capture_codegen_env, make_spec
from nvgemm.aot.selftest import SELFTEST_TEMPLATE_ID, SelftestConfig
from nvgemm.cli.precompile import ARCH_DEFAULT_GPU
from nvgemm.core.formats import quantize_activation, quantize_weight, to_blocked
from nvgemm.core.validation import alpha_of, check_linear_args, problem_of
from nvgemm.dispatch.registry import select_backend
from nvgemm.core.epilogue import EpilogueSpec
from nvgemm.heuristics import GemmProblem, Target, candidates
from nvgemm.heuristics.presets import get_preset
import nvgemm.ops.linear  # noqa: F401  (registers torch.ops.nvgemm)



def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench",
        help="per-GEMM decode latency vs cuBLAS/bf16/roofline (GPU), or compile/load timings (CPU)",
        description="Decode GEMM benchmark over a model preset's layer shapes and token counts.",
    )
    p.add_argument("--model", default="Llama-3.1-8B", help="model preset (default Llama-3.1-8B)")
    p.add_argument("--m", type=int_list, default=[1, 8, 32, 128], help="token counts (default 1,8,32,128)")
    p.add_argument("--iters", type=int, default=64, help="GEMM calls per CUDA graph (default 64)")
    p.add_argument("--reps", type=int, default=7, help="graph replays; the best is reported (default 7)")
    p.add_argument("--arch", default="sm_100a,sm_90a", help="CPU mode: target arches to compile (default sm_100a,sm_90a)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="CPU mode: cache root (default: a fresh temporary directory, so compiles are cold)")
    p.add_argument("--out", type=Path, default=None, help="output prefix for .json/.md/.png "
                   "(default bench/results/decode_<model> on GPU, bench/results/cache_<date> on CPU)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.set_defaults(func=run)
    sub = p.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")
    ds = sub.add_parser(
        "decode-step",
        help="a whole batch-1 decode step: its kernels counted from Inductor's generated code, modelled ms/token",
        description=decode_step.__doc__.split("\n\n")[0],
    )
    decode_step.add_arguments(ds)
    ds.set_defaults(func=decode_step.run)
    return p


# =============================================================================================
# CPU mode: compile and cache-load timings
# =============================================================================================


def _best_specs(model: str, ms: list[int], arches: list[str]) -> list[tuple[str, object]]:
    """(label, CompileSpec) of the policy's top candidate per (arch, layer, M), deduplicated."""
    import torch

    preset = get_preset(model)
    env = capture_codegen_env()
    epi = EpilogueSpec(alpha="scalar", out_dtype=torch.bfloat16)
    out: dict[object, str] = {}
    for arch in arches:
        target = Target.from_gpu(ARCH_DEFAULT_GPU[arch])
        a_format = "bf16" if target.family == "sm90" else "nvfp4"
        for lg in preset.layers:
            for m in ms:
                prob = GemmProblem(n=lg.n, k=lg.k, m=m, a_format=a_format, target=target)
                cands = candidates(prob)
                if not cands:
                    continue
                c = cands[0].config
                spec = CompileSpec(template_id_for_config(c), c, epi, arch, HardwareSpec(target.sm_count),
                                   a_format=a_format, b_format="nvfp4", codegen_env=env)
                out.setdefault(spec, f"{lg.name} M={m}")
    return [(lbl, s) for s, lbl in out.items()]


def _selftest_specs(arches: list[str]) -> list[tuple[str, object]]:
    return [("selftest", make_spec(SELFTEST_TEMPLATE_ID, SelftestConfig(threads=t), a, a_format="bf16", b_format="bf16"))
            for a in arches for t in (128, 256)]


_LOAD_PROBE = textwrap.dedent(
    """
    import json, pickle, sys, time
    for m in ("cutlass", "nvidia_cutlass_dsl"):
        sys.modules[m] = None          # a serving process: the DSL compiler cannot be imported
    t0 = time.perf_counter()
    import torch
    from nvgemm.aot.cache import KernelCache
    t_import = time.perf_counter() - t0
    specs = pickle.load(open(sys.argv[1], "rb"))
    t0 = time.perf_counter()
    kc = KernelCache(sys.argv[2])
    kc.fid = sys.argv[3]               # the builder's fingerprint (the shared tree may change mid-run)
    from nvgemm.aot.artifact import preload_cudart
    preload_cudart()                   # once per process (torch on a GPU box has usually done it)
    t_init = time.perf_counter() - t0
    out = []
    for s in specs:
        t0 = time.perf_counter()
        try:
            kc.get(s, build=False)
            out.append((time.perf_counter() - t0) * 1e3)
        except Exception as e:
            out.append(f"{type(e).__name__}: {e}")
    print(json.dumps({"load_ms": out, "import_s": t_import, "cache_init_s": t_init, "compiled": kc.stats["compiled"],
                      "cutlass_imported": any(v is not None for k, v in sys.modules.items() if "cutlass" in k)}))
    """
)


def cache_timings(model: str, ms: list[int], arches: list[str], cache_dir: Path | None = None) -> dict:
    """Cold compile per kernel, warm re-run compile count, warm load per kernel (cutlass blocked)."""
    specs = _selftest_specs(arches) + _best_specs(model, ms, arches)
    tmp = None
    if cache_dir is None:
        tmp = tempfile.mkdtemp(prefix="nvgemm_bench_cache_")
        cache_dir = Path(tmp)
    kc = KernelCache(cache_dir)
    rows = []
    t_all = time.perf_counter()
    for label, spec in specs:
        r = kc.ensure(spec)
        t = (r.meta or {}).get("timings_s") or {}
        rows.append({"kernel": spec.name(), "template": spec.template_id, "arch": spec.arch, "label": label,
                     "status": r.status, "error": r.error, "build_s": r.seconds if r.status == "compiled" else None,
                     "compile_s": t.get("compile") if r.status == "compiled" else None,
                     "export_s": t.get("export") if r.status == "compiled" else None,
                     "link_s": t.get("link") if r.status == "compiled" else None,
                     "compile_cpu_s": ((r.meta or {}).get("cpu_s") or {}).get("compile") if r.status == "compiled" else None,
                     "so_bytes": (r.path / "kernel.so").stat().st_size if r.path else None})
        print(f"  {r.status:8s} {r.seconds:6.2f} s  {spec.name()}  [{label}]", file=sys.stderr)
    cold_s = time.perf_counter() - t_all
    # Warm re-run in this process: must compile nothing.
    before = kc.stats["compiled"]
    warm = [kc.ensure(s).status for _, s in specs]
    warm_compiled = kc.stats["compiled"] - before
    # Warm load in a fresh serving-like process.
    ok = [(row, s) for row, (_, s) in zip(rows, specs) if row["status"] in ("compiled", "cached")]
    probe = {"load_ms": [], "import_s": None, "cache_init_s": None, "compiled": 0, "cutlass_imported": False}
    if ok:
        with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
            pickle.dump([s for _, s in ok], f)
        try:
            r = subprocess.run([sys.executable, "-c", _LOAD_PROBE, f.name, str(cache_dir), kc.fid],
                               capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise RuntimeError(f"load probe failed: {r.stderr[-2000:]}")
            probe = json.loads(r.stdout.strip().splitlines()[-1])
        finally:
            os.unlink(f.name)
        for (row, _), ms_ in zip(ok, probe["load_ms"]):
            row["load_ms"] = ms_
    if tmp:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return {"model": model, "m": ms, "arches": arches, "rows": rows, "cold_total_s": cold_s,
            "warm_rerun_statuses": sorted(set(warm)), "warm_rerun_compiled": warm_compiled,
            "probe": {k: v for k, v in probe.items() if k != "load_ms"}}


def _stats(vals: list[float]) -> str:
    if not vals:
        return "-"
    v = sorted(vals)
    return f"median {v[len(v) // 2]:.3g}, max {v[-1]:.3g} (n={len(v)})"


def cache_timings_markdown(res: dict, header: str = "") -> str:
    rows = res["rows"]
    out = [header] if header else []
    built = [r for r in rows if r["status"] == "compiled"]
    loads = [r["load_ms"] for r in rows if isinstance(r.get("load_ms"), (int, float))]
    out += [
        f"Model preset **{res['model']}**, M = {res['m']}, arches {', '.join(res['arches'])}: the policy's top "
        f"candidate per (arch, layer, M), plus the AOT selftest kernels.",
        "",
        f"* kernels: {len(rows)}; built {len(built)}, failed {sum(r['status'] == 'failed' for r in rows)}",
        f"* compile (cute.compile) wall s: {_stats([r['compile_s'] for r in built])}; CPU s: "
        f"{_stats([r['compile_cpu_s'] for r in built if r.get('compile_cpu_s') is not None])}; goal <= 3 s "
        f"(the first compile in a process includes CuTeDSL's one-time initialisation)",
        f"* full build (compile + export_to_c + gcc link + checksums) s: {_stats([r['build_s'] for r in built])}",
        f"* warm re-run: {res['warm_rerun_compiled']} compiles (statuses {res['warm_rerun_statuses']}); goal 0",
        f"* warm load per kernel, fresh process with `import cutlass` blocked (checksum + dlopen + symbols) ms: "
        f"{_stats(loads)}; goal <= 20 ms. One-time per process: import torch+nvgemm "
        f"{res['probe'].get('import_s') or 0:.2f} s, cache init (fingerprint + libcudart preload) {res['probe'].get('cache_init_s') or 0:.3f} s; "
        f"cutlass imported: {res['probe'].get('cutlass_imported')}",
        "",
        "| kernel | template | arch | for | status | compile s (CPU s) | export s | link s | .so KB | warm load ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f = lambda v, fmt: (fmt % v) if isinstance(v, (int, float)) else "-"  # noqa: E731
        out.append(
            f"| `{r['kernel']}` | {r['template']} | {r['arch']} | {r['label']} | {r['status']} | "
            f"{f(r['compile_s'], '%.2f')} ({f(r.get('compile_cpu_s'), '%.2f')}) | {f(r['export_s'], '%.2f')} | {f(r['link_s'], '%.2f')} | "
            f"{f(r['so_bytes'] and r['so_bytes'] / 1024, '%.0f')} | "
            f"{f(r.get('load_ms'), '%.2f') if not isinstance(r.get('load_ms'), str) else r['load_ms'][:60]} |"
        )
    fails = {}
    for r in rows:
        if r["status"] == "failed":
            fails.setdefault(r["error"].splitlines()[0][:300], []).append(r["kernel"])
    if fails:
        out += ["", "Failures:", ""]
        out += [f"* x{len(v)}: {k}" for k, v in fails.items()]
    return "\n".join(out) + "\n"


def environment_header(command: str) -> str:
    import importlib.metadata as md

    import torch

    def ver(d):
        try:
            return md.version(d)
        except md.PackageNotFoundError:
            return "-"

    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        mem = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM"
    except (ValueError, OSError):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    try:
        load = ", load average at start %.1f / %.1f / %.1f (shared box: other jobs inflate timings)" % os.getloadavg()
    except OSError:
        load = ""
    return "\n".join([
        f"* date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"* machine: {os.cpu_count()} CPU cores ({cpu}){mem}, {gpu}{load}",
        f"* versions: nvgemm {ver('nvgemm')}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"nvidia-cutlass-dsl {ver('nvidia-cutlass-dsl')}, Python {platform.python_version()}",
        f"* command: `{command}`",
        "",
    ])


# =============================================================================================
# GPU mode: decode latency
# =============================================================================================


def measure_bandwidth_gbs(nbytes: int = 1 << 30, reps: int = 10) -> float:
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        dst.copy_(src)
        e1.record()
        e1.synchronize()
        best = min(best, e0.elapsed_time(e1) / 1e3)
    del src, dst
    return 2 * nbytes / best / 1e9  # read + write


def graph_time_us(calls: list, iters: int, reps: int) -> tuple[float, str]:
    """Per-call time (best replay) of a CUDA graph of ``iters`` calls cycling through ``calls``."""
    import torch

    iters = max(iters, len(calls))
    for c in calls:
        c()
    torch.cuda.synchronize()
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for c in calls[:3]:
                c()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for j in range(iters):
                calls[j % len(calls)]()
        run, mode = g.replay, "graph"
    except RuntimeError as e:  # not capturable: time eager launches instead, and say so
        torch.cuda.synchronize()

        def run():
            for j in range(iters):
                calls[j % len(calls)]()

        mode = f"eager ({str(e).splitlines()[0][:80]})"
    run()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        run()
        e1.record()
        e1.synchronize()
        best = min(best, e0.elapsed_time(e1) * 1e3 / iters)
    return best, mode


def _bench_gemm(n: int, k: int, m: int, cap: tuple[int, int], bw_gbs: float, l2_bytes: int, iters: int, reps: int) -> dict:
    import torch

    dev = "cuda"
    g = torch.Generator(device="cpu").manual_seed(n * 131 + k * 7 + m)
    w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16).to(dev)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(dev)
    wq = quantize_weight(w.float())
    w_sw = to_blocked(wq.scale).reshape(-1)  # torch._scaled_mm reads flat swizzled bytes
    fp4_bytes = n * k // 2 + n * k // 16
    copies = max(1, min(64, math.ceil(2 * l2_bytes / fp4_bytes)))
    copies_bf16 = max(1, min(64, math.ceil(2 * l2_bytes / (n * k * 2))))
    row = {"n": n, "k": k, "m": m, "weight_bytes_nvfp4": fp4_bytes, "rotated_copies": copies,
           "roofline_us": fp4_bytes / (bw_gbs * 1e9) * 1e6}
    w4a4 = cap[0] == 10
    input_scale = (x.float().abs().amax() / (6.0 * 448.0)).reshape(()) if w4a4 else None
    packs = [wq.packed.clone() for _ in range(copies)]
    scales = [w_sw.clone() for _ in range(copies)]
    ws2 = wq.global_scale.reshape(()).to(dev)

    # nvgemm op
    spec = check_linear_args(x, packs[0], scales[0], ws2, input_scale, None, None, "none", None)
    backend = select_backend(problem_of(x, packs[0], scales[0], ws2, input_scale, None, None, "none", spec)).name
    row["nvgemm_backend"] = backend
    if backend == "emulated":
        row["nvgemm_us"], row["nvgemm_mode"] = None, "n/a: only the emulated reference backend is registered"
    else:
        calls = [lambda i=i: torch.ops.nvgemm.nvfp4_linear(x, packs[i], scales[i], ws2, input_scale, None, None, "none", None)
                 for i in range(copies)]
        row["nvgemm_us"], row["nvgemm_mode"] = graph_time_us(calls, iters, reps)

    # cuBLAS NVFP4 (GEMM only, pre-quantized activations), Blackwell
    row["cublas_nvfp4_us"] = None
    if w4a4 and hasattr(torch, "float4_e2m1fn_x2"):
        try:
            xq, xs = quantize_activation(x, input_scale)
            a = xq.view(torch.float4_e2m1fn_x2)
            xs_sw = to_blocked(xs).reshape(-1)
            alpha = alpha_of(ws2, input_scale)
            calls = [lambda i=i: torch._scaled_mm(a, packs[i].view(torch.float4_e2m1fn_x2).t(), xs_sw, scales[i],
                                                  out_dtype=torch.bfloat16) * alpha for i in range(copies)]
            row["cublas_nvfp4_us"], row["cublas_nvfp4_mode"] = graph_time_us(calls, iters, reps)
        except (RuntimeError, TypeError) as e:
            row["cublas_nvfp4_mode"] = f"n/a: {str(e).splitlines()[0][:120]}"
    del packs, scales

    # bf16
    wb = [w.clone() for _ in range(copies_bf16)]
    row["bf16_us"], row["bf16_mode"] = graph_time_us([lambda i=i: torch.matmul(x, wb[i].t()) for i in range(copies_bf16)],
                                                     iters, reps)
    del wb

    # FP8 per-tensor (Hopper)
    row["fp8_us"] = None
    if cap == (9, 0):
        try:
            sx = (x.float().abs().amax() / 448.0).reshape(())
            sw = (w.float().abs().amax() / 448.0).reshape(())
            xf = (x.float() / sx).to(torch.float8_e4m3fn)
            wf = (w.float() / sw).to(torch.float8_e4m3fn)
            c8 = max(1, min(64, math.ceil(2 * l2_bytes / (n * k))))
            wfs = [wf.clone() for _ in range(c8)]
            calls = [lambda i=i: torch._scaled_mm(xf, wfs[i].t(), sx, sw, out_dtype=torch.bfloat16) for i in range(c8)]
            row["fp8_us"], row["fp8_mode"] = graph_time_us(calls, iters, reps)
            del wfs
        except (RuntimeError, TypeError) as e:
            row["fp8_mode"] = f"n/a: {str(e).splitlines()[0][:120]}"
    torch.cuda.empty_cache()
    return row


def gpu_markdown(res: dict, header: str = "") -> str:
    f = lambda v: f"{v:.2f}" if isinstance(v, (int, float)) else "-"  # noqa: E731
    out = [header] if header else []
    out += [
        f"{res['gpu']} ({res['arch']}), measured HBM bandwidth {res['bandwidth_gbs']:.0f} GB/s (1 GiB D2D copy); "
        f"CUDA graphs of {res['iters']} calls over rotated weight copies (> 2x L2 {res['l2_mb']:.0f} MB), best of {res['reps']}.",
        "nvgemm = full `nvgemm::nvfp4_linear` op (incl. activation quantization on W4A4); cublas_nvfp4 = "
        "`torch._scaled_mm` on pre-quantized operands followed by `* alpha`.",
        "",
        "| layer | N | K | M | nvgemm us (backend) | cuBLAS NVFP4 us | bf16 us | FP8 us | roofline us | nvgemm / roofline |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        ratio = f"{r['nvgemm_us'] / r['roofline_us']:.2f}x" if r.get("nvgemm_us") else "-"
        out.append(f"| {r['layer']} | {r['n']} | {r['k']} | {r['m']} | {f(r.get('nvgemm_us'))} ({r['nvgemm_backend']}) | "
                   f"{f(r.get('cublas_nvfp4_us'))} | {f(r.get('bf16_us'))} | {f(r.get('fp8_us'))} | {f(r['roofline_us'])} | {ratio} |")
    notes = sorted({f"{k}: {v}" for r in res["rows"] for k, v in r.items() if k.endswith("_mode") and str(v).startswith(("n/a", "eager"))})
    if notes:
        out += ["", "Notes:", ""] + [f"* {n}" for n in notes]
    return "\n".join(out) + "\n"


def plot_roofline(res: dict, path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: skipped the roofline PNG (pip install matplotlib)"
    layers = list(dict.fromkeys(r["layer"] for r in res["rows"]))
    fig, axes = plt.subplots(1, len(layers), figsize=(4.2 * len(layers), 3.6), squeeze=False)
    for ax, layer in zip(axes[0], layers):
        rows = [r for r in res["rows"] if r["layer"] == layer]
        ms = [r["m"] for r in rows]
        for key, lbl, style in (("nvgemm_us", "nvgemm", "o-"), ("cublas_nvfp4_us", "cuBLAS NVFP4", "s-"),
                                ("bf16_us", "bf16 matmul", "^-"), ("fp8_us", "FP8 scaled_mm", "v-"),
                                ("roofline_us", "NVFP4 roofline", "k--")):
            pts = [(m, r.get(key)) for m, r in zip(ms, rows) if isinstance(r.get(key), (int, float))]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=lbl)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{layer} N={rows[0]['n']} K={rows[0]['k']}")
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel("us")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{res['model']} decode GEMMs on {res['gpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return f"wrote {path}"


def gpu_bench(args) -> dict:
    import torch

    preset = get_preset(args.model)
    props = torch.cuda.get_device_properties(0)
    cap = (props.major, props.minor)
    bw = measure_bandwidth_gbs()
    l2 = int(getattr(props, "L2_cache_size", 50 << 20))
    rows = []
    for lg in preset.layers:
        for m in args.m:
            r = _bench_gemm(lg.n, lg.k, m, cap, bw, l2, args.iters, args.reps)
            r["layer"] = lg.name
            rows.append(r)
            print(f"  {lg.name:8s} M={m:4d} nvgemm {r.get('nvgemm_us')} ({r['nvgemm_backend']}) "
                  f"cublas_nvfp4 {r.get('cublas_nvfp4_us')} bf16 {r.get('bf16_us')} fp8 {r.get('fp8_us')} "
                  f"roofline {r['roofline_us']:.2f} us", file=sys.stderr)
    return {"model": preset.name, "gpu": props.name, "arch": f"sm_{cap[0]}{cap[1]}", "bandwidth_gbs": bw,
            "l2_mb": l2 / 2**20, "iters": args.iters, "reps": args.reps, "rows": rows}


def run(args) -> int:
    import torch

    if args.iters < 1 or args.reps < 1:
        print("nvgemm bench: --iters and --reps must be >= 1", file=sys.stderr)
        return 2
    command = "nvgemm " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("nvgemm") else "nvgemm bench"
    try:
        get_preset(args.model)
    except KeyError as e:
        print(f"nvgemm bench: {e.args[0]}", file=sys.stderr)
        return 2
    if torch.cuda.is_available():
        out = args.out or Path("bench/results") / f"decode_{args.model.lower().replace('.', '_')}"
        res = gpu_bench(args)
        md = gpu_markdown(res, f"# nvgemm decode GEMM latency: {res['model']}\n\n" + environment_header(command))
        plot_msg = "plot skipped (--no-plot)" if args.no_plot else plot_roofline(res, out.with_suffix(".png"))
    else:
        print("nvgemm bench: no CUDA GPU on this machine, so GEMM latencies cannot be measured here. "
              "Reporting compile and cache-load timings of the AOT kernel cache instead.", file=sys.stderr)
        arches = [a.strip() for a in args.arch.split(",") if a.strip()]
        out = args.out or Path("bench/results") / f"cache_{time.strftime('%Y-%m-%d', time.gmtime())}"
        res = cache_timings(args.model, args.m, arches, args.cache_dir)
        md = cache_timings_markdown(res, "# nvgemm kernel cache: compile and warm-load timings\n\n"
                                    + environment_header(command))
        plot_msg = "no plot in CPU mode"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    out.with_suffix(".md").write_text(md)
    print(md)
    print(f"nvgemm bench: wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}; {plot_msg}", file=sys.stderr)
    return 0
