"""Every ``NVGEMM_*`` environment variable nvgemm reads: name, type, default, one-line doc and tag.

This module is the only place in nvgemm that touches ``NVGEMM_*`` in the environment (a test scans the
package for any other read). A value is read on each access, so a variable changed while the process
runs (``monkeypatch.setenv`` in a test, ``os.environ[...]`` before a call) takes effect on the next
access. A read costs one environment lookup (a text seen before is not parsed again)::

    from nvgemm import settings

    if settings.NVGEMM_SELFCHECK: ...        # typed value: bool, str, int, Path, tuple or None
    settings.get("NVGEMM_VLLM", environ)     # the same, from another mapping than os.environ

Each setting carries one tag:

* ``codegen``: it changes the code a kernel template generates. The AOT cache key takes exactly these
  (:func:`codegen_env`, through :func:`nvgemm.aot.compile_spec.capture_codegen_env`), and a template
  reads one from its spec (``spec.env(name)``), never from the environment.
* ``runtime``: which kernel runs, where files go, logging, diagnostics. Never part of the cache key, so
  setting one never misses a precompiled kernel.

An unset or empty variable means its default. A value that does not parse raises :class:`SettingError`,
naming the variable and the values it accepts (``NVGEMM_PDL=maybe``). ``nvgemm env`` prints every
setting with its value, source and tag; ``nvgemm env --markdown`` writes ``docs/env.md`` (:func:`markdown`).
This module imports nothing from nvgemm, so every layer may use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import types
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

PREFIX = "NVGEMM_"
CODEGEN = "codegen"
RUNTIME = "runtime"
TAGS = (CODEGEN, RUNTIME)


class SettingError(ValueError):
    """An ``NVGEMM_*`` variable holds a value its setting does not accept."""


# ---- value types: (parse raw text -> value, canonical text of a value, what is accepted) -----------

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class _Type:
    name: str  # shown in docs/env.md and `nvgemm env`
    accepts: str  # the accepted values, for docs and error messages
    parse: Callable[[str], Any]  # stripped, non-empty text -> value; raises ValueError when not accepted
    text: Callable[[Any], str] = str  # value -> canonical text (the cache key, `nvgemm env`)


def _parse_bool(raw: str) -> bool:
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError


BOOL = _Type("bool", "1 or 0 (also true/false, yes/no, on/off)", _parse_bool, lambda v: "1" if v else "0")
NAME = _Type("name", "a registered name", str)
PATH = _Type("path", "a directory path", lambda raw: Path(raw).expanduser())


def _names(raw: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in raw.split(",") if s.strip())
    if not names:
        raise ValueError
    return names


NAMES = _Type("names", "comma-separated names", _names, ",".join)


def _count(raw: str) -> int:
    v = int(raw)
    if v < 0:
        raise ValueError
    return v


COUNT = _Type("int", "an integer >= 0", _count)


def _choice(*values: str) -> _Type:
    def parse(raw: str) -> str:
        up = raw.upper()
        if up not in values:
            raise ValueError
        return up

    return _Type("choice", ", ".join(values) + " (any case)", parse)


LOG_LEVEL = _choice("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL", "FATAL", "NOTSET")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One ``NVGEMM_*`` variable. ``default`` is the value an unset or empty variable has (None: off /
    not given, as ``doc`` says)."""

    name: str
    type: _Type
    default: Any
    tag: str
    doc: str

    def __post_init__(self) -> None:
        if not self.name.startswith(PREFIX):
            raise ValueError(f"setting {self.name!r}: the name must start with {PREFIX}")
        if self.tag not in TAGS:
            raise ValueError(f"setting {self.name}: tag {self.tag!r} is not one of {', '.join(TAGS)}")

    def parse(self, raw: Optional[str]) -> Any:
        """The value of the raw text ``raw`` (None or blank: the default)."""
        if raw is None or not raw.strip():
            return self.default
        try:
            return self.type.parse(raw.strip())
        except ValueError:
            raise SettingError(f"{self.name}={raw!r}: expected {self.type.accepts}") from None

    def text(self, value: Any) -> str:
        """Canonical text of ``value`` ('' for None)."""
        return "" if value is None else self.type.text(value)


