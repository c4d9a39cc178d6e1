"""Bound decode calls (:class:`nvgemm.dispatch.registry.Binding`): a repeat call of a layer skips the complete
path, and never with stale operands.

Through the production sm100 host path on a stand-in device (:func:`nvgemm.testing.host_path_stand_in`: the
kernel's real argument packing, launch not run), the launch's packed arguments are read back (pointers; the
alpha buffer's fp32 value read from host memory, the tensors being CPU tensors):

* a warm call runs the bound launcher, not the argument preparation;
* a different weight tensor (same shape, metadata, values) is launched with its own pointer;
* an in-place update of ``weight_scale_2`` / ``input_scale`` re-derives alpha before the launch;
* an in-place write of a bad value into a host scale is refused (the complete path's value check runs);
* another thread, or changed forcing settings, do not take this thread's binding.
"""

from __future__ import annotations

import ctypes
import threading

import pytest
import torch

import nvgemm  # noqa: F401  (registers the ops)
import nvgemm.templates.sm100_w4a4.backend as SB
from nvgemm.core.formats import quantize_weight, to_blocked
from nvgemm.dispatch import registry as B
from nvgemm.testing import host_path_stand_in

ALPHA = 5  # ABI position of alpha in the sm100 launch (a, b, sfa, sfb, out, alpha, ...)
N, K = 256, 512


def _layer(seed=0):
    g = torch.Generator().manual_seed(seed)
    q = quantize_weight(torch.randn(N, K, generator=g))
    return q.packed, to_blocked(q.scale), q.global_scale.reshape(()).float(), torch.tensor(0.01)


def _alpha_at(ptr: int) -> float:
    return ctypes.c_float.from_address(ptr).value


def _linear(x, w, s, ws2, ins):
    return torch.ops.nvgemm.nvfp4_linear(x, w, s, ws2, ins, None, None, "none", None)


def test_warm_call_is_bound_and_skips_preparation(monkeypatch):
    w, s, ws2, ins = _layer()
    x = torch.randn(1, K).to(torch.bfloat16)
    with host_path_stand_in("sm100") as rec:
        _linear(x, w, s, ws2, ins)  # first call: complete path, then bound

        def no_prepare(*a, **k):
            raise AssertionError("a warm call prepared its arguments again")
        monkeypatch.setattr(SB, "prepare_sm100_args", no_prepare)
        rec.clear()
        for _ in range(3):
            _linear(x, w, s, ws2, ins)
        assert rec.events == ["quantize", "gemm:sm100_nvfp4_gemm"] * 3
        assert len({p[ALPHA] for p in rec.pointers}) == 1


def test_a_different_weight_tensor_is_not_served_by_the_binding():
    w, s, ws2, ins = _layer()
    x = torch.randn(1, K).to(torch.bfloat16)
    with host_path_stand_in("sm100") as rec:
        _linear(x, w, s, ws2, ins)
        _linear(x, w, s, ws2, ins)
        w2 = w.clone()  # same shape, strides, dtype, alignment and values: another buffer
        rec.clear()
        _linear(x, w2, s, ws2, ins)
        _linear(x, w, s, ws2, ins)
        ptrs = {w.data_ptr(), w2.data_ptr()}
        launched = [next(p for p in call if p in ptrs) for call in rec.pointers]
        assert launched == [w2.data_ptr(), w.data_ptr()]


@pytest.mark.parametrize("which", ["weight_scale_2", "input_scale"])
def test_an_in_place_scale_update_re_derives_alpha(which):
    w, s, ws2, ins = _layer(1)
    x = torch.randn(1, K).to(torch.bfloat16)
    with host_path_stand_in("sm100") as rec:
        _linear(x, w, s, ws2, ins)
        rec.clear()
        _linear(x, w, s, ws2, ins)
        before = _alpha_at(rec.pointers[-1][ALPHA])
        assert before == pytest.approx(float(ws2) * float(ins), rel=1e-6)
        (ws2 if which == "weight_scale_2" else ins).mul_(4.0)
        rec.clear()
        _linear(x, w, s, ws2, ins)
        _linear(x, w, s, ws2, ins)
        for call in rec.pointers:
            assert _alpha_at(call[ALPHA]) == pytest.approx(4.0 * before, rel=1e-6)


def test_a_bad_value_written_in_place_is_refused():
    w, s, ws2, ins = _layer(2)
    x = torch.randn(1, K).to(torch.bfloat16)
    with host_path_stand_in("sm100"):
        _linear(x, w, s, ws2, ins)
        _linear(x, w, s, ws2, ins)
        ins.fill_(float("nan"))
        with pytest.raises(ValueError, match="input_scale"):
            _linear(x, w, s, ws2, ins)
        ins.fill_(0.01)
        ws2.fill_(-1.0)
        with pytest.raises(ValueError, match="weight_scale_2"):
            _linear(x, w, s, ws2, ins)


def test_requant_in_place_next_scale_is_seen():
    w, s, ws2, ins = _layer(3)
    nxt = torch.tensor(0.02)
    x = torch.randn(1, K).to(torch.bfloat16)
    with host_path_stand_in("sm100") as rec:
        call = lambda: torch.ops.nvgemm.nvfp4_linear_requant(x, w, s, ws2, ins, None, nxt, None)  # noqa: E731
        call()
        rec.clear()
        call()
        p = rec.pointers[-1][ALPHA]
        assert ctypes.c_float.from_address(p + 4).value == pytest.approx(0.02)  # alpha, then the next scale
        nxt.fill_(0.05)
        rec.clear()
        call()
        p = rec.pointers[-1][ALPHA]
        assert ctypes.c_float.from_address(p + 4).value == pytest.approx(0.05)
        nxt.fill_(float("inf"))
        with pytest.raises(ValueError, match="input_scale"):
            call()


