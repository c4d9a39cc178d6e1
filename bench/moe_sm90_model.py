"""Modelled per-layer time of the sm90 grouped MoE path for the MoE presets (a MODEL, not a
measurement): ``python bench/moe_sm90_model.py [--gpu H200] [--out bench/results/moe_sm90_model.md]``.

Per preset and M: expected active experts and work tiles under uniform routing, the policy's first
(GEMM1, GEMM2) pair and its modelled time (:mod:`nvgemm.templates.sm90_moe.perf`, the dense mma
kernel's model on the equivalent problem), the host path's launches (1 Triton prep + 1 finalize at
the tiny-kernel cost), the shared expert's two dense GEMMs where the model has one, and the byte
floor of the routed (+ shared) experts' NVFP4 weights at the achievable bandwidth. B200 (the
sm100 grouped W4A4 kernels): ``bench/moe_sm100_model.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

MS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def render_tables(layer_model, gpu: str, config_prefix: str) -> list[str]:
    """One markdown table per MoE preset layer: per M, ``layer_model(shape, m, gpu)``'s numbers."""
    from nvgemm.templates.sm90_moe.policy import MOE_LAYERS

    lines = []
    for name, shape in MOE_LAYERS.items():
        lines += [f"## {name}: {shape.num_experts} experts, top-{shape.top_k}, H={shape.hidden}, I={shape.inter}"
                  + (f", shared I={shape.shared_inter}" if shape.shared_inter else "") + f" ({shape.source})", "",
                  "| M | active | tiles | GEMM1+GEMM2 | host | shared | total | floor | floor/total | GEMM1 / GEMM2 |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for m in MS:
            r = layer_model(shape, m, gpu)
            if not r:
                lines.append(f"| {m} | - | - | no estimate | | | | | | |")
                continue
            mid = sum(r["total_us"]) / 2

            def rng(t):
                return f"{t[0]:.1f}-{t[1]:.1f}"

            short = [c.replace(config_prefix, "") for c in (r["config13"], r["config2"])]
            lines.append(f"| {m} | {r['active']:.1f} | {r['tiles']:.1f} | {rng(r['gemm_us'])} | {rng(r['host_us'])} | "
                         f"{rng(r['shared_us'])} | {rng(r['total_us'])} | {r['floor_us']:.1f} | "
                         f"{100 * r['floor_us'] / mid:.0f} % | {short[0]} / {short[1]} |")
        lines.append("")
    return lines


def main() -> int:
    from nvgemm.templates.sm90_moe.policy import layer_model
    from nvgemm.heuristics.perfmodel.hardware import get_hardware

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "moe_sm90_model.md"))
    args = ap.parse_args()
    hw = get_hardware(args.gpu)
    lines = [
        f"# sm90 grouped W4A16 MoE: modelled per-layer time on {args.gpu} (MODEL, not a measurement)",
        "",
        f"Command: `PYTHONPATH=src python bench/moe_sm90_model.py --gpu {args.gpu}`. Assumptions: uniform routing "
        "(binomial pairs per expert), W4A16 NVFP4 experts, bf16 activations; GEMMs = the dense mma kernel's model "
        "on the equivalent problem (N = rows x work tiles, a second tile of one expert charged as a DRAM re-read); "
        f"host = 1 prep + 1 finalize launch at {hw.aux_kernel_us[0]}-{hw.aux_kernel_us[1]} us each; shared expert = "
        "two dense W4A16 GEMMs (model's best). Floor = (active + shared) x 3 x H x I x 0.5625 B at "
        f"{hw.achievable_bw_tbs} TB/s. Times in us as low-high; `floor/total` uses the middle.",
        "",
    ]
    lines += render_tables(layer_model, args.gpu, "nvgemm_cutedsl_sm90_moe_mma_")
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
