"""The three PDL mutations of real PTX the decode-chain tests apply (text edits of a captured launch's PTX, the
program recompiled): a consumer's ``griddepcontrol.wait`` moved after its first read of the producer's output,
the wait dropped, and the producer's ``launch_dependents`` moved before its last global store."""

from __future__ import annotations

import re

import pytest

from nvgemm.emulator.ptx.pdl import PdlRaceError
from nvgemm.emulator.ptx.program import compile_entry
from nvgemm.emulator.stream import run_captured

_WAIT = re.compile(r"^\s*griddepcontrol\.wait\s*;\s*$", re.M)
_TRIGGER = re.compile(r"^\s*griddepcontrol\.launch_dependents\s*;\s*$", re.M)
_GLOBAL_READ = re.compile(r"^\s*(@%p\d+\s+)?(ld\.global|cp\.async\.(ca|cg)\.shared(::\w+)?\.global|"
                          r"cp\.async\.bulk\.tensor\.\w+\.shared::\w+\.global)\b", re.M)
_GLOBAL_STORE = re.compile(r"^\s*(@%p\d+\s+)?(st\.global|cp\.async\.bulk\.tensor\.\w+\.global\.shared)\b", re.M)


def wait_after_line(ptx: str, line: int) -> str:
    """Move the last ``griddepcontrol.wait`` above PTX line ``line`` (0-based) to just after that line."""
    lines = ptx.split("\n")
    above = [i for i in range(line) if _WAIT.match(lines[i])]
    assert above, f"no griddepcontrol.wait above PTX line {line}"
    lines.insert(line + 1, "\tgriddepcontrol.wait;")
    del lines[above[-1]]
    return "\n".join(lines)


def first_read_of_producer_output(recapture, cons: int) -> int:
    """The PTX line of the consumer's first read (in program text order) of bytes its producer writes: the
    consumer run without its wait, every race collected (each names the reading instruction's line)."""
    grids = recapture()
    mutate(grids[cons], drop_wait)
    races = run_captured(grids, "early", strict=False).races
    lines = [int(m.group(1)) for r in races if r.kernel == grids[cons].name and r.kind == "read-after-write"
             for m in [re.search(r"PTX line (\d+)", r.where)] if m]
    assert lines, "the consumer reads nothing its producer writes"
    ptx_lines = grids[cons].launch.ext["ptx"].split("\n")
    # the reported line number is 1-based for the CuTeDSL PTX and equals the text index for Triton's: accept the
    # read at either
    n = min(lines)
    at = [i for i in (n - 1, n) if i < len(ptx_lines) and _GLOBAL_READ.match(ptx_lines[i])]
    assert at, ptx_lines[n - 1:n + 1]
    return at[0]


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



MUTATIONS = ["wait after first read", "wait dropped", "trigger before last store, no wait"]


def apply_and_expect_race(recapture, mutation: str, pair) -> str:
    """Apply ``mutation`` to the (producer, consumer) ``pair`` of freshly captured launches (``recapture()``);
    the early schedule must report a race naming the consumer kernel, its instruction and the address.
    Returns the report."""
    prod, cons = pair
    if mutation == "wait after first read":
        line = first_read_of_producer_output(recapture, cons)
        grids = recapture()
        mutate(grids[cons], lambda ptx: wait_after_line(ptx, line))
    else:
        grids = recapture()
        if mutation == "wait dropped":
            mutate(grids[cons], drop_wait)
        else:
            mutate(grids[prod], trigger_before_last_store)
            mutate(grids[cons], drop_wait)
    with pytest.raises(PdlRaceError) as e:
        run_captured(grids, "early")
    msg = str(e.value)
    assert f"{grids[cons].name}:" in msg and "before griddepcontrol.wait" in msg, msg
    assert re.search(r"at 0x[0-9a-f]+ \(", msg) and "PTX line" in msg, msg
    return msg