def test_bindings_are_per_thread_and_per_forcing_setting(monkeypatch):
    w, s, ws2, ins = _layer(4)
    x = torch.randn(1, K).to(torch.bfloat16)
    with host_path_stand_in("sm100"):
        _linear(x, w, s, ws2, ins)
        n = len(B._BINDINGS)
        t = threading.Thread(target=_linear, args=(x, w, s, ws2, ins))
        t.start()
        t.join()
        assert len(B._BINDINGS) == n + 1  # the other thread bound its own
        monkeypatch.setenv("NVGEMM_BACKEND", "emulated")
        assert torch.ops.nvgemm.nvfp4_linear(x, w, s, ws2, ins, None, None, "none", None).shape == (1, N)
        assert B.last_selected() == "emulated"


def test_a_binding_goes_with_its_weight():
    w, s, ws2, ins = _layer(5)
    x = torch.randn(1, K).to(torch.bfloat16)
    with host_path_stand_in("sm100"):
        _linear(x, w, s, ws2, ins)
        n = len(B._BINDINGS)
        del w
        assert len(B._BINDINGS) == n - 1


def test_a_grown_split_k_pool_is_taken_by_the_bound_call():
    """When the shared split-K pool replaces the stream's pair (a larger problem grew it), the bound call
    launches with the new pair, never the retired one."""
    from nvgemm.templates.common.workspace import WORKSPACES

    g = torch.Generator().manual_seed(6)
    q = quantize_weight(torch.randn(4096, 4096, generator=g) * 0.05)
    w, s, ws2, ins = q.packed, to_blocked(q.scale), q.global_scale.reshape(()).float(), torch.tensor(0.01)
    x = torch.randn(1, 4096).to(torch.bfloat16)
    with host_path_stand_in("sm100") as rec:
        _linear(x, w, s, ws2, ins)
        rec.clear()
        _linear(x, w, s, ws2, ins)
        ws_ptr = rec.pointers[-1][8]
        assert ws_ptr, "this problem must run split-K (a workspace pointer)"
        old = WORKSPACES.current("cpu", 0)
        assert old is not None and old[0].data_ptr() == ws_ptr
        new = WORKSPACES.get(torch.device("cpu"), old[0].numel() * 4, old[1].numel() * 4, 0)
        assert new is not old
        rec.clear()
        _linear(x, w, s, ws2, ins)
        assert (rec.pointers[-1][8], rec.pointers[-1][9]) == (new[0].data_ptr(), new[1].data_ptr())


def test_inference_tensor_layers_are_not_bound():
    """Inference tensors have no version counter (an in-place write inside inference mode could not be seen):
    such a layer is never bound, it takes the complete path on every call."""
    with torch.inference_mode():
        w, s, ws2, ins = _layer(7)
        x = torch.randn(1, K).to(torch.bfloat16)
    with host_path_stand_in("sm100") as rec, torch.inference_mode():
        n = len(B._BINDINGS)
        for _ in range(2):
            _linear(x, w, s, ws2, ins)
        assert len(B._BINDINGS) == n
        assert rec.events == ["quantize", "gemm:sm100_nvfp4_gemm"] * 2


def test_prequant_requant_warm_call_is_bound(monkeypatch):
    """``nvgemm::nvfp4_linear_prequant_requant`` (the gate_up GEMM fed the fused norm quantizer's codes) takes the
    per-problem plan and binding of the other ops: a warm call launches the bound launch (no argument preparation)
    on the codes it is given, and an in-place update of the next layer's scale is seen."""
    from nvgemm.core.formats import quantize_activation

    g = torch.Generator().manual_seed(8)
    q = quantize_weight(torch.randn(2 * N, K, generator=g))
    w, s, ws2 = q.packed, to_blocked(q.scale), q.global_scale.reshape(()).float()
    ins, nxt = torch.tensor(0.01), torch.tensor(0.02)
    with host_path_stand_in("sm100") as rec:
        def call(seed):
            packed, sx = quantize_activation(torch.randn(1, K, generator=torch.Generator().manual_seed(seed)), ins)
            scales = to_blocked(sx).reshape(-1)
            torch.ops.nvgemm.nvfp4_linear_prequant_requant(packed, scales, w, s, ws2, ins, None, nxt, torch.bfloat16)
            return packed, scales

        call(0)  # complete path, then bound

        def no_prepare(*a, **k):
            raise AssertionError("a warm call prepared its arguments again")
        monkeypatch.setattr(SB, "prepare_sm100_requant_args", no_prepare)
        rec.clear()
        for i in range(1, 3):
            packed, scales = call(i)
            assert packed.data_ptr() in rec.pointers[-1] and scales.data_ptr() in rec.pointers[-1]
        assert rec.events == ["gemm:sm100_nvfp4_gemm"] * 2  # no quantizer: the codes arrive quantized
        nxt.fill_(0.05)  # the binding sees the in-place write and re-derives (the complete path prepares again)
        monkeypatch.undo()
        rec.clear()
        call(3)
        assert ctypes.c_float.from_address(rec.pointers[-1][ALPHA] + 4).value == pytest.approx(0.05)
