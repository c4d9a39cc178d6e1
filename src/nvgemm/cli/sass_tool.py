"""The compiling half of the performance model: config -> compiled kernel -> SASS -> facts.

For one config this compiles the family's template for its arch (no GPU; ``cute.compile`` with
``--gpu-arch``), extracts the embedded cubin, disassembles it with ``cuobjdump --dump-sass`` and
``--dump-resource-usage`` (the CUDA toolkit's, else the copy Triton ships under
``triton/backends/nvidia/bin``), and reduces it to :class:`nvgemm.heuristics.perfmodel.facts.KernelFacts`
with :mod:`nvgemm.heuristics.perfmodel.sass` (main loop, issue cycles, serial DRAM round trips per iteration
replayed from the control bits, registers, spills, shared memory) plus the family's extras.

The table's entries are compiled with one reference epilogue -- :func:`reference_epilogue` (scalar
alpha, no bias/activation/residual, bf16 out; bf16 activations for W4A16) -- and describe the main
loop; configs that differ only in split-K fall back to it (the table's ``loop_key`` fallback).
**Timing facts and spills are per-variant facts** where recorded: :func:`spill_facts` also reads
each variant's own main-loop facts (``"loop"``), which the model uses for that (config,
activation) variant (``perfmodel.table.variant_facts``; split-K and the epilogue move ptxas'
schedule: ``bench/results/model_calibration.md`` section 4). **Spills**: the
split-K epilogue and the epilogue's registers (vector alpha + bias + residual) change ptxas'
allocation, and two such variants spill (``LDL``/``STL`` in the SASS) although their main loop's
twin does not. :func:`spill_facts` compiles one (config, epilogue) variant and counts LDL/STL in
its SASS (never PTX ``.local``, which cannot see ptxas' spills); :func:`sweep_spills` records
them for every (config, activation) pair the sm90 policy emits for the preset models' layer
shapes, each with the two epilogues that bracket the runtime's (:func:`spill_epilogues`), in the
table's ``spills`` section, which the policy reads to drop spilling variants
(``bench/compile_sweep_sm90.py``).

:func:`regenerate_table` recompiles every config the families list
(:meth:`~nvgemm.heuristics.perfmodel.facts.FamilyFacts.table_configs`) plus every config the candidate
policy emits for the Llama-3.1-8B / 3.3-70B decode shapes, and writes
``src/nvgemm/heuristics/perfmodel/sass_facts.json`` (``nvgemm model --regen-table``; ~3 s per kernel).

Imports: at module import only the analytic model (this package) and the standard library; the compile
path (templates, :mod:`nvgemm.aot.compile_spec`, the candidate policy, triton) is imported lazily inside
the functions that compile, so ``nvgemm.heuristics.perfmodel`` never imports the AOT cache, the backends or the
heuristics above it when loaded.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from nvgemm.heuristics.perfmodel import sass as S
from nvgemm.heuristics.perfmodel.facts import FamilyFacts, KernelFacts, family_for, registered_families
from nvgemm.heuristics.perfmodel.hardware import DEFAULT_GPU_OF_ARCH, get_hardware
from nvgemm.heuristics.perfmodel.table import TABLE_PATH, clear_cache
from nvgemm.aot.compile_spec import make_spec
from nvgemm.core.problem import GemmProblem, Target
from nvgemm.core.epilogue import EpilogueSpec
from nvgemm.heuristics import candidates, policy
from nvgemm.heuristics.presets import PRESETS

#: (N, K) of the Llama-3.1-8B and Llama-3.3-70B decode GEMMs the model reports on.
LLAMA_SHAPES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
                (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672))
SM90_M = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SM100_M = (1, 2, 4, 8, 16, 32)
REGEN_COMMAND = "nvgemm model --regen-table"


def reference_epilogue():
    return EpilogueSpec(alpha="scalar")


def find_cuobjdump() -> str | None:
    exe = shutil.which("cuobjdump")
    if exe:
        return exe
    try:
        import triton

        p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        return str(p) if p.exists() else None
    except ImportError:
        return None


def _tool_version(exe: str) -> str:
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\S+),", out) or re.search(r"cuda_(\S+)\.r", out)
    return m.group(1) if m else "unknown"


def spill_epilogues(activation: str = "none") -> dict:
    """The epilogue variants the spill record holds per (config, activation): ``ref`` (scalar
    alpha, nothing else) and ``full`` (per-column alpha + bias + residual: the most registers an
    epilogue of that activation takes). Intermediate epilogues (scalar alpha + bias ...) are not
    compiled: assumed spill-free when both ends are (not proven; ptxas is not monotone)."""
    return {"ref": EpilogueSpec(alpha="scalar", activation=activation),
            "full": EpilogueSpec(alpha="vector", bias=True, residual=True, activation=activation)}


def compile_config(config, arch: str | None = None, epilogue=None):
    """Compile ``config`` with ``epilogue`` (default: the reference epilogue) for its family's
    arch (no GPU)."""
    os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.mkdtemp(prefix="nvgemm_cute_dump_"))
    # lazy: looked up at call time (tests patch abi.get_template)
    from nvgemm.aot.abi import check_spec, get_template

    fam = _family(config)
    arch = arch or fam.arch
    a_format = "bf16" if fam.arch.startswith("sm_90") else "nvfp4"
    spec = make_spec(fam.template_id(config), config, arch, epilogue=epilogue or reference_epilogue(), a_format=a_format)
    st = check_spec(spec)
    if not st:
        raise ValueError(f"{config.name()}: cannot be implemented: {st.reason}")
    return get_template(spec.template_id).compile(spec)


def _family(config) -> FamilyFacts:
    fam = family_for(config)
    if fam is None:
        raise ValueError(f"no performance-model family owns {type(config).__name__} ({config!r})")
    return fam


def dump_sass(compiled) -> tuple[str, str]:
    """(``cuobjdump --dump-sass`` text, ``--dump-resource-usage`` text) of a compiled kernel."""
    # lazy: cutlass import cost
    from nvgemm.templates.sm90_w4a16.common import embedded_cubin  # generic: any compiled CuTeDSL module

    exe = find_cuobjdump()
    if exe is None:
        raise RuntimeError("no cuobjdump (CUDA toolkit, or triton's bundled copy) to disassemble the kernel")
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "k.fatbin"
        f.write_bytes(embedded_cubin(compiled))
        sass = subprocess.run([exe, "--dump-sass", str(f)], check=True, capture_output=True, text=True).stdout
        res = subprocess.run([exe, "--dump-resource-usage", str(f)], check=True, capture_output=True, text=True).stdout
    return sass, res


def dynamic_smem_bytes(compiled) -> int:
    """Dynamic shared memory the host side launches the kernel with: the largest i64 constant of
    the host module in (16 KiB, 227 KiB] (the launch-config value; a heuristic read of the IR --
    the compile test checks it against the family's stage arithmetic)."""
    txt = str(compiled.ir_module)
    vals = [int(v) for v in re.findall(r"llvm\.mlir\.constant\((\d+) : i64\)", txt)]
    vals = [v for v in vals if 16384 < v <= 232448]
    return max(vals) if vals else 0


def facts_from_sass(config, sass_text: str, res_text: str, arch: str | None = None, compiled=None) -> KernelFacts:
    """Reduce a SASS listing of ``config``'s kernel to :class:`KernelFacts` (no compile)."""
    fam = _family(config)
    arch = arch or fam.arch
    hw = get_hardware(DEFAULT_GPU_OF_ARCH.get(arch, "H200"))
    funcs = S.parse_sass(sass_text, res_text)
    fn = S.find_function(funcs, fam.stream_load)
    loop = S.main_loop(fn, fam.stream_load)
    ldl, stl = S.spills(fn.instrs)
    extra = {}
    if fam.dynamic_smem and compiled is not None:
        extra["dynamic_smem"] = dynamic_smem_bytes(compiled)
    extra.update(fam.extra_facts(config, compiled, funcs))
    if loop is None:  # no loop (fully unrolled): treat the whole function as one iteration
        body_ = fn.instrs
        outer = None
    else:
        body_ = S.body(fn, loop)
        outer = S.enclosing_loop(fn, loop)
    ldl_l, stl_l = S.spills(body_)
    n_loop = len(S.counted(body_))
    n_outer = len(S.counted(S.body(fn, outer))) if outer is not None else n_loop
    n_all = len(S.counted(fn.instrs))
    base, rt = S.chain_coefficients(body_, fam.stream_load, hw.dram_latency[0], hw.dram_latency[1],
                                    hw.l2_latency[0])
    rt = max(rt, fam.min_round_trips(config))
    smem = (fn.shared or 0) + int(extra.get("dynamic_smem", 0))
    if loop is not None:
        extra["loop_offsets"] = [hex(fn.instrs[loop.start].offset), hex(fn.instrs[loop.end].offset)]
    extra["kernel"] = fn.name[:120]
    extra["functions"] = len(funcs)
    return KernelFacts(
        config=config.name(), arch=arch, family=fam.name, regs=fn.regs or 0, smem_bytes=smem,
        local_bytes=fn.local or 0, ldl=ldl, stl=stl, ldl_loop=ldl_l, stl_loop=stl_l,
        loop_instrs=n_loop, loop_issue_cycles=S.issue_cycles(body_), pass_instrs=n_outer - n_loop,
        fixed_instrs=n_all - n_outer, chain_base=round(base, 1), round_trips=round(rt, 3),
        stream_loads=S.count_matching(body_, fam.stream_load),
        elems_per_thread_iter=float(fam.elems_per_thread_iter(config)),
        histogram=S.opcode_histogram(body_), extra=extra, source="sass",
    )


def derive_facts(config, arch: str | None = None) -> tuple[KernelFacts, str]:
    """Compile ``config``, read its SASS, return (facts, SASS text)."""
    compiled = compile_config(config, arch)
    sass, res = dump_sass(compiled)
    return facts_from_sass(config, sass, res, arch, compiled), sass


#: the timing facts a variant record holds (``spill_facts(...)["loop"]``), read from the variant's
#: own SASS as :func:`facts_from_sass` reads a table entry's
VARIANT_TIMING_FIELDS = ("loop_instrs", "loop_issue_cycles", "pass_instrs", "fixed_instrs", "chain_base",
                         "round_trips", "stream_loads", "smem_bytes")


def spill_facts(config, epilogue, arch: str | None = None) -> dict:
    """Compile one (config, epilogue) variant and read its facts from its own SASS: ``{"ldl",
    "stl", "ldl_loop", "stl_loop", "regs", "mma", "loop"}`` (spills in the whole kernel and inside
    the streaming main loop; ``mma``: tensor-core instructions, HMMA / HGMMA; ``loop``: the
    variant's timing facts, :data:`VARIANT_TIMING_FIELDS`, which the model uses for this variant
    instead of its main loop's shared entry: split-K and the epilogue move ptxas' schedule)."""
    fam = _family(config)
    compiled = compile_config(config, arch, epilogue)
    sass, res = dump_sass(compiled)
    funcs = S.parse_sass(sass, res)
    fn = S.find_function(funcs, fam.stream_load)
    loop = S.main_loop(fn, fam.stream_load)
    ldl, stl = S.spills(fn.instrs)
    ldl_l, stl_l = S.spills(S.body(fn, loop)) if loop is not None else (ldl, stl)
    mma = S.count_matching(fn.instrs, r"^(HMMA|HGMMA|UTCHMMA|UTCQMMA|UTCOMMA)")
    timing = facts_from_sass(config, sass, res, arch, compiled)
    return {"ldl": ldl, "stl": stl, "ldl_loop": ldl_l, "stl_loop": stl_l, "regs": fn.regs or 0, "mma": mma,
            "loop": {k: getattr(timing, k) for k in VARIANT_TIMING_FIELDS}}


def preset_shapes() -> list[tuple[int, int]]:
    """(N, K) of every preset model's layer GEMMs (``nvgemm.heuristics.presets``)."""
    return sorted({(lg.n, lg.k) for p in PRESETS.values() for lg in p.layers})


#: activations the spill sweep covers (the presets' layers: plain projections and fused gate/up)
SWEEP_ACTIVATIONS = ("none", "silu_mul")


def policy_pairs(arch: str = "sm_90a", shapes=None, ms=SM90_M, activations=SWEEP_ACTIVATIONS, top: int = 8) -> dict:
    """``{(config, activation): [problem labels]}``: every pair the candidate policy emits (all its
    candidates up to rank ``top``, nvMatmulHeuristics off) for ``shapes`` (default: the presets') x
    M x activation; a label is ``NxK.mM#rank``."""
    target = Target.from_gpu(DEFAULT_GPU_OF_ARCH.get(arch, "B200"))
    # W4A16 on Hopper and on the mma kernel's other archs (sm_8x, sm_12x); W4A4 on datacenter Blackwell
    a_format = "nvfp4" if arch.startswith(("sm_100", "sm_103", "sm_110")) else "bf16"
    out: dict = {}
    for n, k in shapes or preset_shapes():
        for m in ms:
            for act in activations:
                prob = GemmProblem(n=n, k=k, m=m, a_format=a_format, epilogue=act, target=target)
                for i, c in enumerate(candidates(prob, use_nvmmh=False)[:top]):
                    out.setdefault((c.config, act), []).append(f"{n}x{k}.m{m}#{i + 1}")
    return out


def _best_rank(labels) -> int:
    return min(int(lb.rsplit("#", 1)[1]) for lb in labels)


def _recorded(per_act: dict, act: str, timing: bool) -> bool:
    rec = per_act.get(act)
    return rec is not None and (not timing or all("loop" in f or "error" in f for f in rec.values()))


def sweep_spills(arch: str = "sm_90a", shapes=None, ms=SM90_M, path: Path | None = None, log=print,
                 max_rounds: int = 6, top: int = 8, first=(), timing: bool = False) -> tuple[dict, list]:
    """Record the spills of every (config, activation) pair the policy emits (:func:`policy_pairs`)
    with both :func:`spill_epilogues`, in the table's ``spills`` section, until the policy -- which
    drops recorded spillers -- emits no unrecorded pair (a fixed point; ``max_rounds`` bounds it).
    ``top``: only the policy's candidates up to that rank; ``first``: (config, activation) pairs
    to record before the others; ``timing``: also re-record pairs whose records predate the
    variants' timing facts (``"loop"``). Returns (the final pairs with their problems, rows ``(config,
    activation, variant, facts, seconds)`` of the compiles done)."""
    import time

    rows = []

    for rnd in range(max_rounds):
        policy._candidates_memo.cache_clear()  # its answers predate the records written so far
        pairs = policy_pairs(arch, shapes, ms, top=top)
        table = _load(path)
        rec = table.get("spills", {}).get(arch, {})
        todo = [(c, act) for c, act in list(first) + list(pairs) if not _recorded(rec.get(c.name(), {}), act, timing)]
        todo = list(dict.fromkeys(todo))
        first = ()
        log(f"round {rnd + 1}: {len(pairs)} (config, activation) pairs, {len(todo)} not recorded")
        if not todo:
            return pairs, rows
        new: dict = {}
        # the policy's first choices first (a long sweep records what runs before what is tuned)
        for i, (c, act) in enumerate(sorted(todo, key=lambda t: (_best_rank(pairs.get(t, ["#0"])), t[0].name(), t[1]))):
            per = {}
            for var, epi in spill_epilogues(act).items():
                t0 = time.time()
                try:
                    f = spill_facts(c, epi, arch)
                except Exception as e:  # noqa: BLE001 -- record and continue
                    f = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
                per[var] = f
                rows.append((c.name(), act, var, f, time.time() - t0))
            write_spills({c.name(): {act: per}}, arch, path)  # saved as it goes
            log(f"  [{i + 1}/{len(todo)}] {c.name()} {act}: "
                + ", ".join(f"{v} LDL {f.get('ldl')} STL {f.get('stl')}" for v, f in per.items()))
    policy._candidates_memo.cache_clear()
    return policy_pairs(arch, shapes, ms, top=top), rows


def _load(path: Path | None) -> dict:
    p = Path(path) if path is not None else TABLE_PATH
    return json.loads(p.read_text()) if p.exists() else {"header": {}, "entries": {}}


def write_spills(records: dict, arch: str = "sm_90a", path: Path | None = None) -> None:
    """Merge ``{config name: {activation: {variant: facts}}}`` into the table's ``spills``."""
    p = Path(path) if path is not None else TABLE_PATH
    table = _load(p)
    sp = table.setdefault("spills", {}).setdefault(arch, {})
    for name, per_act in records.items():
        sp.setdefault(name, {}).update(per_act)
    table["spills"][arch] = dict(sorted(sp.items()))
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(format_table(table))
    os.replace(tmp, p)  # atomic: a sweep stopped mid-write leaves the old table, not half a file
    clear_cache()


# ------------------------------------------------------------------------------------ table


def policy_configs(arch: str) -> list:
    """Every config the candidate policy emits for the Llama decode shapes on ``arch``."""
    if arch.startswith("sm_90"):
        target, a_format, ms = Target.from_gpu("H200"), "bf16", SM90_M
    else:
        target, a_format, ms = Target.from_gpu("B200"), "nvfp4", SM100_M
    out, seen = [], set()
    for n, k in LLAMA_SHAPES:
        for m in ms:
            prob = GemmProblem(n=n, k=k, m=m, a_format=a_format, target=target)
            for c in candidates(prob, use_nvmmh=False):
                if c.config not in seen:
                    seen.add(c.config)
                    out.append(c.config)
    return out


def table_configs(archs=("sm_90a", "sm_100a")) -> list:
    """Families' table configs plus the policy's configs, one per main loop (the table lookup
    serves configs with an equal :meth:`~nvgemm.heuristics.perfmodel.facts.FamilyFacts.loop_key` from the
    same entry), in a stable order."""
    out, seen = [], set()

    def add(c) -> None:
        fam = family_for(c)
        if fam is None:
            return
        key = fam.loop_key(c)
        if key not in seen:
            seen.add(key)
            out.append(c)

    for fam in registered_families():
        if fam.arch not in archs:
            continue
        for c in fam.table_configs():
            add(c)
    for arch in archs:
        for c in policy_configs(arch):
            add(c)
    return out


def table_header() -> dict:
    exe = find_cuobjdump()
    return {
        "what": "static SASS facts per kernel config (MODEL input; see nvgemm.heuristics.perfmodel)",
        "cutlass_dsl": importlib.metadata.version("nvidia-cutlass-dsl"),
        "cuobjdump": _tool_version(exe) if exe else "none",
        "epilogue": "alpha=scalar, no bias/activation/residual, bf16 out; W4A16 activations bf16",
        "generated": datetime.date.today().isoformat(),
        "command": REGEN_COMMAND,
    }


def regenerate_table(configs=None, path: Path | None = None, archs=("sm_90a", "sm_100a"), log=print) -> dict:
    """Compile ``configs`` (default :func:`table_configs` of ``archs``), derive their facts, and
    rewrite the table's entries of ``archs`` (other archs' entries are kept); with an explicit
    ``configs`` list only those entries are added or replaced."""
    full = configs is None
    configs = table_configs(archs) if full else list(configs)
    entries: dict[str, dict] = {}
    for i, c in enumerate(configs):
        fam = _family(c)
        try:
            facts, _ = derive_facts(c)
        except Exception as e:  # noqa: BLE001 -- one failing config must not lose the others
            log(f"[{i + 1}/{len(configs)}] {c.name()}: FAILED ({type(e).__name__}: {e})")
            continue
        entries.setdefault(fam.arch, {})[c.name()] = facts.to_json()
        log(f"[{i + 1}/{len(configs)}] {c.name()}: regs {facts.regs}, loop {facts.loop_instrs} instr, "
            f"{facts.round_trips:.2f} round trips/iter")
    p = Path(path) if path is not None else TABLE_PATH
    # a full regeneration replaces the archs' entries; an explicit config list updates just those
    old = json.loads(p.read_text())["entries"] if p.exists() else {}
    merged = {a: dict(e) for a, e in old.items() if not (full and a in archs)}
    for a, e in entries.items():
        merged.setdefault(a, {}).update(e)
    table = {"header": table_header(), "entries": {a: dict(sorted(e.items())) for a, e in sorted(merged.items())}}
    old_table = json.loads(p.read_text()) if p.exists() else {}
    if old_table.get("spills"):
        table["spills"] = old_table["spills"]  # per-variant records: bench/compile_sweep_sm90.py
    p.write_text(format_table(table))
    clear_cache()
    return table


def format_table(table: dict) -> str:
    """The table as JSON with one line per entry (short files, one-line diffs per kernel)."""
    out = ["{", f' "header": {json.dumps(table["header"])},']
    sections = [k for k in ("entries", "spills") if k in table]
    for si, sec in enumerate(sections):
        out.append(f' "{sec}": {{')
        archs = list(table[sec].items())
        for ai, (arch, entries) in enumerate(archs):
            out.append(f"  {json.dumps(arch)}: {{")
            items = list(entries.items())
            for i, (name, d) in enumerate(items):
                out.append(f"   {json.dumps(name)}: {json.dumps(d)}{',' if i < len(items) - 1 else ''}")
            out.append("  }" + ("," if ai < len(archs) - 1 else ""))
        out.append(" }" + ("," if si < len(sections) - 1 else ""))
    out.append("}")
    return "\n".join(out) + "\n"


__all__ = [
    "LLAMA_SHAPES",
    "REGEN_COMMAND",
    "compile_config",
    "derive_facts",
    "dump_sass",
    "dynamic_smem_bytes",
    "facts_from_sass",
    "find_cuobjdump",
    "format_table",
    "policy_configs",
    "policy_pairs",
    "preset_shapes",
    "regenerate_table",
    "spill_epilogues",
    "spill_facts",
    "sweep_spills",
    "write_spills",
    "table_configs",
]