def _declare(*settings: Setting) -> dict[str, Setting]:
    table: dict[str, Setting] = {}
    for s in settings:
        if s.name in table:
            raise ValueError(f"setting {s.name} is declared twice")
        table[s.name] = s
    return table


#: Every setting, in the order docs/env.md and ``nvgemm env`` list them.
SETTINGS: dict[str, Setting] = _declare(
    # -- backend choice
    Setting("NVGEMM_BACKEND", NAME, "", RUNTIME,
            "Force the backend of every `nvgemm::nvfp4_linear` call (`emulated`, `cutedsl_sm100`, `emu_sm90`, "
            "`emu_sm100`, `emu_sm120`, ...; an error if it cannot run the problem); it also forces the fused and "
            "MoE ops when it names one of their backends (`emu_sm100` / `emu_sm120` serve the fused ops too). "
            "Unset: the registry picks."),
    Setting("NVGEMM_FUSED_BACKEND", NAME, "", RUNTIME,
            "Force the backend of the fused requant / prequant ops; wins over `NVGEMM_BACKEND` for them."),
    Setting("NVGEMM_MOE_BACKEND", NAME, "", RUNTIME,
            "Force the backend of `nvgemm::nvfp4_moe`; wins over `NVGEMM_BACKEND` for it. `emu_sm100_moe` "
            "and `emu_sm120_moe` (the sm_100a / sm_120a grouped kernels on the PTX emulator) run only when "
            "named here."),
    Setting("NVGEMM_SELFCHECK", BOOL, True, RUNTIME,
            "Check each kernel backend once per problem against the emulated op before its first use; a "
            "backend that fails is passed over with one warning."),
    Setting("NVGEMM_NVMMH", BOOL, True, RUNTIME,
            "Let nvMatmulHeuristics (when installed) rank the candidate configs; 0 uses nvgemm's decode rules "
            "only. Read once, at the first ranking."),
    Setting("NVGEMM_INDUCTOR_CHOICES", NAMES, None, RUNTIME,
            "Restrict the torch.compile autotuning candidates to these kinds (backend names or `cublaslt`). "
            "Unset: every kind."),
    Setting("NVGEMM_PDL", BOOL, True, RUNTIME,
            "Launch nvgemm's Triton kernels with programmatic dependent launch on sm_90+ when the caller "
            "leaves `pdl` unset (Triton keys its own cache on it). CuTeDSL kernels take PDL from their "
            "config."),
    # -- weights and files
    Setting("NVGEMM_SM90_ONE_COPY", BOOL, True, RUNTIME,
            "Hold a Hopper NVFP4 layer once, in the sm90 kernels' layout, when those kernels serve it; 0 "
            "keeps the checkpoint layout (two copies on the GPU). A loader's `sm90_one_copy=` wins."),
    Setting("NVGEMM_CACHE_DIR", PATH, None, RUNTIME,
            "Root of the AOT kernel cache and of the emulator's built libraries (`<dir>/emulator`). Unset: "
            "the source checkout's `kernels_cache/` when there is one, else `$XDG_CACHE_HOME/nvgemm/kernels`; "
            "the emulator's under the temp directory."),
    Setting("NVGEMM_PRECOMPILE_JOBS", COUNT, 0, RUNTIME,
            "Parallel compile workers of `nvgemm precompile` when `--jobs` is not given; 0: min(4, CPUs)."),
    # -- tools and diagnostics
    Setting("NVGEMM_DEBUG", BOOL, False, RUNTIME,
            "`nvgemm` commands show the traceback of an unexpected error instead of one line."),
    Setting("NVGEMM_EMU_ANY_DSL", BOOL, False, RUNTIME,
            "Let the PTX emulator run compiled host functions on a cutlass-dsl version it was not checked "
            "against."),
    # -- vLLM plugin
    Setting("NVGEMM_VLLM", BOOL, None, RUNTIME,
            "Enable (1) or disable (0) nvgemm's vLLM plugin. Unset: enabled only when `VLLM_PLUGINS` names "
            "`nvgemm`."),
    Setting("NVGEMM_VLLM_LOG_LEVEL", LOG_LEVEL, "INFO", RUNTIME,
            "Level of the nvgemm log lines the vLLM plugin prints (unless the application configured the "
            "`nvgemm_cutedsl` logger)."),
    Setting("NVGEMM_VLLM_DUMP", PATH, None, RUNTIME,
            "Save every linear and MoE call the vLLM plugin makes (inputs and output) under this directory "
            "(tests, debugging; slow)."),
    # -- SGLang plugin
    Setting("NVGEMM_SGLANG", BOOL, None, RUNTIME,
            "Enable (1) or disable (0) nvgemm's SGLang plugin. Unset: enabled only when `SGLANG_PLUGINS` names "
            "`nvgemm`. Enabled on an SGLang it cannot serve, it stops SGLang's startup with the reason."),
    Setting("NVGEMM_SGLANG_LOG_LEVEL", LOG_LEVEL, "INFO", RUNTIME,
            "Level of the nvgemm log lines the SGLang plugin prints (unless the application configured the "
            "`nvgemm_cutedsl` logger)."),
    Setting("NVGEMM_SGLANG_DUMP", PATH, None, RUNTIME,
            "Save every linear and MoE call the SGLang plugin makes (inputs, routing, output) under this directory "
            "(tests, debugging; slow)."),
)


