"""Decode-step benchmark: eager vs torch.compile(max-autotune) without nvgemm vs with nvgemm.

One decode step of ``nvgemm.integrations.inductor.demo.TinyNvfp4Llama`` (q/k/v/o/gate/up/down NVFP4, KV cache
of ``--cache-len`` tokens) per sequence, over several batch sizes served by ONE compiled graph
(dynamic batch). For each mode it reports:

* ``ttft_cold_s``: process-local time from a built model to the first decode step's output,
  including Dynamo/Inductor compilation and nvgemm autotuning, with an empty Inductor cache;
* ``ttft_warm_s``: the same in a second process reusing that cache dir (FX-graph cache and the
  on-disk autotune results);
* ``step_ms[B]``: median wall time of a decode step at batch B after warm-up (CUDA: events
  around the step, synchronised).

Each (mode, cold/warm) runs in its own subprocess so in-memory caches never leak between them.

CPU (``--device cpu``, the default): the tiny model; nvgemm's only CPU candidate is the emulated
reference, so this measures integration overheads, not kernels.
GPU (``--device cuda --preset llama8b``): Llama-3-8B-shaped layers (hidden 4096, intermediate
14336, 32/8 heads), ``--layers`` of them; the nvgemm candidates are whatever kernel backends are
registered for the device, plus cuBLASLt on sm_100 and the emulated op.

Example:
    python bench/bench_decode_step.py --device cpu --batches 1,8 --steps 10
    python bench/bench_decode_step.py --device cuda --preset llama8b --layers 2 --batches 2,8,32,128
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

PRESETS = {
    "tiny": dict(vocab=256, hidden=128, intermediate=256, heads=4, kv_heads=2, cache_len=8),
    "llama8b": dict(vocab=32000, hidden=4096, intermediate=14336, heads=32, kv_heads=8, cache_len=512),
}
MODES = ("eager", "compile", "compile+nvgemm")


def _child(args) -> dict:
    import torch

    import nvgemm
    from nvgemm.integrations.inductor.demo import TinyLlamaConfig, TinyNvfp4Llama

    dev = torch.device(args.device)
    if dev.type == "cpu":
        torch.set_num_threads(args.threads)  # fewer OpenMP threads than cores: less noise on a shared box
    cfg = TinyLlamaConfig(layers=args.layers, **PRESETS[args.preset])
    model = TinyNvfp4Llama(cfg, seed=0).to(dev)
    batches = [int(b) for b in args.batches.split(",")]

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def inputs(b):
        ids = (torch.arange(b) * 37 + 5) % cfg.vocab
        k, v = model.make_cache(b)
        ids, k, v = ids.to(dev), k.to(dev), v.to(dev)
        if args.mode != "eager":
            if args.dynamic == "unbacked":
                torch._dynamo.decorators.mark_unbacked(ids, 0, min=1, max=256)
                torch._dynamo.decorators.mark_unbacked(k, 1, min=1, max=256)
                torch._dynamo.decorators.mark_unbacked(v, 1, min=1, max=256)
            else:
                for t, d in ((ids, 0), (k, 1), (v, 1)):
                    torch._dynamo.mark_dynamic(t, d, min=2, max=256)
        return ids, k, v

    patches = {}
    if dev.type == "cpu":
        # As in tests/cpu/test_inductor_llama.py: skip the C++ GEMM template for the bf16 lm_head.
        patches["max_autotune_gemm_backends"] = "ATEN"
    fn = model
    if args.mode != "eager":
        if args.mode == "compile+nvgemm":
            nvgemm.enable()
        torch._inductor.config.patch(patches).__enter__()
        fn = torch.compile(model, mode="max-autotune", fullgraph=True)

    first = inputs(batches[0])
    sync()
    t0 = time.perf_counter()
    with torch.no_grad():
        fn(*first)
    sync()
    ttft = time.perf_counter() - t0

    step_ms = {}
    with torch.no_grad():
        for b in batches:
            x = inputs(b)
            for _ in range(args.warmup):
                fn(*x)
            times = []
            for _ in range(args.steps):
                sync()
                t = time.perf_counter()
                fn(*x)
                sync()
                times.append((time.perf_counter() - t) * 1e3)
            step_ms[b] = statistics.median(times)
    from torch._dynamo.utils import counters

    return {"ttft_s": ttft, "step_ms": step_ms, "graphs": counters["stats"]["unique_graphs"],
            "nvgemm_linears": counters["nvgemm_cutedsl"]["nvfp4_linear_captured"]}


def _run(args, mode: str, cache_dir: str) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir, TRITON_CACHE_DIR=os.path.join(cache_dir, "triton"))
    if args.device == "cpu":
        env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # no compile-worker pool competing with the timed steps
    cmd = [sys.executable, __file__, "--child", "--mode", mode, "--device", args.device, "--preset", args.preset,
           "--layers", str(args.layers), "--batches", args.batches, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--dynamic", args.dynamic, "--threads", str(args.threads)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _versions() -> str:
    import torch

    try:
        import triton

        tv = triton.__version__
    except ImportError:
        tv = "-"
    dev = "cpu: " + (platform.processor() or platform.machine()) + f", {os.cpu_count()} cores"
    if torch.cuda.is_available():
        dev = torch.cuda.get_device_name()
    return f"torch {torch.__version__}, triton {tv}, python {platform.python_version()}, {dev}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--threads", type=int, default=1, help="CPU: torch.set_num_threads in each run")
    ap.add_argument("--dynamic", default=None, choices=("unbacked", "backed"),
                    help="how the batch dim is marked dynamic (default: unbacked on CPU, backed on CUDA, "
                         "where nvgemm autotunes per M range)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="eager", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.dynamic is None:
        args.dynamic = "unbacked" if args.device == "cpu" else "backed"
    if args.child:
        print(json.dumps(_child(args)))
        return 0

    rows = []
    load0 = os.getloadavg()
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory(prefix="nvgemm_bench_") as cache:
            cold = _run(args, mode, cache)
            warm = _run(args, mode, cache) if mode != "eager" else None
        rows.append((mode, cold, warm))
        print(f"{mode}: {json.dumps({'cold': cold, 'warm': warm})}", file=sys.stderr)

    batches = [int(b) for b in args.batches.split(",")]
    print(f"# decode step, {args.preset} x {args.layers} layer(s), device {args.device}, dynamic batch ({args.dynamic})")
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {_versions()}; "
          f"load average at start {load0[0]:.2f}, at end {os.getloadavg()[0]:.2f}")
    print("# command: python " + " ".join([os.path.relpath(__file__)] + (argv if argv is not None else sys.argv[1:])))
    print()
    head = "| mode | TTFT cold (s) | TTFT warm cache (s) | " + " | ".join(f"step B={b} (ms)" for b in batches) + \
        " | graphs | nvgemm linears |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for mode, cold, warm in rows:
        steps = " | ".join(f"{cold['step_ms'][str(b)]:.2f}" for b in batches)
        w = f"{warm['ttft_s']:.2f}" if warm else "-"
        print(f"| {mode} | {cold['ttft_s']:.2f} | {w} | {steps} | {cold['graphs']} | {cold['nvgemm_linears']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
