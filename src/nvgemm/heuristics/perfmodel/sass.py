"""SASS text -> per-kernel facts (pure text processing: no compiler, no GPU, no torch).

Input is ``cuobjdump --dump-sass`` text (optionally with ``--dump-resource-usage`` text). The
parser keeps, per instruction, its byte offset, guard predicate, opcode, operands and the
**control bits** of the 128-bit encoding (the second hex word cuobjdump prints):

    hi = upper 64 bits;  c = hi >> 41
    stall  = c & 0xf          cycles before this warp may issue its next instruction
    yield  = (c >> 4) & 1
    wbar   = (c >> 5) & 7     scoreboard set when the result is written (7: none)
    rbar   = (c >> 8) & 7     scoreboard set until the sources are read (7: none)
    wait   = (c >> 11) & 0x3f scoreboards this instruction waits for (bit i: SB i)

This is the Volta..Blackwell control-code layout (the one maxas/turingas-style tools decode);
``tests/cpu/test_perfmodel.py`` checks it on a recorded snippet (an LDG sets a write scoreboard,
its first consumer waits on it).

Loops
-----
A loop is a backward branch: a ``BRA`` (guarded; on sm_120a / sm_121a / sm_8x also one with its condition
as an operand, ``BRA.U UP0, <target>``: :data:`OPERAND_BRANCH_LOOP_ARCHS`) at offset ``b`` whose target ``t <= b``
(the self-branch ``BRA <own offset>`` that pads the end of a function is not a loop). Its body is
every instruction in ``[t, b]``. The **main loop** of a streaming kernel is picked as follows:

1. candidate loops are those whose body contains at least one *stream load* (a regex the kernel
   family supplies, e.g. ``LDG.E.NA.128`` for the sm90 weight loads);
2. among them, the innermost (smallest span) that holds the most stream loads wins;
3. the **pass loop** is the smallest loop strictly containing the main loop (if any); its
   instructions outside the main loop are the per-pass overhead.

Forward branches inside a loop body are ignored (every instruction of the span counts as executed
once per iteration). That holds for the sm90 streaming kernels: every mma main loop in the table
has exactly one branch, its back edge (masking is done with selects), and every wgmma main loop one
more, over the ring refill, which is skipped only in a split's last ``stages - 2`` iterations
(``tests/cpu/test_perfmodel.py`` checks the table's histograms). The warp-specialised sm100 kernel's loops spin on mbarriers; the
model does not use their instruction counts (see ``families/sm100.py``).

Single-warp timing of a loop (:func:`loop_cycles`)
--------------------------------------------------
The body is replayed for a few iterations with the control bits: an instruction issues when the
scoreboards in its wait mask are clear, then holds the warp for ``max(1, stall)`` cycles; a
variable-latency instruction releases its write scoreboard ``latency(op)`` cycles after issue
(stream loads: the DRAM latency; other global loads: the L2 latency; shared memory, shuffles,
MUFU, conversions, tensor-core ops: the small constants in :data:`VAR_LATENCY`). ``DEPBAR.LE SBx, n``
waits until at most ``n`` operations on SBx are outstanding (oldest first). The steady-state
cycles of one iteration at two latencies give ``cycles(L) = base + round_trips * L``, so the
number of serial DRAM round trips per iteration falls out of the schedule ptxas actually emitted
(loads consumed in the step that issues them: 1; a late second wave of loads: ~2; a register
prefetch one step ahead: < 1).

Issue cost (:func:`issue_cycles`): one warp-instruction per cycle per scheduler, except the
integer/logic datapath (16 lanes per sub-partition on sm_90/sm_100: 2 cycles per warp
instruction) and the conversion/MUFU unit (4 lanes: 8 cycles), per the CUDA C++ Programming
Guide's arithmetic-throughput table (compute capability 9.0/10.0: 64 results/clock/SM for 32-bit
integer add/shift/logic, 16 for "all other type conversions"). F2FP (fp32 -> 16-bit pair packing)
is counted on the integer datapath; that classification is an assumption (not in the table).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# ------------------------------------------------------------------------------------ parsing

_FUNC_RE = re.compile(r"^\s*Function\s*:\s*(\S+)")
_INS_RE = re.compile(
    r"^\s*/\*([0-9a-fA-F]{4,})\*/\s+(?P<pred>@!?U?P[T0-9]+\s+)?(?P<op>[A-Z][A-Z0-9_.]*)(?P<args>[^;]*);"
    r"\s*/\*\s*0x(?P<lo>[0-9a-fA-F]{16})\s*\*/"
)
_HI_RE = re.compile(r"^\s*/\*\s*0x([0-9a-fA-F]{16})\s*\*/\s*$")
_RES_FUNC_RE = re.compile(r"^\s*Function\s+(\S+?):\s*$")
_RES_RE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
_ARCH_RE = re.compile(r"arch\s*=\s*(sm_\w+)")
#: A branch's target: ``BRA 0x10``, ``BRA `(.L_x_3) 0x10``, and the form with the branch condition as the
#: first operand, a uniform predicate (``BRA.U UP0, 0x10``, ``BRA.U !UP2, 0x2c40``: what ptxas emits for
#: uniform loop branches on sm_100a and sm_120a) or a predicate (group ``cond``).
_BRA_TARGET_RE = re.compile(r"^\s*(?P<cond>!?U?P[T0-9]+\s*,\s*)?(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-fA-F]+)")
#: Archs whose backward branches with the condition as an operand count as loops (:func:`find_loops`): the W4A16
#: ``mma`` kernel's archs beside Hopper, whose compile-sweep records read them. sm_100a's SASS has them as well,
#: but the sm_100 family's table facts -- and the model calibrated on them -- were derived without them (its "main
#: loop" is then the span up to an out-of-line wait stub's jump back); reading them there (and on sm_90a, whose
#: table predates this form) changes those facts and needs their recalibration, which this constant keeps apart.
OPERAND_BRANCH_LOOP_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_120a", "sm_121a")
_DEPBAR_RE = re.compile(r"SB(\d)\s*,\s*(0x[0-9a-fA-F]+|\d+)")

NO_BARRIER = 7


@dataclass(frozen=True)
class Instr:
    offset: int
    opcode: str  # full mnemonic with modifiers, e.g. "LDG.E.NA.128.CONSTANT"
    args: str
    pred: str = ""
    stall: int = 1
    yield_: int = 0
    wbar: int = NO_BARRIER
    rbar: int = NO_BARRIER
    wait: int = 0

    @property
    def base(self) -> str:
        """Mnemonic without modifiers (``LDG``)."""
        return self.opcode.split(".", 1)[0]

    @property
    def text(self) -> str:
        return f"{self.pred}{self.opcode} {self.args.strip()}".strip()

    def branch_target(self, operand_condition: bool = True) -> int | None:
        """The target offset of a branch (None: not a branch, or ``operand_condition`` is False and the
        branch has its condition as an operand, ``BRA.U UP0, <target>``)."""
        if self.base not in ("BRA", "BRX"):
            return None
        m = _BRA_TARGET_RE.match(self.args)
        if m is None or (m.group("cond") and not operand_condition):
            return None
        return int(m.group(2), 16)


@dataclass
class Function:
    name: str
    instrs: list[Instr] = field(default_factory=list)
    regs: int | None = None
    stack: int | None = None
    shared: int | None = None
    local: int | None = None
    arch: str | None = None  # the ``arch = sm_...`` line of the listing before the function

    def index_of(self, offset: int) -> int:
        for i, ins in enumerate(self.instrs):
            if ins.offset == offset:
                return i
        raise KeyError(hex(offset))


def decode_control(hi: int) -> dict:
    """The control fields of an instruction's upper 64 bits (see the module docstring)."""
    c = hi >> 41
    return {
        "stall": c & 0xF,
        "yield_": (c >> 4) & 1,
        "wbar": (c >> 5) & 7,
        "rbar": (c >> 8) & 7,
        "wait": (c >> 11) & 0x3F,
    }


