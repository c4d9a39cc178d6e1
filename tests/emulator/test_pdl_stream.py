"""Two grids under programmatic dependent launch (``nvgemm.emulator.ptx.pdl``), on hand-written PTX: a producer
``out[i] = 2 * in[i] + 1`` and a consumer ``res[i] = out[i] + 3`` that also reads a weight ``wt[i]`` no grid
writes. The rules come from the PTX ISA (``griddepcontrol``) and the CUDA programming guide: the dependent may
start once every CTA of the primary executed ``launch_dependents`` or exited, ``wait`` blocks until the primary
completed. The reference is the same arithmetic in torch (integer, exact)."""

from __future__ import annotations

import re

import pytest
import torch

from nvgemm.emulator.ptx import DeadlockError
from nvgemm.emulator.ptx.pdl import SCHEDULES, PdlRaceError, StreamGrid, run_stream
from nvgemm.emulator.runner import make_launch

pytestmark = pytest.mark.emulator

HEAD = ".version 8.0\n.target sm_90a\n.address_size 64\n"
REGS = ".reg .pred %p<4>;\n.reg .b32 %r<16>;\n.reg .b64 %rd<16>;\n"
INDEX = """
    mov.u32 %r1, %tid.x;  mov.u32 %r2, %ctaid.x;  mov.u32 %r3, %ntid.x;
    mad.lo.u32 %r4, %r2, %r3, %r1;
    mul.wide.u32 %rd3, %r4, 4;
"""


def producer(trigger: str = "after") -> str:
    """``trigger``: where ``launch_dependents`` is ("before": before the store, "after": after it, "none")."""
    t = "    griddepcontrol.launch_dependents;\n"
    return (HEAD + ".visible .entry producer(.param .u64 p_in, .param .u64 p_out)\n{\n" + REGS
            + "    ld.param.u64 %rd1, [p_in];  ld.param.u64 %rd2, [p_out];\n" + INDEX
            + "    add.s64 %rd4, %rd1, %rd3;  add.s64 %rd5, %rd2, %rd3;\n"
            + "    ld.global.u32 %r5, [%rd4];\n    mad.lo.u32 %r6, %r5, 2, 1;\n"
            + (t if trigger == "before" else "")
            + "    st.global.u32 [%rd5], %r6;\n"
            + (t if trigger == "after" else "")
            + "    ret;\n}\n")


def consumer(wait: str = "before") -> str:
    """``wait``: where ``griddepcontrol.wait`` is ("before": before the read of ``out``, "after": after it,
    "none"). The weight read always comes first (allowed before the wait: no grid writes it)."""
    wt = "    griddepcontrol.wait;\n"
    return (HEAD + ".visible .entry consumer(.param .u64 p_out, .param .u64 p_wt, .param .u64 p_res)\n{\n" + REGS
            + "    ld.param.u64 %rd1, [p_out];  ld.param.u64 %rd2, [p_wt];  ld.param.u64 %rd6, [p_res];\n" + INDEX
            + "    add.s64 %rd4, %rd1, %rd3;  add.s64 %rd5, %rd2, %rd3;  add.s64 %rd7, %rd6, %rd3;\n"
            + "    ld.global.u32 %r7, [%rd5];\n"
            + (wt if wait == "before" else "")
            + "    ld.global.u32 %r5, [%rd4];\n"
            + (wt if wait == "after" else "")
            + "    add.u32 %r6, %r5, %r7;\n    st.global.u32 [%rd7], %r6;\n    ret;\n}\n")


GRID, BLOCK = 4, 64
N = GRID * BLOCK


def tensors():
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, 1 << 20, (N,), generator=g, dtype=torch.int32)
    wt = torch.randint(0, 1 << 20, (N,), generator=g, dtype=torch.int32)
    out = torch.zeros(N, dtype=torch.int32)
    res = torch.zeros(N, dtype=torch.int32)
    return x, wt, out, res


def stream(prod_ptx, cons_ptx, x, wt, out, res, pdl=True):
    p = make_launch(prod_ptx, (GRID, 1, 1), (BLOCK, 1, 1), [x, out])
    c = make_launch(cons_ptx, (GRID, 1, 1), (BLOCK, 1, 1), [out, wt, res])
    return [StreamGrid(p, pdl=False, name="producer"), StreamGrid(c, pdl=pdl, name="consumer")]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("trigger", ["after", "before", "none"])
def test_correct_pair_is_race_free_and_exact(schedule, trigger):
    """A consumer that waits before reading the producer's output: no race and the reference's bits under every
    schedule, wherever the producer triggers (an early trigger is legal when the consumer waits)."""
    x, wt, out, res = tensors()
    r = run_stream(stream(producer(trigger), consumer("before"), x, wt, out, res), schedule)
    assert r.races == []
    assert torch.equal(out, 2 * x + 1)
    assert torch.equal(res, 2 * x + 1 + wt)
    # the dependent overlapped the primary exactly when the rules allow it
    assert r.started_before_predecessor_completed == [False, schedule != "serial" and trigger != "none"]
    # the consumer's pre-wait record: only the weight
    assert r.grids[1].launch.ext["pdl_pre_wait_reads"] == {r.grids[1].launch.gmem.names_of(
        torch.tensor([wt.data_ptr()]).numpy().astype("uint64")).pop()}


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("mutation", ["wait after first read", "wait dropped", "trigger before store, no wait"])
def test_pdl_mutations_are_races(schedule, mutation):
    """Each broken pair is reported, under every schedule (the ISA orders the accesses only through the wait),
    naming the consumer kernel, the load instruction and the first address of ``out`` it reads."""
    x, wt, out, res = tensors()
    prod, cons = {"wait after first read": ("after", "after"), "wait dropped": ("after", "none"),
                  "trigger before store, no wait": ("before", "none")}[mutation]
    grids = stream(producer(prod), consumer(cons), x, wt, out, res)
    with pytest.raises(PdlRaceError) as e:
        run_stream(grids, schedule)
    msg = str(e.value)
    assert "read-after-write" in msg and "consumer:" in msg and "conflicting grid: producer" in msg
    assert "ld.global.u32 %r5, [%rd4]" in msg and "griddepcontrol.wait" in msg
    m = re.search(r"at (0x[0-9a-f]+) \((\S+) \+ (\d+)\)", msg)
    addr, off = int(m.group(1), 16), int(m.group(3))
    assert addr == out.data_ptr() + off and 0 <= off < out.numel() * 4  # an address of `out`, named
    lane = int(re.search(r"lane (\d+)", msg).group(1))
    assert off // 4 % 32 == lane  # the lane that read it


