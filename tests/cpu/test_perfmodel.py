"""The CPU performance model (nvgemm.heuristics.perfmodel): SASS parsing, the model's arithmetic against
hand-computed values, the committed table, the CLI and ``nvgemm plan``'s model column.

Hand-computed values are derived in the comments next to each assertion; tolerances are 1e-6
relative (the code and the hand derivation do the same floating-point operations in a different
order) unless stated.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from nvgemm import cli
from nvgemm.heuristics.perfmodel import (
    FamilyFacts,
    Geometry,
    KernelFacts,
    bf16_baseline,
    estimate,
    estimate_with,
    get_hardware,
    lookup,
    rank,
)
from nvgemm.heuristics.perfmodel import sass as S
from nvgemm.templates.sm100_w4a4 import perf as F100
from nvgemm.templates.sm90_w4a16.perf import MmaFacts
from nvgemm.heuristics.perfmodel.facts import SplitKReduce
from nvgemm.heuristics.perfmodel.model import colimit, occupancy, rounds
from nvgemm.heuristics.perfmodel.table import load_table
from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config as C90
from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig as C100

H200 = get_hardware("H200")
REL = 1e-6


def close(a, b, rel=REL):
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


# ------------------------------------------------------------------------------ SASS parsing


def hi_word(stall=1, yield_=0, wbar=7, rbar=7, wait=0, low41=0x0000000000F):
    """Upper 64 bits of an instruction with the given control fields (inverse of decode_control)."""
    c = stall | yield_ << 4 | wbar << 5 | rbar << 8 | wait << 11
    return c << 41 | low41


def line(off, text, **ctrl):
    return (f"        /*{off:04x}*/                   {text} ;   /* 0x0000000000000000 */\n"
            f"                                                   /* 0x{hi_word(**ctrl):016x} */\n")


# A 5-instruction loop: weight load (SB2), address bump, FFMA waiting on SB2 (stall 4), compare,
# backward branch; then an exit and the end-of-function self-branch (not a loop).
SNIPPET = (
    "\tcode for sm_90a\n\t\tFunction : toy_kernel\n"
    + line(0x0000, "MOV R2, c[0x0][0x210]", stall=1)
    + line(0x0010, "LDG.E.NA.128.CONSTANT R4, desc[UR4][R2.64]", stall=1, wbar=2)
    + line(0x0020, "IADD3 R2, P0, R2, 0x10, RZ", stall=1)
    + line(0x0030, "FFMA R8, R4, R5, R8", stall=4, wait=0b000100)
    + line(0x0040, "ISETP.NE.AND P1, PT, R2, R9, PT", stall=1)
    + line(0x0050, "@P1 BRA 0x10", stall=1)
    + line(0x0060, "EXIT", stall=1)
    + line(0x0070, "BRA 0x70", stall=1)
)
RESOURCES = """
Resource usage:
 Function toy_kernel:
  REG:40 STACK:0 SHARED:512 LOCAL:8 CONSTANT[0]:600 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_control_bits_decode_recorded_words():
    # recorded from the gemv kernel's SASS (cuobjdump 13.1, sm_90a):
    # S2R R67, SR_CTAID.Z  /* 0x000e2e0000002700 */: c = 0x000e2e0000002700 >> 41 = 0x717
    #   -> stall 7, yield 1, wbar (0x717 >> 5) & 7 = 0 (SB0), rbar 7, wait 0
    assert S.decode_control(0x000E2E0000002700) == {"stall": 7, "yield_": 1, "wbar": 0, "rbar": 7, "wait": 0}
    # UIMAD UR4, UR12, UR6, URZ  /* 0x002fc6000f8e023f */ (consumes the S2UR that set SB1):
    #   c = 0x17e3 -> stall 3, yield 0, wbar 7, rbar 7, wait (0x17e3 >> 11) = 0b10 (SB1)
    assert S.decode_control(0x002FC6000F8E023F) == {"stall": 3, "yield_": 0, "wbar": 7, "rbar": 7, "wait": 2}
    for fields in ({"stall": 4, "yield_": 1, "wbar": 3, "rbar": 5, "wait": 0b101010},):
        assert S.decode_control(hi_word(**fields)) == fields


def test_parse_loops_and_main_loop():
    fns = S.parse_sass(SNIPPET, RESOURCES)
    assert len(fns) == 1
    fn = fns[0]
    assert (fn.name, fn.regs, fn.shared, fn.local) == ("toy_kernel", 40, 512, 8)
    assert [i.base for i in fn.instrs] == ["MOV", "LDG", "IADD3", "FFMA", "ISETP", "BRA", "EXIT", "BRA"]
    assert fn.instrs[5].pred == "@P1 "
    loops = S.find_loops(fn)
    assert loops == [S.Loop(1, 5)]  # the self-branch at 0x70 is not a loop
    stream = r"^LDG\..*\bNA\b"
    lp = S.main_loop(fn, stream)
    assert lp == S.Loop(1, 5) and S.enclosing_loop(fn, lp) is None
    body = S.body(fn, lp)
    assert len(S.counted(body)) == 5
    # issue: 5 instructions, integer datapath IADD3 + ISETP at 2 cycles each = 4 < 5
    assert S.issue_cycles(body) == 5
    assert S.opcode_histogram(body) == {"BRA": 1, "FFMA": 1, "IADD3": 1, "ISETP": 1, "LDG": 1}
    assert S.spills(fn.instrs) == (0, 0)


