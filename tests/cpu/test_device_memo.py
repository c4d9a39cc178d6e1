"""Per-device tensor memos (index vectors built once per device) never serve a FakeTensor outside its mode."""

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from nvgemm.templates.sm100_w4a4.launch import gate_up_permutation
from nvgemm.templates.sm90_moe.launch import identity_rows
from nvgemm.templates.sm90_w4a16.launch import _int32_dummy


def _real(t):
    return isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor)


def test_a_fake_mode_memo_stays_in_its_mode():
    """A memo first filled under one FakeTensorMode: a second mode gets its own tensors, a real call a real
    tensor with the right values (torch reference), and a mode reuses its own entry (no rebuild per call)."""
    n = 6
    with FakeTensorMode() as m1:
        p1, i1, d1 = gate_up_permutation(n, "cpu"), identity_rows(n, torch.device("cpu")), _int32_dummy(torch.device("cpu"))
        assert gate_up_permutation(n, "cpu") is p1 and _int32_dummy(torch.device("cpu")) is d1
    with FakeTensorMode() as m2:
        p2, i2 = gate_up_permutation(n, "cpu"), identity_rows(n, torch.device("cpu"))
        assert p2.fake_mode is m2 and i2.fake_mode is m2 and p1.fake_mode is m1 and i1.fake_mode is m1
        p2 + 1  # usable in its mode (a tensor of m1 here raises "Mixing fake modes")
    p, i, d = gate_up_permutation(n, "cpu"), identity_rows(n, torch.device("cpu")), _int32_dummy(torch.device("cpu"))
    assert _real(p) and _real(i) and _real(d)
    assert p.tolist() == [0, 3, 1, 4, 2, 5] and i.tolist() == list(range(n)) and d.tolist() == [0]