@pytest.mark.parametrize("schedule", ["early", "late_stores"])
def test_race_values_differ_by_schedule(schedule):
    """Collected (non-strict), the racing consumer's reads: every thread's read of ``out`` is one race record, and
    the values show the schedule: delayed stores leave the consumer the old (zero) bytes."""
    x, wt, out, res = tensors()
    r = run_stream(stream(producer("before"), consumer("none"), x, wt, out, res), schedule, strict=False)
    assert len(r.races) == N // 32  # one record per warp-wide load
    assert {x.kind for x in r.races} == {"read-after-write"}
    assert torch.equal(out, 2 * x + 1)  # the producer's result is there in the end
    if schedule == "late_stores":
        assert torch.equal(res, wt)  # read the bytes before the producer's stores became visible


def test_without_pdl_attribute_no_race():
    """Launched without the attribute the consumer starts after the producer completed: a consumer without any
    wait is correct then."""
    x, wt, out, res = tensors()
    r = run_stream(stream(producer("before"), consumer("none"), x, wt, out, res, pdl=False), "early")
    assert r.races == [] and torch.equal(res, 2 * x + 1 + wt)
    assert r.started_before_predecessor_completed == [False, False]


def test_dependent_write_before_wait_to_primary_input_is_race():
    """Write-after-read the other way: a dependent that writes, before its wait, bytes the primary reads."""
    x, wt, out, res = tensors()
    # the consumer writes its result into `x` (the producer's input) without waiting
    cons = consumer("none")
    p = make_launch(producer("before"), (GRID, 1, 1), (BLOCK, 1, 1), [x, out])
    c = make_launch(cons.replace("ld.global.u32 %r5, [%rd4];\n", "mov.u32 %r5, 0;\n"), (GRID, 1, 1), (BLOCK, 1, 1),
                    [out, wt, x])
    with pytest.raises(PdlRaceError, match="write-after-read.*consumer.*prerequisite grid reads"):
        run_stream([StreamGrid(p, False, "producer"), StreamGrid(c, True, "consumer")], "early")


def test_three_grid_chain_orders_through_waits():
    """producer -> consumer (PDL, waits) -> a third grid (PDL, waits) reading the producer's output: ordered
    through the consumer's completion, no race; without its wait the third grid races with the producer, which
    may still run (the consumer can start before its own wait)."""
    x, wt, out, res = tensors()
    res2 = torch.zeros(N, dtype=torch.int32)

    def grids(third_wait):
        p = make_launch(producer("before"), (GRID, 1, 1), (BLOCK, 1, 1), [x, out])
        c = make_launch(consumer("before").replace("    griddepcontrol.wait;\n",
                                                   "    griddepcontrol.launch_dependents;\n    griddepcontrol.wait;\n"),
                        (GRID, 1, 1), (BLOCK, 1, 1), [out, wt, res])
        t = make_launch(consumer(third_wait), (GRID, 1, 1), (BLOCK, 1, 1), [out, wt, res2])
        return [StreamGrid(p, False, "producer"), StreamGrid(c, True, "consumer"), StreamGrid(t, True, "third")]

    for schedule in SCHEDULES:
        res2.zero_()
        r = run_stream(grids("before"), schedule)
        assert r.races == [] and torch.equal(res2, 2 * x + 1 + wt)
    with pytest.raises(PdlRaceError, match="third:.*conflicting grid: producer"):
        run_stream(grids("none"), "early")


def test_stuck_primary_is_a_deadlock_report():
    """A dependent whose primary never completes (warp 1 exits, warp 0 waits at a barrier for it) is reported as
    a deadlock naming the stream's blocked warps, the dependent's wait among them, not a hang."""
    x, wt, out, res = tensors()
    spin = producer("after").replace("    ret;\n", "    setp.ge.u32 %p1, %r1, 32;\n    @%p1 bra DONE;\n"
                                     "    bar.sync 1, 64;\nDONE:\n    ret;\n")
    grids = [StreamGrid(make_launch(spin, (1, 1, 1), (BLOCK, 1, 1), [x, out]), False, "producer"),
             StreamGrid(make_launch(consumer("before"), (1, 1, 1), (BLOCK, 1, 1), [out, wt, res]), True, "consumer")]
    with pytest.raises(DeadlockError, match=r"(?s)PDL stream.*\[producer\].*\[consumer\].*griddepcontrol.wait"):
        run_stream(grids, "early")


def test_bad_schedule_named():
    x, wt, out, res = tensors()
    with pytest.raises(ValueError, match="PDL schedule must be one of"):
        run_stream(stream(producer(), consumer(), x, wt, out, res), "eager")
