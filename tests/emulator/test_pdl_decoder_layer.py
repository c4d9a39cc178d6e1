"""A whole decoder layer in the launch order of Inductor's generated code, under programmatic dependent launch
on the emulator.

The layer is the decode-step tool's ``DecoderLayer`` (tiny: hidden 256, intermediate 128, two query heads on one
KV head of 128, a static KV cache of 16 slots, one token at position 5) with random NVFP4 weights, the loader's
fused qkv and gate/up. ``torch.compile`` + ``nvgemm.enable()`` generate its code for a fake B200 (W4A4,
sm_100a) and a fake H200 (W4A16, sm_90a); the test derives the kernel list from that code, whatever kernels it
has: RMSNorm (+ activation quantizer), the qkv GEMM, RoPE and the KV-cache writes (Inductor's Triton kernels or
nvgemm's op), the attention, o_proj (+ residual), RMSNorm (+ quant), gate/up (+ SiLU-mul / requant), down
(+ residual). The replay (``_inductor_emu_replay.py``) runs it on CPU tensors: every Triton kernel (Inductor's
``triton_poi`` / ``triton_per`` kernels compiled for the fake arch from the generated source, nvgemm's) from its
PTX, every CuTeDSL GEMM from its AOT artifact, with the PDL attributes the generated code and nvgemm's launchers
set. The attention is an extern (aten flash attention: cuDNN / flash binaries, no PTX): it runs on the host in
stream order (``_scaled_dot_product_flash_attention_for_cpu``) and is a launch boundary: the launches before it
complete first, nothing overlaps across it. It is not emulated.

Reference: the same replay launch by launch (the compiled step on the emulated backend, ``NVGEMM_BACKEND=
emu_sm100`` / ``emu_sm90``). Under every PDL schedule of :mod:`nvgemm.emulator.ptx.pdl` the layer's output and
both KV caches must equal it bit for bit with no race, and (``early`` / ``late_stores``) dependents must start
before their producers completed. The three PDL mutations of ``_pdl_mutations.py`` (a consumer's wait moved
after its first read of the producer's output, the wait dropped, the producer's trigger moved before its last
store while the consumer does not wait) must each be reported as a race naming the consumer: in the default
subset each on one producer / consumer pair (a different pair per mutation, both sides of the attention), with
``-m emulator_full`` each on every pair of the layer (a PDL-launched grid with a wait). Independent of the
emulator, the output is checked against the layer's eager CPU forward (nvgemm's emulated reference path, the
same host attention) within 2**-5 of the output's max (as the MLP layer test: both quantize the same
activations, but Inductor's fused RMSNorm rounds in fp32 where the eager one rounds each op in bf16, which can
flip an FP4 code of the qkv input), and this token's KV-cache rows within 2**-7 relative + 2**-7 absolute, about
one bf16 ulp (k and v come from the qkv GEMM on the same activations, rounded to bf16 after a different fp32
summation order; RoPE's products are fused in fp32 by Inductor; observed: at most one ulp); every other cache slot
must be untouched.

Run times per kernel (the reference replay) are printed (``pytest -s``).
"""

from __future__ import annotations

import re
import time

import pytest
import torch
from isa_env import kernel_test_env

kernel_test_env("sm_100a")

import _inductor_emu_replay as replay_mod  # noqa: E402
from _pdl_mutations import MUTATIONS, apply_and_expect_race, consumer_pairs  # noqa: E402
from nvgemm.emulator.ptx.pdl import SCHEDULES  # noqa: E402
from nvgemm.emulator.stream import run_captured  # noqa: E402

pytestmark = pytest.mark.emulator

LAYERS = {"B200-w4a4": ("B200", "sm_100a"), "H200-w4a16": ("H200", "sm_90a")}
_BUILT: dict = {}


@pytest.fixture(autouse=True)
def _stand_in_removed_after():
    """The Triton stand-in these tests install is removed after each (other tests expect the torch references)."""
    yield
    import nvgemm.emulator as emu

    emu.disable_triton()


