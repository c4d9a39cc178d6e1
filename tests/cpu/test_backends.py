"""Backend selection: the first-use check keeps a wrong kernel from serving, with one warning."""

from __future__ import annotations

import pytest
import torch

import nvgemm  # noqa: F401
from nvgemm.formats import quantize_weight, to_blocked
from nvgemm.ops import nvfp4_linear_emulated
from nvgemm.runtime import backends as B


@pytest.fixture
def fake_backend():
    names = []

    def add(name, run, priority=50):
        B.register_backend(B.Backend(name=name, priority=priority, supports=lambda p: None, run=run))
        names.append(name)

    yield add
    for n in names:
        B.unregister_backend(n)
    B._CHECKED.clear()


def _call(m=3, n=64, k=64, w4a4=True):
    x = torch.randn(m, k).to(torch.bfloat16)
    q = quantize_weight(torch.randn(n, k))
    ins = torch.tensor(0.003) if w4a4 else None
    return (x, q.packed, to_blocked(q.scale), q.global_scale, ins, None, None, "none", None)


def test_wrong_kernel_is_disabled_and_emulated_serves(fake_backend):
    calls = []

    def garbage(*args):
        calls.append(1)
        return nvfp4_linear_emulated(*args) * 1.5  # plausible-looking, wrong

    fake_backend("garbage_kernel", garbage)
    args = _call()
    with pytest.warns(RuntimeWarning, match="garbage_kernel disagrees with the emulated op"):
        out = torch.ops.nvgemm.nvfp4_linear(*args)
    assert torch.equal(out, nvfp4_linear_emulated(*args))
    assert calls == [1]  # ran once, in the check, never again for this problem
    torch.ops.nvgemm.nvfp4_linear(*args)
    assert calls == [1]


def test_raising_kernel_is_disabled(fake_backend):
    def broken(*args):
        raise RuntimeError("launch failed")

    fake_backend("broken_kernel", broken)
    args = _call(w4a4=False)
    with pytest.warns(RuntimeWarning, match="broken_kernel raised RuntimeError: launch failed"):
        out = torch.ops.nvgemm.nvfp4_linear(*args)
    assert torch.equal(out, nvfp4_linear_emulated(*args))


def test_correct_kernel_is_chosen_and_check_can_be_disabled(fake_backend, monkeypatch):
    ran = []

    def good(*args):
        ran.append(1)
        return nvfp4_linear_emulated(*args)

    fake_backend("good_kernel", good)
    args = _call()
    torch.ops.nvgemm.nvfp4_linear(*args)
    assert len(ran) == 2  # the check, then the real call
    assert nvgemm.NVFP4Linear  # noqa: B018
    p = B.LinearProblem(m=3, n=64, k=64, device_type="cpu", capability=None, weight_only=False,
                        x_dtype=torch.bfloat16, out_dtype=torch.bfloat16, alpha="scalar", bias=False,
                        activation="none", residual=False)
    assert B.select_backend(p).name == "good_kernel"
    B._CHECKED.clear()
    monkeypatch.setenv("NVGEMM_SELFCHECK", "0")
    fake_backend("garbage2", lambda *a: nvfp4_linear_emulated(*a) * 2, priority=60)
    assert B.select_backend(p).name == "garbage2"  # unchecked when the user turns checking off
