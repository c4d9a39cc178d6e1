"""nvgemm.settings: parsing, lazy reads, the codegen part of the AOT key, docs/env.md, and the rule that no
other module reads ``NVGEMM_*`` from the environment."""

from __future__ import annotations

import ast
import os
import textwrap
from pathlib import Path

import pytest

from nvgemm import settings
from nvgemm.settings import CODEGEN, RUNTIME, Setting, SettingError

SRC = Path(settings.__file__).resolve().parent  # src/nvgemm
DOCS_ENV = SRC.parents[1] / "docs" / "env.md"


# ---- parsing -------------------------------------------------------------------------------------


def test_every_setting_is_named_typed_documented_and_tagged():
    assert settings.SETTINGS, "no settings declared"
    for name, s in settings.SETTINGS.items():
        assert name == s.name and name.startswith("NVGEMM_")
        assert s.tag in (CODEGEN, RUNTIME)
        assert s.doc and "\n" not in s.doc and s.type.accepts
        # the default survives a round trip through its own text (what docs/env.md and `nvgemm env` show)
        text = s.text(s.default)
        assert s.parse(text) == s.default if text else s.parse(None) == s.default


@pytest.mark.parametrize("raw, want", [
    ("1", True), ("0", False), ("true", True), ("False", False), ("yes", True), ("no", False), ("ON", True),
    ("off", False), (" 0 ", False), ("", True), (None, True),
])
def test_bool_values(raw, want):
    env = {} if raw is None else {"NVGEMM_PDL": raw}
    assert settings.get("NVGEMM_PDL", env) is want


@pytest.mark.parametrize("name, raw, accepts", [
    ("NVGEMM_PDL", "maybe", "1 or 0"),
    ("NVGEMM_SELFCHECK", "2", "1 or 0"),
    ("NVGEMM_PRECOMPILE_JOBS", "four", "an integer >= 0"),
    ("NVGEMM_PRECOMPILE_JOBS", "-1", "an integer >= 0"),
    ("NVGEMM_VLLM_LOG_LEVEL", "LOUD", "DEBUG, INFO, WARNING"),
    ("NVGEMM_INDUCTOR_CHOICES", ",", "comma-separated names"),
])
def test_bad_value_names_the_variable_and_the_allowed_values(monkeypatch, name, raw, accepts):
    monkeypatch.setenv(name, raw)
    with pytest.raises(SettingError, match=f"{name}={raw!r}: expected {accepts}"):
        getattr(settings, name)


def test_values_are_typed_and_default_when_unset_or_empty():
    env = {"NVGEMM_BACKEND": " emulated ", "NVGEMM_INDUCTOR_CHOICES": "emulated, cublaslt,",
           "NVGEMM_PRECOMPILE_JOBS": "3", "NVGEMM_CACHE_DIR": "~/kc", "NVGEMM_VLLM_LOG_LEVEL": "warning",
           "NVGEMM_VLLM_DUMP": ""}
    assert settings.get("NVGEMM_BACKEND", env) == "emulated"
    assert settings.get("NVGEMM_INDUCTOR_CHOICES", env) == ("emulated", "cublaslt")
    assert settings.get("NVGEMM_PRECOMPILE_JOBS", env) == 3
    assert settings.get("NVGEMM_CACHE_DIR", env) == Path("~/kc").expanduser()
    assert settings.get("NVGEMM_VLLM_LOG_LEVEL", env) == "WARNING"
    assert settings.get("NVGEMM_VLLM_DUMP", env) is None and settings.source("NVGEMM_VLLM_DUMP", env) == "default"
    assert settings.source("NVGEMM_BACKEND", env) == "environment"
    assert settings.get("NVGEMM_VLLM", {}) is None  # tri-state: unset defers to VLLM_PLUGINS
    assert settings.get("NVGEMM_BACKEND", {}) == "" and settings.get("NVGEMM_INDUCTOR_CHOICES", {}) is None


