"""The kernel-family contract: one :class:`KernelFamily` record per folder of ``nvgemm/templates``.

A family folder's ``__init__.py`` makes one call, :func:`register_family`, naming every piece of the family
by reference (``"module"`` or ``"module:attribute"`` strings, resolved by :func:`resolve` when a layer
needs the piece). The layers above take what they need from here instead of keeping their own tables:

* dispatch (:mod:`nvgemm.dispatch.registry`): the family's :attr:`~KernelFamily.backends` per op kind;
* the candidate engine (:mod:`nvgemm.heuristics.policy`, :mod:`nvgemm.heuristics.implementable`): the
  family's GEMM kind and arches, its ``policy`` module's ``candidates``, its config types and ``can_implement``;
* the performance model (:mod:`nvgemm.heuristics.perfmodel.facts`): the family's ``perf_facts`` classes;
* the AOT ABI (:mod:`nvgemm.aot.abi`): template id -> kernel module (:attr:`~KernelFamily.kernels`) and
  config -> template id (:attr:`~KernelFamily.template_of`).

Registering records names only: nothing is imported until a piece is resolved, so a family's
``__init__`` stays light and ``import nvgemm`` imports no family at all. The built-in families are the
sub-packages of the family roots (``nvgemm/__init__.py`` adds ``nvgemm.templates`` with
:func:`add_family_root`); :func:`families` imports them (each registers itself) on first use. This module
imports no other nvgemm module but :mod:`nvgemm.core.backend` and names no module above ``core``.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
import threading
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from nvgemm.core.backend import OP_KINDS

#: sub-packages of a family root that are no family (``common`` holds what the families share)
NOT_FAMILIES = ("common",)

#: the pieces every family provides, or names in ``omits`` with the reason it has none
PIECES = ("configs", "can_implement", "kernels", "launcher", "backends", "policy", "perf")


@dataclass(frozen=True)
class KernelFamily:
    """Everything the layers above need to know about one kernel family, by reference."""

    name: str  # the folder name, e.g. "sm100_w4a4"
    package: str  # its dotted package, e.g. "nvgemm.templates.sm100_w4a4"
    summary: str
    #: (op kind, "module:attr" of a :class:`~nvgemm.core.backend.Backend`) for each backend the family serves
    backends: tuple[tuple[str, str], ...] = ()
    #: "module:Class" of each config type (the config space)
    configs: tuple[str, ...] = ()
    #: "module:function": the family's implementability predicate (a ``Status`` or a reason)
    can_implement: str | None = None
    #: (AOT template id, kernel module that registers that template on import)
    kernels: tuple[tuple[str, str], ...] = ()
    #: "module:function" config -> template id; None: the family's single template id
    template_of: str | None = None
    launcher: str | None = None  # "module" of the host launcher
    policy: str | None = None  # "module" of the policy rules (its ``candidates`` serves the GEMM engine)
    perf: str | None = None  # "module" of the performance facts
    #: "module:Class" of each perf-model ``FamilyFacts`` the family contributes
    perf_facts: tuple[str, ...] = ()
    #: the dense-GEMM problem kind its policy serves ("w4a4" | "w4a16"), None: not a dense GEMM family
    gemm_kind: str | None = None
    archs: tuple[str, ...] = ()  # target arches the family compiles for
    #: (piece, reason) for each of :data:`PIECES` the family deliberately has none of
    omits: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        if not self.name or not self.package.endswith("." + self.name):
            raise ValueError(f"kernel family {self.name!r}: package {self.package!r} must be the family's folder")
        for kind, ref in self.backends:
            if kind not in OP_KINDS:
                raise ValueError(f"kernel family {self.name}: backend {ref!r} has op kind {kind!r}, not one of {OP_KINDS}")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _REF_FIELDS:
                refs = [] if v is None else [v]
            elif f.name in ("configs", "perf_facts"):
                refs = list(v)
            elif f.name in ("backends", "kernels"):
                refs = [r for _, r in v]
            else:
                continue
            for r in refs:
                if not isinstance(r, str) or not _REF.fullmatch(r):
                    raise ValueError(f"kernel family {self.name}: {f.name} reference {r!r} is not 'module' or 'module:attr'")
        unknown = [p for p, _ in self.omits if p not in PIECES]
        if unknown:
            raise ValueError(f"kernel family {self.name}: omits names unknown pieces {unknown}; pieces are {PIECES}")
        if self.template_of is None and len(self.kernels) > 1:
            raise ValueError(f"kernel family {self.name}: {len(self.kernels)} templates need a template_of function")

    @property
    def omitted(self) -> dict[str, str]:
        return dict(self.omits)

    @property
    def folder(self) -> Path:
        """The family's folder (its package is imported: it registered itself)."""
        return Path(sys.modules[self.package].__file__).parent

    def config_names(self) -> tuple[str, ...]:
        """Class names of the family's config types (no import)."""
        return tuple(r.rpartition(":")[2] for r in self.configs)

    def template_id_for(self, config: Any) -> str:
        if self.template_of is not None:
            return resolve(self.template_of)(config)
        return self.kernels[0][0]

    def candidates(self, problem, max_candidates: int, use_nvmmh: bool):
        """The family's ranked candidates for a dense-GEMM ``problem`` (its policy module's ``candidates``)."""
        return resolve(self.policy + ":candidates")(problem, max_candidates, use_nvmmh=use_nvmmh)

    def probe_config(self):
        """The family's default config: it carries every problem-only rule (K and N alignment)."""
        return resolve(self.configs[0])()


