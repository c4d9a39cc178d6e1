"""SGLang's engine startup with the plugin off, on an untested SGLang, and with a planted failure in register().

* plugin off (NVGEMM_SGLANG unset, SGLANG_PLUGINS not naming it): SGLang's own ``ModelOptFp4LinearMethod``
  serves the NVFP4 export; on this CPU its native W4A4 GEMM backends do not exist, so startup fails with
  SGLang's own message, and nvgemm logged nothing and dumped nothing;
* opted in on an untested SGLang (the version reported by package metadata is planted by the test stub):
  startup stops with nvgemm's message naming the tested versions, before any model is built;
* opted in and ``register()`` fails inside (the import of the plugin's method module is planted to fail):
  startup stops with nvgemm's message and the cause -- SGLang logs and swallows a plugin's ``Exception``,
  which here would mean SGLang's own kernels serving an opted-in user without notice.
"""

from __future__ import annotations

import pytest

pytest.importorskip("sglang")

from conftest import serve  # noqa: E402

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("startup")


def test_plugin_off_loads_the_stock_path(checkpoints, work):
    _, dump, log = serve(checkpoints["NVFP4"], 1, work, "off", env={"NVGEMM_SGLANG": None, "SGLANG_PLUGINS": None},
                         expect_failure=True)
    assert log.startswith("exit code ") and not log.startswith("exit code 0\n"), log[-3000:]
    # SGLang's own W4A4 method was chosen and refuses this device (sglang modelopt_quant.py, process_weights_after_loading)
    assert "ModelOpt NVFP4 native dense GEMM backends require SM100+" in log, log[-3000:]
    assert "[nvgemm]" not in log and not dump.exists()


def test_untested_sglang_stops_startup(checkpoints, work):
    _, dump, log = serve(checkpoints["NVFP4"], 1, work, "untested", env={"NVGEMM_TEST_SGLANG_VERSION": "0.5.24"},
                         expect_failure=True)
    assert not log.startswith("exit code 0\n"), log[-3000:]
    assert "nvgemm's SGLang plugin supports SGLang 0.5.23, found SGLang 0.5.24" in log, log[-3000:]
    assert "could not install itself" in log and "SGLang layer" not in log and not dump.exists()
    assert "Load weight begin" not in log  # stopped before any model was built


def test_planted_failure_in_register_stops_startup(checkpoints, work):
    _, dump, log = serve(checkpoints["NVFP4"], 1, work, "planted",
                         env={"NVGEMM_TEST_PLANT_IMPORT_ERROR": "nvgemm.integrations.sglang.method"},
                         expect_failure=True)
    assert not log.startswith("exit code 0\n"), log[-3000:]
    assert ("nvgemm: the SGLang plugin was enabled (NVGEMM_SGLANG=1 or SGLANG_PLUGINS names nvgemm) but could not "
            "install itself, so SGLang would silently serve with its own kernels; stopping. Cause: ImportError: "
            "planted failure: importing nvgemm.integrations.sglang.method fails") in log, log[-3000:]
    assert "Failed to execute general plugin" not in log  # not swallowed by SGLang's plugin loader
    assert "SGLang layer" not in log and not dump.exists()