# ---- reading -------------------------------------------------------------------------------------


def setting(name: str) -> Setting:
    """The declared setting ``name``; an error naming the known ones otherwise."""
    try:
        return SETTINGS[name]
    except KeyError:
        raise KeyError(f"{name} is not an nvgemm setting (known: {', '.join(SETTINGS)})") from None


#: (name, raw text) -> (setting, parsed value): a read that finds the text it saw before skips the parse.
_PARSED: dict[tuple[str, str], tuple[Setting, Any]] = {}


def get(name: str, environ: Optional[Mapping[str, str]] = None) -> Any:
    """The value of setting ``name`` in ``environ`` (default: this process's environment, read now)."""
    s = SETTINGS.get(name) or setting(name)
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None:
        return s.default
    hit = _PARSED.get((name, raw))
    if hit is not None and hit[0] is s:
        return hit[1]
    value = s.parse(raw)
    _PARSED[name, raw] = (s, value)
    return value


#: settings that change which backend an op call selects (part of the ops' per-call plan keys)
FORCING = ("NVGEMM_BACKEND", "NVGEMM_FUSED_BACKEND", "NVGEMM_MOE_BACKEND", "NVGEMM_SELFCHECK")


def forcing_token() -> tuple[Optional[str], ...]:
    """The raw environment text of the :data:`FORCING` settings, read now (a cheap per-call key: a
    changed value, parsed or not, makes a new key)."""
    env = os.environ
    data = getattr(env, "_data", None)  # CPython's encoded-key dict behind os.environ: one dict lookup each
    last = _LAST_ENV
    if data is not None and last[0] is env and last[1] is data:
        return tuple(map(data.get, last[2]))
    if data is not None and hasattr(env, "encodekey"):
        _LAST_ENV[:] = [env, data, _forcing_keys(env)]
        return tuple(map(data.get, _LAST_ENV[2]))
    return tuple(map(env.get, FORCING))


#: the environ mapping, its encoded-key dict and the encoded FORCING keys of the last forcing_token read
_LAST_ENV: list = [None, None, ()]


_FORCING_KEYS: dict[int, tuple] = {}


def _forcing_keys(env) -> tuple:
    keys = _FORCING_KEYS.get(id(env))
    if keys is None:
        keys = _FORCING_KEYS[id(env)] = tuple(map(env.encodekey, FORCING))
    return keys


def source(name: str, environ: Optional[Mapping[str, str]] = None) -> str:
    """``environment`` when the variable is set to a non-empty value, else ``default``."""
    env = os.environ if environ is None else environ
    setting(name)
    return "environment" if (env.get(name) or "").strip() else "default"


class _SettingsModule(types.ModuleType):
    """This module's type: one read-only property per setting, so ``settings.NVGEMM_X`` reads the
    environment on each access (a property is found without the failed lookup a module ``__getattr__``
    costs first)."""