def parse_sass(text: str, resource_usage: str = "") -> list[Function]:
    """All functions of a ``cuobjdump --dump-sass`` listing, with resource usage when given."""
    funcs: list[Function] = []
    cur: Function | None = None
    pending: tuple | None = None  # (offset, pred, op, args) waiting for its hi word
    arch = None
    for line in text.splitlines():
        am = _ARCH_RE.match(line.strip())
        if am:
            arch = am.group(1)
            continue
        fm = _FUNC_RE.match(line)
        if fm:
            cur = Function(fm.group(1), arch=arch)
            funcs.append(cur)
            pending = None
            continue
        if cur is None:
            continue
        im = _INS_RE.match(line)
        if im:
            pending = (int(im.group(1), 16), (im.group("pred") or "").strip(), im.group("op"), im.group("args"))
            continue
        hm = _HI_RE.match(line)
        if hm and pending is not None:
            off, pred, op, args = pending
            cur.instrs.append(Instr(off, op, args, pred + " " if pred else "", **decode_control(int(hm.group(1), 16))))
            pending = None
    if resource_usage:
        res = parse_resource_usage(resource_usage)
        for f in funcs:
            if f.name in res:
                f.regs, f.stack, f.shared, f.local = res[f.name]
    return funcs


def parse_resource_usage(text: str) -> dict[str, tuple[int, int, int, int]]:
    """``cuobjdump --dump-resource-usage`` -> {function: (REG, STACK, SHARED, LOCAL)}."""
    out: dict[str, tuple[int, int, int, int]] = {}
    name = None
    for line in text.splitlines():
        fm = _RES_FUNC_RE.match(line)
        if fm:
            name = fm.group(1)
            continue
        rm = _RES_RE.search(line)
        if rm and name:
            out[name] = tuple(int(v) for v in rm.groups())  # type: ignore[assignment]
            name = None
    return out


