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
    from nvgemm.templates.sm100_moe.perf import (L2_BW_OVER_DRAM, L2_PREFETCH_SHARE, PREP_KERNELS, PREP_KERNELS_LARGE,
                                                 moe_gemm_estimates, prefetched_pair_us)
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
        "model charges as that same term, with no further overlap. "
        "L2 prefetch (where the routed pairs fit the one-launch prep and both GEMMs' routed weights fit "
        f"{int(L2_PREFETCH_SHARE * 100)} % of the L2): the prep prefetches GEMM1's routed weights, GEMM1 (`_pf2`) "
        "GEMM2's; priced on a timeline that starts the DRAM stream at the prep's end (GEMM1's weights, then "
        "GEMM2's, at the achievable bandwidth after one DRAM latency) and runs each GEMM after its launch at the "
        "smaller of its DRAM-fed time and the larger of its L2-fed time (L2 latency, L2 bandwidth "
        f"{L2_BW_OVER_DRAM[1]}-{L2_BW_OVER_DRAM[0]} x DRAM's, an assumption) and its bytes' arrival + an L2 latency + "
        "its tail (`templates/sm100_moe/perf.py`). Never run on hardware.",
        "",
    ]
    lines += render_tables(layer_model, args.gpu, "nvgemm_cutedsl_sm100_moe_")
    from nvgemm.templates.sm100_moe.config import moe_config_from_name, padded_rows

    def prefetch_saving(shape, r):
        """The pair on the prefetch timeline - the same configs priced without the prefetches (mid, us)."""
        c1, c2 = moe_config_from_name(r["config13"]), moe_config_from_name(r["config2"])
        if not c1.prefetch_next:
            return 0.0
        jobs = [([c1], [c1.dense()], c1.tile_n, 2 * shape.inter, shape.hidden),
                ([c2], [c2.dense()], c2.tile_n, shape.hidden, shape.inter)]
        plain = moe_gemm_estimates(jobs, 1, shape.top_k, shape.num_experts, args.gpu)
        pf = prefetched_pair_us(c1, c2, 1, shape.top_k, shape.num_experts, 2 * shape.inter, shape.hidden,
                                shape.hidden, shape.inter, args.gpu)
        return 0.5 * (sum(pf[0]) + sum(pf[1]) - sum(plain[0][0].us) - sum(plain[1][0].us))

    lines += m1_breakdown(layer_model, args.gpu, moe_config_from_name, padded_rows, prefetch_saving=prefetch_saving)
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
