"""The emulator's full sweep runs only when asked for (``-m emulator_full``)."""

import pytest


def pytest_collection_modifyitems(config, items):
    if "emulator_full" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="the emulator's full sweep is opt-in: pytest -m emulator_full")
    for item in items:
        if item.get_closest_marker("emulator_full"):
            item.add_marker(skip)
