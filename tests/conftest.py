"""Shared test configuration: GPU markers skip cleanly on machines without that GPU."""

from __future__ import annotations

import hashlib
import os

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


def pytest_collection_modifyitems(config, items):
    cap = _cuda_capability()
    for item in items:
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
