"""PTX identity of every kernel the candidate policies emit, across two source trees (no GPU).

Proves that a refactor which moves modules (e.g. the family-first package layout) changes no generated
code: ``dump`` enumerates the distinct :class:`CompileSpec`s the policies emit, compiles each with
``keep_ptx`` for its explicit arch and records the sha256 of the PTX text; ``compare`` matches two
dumps by a layout-independent kernel identity and counts identical / different / missing kernels.

    nice -n 10 python bench/ptx_identity.py plan   [--coverage default|all]
    nice -n 10 python bench/ptx_identity.py dump   --out FILE.json [--ptx-dir DIR] [--coverage default|all]
                                                   [--budget-s S] [--match OTHER.json [--resume]]
    python bench/ptx_identity.py compare A.json B.json [--names-normalised]

e.g. (old tree in a worktree of the pre-move commit, new tree = this checkout)::

    PYTHONPATH=/work/base/src nice -n 10 python bench/ptx_identity.py dump --budget-s 2100 \
        --out base.json --ptx-dir base_ptx
    PYTHONPATH=src nice -n 10 python bench/ptx_identity.py dump --budget-s 2100 --out new.json --ptx-dir new_ptx
    python bench/ptx_identity.py compare base.json new.json                      # raw PTX: exit 1 on any difference
    python bench/ptx_identity.py compare base.json new.json --names-normalised   # exit status from comparison 2

Run ``dump`` once per tree with that tree's ``src`` first on ``PYTHONPATH`` (the script imports
``nvgemm`` from wherever Python finds it and records ``nvgemm.__file__``); the old and the new module
paths are both tried (:func:`_mod`).

**What "the policies emit"** (module docstring of each policy; enumeration as the compile / emulator
sweeps do it, widened):

* dense W4A16 ``sm_90a`` (H200, bf16 activations) and dense W4A4 ``sm_100a`` (B200): every candidate
  (all 8 ranks, nvMatmulHeuristics on and off) of ``nvgemm.heuristics.candidates`` for every preset
  layer shape (the dense presets' layers plus the MoE presets' attention / shared-expert GEMMs) at
  every exact M = 1..256 and every M bucket up to 256, for each activation the problem can carry
  (none / silu / gelu_tanh / silu_mul): a set of (config, activation) pairs;
* grouped MoE ``sm_90a`` / ``sm_100a``: every (GEMM1, GEMM2) candidate of the two grouped policies for
  their MoE layers (``MOE_LAYERS``) at M = 1..256 (sm90: gated and non-gated);
* the sm100 fused-requant launch's config (``requant_config(m)``, M = 1..128; a picker, not a ranked
  policy).

Each (config, activation) becomes CompileSpecs with the epilogues the runtime builds for it (see
:func:`enumerate_specs`); ``plan`` prints how many distinct specs exist per group (8378 at the layout
move). ``dump`` compiles them in tiers (:data:`TIERS`): tier 1 -- every config the dense policies rank
first for a preset shape at some M = 1..256 and every grouped MoE config per GEMM role, each once -- always
runs; later tiers (epilogue variants, the dense policies' ranks 2..8, and with ``--coverage all`` every
(config, activation, epilogue)) run until ``--budget-s``. Keep-ptx compiles take 2-30 s each on a shared
2-core machine, so all 8378 do not fit one run. ``--match OTHER.json`` compiles exactly the kernels
another dump has (to finish a comparison whose two sides stopped at different points).
Every dump also records the whole enumerated set, so ``compare`` checks that both trees' policies emit the
same specs, compiled or not.

**Identity** (:func:`identity`): template id + config field values + epilogue fields + arch + hardware
numbers + operand formats / majors + codegen env -- never the Python module path of the config class
(which a layout move changes; it is recorded, not keyed).

**PTX names.** CuTeDSL names a kernel ``kernel_<prefix>_<function name>_<str(args)...>`` with
``str(self)`` of the kernel object (``<nvgemm.templates.sm90.mma.Sm90W4A16MmaKernel object at ...>``,
punctuation and the address stripped) and cuts the name at 180 characters: a kernel module that moves
changes every entry name (and, the cut being at a fixed length, how much of the argument signature
survives). The raw comparison (sha256 of the PTX text as CuTeDSL returns it) therefore sees a module
move; ``compare`` reports such kernels separately with their differing lines, and its second, labelled
comparison replaces every ``.entry`` / ``.func`` symbol by its position (``__SYM0__``, ...) before
hashing (:func:`normalise_names`).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import enum
import gzip
import hashlib
import importlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# CuTeDSL reads its dump dir once; keep_ptx compiles get a private subdir of it (compile_for_target)
os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.mkdtemp(prefix="nvgemm_ptxid_dump_"))

DENSE_ACTIVATIONS = ("none", "silu", "gelu_tanh", "silu_mul")
M_MAX = 256
SCHEMA = 1


# ------------------------------------------------------------------------------ imports (both layouts)


def _mod(*names: str):
    """The first of ``names`` that imports (new layout first). A module that exists but fails to import
    (a missing dependency of it) raises; only "this module path does not exist" falls through."""
    err = None
    for n in names:
        try:
            return importlib.import_module(n)
        except ModuleNotFoundError as e:
            if e.name is None or not (n == e.name or n.startswith(e.name + ".")):
                raise
            err = e
    raise err


class NV:
    """nvgemm's modules under either layout (filled by :func:`load`)."""