def test_reads_are_lazy_so_setenv_takes_effect(monkeypatch):
    monkeypatch.delenv("NVGEMM_SELFCHECK", raising=False)
    assert settings.NVGEMM_SELFCHECK is True
    monkeypatch.setenv("NVGEMM_SELFCHECK", "0")
    assert settings.NVGEMM_SELFCHECK is False
    monkeypatch.setenv("NVGEMM_SELFCHECK", "1")  # a text seen before: answered from the parse memo
    assert settings.NVGEMM_SELFCHECK is True
    monkeypatch.setenv("NVGEMM_SELFCHECK", "0")
    assert settings.NVGEMM_SELFCHECK is False and settings.get("NVGEMM_SELFCHECK", {}) is True
    with pytest.raises(AttributeError, match=r"settings.NVGEMM_SELFCHECK is read from the environment"):
        settings.NVGEMM_SELFCHECK = True


def test_unknown_names_are_errors():
    with pytest.raises(AttributeError, match="NVGEMM_PDLL is not a declared setting"):
        settings.NVGEMM_PDLL  # noqa: B018
    with pytest.raises(KeyError, match="NVGEMM_NOPE is not an nvgemm setting"):
        settings.get("NVGEMM_NOPE")
    assert settings.unknown({"NVGEMM_PDLL": "0", "NVGEMM_PDL": "0", "HOME": "/h"}) == ["NVGEMM_PDLL"]


def test_declarations_are_checked():
    with pytest.raises(ValueError, match="tag 'sometimes'"):
        Setting("NVGEMM_X", settings.BOOL, False, "sometimes", "doc")
    with pytest.raises(ValueError, match="must start with NVGEMM_"):
        Setting("X", settings.BOOL, False, RUNTIME, "doc")


def test_override_sets_checks_and_restores(monkeypatch):
    monkeypatch.setenv("NVGEMM_BACKEND", "emulated")
    monkeypatch.delenv("NVGEMM_SELFCHECK", raising=False)
    with settings.override(NVGEMM_BACKEND="emu_sm90", NVGEMM_SELFCHECK=False):
        assert settings.NVGEMM_BACKEND == "emu_sm90" and os.environ["NVGEMM_SELFCHECK"] == "0"
    assert settings.NVGEMM_BACKEND == "emulated" and "NVGEMM_SELFCHECK" not in os.environ
    with pytest.raises(SettingError, match="NVGEMM_PDL='maybe'"):
        with settings.override(NVGEMM_PDL="maybe"):
            pass
    assert "NVGEMM_PDL" not in os.environ or os.environ["NVGEMM_PDL"] != "maybe"


# ---- the AOT key takes exactly the codegen settings ------------------------------------------------


@pytest.fixture
def codegen_setting(monkeypatch):
    """A codegen setting declared for the test (nvgemm has none today; the mechanism must still key one)."""
    s = Setting("NVGEMM_TEST_EPI_TILE", settings.COUNT, 0, CODEGEN, "test-only codegen switch")
    monkeypatch.setitem(settings.SETTINGS, s.name, s)
    return s


def test_codegen_env_is_exactly_the_codegen_settings(codegen_setting):
    every_runtime = {s.name: s.text(s.default) or "x" for s in settings.SETTINGS.values() if s.tag == RUNTIME}
    env = {**every_runtime, "NVGEMM_TEST_EPI_TILE": " 32", "NVGEMM_UNDECLARED": "1", "HOME": "/h"}
    env["NVGEMM_INDUCTOR_CHOICES"] = "emulated"
    env["NVGEMM_VLLM_LOG_LEVEL"] = "INFO"
    env["NVGEMM_PRECOMPILE_JOBS"] = "2"
    env["NVGEMM_PDL"] = env["NVGEMM_SELFCHECK"] = env["NVGEMM_NVMMH"] = env["NVGEMM_SM90_ONE_COPY"] = "0"
    assert settings.codegen_env(env) == (("NVGEMM_TEST_EPI_TILE", "32"),)
    assert settings.codegen_env({}) == ()
    with pytest.raises(SettingError, match="NVGEMM_TEST_EPI_TILE='wide'"):
        settings.codegen_env({"NVGEMM_TEST_EPI_TILE": "wide"})


