"""``nvgemm.fused_requant_pass``: the fused requant rewrite as an Inductor post-grad pass that a compiler
takes by qualified name (vLLM: ``-cc '{"inductor_passes": {"post_grad_custom_pre_pass":
"nvgemm.fused_requant_pass"}}'``), with an identity that changes whenever the rewrite can.

A compile cache reuses a graph only while the identity of the passes that made it is unchanged. vLLM
takes a pass that is not one of its own ``InductorPass`` objects and wraps it in ``CallableInductorPass``,
whose ``uuid()`` is the sha256 of the pass's *source text* (``inspect.getsource``); that uuid enters
vLLM's compile-cache key (``CompilationConfig.compute_hash``) and Inductor's FX-graph cache key
(``post_grad_custom_pre_pass.uuid()``). A hand-written wrapper function has the same source text in
every nvgemm release, so a graph rewritten by an old nvgemm would be reused after the rewrite changed.

So the function is built here from a source text that carries :data:`PASS_UUID`: nvgemm's version and
a sha256 over the sources the rewritten graph is made from (:data:`REWRITE_SOURCES`: the rewrite, the
ops and fake impls it emits, the dispatch rule that decides where it applies, the format and epilogue
definitions; any file added under them counts). ``fused_requant_pass.uuid()`` returns the same value.
With the pass off, vLLM and Inductor key on no pass at all, so a graph compiled without it is never
reused with it on. Given to Inductor directly (``torch._inductor.config.post_grad_custom_pre_pass``), a
plain function makes Inductor bypass its FX-graph cache, which is safe.

Computed at ``import nvgemm`` (vLLM reads the name from the module's ``__dict__``): about 1 ms of file
hashing, with no Inductor import.
"""

from __future__ import annotations

import hashlib
import linecache
from pathlib import Path

#: Folders of the nvgemm package (relative to it) whose ``.py`` files the rewritten graph depends on.
REWRITE_SOURCES = ("core", "epilogues", "dispatch", "ops", "integrations/inductor")

_PACKAGE = Path(__file__).resolve().parent.parent


def rewrite_sources(package: Path = _PACKAGE) -> list[Path]:
    """Every file hashed into the pass's identity: the ``.py`` files under :data:`REWRITE_SOURCES` and this one."""
    files = [p for d in REWRITE_SOURCES for p in (package / d).rglob("*.py")]
    return sorted({*files, package / "integrations" / "requant_pass.py"})


def pass_uuid(version: str, package: Path = _PACKAGE) -> str:
    """The pass's identity: ``nvgemm-<version>-fused-requant-<sha256 of the rewrite's sources>``."""
    h = hashlib.sha256()
    for p in rewrite_sources(package):
        h.update(p.relative_to(package).as_posix().encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    return f"nvgemm-{version}-fused-requant-{h.hexdigest()}"


def _run(graph) -> None:
    from nvgemm.integrations.inductor.capture import post_grad_pass  # lazy: keeps Inductor code out of import

    post_grad_pass(graph)


def make_fused_requant_pass(uuid: str):
    """``fused_requant_pass(graph)`` whose source text (what vLLM hashes) names ``uuid``.

    The source is registered in ``linecache`` under a ``<...>`` file name, as generated code is (attrs,
    torch.fx), so ``inspect.getsource`` returns it; the function pickles by its qualified name."""
    src = (
        "def fused_requant_pass(graph):\n"
        f"    \"\"\"nvgemm's fused requant rewrite; identity {uuid}\"\"\"\n"
        "    _run(graph)\n"
    )
    filename = f"<nvgemm.fused_requant_pass {uuid}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    namespace = {"__name__": "nvgemm", "_run": _run}
    exec(compile(src, filename, "exec"), namespace)
    fn = namespace["fused_requant_pass"]
    fn.__doc__ = (
        "Inductor post-grad pass rewriting W4A4 gated MLPs into the fused requant chain, by qualified name for "
        "compilers that take passes that way (vLLM: ``-cc '{\"inductor_passes\": {\"post_grad_custom_pre_pass\": "
        "\"nvgemm.fused_requant_pass\"}}'``); see :func:`nvgemm.integrations.inductor.capture.post_grad_pass`. "
        "``nvgemm.enable()`` runs the same rewrite inside its capture pass. ``fused_requant_pass.uuid()`` is its "
        f"compile-cache identity ({uuid}); see :mod:`nvgemm.integrations.requant_pass`."
    )
    fn.uuid = lambda: uuid
    return fn
