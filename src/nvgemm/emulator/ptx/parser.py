"""PTX text -> entries of instructions (LLVM-NVPTX formatted PTX, CuTeDSL inline-asm scopes included).

Handles what nvgemm's kernels contain: ``.entry`` signatures with ``.param .align A .b8 name[N]`` and
scalar params, ``.reg .type %p<N>`` ranges and plain names, ``.shared`` / ``.extern .shared``
variables, brace scopes (inline-asm blocks) whose ``.reg`` declarations and labels are local to the
scope (uniqued here as ``name#scope``), predicated instructions (``@%p`` / ``@!%p``), vector operands
``{a, b}``, address operands ``[reg+imm]`` / ``[symbol+imm]``, ``%r|%p`` dual destinations, and the
immediate forms ``0x..``, ``0f<8 hex>`` (f32 bits), ``0d<16 hex>`` (f64 bits), decimals and floats.
Anything else is a :class:`~.errors.EmulationError` naming the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nvgemm.emulator.ptx.errors import EmulationError

REG_TYPES = {  # declared register type -> storage bank (raw bits; registers are untyped containers)
    "pred": "pred",
    "b8": "b16", "u8": "b16", "s8": "b16",
    "b16": "b16", "u16": "b16", "s16": "b16", "f16": "b16", "bf16": "b16",
    "b32": "b32", "u32": "b32", "s32": "b32", "f32": "b32", "f16x2": "b32", "bf16x2": "b32",
    "b64": "b64", "u64": "b64", "s64": "b64", "f64": "b64",
    "b128": "b128",
}
SCALAR_SIZE = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2, "b32": 4, "u32": 4,
               "s32": 4, "f32": 4, "b64": 8, "u64": 8, "s64": 8, "f64": 8, "pred": 1}


@dataclass
class Operand:
    """One parsed operand. ``kind``: reg | imm | vec | addr | sym | sink | dual.

    reg: ``name`` (resolved, scope-uniqued) | imm: ``value`` (int) or ``fvalue`` (float literal)
    vec: ``items`` (Operands) | addr: ``base`` (Operand reg/sym/imm) + ``offset`` (int)
    sym: ``name`` (label, param, shared variable, special register such as ``%tid.x``)
    dual: ``items`` = (first, second) of ``a|b``."""

    kind: str
    name: str = ""
    value: int = 0
    fvalue: float | None = None
    items: tuple = ()
    base: "Operand | None" = None
    offset: int = 0
    text: str = ""
    neg: bool = False  # a negated predicate source ``!%p``


@dataclass
class Instruction:
    pc: int
    opcode: str  # full dotted opcode with modifiers, e.g. "cp.async.ca.shared.global"
    operands: list[Operand]
    pred: str | None = None  # guard predicate register (resolved name)
    pred_neg: bool = False
    line: int = 0
    text: str = ""

    @property
    def parts(self) -> list[str]:
        return self.opcode.split(".")

    def where(self) -> str:
        return f"pc {self.pc} (PTX line {self.line}: {self.text.strip()[:160]})"


@dataclass
class Param:
    name: str
    offset: int
    size: int
    align: int


@dataclass
class SharedVar:
    name: str
    size: int  # 0 for extern (dynamic) arrays
    align: int
    extern: bool


@dataclass
class Entry:
    name: str
    params: list[Param]
    regs: dict[str, str]  # resolved register name -> bank ("pred", "b16", "b32", "b64")
    reg_ranges: dict[str, tuple[str, int]]  # prefix ("%r") -> (bank, count) of "%r<N>" declarations
    instructions: list[Instruction]
    labels: dict[str, int]  # resolved label -> pc
    directives: dict[str, tuple[int, ...]] = field(default_factory=dict)  # reqntid, maxntid, ...

    @property
    def param_bytes(self) -> int:
        return max((p.offset + p.size for p in self.params), default=0)


@dataclass
class Module:
    version: str
    target: str
    shared: list[SharedVar]
    entries: dict[str, Entry]


_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\(", re.S)
# ``.ptr{.space}{.align N}`` on a pointer parameter (PTX ISA "Kernel Function Parameter Attributes") describes
# the memory it points to, not the parameter's own layout: skipped
_PARAM = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+"
                    r"(?:\.ptr\s+(?:\.(?:global|shared|const|local)\s+)?(?:\.align\s+\d+\s+)?)?([\w$]+)(?:\[(\d+)\])?")
_REG_DECL = re.compile(r"^\.reg\s+(?:\.v\d\s+)?\.(\w+)\s+(.*)$", re.S)
_SHARED = re.compile(r"(\.extern\s+)?\.shared\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+([\w$]+)\[(\d*)\]$")
_LOCAL_DEPOT = re.compile(r"\.local\s+(?:\.align\s+\d+\s+)?\.b8\s+__local_depot\d+\[\d+\]")
_LINE_DIRECTIVE = re.compile(r"^[ \t]*\.(?:loc|file)\b[^\n]*", re.M)
_NUM = re.compile(r"^-?(0[xX][0-9a-fA-F]+|\d+)[uU]?$")
_LABEL = re.compile(r"^([\w$]+):")


def _split_top(s: str, sep: str = ",") -> list[str]:
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        if ch == sep and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def parse_imm(tok: str) -> Operand | None:
    t = tok.strip()
    if _NUM.match(t):
        neg = t.startswith("-")
        body = t.lstrip("-").rstrip("uU")
        v = int(body, 16) if body[:2].lower() == "0x" else int(body)
        return Operand("imm", value=-v if neg else v, text=t)
    if re.match(r"^0[fF][0-9a-fA-F]{8}$", t):
        return Operand("imm", value=int(t[2:], 16), fvalue=None, text=t, name="f32bits")
    if re.match(r"^0[dD][0-9a-fA-F]{16}$", t):
        return Operand("imm", value=int(t[2:], 16), text=t, name="f64bits")
    if re.match(r"^-?\d+\.\d*([eE][-+]?\d+)?$", t):
        return Operand("imm", fvalue=float(t), text=t, name="float")
    return None


class _Scopes:
    """Brace scopes of one entry body: declarations and labels resolve innermost-first."""

    def __init__(self):
        self.parent: list[int] = [-1]
        self.regs: list[dict[str, str]] = [{}]
        self.labels: list[dict[str, str]] = [{}]

    def open(self, cur: int) -> int:
        self.parent.append(cur)
        self.regs.append({})
        self.labels.append({})
        return len(self.parent) - 1

    def lookup(self, table: str, scope: int, name: str) -> str | None:
        s = scope
        while s >= 0:
            d = getattr(self, table)[s]
            if name in d:
                return d[name]
            s = self.parent[s]
        return None


def _split_labels(text: str) -> tuple[list[str], str]:
    labels = []
    while True:
        m = re.match(r"^\s*([\w$]+):(?!:)\s*", text)
        if not m:
            return labels, text.strip()
        labels.append(m.group(1) + ":")
        text = text[m.end():]


def _statements(body: str, line0: int):
    """(scope event | statement text, line) in order; events are ('open',) / ('close',); a label is a
    statement ``name:`` of its own."""
    cur: list[str] = []
    line = line0
    start = line0
    depth = 0  # vector-operand braces inside a statement

    def flush(text: str):
        labels, rest = _split_labels(text)
        for lab in labels:
            yield lab, start
        if rest:
            yield rest, start

    for ch in body:
        if ch == "\n":
            line += 1
        if ch == "{" and depth == 0:
            labels, rest = _split_labels("".join(cur))
            if not rest:
                for lab in labels:
                    yield lab, start
                yield ("open",), line
                cur = []
                continue
            depth += 1
        elif ch == "}":
            if depth == 0:
                labels, rest = _split_labels("".join(cur))
                if rest:
                    raise EmulationError(f"PTX line {line}: statement {rest!r} not terminated before '}}'")
                for lab in labels:
                    yield lab, start
                yield ("close",), line
                cur = []
                continue
            depth -= 1
        elif ch == ";" and depth == 0:
            yield from flush("".join(cur))
            cur = []
            continue
        if not cur or not "".join(cur).strip():
            start = line
        cur.append(ch)
    labels, rest = _split_labels("".join(cur))
    if rest:
        raise EmulationError(f"PTX line {line}: unterminated statement {rest!r}")
    for lab in labels:
        yield lab, start


def _matching_brace(text: str, i: int) -> int:
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    raise EmulationError("PTX: unbalanced braces in an entry body")


def parse_module(text: str) -> Module:
    """Parse a PTX module (every ``.entry``)."""
    src = _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    # debugging directives end at the end of their line, not at a ';' (PTX ISA ".loc", ".file"): left in, the
    # next statement would be read as part of the directive and dropped
    src = _LINE_DIRECTIVE.sub("", src)
    version = (re.search(r"\.version\s+([\d.]+)", src) or [None, ""])[1]
    target = (re.search(r"\.target\s+([\w,\s]+?)\n", src) or [None, ""])[1].strip()
    shared: list[SharedVar] = []
    entries: dict[str, Entry] = {}
    pos = 0
    for m in _ENTRY.finditer(src):
        # module-scope declarations between entries
        for stmt in src[pos:m.start()].split(";"):
            st = " ".join(stmt.split())
            sm = _SHARED.search(st)
            if sm:
                shared.append(SharedVar(sm.group(4), int(sm.group(5) or 0) * SCALAR_SIZE.get(sm.group(3), 1),
                                        int(sm.group(2) or SCALAR_SIZE.get(sm.group(3), 1)), bool(sm.group(1))))
        close = src.index(")", m.end())
        params = _parse_params(src[m.end():close])
        brace = src.index("{", close)
        dirs = {}
        for dm in re.finditer(r"\.(reqntid|maxntid|minnctapersm|reqnctapercluster|maxnreg|maxclusterrank)\s+([\d,\s]+)",
                              src[close:brace]):
            dirs[dm.group(1)] = tuple(int(v) for v in dm.group(2).replace(" ", "").split(",") if v)
        end = _matching_brace(src, brace)
        line0 = src.count("\n", 0, brace + 1) + 1
        entries[m.group(1)] = _parse_body(m.group(1), params, src[brace + 1:end], line0, dirs,
                                          {v.name for v in shared})
        pos = end + 1
    return Module(version, target, shared, entries)


def _parse_params(text: str) -> list[Param]:
    out, off = [], 0
    for p in _split_top(text):
        pm = _PARAM.search(p)
        if not pm:
            raise EmulationError(f"PTX: cannot parse kernel parameter {p!r}")
        size = SCALAR_SIZE[pm.group(2)] * (int(pm.group(4)) if pm.group(4) else 1)
        align = int(pm.group(1)) if pm.group(1) else SCALAR_SIZE[pm.group(2)]
        off = (off + align - 1) // align * align
        out.append(Param(pm.group(3), off, size, align))
        off += size
    return out


def _parse_body(name: str, params: list[Param], body: str, line0: int, dirs: dict, shared_names: set[str]) -> Entry:
    scopes = _Scopes()
    regs: dict[str, str] = {}
    ranges: dict[str, tuple[str, int]] = {}
    raw: list[tuple[str, int, int]] = []  # (statement, line, scope)
    scope = 0
    stack = [0]
    uid = 0
    for st, line in _statements(body, line0):
        if st == ("open",):
            scope = scopes.open(scope)
            stack.append(scope)
            continue
        if st == ("close",):
            stack.pop()
            if not stack:
                raise EmulationError(f"PTX line {line}: unbalanced '}}' in {name}")
            scope = stack[-1]
            continue
        st = " ".join(st.split())
        lm = re.fullmatch(r"([\w$]+):", st)
        if lm:
            uniq = lm.group(1) if scope == 0 else f"{lm.group(1)}#{scope}"
            scopes.labels[scope][lm.group(1)] = uniq
            raw.append((f"{uniq}:", line, scope))
            continue
        if st.startswith(".reg"):
            rm = _REG_DECL.match(st)
            if not rm or rm.group(1) not in REG_TYPES:
                raise EmulationError(f"PTX line {line}: unsupported register declaration {st!r}")
            bank = REG_TYPES[rm.group(1)]
            for item in _split_top(rm.group(2)):
                rr = re.fullmatch(r"(%?[\w$]+)<(\d+)>", item)
                if rr:
                    if scope != 0:
                        raise EmulationError(f"PTX line {line}: register range in a nested scope: {st!r}")
                    ranges[rr.group(1)] = (bank, int(rr.group(2)))
                    continue
                uid += 1
                uniq = item if scope == 0 else f"{item}#{scope}"
                scopes.regs[scope][item] = uniq
                regs[uniq] = bank
            continue
        if st.startswith("."):
            if st.startswith(".local") and _LOCAL_DEPOT.fullmatch(st):
                # a per-thread stack frame LLVM declares even when nothing uses it (Triton 3.8, sm_100a). It is not
                # given an address: an instruction naming it, or any .local access, is an error at compile time
                continue
            if st.startswith((".local", ".shared", ".global", ".const", ".extern")):
                raise EmulationError(f"PTX line {line}: unsupported declaration inside {name}: {st!r}")
            continue  # .pragma, .loc, ...
        raw.append((st, line, scope))

    instructions: list[Instruction] = []
    labels: dict[str, int] = {}
    pending = []
    for st, line, sc in raw:
        if st.endswith(":") and re.fullmatch(r"[\w$#]+:", st):
            labels[st[:-1]] = len(instructions)
            continue
        pending.append((st, line, sc))
        instructions.append(None)  # placeholder, filled below
    param_names = {p.name for p in params}

    def resolve_name(tok: str, sc: int) -> Operand:
        tok = tok.strip()
        if tok == "_":
            return Operand("sink", text=tok)
        r = scopes.lookup("regs", sc, tok)
        if r is not None:
            return Operand("reg", name=r, text=tok)
        m = re.fullmatch(r"(%[A-Za-z_]+)(\d+)", tok)
        if m and m.group(1) in ranges:
            bank, count = ranges[m.group(1)]
            if int(m.group(2)) >= count:
                raise EmulationError(f"PTX: register {tok} beyond its declaration {m.group(1)}<{count}>")
            regs.setdefault(tok, bank)
            return Operand("reg", name=tok, text=tok)
        lab = scopes.lookup("labels", sc, tok)
        if lab is not None:
            return Operand("sym", name=lab, text=tok)
        if tok in param_names or tok in shared_names or tok.startswith("%"):
            return Operand("sym", name=tok, text=tok)
        if re.fullmatch(r"[\w$]+", tok):
            return Operand("sym", name=tok, text=tok)
        raise EmulationError(f"PTX: cannot parse operand {tok!r}")

    def operand(tok: str, sc: int) -> Operand:
        tok = tok.strip()
        if tok.startswith("{") and tok.endswith("}"):
            return Operand("vec", items=tuple(operand(t, sc) for t in _split_top(tok[1:-1])), text=tok)
        if tok.startswith("[") and tok.endswith("]"):
            inner = tok[1:-1].replace(" ", "")
            mm = re.fullmatch(r"([^+\-]+)(?:\+?(-?(?:0[xX][0-9a-fA-F]+|\d+)))?", inner)
            if not mm:
                imm = parse_imm(inner)
                if imm is not None:
                    return Operand("addr", base=imm, offset=0, text=tok)
                raise EmulationError(f"PTX: cannot parse address {tok!r}")
            base = parse_imm(mm.group(1)) or resolve_name(mm.group(1), sc)
            off = int(mm.group(2), 0) if mm.group(2) else 0
            return Operand("addr", base=base, offset=off, text=tok)
        if "|" in tok:
            a, b = tok.split("|")
            return Operand("dual", items=(operand(a, sc), operand(b, sc)), text=tok)
        imm = parse_imm(tok)
        if imm is not None:
            return imm
        if tok.startswith("!"):
            o = resolve_name(tok[1:], sc)
            o.text = tok
            o.neg = True
            return o
        return resolve_name(tok, sc)

    for i, (st, line, sc) in enumerate(pending):
        pred, neg = None, False
        pm = re.match(r"^@(!?)(%?[\w$]+)\s+", st)
        if pm:
            neg = pm.group(1) == "!"
            po = resolve_name(pm.group(2), sc)
            pred = po.name
            st = st[pm.end():]
        sp = st.split(None, 1)
        opcode = sp[0]
        ops = [operand(t, sc) for t in _split_top(sp[1])] if len(sp) > 1 else []
        instructions[i] = Instruction(i, opcode, ops, pred, neg, line, st)
    return Entry(name, params, regs, ranges, instructions, labels, dirs)


__all__ = ["Entry", "Instruction", "Module", "Operand", "Param", "REG_TYPES", "SharedVar", "parse_module",
           "parse_imm"]