def load() -> type[NV]:
    NV.abi = _mod("nvgemm.aot.abi", "nvgemm.templates.registry")
    NV.compile_spec = _mod("nvgemm.aot.compile_spec")
    NV.heur = _mod("nvgemm.heuristics")
    NV.problem = _mod("nvgemm.core.problem", "nvgemm.heuristics.problem")
    NV.presets = _mod("nvgemm.heuristics.presets")
    NV.moe90 = _mod("nvgemm.templates.sm90_moe.policy", "nvgemm.heuristics.moe_sm90")
    NV.moe100 = _mod("nvgemm.templates.sm100_moe.policy", "nvgemm.heuristics.moe_sm100")
    NV.sm100_launch = _mod("nvgemm.templates.sm100_w4a4.launch", "nvgemm.templates.sm100.launch")
    NV.epi = _mod("nvgemm.core.epilogue", "nvgemm.epilogues.spec")
    return NV


# ------------------------------------------------------------------------------ identity


def _canon(v):
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _canon(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, enum.Enum):
        return f"{type(v).__name__}.{v.name}"
    if isinstance(v, (list, tuple)):
        return [_canon(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _canon(x) for k, x in sorted(v.items())}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)  # torch dtypes


def identity(spec) -> dict:
    """Layout-independent identity of a CompileSpec (no module paths, no class names)."""
    return {
        "template_id": spec.template_id,
        "config": _canon(spec.config),
        "epilogue": _canon(spec.epilogue),
        "arch": spec.arch,
        "hw": _canon(spec.hw),
        "a_format": spec.a_format, "b_format": spec.b_format, "a_major": spec.a_major, "b_major": spec.b_major,
        "codegen_env": _canon(spec.codegen_env),
    }


def identity_key(spec) -> str:
    return json.dumps(identity(spec), sort_keys=True, separators=(",", ":"))


# ------------------------------------------------------------------------------ enumeration


def dense_shapes() -> list[tuple[int, int]]:
    P = NV.presets
    s = {(lg.n, lg.k) for p in P.PRESETS.values() for lg in p.layers}
    s |= {(lg.n, lg.k) for p in P.MOE_PRESETS.values() for lg in p.dense_gemms()}
    return sorted(s)


def dense_pairs(gpu: str, a_format: str, log=None) -> dict:
    """``{(config, activation): first label}`` over shapes x M 1..256 and buckets x activations x
    nvMatmulHeuristics on/off x all ranks; ``first label`` names the first problem that emitted it."""
    GemmProblem, Target = NV.problem.GemmProblem, NV.problem.Target
    target = Target.from_gpu(gpu)
    out: dict = {}
    ranks1: set = set()
    ms = [("m", m) for m in range(1, M_MAX + 1)] + [("r", b) for b in NV.heur.m_buckets(M_MAX)]
    for n, k in dense_shapes():
        for act in DENSE_ACTIVATIONS:
            for nv in (False, True):
                for kind, m in ms:
                    kw = {"m": m} if kind == "m" else {"m_range": m}
                    prob = GemmProblem(n=n, k=k, a_format=a_format, epilogue=act, target=target, **kw)
                    for i, c in enumerate(NV.heur.candidates(prob, 8, use_nvmmh=nv)):
                        lbl = f"{n}x{k} M={m if kind == 'm' else '%d..%d' % m} {act} rank {i + 1}" \
                              f"{' nvmmh' if nv else ''}"
                        out.setdefault((c.config, act), lbl)
                        if i == 0 and kind == "m":
                            ranks1.add((c.config, act))
        if log:
            log(f"  {gpu}: shape {n}x{k} done, {len(out)} (config, activation) pairs so far")
    return out, ranks1