def test_uniform_predicate_branch_is_a_loop():
    """sm_120a SASS puts a loop's branch condition in the operands (recorded from the W4A16 mma kernel
    for sm_120a, cuobjdump 13.x): ``BRA.U UP0, 0xcd0`` closes the main loop, ``BRA.U !UP2, 0x2c40`` skips
    it forward; both targets parse, and the backward one is the loop."""
    text = (
        "arch = sm_120a\n\tcode for sm_120a\n\t\tFunction : k\n"
        + line(0x00, "BRA.U !UP2, 0x50", stall=1)
        + line(0x10, "LDGSTS.E.BYPASS.LTC128B.128 [R29+UR10], desc[UR11][R48.64]", stall=1, wbar=0)
        + line(0x20, "HMMA.16816.F32.BF16 R4, R12, R16, R4", stall=1)
        + line(0x30, "@P0 BRA P1, 0x20", stall=1)
        + line(0x40, "BRA.U UP0, 0x10", stall=1)
        + line(0x50, "EXIT", stall=1)
    )
    fn = S.parse_sass(text)[0]
    assert fn.arch == "sm_120a"
    assert [i.branch_target() for i in fn.instrs if i.base == "BRA"] == [0x50, 0x20, 0x10]
    assert S.main_loop(fn, r"^LDGSTS") == S.Loop(1, 4)
    assert S.find_loops(fn) == [S.Loop(2, 3), S.Loop(1, 4)]
    # sm_100a: the family's table facts were derived without such loops (S.OPERAND_BRANCH_LOOP_ARCHS)
    fn100 = S.parse_sass(text.replace("sm_120a", "sm_100a"))[0]
    assert fn100.arch == "sm_100a" and S.find_loops(fn100) == []


def test_loop_cycles_replays_the_scoreboards():
    body = S.body(S.parse_sass(SNIPPET)[0], S.Loop(1, 5))
    stream = r"^LDG\..*\bNA\b"
    # per iteration: LDG at t, IADD3 t+1, FFMA waits for SB2 (t + L) then stalls 4, ISETP 1, BRA 1
    # -> L + 6 cycles per iteration
    assert S.loop_cycles(body, stream, 1000.0, 300.0) == 1006.0
    base, rt = S.chain_coefficients(body, stream, 1200.0, 2000.0, 300.0)
    assert (base, rt) == (6.0, 1.0)
    # the same load classified as a non-streamed (L2) load: the DRAM latency no longer matters
    base, rt = S.chain_coefficients(body, r"^NOTHING", 1200.0, 2000.0, 300.0)
    assert (base, rt) == (306.0, 0.0)


def test_depbar_waits_for_all_but_n():
    text = (
        "\t\tFunction : k\n"
        + line(0x00, "LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64]", stall=1, wbar=0)
        + line(0x10, "LDGSTS.E.BYPASS.128 [R1+0x10], desc[UR4][R4.64]", stall=1, wbar=0)
        + line(0x20, "DEPBAR.LE SB0, 0x1", stall=1)
        + line(0x30, "@P0 BRA 0x0", stall=1)
    )
    body = S.parse_sass(text)[0].instrs
    # the two copies complete at t+L and t+1+L; "at most 1 outstanding" waits for the first only:
    # 2 + L, then DEPBAR 1 cycle, BRA 1 cycle; the next iteration re-issues at once
    assert S.loop_cycles(body, r"^LDGSTS", 500.0, 100.0) == 502.0


# ------------------------------------------------------------------------------ model arithmetic


class _ToyFamily(FamilyFacts):
    name = "test.toy"
    arch = "sm_90a"
    engine = "sass_chain"

    def __init__(self, geo):
        self.geo = geo

    def geometry(self, config, m, n, k, hw):
        return self.geo


class _Cfg:
    def name(self):
        return "toy"


def _toy_facts(**kw):
    d = dict(config="toy", arch="sm_90a", family="test.toy", regs=64, smem_bytes=0, loop_instrs=100,
             loop_issue_cycles=100, chain_base=50.0, round_trips=1.0, elems_per_thread_iter=100.0)
    d.update(kw)
    return KernelFacts(**d)


def test_occupancy_from_registers_smem_threads():
    geo = Geometry(ctas=1, threads=128, iters_per_cta=1, passes_per_cta=1, stream_bytes_per_iter=0,
                   other_bytes_per_iter=0, dram_bytes=0, weight_bytes=1)
    # 116 regs -> 120 x 32 = 3840 per warp; 16384 // 3840 = 4 warps per scheduler -> 16 warps -> 4 CTAs
    o = occupancy(_toy_facts(regs=116), geo, H200)
    assert (o.ctas_per_sm, o.warps_per_sm, o.limiter) == (4, 16, "registers")
    # 64 regs -> 2048 per warp -> 8 per scheduler -> 32 warps -> 8 CTAs; 40 KB smem -> 233472 // 41984 = 5
    o = occupancy(_toy_facts(regs=64, smem_bytes=40960), geo, H200)
    assert (o.ctas_per_sm, o.limiter) == (5, "shared memory")


CLK = 1.98e9
BW_CLK = (4.3e12 / CLK, 3.85e12 / CLK)  # achievable bytes per cycle at the (low, high) time end


def _h(r):
    return (1 + r ** 4) ** 0.25


def _colimit2(a, b):
    """The co-limit of two terms written out (COLIMIT_MARGIN 0.5, COLIMIT_P 4)."""
    hi, lo = max(a, b), min(a, b)
    r = lo / hi
    return hi * (1 + (_h(r) - _h(0.5) if r > 0.5 else 0.0))


def test_colimit_is_max_apart_and_charges_close_limits():
    assert colimit(7.0) == 7.0 and colimit(1.0, 0.5) == 1.0 and colimit(1.0, 0.3, 0.2) == 1.0
    # equal terms: 2^(1/4) - (1 + 1/16)^(1/4) = 17.4 % above either
    assert close(colimit(1.0, 1.0), 1 + 2 ** 0.25 - 1.0625 ** 0.25)
    assert close(colimit(1.0, 1.0), 1.17394, rel=1e-5)
    assert close(colimit(2.0, 1.6), 2.0 * (1 + _h(0.8) - _h(0.5)))
    assert colimit(1.0, 0.9) > colimit(1.0, 0.7) > colimit(1.0, 0.55) > 1.0  # grows as they close up


def test_rounds_spread_ctas_breadth_first():
    # 224 CTAs, 1 per SM: 132, then 92 (40 SMs idle); 2 per SM: one round, 92 SMs with 2
    assert rounds(224, 132, 1) == [(1, 1, 132), (1, 1, 92)]
    assert rounds(224, 132, 2) == [(1, 2, 224)]
    # 112 CTAs (28672 x 4096 in 256-row tiles): 20 SMs idle
    assert rounds(112, 132, 2) == [(1, 1, 112)]
    # 1000 CTAs, 3 per SM: 7 per SM and one more on 76; two full rounds of 3, then 2 on 76 SMs + 1 on 56
    assert rounds(1000, 132, 3) == [(2, 3, 396), (1, 2, 208)]
    assert sum(c * a for c, _, a in rounds(1000, 132, 3)) == 1000


