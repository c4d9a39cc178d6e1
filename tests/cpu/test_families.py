"""Every kernel family folder registers itself and provides every piece: config space, ``can_implement``,
AOT kernel modules, launcher, backends (in the dispatch registry), policy rules, performance facts and a
README -- or names the piece in ``omits`` with the reason it has none. A planted incomplete family shows
the check fails."""

from __future__ import annotations

import importlib.util
import inspect
import pkgutil

import pytest

import nvgemm.templates
from nvgemm.core.backend import OP_KINDS, Backend
from nvgemm.core.family import KernelFamily, families, register_family, resolve


def missing_pieces(fam: KernelFamily) -> list[str]:
    """What ``fam`` lacks, one line per piece (empty: complete)."""
    out: list[str] = []
    omitted = fam.omitted
    for piece, why in omitted.items():
        if not why.strip():
            out.append(f"{piece}: omitted without a reason")

    def need(piece: str, present: bool, what: str) -> None:
        if piece in omitted:
            if present:
                out.append(f"{piece}: both provided and omitted")
        elif not present:
            out.append(f"{piece}: {what}")

    def resolves(ref: str):
        try:
            return resolve(ref)
        except (ImportError, AttributeError) as e:
            out.append(f"{ref}: does not resolve ({type(e).__name__}: {e})")
            return None

    need("configs", bool(fam.configs), "no config type")
    for ref in fam.configs:
        cls = resolves(ref)
        if cls is not None and not inspect.isclass(cls):
            out.append(f"{ref}: a config type must be a class")
    need("can_implement", fam.can_implement is not None, "no can_implement predicate")
    if fam.can_implement is not None and not callable(resolves(fam.can_implement)):
        out.append(f"{fam.can_implement}: can_implement is not callable")
    need("kernels", bool(fam.kernels), "no AOT kernel module")
    for tid, module in fam.kernels:  # kernel modules import cutlass: located, not imported
        if importlib.util.find_spec(module) is None:
            out.append(f"kernels: template {tid}'s module {module} does not exist")
    need("launcher", fam.launcher is not None, "no launcher")
    if fam.launcher is not None:
        resolves(fam.launcher)
    need("backends", bool(fam.backends), "no backend")
    for kind, ref in fam.backends:
        b = resolves(ref)
        if b is not None and not isinstance(b, Backend):
            out.append(f"{ref}: a {kind} backend must be a nvgemm.core.backend.Backend, got {type(b).__name__}")
    need("policy", fam.policy is not None, "no policy rules")
    if fam.policy is not None:
        mod = resolves(fam.policy)
        if mod is not None and fam.gemm_kind is not None and not callable(getattr(mod, "candidates", None)):
            out.append(f"{fam.policy}: a dense-GEMM family's policy needs candidates(problem, max_candidates, use_nvmmh)")
    need("perf", fam.perf is not None, "no performance facts")
    if fam.perf is not None:
        resolves(fam.perf)
    for ref in fam.perf_facts:
        resolves(ref)
    if fam.gemm_kind is not None and not fam.perf_facts:
        out.append("perf_facts: a dense-GEMM family's configs must be priced by the performance model")
    if fam.gemm_kind is not None and not fam.archs:
        out.append("archs: a dense-GEMM family names the arches its policy serves")
    if not (fam.folder / "README.md").is_file():
        out.append(f"README.md: missing in {fam.folder}")
    return out


def _family_folders() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(nvgemm.templates.__path__) if m.ispkg and m.name != "common")


def test_every_family_folder_registers_itself():
    assert [f.name for f in families()] == _family_folders()
    for fam in families():
        assert fam.package == f"nvgemm.templates.{fam.name}"


@pytest.mark.parametrize("name", _family_folders())
def test_family_provides_every_piece(name):
    fam = next(f for f in families() if f.name == name)
    assert missing_pieces(fam) == []
    if fam.kernels:  # an AOT-compiled (CuTeDSL) family omits nothing
        assert fam.omits == ()


def test_backends_policy_facts_and_templates_reach_their_layers():
    from nvgemm.aot.abi import builtin_template_modules
    from nvgemm.dispatch.registry import backends
    from nvgemm.heuristics.perfmodel.facts import registered_families

    by_kind = {k: {b.name: b for b in backends(k)} for k in OP_KINDS}
    facts = {type(f) for f in registered_families()}
    templates = builtin_template_modules()
    for fam in families():
        for kind, ref in fam.backends:
            b = resolve(ref)
            assert by_kind[kind].get(b.name) is b, f"{fam.name}: {kind} backend {b.name} is not in the dispatch registry"
        for ref in fam.perf_facts:
            assert resolve(ref) in facts, f"{fam.name}: {ref} is not in the performance model"
        for tid, module in fam.kernels:
            assert templates[tid] == module


def test_a_planted_incomplete_family_is_reported(tmp_path):
    planted = KernelFamily(name="planted", package="nvgemm.templates.planted", summary="incomplete on purpose",
                           backends=(("linear", "nvgemm.templates.sm90_w4a16.backend:supports"),),
                           configs=("nvgemm.templates.sm90_w4a16.config:Sm90W4A16Config",),
                           kernels=(("planted_gemm", "nvgemm.templates.planted_kernel_missing"),),
                           launcher="nvgemm.templates.sm90_w4a16.launch", gemm_kind="w4a16", archs=("sm_90a",),
                           omits=(("perf", " "),))
    import sys
    import types

    pkg = types.ModuleType(planted.package)
    pkg.__file__ = str(tmp_path / "__init__.py")  # a folder without README.md
    sys.modules[planted.package] = pkg
    try:
        got = missing_pieces(planted)
    finally:
        del sys.modules[planted.package]
    text = "\n".join(got)
    for want in ("perf: omitted without a reason", "can_implement: no can_implement predicate",
                 "template planted_gemm's module nvgemm.templates.planted_kernel_missing does not exist",
                 "must be a nvgemm.core.backend.Backend, got function", "policy: no policy rules",
                 "perf_facts: a dense-GEMM family's configs must be priced", "README.md: missing"):
        assert want in text, f"{want!r} not reported in:\n{text}"


def test_registration_errors_name_the_problem():
    with pytest.raises(ValueError, match="op kind 'dense', not one of"):
        KernelFamily(name="x", package="nvgemm.templates.x", summary="", backends=(("dense", "m:B"),))
    with pytest.raises(ValueError, match="package 'nvgemm.templates.y' must be the family's folder"):
        KernelFamily(name="x", package="nvgemm.templates.y", summary="")
    with pytest.raises(ValueError, match="omits names unknown pieces \\['tests'\\]"):
        KernelFamily(name="x", package="nvgemm.templates.x", summary="", omits=(("tests", "none"),))
    with pytest.raises(ValueError, match="launcher reference 'not a ref' is not 'module' or 'module:attr'"):
        KernelFamily(name="x", package="nvgemm.templates.x", summary="", launcher="not a ref")
    families()  # built-ins loaded
    with pytest.raises(ValueError, match="template ids \\['sm100_nvfp4_gemm'\\] belong to family sm100_w4a4"):
        register_family(name="x", package="nvgemm.templates.x", summary="",
                        kernels=(("sm100_nvfp4_gemm", "nvgemm.templates.x.kernel"),))
    with pytest.raises(ValueError, match="kernel family 'sm90_w4a16' is already registered"):
        register_family(name="sm90_w4a16", package="nvgemm.templates.sm90_w4a16", summary="another")