def moe_pairs(family: str) -> list[tuple]:
    """``[(role, config, gated, first label)]`` of a grouped policy (role 13 = GEMM1, 2 = GEMM2)."""
    mod, gpu = (NV.moe90, "H200") if family == "sm90_moe" else (NV.moe100, "B200")
    out: dict = {}
    for gated in ((True, False) if family == "sm90_moe" else (True,)):
        for shape in mod.MOE_LAYERS.values():
            for m in range(1, M_MAX + 1):
                kw = {"gated": gated} if family == "sm90_moe" else {}
                for i, c in enumerate(mod.moe_candidates(shape, m, gpu, **kw)):
                    lbl = f"{shape.name} M={m} rank {i + 1}{'' if gated else ' non-gated'}"
                    out.setdefault((13, c.config13, gated), lbl)
                    out.setdefault((2, c.config2, gated), lbl)
    return [(r, c, g, lbl) for (r, c, g), lbl in out.items()]


def enumerate_specs(log=None) -> list[dict]:
    """Every distinct spec of every group: ``[{"spec", "groups", "label"}]`` (groups: the coverage groups
    the spec belongs to; one spec may be in several)."""
    import torch

    E = NV.epi.EpilogueSpec
    make_spec = NV.compile_spec.make_spec
    tid_of = NV.abi.template_id_for_config
    specs: dict[str, dict] = {}

    def add(group, spec, label):
        k = identity_key(spec)
        d = specs.setdefault(k, {"spec": spec, "groups": [], "label": label})
        if group not in d["groups"]:
            d["groups"].append(group)

    # dense: ref (scalar alpha, bf16 out), full (per-column alpha + bias + residual), fp16 (ref with fp16
    # activations and output); the sm100 silu_mul pairs also with the fused requant epilogue where valid
    for fam, gpu, arch, a_format in (("sm90", "H200", "sm_90a", "bf16"), ("sm100", "B200", "sm_100a", "nvfp4")):
        pairs, ranks1 = dense_pairs(gpu, a_format, log)
        first_act: dict = {}
        for (c, act), lbl in pairs.items():
            first_act.setdefault(c, (act, lbl))
        for c, (act, lbl) in first_act.items():  # every config once
            add(f"dense_{fam}_config", make_spec(tid_of(c), c, arch, epilogue=E(alpha="scalar", activation=act),
                                                 a_format=a_format), lbl)
        first_pick: dict = {}
        for (c, act), lbl in pairs.items():
            if (c, act) in ranks1:
                first_pick.setdefault(c, (act, lbl))
        for c, (act, lbl) in first_pick.items():  # every config the policy ranks first somewhere, once
            add(f"dense_{fam}_pick", make_spec(tid_of(c), c, arch, epilogue=E(alpha="scalar", activation=act),
                                               a_format=a_format), lbl)
        for (c, act), lbl in pairs.items():
            ref = E(alpha="scalar", activation=act)
            full = E(alpha="vector", bias=True, residual=True, activation=act)
            fp16 = E(alpha="scalar", activation=act, out_dtype=torch.float16)
            grp = f"dense_{fam}_pair"
            add(f"{grp}_ref", make_spec(tid_of(c), c, arch, epilogue=ref, a_format=a_format), lbl)
            if (c, act) in ranks1:
                add(f"{grp}_rank1_ref", make_spec(tid_of(c), c, arch, epilogue=ref, a_format=a_format), lbl)
                add(f"{grp}_rank1_full", make_spec(tid_of(c), c, arch, epilogue=full, a_format=a_format), lbl)
                add(f"{grp}_rank1_fp16", make_spec(tid_of(c), c, arch, epilogue=fp16,
                                                   a_format="fp16" if fam == "sm90" else a_format), lbl)
            add(f"{grp}_full", make_spec(tid_of(c), c, arch, epilogue=full, a_format=a_format), lbl)
            add(f"{grp}_fp16", make_spec(tid_of(c), c, arch, epilogue=fp16,
                                         a_format="fp16" if fam == "sm90" else a_format), lbl)
    # sm100 fused requant (nvgemm::nvfp4_linear_requant): requant_config(m), silu_mul + out_quant
    for m in range(1, 129):
        c = NV.sm100_launch.requant_config(m)
        for alpha in ("scalar", "vector"):
            for dt in (torch.bfloat16, torch.float16):
                add("sm100_requant", make_spec(tid_of(c), c, "sm_100a",
                                               epilogue=E(alpha=alpha, activation="silu_mul", out_dtype=dt,
                                                          out_quant=True)), f"requant_config({m})")
    # grouped MoE, per role, with the epilogues moe_forward builds
    moe90 = moe_pairs("sm90_moe")
    moe100 = moe_pairs("sm100_moe")
    # every grouped config once per role, with the default variant's epilogue (bf16 activations, per-expert alpha)
    for role, c, gated, lbl in moe90:
        if role == 13:
            epi, af = E(alpha="scalar", activation="silu_mul" if gated else "silu"), "bf16"
        else:
            epi, af = E(alpha="scalar", activation="none", out_dtype=torch.float32), "bf16"
        add(f"moe_sm90_gemm{1 if role == 13 else 2}_config", make_spec("sm90_moe_mma", c, "sm_90a", epilogue=epi,
                                                                         a_format=af), lbl)
    for role, c, gated, lbl in moe100:
        epi = (E(alpha="scalar", activation="silu_mul", out_quant=True) if role == 13 else
               E(alpha="scalar", activation="none", out_dtype=torch.float32))
        add(f"moe_sm100_gemm{1 if role == 13 else 2}_config", make_spec("sm100_moe_nvfp4", c, "sm_100a", epilogue=epi),
            lbl)
    for role, c, gated, lbl in moe90:
        if role == 13:  # GEMM1: per-expert (scalar) or per-row (vector) alpha, bf16 / fp16 activations
            for act in (("silu_mul",) if gated else ("silu", "gelu_tanh")):
                for alpha, dt in (("scalar", torch.bfloat16), ("vector", torch.bfloat16), ("scalar", torch.float16),
                                  ("vector", torch.float16)):
                    add("moe_sm90_gemm1", make_spec("sm90_moe_mma", c, "sm_90a",
                                                    epilogue=E(alpha=alpha, activation=act, out_dtype=dt),
                                                    a_format="bf16" if dt == torch.bfloat16 else "fp16"), lbl)
        else:  # GEMM2: fp32 out, input = GEMM1's output dtype
            for af in ("bf16", "fp16"):
                add("moe_sm90_gemm2", make_spec("sm90_moe_mma", c, "sm_90a",
                                                epilogue=E(alpha="scalar", activation="none", out_dtype=torch.float32),
                                                a_format=af), lbl)
    for role, c, gated, lbl in moe100:
        if role == 13:
            for alpha in ("scalar", "vector"):
                for dt in (torch.bfloat16, torch.float16):
                    add("moe_sm100_gemm1", make_spec("sm100_moe_nvfp4", c, "sm_100a",
                                                     epilogue=E(alpha=alpha, activation="silu_mul", out_dtype=dt,
                                                                out_quant=True)), lbl)
        else:
            add("moe_sm100_gemm2", make_spec("sm100_moe_nvfp4", c, "sm_100a",
                                             epilogue=E(alpha="scalar", activation="none", out_dtype=torch.float32)),
                lbl)
    return list(specs.values())


