"""Imports flow one way (issue 31 item 3): an AST check of every nvgemm import in ``src/nvgemm``.

What counts as an import of an nvgemm module (an *edge*):
- every ``import nvgemm...`` / ``from nvgemm... import ...`` / relative ``from . import ...``, at module
  level, in class bodies and inside functions alike (``from A import b`` targets ``A.b`` when that is a
  module, else ``A``); imports under ``if TYPE_CHECKING:`` never run and are skipped;
- *by-name* imports: a string constant (not a docstring) that is exactly the dotted name of an nvgemm
  module, as passed to ``importlib.import_module`` or kept in a table of modules to import
  (``dispatch.registry._BUILTIN_MODULES``, ``aot.abi.BUILTIN_TEMPLATE_MODULES``).

Each module belongs to one *unit*: ``templates/<family>``, ``templates/common``, ``integrations/<x>``, or
else the first folder (or module) under ``nvgemm/``; ``nvgemm/__init__.py`` is the unit ``nvgemm``,
``templates/__init__.py`` belongs to ``templates/common``. :data:`LAYERS` ranks the units, lowest first.
The test fails on
(a) an edge to a unit of a higher layer (the only exceptions: :data:`ALLOWED_UPWARD`, each with a reason);
    edges between units of one layer (two families, two integrations, heuristics and aot) are allowed;
(b) a cycle between units, whatever the layers (reported as the edge list of each strongly connected set);
(c) an import of the emulator from outside ``emulator/`` and ``cli/``, except by the one opt-in module
    :data:`EMULATOR_OPT_IN`; the emulator itself may import any unit below ``cli``;
(d) a function-level import of an nvgemm module without a one-line reason: a ``# lazy: <reason>``
    comment on the import's own line(s) or on the line above it; one comment above a run of adjacent
    import lines covers the run. An import with no such reason belongs at module level. The reasons in
    use: ``# lazy: triton import cost`` (or cutlass, vllm: the imported module imports it at module level
    and the importer does not), ``# lazy: keeps X out of `import nvgemm``` (the importer is on the
    ``import nvgemm`` path), ``# lazy: breaks the cycle X <-> Y`` (name both modules), ``# lazy: looked up
    at call time (tests patch X)``, ``# lazy: optional here (the except ImportError below falls back)``.
Third-party imports inside functions need no comment: for cutlass, triton, torch._inductor, vllm,
transformers, modelopt, nvMatmulHeuristics and the like the module name is the reason (start-up cost or
an optional dependency; ``import nvgemm`` imports none of them, see ``test_import_nvgemm_stays_light``).
"""

from __future__ import annotations

import ast
import io
import pathlib
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"

#: The layers, lowest first: a unit may import units of its own layer or lower ones. ``templates/*``
#: and ``integrations/*`` stand for every family / integration folder.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("settings",),  # reads NVGEMM_* only; any unit may import it
    ("core",),  # formats, problem, status, files: the contract
    ("epilogues",),
    ("heuristics", "aot"),  # the candidate + performance-model engines; ABI, compile spec, cache
    ("templates/common",),
    ("templates/*",),  # one folder per kernel family; one family may build on another (no cycle)
    ("dispatch",),
    ("ops",),
    ("nn",),
    ("integrations", "integrations/*"),
    ("cli", "testing"),  # testing.py: tiny ModelOpt checkpoints for tests, benches and `nvgemm demo`
    ("nvgemm",),  # nvgemm/__init__.py: the public names
)

#: The emulator sits beside the stack: it may import any unit below this one, and is imported only by
#: emulator/, cli/ and the opt-in module below.
EMULATOR = "emulator"
EMULATOR_CEILING = "cli"

#: module -> reason. The one module outside emulator/ and cli/ that may import the emulator.
EMULATOR_OPT_IN: dict[str, str] = {
    "nvgemm.dispatch.registry": "_emulator_requested: enables the emulator when NVGEMM_BACKEND, NVGEMM_MOE_BACKEND "
    "or NVGEMM_FUSED_BACKEND names an emu_* backend",
}

#: (importer module, imported module) -> reason. Upward edges that stay; keep this list short.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}

LAZY_COMMENT = re.compile(r"#\s*lazy:\s*\S.{3,}")


@dataclass(frozen=True)
class Edge:
    src: str  # importing module, dotted
    dst: str  # imported module, dotted
    path: str  # file relative to src/
    line: int
    kind: str  # "module" | "function" | "by-name"

    def __str__(self):
        return f"{self.path}:{self.line}: {self.src} -> {self.dst} ({self.kind})"


