"""A decode layer's kernel chain under programmatic dependent launch on the emulator
(:mod:`nvgemm.emulator.stream`, :mod:`nvgemm.emulator.ptx.pdl`).

The emulated backends' host paths (the Triton kernels from their sm_100a PTX, the AOT artifacts relinked
against the fake CUDA runtime) run inside a capture: each launch keeps the PDL attribute its host code set
(``launch_pdl`` of a Triton launch, the GEMM config's ``pdl`` launch attribute), and the captured launches run
together as one stream under every schedule (serial, early, late stores). The reference is the same chain run
launch by launch (the emulated backend, what ``NVGEMM_BACKEND=emu_sm100`` / ``emu_sm90`` computes): equal bit for
bit, no race, and the dependents really started before their predecessors completed. Then three PDL mutations
of the real PTX, each reported as a race naming the consumer kernel:

* a consumer's ``griddepcontrol.wait`` moved after its first read of the producer's output;
* a consumer's wait dropped;
* the producer's ``launch_dependents`` moved before its last store while the consumer reads without waiting.

W4A4 on sm_100a (the MLP of a layer): RMSNorm + quant (Triton) -> GEMM (prequant activations) -> activation
quant (Triton) -> gate/up GEMM with the fused SiLU-mul requant -> down GEMM (prequant) + residual. W4A16 on
sm_90a: gate/up GEMM with the SiLU-mul epilogue -> down GEMM + residual.
"""

from __future__ import annotations

import pytest
import torch
from isa_env import kernel_test_env

kernel_test_env("sm_100a")

from nvgemm.core.formats import quantize_weight, to_blocked  # noqa: E402
from nvgemm.emulator.ptx.pdl import SCHEDULES  # noqa: E402
from nvgemm.emulator.stream import capture, run_captured  # noqa: E402
from _pdl_mutations import MUTATIONS, apply_and_expect_race, consumer_pairs  # noqa: E402

pytestmark = pytest.mark.emulator_full  # opt-in: the generated decoder layers (test_pdl_decoder_layer.py) are the default

HIDDEN, INTER, TOKENS = 256, 128, 3


def _lin(g, n, k):
    q = quantize_weight(torch.randn(n, k, generator=g))
    return q.packed, to_blocked(q.scale), q.global_scale.reshape(())


def _setup(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(TOKENS, HIDDEN, generator=g).to(torch.bfloat16)
    return g, x


def sm100_chain():
    import nvgemm.emulator as emu
    from nvgemm.emulator import backend as eb
    from nvgemm.templates.triton.fused_ops import rmsnorm_quantize_nvfp4

    emu.enable("sm_100a")
    g, x = _setup()
    norm_w = (1 + 0.1 * torch.randn(HIDDEN, generator=g)).to(torch.bfloat16)
    w_o, w_gu, w_d = _lin(g, HIDDEN, HIDDEN), _lin(g, 2 * INTER, HIDDEN), _lin(g, HIDDEN, INTER)
    s0, s1, s2 = torch.tensor(0.002), torch.tensor(0.004), torch.tensor(0.02)

    def step():
        p0, sf0 = rmsnorm_quantize_nvfp4(x, norm_w, s0)
        y = eb.run_emu_sm100_prequant(p0, sf0, *w_o, s0, None, None, torch.bfloat16)
        p1, sf1 = eb.run_emu_sm100_requant_op(y, *w_gu, s1, None, s2)
        return eb.run_emu_sm100_prequant(p1, sf1, *w_d, s2, None, x, torch.bfloat16)

    return step


def sm90_chain():
    import nvgemm.emulator as emu
    from nvgemm.emulator import backend as eb

    emu.enable("sm_90a")
    g, x = _setup(1)
    w_gu, w_d = _lin(g, 2 * INTER, HIDDEN), _lin(g, HIDDEN, INTER)

    def step():
        h = eb.run_emu_sm90(x, *w_gu, None, None, None, "silu_mul", torch.bfloat16)
        return eb.run_emu_sm90(h, *w_d, None, None, x, "none", torch.bfloat16)

    return step


CHAINS = {"sm100-w4a4": sm100_chain, "sm90-w4a16": sm90_chain}
_STEPS: dict = {}


@pytest.fixture(autouse=True)
def _stand_in_removed_after():
    """The Triton stand-in these tests install is removed after each (other tests expect the torch references)."""
    yield
    import nvgemm.emulator as emu

    emu.disable_triton()


def chain(name):
    import nvgemm.emulator as emu

    emu.enable("sm_100a" if name.startswith("sm100") else "sm_90a")
    if name not in _STEPS:
        step = CHAINS[name]()
        _STEPS[name] = (step, step())  # the launch-by-launch run: the emulated backend's output
    return _STEPS[name]


def captured(step):
    with capture() as grids:
        out = step()
    return grids, out


# ------------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", list(CHAINS))
def test_decode_chain_under_pdl_schedules_bit_exact(name):
    step, ref = chain(name)
    for schedule in SCHEDULES:
        grids, out = captured(step)
        assert all(gr.pdl for gr in grids[1:]), [(gr.name, gr.pdl) for gr in grids]  # the host code sets PDL
        r = run_captured(grids, schedule)
        assert r.races == []
        assert torch.equal(out, ref), schedule
        overlapped = r.started_before_predecessor_completed
        assert any(overlapped) == (schedule != "serial"), (schedule, overlapped)


@pytest.mark.parametrize("name", list(CHAINS))
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_decode_chain_pdl_mutations_caught(name, mutation):
    step, _ = chain(name)
    grids, _ = captured(step)
    pairs = consumer_pairs(grids)
    assert pairs, "no PDL consumer in the chain"
    # a different pair for each mutation where the chain has several
    apply_and_expect_race(lambda: captured(step)[0], mutation, pairs[(MUTATIONS.index(mutation) + 1) % len(pairs)])
