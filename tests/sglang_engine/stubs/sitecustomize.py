"""Loads the test-only import stubs (``_sglang_test_stubs``) into every SGLang engine process the tests start."""

import _sglang_test_stubs  # noqa: F401