def test_model_single_round_latency_chain_by_hand():
    geo = Geometry(ctas=132, threads=128, iters_per_cta=10, passes_per_cta=1, stream_bytes_per_iter=1000.0,
                   other_bytes_per_iter=0.0, dram_bytes=1e6, weight_bytes=1e6)
    e = estimate_with(_Cfg(), 1, 1, 1, H200, _toy_facts(), _ToyFamily(geo))
    # 8 CTAs/SM fit; 132 CTAs -> one round of 1 CTA per SM, w = 1 warp per scheduler:
    # step_sm = colimit(max(50 + L, L / 1), 1 x 100, 1000 / 64) = 50 + L (the others < half of it);
    # step_chip = 132 x (1e6 / 1320) B / (4.3e12 / 1.98e9 B/clk) = 46 cycles: far below -> step = 50 + L
    # fill = L + 1 x 1000 / 64 (one CTA's first stage through the port); no tail (no pass / fixed instructions, no epilogue)
    for i, lat in enumerate((1200.0, 2000.0)):
        cyc = (lat + 1000 / 64) + 10 * (50 + lat)
        assert close(e.kernel_us[i], cyc / CLK * 1e6)
        assert close(e.fill_us[i], (lat + 1000 / 64) / CLK * 1e6)
    assert close(e.byte_floor_us, 1e6 / 4.3e12 * 1e6)
    # issue floor: 132 CTAs x 4 warps x 10 x 100 cycles over 132 x 4 schedulers = 1000 cycles
    assert close(e.issue_floor_us, 1000 / CLK * 1e6)
    assert e.limiter == ("latency", "latency") and e.rounds == 1 and e.active_sms == 132
    # PDL off: launch 1.5 / 2.5 us
    assert close(e.total_us[0], e.kernel_us[0] + 1.5) and close(e.total_us[1], e.kernel_us[1] + 2.5)
    # Little: 4.3 TB/s / 132 SMs x 1200 / 1.98 GHz = 19.74 KB per SM
    assert close(e.inflight_needed_per_sm[0], 4.3e12 / 132 * 1200 / CLK)
    assert e.inflight_peak_per_sm == 8 * 1000.0  # 8 resident CTAs x depth 1 x one iteration's stream bytes


def test_idle_sms_partial_wave_fill_tail_and_splitk_by_hand():
    """224 CTAs on 132 SMs, 1 resident per SM (shared memory): a full round, then a partial one on
    92 SMs while 40 idle. Each CTA streams 8 KB per step with 2 steps in flight."""
    sk = SplitKReduce("batched", 2, 0.0, dependent_l2_trips=3.0)
    geo = Geometry(ctas=224, threads=128, iters_per_cta=10, passes_per_cta=1, stream_bytes_per_iter=8192.0,
                   other_bytes_per_iter=0.0, dram_bytes=224 * 10 * 8192.0, weight_bytes=224 * 10 * 8192.0,
                   depth=2.0, splitk=sk)
    facts = _toy_facts(smem_bytes=120000, chain_base=50.0, round_trips=0.5, fixed_instrs=40)
    e = estimate_with(_Cfg(), 1, 1, 1, H200, facts, _ToyFamily(geo))
    assert e.occupancy.ctas_per_sm == 1 and e.rounds == 2 and e.active_sms == 132
    for i, (lat, l2) in enumerate(((1200.0, 270.0), (2000.0, 550.0))):
        latency = max(50 + 0.5 * lat, lat / 2)  # SASS chain vs Little's law (2 steps in flight per L)
        step_sm = latency  # issue 100, fabric 8192 / 64 = 128: both below half of it
        dram_step = 8192.0 / BW_CLK[i]  # chip cycles per CTA step (DRAM bytes per step = 8192)
        fill = lat + 1 * 8192 / 64  # one loaded latency + the first ring stage through the SM's port
        tail = 1 * 40 + 3 * l2  # fixed instructions x 1 warp per scheduler + the split-K round trips
        round1 = fill + 10 * _colimit2(step_sm, 132 * dram_step) + tail
        # the partial round: 92 CTAs; the 40 idle SMs add no bandwidth; its CTAs pay a fresh fill (q = 1)
        round2 = fill + 10 * _colimit2(step_sm, 92 * dram_step) + tail
        assert close(e.kernel_us[i], (round1 + round2) / CLK * 1e6), (i, e.kernel_us[i], (round1 + round2) / CLK * 1e6)
        assert close(e.tail_us[i], tail / CLK * 1e6)
    # the naive byte floor (bytes / achievable bandwidth) is far below: waves, fill and tail are charged
    assert e.kernel_us[0] > 1.5 * e.byte_floor_us


def test_bf16_baseline_by_hand():
    b = bf16_baseline(1, 4096, 4096, "H200")
    nbytes = 2 * 4096 * 4096 + 2 * 4096 + 2 * 4096
    assert b.bytes == nbytes
    # the same bandwidth range, fill (one DRAM latency) and launch model as nvgemm's kernels;
    # the tensor term (8-row tiles at 70 % of 989 TFLOPS: 0.4 us) is far below the stream
    assert close(b.total_us[0], 1.5 - 0.7 + 1200 / CLK * 1e6 + nbytes / 4.3e12 * 1e6)
    assert close(b.total_us[1], 2.5 - 0.3 + 2000 / CLK * 1e6 + nbytes / 3.85e12 * 1e6)
    # the anchors.md cross-check: B200 6656 x 19968 at M=1 measured 46.2 us (FlashInfer PR #4466)
    lo, hi = bf16_baseline(1, 6656, 19968, "B200").total_us
    assert lo <= 46.2 <= hi