def test_cache_key_follows_codegen_settings_only(codegen_setting):
    from nvgemm.aot.compile_spec import capture_codegen_env, compile_key, make_spec
    from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig

    def key(env):
        return compile_key(make_spec("sm100_nvfp4_gemm", Sm100Nvfp4GemmConfig(), "sm_100a", environ=env), "f" * 16)

    clean = key({})
    for s in settings.SETTINGS.values():
        if s.tag == RUNTIME:
            raw = {"NVGEMM_INDUCTOR_CHOICES": "emulated", "NVGEMM_VLLM_LOG_LEVEL": "DEBUG",
                   "NVGEMM_PRECOMPILE_JOBS": "2"}.get(s.name, "0" if s.type is settings.BOOL else "x")
            assert key({s.name: raw}) == clean, f"runtime setting {s.name} changed the AOT cache key"
    assert key({"NVGEMM_TEST_EPI_TILE": "32"}) != clean
    assert capture_codegen_env({"NVGEMM_TEST_EPI_TILE": "32", "CUTE_DSL_LINEINFO": "1"}) == (
        ("CUTE_DSL_LINEINFO", "1"), ("NVGEMM_TEST_EPI_TILE", "32"))


# ---- docs/env.md -------------------------------------------------------------------------------------


def test_docs_env_md_is_generated_from_settings():
    assert DOCS_ENV.is_file(), f"{DOCS_ENV} is missing: nvgemm env --markdown > docs/env.md"
    assert DOCS_ENV.read_text() == settings.markdown(), (
        "docs/env.md is out of date with src/nvgemm/settings.py: nvgemm env --markdown > docs/env.md")


def test_markdown_lists_every_setting_once(codegen_setting):
    md = settings.markdown()
    for name in settings.SETTINGS:
        assert md.count(f"| `{name}` |") == 1
    assert "Codegen settings: `NVGEMM_TEST_EPI_TILE`." in md


# ---- nobody else reads NVGEMM_* ----------------------------------------------------------------------


