"""The per-family facts hook and the two fact records the model consumes.

:class:`KernelFacts`
    static facts of one compiled kernel (config + arch), read from its SASS by
    ``nvgemm.cli.sass_tool`` and stored in the committed table (``sass_facts.json``):
    registers, shared/local memory, spills, the main loop's size, issue cycles and serial DRAM
    round trips per iteration, per-pass overhead, and family extras (stages, TMEM columns ...).
:class:`Geometry`
    what one call of that kernel does for a shape (M, N, K): CTAs, threads, main-loop
    iterations of the busiest CTA, bytes streamed per iteration, DRAM bytes, extra launches,
    split-K reduction. Computed by the family, no compile.
:class:`FamilyFacts`
    the hook: one subclass per kernel family, named in that family's registration
    (``perf_facts=`` of :func:`nvgemm.core.family.register_family`). It knows
    which configs it owns, the SASS pattern of its streamed loads, how many weight elements a
    thread consumes per main-loop iteration (to normalise instruction counts), the geometry, and
    (optionally) an arithmetic estimate of the static facts for configs missing from the table.

Adding a family (what a kernel helper does)
-------------------------------------------
::

    # templates/<family>/perf.py
    from nvgemm.heuristics.perfmodel.facts import FamilyFacts, Geometry

    class MyFamily(FamilyFacts):
        name = "sm90.myfam"               # table key prefix, shown in reports
        arch = "sm_90a"
        engine = "sass_chain"             # or "pipeline" (TMA / cp.async ring, see model.py)
        stream_load = r"^LDG\\..*\\bNA\\b"  # SASS opcode regex of the streamed weight/scale loads

        def matches(self, config): ...               # True for the configs this family owns
        def template_id(self, config): ...           # registry template id (used by the SASS tool)
        def elems_per_thread_iter(self, config): ... # weight elements one thread consumes per
                                                     # main-loop iteration (normalisation)
        def loop_key(self, config): ...              # configs with equal keys compile to the same
                                                     # main loop (table fallback); default: name
        def geometry(self, config, m, n, k, hw): ... # -> Geometry
        def shape_problem(self, config, m, n, k): ...# why the config cannot run (M, N, K), or None

optionally ``parse_name(name)`` (config name -> config, for the table and the CLI; needed when
the family has its own config class), ``estimate_static(config)`` (facts without SASS), ``extra_facts(config, compiled,
funcs)`` (family extras the SASS tool stores, e.g. stages) with ``dynamic_smem = True`` when the
kernel's shared memory is dynamic, ``min_round_trips(config)`` (a lower bound on serial DRAM round
trips per iteration the SASS replay cannot see, e.g. a cp.async ring), and ``search_space(m)``
(configs ``nvgemm.heuristics.perfmodel.best`` searches); name the class in the family's registration
(``perf_facts=("nvgemm.templates.<family>.perf:MyFamily",)``), list the configs to tabulate in
:func:`FamilyFacts.table_configs` and regenerate the table (``nvgemm model --regen-table``).
The built-in facts: ``templates/sm90_w4a16/perf.py`` (mma, wgmma) and ``templates/sm100_w4a4/perf.py``
(the tcgen05 block-scaled GEMM). This module imports no kernel family: the registry hands them in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nvgemm.core.family import families, generation, resolve
from nvgemm.heuristics.perfmodel.hardware import Hardware


@dataclass(frozen=True)
class KernelFacts:
    """Static facts of one compiled kernel (see the module docstring)."""

    config: str
    arch: str
    family: str
    regs: int
    smem_bytes: int  # per CTA: static + dynamic
    local_bytes: int = 0
    ldl: int = 0
    stl: int = 0
    ldl_loop: int = 0
    stl_loop: int = 0
    loop_instrs: int = 0  # main-loop body, warp-instructions per iteration
    loop_issue_cycles: int = 0  # scheduler cycles to issue that body (datapath rates included)
    pass_instrs: int = 0  # per pass: enclosing loop body minus the main loop
    fixed_instrs: int = 0  # the rest of the function (prologue / epilogue), once per CTA
    chain_base: float = 0.0  # single-warp cycles per iteration = chain_base + round_trips * L
    round_trips: float = 1.0
    stream_loads: int = 0  # stream loads per iteration (per thread)
    elems_per_thread_iter: float = 0.0
    histogram: dict = field(default_factory=dict, compare=False, hash=False)
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    source: str = "table"  # "table" | "table (same main loop as <name>)" | "estimate"

    @property
    def instr_per_elem(self) -> float:
        """Main-loop SASS instructions per weight element (per thread; the review's unit)."""
        return self.loop_instrs / self.elems_per_thread_iter if self.elems_per_thread_iter else float("nan")

    def chain_cycles(self, latency: float) -> float:
        return self.chain_base + self.round_trips * latency

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "source"}
        return d

    @staticmethod
    def from_json(d: dict, source: str = "table") -> "KernelFacts":
        fields = KernelFacts.__dataclass_fields__
        return KernelFacts(**{k: v for k, v in d.items() if k in fields and k != "source"}, source=source)


@dataclass(frozen=True)
class SplitKReduce:
    """How a split-K call combines its S partials.

    ``kind``: ``"kernel"`` (a separate reduce kernel: the sm90 families), ``"rolled"`` (the last
    CTA of a tile sums with a rolled per-element loop: one dependent L2 round trip per partial
    and element), ``"batched"`` (the last CTA issues all partial loads first, then sums: one
    round trip per epilogue sub-tile)."""

    kind: str
    splits: int
    workspace_bytes: float  # fp32 partials (written once, read back once)
    dependent_l2_trips: float = 0.0  # serial L2 round trips on the critical path (in-kernel kinds)


