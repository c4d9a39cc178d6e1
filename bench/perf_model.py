"""Write the performance-MODEL reports (CPU only, no GPU; a GPU measurement overrides them).

    python bench/perf_model.py sm90    # -> bench/results/sm90_model.md  (H200, current sm90 kernels)
    python bench/perf_model.py sm100   # -> bench/results/sm100_model.md (B200, sm100 decode configs)
    python bench/perf_model.py mma     # -> bench/results/mma_archs_model.md (RTX 5090, L40S: the mma kernel)
    python bench/perf_model.py sm120   # -> bench/results/sm120_model.md (RTX 5090 / PRO 6000 / 5080, GB10: W4A4)
    python bench/perf_model.py all

Inputs: the committed SASS facts table (``src/nvgemm/heuristics/perfmodel/sass_facts.json``; regenerate it
with ``nvgemm model --regen-table`` after a kernel change), the candidate policy
(``nvgemm.heuristics.candidates``, nvMatmulHeuristics off so the rows are reproducible) and the
model (``nvgemm.heuristics.perfmodel``). Shapes: the Llama-3.1-8B and 3.3-70B decode GEMMs.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SHAPES = ((6144, 4096, "8B qkv"), (4096, 4096, "8B o"), (28672, 4096, "8B gate_up"), (4096, 14336, "8B down"),
          (10240, 8192, "70B qkv"), (8192, 8192, "70B o"), (57344, 8192, "70B gate_up"), (8192, 28672, "70B down"))
SM90_M = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
SM100_M = (1, 2, 4, 8, 16, 32)


def _r(t, d=1) -> str:
    return f"{t[0]:.{d}f}-{t[1]:.{d}f}"


def _pct(e, peak=False) -> str:
    p = e.pct_of_peak if peak else e.pct_of_achievable
    return f"{p[1]:.0f}-{p[0]:.0f}"


def _short(name: str) -> str:
    return name.replace("nvgemm_cutedsl_", "")


def _policy(n, k, m, gpu):
    from nvgemm.heuristics import candidates
    from nvgemm.core.problem import GemmProblem, Target

    t = Target.from_gpu(gpu)
    a = "bf16" if t.family == "sm90" else "nvfp4"
    return [c.config for c in candidates(GemmProblem(n=n, k=k, m=m, a_format=a, target=t), use_nvmmh=False)]


def _header(title: str, cmd: str) -> list[str]:
    import importlib.metadata as md
    import platform

    from nvgemm.heuristics.perfmodel import table_header

    th = table_header()
    return [
        f"# {title}",
        "",
        "**This is a MODEL, not a measurement. A GPU measurement overrides every number here.** Nothing in this",
        "file ran on a GPU: kernels were compiled on CPU, their SASS read, and the CPU performance model",
        "(`nvgemm.heuristics.perfmodel`) turned that into times. Times are per call, in microseconds, as a low-high range",
        "(optimistic / pessimistic end of every hardware assumption below).",
        "",
        f"- generated {datetime.date.today().isoformat()} with `{cmd}` (python {platform.python_version()}, "
        f"nvidia-cutlass-dsl {md.version('nvidia-cutlass-dsl')})",
        f"- SASS facts table: cutlass-dsl {th.get('cutlass_dsl')}, cuobjdump {th.get('cuobjdump')}, generated "
        f"{th.get('generated')} (`{th.get('command')}`); reference epilogue: {th.get('epilogue')}",
        "- policy: `nvgemm.heuristics.candidates` with nvMatmulHeuristics off (reproducible rows)",
        "",
    ]


SM90_ASSUMPTIONS = """## Model assumptions (H200)

- 132 SMs x 4 schedulers at 1.98 GHz; 3.85-4.3 TB/s achievable of 4.8 TB/s peak HBM (80-90 %, calibrated
  on published H200 bf16 GEMVs: `bench/results/model_calibration.md`); 50 MB L2 (weights re-read
  from DRAM by later M tiles when they exceed 80 % of it); DRAM latency 1200-2000 cycles, L2 270-550 cycles;
  64 B/clock per SM from L2/DRAM (assumption).
- Launch: 1.5-2.5 us per kernel in a CUDA graph, less 0.3-0.7 us with PDL (the mma family launches with
  PDL and streams its first weight stages before `griddepcontrol.wait`). One kernel per call: split-K
  partials are reduced in-kernel by the last CTA of each tile (fence + counter atomic + the partial loads:
  3 dependent L2 round trips). The host path launches nothing else for W4A16 (no fills: absent operands
  reuse tensors of the call, split-K buffers live in a per-device workspace); a W4A4 layer adds its one
  Triton qdq kernel (not included below: these rows are W4A16).