#: compile order (``dump`` stops at ``--budget-s``, so what runs first is what a short run covers):
#: tier 1 = every config the dense policies rank first for a preset shape at some M = 1..256 (each once,
#: scalar alpha, its activation) and every grouped MoE config per GEMM role (each once, the default
#: variant's epilogue); tier 2 = the other epilogue variants of those (fused requant, per-column alpha +
#: bias + residual, fp16, MoE per-row alpha / fp16 / non-gated activations); tier 3 = every other config
#: the dense policies list (ranks 2..8) once; tier 4 = every (config, activation, epilogue) of all ranks
TIERS = (
    ("dense_sm100_pick", "moe_sm100_gemm1_config", "moe_sm100_gemm2_config", "moe_sm90_gemm1_config",
     "moe_sm90_gemm2_config", "dense_sm90_pick"),
    ("sm100_requant", "moe_sm100_gemm1", "moe_sm100_gemm2", "moe_sm90_gemm1", "moe_sm90_gemm2",
     "dense_sm100_pair_rank1_ref", "dense_sm100_pair_rank1_full", "dense_sm100_pair_rank1_fp16",
     "dense_sm90_pair_rank1_ref", "dense_sm90_pair_rank1_full", "dense_sm90_pair_rank1_fp16"),
    ("dense_sm100_config", "dense_sm90_config"),
)
DEFAULT_GROUPS = tuple(g for t in TIERS for g in t)
_TEMPLATE_ORDER = ("sm100_nvfp4_gemm", "sm100_moe_nvfp4", "sm90_moe_mma", "sm90_w4a16_mma", "sm90_w4a16_wgmma")


def tier_of(d: dict) -> int:
    return min([i + 1 for i, t in enumerate(TIERS) if set(t) & set(d["groups"])] or [len(TIERS) + 1])


def select(items: list[dict], coverage: str, groups: str | None) -> list[dict]:
    """The specs to compile, in compile order: by tier, then template, then identity."""
    want = set(groups.split(",")) if groups else (None if coverage == "all" else set(DEFAULT_GROUPS))
    out = [d for d in items if want is None or want & set(d["groups"])]
    tid = lambda d: d["spec"].template_id  # noqa: E731
    return sorted(out, key=lambda d: (tier_of(d), _TEMPLATE_ORDER.index(tid(d)) if tid(d) in _TEMPLATE_ORDER else 99,
                                      identity_key(d["spec"])))


