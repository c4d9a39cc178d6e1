"""Shared test configuration: GPU markers skip cleanly on machines without that GPU."""

from __future__ import annotations

import hashlib
import os
import tempfile

# CuTeDSL writes kept PTX/CUBIN as <dump dir>/<kernel function name>.<arch>.ptx and its dump dir
# defaults to the working directory, read once when cutlass first initialises. The file name does
# not depend on the kernel config, so two test processes in one checkout (CI runs two torch stages
# side by side) would read each other's PTX. One private dump dir per test process, set before any
# test module imports cutlass.
os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.mkdtemp(prefix="nvgemm_cute_dump_"))

import pytest
import torch

try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci", max_examples=60, deadline=None, derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # hypothesis is a dev dependency
    pass


def _cuda_capability():
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


def _slow_opted_in(config) -> bool:
    """``slow`` tests (the long sweeps beside each fast representative subset) run only when asked:
    ``pytest -m slow`` (or any -m expression naming it) or ``NVGEMM_TEST_SLOW=1``."""
    return "slow" in (config.getoption("-m") or "") or os.environ.get("NVGEMM_TEST_SLOW") == "1"


def pytest_collection_modifyitems(config, items):
    cap = _cuda_capability()
    run_slow = _slow_opted_in(config)
    for item in items:
        if item.get_closest_marker("slow") and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow: opt-in with pytest -m slow or NVGEMM_TEST_SLOW=1"))
        # markers, not item.keywords: keywords also hold every parent directory's name, so a
        # checkout in a directory called "sm100" or "gpu" would skip the whole suite
        if item.get_closest_marker("gpu") and cap is None:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if item.get_closest_marker("sm100") and (cap is None or cap[0] != 10):
            item.add_marker(pytest.mark.skip(reason="needs an sm_100-family (Blackwell datacenter) GPU"))
        if item.get_closest_marker("sm90") and (cap is None or cap != (9, 0)):
            item.add_marker(pytest.mark.skip(reason="needs an sm_90 (Hopper) GPU"))


@pytest.fixture
def seed(request) -> int:
    """A seed derived from the test id: reproducible, different per test."""
    s = int.from_bytes(hashlib.sha256(request.node.nodeid.encode()).digest()[:4], "little")
    torch.manual_seed(s)
    return s