_REF_FIELDS = ("can_implement", "template_of", "launcher", "policy", "perf")
_REF = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*)?")

_FAMILIES: dict[str, KernelFamily] = {}
_LOCK = threading.RLock()
_ROOTS: list[str] = []  # packages whose sub-packages are families, imported on first use
_LOADED = False
_GENERATION = 0


def register_family(family: KernelFamily | None = None, /, **pieces) -> KernelFamily:
    """Register one kernel family: ``register_family(name=..., package=__name__, ...)`` (the fields of
    :class:`KernelFamily`) or ``register_family(KernelFamily(...))``. Registering the same record again is a
    no-op; another family under the same name, or a template id another family owns, is an error."""
    fam = family if family is not None else KernelFamily(**pieces)
    with _LOCK:
        old = _FAMILIES.get(fam.name)
        if old is not None and old != fam:
            raise ValueError(f"kernel family {fam.name!r} is already registered (by {old.package})")
        for other in _FAMILIES.values():
            clash = {t for t, _ in fam.kernels} & {t for t, _ in other.kernels}
            if other.name != fam.name and clash:
                raise ValueError(f"kernel family {fam.name}: template ids {sorted(clash)} belong to family {other.name}")
        _FAMILIES[fam.name] = fam
        _bump()
    return fam


def unregister_family(name: str) -> None:
    with _LOCK:
        _FAMILIES.pop(name, None)
        _bump()


def _bump() -> None:
    global _GENERATION
    _GENERATION += 1


def generation() -> int:
    """A counter that changes whenever a family is registered or unregistered (for derived caches)."""
    return _GENERATION


def add_family_root(package: str) -> None:
    """Make every sub-package of ``package`` (but :data:`NOT_FAMILIES`) a family, imported -- and so
    registered -- the first time the registry is consulted."""
    global _LOADED
    with _LOCK:
        if package not in _ROOTS:
            _ROOTS.append(package)
            _LOADED = False


def _load_builtin() -> None:
    global _LOADED
    if _LOADED:
        return
    with _LOCK:
        if _LOADED:
            return
        for package in _ROOTS:
            root = importlib.import_module(package)
            for mod in pkgutil.iter_modules(root.__path__):
                if mod.ispkg and mod.name not in NOT_FAMILIES:
                    importlib.import_module(f"{package}.{mod.name}")  # its __init__ calls register_family
        _LOADED = True


def families() -> list[KernelFamily]:
    """Every registered family (the built-in ones imported on first call), in name order."""
    _load_builtin()
    with _LOCK:
        return [_FAMILIES[n] for n in sorted(_FAMILIES)]


def family(name: str) -> KernelFamily:
    _load_builtin()
    try:
        return _FAMILIES[name]
    except KeyError:
        raise KeyError(f"no kernel family {name!r}; registered: {sorted(_FAMILIES)}") from None


def family_of_config(config: Any) -> KernelFamily | None:
    """The family whose config space holds ``config``'s type (matched by class name; no import)."""
    name = type(config).__name__
    for fam in families():
        if name in fam.config_names():
            return fam
    return None


def resolve(ref: str) -> Any:
    """The object a ``"module"`` / ``"module:attr"`` reference names (importing the module)."""
    module, _, attr = ref.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


__all__ = [
    "KernelFamily",
    "PIECES",
    "add_family_root",
    "families",
    "generation",
    "family",
    "family_of_config",
    "register_family",
    "resolve",
    "unregister_family",
]
