"""GPU throughput of nvgemm's Triton NVFP4 quantizers as a fraction of memory bandwidth.

    python bench/bench_quantizer.py [--m 1,16,128,1024,4096] [--k 4096,8192,14336] [--dtype bf16]
                                    [--kernels quantize,rmsnorm,add_rmsnorm,silu_mul] [--gemm]
                                    [--no-pdl] [--out bench/results/quantizer_<gpu>.md]

Model of the traffic (the issue's definition): read x once, write 0.5625 bytes per element
(0.5 for the E2M1 code + 1/16 for its e4m3 scale). Fused kernels add what they must read/write:
add+RMSNorm reads the residual and writes the new one; SiLU-mul reads gate and up (2 inputs per
output element). The swizzled scale padding (rows to 128) is written too but not counted, so for
small M the "useful" fraction is what the number means.

Denominator: the device-to-device copy bandwidth measured here (``clone`` of a 1 GiB tensor:
read + write), i.e. what a perfect streaming kernel reaches on this GPU, and the theoretical peak
where torch reports the memory clock and bus width. Timing: ``triton.testing.do_bench``
(median, L2 flushed between reps). The torch reference quantizer (``nvgemm.core.formats``) is timed
as a baseline. ``--gemm`` also times the W4A16 fallback GEMM against a bf16 ``torch.mm``.

CPU interpreter timing is not a benchmark: without a CUDA GPU this script says so and exits 2.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from pathlib import Path


def _ints(s: str) -> list[int]:
    return [int(v) for v in s.split(",") if v]


def copy_bandwidth(torch) -> float:
    """Achievable DRAM bandwidth (bytes/s) from a 1 GiB device-to-device clone."""
    import triton.testing

    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    ms = triton.testing.do_bench(lambda: x.clone(), warmup=10, rep=50, return_mode="median")
    return 2 * x.numel() / (ms * 1e-3)


def theoretical_bandwidth(torch) -> float | None:
    p = torch.cuda.get_device_properties(0)
    clock = getattr(p, "memory_clock_rate", None)  # kHz
    bus = getattr(p, "memory_bus_width", None)  # bits
    if not clock or not bus:
        return None
    return 2 * clock * 1e3 * bus / 8  # DDR


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", default="1,16,128,1024,4096")
    ap.add_argument("--k", default="4096,8192,14336")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--kernels", default="quantize,rmsnorm,add_rmsnorm,silu_mul")
    ap.add_argument("--gemm", action="store_true", help="also time the W4A16 fallback GEMM vs bf16 torch.mm")
    ap.add_argument("--no-pdl", action="store_true")
    ap.add_argument("--out", default=None, help="markdown results file (default bench/results/quantizer_<gpu>.md)")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("bench_quantizer: needs a CUDA GPU (found none). The Triton interpreter on CPU is a correctness "
              "tool, not a benchmark; no numbers were produced.")
        return 2
    import triton
    import triton.testing

    from nvgemm.core.formats import blocked_numel, quantize_activation, to_blocked
    from nvgemm.templates.triton.fused import (
        add_rmsnorm_quantize_nvfp4_triton,
        rmsnorm_quantize_nvfp4_triton,
        silu_mul_quantize_nvfp4_triton,
    )
    from nvgemm.templates.triton.quantize import quantize_nvfp4_triton

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    pdl = False if args.no_pdl else None
    gpu = torch.cuda.get_device_name(0)
    cap = torch.cuda.get_device_capability(0)
    bw_copy = copy_bandwidth(torch)
    bw_peak = theoretical_bandwidth(torch)
    gs = torch.tensor(0.01, device="cuda")
    xb = torch.empty((), dtype=dtype).element_size()

    def bench(fn) -> float:
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3

    rows = []
    for k in _ints(args.k):
        w = (torch.rand(k, device="cuda") + 0.5).to(dtype)
        for m in _ints(args.m):
            x = torch.randn(m, k, device="cuda").to(dtype)
            r = torch.randn(m, k, device="cuda").to(dtype)
            out_bytes = 0.5625 * m * k
            cases = {
                "quantize": (lambda: quantize_nvfp4_triton(x, gs, True, pdl=pdl), m * k * xb + out_bytes),
                "rmsnorm": (lambda: rmsnorm_quantize_nvfp4_triton(x, w, gs, 1e-6, True, pdl=pdl),
                            m * k * xb + k * xb + out_bytes),
                "add_rmsnorm": (lambda: add_rmsnorm_quantize_nvfp4_triton(x, r, w, gs, 1e-6, True, pdl=pdl),
                                3 * m * k * xb + k * xb + out_bytes),
                "silu_mul": (lambda: silu_mul_quantize_nvfp4_triton(x, gs, True, pdl=pdl),
                             m * k * xb + 0.5625 * m * (k // 2)),
            }
            for name in args.kernels.split(","):
                fn, nbytes = cases[name]
                fn()
                t = bench(fn)
                rows.append({"kernel": name, "m": m, "k": k, "us": t * 1e6, "GB/s": nbytes / t / 1e9,
                             "frac_copy": nbytes / t / bw_copy,
                             "frac_peak": nbytes / t / bw_peak if bw_peak else None,
                             "pad_bytes": blocked_numel(m, k // 16) - m * k // 16})
            t_ref = bench(lambda: to_blocked(quantize_activation(x, gs)[1]))
            rows.append({"kernel": "torch reference (formats)", "m": m, "k": k, "us": t_ref * 1e6,
                         "GB/s": (m * k * xb + out_bytes) / t_ref / 1e9,
                         "frac_copy": (m * k * xb + out_bytes) / t_ref / bw_copy, "frac_peak": None, "pad_bytes": 0})

    gemm_rows = []
    if args.gemm:
        from nvgemm.core.formats import quantize_weight
        from nvgemm.templates.triton.gemm_w4a16 import nvfp4_linear_triton

        for n, k in ((4096, 4096), (14336, 4096), (4096, 14336)):
            q = quantize_weight(torch.randn(n, k, device="cuda") * 0.02)
            ws = to_blocked(q.scale)
            wb = torch.randn(n, k, device="cuda").to(dtype)
            for m in (1, 8, 32, 128):
                x = torch.randn(m, k, device="cuda").to(dtype)
                t4 = bench(lambda: nvfp4_linear_triton(x, q.packed, ws, q.global_scale, pdl=pdl))
                t16 = bench(lambda: torch.mm(x, wb.t()))
                wbytes = n * k * 0.5625
                gemm_rows.append({"m": m, "n": n, "k": k, "w4a16_us": t4 * 1e6, "bf16_mm_us": t16 * 1e6,
                                  "w4a16_weight_GB/s": wbytes / t4 / 1e9})

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = [
        f"# nvgemm Triton quantizer throughput ({gpu}, sm_{cap[0]}{cap[1]})",
        "",
        f"- date: {stamp}; python {platform.python_version()}, torch {torch.__version__}, triton {triton.__version__}",
        f"- command: `python {' '.join(sys.argv)}`",
        f"- dtype {args.dtype}; PDL {'off' if args.no_pdl else 'default (on for sm_90+)'}",
        f"- copy bandwidth (1 GiB clone, read+write): {bw_copy / 1e9:.0f} GB/s"
        + (f"; theoretical peak {bw_peak / 1e9:.0f} GB/s" if bw_peak else ""),
        "- bytes model: read x once, write 0.5625 B/element (fused kernels: + residual in/out, gate+up in)",
        "",
        "| kernel | M | K | time (us) | GB/s | of copy BW | of peak | swizzle pad bytes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    def _frac(v):
        return "" if v is None else f"{v:.2f}"

    body = [f"| {r['kernel']} | {r['m']} | {r['k']} | {r['us']:.2f} | {r['GB/s']:.0f} | {r['frac_copy']:.2f} | "
            f"{_frac(r['frac_peak'])} | {r['pad_bytes']} |" for r in rows]
    if gemm_rows:
        body += ["", "| GEMM M | N | K | W4A16 (us) | bf16 torch.mm (us) | weight GB/s |", "|---:|---:|---:|---:|---:|---:|"]
        body += [f"| {g['m']} | {g['n']} | {g['k']} | {g['w4a16_us']:.2f} | {g['bf16_mm_us']:.2f} | "
                 f"{g['w4a16_weight_GB/s']:.0f} |" for g in gemm_rows]
    text = "\n".join(head + body) + "\n"
    print(text)
    out = Path(args.out or f"bench/results/quantizer_{gpu.replace(' ', '_')}.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