def short(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------ PTX

_SYM_RE = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+|\.extern\s+)?(?:\.entry|\.func)\s+(?:\([^)]*\)\s*)?([\w$.]+)",
                     re.M)


def ptx_symbols(ptx: str) -> list[str]:
    """``.entry`` / ``.func`` names, in order of first definition or declaration."""
    return list(dict.fromkeys(_SYM_RE.findall(ptx)))


def normalise_names(ptx: str) -> str:
    """The PTX with every ``.entry`` / ``.func`` symbol replaced by ``__SYM<i>__`` (i = order of first
    appearance); longest names first, so a name that prefixes another (``NAME_param_0``) stays consistent."""
    syms = ptx_symbols(ptx)
    for i, s in sorted(enumerate(syms), key=lambda t: -len(t[1])):
        ptx = ptx.replace(s, f"__SYM{i}__")
    return ptx


def sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def compile_ptx(spec) -> str:
    t = NV.abi.get_template(spec.template_id)
    f = t.compile(spec, keep_ptx=True)
    ptx = getattr(f, "__ptx__", None)
    if not ptx:
        raise RuntimeError("keep_ptx compile returned no PTX")
    return ptx


# ------------------------------------------------------------------------------ commands


def _env_info() -> dict:
    import nvgemm

    from importlib.metadata import version

    src = Path(nvgemm.__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(src), "log", "-1", "--format=%H %s"], capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--", "."], capture_output=True,
                               text=True).stdout.strip()
    except OSError:
        head, dirty = "", ""
    return {"nvgemm_file": nvgemm.__file__, "git_head": head, "src_dirty": bool(dirty),
            "cutlass_dsl": version("nvidia-cutlass-dsl"), "torch": version("torch"),
            "python": platform.python_version(), "host": platform.node(), "cpus": os.cpu_count()}


def cmd_plan(a) -> int:
    load()
    t0 = time.time()
    items = enumerate_specs(log=(lambda s: print(s, file=sys.stderr, flush=True)) if a.verbose else None)
    counts: dict = {}
    for d in items:
        for g in d["groups"]:
            counts[g] = counts.get(g, 0) + 1
    sel = select(items, a.coverage, a.groups)
    print(f"{len(items)} distinct specs in all groups ({time.time() - t0:.0f} s to enumerate); "
          f"--coverage {a.coverage}{' --groups ' + a.groups if a.groups else ''}: {len(sel)}")
    for g in sorted(counts):
        print(f"  {g:32s} {counts[g]:5d}{'  (default)' if g in DEFAULT_GROUPS else ''}")
    by_t: dict = {}
    for d in sel:
        by_t[d["spec"].template_id] = by_t.get(d["spec"].template_id, 0) + 1
    print("  selected per template: " + ", ".join(f"{k} {v}" for k, v in sorted(by_t.items())))
    return 0