def _nvgemm_text(node: ast.AST, consts: dict[str, str]) -> bool:
    """Whether ``node`` evaluates to a string naming an NVGEMM_* variable (or the NVGEMM_ prefix)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.startswith("NVGEMM_")
    if isinstance(node, ast.JoinedStr):  # f"NVGEMM_{x}"
        return bool(node.values) and _nvgemm_text(node.values[0], consts)
    if isinstance(node, ast.BinOp):  # "NVGEMM_" + x, "NVGEMM_%s" % x
        return _nvgemm_text(node.left, consts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return _nvgemm_text(node.func.value, consts)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_nvgemm_text(e, consts) for e in node.elts)
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name is not None and name in consts


def _string_constants(trees: dict[str, ast.AST]) -> dict[str, str]:
    """Names bound anywhere in the package (module or class level) to an NVGEMM_* string or prefix tuple:
    ``ENV = "NVGEMM_VLLM"`` is followed when another module imports it."""
    consts: dict[str, str] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if _nvgemm_text(node.value, {}):
                    for t in targets:
                        if isinstance(t, ast.Name):
                            consts[t.id] = ast.unparse(node.value)
    return consts


def _is_environ(node: ast.AST, aliases: set[str]) -> bool:
    """``os.environ`` / ``environ`` (from os) / ``os.environb`` / a local name bound to one of them."""
    if isinstance(node, ast.Attribute) and node.attr in ("environ", "environb"):
        return True
    return isinstance(node, ast.Name) and (node.id in ("environ", "environb") or node.id in aliases)


def env_accesses(tree: ast.AST, consts: dict[str, str]) -> list[tuple[int, str]]:
    """``(line, what)`` of every place ``tree`` reads or writes an NVGEMM_* variable in the environment:
    ``os.environ[...]`` / ``.get`` / ``.pop`` / ``.setdefault``, ``os.getenv`` / ``putenv`` / ``unsetenv``,
    ``... in os.environ``, and a loop over the environment filtered by an NVGEMM_ prefix."""
    aliases: set[str] = set()
    for node in ast.walk(tree):  # env = os.environ if environ is None else environ
        if isinstance(node, ast.Assign) and any(_is_environ(n, set()) for n in ast.walk(node.value)):
            aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and _is_environ(node.value, aliases):
            key = node.slice
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and _is_environ(f.value, aliases) and f.attr in (
                    "get", "pop", "setdefault") and node.args:
                key = node.args[0]
            elif ((isinstance(f, ast.Attribute) and f.attr in ("getenv", "putenv", "unsetenv")
                   or isinstance(f, ast.Name) and f.id in ("getenv", "putenv", "unsetenv")) and node.args):
                key = node.args[0]
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
                and any(_is_environ(c, aliases) for c in node.comparators):
            key = node.left
        if key is not None and _nvgemm_text(key, consts):
            found.append((node.lineno, ast.unparse(node)))
        # prefix loops: for k in os.environ / os.environ.items() / dict(os.environ) ... k.startswith("NVGEMM_")
        if isinstance(node, ast.For):
            iters = [node.iter]
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            iters = [g.iter for g in node.generators]
        else:
            iters = []
        if any(_is_environ(n, aliases) for it in iters for n in ast.walk(it)):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) \
                        and sub.func.attr == "startswith" and sub.args and _nvgemm_text(sub.args[0], consts):
                    found.append((sub.lineno, ast.unparse(sub)))
    return sorted(set(found))


def scan(src_root: Path, allowed: tuple[str, ...] = ("settings.py",)) -> dict[str, list[tuple[int, str]]]:
    trees = {str(p.relative_to(src_root)): ast.parse(p.read_text(), str(p))
             for p in sorted(src_root.rglob("*.py")) if "__pycache__" not in p.parts}
    consts = _string_constants({k: v for k, v in trees.items() if k not in allowed})
    hits = {rel: env_accesses(tree, consts) for rel, tree in trees.items() if rel not in allowed}
    return {rel: h for rel, h in hits.items() if h}


def test_only_settings_reads_nvgemm_variables():
    hits = scan(SRC)
    assert not hits, "read NVGEMM_* through nvgemm.settings instead:\n" + "\n".join(
        f"  src/nvgemm/{rel}:{line}: {what}" for rel, h in hits.items() for line, what in h)


PLANTED = {
    "get": 'import os\nv = os.environ.get("NVGEMM_PDL", "1")\n',
    "subscript": 'import os\nv = os.environ["NVGEMM_PDL"]\n',
    "getenv": 'import os\nv = os.getenv("NVGEMM_PDL")\n',
    "from_import": 'from os import environ, getenv\nv = environ.get("NVGEMM_PDL") or getenv("NVGEMM_X")\n',
    "fstring": 'import os\ndef f(x):\n    return os.environ.get(f"NVGEMM_{x}")\n',
    "concat": 'import os\ndef f(x):\n    return os.environ.get("NVGEMM_" + x)\n',
    "constant": 'import os\nENV = "NVGEMM_VLLM"\ndef f():\n    return os.environ.get(ENV)\n',
    "alias": 'import os\ndef f(environ=None):\n    env = os.environ if environ is None else environ\n'
             '    return env.get("NVGEMM_VLLM")\n',
    "membership": 'import os\nv = "NVGEMM_PDL" in os.environ\n',
    "write": 'import os\nos.environ["NVGEMM_BACKEND"] = "emulated"\n',
    "prefix_loop": 'import os\nv = {k: x for k, x in os.environ.items() if k.startswith("NVGEMM_")}\n',
    "prefix_for": 'import os\nP = ("NVGEMM_", "CUTE_DSL_")\nfor k in os.environ:\n    if k.startswith(P):\n'
                  '        print(k)\n',
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_scan_finds_a_planted_read(tmp_path, case):
    (tmp_path / "settings.py").write_text('import os\nv = os.environ.get("NVGEMM_PDL")\n')
    (tmp_path / "mod.py").write_text(PLANTED[case])
    hits = scan(tmp_path)
    assert list(hits) == ["mod.py"], hits


def test_scan_ignores_what_is_not_an_nvgemm_read(tmp_path):
    (tmp_path / "mod.py").write_text(textwrap.dedent("""
        import os
        VERSION_NODE = "NVGEMM_EMU_1"   # a symbol name, not a variable
        def f():
            d = os.environ.get("CUTE_DSL_DUMP_DIR")
            raise RuntimeError(f"set NVGEMM_DEBUG=1 for the traceback ({d})")
        dsl = [k for k in os.environ if k.startswith(("CUTE_DSL_", "CUTE_EXPERIMENTAL_DSL_"))]
    """))
    assert scan(tmp_path) == {}