def _module_name(path: pathlib.Path, src: pathlib.Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(src: pathlib.Path = SRC) -> dict[str, pathlib.Path]:
    return {_module_name(p, src): p for p in sorted((src / "nvgemm").rglob("*.py"))}


def unit_of(module: str, mods: dict[str, pathlib.Path], src: pathlib.Path = SRC) -> str:
    parts = module.split(".")[1:]
    if not parts:
        return "nvgemm"
    if parts[0] in ("templates", "integrations") and len(parts) >= 2 and (src / "nvgemm" / parts[0] / parts[1]).is_dir():
        return f"{parts[0]}/{parts[1]}"
    if parts[0] == "templates":  # templates/__init__.py and any module directly under templates/
        return "templates/common"
    return parts[0]


def rank_of(unit: str, layers=LAYERS) -> int | None:
    for i, layer in enumerate(layers):
        for pat in layer:
            if unit == pat or (pat.endswith("/*") and unit.startswith(pat[:-1])):
                return i
    return None


def _is_type_checking(node: ast.AST) -> bool:
    t = node.test if isinstance(node, ast.If) else None
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _resolve(node: ast.AST, module: str, is_pkg: bool, mods) -> list[str]:
    """The nvgemm modules an import statement imports (empty for third-party imports)."""
    out = []
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name == "nvgemm" or a.name.startswith("nvgemm."):
                name = a.name
                while name not in mods and "." in name:
                    name = name.rsplit(".", 1)[0]
                out.append(name)
        return out
    if node.level:
        base = module.split(".") if is_pkg else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not (target == "nvgemm" or target.startswith("nvgemm.")):
        return out
    for a in node.names:
        sub = f"{target}.{a.name}"
        out.append(sub if sub in mods else target)
    return out


def _has_lazy_comment(lines: list[str], comments: dict[int, str], node, body) -> bool:
    """A ``# lazy:`` comment on the statement's lines, or above the run of adjacent imports it is in."""
    if any(LAZY_COMMENT.search(comments.get(n, "")) for n in range(node.lineno, node.end_lineno + 1)):
        return True
    i = next(k for k, s in enumerate(body) if s is node)
    while i > 0 and isinstance(body[i - 1], (ast.Import, ast.ImportFrom)) and body[i - 1].end_lineno == body[i].lineno - 1:
        i -= 1
        if any(LAZY_COMMENT.search(comments.get(n, "")) for n in range(body[i].lineno, body[i].end_lineno + 1)):
            return True
    above = body[i].lineno - 1
    return LAZY_COMMENT.search(comments.get(above, "")) is not None and lines[above - 1].lstrip().startswith("#")


def scan(src: pathlib.Path = SRC):
    """(edges, statements, uncommented): every nvgemm import edge; counts of internal import statements
    (all, inside functions); the function-level nvgemm imports that lack a ``# lazy:`` reason."""
    mods = modules(src)
    edges: list[Edge] = []  # one per (statement, target); a duplicate alias adds nothing
    n_all = n_fn = 0
    uncommented: list[str] = []
    for module, path in mods.items():
        text = path.read_text()
        lines = text.splitlines()
        comments = {t.start[0]: t.string for t in tokenize.generate_tokens(io.StringIO(text).readline)
                    if t.type == tokenize.COMMENT}
        rel = str(path.relative_to(src))
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(text)
        docstrings = set()

        def visit(node, in_fn, body):
            nonlocal n_all, n_fn
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets = _resolve(node, module, is_pkg, mods)
                if targets:
                    n_all += 1
                    n_fn += in_fn
                    if in_fn and not _has_lazy_comment(lines, comments, node, body):
                        uncommented.append(f"{rel}:{node.lineno}: {ast.get_source_segment(text, node).splitlines()[0]}")
                for t in dict.fromkeys(targets):
                    edges.append(Edge(module, t, rel, node.lineno, "function" if in_fn else "module"))
                return
            if isinstance(node, ast.If) and _is_type_checking(node):
                for child in node.orelse:
                    visit(child, in_fn, node.orelse)
                return
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
                b = node.body
                if b and isinstance(b[0], ast.Expr) and isinstance(b[0].value, ast.Constant):
                    docstrings.add(id(b[0].value))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if "." in node.value and node.value in mods and node.value != module:
                    edges.append(Edge(module, node.value, rel, node.lineno, "by-name"))
            fn = in_fn or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for field, value in ast.iter_fields(node):
                if isinstance(value, list):
                    for child in value:
                        if isinstance(child, ast.AST):
                            visit(child, fn, value)
                elif isinstance(value, ast.AST):
                    visit(value, fn, None)

        visit(tree, False, None)
    return edges, (n_all, n_fn), uncommented


def unit_graph(edges, src: pathlib.Path = SRC) -> dict[tuple[str, str], list[Edge]]:
    """unit -> unit edges with their evidence. The emulator's opt-in edge is a plugin load on request,
    not a dependency, and is left out (the emulator imports dispatch to register its backends)."""
    mods = modules(src)
    g: dict[tuple[str, str], list[Edge]] = {}
    for e in dict.fromkeys(edges):
        a, b = unit_of(e.src, mods, src), unit_of(e.dst, mods, src)
        if a != b and not (e.src in EMULATOR_OPT_IN and b == EMULATOR):
            g.setdefault((a, b), []).append(e)
    return g


def strongly_connected(g) -> list[list[str]]:
    """Tarjan: the strongly connected sets of more than one unit (each is one or more cycles)."""
    succ: dict[str, list[str]] = {}
    for a, b in g:
        succ.setdefault(a, []).append(b)
        succ.setdefault(b, [])
    index, low, stack, on, out = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(succ):
        if v not in index:
            strong(v)
    return sorted(out)


def upward_violations(edges, src: pathlib.Path = SRC) -> list[str]:
    mods = modules(src)
    ceiling = rank_of(EMULATOR_CEILING)
    bad = []
    for e in edges:
        a, b = unit_of(e.src, mods, src), unit_of(e.dst, mods, src)
        if a == b or (e.src, e.dst) in ALLOWED_UPWARD:
            continue
        if b == EMULATOR:
            if a not in (EMULATOR, EMULATOR_CEILING) and e.src not in EMULATOR_OPT_IN:
                bad.append(f"{e}  [emulator imported from {a}]")
            continue
        ra, rb = rank_of(a), rank_of(b)
        if a == EMULATOR:
            ra = ceiling - 0.5
        if ra is None or rb is None:
            bad.append(f"{e}  [unit {a if ra is None else b} has no layer in LAYERS]")
        elif rb > ra:
            bad.append(f"{e}  [{a} (layer {ra}) imports {b} (layer {rb})]")
    return bad


def _rank(unit: str) -> float:
    return rank_of(EMULATOR_CEILING) - 0.5 if unit == EMULATOR else rank_of(unit)


def _shortest_path(g, a: str, b: str) -> list[str] | None:
    prev, todo = {a: None}, [a]
    while todo:
        nxt = []
        for u in todo:
            for (x, y) in g:
                if x == u and y not in prev:
                    prev[y] = u
                    nxt.append(y)
        todo = nxt
    if b not in prev:
        return None
    path = [b]
    while path[-1] != a:
        path.append(prev[path[-1]])
    return path[::-1]


def cycle_report(edges, src: pathlib.Path = SRC) -> list[str]:
    """One block per strongly connected set of units: the edges inside it that do not go down (each closes
    a cycle; every cycle has one), each with every import behind it and one shortest cycle through it."""
    g = unit_graph(edges, src)
    out = []
    for comp in strongly_connected(g):
        lines = [f"cycle between {', '.join(comp)}; the edges that close it:"]
        for (a, b), es in sorted(g.items()):
            if a in comp and b in comp and not ((ra := _rank(a)) is not None and (rb := _rank(b)) is not None and rb < ra):
                back = _shortest_path({k: v for k, v in g.items() if k[0] in comp and k[1] in comp}, b, a)
                lines.append(f"  {a} -> {b}   (cycle: {' -> '.join([a] + back)})")
                lines += [f"      {e}" for e in es]
        out.append("\n".join(lines))
    return out


@pytest.fixture(scope="module")
def scanned():
    return scan()


def test_units_have_layers(scanned):
    mods = modules()
    units = {unit_of(m, mods) for m in mods}
    assert {u for u in units if u != EMULATOR and rank_of(u) is None} == set()
    assert "templates/sm100_w4a4" in units and "integrations/inductor" in units  # the scan sees the tree


def test_imports_only_go_down(scanned):
    edges, _, _ = scanned
    bad = upward_violations(edges)
    assert not bad, f"{len(bad)} imports go up the layers (tests/cpu/test_import_layers.py LAYERS):\n" + "\n".join(bad)


def test_no_cycles_between_packages(scanned):
    edges, _, _ = scanned
    cycles = cycle_report(edges)
    assert not cycles, f"{len(cycles)} import cycles between packages:\n" + "\n".join(cycles)


def test_function_level_imports_give_a_reason(scanned):
    _, _, uncommented = scanned
    assert not uncommented, (
        f"{len(uncommented)} function-level nvgemm imports without a '# lazy: <reason>' comment (hoist them to "
        "module level, or say why they stay):\n" + "\n".join(uncommented))


def test_exceptions_are_live(scanned):
    """Every listed exception still matches an import (a stale entry would hide the next one)."""
    edges, _, _ = scanned
    pairs = {(e.src, e.dst) for e in edges}
    assert set(ALLOWED_UPWARD) <= pairs
    assert all(any(e.src == m and unit_of(e.dst, modules()) == EMULATOR for e in edges) for m in EMULATOR_OPT_IN)


def test_import_nvgemm_stays_light():
    """``import nvgemm`` imports no kernel compiler, Inductor, model library nor the emulator."""
    heavy = ("cutlass", "triton", "torch._inductor", "transformers", "modelopt", "vllm", "nvMatmulHeuristics",
             "nvgemm.emulator")
    code = ("import sys, nvgemm; print(' '.join(sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') "
            f"for h in {heavy!r}))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(SRC)}).stdout.split()
    assert out == [], out


if __name__ == "__main__":  # report: python tests/cpu/test_import_layers.py [src dir]
    src = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else SRC
    edges, (n_all, n_fn), uncommented = scan(src)
    print(f"internal import statements: {n_all}, inside functions: {n_fn}; without a reason: {len(uncommented)}")
    cycles = cycle_report(edges, src)
    print(f"strongly connected unit sets: {len(cycles)}")
    print("\n".join(cycles))
    if src == SRC:
        up = upward_violations(edges, src)
        print(f"upward imports: {len(up)}")
        print("\n".join(up))