def cmd_dump(a) -> int:
    load()
    t_start = time.time()
    items = enumerate_specs()
    all_counts: dict = {}
    for d in items:
        for g in d["groups"]:
            all_counts[g] = all_counts.get(g, 0) + 1
    by_key = {identity_key(d["spec"]): d for d in items}
    not_enumerated = []
    if a.match:  # exactly the kernels another dump compiled, in its order
        other = json.loads(Path(a.match).read_text())
        sel = []
        for k in other["kernels"]:
            if k["key"] in by_key:
                sel.append(by_key[k["key"]])
            else:
                not_enumerated.append(k)
    else:
        sel = select(items, a.coverage, a.groups)
        if a.every > 1:
            sel = sel[:: a.every]
        if a.limit:
            sel = sel[: a.limit]
    t_enum = time.time() - t_start
    out = Path(a.out)
    ptx_dir = Path(a.ptx_dir) if a.ptx_dir else None
    if ptx_dir:
        ptx_dir.mkdir(parents=True, exist_ok=True)
    done: dict = {}
    if a.resume and out.exists():
        done = {k["key"]: k for k in json.loads(out.read_text())["kernels"] if k.get("status") == "ok"}
    tiers: dict = {}
    for d in items:
        tiers[tier_of(d)] = tiers.get(tier_of(d), 0) + 1
    sel_tiers: dict = {}
    for d in sel:
        sel_tiers[tier_of(d)] = sel_tiers.get(tier_of(d), 0) + 1
    doc = {"schema": SCHEMA, "env": _env_info(), "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
           "coverage": {"mode": "match " + a.match if a.match else a.coverage,
                        "groups": a.groups or (None if a.coverage == "all" else list(DEFAULT_GROUPS)),
                        "limit": a.limit, "every": a.every, "budget_s": a.budget_s,
                        "specs_total": len(items), "specs_per_group_total": all_counts,
                        "specs_per_tier_total": {str(k): v for k, v in sorted(tiers.items())},
                        "selected": len(sel), "selected_per_tier": {str(k): v for k, v in sorted(sel_tiers.items())},
                        "enumerate_s": round(t_enum, 1)},
           # the whole enumerated set (sha256[:16] of each identity): compare checks both trees emit the same
           "enumerated": sorted(short(k) for k in by_key),
           "ptx_dir": str(ptx_dir.resolve()) if ptx_dir else None, "kernels": [],
           "not_enumerated_here": [{"key": k["key"], "name": k["name"]} for k in not_enumerated]}
    print(f"ptx_identity dump: nvgemm from {doc['env']['nvgemm_file']} ({doc['env']['git_head'][:60]}); "
          f"{len(items)} specs enumerated in {t_enum:.0f} s, {len(sel)} selected"
          f"{f', {len(not_enumerated)} of --match not enumerated here' if not_enumerated else ''}",
          file=sys.stderr, flush=True)
    compile_s = 0.0
    last_write = time.time()
    stopped = None
    for i, d in enumerate(sel):
        if a.budget_s and tier_of(d) > 1 and time.time() - t_start > a.budget_s:  # tier 1 always runs
            stopped = i
            print(f"budget of {a.budget_s} s spent: stopping after {i} of {len(sel)} kernels", file=sys.stderr)
            break
        spec = d["spec"]
        key = identity_key(spec)
        rec = done.get(key)
        if rec is None:
            rec = {"key": key, "template_id": spec.template_id, "name": spec.name(), "arch": spec.arch,
                   "tier": tier_of(d), "config": _canon(spec.config),
                   "config_type": f"{type(spec.config).__module__}.{type(spec.config).__qualname__}",
                   "template_module": (NV.abi.builtin_template_modules() if hasattr(NV.abi, "builtin_template_modules")
                                       else NV.abi.BUILTIN_TEMPLATE_MODULES).get(spec.template_id),
                   "epilogue": _canon(spec.epilogue), "a_format": spec.a_format, "b_format": spec.b_format,
                   "groups": d["groups"], "label": d["label"]}
            st = NV.abi.check_spec(spec)
            t0 = time.time()
            c0 = time.process_time()
            try:
                if not st:
                    raise ValueError(f"check_spec: {st.reason}")
                ptx = compile_ptx(spec)
                h = sha(ptx)
                rec.update(status="ok", ptx_sha256=h, ptx_bytes=len(ptx.encode()), symbols=ptx_symbols(ptx),
                           ptx_sha256_names_normalised=sha(normalise_names(ptx)))
                if ptx_dir:
                    p = ptx_dir / f"{h}.ptx.gz"
                    if not p.exists():
                        p.write_bytes(gzip.compress(ptx.encode(), 6))
            except Exception as e:  # noqa: BLE001 -- record, keep going
                msg = str(e).splitlines()[0][:300] if str(e) else ""
                rec.update(status="failed", error=f"{type(e).__name__}: {msg}")
            rec["compile_s"] = round(time.time() - t0, 3)
            rec["compile_cpu_s"] = round(time.process_time() - c0, 3)
            compile_s += rec["compile_s"]
        doc["kernels"].append(rec)
        el = time.time() - t_start
        print(f"[{i + 1}/{len(sel)}] {el:6.0f}s t{rec['tier']} {rec['status']:6s} {rec.get('compile_s', 0):5.2f}s "
              f"{rec.get('ptx_sha256', '')[:12]} {rec['name']}"
              f"{'  ' + rec.get('error', '') if rec['status'] != 'ok' else ''}", file=sys.stderr, flush=True)
        if time.time() - last_write > 30:
            _write(out, doc, t_start, compile_s)
            last_write = time.time()
    doc["coverage"]["stopped_by_budget_after"] = stopped
    _write(out, doc, t_start, compile_s)
    fails = sum(k["status"] != "ok" for k in doc["kernels"])
    print(f"wrote {out}: {len(doc['kernels'])} kernels, {fails} failed, {time.time() - t_start:.0f} s wall",
          file=sys.stderr)
    return 0


