"""The single H200 check of the sm90 NVFP4 W4A16 kernels: numerics + timing, without cutlass-dsl.

Here (no GPU):      python bench/build_sm90_artifacts.py            # -> build/sm90_gpu_check/
On the H200:        PYTHONUNBUFFERED=1 python3 bench/gpu_check.py --artifacts build/sm90_gpu_check --out $OUT
                    (device tool: carry ["build/sm90_gpu_check"]; ~5-7 minutes, --only to subset)
CPU self-test:      python bench/gpu_check.py --cpu-selftest        # the glue, with the kernel emulated

Steps (METHOD.md): 1. load the precompiled kernels (``kernel.so`` via nvgemm's ctypes AOT loader;
cutlass is never imported, and the script says whether it is even installed); 2. numerics of every
manifest case against the emulated op (``nvgemm.ops.linear.nvfp4_linear_emulated``) on fresh random inputs,
outputs poisoned with NaN before each launch, each case launched twice (split-K counters must come
back to zero); 3. device-to-device copy bandwidth, measured once (bytes read + written: the
copy-kernel baseline); 4. timing, cold L2: CUDA graphs over rotating prepared-weight copies (>= 256
MB per graph so L2 cannot serve them), median of many replays, for every family / variant case
(the policy's pick on the 8 Llama shapes at M = 1..256 and timed alternatives: the decode kernel's
tiles, warps, ring depth, split-K and PDL off at M <= 32; the register-A WGMMA kernel's tokens and
rows per CTA, stage shapes, split-K and PDL off at M = 32..256) and for bf16 cuBLAS
(``torch.matmul``) on the same shape;
4b. the grouped MoE cases (``bench/sm90_moe_suite.py``; ``--only moe``): numerics of the whole layer
(work list + both grouped GEMMs + finalize) against the emulated ``nvfp4_moe`` (relative L2 <= 2**-6,
the MoE registry's self-check tolerance), bitwise determinism over two runs and batch invariance (token
0 alone == its row in the batch, same configs); timing of the whole layer in one CUDA graph over 16
different random routings (cold experts), against the weight-byte floor of the routed experts at the
copy bandwidth and the model (``nvgemm.templates.sm90_moe.policy.layer_model``);
5. the performance model's prediction for every timed case (``nvgemm.heuristics.perfmodel``, pure Python) next
to the measurement; one table (us, modelled us, speed-up vs bf16, weight bandwidth as % of the copy
bandwidth and of 4.3 TB/s) and JSON under ``--out``.

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
    from nvgemm.core.formats import to_blocked

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
    return dict(x=x, weight=packed, weight_scale=to_blocked(scale), weight_scale_2=ws2.float(),
                input_scale=input_scale, bias=bias, residual=res, activation=case.activation,
                out_dtype=case.torch_out_dtype if case.out_dtype != case.x_dtype else None)


def error_bound(case, lay, prepared, ref):
    """Elementwise bound on |kernel - emulated| (see the module docstring)."""
    from nvgemm.templates.sm90_w4a16.operand import dequant_ref

    w = dequant_ref(prepared)  # E2M1 * s (no global scale), exact
    x = lay["x"].float()
    if lay["input_scale"] is not None:
        from nvgemm.templates.sm90_w4a16.launch import qdq_activation

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


def load_entry(artifacts: Path, e: dict, loaded: dict, what: str):
    """The ``AotKernel`` of manifest entry ``e`` (memoized in ``loaded``), through the cache's own
    verified read (checksums of meta.json and kernel.so)."""
    if e["status"] == "failed" or not e["entry"]:
        raise RuntimeError(f"{what}: its kernel failed to build ({e['spec_name']})")
    d = artifacts / e["entry"]
    if d not in loaded:
        from nvgemm.aot.artifact import AotKernel
        from nvgemm.aot.cache import KernelCache
        from nvgemm.aot.abi import abi_from_json

        meta = KernelCache(artifacts).read_entry(d, e["key"], Path(e["entry"]).parts[0])
        loaded[d] = AotKernel(d / "kernel.so", abi_from_json(meta["abi"]), name=e["spec_name"])
    return loaded[d]


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
        from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config

        if self.cpu:
            from nvgemm.templates.sm90_w4a16.backend import pick_config

            if case.config is not None:
                return Sm90W4A16Config(**case.config)
            return pick_config(case.m, case.n, case.k, case.torch_x_dtype, case.activation, 132)
        return Sm90W4A16Config(**self.manifest[case.name]["config"])

    def kernel(self, case):
        if self.cpu:
            return None
        return load_entry(self.artifacts, self.manifest[case.name], self.kernels, case.name)

    def launch(self, case, args, kernel, stream=None):
        if self.cpu:
            from nvgemm.templates.sm90_w4a16.launch import kernel_view_ref

            args.out.copy_(kernel_view_ref(args, self.config(case)))
            return args.out
        from nvgemm.templates.sm90_w4a16.launch import launch_sm90

        return launch_sm90(args, kernel, stream or torch.cuda.current_stream())


# ------------------------------------------------------------------------------- steps


def check_numerics(case, runner, dev, gen):
    from nvgemm.ops.linear import nvfp4_linear_emulated
    from nvgemm.templates.sm90_w4a16.launch import prepare_sm90_args
    from nvgemm.templates.sm90_w4a16.operand import kind_of, prepare_sm90_weight

    lay = random_layer(case, dev, gen)
    prepared = prepare_sm90_weight(lay["weight"], lay["weight_scale"], lay["weight_scale_2"], kind_of(lay["x"].dtype))
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
_WEIGHT_COPIES: dict = {}


def model_of(case, cfg, sms):
    """The performance model's (low, high) microseconds for this case and bf16 cuBLAS (pure Python)."""
    try:
        from nvgemm.heuristics.perfmodel import bf16_baseline, estimate

        e = estimate(cfg, case.m, case.n, case.k, "H200", sms)
        b = bf16_baseline(case.m, case.n, case.k, "H200", sms)
        return (list(e.total_us) if e is not None else None), list(b.total_us)
    except Exception as exc:  # noqa: BLE001  (the model is advisory here)
        return None, f"{type(exc).__name__}: {exc}"