@dataclass(eq=False)
class Geometry:
    """One call of a kernel on a shape (see the module docstring). Not frozen: the policy builds
    one per priced config and shape, and a frozen dataclass of this size costs several us to
    construct; treat it as read-only."""

    ctas: int  # CTAs of the main kernel
    threads: int  # per CTA
    iters_per_cta: int  # main-loop iterations of the busiest CTA (all passes / work tiles)
    passes_per_cta: int  # executions of the per-pass overhead
    stream_bytes_per_iter: float  # weight + scale bytes one CTA requests per iteration
    other_bytes_per_iter: float  # activation bytes per iteration (L1/L2 hits)
    dram_bytes: float  # unique DRAM traffic of the call (weights re-read when they do not fit L2)
    weight_bytes: float  # weights + scales (the streamed operand) once
    depth: float = 1.0  # iterations of loads in flight per CTA (pipeline stages; 1 = none ahead)
    units_per_cta: int = 1  # work tiles of the busiest CTA (persistent kernels)
    total_units: int = 0  # work tiles of the whole grid (persistent kernels; 0: ctas x units_per_cta)
    extra_launches: int = 0  # further kernels of the same call (e.g. a split-K reduce kernel)
    aux_kernels: int = 0  # host-path helper kernels per call (fills, quantize, ...)
    tensor_flops: float = 0.0  # tensor-core FLOPs incl. tile padding
    tensor_tflops: float = 0.0  # the rate they run at (0: not tensor-core bound)
    epilogue_cycles: float = 0.0  # exposed epilogue per CTA (after its last iteration)
    splitk: SplitKReduce | None = None
    persistent: bool = False
    pdl: bool = False
    resident_ctas: int | None = None  # forced residency (persistent: 1 CTA per SM)
    l2_reread_fraction: float = 0.0  # share of main-loop iterations whose stream loads hit L2 (re-reads)
    # a split tail (stream-K-like): the last ``tail_ctas`` of ``ctas`` run ``tail_iters`` iterations
    # each after the others' full waves, and only they pay the split-K reduction
    tail_ctas: int = 0
    tail_iters: int = 0
    note: str = ""


class FamilyFacts:
    """Base class of a family's facts (see the module docstring)."""

    name: str = ""
    arch: str = ""
    engine: str = "sass_chain"  # "sass_chain" | "pipeline"
    stream_load: str = r"^LDG\..*\bNA\b"
    dynamic_smem: bool = False  # the SASS tool reads the launch's dynamic shared memory from the IR

    def matches(self, config) -> bool:
        raise NotImplementedError

    def template_id(self, config) -> str:
        raise NotImplementedError

    def elems_per_thread_iter(self, config) -> float:
        raise NotImplementedError

    def loop_key(self, config):
        return config.name()

    def geometry(self, config, m: int, n: int, k: int, hw: Hardware) -> Geometry:
        raise NotImplementedError

    def shape_problem(self, config, m: int, n: int, k: int) -> str | None:
        return None

    def min_round_trips(self, config) -> float:
        """Lower bound on serial DRAM round trips per main-loop iteration that the SASS replay
        cannot see (0: none). A cp.async ring of depth D whose prologue issues the first D - 1
        stages before the loop needs at least 1 / (D - 1): only D - 1 stages are ever in flight."""
        return 0.0

    def parse_name(self, name: str):
        """The config a table key / CLI name stands for if this family owns it, else None."""
        return None

    def estimate_static(self, config) -> KernelFacts | None:
        """Static facts without SASS (configs missing from the table); None: none available."""
        return None

    def table_configs(self) -> list:
        """Configs the SASS table holds for this family (see ``nvgemm model --regen-table``)."""
        return []

    def extra_facts(self, config, compiled, funcs) -> dict:
        """Family extras the SASS tool stores with a table entry (``compiled``: the compiled
        object, ``funcs``: parsed SASS functions)."""
        return {}


_FACTS: list[FamilyFacts] = []
_FACTS_GENERATION = -1


def registered_families() -> list[FamilyFacts]:
    """One instance of every ``FamilyFacts`` the registered kernel families name (``perf_facts``),
    in family order; rebuilt when a kernel family is (un)registered."""
    global _FACTS_GENERATION
    gen = generation()
    if gen != _FACTS_GENERATION:
        facts = [resolve(ref)() for fam in families() for ref in fam.perf_facts]
        for f in facts:
            if not f.name:
                raise ValueError(f"{type(f).__name__}: a FamilyFacts needs a name")
        gen = generation()  # families() may have loaded the built-in families
        _FACTS[:] = facts
        _FACTS_GENERATION = gen
    return list(_FACTS)


def family_for(config) -> FamilyFacts | None:
    """The registered family that owns ``config`` (None: no family)."""
    for f in reversed(registered_families()):  # later registrations (extensions) win
        try:
            if f.matches(config):
                return f
        except (AttributeError, TypeError):
            continue
    return None


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = [
    "FamilyFacts",
    "Geometry",
    "KernelFacts",
    "SplitKReduce",
    "ceil_div",
    "family_for",
    "registered_families",
]
