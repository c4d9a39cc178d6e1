"""The single H200 check of the sm90 NVFP4 W4A16 kernels: numerics + timing, without cutlass-dsl.

Here (no GPU):      python bench/build_sm90_artifacts.py            # -> build/sm90_gpu_check/
On the H200:        PYTHONUNBUFFERED=1 python3 bench/gpu_check.py --artifacts build/sm90_gpu_check --out $OUT
                    (device tool: carry ["build/sm90_gpu_check"]; ~2-4 minutes)
CPU self-test:      python bench/gpu_check.py --cpu-selftest        # the glue, with the kernel emulated

Steps (METHOD.md): 1. load the precompiled kernels (``kernel.so`` via nvgemm's ctypes AOT loader;
cutlass is never imported, and the script says whether it is even installed); 2. numerics of every
manifest case against the emulated op (``nvgemm.ops.nvfp4_linear_emulated``) on fresh random inputs,
outputs poisoned with NaN before each launch; 3. device-to-device copy bandwidth, measured once
(bytes read + written); 4. timing: CUDA graphs over rotating weight copies (>= 256 MB per graph so
L2 cannot serve them), median of many replays, for each kernel and for bf16 ``torch.matmul`` on the
same shape; 5. one short table (us, speed-up vs bf16, weight bandwidth as % of the copy bandwidth,
time vs the byte roofline) and JSON under ``--out``.

Tolerance (numerics): the kernel and the emulated op compute the same exact products (E2M1 x e4m3
x activation are exact in fp32) and differ in fp32 summation order only: |diff| <= 2 ulp(out) * |ref|
+ 4 * K * 2**-24 * (|x| @ |W|^T) * |alpha| (elementwise; the factor 4 covers the activations'
slopes and the fold of the 2**14 decode scale).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-23}
ROTATE_BYTES = 256 << 20
REPS = 30


def _load_suite():
    spec = importlib.util.spec_from_file_location("sm90_suite", ROOT / "bench" / "sm90_suite.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sm90_suite"] = mod
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------------------- inputs


def random_layer(case, dev, gen):
    """Fresh random packed weight (every byte value is a valid pair of codes), e4m3 block scales in
    a realistic range, global scale(s), activations; the op's input contract (swizzled scales)."""
    from nvgemm.formats import to_blocked

    n, k = case.n, case.k
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev, generator=gen)
    scale = torch.exp2(torch.randint(-6, 4, (n, k // 16), device=dev, generator=gen).float())
    scale = (scale * (1 + torch.rand(n, k // 16, device=dev, generator=gen))).to(torch.float8_e4m3fn)
    ws2 = torch.rand((), device=dev, generator=gen) * 1e-2 + 1e-3
    if case.vector_alpha:
        ws2 = ws2 * (1 + torch.arange(n, device=dev) % 3).float()
    x = torch.randn(case.m, k, device=dev, generator=gen).to(case.torch_x_dtype)
    input_scale = (x.float().abs().amax() / 2688).reshape(()) if case.w4a4 else None
    n_out = n // 2 if case.activation == "silu_mul" else n
    bias = torch.randn(n, device=dev, generator=gen).to(case.torch_x_dtype) if case.bias else None
    res = torch.randn(case.m, n_out, device=dev, generator=gen).to(case.torch_out_dtype) if case.residual else None
    return dict(x=x, weight=packed, weight_scale=to_blocked(scale).reshape(-1), weight_scale_2=ws2.float(),
                input_scale=input_scale, bias=bias, residual=res, activation=case.activation,
                out_dtype=case.torch_out_dtype if case.out_dtype != case.x_dtype else None)


def error_bound(case, lay, prepared, ref):
    """Elementwise bound on |kernel - emulated| (see the module docstring)."""
    from nvgemm.formats import dequantize

    w = dequantize(lay["weight"], prepared.scale.view(torch.float8_e4m3fn))  # E2M1 * s (no global scale)
    x = lay["x"].float()
    if lay["input_scale"] is not None:
        from nvgemm.runtime.sm90_launch import qdq_activation

        x = qdq_activation(lay["x"], lay["input_scale"]).float()
    alpha = lay["weight_scale_2"].float().abs() * (lay["input_scale"].float() if lay["input_scale"] is not None else 1.0)
    mag = (x.abs() @ w.abs().t()) * alpha  # [M, N]
    if case.activation == "silu_mul":
        h = mag.shape[1] // 2
        g, u = mag[:, :h], mag[:, h:]
        mag = g * u + g + u  # |d(silu(g) u)| <= |u| dg + |g| du (silu' <= 1.1)
    slack = 4 * case.k * 2.0**-24 * mag
    return ULP[ref.dtype] * 2 * ref.float().abs() + slack + 1e-30


# ------------------------------------------------------------------------------- kernels


class Runner:
    """Loads kernels from the manifest's cache entries (``AotKernel``; never imports cutlass)."""

    def __init__(self, artifacts: Path, cpu_selftest: bool):
        self.cpu = cpu_selftest
        self.artifacts = artifacts
        self.manifest = {}
        self.kernels = {}
        if not cpu_selftest:
            man = json.loads((artifacts / "manifest.json").read_text())
            self.manifest = {e["case"]["name"]: e for e in man["entries"]}

    def config(self, case):
        from nvgemm.templates.sm90_config import Sm90W4A16Config

        if self.cpu:
            from nvgemm.runtime.sm90_launch import pick_config

            if case.config is not None:
                return Sm90W4A16Config(**case.config)
            return pick_config(case.m, case.n, case.k, case.torch_x_dtype, case.activation, 132)
        return Sm90W4A16Config(**self.manifest[case.name]["config"])

    def kernel(self, case):
        if self.cpu:
            return None
        e = self.manifest[case.name]
        if e["status"] == "failed" or not e["entry"]:
            raise RuntimeError(f"{case.name}: its kernel failed to build ({e['spec_name']})")
        d = self.artifacts / e["entry"]
        if d not in self.kernels:
            from nvgemm.runtime.aot import AotKernel
            from nvgemm.runtime.cache import KernelCache
            from nvgemm.templates.registry import abi_from_json

            # the cache's own verified read (checksums of meta.json and kernel.so)
            meta = KernelCache(self.artifacts).read_entry(d, e["key"], Path(e["entry"]).parts[0])
            self.kernels[d] = AotKernel(d / "kernel.so", abi_from_json(meta["abi"]), name=e["spec_name"])
        return self.kernels[d]

    def launch(self, case, args, kernel, stream=None):
        if self.cpu:
            from nvgemm.runtime.sm90_launch import kernel_view_ref

            args.out.copy_(kernel_view_ref(args, self.config(case)))
            return args.out
        from nvgemm.runtime.sm90_launch import launch_sm90

        return launch_sm90(args, kernel, stream or torch.cuda.current_stream())


# ------------------------------------------------------------------------------- steps


def check_numerics(case, runner, dev, gen):
    from nvgemm.ops import nvfp4_linear_emulated
    from nvgemm.runtime.sm90_launch import prepare_sm90_args, prepare_sm90_weight

    lay = random_layer(case, dev, gen)
    prepared = prepare_sm90_weight(lay["weight"], lay["weight_scale"], lay["weight_scale_2"])
    cfg = runner.config(case)
    args = prepare_sm90_args(lay["x"], prepared, lay["input_scale"], lay["bias"], lay["residual"], lay["activation"],
                             lay["out_dtype"], cfg)
    kern = runner.kernel(case)
    worst = 0.0
    for rep in range(2):  # the second run catches state left by the first (split-K workspace, races)
        args.out.fill_(float("nan"))
        out = runner.launch(case, args, kern)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        ref = nvfp4_linear_emulated(lay["x"], lay["weight"], lay["weight_scale"], lay["weight_scale_2"],
                                    lay["input_scale"], lay["bias"], lay["residual"], lay["activation"],
                                    lay["out_dtype"])
        if not torch.isfinite(out).all():
            bad = (~torch.isfinite(out)).sum().item()
            return dict(ok=False, why=f"{bad} non-finite outputs (unwritten or overflow)", rep=rep)
        bound = error_bound(case, lay, prepared, ref)
        err = (out.float() - ref.float()).abs()
        ratio = (err / bound).max().item()
        worst = max(worst, ratio)
        if ratio > 1:
            i = int((err / bound).argmax())
            return dict(ok=False, why=f"|diff| {err.view(-1)[i]:.3g} > bound {bound.view(-1)[i]:.3g} at flat {i}",
                        rep=rep)
    rel = ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()
    return dict(ok=True, worst_err_over_bound=worst, rel_l2=rel, config=cfg.name())


def copy_bandwidth(dev):
    n = (2 << 30) // 4
    a = torch.empty(n, dtype=torch.float32, device=dev).uniform_()
    b = torch.empty_like(a)
    ts = []
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e-3)
    t = sorted(ts)[len(ts) // 2]
    del a, b
    torch.cuda.empty_cache()
    return 2 * n * 4 / t  # bytes read + written per second


def time_graph(fns, reps=REPS):
    """Median seconds per call of ``fns`` (one per rotating copy), captured in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns[:2]:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            for f in fns:
                f()
        graph = True
    except Exception as exc:  # noqa: BLE001  (record why and fall back to plain launches)
        print(f"  graph capture failed ({type(exc).__name__}: {exc}); timing plain launches", flush=True)
        graph = False
    ts = []
    for _ in range(3 if graph else 1):
        g.replay() if graph else [f() for f in fns]
    torch.cuda.synchronize()
    for _ in range(reps):
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record()
        if graph:
            g.replay()
        else:
            for f in fns:
                f()
        en.record()
        en.synchronize()
        ts.append(st.elapsed_time(en) * 1e-3 / len(fns))
    ts.sort()
    return ts[len(ts) // 2], graph, (ts[-1] - ts[0]) / ts[len(ts) // 2]


_BF16_TIMES: dict = {}


def time_case(case, runner, dev, gen, copy_bw):
    from nvgemm.runtime.sm90_launch import Sm90Weight, prepare_sm90_args, prepare_sm90_weight

    lay = random_layer(case, dev, gen)
    prepared = prepare_sm90_weight(lay["weight"], lay["weight_scale"], lay["weight_scale_2"])
    cfg = runner.config(case)
    kern = runner.kernel(case)
    wbytes = prepared.weight.numel() + prepared.scale.numel()
    copies = max(2, math.ceil(ROTATE_BYTES / wbytes))
    ws = [Sm90Weight(prepared.weight.clone(), prepared.scale.clone(), prepared.weight_scale_2, prepared.n, prepared.k)
          for _ in range(copies)]
    argss = [prepare_sm90_args(lay["x"], w, None, None, None, "none", None, cfg) for w in ws]
    t_k, graph_k, spread_k = time_graph([lambda a=a: runner.launch(case, a, kern) for a in argss])
    del ws, argss
    # bf16 baseline on the same shape, rotating bf16 weights (once per shape and M)
    bkey = (case.m, case.n, case.k)
    if bkey not in _BF16_TIMES:
        wb = torch.randn(case.n, case.k, device=dev, generator=gen, dtype=torch.bfloat16)
        bcopies = max(2, math.ceil(ROTATE_BYTES / (wb.numel() * 2)))
        wbs = [wb] + [wb.clone() for _ in range(bcopies - 1)]
        o = torch.empty(case.m, case.n, device=dev, dtype=torch.bfloat16)
        xb = lay["x"].to(torch.bfloat16)
        _BF16_TIMES[bkey] = time_graph([lambda w=w: torch.matmul(xb, w.t(), out=o) for w in wbs])
        del wbs, wb
    t_b, graph_b, spread_b = _BF16_TIMES[bkey]
    torch.cuda.empty_cache()
    all_bytes = wbytes + case.m * case.k * 2 + case.m * case.n * 2
    return dict(
        config=cfg.name(), us=t_k * 1e6, bf16_us=t_b * 1e6, speedup=t_b / t_k,
        weight_tbps=wbytes / t_k / 1e12, pct_copy_bw=100 * wbytes / t_k / copy_bw,
        roofline_us=all_bytes / copy_bw * 1e6, pct_roofline=100 * (all_bytes / copy_bw) / t_k,
        bf16_pct_copy_bw=100 * case.n * case.k * 2 / t_b / copy_bw,
        copies=copies, graph=graph_k and graph_b, spread=max(spread_k, spread_b),
    )


# ------------------------------------------------------------------------------- main


def environment(dev) -> dict:
    info = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "python": platform.python_version(),
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "host": platform.node()}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    info["cutlass_dsl_installed"] = importlib.util.find_spec("cutlass") is not None
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        info.update(gpu=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count,
                    memory_gib=round(p.total_memory / 2**30, 1))
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem,power.limit",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            info["nvidia_smi"] = q.stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            info["nvidia_smi"] = f"unavailable: {e}"
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default=str(ROOT / "build" / "sm90_gpu_check"))
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "build" / "gpu_check_out")))
    ap.add_argument("--cpu-selftest", action="store_true", help="run the glue on CPU with the kernel emulated")
    ap.add_argument("--only", default="", help="substring filter on case names")
    ap.add_argument("--no-timing", action="store_true")
    args = ap.parse_args()
    t_start = time.time()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    import nvgemm  # noqa: F401  (registers the ops)

    suite = _load_suite()
    dev = torch.device("cpu" if args.cpu_selftest else "cuda")
    if not args.cpu_selftest:
        cap = torch.cuda.get_device_capability()
        if cap != (9, 0):
            print(f"this check is for an sm_90 GPU; found capability {cap}")
            return 2
    env = environment(dev)
    print("env:", json.dumps(env), flush=True)
    runner = Runner(Path(args.artifacts), args.cpu_selftest)
    gen = torch.Generator(device=dev)
    gen.manual_seed(int(time.time()) & 0xFFFFFFFF)  # fresh inputs every run (the seed is recorded)
    result = {"env": env, "seed": gen.initial_seed(), "numerics": {}, "timing": {}}

    cases = [c for c in suite.all_cases() if args.only in c.name]
    if args.cpu_selftest:  # small stand-ins for the big shapes; same code paths
        cases = [dataclasses.replace(c, n=min(c.n, 256), k=min(c.k, 512 if c.k % 512 == 0 else c.k % 512 + 512),
                                     m=min(c.m, 8))
                 for c in cases if c.name.endswith(".m1") or not c.timed]

    # 1-2. numerics: every numeric case, and each timed shape at its smallest and a mid M
    num_cases = [c for c in cases if not c.timed or c.m in (1, 16)]
    n_fail = 0
    for c in num_cases:
        t0 = time.time()
        try:
            r = check_numerics(c, runner, dev, gen)
        except Exception as e:  # noqa: BLE001  (a broken case is reported, the run goes on)
            r = dict(ok=False, why=f"{type(e).__name__}: {e}")
        r["seconds"] = round(time.time() - t0, 2)
        result["numerics"][c.name] = r
        n_fail += not r["ok"]
        print(f"numerics {c.name:32s} {'ok ' if r['ok'] else 'FAIL'} "
              f"{r.get('worst_err_over_bound', r.get('why', ''))}", flush=True)

    # 3-4. bandwidth and timing
    if not args.cpu_selftest and not args.no_timing:
        bw = copy_bandwidth(dev)
        result["copy_bw_tbps"] = bw / 1e12
        print(f"device-to-device copy: {bw / 1e12:.2f} TB/s (read + write)", flush=True)
        for c in [c for c in cases if c.timed]:
            try:
                r = time_case(c, runner, dev, gen, bw)
            except Exception as e:  # noqa: BLE001
                r = dict(error=f"{type(e).__name__}: {e}")
            result["timing"][c.name] = r
            print(f"time {c.name:32s} {json.dumps(r)}", flush=True)
    result["wall_s"] = round(time.time() - t_start, 1)
    (out_dir / "gpu_check_sm90.json").write_text(json.dumps(result, indent=1))

    # 5. the short table
    print(f"\nsm90 W4A16 gemv on {env.get('gpu', 'CPU selftest')}; copy BW "
          f"{result.get('copy_bw_tbps', float('nan')):.2f} TB/s; numerics {len(num_cases) - n_fail}/{len(num_cases)} ok")
    print(f"{'case':28s} {'us':>8s} {'bf16 us':>8s} {'x bf16':>7s} {'%copyBW':>8s} {'%roof':>6s}  config")
    for name, r in result["timing"].items():
        if "error" in r:
            print(f"{name:28s} ERROR {r['error'][:80]}")
            continue
        print(f"{name:28s} {r['us']:8.2f} {r['bf16_us']:8.2f} {r['speedup']:7.2f} {r['pct_copy_bw']:8.1f} "
              f"{r['pct_roofline']:6.1f}  {r['config'].replace('nvgemm_cutedsl_sm90_w4a16_', '')}")
    print(f"wall {result['wall_s']} s; JSON: {out_dir / 'gpu_check_sm90.json'}")
    return 1 if n_fail else 0


if __name__ == "__main__":
    raise SystemExit(main())
