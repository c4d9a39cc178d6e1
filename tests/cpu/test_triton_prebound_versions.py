"""The pre-bound Triton launch is used only on the Triton releases it was checked against; any other release keeps
every launch on Triton's public ``kernel[grid](...)``. Runs with whatever Triton is installed (no launch)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from nvgemm.templates.triton import prebound  # noqa: E402


def test_checked_releases():
    assert prebound.triton_checked("3.9.0") and prebound.triton_checked("3.9.1+git0123")
    assert not prebound.triton_checked("3.8.0") and not prebound.triton_checked("3.10.0")
    assert not prebound.triton_checked("4.0.0")


def test_an_unchecked_triton_prebinds_nothing(monkeypatch):
    from nvgemm.templates.triton.quantize import quantize_nvfp4_kernel

    monkeypatch.setattr(prebound, "_CHECKED", False)
    assert not prebound.prebindable(quantize_nvfp4_kernel)
    with pytest.raises(TypeError, match="not a plain @triton.jit kernel"):
        prebound.PreboundLaunch(quantize_nvfp4_kernel, (1,), (None,), (0,), {})