def sass_arch(text: str) -> str | None:
    m = _ARCH_RE.search(text)
    return m.group(1) if m else None


# ------------------------------------------------------------------------------------ loops


@dataclass(frozen=True)
class Loop:
    start: int  # index of the first body instruction
    end: int  # index of the backward branch (inclusive)

    @property
    def span(self) -> int:
        return self.end - self.start + 1

    def contains(self, other: "Loop") -> bool:
        return self.start <= other.start and other.end <= self.end and self != other


def find_loops(fn: Function) -> list[Loop]:
    """Backward branches of ``fn`` as loops (see the module docstring), outermost last."""
    loops = []
    operand = fn.arch in OPERAND_BRANCH_LOOP_ARCHS
    for i, ins in enumerate(fn.instrs):
        t = ins.branch_target(operand)
        if t is None or t >= ins.offset:
            continue  # forward branch, or the end-of-function self-branch (t == offset)
        try:
            loops.append(Loop(fn.index_of(t), i))
        except KeyError:
            continue
    return sorted(loops, key=lambda lp: (lp.span, lp.start))


def body(fn: Function, loop: Loop) -> list[Instr]:
    return fn.instrs[loop.start : loop.end + 1]


def count_matching(instrs, pattern: re.Pattern | str) -> int:
    pat = re.compile(pattern) if isinstance(pattern, str) else pattern
    return sum(1 for ins in instrs if pat.search(ins.opcode))


def main_loop(fn: Function, stream_load: str) -> Loop | None:
    """The streaming main loop of ``fn``: innermost loop holding the most stream loads."""
    pat = re.compile(stream_load)
    best = None
    best_key = None
    for lp in find_loops(fn):
        n = count_matching(body(fn, lp), pat)
        if n == 0:
            continue
        key = (-n, lp.span)
        if best_key is None or key < best_key:
            best, best_key = lp, key
    return best


def enclosing_loop(fn: Function, inner: Loop) -> Loop | None:
    outer = [lp for lp in find_loops(fn) if lp.contains(inner)]
    return min(outer, key=lambda lp: lp.span) if outer else None


# ------------------------------------------------------------------------------------ costs

#: Instructions not executed (padding) or not issued as work.
_NOT_COUNTED = {"NOP"}
#: 32-bit integer / logic datapath: 16 lanes per sub-partition -> 2 cycles per warp-instruction.
INT_PIPE = {
    "IADD3", "IADD", "LOP3", "LOP", "SHF", "SHL", "SHR", "ISETP", "IMNMX", "LEA", "SEL", "PRMT",
    "IABS", "BMSK", "BREV", "FLO", "POPC", "SGXT", "F2FP", "MOV", "PLOP3", "P2R", "R2P", "VIADD",
    "VIMNMX", "IMAD", "FSEL", "FSETP", "FMNMX", "CSET", "CSETP",
}
#: Conversion / special-function unit: 4 lanes per sub-partition -> 8 cycles per warp-instruction.
XU_PIPE = {"F2F", "F2I", "I2F", "I2FP", "F2IP", "MUFU", "FRND"}
INT_CYCLES = 2
XU_CYCLES = 8

#: Release latency (cycles) of variable-latency ops that set a write scoreboard. ``"global"`` and
#: ``"stream"`` are filled in from the hardware description by :func:`loop_cycles`.
VAR_LATENCY = {
    "LDS": 30, "LDSM": 32, "STS": 20, "ATOMS": 40, "SHFL": 28, "MUFU": 20, "S2R": 24, "S2UR": 24,
    "CS2R": 8, "LDC": 24, "ULDC": 24, "HMMA": 32, "IMMA": 32, "HGMMA": 64, "BAR": 30, "F2F": 16,
    "I2F": 16, "F2I": 16, "I2FP": 16, "F2IP": 16, "F2FP": 8, "POPC": 12, "FLO": 12, "BREV": 12,
    "MATCH": 40, "VOTE": 8, "REDUX": 40, "SYNCS": 40, "LDL": 40, "STL": 20,
}
DEFAULT_VAR_LATENCY = 20
_GLOBAL_MEM = {"LDG", "LD", "ATOMG", "ATOM", "RED", "LDGSTS", "STG", "ST"}


