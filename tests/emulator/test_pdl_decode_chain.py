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

import re

import pytest
import torch
from isa_env import kernel_test_env

kernel_test_env("sm_100a")

from nvgemm.core.formats import quantize_weight, to_blocked  # noqa: E402
from nvgemm.emulator.ptx.pdl import SCHEDULES, PdlRaceError  # noqa: E402
from nvgemm.emulator.ptx.program import compile_entry  # noqa: E402
from nvgemm.emulator.stream import capture, run_captured  # noqa: E402

pytestmark = pytest.mark.emulator

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


def chain(name):
    if name not in _STEPS:
        step = CHAINS[name]()
        _STEPS[name] = (step, step())  # the launch-by-launch run: the emulated backend's output
    return _STEPS[name]


def captured(step):
    with capture() as grids:
        out = step()
    return grids, out


# ------------------------------------------------------------------------------------------------- mutations

_WAIT = re.compile(r"^\s*griddepcontrol\.wait\s*;\s*$", re.M)
_TRIGGER = re.compile(r"^\s*griddepcontrol\.launch_dependents\s*;\s*$", re.M)
_GLOBAL_READ = re.compile(r"^\s*(@%p\d+\s+)?(ld\.global|cp\.async\.bulk\.tensor\.\w+\.shared::\w+\.global)\b", re.M)
_GLOBAL_STORE = re.compile(r"^\s*(@%p\d+\s+)?(st\.global|cp\.async\.bulk\.tensor\.\w+\.global\.shared)\b", re.M)


def wait_after_first_read(ptx: str) -> str:
    """Move the (first) ``griddepcontrol.wait`` after the first global read that follows it."""
    m = _WAIT.search(ptx)
    assert m, "no griddepcontrol.wait in the consumer's PTX"
    rest = ptx[m.end():]
    r = _GLOBAL_READ.search(rest)
    assert r, "no global read after the wait"
    eol = rest.index("\n", r.start())
    return ptx[:m.start()] + rest[:eol + 1] + "\tgriddepcontrol.wait;\n" + rest[eol + 1:]


def drop_wait(ptx: str) -> str:
    out, n = _WAIT.subn("", ptx)
    assert n, "no griddepcontrol.wait to drop"
    return out


def trigger_before_last_store(ptx: str) -> str:
    """Every ``launch_dependents`` removed, one placed before the last global store of the program text."""
    ptx, _ = _TRIGGER.subn("", ptx)
    last = list(_GLOBAL_STORE.finditer(ptx))[-1]
    return ptx[:last.start()] + "\tgriddepcontrol.launch_dependents;\n" + ptx[last.start():]


def mutate(grid, edit) -> None:
    grid.launch.program = compile_entry(edit(grid.launch.ext["ptx"]), grid.launch.program.entry.name)


def consumer_pairs(grids):
    """(producer index, consumer index) of each PDL-launched grid with a wait in its PTX."""
    return [(j - 1, j) for j, gr in enumerate(grids) if j and gr.pdl and _WAIT.search(gr.launch.ext["ptx"])]


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


# the pair each mutation breaks: by chain, (producer index, consumer index) in launch order
MUTATIONS = ["wait after first read", "wait dropped", "trigger before last store, no wait"]


@pytest.mark.parametrize("name", list(CHAINS))
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_decode_chain_pdl_mutations_caught(name, mutation):
    step, _ = chain(name)
    grids, _ = captured(step)
    pairs = consumer_pairs(grids)
    assert pairs, "no PDL consumer in the chain"
    # a different pair for each mutation where the chain has several
    prod, cons = pairs[(MUTATIONS.index(mutation) + 1) % len(pairs)]
    if mutation == "wait after first read":
        mutate(grids[cons], wait_after_first_read)
    elif mutation == "wait dropped":
        mutate(grids[cons], drop_wait)
    else:
        mutate(grids[prod], trigger_before_last_store)
        mutate(grids[cons], drop_wait)
    with pytest.raises(PdlRaceError) as e:
        run_captured(grids, "early")
    msg = str(e.value)
    assert f"{grids[cons].name}:" in msg and "before griddepcontrol.wait" in msg, msg
    assert re.search(r"at 0x[0-9a-f]+ \(", msg) and "PTX line" in msg, msg
