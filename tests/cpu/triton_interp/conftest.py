"""Interpreter tests of nvgemm's Triton kernels: only meaningful with TRITON_INTERPRET=1.

``tests/cpu/test_triton_interpreter.py`` runs each ``interp_*.py`` here in a subprocess with the
variable set; in any other process these files are not collected (their kernels would compile).
"""

import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":
    collect_ignore_glob = ["interp_*.py"]


def pytest_collection_modifyitems(config, items):
    # numpy warns on IEEE overflow (exp -> inf) exactly where the GPU silently saturates
    for item in items:
        item.add_marker(pytest.mark.filterwarnings("ignore::RuntimeWarning"))