def _preset_picks(gpu: str, a_format: str, ms):
    """(M, N, K, policy pick) for every preset layer GEMM and M on ``gpu`` (nvMatmulHeuristics off)."""
    from nvgemm.heuristics import candidates
    from nvgemm.heuristics.presets import PRESETS
    from nvgemm.core.problem import GemmProblem, Target

    target = Target.from_gpu(gpu)
    shapes = sorted({(lg.n, lg.k) for p in PRESETS.values() for lg in p.layers})
    for n, k in shapes:
        for m in ms:
            c = candidates(GemmProblem(n=n, k=k, m=m, a_format=a_format, target=target), use_nvmmh=False)
            if c:
                yield m, n, k, c[0].config


@pytest.mark.parametrize("gpu,a_format,ms", [("H200", "bf16", (1, 2, 4, 8, 16, 32, 64, 128, 256)),
                                             ("B200", "nvfp4", (1, 2, 4, 8, 16, 32, 128)),
                                             ("RTX5090", "bf16", (1, 2, 3, 4, 8, 13, 16, 24, 32, 48, 64)),
                                             ("L40S", "bf16", (1, 2, 3, 4, 8, 13, 16, 24, 32, 48, 64))])
def test_no_modelled_ratio_exceeds_the_byte_ratio(gpu, a_format, ms):
    """nvgemm / bf16 cuBLAS, both modelled with one bandwidth, fill and launch model: the speed-up
    can never exceed the ratio of the bytes the two GEMMs must move -- bf16 weights + activations +
    output against NVFP4 weights incl. their scale bytes exactly (the family's padded weight
    bytes) + the same activations and output (W4A16) or the output alone (W4A4: its activations
    are smaller still, so this bound is looser). At M = 1 on a large layer this is ~2 / 0.5625."""
    worst = 0.0
    n_checked = 0
    for m, n, k, cfg in _preset_picks(gpu, a_format, ms):
        e = estimate(cfg, m, n, k, gpu)
        b = bf16_baseline(m, n, k, gpu)
        assert e is not None, cfg.name()
        other = 2.0 * m * k + 2.0 * m * n if a_format == "bf16" else 2.0 * m * n
        bound = b.bytes / (e.geometry.weight_bytes + other)
        for i in range(2):  # the same end of every range on both sides
            ratio = b.total_us[i] / e.total_us[i]
            assert ratio <= bound, (cfg.name(), m, n, k, i, ratio, bound)
            worst = max(worst, ratio / bound)
        n_checked += 1
    assert n_checked >= 5 * len(ms)
    # the weights-only byte ratio of a large W4A16 layer: 2 / (0.5 + 1/16) exactly
    w = MmaFacts().geometry(C90("mma", tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4), 1, 28672, 4096,
                            H200).weight_bytes
    assert close(2.0 * 28672 * 4096 / w, 2 / 0.5625)


@pytest.mark.parametrize("gpu", ["RTX5090", "RTXPRO6000", "GB10", "RTX5080"])
def test_sm120_w4a4_ratio_never_exceeds_the_byte_ratio(gpu):
    """The sm120 W4A4 decode kernel's policy pick (``heuristics.candidates`` on ``Target.from_gpu(gpu)``) against
    the bf16 cuBLAS baseline on the same hardware profile, Llama-3.1-8B decode GEMMs, M = 1..64 (the rows of
    ``bench/results/sm120_model.md``): the modelled speed-up, at either end of both ranges, never exceeds the
    bytes the two GEMMs must move -- bf16 weights + activations + output against the padded NVFP4 weights and
    scales + NVFP4 activations and scales + bf16 output. A GPU whose profile the policy ignored (modelled on
    another GPU's SMs / bandwidth) would still be bounded; the pick is checked to be the gpu-aware one."""
    from nvgemm.core.problem import GemmProblem, Target
    from nvgemm.heuristics import candidates
    from nvgemm.templates.sm120_w4a4.config import Sm120W4A4Config
    from nvgemm.templates.sm120_w4a4.policy import pick_config

    target = Target.from_gpu(gpu)
    hw = get_hardware(gpu)
    worst, n_checked = 0.0, 0
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
        for m in (1, 2, 3, 4, 8, 13, 16, 24, 32, 48, 64):
            c = candidates(GemmProblem(n=n, k=k, m=m, a_format="nvfp4", target=target), use_nvmmh=False)
            cfg = c[0].config
            assert isinstance(cfg, Sm120W4A4Config) and cfg == pick_config(m, n, k, "none", hw.arch, hw.sm_count, gpu)
            e = estimate(cfg, m, n, k, gpu, activation="none")
            b = bf16_baseline(m, n, k, gpu)
            assert b.bytes == 2.0 * n * k + 2.0 * m * k + 2.0 * m * n
            bound = b.bytes / (e.geometry.weight_bytes + 0.5625 * m * k + 2.0 * m * n)
            for i in range(2):
                ratio = b.total_us[i] / e.total_us[i]
                assert ratio <= bound, (gpu, cfg.name(), m, n, k, i, ratio, bound)
                worst = max(worst, ratio / bound)
            n_checked += 1
    assert n_checked == 44 and 0.5 < worst < 1.0


