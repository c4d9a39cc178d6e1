"""Test-only import stubs for SGLang's Python engine on CPU (on PYTHONPATH of the engine processes only).

SGLang 0.5.23 imports two packages this CPU test environment cannot provide:

* ``sgl_kernel`` (SGLang's CPU kernel library; not on PyPI for CPU, built from SGLang's git tree):
  imported when ``is_cpu()``; the engine paths the tests run (torch_native attention) never call it,
  and every attribute of the stub raises when called, so a call would fail the test, not fake a result;
* ``torchvision`` (PyPI's wheel does not load beside torch 2.13.0+cpu): imported by model-config
  modules, never used by the text-only models served here.

Two planted conditions, each set by one test through the environment:

* ``NVGEMM_TEST_SGLANG_VERSION=X``: ``importlib.metadata.version("sglang")`` answers X (an untested SGLang);
* ``NVGEMM_TEST_PLANT_IMPORT_ERROR=module``: importing that module raises ImportError (a failure
  inside the plugin's ``register()``).
"""

import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import sys
import types

_STUBBED = ("sgl_kernel", "torchvision")


class _Attr:
    """Any attribute of a stubbed package: more attributes below it, and an error when called."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Attr(f"{self._name}.{name}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"test stub: {self._name} was called (stubbed in tests/sglang_engine/stubs)")

    def __repr__(self):
        return f"<test stub {self._name}>"


class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Attr(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in _STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        planted = os.environ.get("NVGEMM_TEST_PLANT_IMPORT_ERROR")
        if planted and fullname == planted:
            raise ImportError(f"planted failure: importing {fullname} fails (NVGEMM_TEST_PLANT_IMPORT_ERROR)")
        return None

    def create_module(self, spec):
        m = _Stub(spec.name)
        m.__path__ = []
        m.__version__ = "0.0.0"
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())

_fake_version = os.environ.get("NVGEMM_TEST_SGLANG_VERSION")
if _fake_version:
    _real_version = importlib.metadata.version

    def _version(name):
        return _fake_version if name == "sglang" else _real_version(name)

    importlib.metadata.version = _version