class Layer:
    def __init__(self, name):
        import nvgemm.emulator as emu

        self.gpu, self.arch = LAYERS[name]
        emu.enable(self.arch)
        self.code, self.inputs, self.module = replay_mod.build_decoder_layer(self.gpu)
        self.cold: list = []  # the first replay: each kernel's compile (PTX, program) included
        ins = self.fresh()
        self.ref = replay_mod.replay(self.code, ins, self.arch, log=self.cold)[0]
        self.ref_caches = (ins[1], ins[2])
        self.log: list = []  # a second (warm) replay: the emulator's run time per launch; the same bits
        again = self.fresh()
        assert torch.equal(replay_mod.replay(self.code, again, self.arch, log=self.log)[0], self.ref)
        assert torch.equal(again[1], ins[1]) and torch.equal(again[2], ins[2])

    def fresh(self):
        """The inputs with fresh KV caches (the step writes this token's slot in place)."""
        return [t.clone() if i in (1, 2) else t for i, t in enumerate(self.inputs)]

    def run(self, run_segment, stop_at=None):
        ins = self.fresh()
        out = replay_mod.captured_segments(self.code, ins, self.arch, run_segment, stop_at)
        return out if stop_at is not None else (out[0], ins[1], ins[2])


def layer(name) -> Layer:
    import nvgemm.emulator as emu

    if name not in _BUILT:
        _BUILT[name] = Layer(name)
    emu.enable(_BUILT[name].arch)
    return _BUILT[name]


def _serial(_i, grids):
    run_captured(grids, "serial")


def _choices(code: str) -> list[str]:
    """The kernel config each choice op of the generated code names (``backend:<backend>[:<config>]``; "" where
    the backend picks), in order."""
    return re.findall(r"_choice\.default\(.*'backend:\w+(?::(\w+))?'\)", code)