def counted(instrs) -> list[Instr]:
    return [i for i in instrs if i.base not in _NOT_COUNTED]


def issue_cycles(instrs) -> int:
    """Scheduler cycles one warp needs to issue ``instrs`` when nothing else limits it:
    ``max(instructions, 2 x integer-datapath ops, 8 x conversion/MUFU ops)``."""
    ins = counted(instrs)
    n_int = sum(1 for i in ins if i.base in INT_PIPE)
    n_xu = sum(1 for i in ins if i.base in XU_PIPE)
    return max(len(ins), INT_CYCLES * n_int, XU_CYCLES * n_xu)


def opcode_histogram(instrs) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in counted(instrs):
        out[i.base] = out.get(i.base, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def _latency(ins: Instr, stream_pat: re.Pattern, dram: float, l2: float) -> float:
    if stream_pat.search(ins.opcode):
        return dram
    if ins.base in _GLOBAL_MEM:
        return l2
    return float(VAR_LATENCY.get(ins.base, DEFAULT_VAR_LATENCY))


def loop_cycles(instrs, stream_load: str, dram_latency: float, l2_latency: float, iterations: int = 4) -> float:
    """Steady-state cycles of one iteration of ``instrs`` (a loop body) for a single warp.

    Replays the body ``iterations`` times with the control bits (see the module docstring) and
    returns the duration of the last iteration, so loads carried over from the previous one
    (register prefetch) are accounted for."""
    pat = re.compile(stream_load)
    sb: list[list[float]] = [[] for _ in range(6)]  # completion times per scoreboard
    t = 0.0
    starts = []
    body_ = counted(instrs)
    for _ in range(iterations):
        starts.append(t)
        for ins in body_:
            for b in range(6):
                if ins.wait >> b & 1 and sb[b]:
                    t = max(t, max(sb[b]))
                    sb[b] = []
            if ins.base == "DEPBAR":
                m = _DEPBAR_RE.search(ins.args)
                if m:
                    b, keep = int(m.group(1)), int(m.group(2), 0)
                    pend = sorted(sb[b])
                    if len(pend) > keep:
                        t = max(t, pend[len(pend) - keep - 1])
                        sb[b] = pend[len(pend) - keep:]
            if ins.wbar != NO_BARRIER:
                sb[ins.wbar].append(t + _latency(ins, pat, dram_latency, l2_latency))
            if ins.rbar != NO_BARRIER:
                sb[ins.rbar].append(t + 4.0)
            t += max(1, ins.stall)
    starts.append(t)
    return starts[-1] - starts[-2]


def chain_coefficients(instrs, stream_load: str, dram_lo: float, dram_hi: float, l2_latency: float) -> tuple[float, float]:
    """``(base, round_trips)`` with ``loop_cycles(L) ~= base + round_trips * L`` over [dram_lo, dram_hi]."""
    c_lo = loop_cycles(instrs, stream_load, dram_lo, l2_latency)
    c_hi = loop_cycles(instrs, stream_load, dram_hi, l2_latency)
    rt = (c_hi - c_lo) / (dram_hi - dram_lo) if dram_hi > dram_lo else 0.0
    return c_lo - rt * dram_lo, rt


def spills(instrs) -> tuple[int, int]:
    """(LDL, STL) counts: local-memory loads and stores (register spills or local arrays)."""
    ins = counted(instrs)
    return sum(1 for i in ins if i.base == "LDL"), sum(1 for i in ins if i.base == "STL")


def find_function(funcs: list[Function], stream_load: str) -> Function:
    """The function holding the most stream loads (the main kernel; a split-K reduce kernel has none)."""
    pat = re.compile(stream_load)
    scored = [(count_matching(f.instrs, pat), -i, f) for i, f in enumerate(funcs)]
    if not scored:
        raise ValueError("no functions in the SASS listing")
    n, _, f = max(scored, key=lambda s: (s[0], s[1]))
    if n == 0:
        raise ValueError(f"no instruction matches the stream-load pattern {stream_load!r}")
    return f


__all__ = [
    "Function",
    "Instr",
    "Loop",
    "body",
    "chain_coefficients",
    "count_matching",
    "counted",
    "decode_control",
    "enclosing_loop",
    "find_function",
    "find_loops",
    "issue_cycles",
    "loop_cycles",
    "main_loop",
    "opcode_histogram",
    "parse_resource_usage",
    "parse_sass",
    "sass_arch",
    "spills",
]