- Kernel (`nvgemm/heuristics/perfmodel/model.py`): the grid's CTAs are spread over the 132 SMs in rounds of the
  resident CTAs per SM (occupancy from registers per scheduler quadrant, shared memory incl. the dynamic
  ring, threads); a partial last round runs on the SMs that hold CTAs and the idle ones add nothing. Each
  round = fill (one loaded DRAM latency + the first ring stage through the port; a later round pays fill / residency)
  + iterations x step + the CTAs' tail (per-CTA instructions, exposed epilogue, in-kernel split-K round
  trips). step = colimit(per-CTA step, chip byte step): the per-CTA step is colimit(latency, warps per
  scheduler x SASS issue cycles, fabric, tensor-core time) with latency = max(SASS replay `T1(L) = base +
  round_trips x L`, Little's law L / ring depth); the chip byte step = CTAs of the round x DRAM bytes per
  CTA step / achievable bandwidth (the sum of the SMs' streams, capped by the chip). colimit = the largest
  term plus a share of any other within a factor 2 of it (equal terms +17 %): co-limits are not max()-ed.
- Tensor cores: the wgmma family's WGMMA FLOPs (incl. its tile padding) at 70 % of the 989 TFLOP/s dense
  bf16 peak, the mma family's `mma.sync` at 2/3 of that peak, per SM, as a term of every step (so a
  tensor-bound kernel pays for its partial last round). The wgmma family's split-K splits only the tiles
  of that last round (its tail), each into split-K CTAs after the whole tiles.
- bf16 cuBLAS baseline (`nvgemm/heuristics/perfmodel/baseline.py`): the same bandwidth range, fill, launch (with the
  PDL saving) and co-limit rule: launch + one DRAM latency + colimit(bf16 bytes / bandwidth, 2 x M8 x N x K
  FLOPs at 70 % of the peak), M8 = M rounded up to 8 rows; charged no waves or tail (an ideal stream, if
  anything faster than cuBLAS: `bench/results/model_calibration.md`). "x bf16" = modelled bf16 time /
  modelled nvgemm time, middle of both ranges; it can never exceed the byte ratio ("bytes x" column;
  `tests/cpu/test_perfmodel.py::test_no_modelled_ratio_exceeds_the_byte_ratio`).
- "% of 4.8 TB/s" = NVFP4 weight + scale bytes (0.5625 B/element) / modelled per-call time, as a range
  (pessimistic-optimistic), against the peak.
"""

def sm90_report(out: Path) -> None:
    import torch

    from nvgemm.heuristics.perfmodel import bf16_baseline, estimate, lookup
    from nvgemm.heuristics.perfmodel.model import best
    from nvgemm.templates.sm90_w4a16.backend import pick_config

    fams = ("sm90.mma", "sm90.wgmma")
    lines = _header("sm90 W4A16 decode on H200: performance MODEL of the policy's picks (issue 14)",
                    "python bench/perf_model.py sm90")
    lines += [
        "## Model: policy pick per shape and M, against bf16 cuBLAS",
        "",
        "Policy pick = what the sm90 runtime runs (`runtime/sm90_backend.pick_config`: the first candidate of",
        "`templates/sm90_w4a16/policy.py`, which ranks both families' configs with this model and drops variants whose SASS",
        "spills). Model best = the fastest modelled config over the families' search spaces (tiles, warps, ring",
        "depth, split-K; spills not checked). Rounds = rounds of CTAs x SMs holding CTAs (of 132). Limit = what",
        "sets the first round's step at the (low, high) end. Bytes x = the ratio of the bytes the two GEMMs",
        "move (bf16 weights + activations + output vs NVFP4 weights + scales + the same): the ceiling of x bf16.",
        "(The columns comparing with the kernels before issue 14 are gone: they were priced by the previous",
        "model, whose numbers this one does not reproduce.)",
        "",
        "| N x K (layer) | M | model: policy pick | model us | model % of 4.8 TB/s | model x bf16 | bytes x | model bf16 us"
        " | rounds | limit | model: best config | model best us |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    picks = {}
    rows = []
    for n, k, layer in SHAPES:
        for m in SM90_M:
            pick = pick_config(m, n, k, torch.bfloat16, "none", 132)
            e = estimate(pick, m, n, k, "H200", activation="none")  # the variant the policy priced
            b = bf16_baseline(m, n, k, "H200")
            bc, be = best(fams, m, n, k, "H200", activation="none")
            picks.setdefault(pick, []).append((n, k, m))
            rows.append((n, k, m, e, be, b))
            bound = b.bytes / (e.geometry.weight_bytes + 2.0 * m * k + 2.0 * m * n)
            lim = e.limiter[0] if e.limiter[0] == e.limiter[1] else f"{e.limiter[0]}/{e.limiter[1]}"
            lines.append(
                f"| {n}x{k} ({layer}) | {m} | {_short(pick.name())} | {_r(e.total_us)} | {_pct(e, peak=True)} | "
                f"{b.mid_us / e.mid_us:.2f} | {bound:.2f} | {_r(b.total_us)} | {e.rounds} x {e.active_sms} | {lim} | "
                f"{_short(bc.name())} | {_r(be.total_us)} |")
    lines += [""] + sm90_targets(rows) + ["", "## Model inputs: SASS facts of the policy's picks (from the table)", "",
              "| config | regs | model CTAs/SM (limit) | main-loop SASS instr per weight element | serial DRAM round"
              " trips per iteration | LDL/STL (in loop) | weight bytes in flight per SM, peak |",
              "|---|---|---|---|---|---|---|"]
    for cfg in sorted(picks, key=lambda c: c.name()):
        f = lookup(cfg, "sm_90a", activation="none")
        n, k, m = picks[cfg][0]
        e = estimate(cfg, m, n, k, "H200", activation="none")
        lines.append(f"| {_short(cfg.name())} | {f.regs} | {e.occupancy.ctas_per_sm} ({e.occupancy.limiter}) | "
                     f"{f.instr_per_elem:.2f} | {f.round_trips:.2f} | {f.ldl}/{f.stl} ({f.ldl_loop}/{f.stl_loop}) | "
                     f"{e.inflight_peak_per_sm / 1024:.1f} KB |")
    lines += ["", SM90_ASSUMPTIONS] + [""] + bf16_crosscheck()
    out.write_text("\n".join(lines).rstrip() + "\n")


TARGET_SHAPES = ((28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672))


def sm90_targets(rows) -> list[str]:
    """Issue 14 item 8 against the model, for the policy's picks and the model's best configs."""
    def count(pred, which):
        ok = [(n, k, m) for n, k, m, e, be, b in rows if pred(n, k, m) and which(n, k, m, e, be, b)]
        tot = [(n, k, m) for n, k, m, *_ in rows if pred(n, k, m)]
        return f"{len(ok)} of {len(tot)}"

    bw = lambda n, k, m: (n, k) in TARGET_SHAPES and m <= 16  # noqa: E731
    x3 = lambda n, k, m: (n, k) == (28672, 4096) and m == 1  # noqa: E731
    any64 = lambda n, k, m: m <= 64  # noqa: E731
    big = lambda n, k, m: 33 <= m <= 256  # noqa: E731
    misses = [f"{n}x{k} M={m} ({e.pct_of_achievable[1]:.0f}-{e.pct_of_achievable[0]:.0f} %)"
              for n, k, m, e, be, b in rows if bw(n, k, m) and e.pct_of_achievable[1] < 75]
    lines = ["## Model against the issue 14 targets (item 8)", "",
             "Each target counted twice: on the middle of the modelled range and on its pessimistic end (the high",
             "time; a target counts as met there only if the high time meets it).", "",
             "| target (modelled, H200) | policy picks, mid | policy picks, pessimistic end | model's best, pessimistic"
             " end |", "|---|---|---|---|",
             f"| >= 75 % of 4.3 TB/s at M = 1..16 on 28672x4096, 4096x14336 and the four 70B shapes | "
             f"{count(bw, lambda n, k, m, e, be, b: sum(e.pct_of_achievable) / 2 >= 75)} | "
             f"{count(bw, lambda n, k, m, e, be, b: e.pct_of_achievable[1] >= 75)} | "
             f"{count(bw, lambda n, k, m, e, be, b: be.pct_of_achievable[1] >= 75)} |",
             f"| >= 3.0x modelled bf16 at M=1 on 28672x4096 | "
             f"{count(x3, lambda n, k, m, e, be, b: b.mid_us / e.mid_us >= 3.0)} | "
             f"{count(x3, lambda n, k, m, e, be, b: b.total_us[0] / e.total_us[1] >= 3.0)} | "
             f"{count(x3, lambda n, k, m, e, be, b: b.total_us[0] / be.total_us[1] >= 3.0)} |",
             f"| never slower than modelled bf16 at M <= 64 (all 8 shapes) | "
             f"{count(any64, lambda n, k, m, e, be, b: e.mid_us <= b.mid_us)} | "
             f"{count(any64, lambda n, k, m, e, be, b: e.total_us[1] <= b.total_us[0])} | "
             f"{count(any64, lambda n, k, m, e, be, b: be.total_us[1] <= b.total_us[0])} |",
             f"| item 5: never slower than modelled bf16 at M = 33..256 (rows above: M = 48..256) | "
             f"{count(big, lambda n, k, m, e, be, b: e.mid_us <= b.mid_us)} | "
             f"{count(big, lambda n, k, m, e, be, b: e.total_us[1] <= b.total_us[0])} | "
             f"{count(big, lambda n, k, m, e, be, b: be.total_us[1] <= b.total_us[0])} |", "",
             "Bandwidth target missed at the pessimistic end: " + (", ".join(misses) if misses else "none") + ".", "",
             "Physical reach: at 75 % of 4.3 TB/s a call may take at most weight bytes / 3.2 GB/ms; the model",
             "charges every call at least one launch (0.8-2.2 us with PDL), one DRAM latency and its bytes at",
             "3.85-4.3 TB/s, so the small layers (6144x4096, 4096x4096) cannot reach it with any kernel and the",
             "target list leaves them out.", ""] + sm90_sweep() + [""] + sm90_compute_bound(rows)
    return lines


def sm90_sweep() -> list[str]:
    """Item 5 at every M in 33..256 (not only the rows above): policy pick vs modelled bf16."""
    import torch

    from nvgemm.heuristics.perfmodel import bf16_baseline, estimate
    from nvgemm.templates.sm90_w4a16.backend import pick_config

    from nvgemm.heuristics.perfmodel import get_hardware

    hw = get_hardware("H200")
    worse, total, dq_wins = [], 0, 0
    for n, k, _ in SHAPES:
        for m in range(33, 257):
            cfg = pick_config(m, n, k, torch.bfloat16, "none", 132)
            ours = estimate(cfg, m, n, k, "H200", activation="none").mid_us
            b = bf16_baseline(m, n, k, "H200").mid_us
            # dequantize-into-workspace + cuBLAS: the bf16 GEMM (fp32 out: + 2 M N bytes), a dequantize
            # pass (read NVFP4, write bf16) and an fp32 epilogue pass, each a kernel of its own
            dq = (b + (0.5625 * n * k + 2.0 * n * k + 2.0 * m * n) / hw.achievable_bw * 1e6
                  + (6.0 * m * n) / hw.achievable_bw * 1e6 + 2 * 0.5 * sum(hw.launch_us))
            dq_wins += dq < ours
            total += 1
            if b / ours < 1.0:
                worse.append((n, k, m, b / ours, cfg))
    lines = [f"Every M in 33..256 on the 8 shapes ({total} points, policy picks, middle of both ranges): "
             f"{total - len(worse)} modelled no slower than bf16"]
    if worse:
        by_shape: dict = {}
        for n, k, m, r, cfg in worse:
            by_shape.setdefault((n, k), []).append((m, r, cfg))
        parts = [f"{n}x{k} at M = {min(x[0] for x in v)}..{max(x[0] for x in v)} "
                 f"({min(x[1] for x in v):.3f}-{max(x[1] for x in v):.3f}x, {_short(v[0][2].name())})"
                 for (n, k), v in by_shape.items()]
        lines[0] += "; slower: " + "; ".join(parts) + "."
        lines += ["Where slower, both GEMMs are tensor-core bound (bf16 counted on M rounded up to 8 rows, the",
                  "least any tensor-core GEMM pads): the gap is the NVFP4 kernel's partial last wave (the tiles that",
                  "do not fill 132 SMs; split-K of that tail shortens it but the split partials cost a round trip),",
                  "its per-CTA pipeline fill and epilogue, and tile padding -- costs the bf16 model folds into its",
                  "end-to-end 70 %. No NVFP4 path can do better than a tie there (next paragraph)."]
    else:
        lines[0] += "."
    lines += ["", f"A dequantize-into-workspace + cuBLAS candidate (the bf16 GEMM with an fp32 output, plus a "
              "dequantize pass writing", f"the bf16 weight and an epilogue pass, two more launches) would be "
              f"modelled faster than the policy's pick at {dq_wins} of these {total} points."]
    return lines


def sm90_compute_bound(rows) -> list[str]:
    """Item 5's arithmetic: where bf16 cuBLAS is tensor-core bound, no NVFP4 path can be faster."""
    from nvgemm.heuristics.perfmodel import get_hardware
    from nvgemm.heuristics.perfmodel.baseline import TENSOR_EFFICIENCY

    hw = get_hardware("H200")
    n, k, m = 57344, 8192, 256
    flops = 2.0 * m * n * k
    t_peak = flops / (hw.bf16_tflops * 1e12) * 1e6
    t_eff = t_peak / TENSOR_EFFICIENCY
    bf16_bytes, fp4_bytes = 2.0 * n * k, 0.5625 * n * k
    e = next(e for nn, kk, mm, e, be, b in rows if (nn, kk, mm) == (n, k, m))
    b = next(b for nn, kk, mm, e, be, b in rows if (nn, kk, mm) == (n, k, m))
    return [
        "Why no NVFP4 path can beat bf16 at M = 256 (the arithmetic item 5 asks for): 57344x8192 at M = 256 is",
        f"{flops / 1e9:.0f} GFLOP: {t_peak:.0f} us at the H200's dense bf16 peak ({hw.bf16_tflops:.0f} TFLOP/s), "
        f"{t_eff:.0f} us at the {TENSOR_EFFICIENCY:.0%} both models assume.",
        f"Its bf16 weights are {bf16_bytes / 1e6:.0f} MB ({bf16_bytes / hw.achievable_bw * 1e6:.0f} us at "
        f"{hw.achievable_bw_tbs} TB/s), "
        f"NVFP4 {fp4_bytes / 1e6:.0f} MB ({fp4_bytes / hw.achievable_bw * 1e6:.0f} us): both GEMMs are "
        "tensor-core bound, and Hopper",
        "multiplies NVFP4 weights only as bf16/fp16 operands (no FP4 tensor cores; FP8 would round the",
        "activations and the 6-significant-bit E2M1 x e4m3 products), so every NVFP4 path does the same",
        "FLOPs on the same tensor cores: the best it can do is tie. The register-A WGMMA kernel models at",
        f"{_r(e.total_us)} us against bf16's {_r(b.total_us)} us: the same 70 % tensor rate, but the model charges",
        "the NVFP4 kernel its grid explicitly -- CTAs in rounds over 132 SMs, fill and tail per round -- while",
        "the bf16 baseline is an ideal stream charged none of that (cuBLAS runs persistent / stream-K kernels",
        "on Hopper). The wgmma kernel's split tail (only the last partial round's tiles split in K) recovers",
        "part of the round loss.",
        "A per-call dequantize-into-workspace + cuBLAS candidate costs the bf16 GEMM plus the dequantize",
        f"kernel (read {fp4_bytes / 1e6:.0f} MB, write {bf16_bytes / 1e6:.0f} MB: "
        f"{(fp4_bytes + bf16_bytes) / hw.achievable_bw * 1e6:.0f} us) plus an fp32 epilogue pass: slower than bf16 "
        "alone at every M; where the WGMMA kernel models slower than bf16 it does so by less than that",
        "dequantize pass, so the candidate would be picked at no point (count above) and is not added.",
    ]


def bf16_crosscheck() -> list[str]:
    """The bf16 baseline model next to published measurements (anchors.md)."""
    from nvgemm.heuristics.perfmodel import bf16_baseline

    rows = [("B200, bf16 M=1, N=6656 K=19968 (FlashInfer PR #4466)", "46.2 us", (1, 6656, 19968, "B200")),
            ("B200, bf16 M=1, N=19968 K=6656 (FlashInfer PR #4466)", "45.4 us", (1, 19968, 6656, "B200")),
            ("B200, fp16 M=1, 8192x8192 (\"5-6 TB/s\", flashinfer#1732)", "22.4-26.8 us", (1, 8192, 8192, "B200")),
            ("H100, fp16 M=1, 8192x8192 (Marlin's comparison)", "~58 us", (1, 8192, 8192, "H100"))]
    out = ["## bf16 baseline model cross-checked against published numbers (anchors.md)", "",
           "| published (anchors.md) | measured | model, same shape and GPU |", "|---|---|---|"]
    for what, meas, args in rows:
        out.append(f"| {what} | {meas} | {_r(bf16_baseline(*args).total_us)} us |")
    return out + ["", "No published cuBLAS bf16 numbers at M = 2..64 for these shapes were found. The H200 bf16 GEMV",
                  "calibration (published 70-82 % cuBLAS, 72-89 % best custom kernels): "
                  "`bench/results/model_calibration.md`."]


def _gpct(e) -> str:
    lo, hi = e.gemm_pct_of_peak()
    return f"{hi:.0f}-{lo:.0f}"


def sm100_report(out: Path) -> None:
    from dataclasses import replace as dreplace

    from nvgemm.heuristics.perfmodel import bf16_baseline, estimate, estimate_with, family_for, get_hardware, lookup, rank
    from nvgemm.heuristics.perfmodel.model import best
    from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig as C

    lines = _header("sm100 NVFP4 W4A4 decode on B200: performance MODEL (issue 13 item 10)",
                    "python bench/perf_model.py sm100")
    lines += [
        "## Model: the policy's first choice, the model's ranking of the policy's list, the model's best",
        "",
        "\"GEMM\" = the kernel plus its launch (PDL saving included); \"per call\" adds the host path's two",
        "helper kernels (activation quantize, alpha product) at 1.0-2.0 us each. % of 8 TB/s = NVFP4 weight +",
        "scale bytes / GEMM time. Goal (issue 13): modelled M=1 >= 60 % of HBM bandwidth (8 TB/s), read here on",
        "the GEMM time. The policy list is `candidates()` with nvMatmulHeuristics off; \"fastest of the policy's",
        "list\" is what the policy would rank first if it ranked by the model (`nvgemm.heuristics.perfmodel.rank`).",
        "",
        "| N x K (layer) | M | model: policy #1 | model GEMM us | model % of 8 TB/s | model per-call us"
        " | model: fastest of the policy's list (its rank) | model GEMM us | model % of 8 TB/s"
        " | model: best config (search) | model GEMM us | model % of 8 TB/s | model bf16 us |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    m1 = []
    for n, k, layer in SHAPES:
        for m in SM100_M:
            cands = _policy(n, k, m, "B200")
            first = cands[0]
            e1 = estimate(first, m, n, k, "B200")
            rc, re_ = rank(cands, m, n, k, "B200")[0]
            pos = cands.index(rc) + 1
            bc, be = best(("sm100.nvfp4",), m, n, k, "B200")
            b = bf16_baseline(m, n, k, "B200")
            if m == 1:
                m1.append((n, k, layer, first, e1, bc, be))
            lines.append(
                f"| {n}x{k} ({layer}) | {m} | {_short(first.name())} | {_r(e1.gemm_us)} | {_gpct(e1)} | "
                f"{_r(e1.total_us)} | {_short(rc.name())} (#{pos}) | {_r(re_.gemm_us)} | {_gpct(re_)} | "
                f"{_short(bc.name())} | {_r(be.gemm_us)} | {_gpct(be)} | {_r(b.total_us)} |")

    def meets(e):
        lo, hi = e.gemm_pct_of_peak()[1], e.gemm_pct_of_peak()[0]
        if lo >= 60:
            return f"yes ({lo:.0f}-{hi:.0f} %)"
        if hi < 60:
            return f"no ({lo:.0f}-{hi:.0f} %)"
        return f"only at the optimistic end ({lo:.0f}-{hi:.0f} %)"

    hw = get_hardware("B200")

    lines += ["", "## Model: M=1 against the 60 % goal", "",
              "At 60 % of 8 TB/s a GEMM streams 4.8 bytes per ns: the whole GEMM time, launch included, may be",
              f"at most weight bytes / 4.8 GB/ms. The launch alone is {hw.launch_us[0] - hw.pdl_saving_us[1]:.1f}-"
              f"{hw.launch_us[1] - hw.pdl_saving_us[0]:.1f} us with PDL (model assumption) plus one DRAM latency, so",
              "the two smallest layers (budgets 2.9 and 2.0 us) cannot reach 60 % in this model with any kernel.", "",
              "| N x K | weight MB | GEMM budget at 60 % | model: policy #1 | model: best config (search) | meets? |",
              "|---|---|---|---|---|---|"]
    for n, k, layer, first, e1, bc, be in m1:
        w = e1.geometry.weight_bytes
        lines.append(f"| {n}x{k} ({layer}) | {w / 1e6:.1f} | {w / 4.8e12 * 1e6:.1f} us | {meets(e1)} | "
                     f"{_short(bc.name())} | {meets(be)} |")

    lines += ["", "## Model: the split-K reduction before (nvgemm b453ecf) and now", "",
              "Same config and shape; only the reduction differs. Before: the rolled per-element loop of the kernel",
              "before this change (S > 2: sub-tiles x epi_n x (S-1) dependent L2 round trips per thread after fence +",
              "atomic; S = 2 was unrolled). Now: what the compiled kernel's SASS shows (all partial loads of a round",
              "first, 16-byte vectors, fixed-order sum: fence + atomic + one round trip per sub-tile).", "",
              "| N x K | M | config | reduction now (SASS) | model GEMM us, before | model GEMM us, now |",
              "|---|---|---|---|---|---|"]
    for n, k, layer in SHAPES:
        for cfg in (C(128, 8, swap_ab=True, split_k=2), C(128, 8, swap_ab=True, split_k=4),
                    C(128, 16, swap_ab=True, split_k=4), C(128, 32, swap_ab=True, split_k=8)):
            fam = family_for(cfg)
            if fam.shape_problem(cfg, 1, n, k):
                continue
            f = lookup(cfg, "sm_100a")
            before = dreplace(f, extra={**f.extra, "rolled_reduce": cfg.split_k > 2})
            eb = estimate_with(cfg, 1, n, k, hw, before, fam)
            en = estimate_with(cfg, 1, n, k, hw, f, fam)
            now = "rolled" if f.extra.get("rolled_reduce") else "batched"
            src = "" if f.source == "table" else f" ({f.source})"
            lines.append(f"| {n}x{k} | 1 | {_short(cfg.name())} | {now}{src} | {_r(eb.gemm_us)} | {_r(en.gemm_us)} |")
    lines += ["", SM100_ASSUMPTIONS]
    out.write_text("\n".join(lines).rstrip() + "\n")


SM100_ASSUMPTIONS = """## Model assumptions (B200)

- 148 SMs, ~1.965 GHz, 8 TB/s HBM peak with 6.0-6.8 TB/s (75-85 %) achievable, L2 126 MB, DRAM latency 1400-2400
  cycles, L2 300-700 cycles, 64 B/clock per SM from L2/DRAM: published figures where known
  (`nvgemm/heuristics/perfmodel/hardware.py` cites them), assumptions otherwise.
- For these tcgen05/TMA kernels instruction counts do not matter; the model uses bytes in flight and
  pipeline depth: one CTA per SM keeps `stages` 256-deep K tiles in flight (stages from shared memory:
  `(232448 - 2048) // stage bytes`, capped at 12; checked against the compiled kernels' launch), so a
  stage takes colimit(L / stages, stage bytes / 64 B per clock, MMA time, chip byte step); the persistent
  grid is the launcher's own bound (`templates/sm100/occupancy.aot_max_active_clusters` x cluster size:
  the clusters the GPC topology guarantees, one shared function); work units run in rounds over that
  grid (all CTAs in the full rounds, units mod grid in the last); + fill (one DRAM latency + the ring)
  + the exposed epilogue (200 cycles per 128 x 32 sub-tile, assumption) + split-K (fence + counter
  atomic = 2 L2 round trips, then the reduction) as the tail.
- Co-limits combined as for sm90 (`colimit`); launch 1.5-2.5 us less 0.3-0.7 us with PDL.
- Per call adds two helper kernels (activation quantize, alpha product) at 1.0-2.0 us each.
- Which reduction a compiled kernel has is read from its SASS (the table's `rolled_reduce`); configs not in
  the table are assumed to have the current kernel's batched reduction.
"""


MMA_M = tuple(range(1, 17)) + (24, 32, 40, 48, 56, 64)
MMA_GPUS = ("RTX5090", "L40S")


def mma_archs_report(out: Path, gpus=MMA_GPUS) -> None:
    """The mma decode kernel on GeForce Blackwell / Ada (Llama-3.1-8B decode GEMMs, M = 1..64): the runtime's
    pick against bf16 cuBLAS, both modelled with the GPU's profile and the same assumptions."""
    import torch

    from nvgemm.heuristics.perfmodel import bf16_baseline, estimate, get_hardware
    from nvgemm.templates.sm90_w4a16.backend import pick_config

    lines = _header("W4A16 mma decode kernel on " + " / ".join(gpus) + ": performance MODEL (not a measurement)",
                    "python bench/perf_model.py mma")
    for gpu in gpus:
        hw = get_hardware(gpu)
        lines += [f"## {gpu} ({hw.arch}, {hw.sm_count} SMs, {hw.peak_bw_tbs * 1000:.0f} GB/s peak): model", "",
                  f"Hardware source: {hw.source}.", "",
                  "model x bf16 = modelled bf16 cuBLAS time / modelled W4A16 time (low end, high end of both ranges); "
                  "bytes x = the byte ratio of the two GEMMs (bf16 weights + activations + output vs NVFP4 weights + "
                  "scales + the same), the ceiling no modelled ratio exceeds (tests/cpu/test_perfmodel.py).", "",
                  "| N x K (layer) | M | model: runtime pick | model us | model bf16 us | model x bf16 | bytes x |",
                  "|---|---|---|---|---|---|---|"]
        for n, k, layer in SHAPES[:4]:
            for m in MMA_M:
                pick = pick_config(m, n, k, torch.bfloat16, "none", hw.sm_count, hw.arch)
                e = estimate(pick, m, n, k, gpu, activation="none")
                b = bf16_baseline(m, n, k, gpu)
                bound = b.bytes / (e.geometry.weight_bytes + 2.0 * m * k + 2.0 * m * n)
                ratios = [b.total_us[i] / e.total_us[i] for i in range(2)]
                assert max(ratios) <= bound, (gpu, n, k, m, ratios, bound)
                lines.append(f"| {n}x{k} ({layer}) | {m} | {_short(pick.name())} | {_r(e.total_us)} | "
                             f"{_r(b.total_us)} | {ratios[0]:.2f}-{ratios[1]:.2f} | {bound:.2f} |")
        lines.append("")
    out.write_text("\n".join(lines) + "\n")


SM120_GPUS = ("RTX5090", "RTXPRO6000", "GB10", "RTX5080")


def sm120_rows(gpus=SM120_GPUS, ms=MMA_M):
    """(gpu, n, k, layer, m, pick, estimate, family model range, bf16 baseline, byte ratio) of the sm120 W4A4
    decode kernel's runtime pick on the Llama-3.1-8B decode GEMMs (activation none)."""
    from nvgemm.heuristics.perfmodel import bf16_baseline, estimate
    from nvgemm.templates.sm120_w4a4.perf import device_for, model_range_us
    from nvgemm.templates.sm120_w4a4.policy import pick_config

    for gpu in gpus:
        from nvgemm.heuristics.perfmodel import get_hardware

        hw = device_for(get_hardware(gpu).arch, gpu=gpu)
        for n, k, layer in SHAPES[:4]:
            for m in ms:
                pick = pick_config(m, n, k, "none", hw.arch, hw.sm_count, gpu)
                e = estimate(pick, m, n, k, gpu, activation="none")
                b = bf16_baseline(m, n, k, gpu)
                # the W4A4 GEMM's own bytes: padded NVFP4 weights + scales, NVFP4 activations + scales, bf16 output
                bound = b.bytes / (e.geometry.weight_bytes + 0.5625 * m * k + 2.0 * m * n)
                yield gpu, n, k, layer, m, pick, e, model_range_us(pick, m, n, k, hw), b, bound


def sm120_report(out: Path, gpus=SM120_GPUS) -> None:
    """The sm120 W4A4 decode kernel on consumer / workstation Blackwell and DGX Spark (Llama-3.1-8B decode GEMMs,
    M = 1..64): the runtime's pick against bf16 cuBLAS, both modelled with the GPU's profile and the same
    assumptions."""
    from nvgemm.heuristics.perfmodel import get_hardware

    lines = _header("NVFP4 W4A4 sm120 decode kernel on " + " / ".join(gpus) + ": performance MODEL (not a "
                    "measurement)", "python bench/perf_model.py sm120")
    lines += [
        "The kernel (`templates/sm120_w4a4`, backend `cutedsl_sm120`) compiles for sm_120a / sm_121a and ran bit-exact",
        "on nvgemm's PTX emulator; it has never run on hardware. Every time below is a model.",
        "",
        "- model us: nvgemm's performance model (`nvgemm.heuristics.perfmodel.estimate`: the family's `Sm120Facts`,",
        "  static main-loop estimate, no SASS table record) for the whole call: activation quantizer + GEMM",
        "  (low end, high end of every range).",
        "- family model us: the family's own byte / latency model (`templates/sm120_w4a4/perf.py`) that ranks the",
        "  candidates (the pick is its first), GEMM only.",
        "- model bf16 us: the bf16 cuBLAS baseline (`heuristics/perfmodel/baseline.py`) on the same hardware profile,",
        "  bandwidth range, fill, launch and PDL saving.",
        "- model x bf16 = model bf16 us / model us at the same end of both ranges; bytes x = bf16 GEMM bytes (weights",
        "  + activations + output) / the W4A4 GEMM's bytes (padded NVFP4 weights and scales + NVFP4 activations and",
        "  scales + bf16 output), the ceiling no modelled ratio exceeds",
        "  (`tests/cpu/test_perfmodel.py::test_sm120_w4a4_ratio_never_exceeds_the_byte_ratio`).",
        "- Activation `none` (the bf16 baseline has no fused epilogue either).",
        "",
    ]
    rows = list(sm120_rows(gpus))
    for gpu in gpus:
        hw = get_hardware(gpu)
        mine = [r for r in rows if r[0] == gpu]
        rat = [r[8].total_us[i] / r[6].total_us[i] for r in mine for i in range(2)]
        lines += [f"## {gpu} ({hw.arch}, {hw.sm_count} SMs, {hw.peak_bw_tbs * 1000:.0f} GB/s peak): model", "",
                  f"Hardware source: {hw.source}.", "",
                  f"Modelled W4A4 / bf16 speed-up over these {len(mine)} points: {min(rat):.2f}x-{max(rat):.2f}x (a model).",
                  "",
                  "| N x K (layer) | M | model: runtime pick | model us | family model us | model bf16 us | model x bf16 "
                  "| bytes x |", "|---|---|---|---|---|---|---|---|"]
        for _, n, k, layer, m, pick, e, fam, b, bound in mine:
            ratios = [b.total_us[i] / e.total_us[i] for i in range(2)]
            assert max(ratios) <= bound, (gpu, n, k, m, ratios, bound)
            lines.append(f"| {n}x{k} ({layer}) | {m} | {_short(pick.name())} | {_r(e.total_us)} | {_r(fam)} | "
                         f"{_r(b.total_us)} | {ratios[0]:.2f}-{ratios[1]:.2f} | {bound:.2f} |")
        lines.append("")
    out.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", choices=("sm90", "sm100", "mma", "sm120", "all"))
    ap.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    d = Path(args.out_dir)
    if args.which in ("sm90", "all"):
        sm90_report(d / "sm90_model.md")
        print(f"wrote {d / 'sm90_model.md'}")
    if args.which in ("sm100", "all"):
        sm100_report(d / "sm100_model.md")
        print(f"wrote {d / 'sm100_model.md'}")
    if args.which in ("mma", "all"):
        mma_archs_report(d / "mma_archs_model.md")
        print(f"wrote {d / 'mma_archs_model.md'}")
    if args.which in ("sm120", "all"):
        sm120_report(d / "sm120_model.md")
        print(f"wrote {d / 'sm120_model.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
