"""Modelled per-layer time of the sm90 grouped MoE path for the MoE presets (a MODEL, not a
measurement): ``python bench/moe_sm90_model.py [--gpu H200] [--out bench/results/moe_sm90_model.md]``.

Per preset and M: expected active experts and work tiles under uniform routing, the policy's first
(GEMM1, GEMM2) pair and its modelled time (:mod:`nvgemm.templates.sm90_moe.perf`, the dense mma
kernel's model on the equivalent problem; up to 2 tokens GEMM2 runs the top-k finalize, charged as its last
CTA's serial tail), the host path's launches (1 Triton prep, + 1 finalize above 2 tokens, at the tiny-kernel
cost), the shared expert's two dense GEMMs where the model has one, and the byte floor of the routed (+ shared)
experts' NVFP4 weights at the achievable bandwidth, and the routed experts' own share (their floor over the layer
time less the shared expert); then, at M = 1, where the time goes (:func:`m1_breakdown`).
B200 (the sm100 grouped W4A4 kernels): ``bench/moe_sm100_model.py``.
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
                  "| M | active | tiles | launches | GEMM1+GEMM2 | host | shared | total | floor | floor/total | "
                  "routed only: floor/time | GEMM1 / GEMM2 |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for m in MS:
            r = layer_model(shape, m, gpu)
            if not r:
                lines.append(f"| {m} | - | - | - | no estimate | | | | | | | |")
                continue
            mid = sum(r["total_us"]) / 2

            def rng(t):
                return f"{t[0]:.1f}-{t[1]:.1f}"

            short = [c.replace(config_prefix, "") for c in (r["config13"], r["config2"])]
            lines.append(f"| {m} | {r['active']:.1f} | {r['tiles']:.1f} | {r['launches']} | {rng(r['gemm_us'])} | "
                         f"{rng(r['host_us'])} | "
                         f"{rng(r['shared_us'])} | {rng(r['total_us'])} | {r['floor_us']:.1f} | "
                         f"{100 * r['floor_us'] / mid:.0f} % | {routed_share(shape, r, m, gpu)} | "
                         f"{short[0]} / {short[1]} |")
        lines.append("")
    return lines


def routed_floor_us(shape, m: int, gpu: str) -> float:
    """The byte floor of the routed experts alone (the active experts' weights, no shared expert)."""
    from nvgemm.templates.sm90_moe.perf import byte_floor_us

    return byte_floor_us(m, shape.top_k, shape.num_experts, shape.hidden, shape.inter, 0, gpu)


def routed_share(shape, r, m: int, gpu: str) -> str:
    """The routed experts' share of their floor: routed floor / (layer total - shared expert), middles."""
    t = 0.5 * (r["total_us"][0] + r["total_us"][1]) - 0.5 * (r["shared_us"][0] + r["shared_us"][1])
    return f"{100 * routed_floor_us(shape, m, gpu) / t:.0f} %"


def m1_breakdown(layer_model, gpu: str, config_from_name, rows_of, names=("DeepSeek-V3-TP8", "Qwen3-30B-A3B"),
                 prefetch_saving=None) -> list[str]:
    """Where one token's layer time goes (model, M = 1): per grouped GEMM the dense model's terms on the
    equivalent problem (8 work slots of one pair: N = rows x slots, M = 1) -- the weight bytes at the achievable
    bandwidth, the rest of the kernel (first round's DRAM fill, streaming below the achievable rate on the SMs
    the work units occupy, the tail) and the launch -- then the prep launch, the fused finalize's tail, the
    grid's empty work slots and the shared expert. ``rows_of(rows)``: the stack's rows per expert.
    ``prefetch_saving(shape, r)``: the (negative) us the decode L2 prefetches take off the GEMM pair (sm100), or
    0 where there are none."""
    from nvgemm.heuristics.perfmodel.model import estimate
    from nvgemm.templates.sm90_moe.perf import fused_finalize_tail_us
    from nvgemm.templates.sm90_moe.policy import MOE_LAYERS

    def mid(t):
        return 0.5 * (t[0] + t[1])

    out = ["## Where the time goes at M = 1 (model)", "",
           "| layer | part | us (model, mid) | |", "|---|---|---:|---|"]
    for name in names:
        shape = MOE_LAYERS[name]
        r = layer_model(shape, 1, gpu)
        parts, gsum = [], 0.0
        for label, cname, rows, k in (("GEMM1", r["config13"], 2 * shape.inter, shape.hidden),
                                      ("GEMM2", r["config2"], shape.hidden, shape.inter)):
            c = config_from_name(cname)
            tiles = round(r["tiles"])
            e = estimate(c.dense(), 1, rows_of(rows) * tiles, k, gpu)
            kern = mid(e.kernel_us)
            gsum += kern + mid(e.launch_us)
            parts += [(f"{label} weight bytes at {get_bw(gpu)} TB/s", e.byte_floor_us,
                       f"{tiles} slots x {rows} rows x K={k}"),
                      (f"{label} fill, sub-achievable streaming, tail", kern - e.byte_floor_us,
                       f"{e.active_sms} SMs busy, {e.rounds} round(s), fill {mid(e.fill_us):.2f}"),
                      (f"{label} launch", mid(e.launch_us),
                       "PDL saving included" + ("; its weights are read before the wait (the dense PDL prologue "
                                                "term, nothing more)" if label == "GEMM2" else ""))]
        tail = (0.0, 0.0)
        if r["launches"] == 3:
            tail = fused_finalize_tail_us(1, shape.top_k, gpu, 1)
        saved = prefetch_saving(shape, r) if prefetch_saving else 0.0
        other = mid(r["gemm_us"]) - gsum - mid(tail) - saved
        if saved:
            parts.append(("L2 prefetch of both GEMMs' routed weights", saved,
                          "prep -> GEMM1's, GEMM1 -> GEMM2's: the streams start in the launch gaps (timeline)"))
        parts += [("fused finalize tail (GEMM2's last CTA)", mid(tail), "arrival + 2 L2 round trips"),
                  ("grouped-kernel terms beyond the dense twin", other, "empty work slots, routing interpolation"),
                  ("prep launch" if r["launches"] > 2 else "prep launch (none: the ids are the work list)",
                   mid(r["host_us"]), f"{r['launches']} launches in all"),
                  ("shared expert (two dense GEMMs)", mid(r["shared_us"]), "")]
        tot = mid(r["total_us"])
        for label, us, note in parts:
            out.append(f"| {name} | {label} | {abs(us) if abs(us) < 5e-3 else us:.2f} | {note} |")
        out.append(f"| {name} | **total (whole MoE layer)** | **{tot:.2f}** | floor {r['floor_us']:.2f} us = "
                   f"{100 * r['floor_us'] / tot:.0f} %; 35 % needs {r['floor_us'] / 0.35:.2f} us |")
        routed = tot - mid(r["shared_us"])
        rf = routed_floor_us(shape, 1, gpu)
        out.append(f"| {name} | **routed experts only** (total - shared expert) | **{routed:.2f}** | routed floor "
                   f"{rf:.2f} us = {100 * rf / routed:.0f} %; 35 % needs {rf / 0.35:.2f} us |")
    out.append("")
    return out


def get_bw(gpu: str) -> float:
    from nvgemm.heuristics.perfmodel.hardware import get_hardware

    return get_hardware(gpu).achievable_bw_tbs


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
        "up to 2 tokens GEMM2 runs the top-k finalize (3 launches: prep, GEMM1, GEMM2; its last CTA's serial tail "
        "charged in GEMM1+GEMM2), above it the finalize is a launch (4); one token needs no prep (the grouped "
        "kernels read the routing from the ids: 2 launches); "
        f"host = 1 prep (none at M = 1) (+ 1 finalize) launch at {hw.aux_kernel_us[0]}-{hw.aux_kernel_us[1]} us each; shared expert = "
        "two dense W4A16 GEMMs (model's best). Floor = (active + shared) x 3 x H x I x 0.5625 B at "
        f"{hw.achievable_bw_tbs} TB/s. Times in us as low-high; `floor/total` uses the middle; `routed only` = the "
        "routed experts' floor (active experts only) over the layer time less the shared expert. PDL: both GEMMs get "
        "the dense model's PDL term (launch - 0.3-0.7 us); GEMM2 reads its routing and issues its first weight "
        "stages before `griddepcontrol.wait`, which the model charges as that same term, with no further overlap.",
        "",
    ]
    lines += render_tables(layer_model, args.gpu, "nvgemm_cutedsl_sm90_moe_mma_")
    from nvgemm.templates.sm90_moe.config import moe_config_from_name

    lines += m1_breakdown(layer_model, args.gpu, moe_config_from_name, lambda rows: rows)
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