def test_mma_geometry_by_hand():
    # 8 tokens x 128 rows per CTA (4 warps x 2 row tiles), stages of 256 K, 4-stage ring
    c = C90("mma", tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4, pdl=True)
    g = MmaFacts().geometry(c, 1, 28672, 4096, H200)
    assert (g.ctas, g.iters_per_cta, g.passes_per_cta) == (28672 // 128, 4096 // 256, 1)
    # per stage: 4 warps x 2 row tiles x 4 chunks x 512 B weights + 4 x 2 x 32 lanes x 8 B scales
    assert g.stream_bytes_per_iter == 4 * 2 * 4 * 512 + 4 * 2 * 32 * 8
    assert g.depth == 3 and g.pdl and g.aux_kernels == 0 and g.splitk is None
    assert g.weight_bytes == 28672 * 4096 * 0.5625
    assert MmaFacts().elems_per_thread_iter(c) == 2 * 4 * 32  # row tiles x chunks x 32 per lane
    assert MmaFacts().min_round_trips(c) == 1 / 3
    # K = 4100 pads to 4352 = 17 stages; N = 4100 pads to 4112 rows (257 tiles)
    g2 = MmaFacts().geometry(c, 1, 4100, 4100, H200)
    assert g2.iters_per_cta == 17 and g2.weight_bytes == 4112 * 4352 * 0.5625
    # split-K 4: 16 stages -> 4 per CTA; an in-kernel (batched) reduction of fp32 partials
    g4 = MmaFacts().geometry(C90("mma", tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4, split_k=4),
                             1, 4096, 4096, H200)
    assert g4.iters_per_cta == 4 and g4.ctas == 32 * 4 and g4.splitk.kind == "batched"
    # M = 64 with tile_m 32: 2 M tiles; 66 MB of weights > 80 % of the 50 MB L2 -> read twice
    c32 = C90("mma", tile_m=32, tile_n=128, tile_k=256, num_warps=8, stages=3)
    g32 = MmaFacts().geometry(c32, 64, 28672, 4096, H200)
    assert g32.ctas == 2 * 224 and close(g32.dram_bytes, 2 * g32.weight_bytes + 64 * 4096 * 2 + 64 * 28672 * 2)
    assert g32.l2_reread_fraction == 0.0
    # 9.4 MB fits L2: the second M tile re-reads from L2
    assert close(MmaFacts().geometry(c32, 64, 4096, 4096, H200).l2_reread_fraction, 0.5)


def test_sm100_stages_tmem_and_splitk_reduce_by_hand():
    c = C100(128, 16, swap_ab=True, split_k=4)
    # stage: A 128 x 128 + B 16 x 128 + SFA 128 x 16 + SFB 128 x 16 = 22528 B; (232448 - 2048) // 22528 = 10
    assert F100.stage_bytes(c)["total"] == 22528 and F100.num_stages(c) == 10
    # TMEM: 16 x 2 accumulator stages + 4 x 4 SFA + 4 x 4 SFB = 64 columns
    assert F100.tmem_columns(c) == 64
    fam = F100.Sm100Facts()
    b200 = get_hardware("B200")
    rolled = fam.geometry(c, 1, 4096, 4096, b200, reduce_kind="rolled").splitk
    batched = fam.geometry(c, 1, 4096, 4096, b200, reduce_kind="batched").splitk
    # fence + atomic (2 trips), then one sub-tile of 16 elements x (S - 1) = 48 dependent loads, or 1 batch
    assert rolled.dependent_l2_trips == 2 + 48 and batched.dependent_l2_trips == 2 + 1
    g = fam.geometry(c, 1, 4096, 4096, b200)
    # 4096 / 128 = 32 weight tiles x 1 token tile x 4 splits = 128 units on 128 CTAs; 16 K tiles / 4
    assert (g.ctas, g.units_per_cta, g.iters_per_cta, g.depth) == (128, 1, 4, 10)
    assert fam.shape_problem(C100(128, 8, swap_ab=True), 9, 4096, 4096).startswith("narrow tile_n=8")


def test_sm100_grid_is_the_launchers_persistent_bound():
    """The model's persistent grid is the launcher's: ``max_active_clusters_for`` bakes
    ``aot_max_active_clusters`` (the clusters the B200's GPC topology guarantees: 34 of 4, 14 of 8
    -- not sm_count // cluster = 37 / 18) into the kernel, and the model calls the same function."""
    from types import SimpleNamespace

    from nvgemm.templates.sm100_w4a4.kernel import max_active_clusters_for

    b200 = get_hardware("B200")
    fam = F100.Sm100Facts()
    for cm, want in ((1, 148), (2, 148), (4, 136)):
        c = C100(128, 8, cm, 1, swap_ab=True, split_k=4)
        spec = SimpleNamespace(arch=b200.arch, config=c, hw=SimpleNamespace(sm_count=b200.sm_count,
                                                                           max_active_clusters=None))
        assert max_active_clusters_for(spec) * cm == want == F100.persistent_ctas(b200, cm)
        # 57344 rows / 128 = 448 weight tiles x 4 splits = 1792 units: more than the grid holds
        assert fam.geometry(c, 1, 57344, 8192, b200).ctas == want


# ------------------------------------------------------------------------------ table and API


def test_table_header_and_entries():
    t = load_table()
    h = t["header"]
    assert h.get("cutlass_dsl") and h.get("command") == "nvgemm model --regen-table"
    assert set(t["entries"]) == {"sm_90a", "sm_100a"}
    for arch, entries in t["entries"].items():
        for name, d in entries.items():
            assert d["config"] == name and d["arch"] == arch
            assert d["regs"] > 0, name


def test_table_file_format_round_trips():
    """The committed file is what ``format_table`` writes (one line per entry) and parses back."""
    from nvgemm.heuristics.perfmodel.table import TABLE_PATH
    from nvgemm.cli.sass_tool import format_table

    t = load_table()
    clean = {"header": t["header"], "entries": t["entries"], **({"spills": t["spills"]} if "spills" in t else {})}
    assert json.loads(format_table(clean)) == clean
    assert TABLE_PATH.read_text() == format_table(clean)


def _spill_table():
    """A table with one main-loop entry and spill records of two variants of its config."""
    ok = {"ldl": 0, "stl": 0, "ldl_loop": 0, "stl_loop": 0, "regs": 76}
    bad = {"ldl": 1, "stl": 1, "ldl_loop": 1, "stl_loop": 0, "regs": 64}
    sk4 = C90("mma", tile_m=32, tile_n=128, tile_k=256, split_k=4, num_warps=8, stages=3, pdl=True)
    sk7 = C90("mma", tile_m=32, tile_n=128, tile_k=256, split_k=7, num_warps=8, stages=3, pdl=True)
    base = C90("mma", tile_m=32, tile_n=128, tile_k=256, num_warps=8, stages=3, pdl=True)
    t = {"header": {}, "entries": {"sm_90a": {base.name(): {"ldl": 0, "stl": 0}}},
         "spills": {"sm_90a": {sk4.name(): {"none": {"ref": ok, "full": bad}, "silu_mul": {"ref": ok, "full": ok}}}}}
    return t, base, sk4, sk7


def test_spill_status_is_per_variant():
    from nvgemm.heuristics.perfmodel.table import spill_status

    t, base, sk4, sk7 = _spill_table()
    # sk4 spills with the full epilogue of activation none (either recorded variant counts)
    assert spill_status(sk4, "none", table=t) is True
    assert spill_status(sk4, "silu_mul", table=t) is False
    # the base config's own entry (reference epilogue) is clean; sk7 was never compiled: unknown,
    # although it shares the base's main loop (a twin's spills are never borrowed)
    assert spill_status(base, "none", table=t) is False
    # sk7 was never compiled: inferred from its recorded split-K sibling sk4, which spills (a
    # twin's record is never used to call a variant clean: for silu_mul sk4 is clean, sk7 unknown)
    assert spill_status(sk7, "none", table=t) is True
    assert spill_status(sk7, "silu_mul", table=t) is None
    t, base, sk4, sk7 = _spill_table()  # a loaded table is read-only (answers are memoised): a new one
    t["spills"]["sm_90a"][sk4.name()]["silu_mul"]["full"] = {"error": "ValueError: boom"}
    assert spill_status(sk4, "silu_mul", table=t) is True  # a failed compile is not spill-free


def test_timing_facts_are_per_variant_where_recorded():
    """A (config, activation) record with the variant's own main-loop facts (``"loop"``) replaces
    the main loop's shared entry for that variant -- field by field the larger of its ``ref`` and
    ``full`` epilogues, registers too -- and the model prices the variant with them; a variant
    without such a record (or asked without an activation) keeps the shared entry."""
    from nvgemm.heuristics.perfmodel.model import estimate_with
    from nvgemm.heuristics.perfmodel.table import lookup

    base = C90("mma", tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=3, pdl=True)
    sk8 = C90("mma", tile_m=8, tile_n=128, tile_k=256, split_k=8, num_warps=4, stages=3, pdl=True)
    entry = {"config": base.name(), "arch": "sm_90a", "family": "sm90.mma", "regs": 56, "smem_bytes": 30000,
             "loop_instrs": 501, "loop_issue_cycles": 576, "fixed_instrs": 364, "chain_base": 921.0,
             "round_trips": 0.5, "elems_per_thread_iter": 256.0}
    loop = {"loop_instrs": 501, "loop_issue_cycles": 576, "pass_instrs": 0, "fixed_instrs": 3076,
            "chain_base": 872.0, "round_trips": 0.5, "stream_loads": 12, "smem_bytes": 30000}
    ok = {"ldl": 0, "stl": 0, "ldl_loop": 0, "stl_loop": 0}
    t = {"header": {}, "entries": {"sm_90a": {base.name(): entry}},
         "spills": {"sm_90a": {sk8.name(): {
             "none": {"ref": {**ok, "regs": 64, "loop": loop},
                      "full": {**ok, "regs": 72, "loop": {**loop, "chain_base": 880.0, "loop_issue_cycles": 580}}},
             "silu_mul": {"ref": {**ok, "regs": 64}, "full": {**ok, "regs": 64}}}}}}
    shared = lookup(sk8, "sm_90a", t)
    assert shared.source.startswith("table (same main loop") and shared.chain_base == 921.0
    v = lookup(sk8, "sm_90a", t, activation="none")
    assert (v.chain_base, v.loop_issue_cycles, v.regs) == (880.0, 580, 72)  # the larger of ref / full
    assert v.fixed_instrs == 364  # static epilogue counts stay the main loop's (module docstring)
    assert v.source.startswith("variant (none")
    assert lookup(sk8, "sm_90a", t, activation="silu_mul") == shared  # records without "loop": shared
    assert lookup(base, "sm_90a", t, activation="none").chain_base == 921.0  # no record at all
    fam, hw = MmaFacts(), H200
    e_shared = estimate_with(sk8, 8, 4096, 4096, hw, shared, fam)
    e_var = estimate_with(sk8, 8, 4096, 4096, hw, v, fam)
    assert e_var.total_us != e_shared.total_us  # the variant's own facts are what gets priced


def test_policy_drops_recorded_spilling_variants(monkeypatch):
    """The sm90 policy reads the spill records: a variant recorded as spilling is never emitted
    (here a synthetic record for every candidate of one problem: all dropped but one)."""
    from nvgemm.templates.sm90_w4a16 import policy as H
    from nvgemm.core.problem import GemmProblem, Target
    from nvgemm.heuristics.perfmodel import table as T

    prob = GemmProblem(n=4096, k=14336, m=32, a_format="bf16", target=Target.from_gpu("H200"))
    cands = H.ranked_candidates(prob, limit=3)
    assert len(cands) == 3
    real = T.load_table()
    bad = {"ldl": 2, "stl": 1, "ldl_loop": 1, "stl_loop": 0, "regs": 64}
    fake = {**{k: v for k, v in real.items() if not k.startswith("_")},  # without the real table's memos
            "spills": {"sm_90a": {**real["spills"]["sm_90a"],
                                  **{c.name: {"none": {"ref": bad, "full": bad}} for c in cands[:2]}}}}
    monkeypatch.setattr(T, "load_table", lambda path=None: fake)
    after = H.ranked_candidates(prob, limit=3)
    assert [c.name for c in after][0] == cands[2].name
    assert not {c.name for c in after} & {c.name for c in cands[:2]}


def test_named_spilling_variants_are_recorded_and_not_emitted():
    """Issue 23: ``mma_t32x128x256_w8_s3_sk7`` (LDL in the main loop even with the reference
    epilogue) and its ``_sk4`` twin with per-column alpha + bias + residual spill; the committed
    table records both from their SASS and the policy never emits them for activation none."""
    from nvgemm.heuristics import candidates
    from nvgemm.heuristics.presets import PRESETS
    from nvgemm.core.problem import GemmProblem, Target
    from nvgemm.heuristics.perfmodel.table import spill_status
    from nvgemm.cli.sass_tool import SM90_M

    sk7 = C90("mma", tile_m=32, tile_n=128, tile_k=256, split_k=7, num_warps=8, stages=3, pdl=True)
    sk4 = C90("mma", tile_m=32, tile_n=128, tile_k=256, split_k=4, num_warps=8, stages=3, pdl=True)
    rec = load_table()["spills"]["sm_90a"]
    assert rec[sk7.name()]["none"]["ref"]["ldl_loop"] > 0
    assert rec[sk4.name()]["none"]["full"]["ldl"] > 0 and rec[sk4.name()]["none"]["ref"]["ldl"] == 0
    assert spill_status(sk7, "none") and spill_status(sk4, "none")
    target = Target.from_gpu("H200")
    for n, k in sorted({(lg.n, lg.k) for p in PRESETS.values() for lg in p.layers}):
        for m in SM90_M:
            names = {c.name for c in candidates(GemmProblem(n=n, k=k, m=m, a_format="bf16", target=target),
                                                use_nvmmh=False)}
            assert sk7.name() not in names and sk4.name() not in names, (n, k, m)


def test_every_recorded_pair_the_policy_emits_is_spill_free():
    """Every (config, activation) the policy emits for the preset shapes that the compile sweep has
    recorded is spill-free in both epilogues (by the policy's filter, checked here end to end), and
    every first choice for the Llama-3.1-8B / 3.3-70B shapes is recorded (the sweep's minimum:
    ``python bench/compile_sweep_sm90.py --shapes llama --top 1``)."""
    from nvgemm.heuristics.perfmodel.table import spill_status
    from nvgemm.cli.sass_tool import LLAMA_SHAPES, SM90_M, policy_pairs

    pairs = policy_pairs("sm_90a")
    assert pairs
    for (cfg, act), probs in pairs.items():
        assert spill_status(cfg, act) is not True, (cfg.name(), act, probs[:3])
    firsts = policy_pairs("sm_90a", shapes=LLAMA_SHAPES, ms=SM90_M, top=1)
    missing = [(c.name(), a) for c, a in firsts if spill_status(c, a) is None]
    assert not missing, f"first choices without a spill record: {missing[:5]} (run bench/compile_sweep_sm90.py)"


def test_regenerate_updates_only_what_it_compiled(tmp_path, monkeypatch):
    """``regenerate_table`` (compiling stubbed out): an explicit config list replaces just those
    entries; a full regeneration of one arch keeps the other arch's entries."""
    from nvgemm.heuristics.perfmodel.table import TABLE_PATH
    from nvgemm.cli import sass_tool

    cfg = C90("mma", tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4, pdl=True)
    fake = dict(lookup(cfg).to_json(), regs=99)
    monkeypatch.setattr(sass_tool, "derive_facts", lambda c, arch=None: (KernelFacts.from_json(fake), ""))
    monkeypatch.setattr(sass_tool, "table_configs", lambda archs: [cfg])
    path = tmp_path / "t.json"
    path.write_text(TABLE_PATH.read_text())
    before = json.loads(path.read_text())["entries"]
    t = sass_tool.regenerate_table([cfg], path=path, log=lambda s: None)
    assert t["entries"]["sm_90a"][cfg.name()]["regs"] == 99
    assert len(t["entries"]["sm_90a"]) == len(before["sm_90a"]) and t["entries"]["sm_100a"] == before["sm_100a"]
    t = sass_tool.regenerate_table(path=path, archs=("sm_90a",), log=lambda s: None)
    assert list(t["entries"]["sm_90a"]) == [cfg.name()] and t["entries"]["sm_100a"] == before["sm_100a"]
    assert json.loads(path.read_text()) == t


def test_sm90_main_loops_are_branch_free():
    """The model counts every instruction of a loop span as executed (sass.py): true while the sm90
    main loops have no branch but their back edge -- and, in the wgmma family, the one forward
    branch over the ring refill, which skips it only in a split's last ``stages - 2`` iterations
    (the count is high by at most that share of the refill)."""
    for name, d in load_table()["entries"]["sm_90a"].items():
        assert d["histogram"].get("BRA") == (2 if "_wgmma_" in name else 1), name


def test_lookup_exact_twin_and_estimate():
    exact = C90("mma", tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4, pdl=True)
    f = lookup(exact)
    assert f.source == "table" and f.loop_instrs > 0
    twin = C90("mma", tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4, split_k=3, pdl=True)  # same loop
    ft = lookup(twin)
    assert ft.source.startswith("table (same main loop as") and ft.loop_instrs == f.loop_instrs
    est = lookup(C100(128, 192, 1, 1))  # sm100 tiles outside the table: arithmetic estimate
    assert est.source in ("estimate",) or est.source.startswith("table")


def test_estimate_rank_and_gaps():
    cfgs = [C90("mma", tile_m=8, tile_n=tn, tile_k=256, num_warps=4, stages=4, pdl=True) for tn in (64, 128, 256)]
    ranked = rank(cfgs, 1, 28672, 4096, "H200", tie=0.0)
    mids = [e.mid_us for _, e in ranked]
    assert len(ranked) == 3 and mids == sorted(mids)
    assert estimate(cfgs[0], 1, 4096, 4112) is None  # K % 32
    e = estimate(cfgs[1], 1, 28672, 4096, "H200")
    assert e.total_us[0] < e.total_us[1] and e.pct_of_achievable[0] > e.pct_of_achievable[1]


def test_rank_ties_go_to_fewer_instructions_per_element():
    """Two decode tiles on the 8B o projection at M = 1 whose modelled middles are 1-2.5 % apart
    (latency-chain terms), the slower one issuing fewer main-loop instructions per weight element
    (the pair is found in a fixed list, so a table regeneration keeps the test meaningful).
    Strict ordering (tie 0) and the default 1 % follow the model's middle; a 3 % tie (the
    policy's at M <= 32) leads with the lower issue count."""
    import itertools

    cs = [C90("mma", tile_m=8, tile_n=tn, tile_k=256, num_warps=w, stages=st, split_k=sk, pdl=True)
          for tn in (64, 128, 256) for w in (2, 4, 8) for st in (3, 4) for sk in (1, 4, 8)]
    es = [(c, estimate(c, 1, 4096, 4096, "H200")) for c in cs]
    pair = next(((a, b) for (a, ea), (b, eb) in itertools.permutations([x for x in es if x[1]], 2)
                 if ea.mid_us * 1.011 < eb.mid_us <= ea.mid_us * 1.025
                 and eb.facts.instr_per_elem < ea.facts.instr_per_elem), None)
    assert pair is not None, "no near-tie pair with the slower one issuing less: the premise"
    fast, slow = pair
    assert [c for c, _ in rank([slow, fast], 1, 4096, 4096, "H200", tie=0.0)] == [fast, slow]
    assert [c for c, _ in rank([slow, fast], 1, 4096, 4096, "H200")] == [fast, slow]
    assert [c for c, _ in rank([fast, slow], 1, 4096, 4096, "H200", tie=0.03)] == [slow, fast]
    # a config outside the tie window is never promoted by its instruction count
    far = C90("mma", tile_m=32, tile_n=64, tile_k=256, num_warps=2, stages=3, pdl=True)
    assert [c for c, _ in rank([far, fast], 1, 4096, 4096, "H200", tie=0.03)][0] == fast


# ------------------------------------------------------------------------------ CLI


def test_model_cli_report_matches_the_api(capsys):
    name = "nvgemm_cutedsl_sm90_w4a16_mma_t8x128x256_w4_s4_pdl"
    assert cli.main(["model", "--config", name, "--shape", "28672,4096", "--m", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    e = estimate(C90("mma", tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4, pdl=True), 1, 28672, 4096, "H200")
    (row,) = data["rows"]
    assert "MODEL" in data["note"]
    assert row["config"] == name and row["total_us"] == list(e.total_us)
    assert cli.main(["model", "--config", name, "--shape", "28672,4096", "--m", "1,4"]) == 0
    out = capsys.readouterr().out
    assert out.count("MODEL (not a measurement") == 2 and "per weight element" in out and "bf16 cuBLAS" in out
    assert cli.main(["model", "--config", "not_a_config", "--shape", "1,1"]) == 2
    assert "not an nvgemm config name" in capsys.readouterr().err
    assert cli.main(["model", "--config", name]) == 2
    assert "--shape" in capsys.readouterr().err


def test_model_cli_best_and_policy(capsys):
    assert cli.main(["model", "--best", "sm100.nvfp4", "--shape", "4096,4096", "--m", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert len(rows) == 1 and rows[0]["family"] == "sm100.nvfp4" and rows[0]["gpu"] == "B200"
    assert cli.main(["model", "--policy", "--shape", "6144,4096", "--m", "1", "--gpu", "H200", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows and all(r["config"].startswith("nvgemm_cutedsl_sm90") for r in rows)


def test_plan_shows_model_column(capsys):
    assert cli.main(["plan", "--shape", "28672,4096", "--gpu", "H200", "--m", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    cands = data["rows"][0]["candidates"]
    assert data["model_gpu"] == "H200" and all(c["model_us"] is not None for c in cands)
    from nvgemm.templates.sm90_w4a16.backend import pick_config

    first = pick_config(1, 28672, 4096, torch.bfloat16, "none", 132)
    assert cands[0]["config"] == first.name()
    want = estimate(first, 1, 28672, 4096, "H200", 132).total_us
    assert cands[0]["model_us"] == [round(want[0], 2), round(want[1], 2)]
    # the sm90 policy ranks with the model: its time is the model's, never nvMatmulHeuristics'
    assert all(c["est_runtime_us"] is None for c in cands)
    for argv in (["--shape", "4096,4096", "--gpu", "B200"], ["--shape", "28672,4096", "--gpu", "H200"]):
        assert cli.main(["plan", *argv, "--m", "1", "--no-nvmmh"]) == 0
        out = capsys.readouterr().out
        assert "us (model)" in out and "not a measurement" in out
        assert "nvMMH" not in out  # no nvMatmulHeuristics number, so no such label
    for line in _plan_lines(["--shape", "28672,4096", "--gpu", "H200", "--m", "1,8"]):
        assert "(nvMMH)" not in line and "(model)" in line


def _plan_lines(argv):
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(["plan", *argv]) == 0
    return [ln for ln in buf.getvalue().splitlines() if ln.startswith("  ") and ". nvgemm_" in ln]


def test_mma_kernel_off_hopper_is_priced_with_its_own_arch_timing_facts():
    """The W4A16 mma kernel compiled for sm_120a is scheduled differently by ptxas from the same source on
    sm_90a (same main-loop instruction count, longer encoded stalls: chain base 921 -> 1055 cycles for
    t8x128x256_w4_s4); the model reads the sm_120a sweep's record for an RTX 5090 (and the sm_89 one for an
    L40S), and falls back to the sm_90a facts where the arch has no record."""
    from nvgemm.heuristics.perfmodel import estimate
    from nvgemm.heuristics.perfmodel.table import load_table, lookup
    from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config as W

    cfg = W("mma", tile_m=8, tile_n=128, tile_k=256, num_warps=2, stages=4, pdl=True)
    rec = load_table()["spills"]["sm_120a"][cfg.name()]["none"]
    want = max(v["loop"]["chain_base"] for v in rec.values())
    hop = lookup(cfg, "sm_90a", activation="none")
    own = lookup(cfg, "sm_90a", activation="none", own_arch="sm_120a")
    assert own.chain_base == want and own.source.endswith("sm_120a)")
    assert own.chain_base > 1.2 * hop.chain_base and abs(own.loop_instrs - hop.loop_instrs) <= 0.01 * hop.loop_instrs
    # no record for the arch (sm_86: no sweep): the sm_90a variant's facts
    assert lookup(cfg, "sm_90a", activation="none", own_arch="sm_86") == hop
    # the estimate on an RTX 5090 uses them: slower than the same hardware priced with the sm_90a facts
    from nvgemm.heuristics.perfmodel.facts import family_for
    from nvgemm.heuristics.perfmodel.hardware import get_hardware
    from nvgemm.heuristics.perfmodel.model import estimate_with

    e = estimate(cfg, 16, 4096, 14336, "RTX5090", activation="none")
    e_hop = estimate_with(cfg, 16, 4096, 14336, get_hardware("RTX5090"), hop, family_for(cfg))
    assert e.gemm_us[0] > 1.1 * e_hop.gemm_us[0]
    e_own = estimate_with(cfg, 16, 4096, 14336, get_hardware("RTX5090"), own, family_for(cfg))
    assert e.gemm_us == e_own.gemm_us