def time_case(case, runner, dev, gen, copy_bw):
    import dataclasses as dc

    from nvgemm.templates.sm90_w4a16.launch import Sm90Workspace, prepare_sm90_args
    from nvgemm.templates.sm90_w4a16.operand import kind_of, prepare_sm90_weight

    lay = random_layer(case, dev, gen)
    cfg = runner.config(case)
    kern = runner.kernel(case)
    # rotating prepared-weight copies, shared by every timed case of the shape (values do not
    # matter for timing; preparing a 57344 x 8192 weight costs more than timing it)
    wkey = (case.n, case.k, case.x_dtype)
    if wkey not in _WEIGHT_COPIES:
        _WEIGHT_COPIES.clear()
        prepared = prepare_sm90_weight(lay["weight"], lay["weight_scale"], lay["weight_scale_2"],
                                       kind_of(lay["x"].dtype))
        copies = max(2, math.ceil(ROTATE_BYTES / prepared.nbytes()))
        _WEIGHT_COPIES[wkey] = [prepared] + [dc.replace(prepared, weight=prepared.weight.clone(),
                                                        scale=prepared.scale.clone()) for _ in range(copies - 1)]
    ws = _WEIGHT_COPIES[wkey]
    wbytes, copies = ws[0].nbytes(), len(ws)
    work = Sm90Workspace(dev)  # one workspace for the whole graph (the launches are serialised)
    argss = [prepare_sm90_args(lay["x"], w, None, None, None, "none", None, cfg, workspace=work) for w in ws]
    t_k, graph_k, spread_k = time_graph([lambda a=a: runner.launch(case, a, kern) for a in argss])
    del argss
    # bf16 cuBLAS on the same shape, rotating bf16 weights (once per shape and M)
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
    model, model_bf16 = model_of(case, cfg, torch.cuda.get_device_properties(dev).multi_processor_count)
    return dict(
        config=cfg.name(), us=t_k * 1e6, bf16_us=t_b * 1e6, speedup=t_b / t_k,
        weight_tbps=wbytes / t_k / 1e12, pct_copy_bw=100 * wbytes / t_k / copy_bw,
        pct_4_3=100 * wbytes / t_k / 4.3e12,
        roofline_us=all_bytes / copy_bw * 1e6, pct_roofline=100 * (all_bytes / copy_bw) / t_k,
        bf16_pct_copy_bw=100 * case.n * case.k * 2 / t_b / copy_bw,
        model_us=model, model_bf16_us=model_bf16,
        copies=copies, graph=graph_k and graph_b, spread=max(spread_k, spread_b),
    )


