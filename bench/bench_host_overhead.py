"""Host (Python) cost of one decode call of nvgemm's ops, side by side with an empty custom op, on CPU.

Measures, interleaved in one process (rounds alternate between the cases, so load on the machine hits all
of them alike), the wall time per call of:

* ``empty_custom_op``: a ``torch.library.custom_op`` with ``nvgemm::nvfp4_linear``'s schema whose body only
  allocates the output -- the dispatcher's own floor for an op of this signature;
* ``empty_custom_op_1arg``: the same with one tensor argument (for reference);
* ``empty_custom_op_requant``: an empty op with ``nvgemm::nvfp4_linear_requant``'s schema (two outputs,
  both allocated): the dispatcher's floor for the fused requant op;
* ``F.linear``: fp32 ``torch.nn.functional.linear`` of a [1, 64] x [64, 64] problem (reference: a computing
  op's floor);
* ``nvfp4_linear[null]``: ``torch.ops.nvgemm.nvfp4_linear`` with a null backend (allocates the output,
  launches nothing): the op's own Python -- call key, plan, scale checks, backend run;
* ``nvfp4_linear[sm100 host]`` / ``nvfp4_linear_requant[sm100 host]`` / ``nvfp4_linear[sm90 host]``: the op
  plus the production host path of ``cutedsl_sm100`` / ``cutedsl_sm90`` on a stand-in device
  (:func:`nvgemm.testing.host_path_stand_in`: per-problem plan, argument preparation, derived operands,
  ``AotKernel`` argument packing; the kernel launch itself and the Triton quantizer's launch are not run);
* ``quantize launch[JITFunction.run]`` / ``quantize launch[pre-bound]``: the Triton activation quantizer's launch
  of an [M, K] problem alone, as ``quantize_nvfp4_kernel[grid](...)`` (Triton's ``JITFunction.run``: binder,
  specialization, cache key and lookup, launch metadata, launcher) and as the quantizer's pre-bound launch
  (:class:`nvgemm.templates.triton.prebound.PreboundLaunch`), on a stand-in sm_100 driver
  (:func:`nvgemm.testing.triton_recording_driver`, recording off): Triton's real Python launch path up to the
  driver's ``launch`` entry; the C launcher behind it (``cuLaunchKernelEx``) is not run.

Tensors are CPU tensors (no GPU here): the host scales' per-call value checks run (on a GPU they are
skipped for device-resident scales), the rest is the code a GPU call runs. Reports the median over
``--rounds`` of the mean per call over ``--iters`` calls, and each op case's ratio to ``empty_custom_op``.

    python bench/bench_host_overhead.py --json bench/results/host_overhead_cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import shlex
import statistics
import sys
import time
from typing import Optional

import torch
import torch.nn.functional as F


@torch.library.custom_op("nvgemm_bench::empty_linear", mutates_args=())
def empty_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
    activation: str = "none",
    out_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    return torch.empty((x.shape[0], weight.shape[0]), dtype=out_dtype or x.dtype)


@torch.library.custom_op("nvgemm_bench::empty_requant", mutates_args=())
def empty_requant(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    out_input_scale: torch.Tensor,
    out_dtype: Optional[torch.dtype] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    m, i = x.shape[0], weight.shape[0] // 2
    return (torch.empty((m, i // 2), dtype=torch.uint8),
            torch.empty(((m + 127) // 128 * 128) * ((i // 16 + 3) // 4 * 4), dtype=torch.float8_e4m3fn))


@torch.library.custom_op("nvgemm_bench::empty_1arg", mutates_args=())
def empty_1arg(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _time(fn, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


def _triton_quantize_cases(m: int, k: int, x: torch.Tensor) -> dict:
    """The quantizer's launch through ``JITFunction.run`` and pre-bound (empty without a compiled-mode Triton)."""
    try:
        from nvgemm.templates.triton import quantize as tq
        from nvgemm.templates.triton.prebound import PreboundLaunch, prebindable
    except ImportError:
        return {}
    kernel = tq.quantize_nvfp4_kernel
    if not prebindable(kernel):
        return {}
    gs = torch.ones(1)
    packed = torch.empty(m, k // 2, dtype=torch.uint8)
    sf = torch.empty(((m + 127) // 128 * 128) * ((k // 16 + 3) // 4 * 4), dtype=torch.uint8)
    bm, bk, nw = tq.quantize_config(m, k, True, False)
    grid = (-(-((m + 127) // 128 * 128) // bm), -(-((k // 16 + 3) // 4 * 64) // bk))
    opts = dict(SWIZZLE=True, USE_GDC=True, BLOCK_M=bm, BLOCK_K=bk, num_warps=nw, launch_pdl=True,
                enable_fp_fusion=False)
    bound = PreboundLaunch(kernel, grid, (None, None, None, None, m, k, x.stride(0), packed.stride(0)), (0, 1, 2, 3),
                           opts)
    return {
        "quantize launch[JITFunction.run]": lambda: kernel[grid](x, gs, packed, sf, m, k, x.stride(0),
                                                                 packed.stride(0), **opts),
        "quantize launch[pre-bound]": lambda: bound(x, gs, packed, sf),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, default=1, help="tokens (decode: 1)")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=2000, help="calls per round and case")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", metavar="PATH", help="write the results here")
    ap.add_argument("--only", metavar="TEXT", action="append",
                    help="run only the cases whose name contains TEXT (repeatable; empty_custom_op, the ratios' "
                         "floor, always runs)")
    args = ap.parse_args(argv)

    import nvgemm  # noqa: F401  (registers the ops)
    from nvgemm import settings
    from nvgemm.core.formats import quantize_weight, to_blocked
    from nvgemm.dispatch import registry as B
    from nvgemm.testing import host_path_stand_in

    m, n, k = args.m, args.n, args.k
    g = torch.Generator().manual_seed(0)
    q = quantize_weight(torch.randn(n, k, generator=g) * 0.05)
    w, s, ws2 = q.packed, to_blocked(q.scale), q.global_scale.reshape(()).float()
    ins, next_ins = torch.tensor(0.01), torch.tensor(0.02)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    xb = torch.randn(1, 64, generator=g)  # F.linear: a tiny fp32 problem (the dispatch floor of a computing op)
    wb = torch.randn(64, 64, generator=g)

    def null_run(x, weight, *_a):
        return torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype)

    cases = {
        "empty_custom_op": lambda: torch.ops.nvgemm_bench.empty_linear(x, w, s, ws2, ins, None, None, "none", None),
        "empty_custom_op_1arg": lambda: torch.ops.nvgemm_bench.empty_1arg(x),
        "empty_custom_op_requant": lambda: torch.ops.nvgemm_bench.empty_requant(x, w, s, ws2, ins, None, next_ins,
                                                                                 None),
        "F.linear": lambda: F.linear(xb, wb),
        "nvfp4_linear[null]": lambda: torch.ops.nvgemm.nvfp4_linear(x, w, s, ws2, ins, None, None, "none", None),
    }
    host_cases = {
        "nvfp4_linear[sm100 host]": ("sm100", lambda: torch.ops.nvgemm.nvfp4_linear(x, w, s, ws2, ins, None, None,
                                                                                   "none", None)),
        "nvfp4_linear_requant[sm100 host]": ("sm100", lambda: torch.ops.nvgemm.nvfp4_linear_requant(
            x, w, s, ws2, ins, None, next_ins, None)),
        "nvfp4_linear[sm90 host]": ("sm90", lambda: torch.ops.nvgemm.nvfp4_linear(x, w, s, ws2, None, None, None,
                                                                                 "none", None)),
    }
    triton_cases = _triton_quantize_cases(m, k, x)
    if args.only:
        def keep(d):
            return {n: v for n, v in d.items() if n == "empty_custom_op" or any(t in n for t in args.only)}
        cases, host_cases, triton_cases = keep(cases), keep(host_cases), keep(triton_cases)
    times: dict[str, list[float]] = {name: [] for name in [*cases, *host_cases, *triton_cases]}
    null = B.Backend(name="bench_null", priority=10**9, supports=lambda p: None, run=null_run)
    triton_driver = None
    with settings.override(NVGEMM_SELFCHECK=False), contextlib.ExitStack() as stack:
        for _ in range(args.rounds):
            B.register_backend(null)
            try:
                for name, fn in cases.items():
                    fn()
                    times[name].append(_time(fn, args.iters))
            finally:
                B.unregister_backend("bench_null")
            for name, (family, fn) in host_cases.items():
                with host_path_stand_in(family, record_ops=False):
                    fn()
                    times[name].append(_time(fn, args.iters))
            if triton_cases:
                from nvgemm.testing import triton_recording_driver

                # one stand-in driver for every round (a pre-bound launch is tied to the driver it captured on)
                if triton_driver is None:
                    triton_driver = stack.enter_context(triton_recording_driver(record=False))
                for name, fn in triton_cases.items():
                    fn()
                    times[name].append(_time(fn, args.iters))

    floor = statistics.median(times["empty_custom_op"])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append(dict(case=name, us_per_call=round(med, 2), min_us=round(min(ts), 2), max_us=round(max(ts), 2),
                         ratio_to_empty_custom_op=round(med / floor, 2)))
        if name.startswith("nvfp4_linear_requant") and "empty_custom_op_requant" in times:
            rows[-1]["ratio_to_empty_requant_op"] = round(med / statistics.median(times["empty_custom_op_requant"]), 2)
    print(f"host cost per call, CPU ({platform.processor() or platform.machine()}), M={m} N={n} K={k}, "
          f"median of {args.rounds} rounds x {args.iters} calls (measured on this CPU, not a GPU host)")
    print(f"{'case':36s} {'us/call':>9s} {'min':>8s} {'max':>8s} {'x empty op':>11s}")
    for r in rows:
        other = (f"  ({r['ratio_to_empty_requant_op']:.2f}x the empty requant-schema op)"
                 if "ratio_to_empty_requant_op" in r else "")
        print(f"{r['case']:36s} {r['us_per_call']:9.2f} {r['min_us']:8.2f} {r['max_us']:8.2f} "
              f"{r['ratio_to_empty_custom_op']:11.2f}{other}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(command="python bench/bench_host_overhead.py " + shlex.join(sys.argv[1:] if argv is None
                                                                                      else argv),
                           torch=torch.__version__, python=platform.python_version(), machine=platform.machine(),
                           m=m, n=n, k=k, iters=args.iters, rounds=args.rounds, rows=rows), f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
