"""Modelled per-layer time of the sm100 grouped W4A4 MoE path for the MoE presets (a MODEL, not a
measurement): ``python bench/moe_sm100_model.py [--gpu B200] [--out bench/results/moe_sm100_model.md]``.

Per preset and M: expected active experts and work slots under uniform routing, the policy's first
(GEMM1, GEMM2) pair (:mod:`nvgemm.templates.sm100_moe.policy`) and its modelled time
(:mod:`nvgemm.templates.sm100_moe.perf`: the dense swap-AB sm100 kernel's model on the equivalent
problem, with its fill, partial-round (idle SM) and tail terms; up to 2 tokens GEMM2 runs the top-k finalize,
charged as its last CTA's serial tail), the host path's launches (one Triton prep at decode, three above 128
routed pairs, + the finalize above 2 tokens, at the tiny-kernel cost), the shared expert's two dense W4A4
GEMMs, the byte floor of the routed (+ shared) experts' NVFP4 weights at the achievable bandwidth, and where
the time goes at M = 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> int:
    from moe_sm90_model import m1_breakdown, render_tables

    from nvgemm.templates.sm100_moe.policy import layer_model
    from nvgemm.templates.sm100_moe.config import FUSED_PREP_MAX_PAIRS
    from nvgemm.templates.sm100_moe.perf import PREP_KERNELS, PREP_KERNELS_LARGE
    from nvgemm.heuristics.perfmodel.hardware import get_hardware

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="B200")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "moe_sm100_model.md"))
    args = ap.parse_args()
    hw = get_hardware(args.gpu)
    lines = [
        f"# sm100 grouped W4A4 MoE: modelled per-layer time on {args.gpu} (MODEL, not a measurement)",
        "",
        f"Command: `PYTHONPATH=src python bench/moe_sm100_model.py --gpu {args.gpu}`. The kernel has run only on the "
        "CPU PTX emulator, never on Blackwell hardware. Assumptions: uniform routing (binomial pairs per expert), "
        "W4A4 NVFP4 experts, bf16 activations; GEMMs = the dense swap-AB sm100 kernel's model on the equivalent "
        "problem (N = rows padded to 128 x work slots, a second slot of one expert charged as a DRAM re-read; "
        "GEMM1's fused SwiGLU + NVFP4 requant epilogue charged as the plain epilogue); "
        "up to 2 tokens GEMM2 runs the top-k finalize (3 launches: prep, GEMM1, GEMM2; its last CTA's serial tail, "
        "one token after another, charged in GEMM1+GEMM2), above it the finalize is a launch; "
        f"host = {PREP_KERNELS} prep launch (one Triton kernel: work list, activation prep, scale padding; "
        f"{PREP_KERNELS_LARGE} above {FUSED_PREP_MAX_PAIRS} routed pairs: work-list kernel, prep, a gather) (+ 1 finalize) "
        f"at {hw.aux_kernel_us[0]}-{hw.aux_kernel_us[1]} us each; shared expert = two dense W4A4 GEMMs (model's best). "
        "Floor = (active + shared) x 3 x H x I x 0.5625 B at "
        f"{hw.achievable_bw_tbs} TB/s. Times in us as low-high; `floor/total` uses the middle; `tiles` = work slots; "
        "`routed only` = the routed experts' floor (active experts only) over the layer time less the shared expert. "
        "PDL: both GEMMs get the dense model's PDL term (launch - 0.3-0.7 us); GEMM2 reads its work list and "
        "TMA-loads its first weight tiles into the smem ring before `griddepcontrol.wait`, which the "
        "model charges as that same term, with no further overlap.",
        "",
    ]
    lines += render_tables(layer_model, args.gpu, "nvgemm_cutedsl_sm100_moe_")
    from nvgemm.templates.sm100_moe.config import moe_config_from_name, padded_rows

    lines += m1_breakdown(layer_model, args.gpu, moe_config_from_name, padded_rows)
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