# ------------------------------------------------------------------------------- grouped MoE


def _load_moe_suite():
    spec = importlib.util.spec_from_file_location("sm90_moe_suite", ROOT / "bench" / "sm90_moe_suite.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sm90_moe_suite"] = mod
    spec.loader.exec_module(mod)
    return mod


class MoeRunner:
    """Grouped-MoE kernels by compile-spec name: the manifest's AOT entries on the GPU, the PTX
    emulator (real AOT artifacts, needs cutlass-dsl) in the CPU self-test."""

    def __init__(self, artifacts: Path, cpu_selftest: bool):
        self.cpu = cpu_selftest
        self.artifacts = artifacts
        self.by_name = {}
        self.kernels = {}
        if not cpu_selftest:
            man = json.loads((artifacts / "manifest.json").read_text())
            for e in man.get("moe_entries", []):
                for k in e["kernels"]:
                    self.by_name[k["spec_name"]] = k

    def launcher(self, stream=None):
        from nvgemm.aot.compile_spec import make_spec
        from nvgemm.aot.abi import HardwareSpec
        from nvgemm.templates.sm90_w4a16.operand import kind_of

        def launch(args):
            spec = make_spec("sm90_moe_mma", args.config, "sm_90a", epilogue=args.spec, hw=HardwareSpec(sm_count=132),
                             a_format=kind_of(args.x.dtype), b_format="nvfp4", environ={})
            if self.cpu:
                from nvgemm.emulator.runner import prepare

                prepare(spec).launch(*args.abi_values(), 0)
                return
            e = self.by_name.get(spec.name())
            if e is None:
                raise RuntimeError(f"no built kernel for {spec.name()} (rebuild the artifacts)")
            load_entry(self.artifacts, e, self.kernels, spec.name()).launch(*args.abi_values(),
                                                                             stream or torch.cuda.current_stream())

        return launch