@pytest.mark.parametrize("name", list(LAYERS))
def test_decoder_layer_under_pdl_schedules_bit_exact(name):
    lay = layer(name)
    segments_of = {}
    for schedule in SCHEDULES:
        segs = []

        def run_segment(_i, grids, schedule=schedule, segs=segs):
            r = run_captured(grids, schedule)
            segs.append(([(g.name, g.pdl) for g in grids], r.races, r.started_before_predecessor_completed))

        t0 = time.perf_counter()
        out, kc, vc = lay.run(run_segment)
        dt = time.perf_counter() - t0
        print(f"\n{name} {schedule}: {dt:.1f} s, segments {[len(s[0]) for s in segs]}")
        assert all(races == [] for _, races, _ in segs), schedule
        assert torch.equal(out, lay.ref), schedule
        assert torch.equal(kc, lay.ref_caches[0]) and torch.equal(vc, lay.ref_caches[1]), schedule
        # early / late stores: dependents start before their producers completed (at least after the attention:
        # nvgemm's chain; before it, where the generated code launches Inductor's kernels with PDL, those too)
        early = [any(s[2]) for s in segs]
        assert early[-1] == any(early) == (schedule != "serial"), (schedule, segs)
        segments_of[schedule] = [s[0] for s in segs]
    # the launches are the same under every schedule: those of the launch-by-launch reference, in its order,
    # split at the one host step (the attention)
    segs = segments_of["serial"]
    assert all(segments_of[s] == segs for s in SCHEDULES), segments_of
    steps = [e for e in lay.log if e[0] == "host"]
    assert [s[1] for s in steps] == ["aten._scaled_dot_product_flash_attention"], steps
    kernels = [e[1] for e in lay.log if e[0] == "kernel"]
    names = [n for seg in segs for n, _ in seg]
    assert len(names) == len(kernels) and all(k.startswith(n) or n.startswith(k) for n, k in zip(names, kernels)), \
        (names, kernels)
    at = next(i for i, e in enumerate(lay.log) if e[0] == "host")
    assert len(segs) == 2 and len(segs[0]) == sum(e[0] == "kernel" for e in lay.log[:at]), segs
    # every Triton kernel the generated code defines ran from its PTX, once per call site
    code = lay.code
    defined = re.findall(r"^(\w+) = async_compile\.triton\(", code, re.M)
    assert all(names.count(k) == code.count(f"{k}.run(") for k in defined), (defined, names)
    # every nvgemm op call launched kernels; GEMMs: one per choice op, the config it names, all launched with PDL
    ops = [e for e in lay.log if e[0] == "op"]
    calls = re.findall(r"torch\.ops\.nvgemm\.(\w+)\.default\(", code)  # calls (not the comments, strings)
    assert [e[1] for e in ops] == calls and all(e[2] >= 1 for e in ops), (ops, calls)
    assert len(names) == sum(e[2] for e in ops) + sum(code.count(f"{k}.run(") for k in defined), (names, ops)
    # the four GEMMs of the layer (qkv, o_proj, gate/up, down)
    gemms = [(n, p) for seg in segs for n, p in seg if n.startswith("nvgemm_cutedsl_")]
    chosen = _choices(code)
    assert len(gemms) == len(chosen) == 4, (gemms, chosen)
    assert all(g.startswith(c + "_") for (g, _), c in zip(gemms, chosen) if c), (gemms, chosen)
    assert all(p for n, p in gemms), gemms
    assert all(p for seg in segs for n, p in seg if not n.startswith("triton_")), segs  # nvgemm's: all PDL
    if lay.arch == "sm_100a":  # W4A4: an activation quantizer (alone or fused with the RMSNorm) before the qkv GEMM
        assert any("quantize" in n for n in names[:names.index(gemms[0][0])]), names
    rows = [(w, c) for w, c in zip(lay.log, lay.cold) if w[0] != "op"]
    per_kernel = "\n".join(f"  {w[0]:6s} {w[1]:90s} {w[2] * 1e3:9.1f} ms {c[2] * 1e3:9.1f} ms" for w, c in rows)
    print(f"\n{name}: the reference replay per launch, warm / first (with compile); host: not emulated\n"
          f"{per_kernel}")
    # independent of the emulator: the layer's eager CPU forward (the emulated reference path)
    with replay_mod.HostAttention():
        ins = lay.fresh()
        eager = replay_mod.decoder_layer(weight_only=lay.arch == "sm_90a")(*ins[:6]).float()
    err = (lay.ref.float() - eager).abs().max() / eager.abs().max()
    assert err < 2 ** -5, float(err)
    # the caches: this token's k (RoPE'd) and v; every other slot untouched
    pos = replay_mod.LAYER_DIMS["pos"]
    for got, want, old in zip(lay.ref_caches, ins[1:3], lay.inputs[1:3]):
        assert torch.equal(torch.cat([got[:, :, :pos], got[:, :, pos + 1:]], 2),
                           torch.cat([old[:, :, :pos], old[:, :, pos + 1:]], 2))
        torch.testing.assert_close(got[:, :, pos].float(), want[:, :, pos].float(), rtol=2 ** -7, atol=2 ** -7)


def _mutate_pairs(name, mutation, every: bool):
    lay = layer(name)
    segments = []
    lay.run(lambda i, grids: (segments.append(grids), _serial(i, grids)))
    pairs = [(k, pair) for k, grids in enumerate(segments) for pair in consumer_pairs(grids)]
    assert len({k for k, _ in pairs}) == len(segments) == 2, "a segment without a PDL consumer"
    if not every:  # the default subset: one pair per mutation, a different one for each (both segments)
        pairs = [pairs[(2 * MUTATIONS.index(mutation) + 1) % len(pairs)]]
    caught = []
    for k, pair in pairs:
        msg = apply_and_expect_race(lambda k=k: lay.run(_serial, stop_at=k), mutation, pair)
        caught.append(f"{segments[k][pair[0]].name} -> {segments[k][pair[1]].name}: {msg.splitlines()[0][:160]}")
    print(f"\n{name} / {mutation}: {len(caught)} pairs caught\n  " + "\n  ".join(caught))


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_decoder_layer_pdl_mutations_caught(name, mutation):
    """Each mutation on one producer / consumer pair of the layer: the second, fourth and sixth pair (cyclically)
    for the three mutations, so different kernels on both sides of the attention."""
    _mutate_pairs(name, mutation, every=False)


@pytest.mark.emulator_full
@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_decoder_layer_pdl_mutations_caught_every_pair(name, mutation):
    """Each mutation on every producer / consumer pair of the layer (a PDL-launched grid with a wait), both
    segments (opt-in: about 4 min on 2 busy cores)."""
    _mutate_pairs(name, mutation, every=True)