def _write(out: Path, doc: dict, t_start: float, compile_s: float) -> None:
    doc["wall_s"] = round(time.time() - t_start, 1)
    doc["compile_s_sum"] = round(compile_s, 1)
    doc["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=0, sort_keys=False))
    os.replace(tmp, out)


def _ptx_text(doc: dict, h: str) -> str | None:
    if not doc.get("ptx_dir"):
        return None
    p = Path(doc["ptx_dir"]) / f"{h}.ptx.gz"
    return gzip.decompress(p.read_bytes()).decode() if p.exists() else None


def _first_diff(a: str, b: str, n: int = 12) -> list[str]:
    la, lb = a.splitlines(), b.splitlines()
    out = []
    for ln in difflib.unified_diff(la, lb, "A", "B", n=0, lineterm=""):
        out.append(ln if len(ln) <= 400 else ln[:400] + " ...")
        if len(out) >= n:
            break
    return out


def module_explains(x: dict, y: dict) -> bool:
    """Do the symbol names of kernel records ``x`` / ``y`` differ only by their kernel module's path? CuTeDSL
    builds ``kernel_<prefix>_<fn>_<str(self) without punctuation: module.Class object at ...>...``, cut at
    180 characters, then ``_<n>``: with module A's mangled form replaced by B's, A's name and B's must agree
    up to the shorter of the two cuts."""
    ma, mb = (str(r.get("template_module") or "").replace(".", "") for r in (x, y))
    if not ma or not mb or len(x["symbols"]) != len(y["symbols"]):
        return False
    for sa, sb in zip(x["symbols"], y["symbols"]):
        if sa == sb:
            continue
        ba, na = re.match(r"(.*?)(_\d+)?$", sa).groups()
        bb, nb = re.match(r"(.*?)(_\d+)?$", sb).groups()
        if na != nb or ma not in ba or mb not in bb:
            return False
        ba = ba.replace(ma, mb, 1)
        if not (ba.startswith(bb) or bb.startswith(ba)):
            return False
    return True


def cmd_compare(a) -> int:
    A, B = (json.loads(Path(p).read_text()) for p in (a.a, a.b))
    ka = {k["key"]: k for k in A["kernels"]}
    kb = {k["key"]: k for k in B["kernels"]}
    both = [k for k in ka if k in kb]
    only_a = [k for k in ka if k not in kb]
    only_b = [k for k in kb if k not in ka]
    ea, eb = set(A.get("enumerated", ())), set(B.get("enumerated", ()))

    def unreached(keys, other, enum_other):
        """Keys the other dump enumerated too but never reached (it stopped at its --budget-s, or is a partial
        file of a run still going or stopped): not compared, not a difference."""
        cov = other["coverage"]
        stopped = cov.get("stopped_by_budget_after") is not None or len(other["kernels"]) < cov.get("selected", 0)
        if not stopped:
            return [], keys
        r = [k for k in keys if short(k) in enum_other]
        return r, [k for k in keys if short(k) not in enum_other]

    unreached_b, only_a = unreached(only_a, B, eb)
    unreached_a, only_b = unreached(only_b, A, ea)
    ident, names_only, diff, fail_same, fail_diff = [], [], [], [], []
    for k in both:
        x, y = ka[k], kb[k]
        if x["status"] != "ok" or y["status"] != "ok":
            (fail_same if (x["status"], x.get("error")) == (y["status"], y.get("error")) else fail_diff).append(k)
        elif x["ptx_sha256"] == y["ptx_sha256"]:
            ident.append(k)
        elif x["ptx_sha256_names_normalised"] == y["ptx_sha256_names_normalised"]:
            names_only.append(k)
        else:
            diff.append(k)
    for nm, d in (("A", A), ("B", B)):
        e = d["env"]
        print(f"{nm}: {a.a if nm == 'A' else a.b}: nvgemm {e['nvgemm_file']} @ {e['git_head'][:72]}"
              f"{' (src dirty)' if e.get('src_dirty') else ''}; {len(d['kernels'])} kernels, wall {d.get('wall_s')} s")
    print(f"0. specs the policies emit (enumerated, by identity): A {len(ea)}, B {len(eb)}, in both {len(ea & eb)}, "
          f"only in A {len(ea - eb)}, only in B {len(eb - ea)}")
    print(f"compiled kernels matched by identity: {len(both)}; compiled only in A: {len(only_a) + len(unreached_b)} "
          f"({len(unreached_b)} of them not reached by B: its time budget, or a partial dump); only in B: "
          f"{len(only_b) + len(unreached_a)} ({len(unreached_a)} not reached by A)")
    print(f"1. raw PTX text (sha256 as CuTeDSL returns it): identical {len(ident)}, different "
          f"{len(names_only) + len(diff)}, failed on a side {len(fail_same) + len(fail_diff)} "
          f"({len(fail_same)} failed identically on both)")
    print(f"2. names normalised (every .entry/.func symbol -> __SYM<i>__): identical {len(ident) + len(names_only)}, "
          f"different {len(diff)}")
    if names_only:
        expl = [k for k in names_only if module_explains(ka[k], kb[k])]
        moves = sorted({(ka[k]["template_module"], kb[k]["template_module"]) for k in names_only})
        print(f"\nnames only: {len(expl)} of {len(names_only)} kernels' symbol differences are exactly the kernel "
              "module's path as CuTeDSL mangles it (dots dropped, name cut at 180 characters):")
        for ma, mb in moves:
            print(f"  {ma} -> {mb}")
        ex = ka[names_only[0]], kb[names_only[0]]
        print(f"\n{len(names_only)} kernels differ only in their symbol names; per template:")
        per: dict = {}
        for k in names_only:
            per[ka[k]["template_id"]] = per.get(ka[k]["template_id"], 0) + 1
        for t, n in sorted(per.items()):
            print(f"  {t}: {n}")
        for mv in moves:  # one example per module move: its symbols and its first differing lines
            k = next(k for k in names_only if (ka[k]["template_module"], kb[k]["template_module"]) == mv)
            x, y = ka[k], kb[k]
            print(f"\n  e.g. {x['name']} ({x['label']}):")
            for s0, s1 in zip(x["symbols"], y["symbols"]):
                if s0 != s1:
                    print(f"    A symbol: {s0}\n    B symbol: {s1}")
            ta, tb = _ptx_text(A, x["ptx_sha256"]), _ptx_text(B, y["ptx_sha256"])
            if ta and tb:
                la, lb = ta.splitlines(), tb.splitlines()
                syms = x["symbols"] + y["symbols"]
                pairs = [(u, v) for u, v in zip(la, lb) if u != v]
                other = [p for p in pairs if not any(sy in p[0] for sy in syms) or not any(sy in p[1] for sy in syms)]
                print(f"    {len(la)} / {len(lb)} lines; {len(pairs)} differ, {len(other)} of them without a kernel "
                      "symbol; first differing lines:")
                for ln in _first_diff(ta, tb, a.lines):
                    print("    " + ln)
    for k in diff[: a.show]:
        x, y = ka[k], kb[k]
        print(f"\nDIFFERENT: {x['name']} ({x['label']})\n  A {x['ptx_sha256'][:16]} B {y['ptx_sha256'][:16]}")
        ta, tb = _ptx_text(A, x["ptx_sha256"]), _ptx_text(B, y["ptx_sha256"])
        if ta and tb:
            for ln in _first_diff(normalise_names(ta), normalise_names(tb), a.lines):
                print("    " + ln)
    for k in (fail_diff + fail_same)[: a.show]:
        print(f"\nFAILED: {ka[k]['name']}: A {ka[k].get('error', 'ok')} | B {kb[k].get('error', 'ok')}")
    for nm, keys, d in (("A", only_a, ka), ("B", only_b, kb)):
        for k in keys[: a.show]:
            print(f"only in {nm}: {d[k]['name']} ({d[k]['template_id']})")
    per_t: dict = {}
    for k in both:
        t = ka[k]["template_id"]
        row = per_t.setdefault(t, [0, 0, 0, 0])
        row[0] += 1
        row[1] += k in ident
        row[2] += k in names_only
        row[3] += k in diff
    print("\nper template: matched / raw-identical / names-only / different")
    for t, (n, i_, no, df) in sorted(per_t.items()):
        print(f"  {t:18s} {n:5d} {i_:5d} {no:5d} {df:5d}")
    bad = (len(diff) + len(fail_diff) + len(only_a) + len(only_b) + len(ea ^ eb)
           + (0 if a.names_normalised else len(names_only)))
    print(f"\nverdict ({'names normalised' if a.names_normalised else 'raw PTX'}): "
          f"{'IDENTICAL' if bad == 0 else 'DIFFERENCES'}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for nm in ("plan", "dump"):
        p = sub.add_parser(nm)
        p.add_argument("--coverage", choices=("default", "all"), default="default")
        p.add_argument("--groups", help="comma-separated groups (overrides --coverage); `plan` lists them")
        if nm == "plan":
            p.add_argument("--verbose", action="store_true")
        else:
            p.add_argument("--out", required=True)
            p.add_argument("--ptx-dir", help="also keep each PTX text, gzipped, as DIR/<sha256>.ptx.gz (for diffs)")
            p.add_argument("--limit", type=int, default=0, help="only the first N selected specs")
            p.add_argument("--every", type=int, default=1, help="only every N-th selected spec (timing samples)")
            p.add_argument("--budget-s", type=float, default=0,
                           help="after tier 1 (always compiled), stop once this many seconds of wall time have passed")
            p.add_argument("--match", help="compile exactly the kernels this other dump has, in its order")
            p.add_argument("--resume", action="store_true", help="keep the kernels --out already has")
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--names-normalised", action="store_true",
                   help="exit status from the names-normalised comparison (both are always printed)")
    p.add_argument("--show", type=int, default=20, help="differing kernels to show (default 20)")
    p.add_argument("--lines", type=int, default=16, help="diff lines per kernel (default 16)")
    a = ap.parse_args()
    return {"plan": cmd_plan, "dump": cmd_dump, "compare": cmd_compare}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