def moe_layer(case, dev, gen, cpu_selftest):
    """Random W4A16 expert stacks of the case's preset (tiny stand-ins in the CPU self-test)."""
    from nvgemm.core.formats import blocked_numel
    from nvgemm.templates.sm90_moe.policy import get_moe_layer

    if cpu_selftest:
        e, k, h, i = 4, 2, 64, 32
    else:
        s = get_moe_layer(case.preset)
        e, k, h, i = s.num_experts, s.top_k, s.hidden, s.inter
    xdt = torch.float16 if case.x_dtype == "fp16" else torch.bfloat16

    def stack(rows, kk):
        w = torch.randint(0, 256, (e, rows, kk // 2), device=dev, generator=gen, dtype=torch.uint8)
        sc = torch.pow(2.0, torch.randint(-3, 2, (e, blocked_numel(rows, kk // 16)), device=dev, generator=gen).float())
        return w, sc.to(torch.float8_e4m3fn)

    w13, s13 = stack(2 * i, h)
    w2, s2 = stack(h, i)
    g13 = torch.rand(e, device=dev, generator=gen) * 0.01 + 0.005
    if case.alpha13 == "row":
        g13 = g13[:, None] * torch.linspace(0.5, 2.0, 2 * i, device=dev)
    g2 = torch.rand(e, device=dev, generator=gen) * 0.01 + 0.005
    m = min(case.m, 8) if cpu_selftest else case.m
    x = torch.randn(m, h, device=dev, generator=gen).to(xdt)
    ids = torch.stack([torch.randperm(e, device=dev, generator=gen)[:k] for _ in range(m)]).to(torch.int32)
    if m * k > 2:
        ids.view(-1)[1] = -1
    wts = torch.rand(m, k, device=dev, generator=gen)
    sh = torch.randn(m, h, device=dev, generator=gen).to(xdt) if case.extras else None
    res = torch.randn(m, h, device=dev, generator=gen).to(xdt) if case.extras else None
    return [x, ids, wts, w13, s13, g13, None, w2, s2, g2, None, "silu_mul", False, None, sh, res, None]


def _moe_run(ops, configs, launch):
    from nvgemm.templates.sm90_moe.launch import moe_forward

    x, ids, wts, w13, s13, g13, _, w2, s2, g2, _, act, rwi, emap, sh, res, odt = ops
    return moe_forward(x, ids, emap, wts, w13, s13, g13, w2, s2, g2, act, rwi, sh, res, odt, configs[0],
                       configs[1], launch)


def check_moe_numerics(case, msuite, runner, dev, gen, cpu_selftest):
    from nvgemm.ops.moe import nvfp4_moe_emulated

    ops = moe_layer(case, dev, gen, cpu_selftest)
    configs = msuite.case_configs(case)
    if cpu_selftest:  # the tiny stand-in has fewer K stages than a real layer: no deeper split than it has
        from nvgemm.templates.sm90_moe.config import moe_shape_problem

        h, i = ops[0].shape[1], ops[7].shape[2] * 2
        configs = tuple(dataclasses.replace(c, split_k=1) if moe_shape_problem(c, r, kk, g) else c
                        for c, r, kk, g in ((configs[0], 2 * i, h, True), (configs[1], h, i, False)))
    launch = runner.launcher()
    a = _moe_run(ops, configs, launch)
    b = _moe_run(ops, configs, launch)
    ref = nvfp4_moe_emulated(*ops)
    if not torch.isfinite(a).all():
        return dict(ok=False, why="non-finite outputs")
    if not torch.equal(a, b):
        return dict(ok=False, why="two runs differ (not deterministic)")
    rel = ((a.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()
    one = list(ops)
    one[0], one[1], one[2] = ops[0][:1], ops[1][:1], ops[2][:1]
    for j in (14, 15):
        one[j] = None if ops[j] is None else ops[j][:1]
    inv = torch.equal(_moe_run(one, configs, launch)[0], a[0])
    ok = rel <= 2.0**-6 and inv
    return dict(ok=ok, rel_l2=rel, batch_invariant=inv, configs=[c.name() for c in configs],
                **({} if ok else {"why": f"rel_l2 {rel:.3g} > 2**-6" if rel > 2.0**-6 else "batch variance"}))


def time_moe_case(case, msuite, runner, dev, gen, copy_bw):
    from nvgemm.templates.sm90_moe.policy import get_moe_layer, layer_model

    ops = moe_layer(case, dev, gen, False)
    configs = msuite.case_configs(case)
    launch = runner.launcher()
    s = get_moe_layer(case.preset)
    routings = []
    for _ in range(16):  # different experts per call: the weights come from DRAM, not L2
        o = list(ops)
        o[1] = torch.stack([torch.randperm(s.num_experts, device=dev, generator=gen)[:s.top_k]
                            for _ in range(case.m)]).to(torch.int32)
        routings.append(o)
    active = sum(len(torch.unique(o[1])) for o in routings) / len(routings)
    t, graph, spread = time_graph([lambda o=o: _moe_run(o, configs, launch) for o in routings])
    per_expert = 3 * s.hidden * s.inter * 0.5625
    floor_us = active * per_expert / copy_bw * 1e6  # the routed experts' weight bytes at the copy bandwidth
    mod = layer_model(s, case.m, "H200")
    return dict(us=t * 1e6, active_experts=active, floor_us=floor_us, pct_floor=100 * floor_us / (t * 1e6),
                model_total_us=list(mod.get("total_us", ())), model_gemm_us=list(mod.get("gemm_us", ())),
                configs=[c.name() for c in configs], graph=graph, spread=spread)


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
        from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config, shape_problem

        small = [dataclasses.replace(c, n=min(c.n, 256), k=min(c.k, 512 if c.k % 512 == 0 else c.k % 512 + 512),
                                     m=min(c.m, 8))
                 for c in cases if c.name.endswith(".m1") or not c.timed]
        cases = [c for c in small if c.config is None or not shape_problem(
            Sm90W4A16Config(**c.config), c.m, c.n, c.k, c.activation == "silu_mul")]
        print(f"cpu selftest: {len(cases)} small stand-in cases ({len(small) - len(cases)} forced configs that "
              "cannot run the shrunk shape skipped)", flush=True)

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
            # partial results survive a device-time limit that ends the run early
            (out_dir / "gpu_check_sm90.json").write_text(json.dumps(result, indent=1))
    # 4b. grouped MoE cases
    msuite = _load_moe_suite()
    mcases = [c for c in msuite.moe_cases() if args.only in c.name]
    if args.cpu_selftest:  # the grouped kernels run on the PTX emulator: needs cutlass-dsl to build them
        mcases = [c for c in mcases if not c.timed][:3] if importlib.util.find_spec("cutlass") else []
        print(f"cpu selftest: {len(mcases)} grouped-MoE cases on the PTX emulator", flush=True)
    mrunner = MoeRunner(Path(args.artifacts), args.cpu_selftest)
    result["moe_numerics"], result["moe_timing"] = {}, {}
    for c in [c for c in mcases if not c.timed or c.m in (1, 16)]:
        try:
            r = check_moe_numerics(c, msuite, mrunner, dev, gen, args.cpu_selftest)
        except Exception as e:  # noqa: BLE001
            r = dict(ok=False, why=f"{type(e).__name__}: {e}")
        result["moe_numerics"][c.name] = r
        n_fail += not r["ok"]
        print(f"numerics {c.name:32s} {'ok ' if r['ok'] else 'FAIL'} {r.get('rel_l2', r.get('why', ''))}", flush=True)
    if not args.cpu_selftest and not args.no_timing:
        for c in [c for c in mcases if c.timed]:
            try:
                r = time_moe_case(c, msuite, mrunner, dev, gen, result["copy_bw_tbps"] * 1e12)
            except Exception as e:  # noqa: BLE001
                r = dict(error=f"{type(e).__name__}: {e}")
            result["moe_timing"][c.name] = r
            print(f"time {c.name:32s} {json.dumps(r)}", flush=True)
            (out_dir / "gpu_check_sm90.json").write_text(json.dumps(result, indent=1))
    result["wall_s"] = round(time.time() - t_start, 1)
    (out_dir / "gpu_check_sm90.json").write_text(json.dumps(result, indent=1))

    # 5. the short table
    print(f"\nsm90 W4A16 on {env.get('gpu', 'CPU selftest')}; copy BW "
          f"{result.get('copy_bw_tbps', float('nan')):.2f} TB/s; numerics {len(num_cases) - n_fail}/{len(num_cases)} ok")
    print(f"{'case':34s} {'us':>8s} {'model us':>13s} {'bf16 us':>8s} {'x bf16':>7s} {'%4.3TB/s':>8s} {'%copyBW':>8s}"
          f"  config")
    for name, r in result["timing"].items():
        if "error" in r:
            print(f"{name:34s} ERROR {r['error'][:80]}")
            continue
        mod = r.get("model_us")
        mtxt = f"{mod[0]:5.1f}-{mod[1]:5.1f}" if isinstance(mod, list) else "-"
        print(f"{name:34s} {r['us']:8.2f} {mtxt:>13s} {r['bf16_us']:8.2f} {r['speedup']:7.2f} {r['pct_4_3']:8.1f} "
              f"{r['pct_copy_bw']:8.1f}  {r['config'].replace('nvgemm_cutedsl_sm90_w4a16_', '')}")
    if result.get("moe_timing"):
        print(f"\n{'grouped MoE layer':34s} {'us':>8s} {'floor us':>9s} {'%floor':>7s} {'model us':>13s}  configs")
        for name, r in result["moe_timing"].items():
            if "error" in r:
                print(f"{name:34s} ERROR {r['error'][:80]}")
                continue
            mod = r.get("model_total_us") or [float("nan")] * 2
            print(f"{name:34s} {r['us']:8.2f} {r['floor_us']:9.2f} {r['pct_floor']:7.1f} {mod[0]:5.1f}-{mod[1]:5.1f}  "
                  f"{' + '.join(c.replace('nvgemm_cutedsl_sm90_moe_mma_', '') for c in r['configs'])}")
    print(f"wall {result['wall_s']} s; JSON: {out_dir / 'gpu_check_sm90.json'}")
    return 1 if n_fail else 0


if __name__ == "__main__":
    raise SystemExit(main())