def _property(name: str) -> property:
    def refuse(_module, _value):
        raise AttributeError(f"settings.{name} is read from the environment: set os.environ[{name!r}] "
                             "(a test: monkeypatch.setenv), or use settings.override(...)")

    return property(lambda _module: get(name), refuse, doc=SETTINGS[name].doc)


for _name in SETTINGS:
    setattr(_SettingsModule, _name, _property(_name))
sys.modules[__name__].__class__ = _SettingsModule


def __getattr__(name: str) -> Any:
    """A setting declared after import (tests), or a clear error for a name that is not one."""
    if name in SETTINGS:
        return get(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}"
                         + (f" ({name} is not a declared setting)" if name.startswith(PREFIX) else ""))


def codegen_env(environ: Optional[Mapping[str, str]] = None) -> tuple[tuple[str, str], ...]:
    """Sorted ``(name, canonical value)`` of the ``codegen`` settings set in ``environ``: the nvgemm part
    of an AOT cache key. Each value is parsed first, so a bad one is an error, not a key."""
    env = os.environ if environ is None else environ
    out = []
    for s in SETTINGS.values():
        if s.tag == CODEGEN and (env.get(s.name) or "").strip():
            out.append((s.name, s.text(s.parse(env[s.name]))))
    return tuple(sorted(out))


def unknown(environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """``NVGEMM_*`` variables set in ``environ`` that no setting declares (nvgemm ignores them: a typo?)."""
    env = os.environ if environ is None else environ
    return sorted(k for k in env if k.startswith(PREFIX) and k not in SETTINGS)


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of :func:`report`: the value's canonical text, or the error when it does not parse."""

    setting: Setting
    value: str
    source: str
    error: Optional[str] = None


def report(environ: Optional[Mapping[str, str]] = None) -> list[Row]:
    """Every setting with its current value and source (a value that does not parse gives its error)."""
    env = os.environ if environ is None else environ
    rows = []
    for s in SETTINGS.values():
        src = source(s.name, env)
        try:
            rows.append(Row(s, s.text(s.parse(env.get(s.name))), src))
        except SettingError as e:
            rows.append(Row(s, env.get(s.name, ""), src, str(e)))
    return rows


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Set settings in this process's environment for the ``with`` block (child processes see them too),
    then restore the previous state. Values are given as their typed value or text, and checked."""
    texts = {}
    for name, v in values.items():
        s = setting(name)
        texts[name] = s.text(s.parse(v if isinstance(v, str) else s.text(v)))
    prev = {name: os.environ.get(name) for name in texts}
    os.environ.update(texts)
    try:
        yield
    finally:
        for name, old in prev.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


# ---- docs/env.md --------------------------------------------------------------------------------


def _default_text(s: Setting) -> str:
    text = s.text(s.default)
    return f"`{text}`" if text else "unset"


def markdown() -> str:
    """The text of ``docs/env.md`` (``nvgemm env --markdown > docs/env.md``)."""
    lines = [
        "<!-- generated from src/nvgemm/settings.py by `nvgemm env --markdown > docs/env.md`; do not edit -->",
        "# Environment variables",
        "",
        "nvgemm reads these `NVGEMM_*` variables, and no others, through `nvgemm.settings`. An unset or empty",
        "variable means its default; a value that does not parse is an error naming the variable and the values",
        "it accepts. `nvgemm env` prints each one with its current value and where the value came from.",
        "",
        "Tags: **codegen** settings change the code a kernel template generates and are part of the AOT cache",
        "key; **runtime** settings (which kernel runs, where files go, logging) never are, so setting one never",
        "misses a precompiled kernel.",
        "",
        "| variable | type | default | tag | meaning |",
        "|---|---|---|---|---|",
    ]
    for s in SETTINGS.values():
        lines.append(f"| `{s.name}` | {s.type.name}: {s.type.accepts} | {_default_text(s)} | {s.tag} | {s.doc} |")
    codegen = [s.name for s in SETTINGS.values() if s.tag == CODEGEN]
    lines += ["", f"Codegen settings: {', '.join(f'`{n}`' for n in codegen) if codegen else 'none'}.", ""]
    return "\n".join(lines)
