"""Dispatch of the fused gated-MLP ops (``nvgemm::nvfp4_linear_requant`` / ``_prequant``) through
:mod:`nvgemm.dispatch.fused`, on CPU: which backend a problem gets on a (fake) sm_100 / sm_90 GPU,
the one warning of the fallbacks, the overrides, and the first-use check (bytes for requant) keeping a
wrong kernel from serving while a correct kernel that sums in another order and computes silu another way
passes it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import nvgemm  # noqa: F401
from nvgemm.ops.fused import prequant_emulated, requant_emulated
from nvgemm.core.formats import dequantize, from_blocked, quantize_activation, quantize_weight, to_blocked
from nvgemm.core import backend as core_backend
from nvgemm.dispatch import registry as B
from nvgemm.dispatch import fused as F


def _problem(m=4, n=64, k=64, device_type="cpu", capability=None, activation="silu_mul", bias=False, alpha="scalar",
             out_dtype=torch.bfloat16):
    return B.LinearProblem(m=m, n=n, k=k, device_type=device_type, capability=capability, weight_only=False,
                           x_dtype=torch.bfloat16, out_dtype=out_dtype, alpha=alpha, bias=bias, activation=activation,
                           residual=False)


@pytest.fixture
def fake_fused():
    added = []

    def add(kind, name, run, priority=50, supports=lambda p: None):
        B.register_backend(B.Backend(name=name, priority=priority, supports=supports, run=run), kind)
        added.append((kind, name))

    yield add
    for kind, name in added:
        B.unregister_backend(name, kind)
    F._CHECKED.clear()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ("NVGEMM_BACKEND", "NVGEMM_FUSED_BACKEND", "NVGEMM_SELFCHECK"):
        monkeypatch.delenv(var, raising=False)
    core_backend._WARNED.clear()


def test_sm100_gpu_gets_the_kernels_other_gpus_the_fallbacks_with_one_warning():
    """The wiring: cutedsl_sm100 is registered for both fused ops and chosen on capability 10.x (decode M);
    elsewhere requant runs unfused (dense GEMM + quantize) and prequant emulated, each warning once."""
    sm100 = dict(device_type="cuda", capability=(10, 0))
    assert F.select_fused_backend(F.REQUANT, _problem(m=7, n=512, k=256, **sm100), check=False).name == "cutedsl_sm100"
    assert F.select_fused_backend(F.PREQUANT, _problem(m=7, n=256, k=256, activation="none", **sm100),
                                  check=False).name == "cutedsl_sm100"
    # above one swap-AB N tile of tokens (prefill): the contract's own two kernels, logged, not warned
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert F.select_fused_backend(F.REQUANT, _problem(m=200, n=512, k=256, **sm100), check=False).name == "unfused"
    hopper = dict(device_type="cuda", capability=(9, 0))
    with pytest.warns(RuntimeWarning, match=r"no fused requant kernel .* sm_90 .*needs an sm_100-family GPU.*"
                                            r"gate_up GEMM with silu_mul, then quantize_nvfp4"):
        assert F.select_fused_backend(F.REQUANT, _problem(**hopper), check=False).name == "unfused"
    with pytest.warns(RuntimeWarning, match="nvfp4_linear_prequant runs the emulated op"):
        assert F.select_fused_backend(F.PREQUANT, _problem(activation="none", **hopper), check=False).name == "emulated"

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per kind and device: no second warning
        F.select_fused_backend(F.REQUANT, _problem(**hopper), check=False)
    # CPU: the emulated reference, silently; emu_sm100 only when forced
    assert F.select_fused_backend(F.REQUANT, _problem(), check=False).name == "emulated"


def test_overrides(monkeypatch):
    sm100 = dict(device_type="cuda", capability=(10, 0))
    p = _problem(m=7, n=512, k=256, **sm100)
    monkeypatch.setenv("NVGEMM_BACKEND", "emulated")  # a fused backend name: forced for the fused ops too
    assert F.select_fused_backend(F.REQUANT, p, check=False).name == "emulated"
    monkeypatch.setenv("NVGEMM_BACKEND", "triton_w4a16")  # dense-only: no fused kernel runs instead of it
    assert F.select_fused_backend(F.REQUANT, p, check=False).name == "unfused"
    monkeypatch.setenv("NVGEMM_FUSED_BACKEND", "cutedsl_sm100")
    assert F.select_fused_backend(F.REQUANT, p, check=False).name == "cutedsl_sm100"
    with pytest.raises(RuntimeError, match="NVGEMM_FUSED_BACKEND=cutedsl_sm100 cannot run"):
        F.select_fused_backend(F.REQUANT, _problem(), check=False)  # a CPU problem
    with pytest.raises(RuntimeError, match="cannot run this nvgemm::nvfp4_linear_prequant call: bias dtype"):
        F.select_fused_backend(F.PREQUANT, p, check=False, no_kernel="bias dtype torch.float32 ...")


def _requant_call(m=5, i=32, k=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = quantize_weight(torch.randn(2 * i, k, generator=g))
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    ins = (x.float().abs().amax() / 2688).reshape(())
    return (x, q.packed, to_blocked(q.scale), q.global_scale.reshape(()), ins, None, torch.tensor(0.3 / 2688),
            torch.bfloat16)


def _reordered_requant(x, weight, weight_scale, ws2, ins, bias, gs, out_dtype=None):
    """A correct kernel computed differently from the reference: K summed in reversed 16-blocks (another fp32
    order), silu as g / (1 + exp(-g)); same quantization rule."""
    n, k = weight.shape[0], weight.shape[1] * 2
    a = dequantize(*quantize_activation(x, ins))
    w = dequantize(weight, from_blocked(weight_scale.view(torch.float8_e4m3fn), n, k // 16))
    acc = torch.zeros(x.shape[0], n)
    for b in reversed(range(k // 16)):
        acc = acc + a[:, 16 * b:16 * b + 16] @ w[:, 16 * b:16 * b + 16].t()
    pre = acc * (ws2.float() * ins.float())
    if bias is not None:
        pre = pre + bias.float()
    i = n // 2
    h = ((pre[:, :i] / (1 + torch.exp(-pre[:, :i]))) * pre[:, i:]).to(out_dtype or x.dtype)
    return torch.ops.nvgemm.quantize_nvfp4(h, gs, True)


@pytest.mark.parametrize("alpha,bias,dtype,k", [("scalar", False, torch.bfloat16, 64), ("vector", True, torch.float16, 4096)])
def test_requant_check_data_is_exact_in_any_order(alpha, bias, dtype, k):
    """The first-use check compares bytes, so its data must make a correct kernel agree exactly: the
    reordered kernel above does (K = 4096: 256 blocks summed in another order)."""
    p = _problem(m=9, n=96, k=k, alpha=alpha, bias=bias, out_dtype=dtype)
    args = F.requant_selfcheck_inputs(p, torch.device("cpu"))
    want = requant_emulated(*args)
    got = _reordered_requant(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1].view(torch.uint8), want[1].view(torch.uint8))
    i = p.n // 2
    scales = from_blocked(want[1], p.m, i // 16).float()
    assert (scales == 448).any() and (scales < 448).any()  # saturated and ordinary blocks
    assert torch.unique(want[0] & 0xF).numel() >= 12  # most E2M1 codes are written


def test_wrong_requant_kernel_is_disabled_one_byte(fake_fused):
    calls = []

    def one_bad_byte(*args):
        calls.append(1)
        packed, scales = requant_emulated(*args)
        packed = packed.clone()
        packed.view(-1)[-1] ^= 0x10  # one code of the last token
        return packed, scales

    fake_fused(F.REQUANT, "bad_requant", one_bad_byte)
    args = _requant_call()
    with pytest.warns(RuntimeWarning, match=r"bad_requant\[requant\] disagrees with the emulated fused requant op on 1 of"):
        out = torch.ops.nvgemm.nvfp4_linear_requant(*args)
    want = requant_emulated(*args)
    assert torch.equal(out[0], want[0]) and F.last_fused_selected(F.REQUANT) == "emulated"
    assert calls == [1]
    torch.ops.nvgemm.nvfp4_linear_requant(*args)
    assert calls == [1]


def test_correct_fused_kernels_serve(fake_fused):
    ran = []

    def good_requant(*args):
        ran.append("requant")
        return _reordered_requant(*args)

    def good_prequant(*args):
        ran.append("prequant")
        return prequant_emulated(*args)

    fake_fused(F.REQUANT, "good_requant", good_requant)
    fake_fused(F.PREQUANT, "good_prequant", good_prequant)
    args = _requant_call()
    packed, scales = torch.ops.nvgemm.nvfp4_linear_requant(*args)
    assert ran == ["requant", "requant"] and F.last_fused_selected(F.REQUANT) == "good_requant"
    q = quantize_weight(torch.randn(48, 32))
    down = (packed, scales, q.packed, to_blocked(q.scale), q.global_scale.reshape(()), args[6], None, None,
            torch.bfloat16)
    out = torch.ops.nvgemm.nvfp4_linear_prequant(*down)
    assert ran[2:] == ["prequant", "prequant"] and F.last_fused_selected(F.PREQUANT) == "good_prequant"
    assert torch.equal(out, prequant_emulated(*down))


def test_wrong_prequant_kernel_is_disabled(fake_fused):
    def wrong_column(*args):
        out = prequant_emulated(*args).clone()
        out[:, 3] += out[:, 3].abs().amax() * 0.05 + 0.05
        return out

    fake_fused(F.PREQUANT, "bad_prequant", wrong_column)
    x, w, ws, ws2, ins, _b, gs, dt = _requant_call()
    packed, scales = torch.ops.nvgemm.nvfp4_linear_requant(x, w, ws, ws2, ins, None, gs, dt)
    q = quantize_weight(torch.randn(48, 32))
    down = (packed, scales, q.packed, to_blocked(q.scale), q.global_scale.reshape(()), gs, None, None, dt)
    with pytest.warns(RuntimeWarning, match=r"bad_prequant\[prequant\] disagrees with the emulated fused prequant op"):
        out = torch.ops.nvgemm.nvfp4_linear_prequant(*down)
    assert torch.equal(out, prequant_emulated(*down))


def test_prequant_check_bound_passes_reordered_sum_and_catches_one_element():
    p = _problem(m=6, n=128, k=512, activation="none", bias=True)
    args = F.prequant_selfcheck_inputs(p, torch.device("cpu"))
    want = prequant_emulated(*args).float()
    packed, scales, w, ws, ws2, ins, bias, _r, dt = args
    m, k, n = packed.shape[0], packed.shape[1] * 2, w.shape[0]
    a = dequantize(packed, from_blocked(scales.view(torch.float8_e4m3fn), m, k // 16)).double()
    wd = dequantize(w, from_blocked(ws.view(torch.float8_e4m3fn), n, k // 16)).double()
    other = ((a @ wd.t()) * float(ws2 * ins) + bias.double()).to(dt).float()  # fp64 sum: another order
    bound = F.prequant_selfcheck_bound(args, want)
    assert ((other - want).abs() <= bound).all()
    bad = want.clone()
    bad[2, 5] += 0.02 * want.abs().amax()
    assert ((bad - want).abs() > bound).any()


def test_op_refuses_bad_scales_and_runs_kernel_free_on_bias_dtype(fake_fused):
    x, w, ws, ws2, ins, _b, gs, dt = _requant_call()
    with pytest.raises(ValueError, match=r"out_input_scale\): input_scale is nan"):
        torch.ops.nvgemm.nvfp4_linear_requant(x, w, ws, ws2, ins, None, torch.tensor(float("nan")), dt)
    called = []
    fake_fused(F.REQUANT, "never", lambda *a: called.append(1) or requant_emulated(*a))
    bias32 = torch.zeros(w.shape[0])  # fp32 bias: kernels read bias in the output dtype
    torch.ops.nvgemm.nvfp4_linear_requant(x, w, ws, ws2, ins, bias32, gs, dt)
    assert called == [] and F.last_fused_selected(F.REQUANT) == "emulated"


def test_emu_sm100_is_registered_for_both_ops_and_only_forced():
    from nvgemm import emulator

    emulator.enable()
    names = {k: [b.name for b in B.backends(k)] for k in (F.REQUANT, F.PREQUANT)}
    for kind in names:
        # the emulator twins sort below every real backend and the reference: they run only when forced
        assert set(names[kind][-2:]) == {"emu_sm100", "emu_sm120"}, names[kind]
        assert "cutedsl_sm100" in names[kind] and "cutedsl_sm120" in names[kind] and "emulated" in names[kind]
    emu = {b.name: b for b in B.backends(F.REQUANT)}["emu_sm100"]
    assert "CPU tensors" in emu.supports(_problem(device_type="cuda", capability=(10, 0)))
    assert "M=300 > 128" in emu.supports(_problem(m=300, n=512, k=256))
    assert dataclasses.replace(emu).autotune is False


def test_clear_errors_on_misused_registry_and_module():
    from nvgemm.integrations.modelopt import NVFP4GatedMLP

    with pytest.raises(ValueError, match="kind must be 'requant' or 'prequant'"):
        F.select_fused_backend("moe", _problem())
    with pytest.raises(ValueError, match=r"op kind must be one of \('linear', 'moe', 'requant', 'prequant'\), got 'fused'"):
        B.backends("fused")
    plain = nvgemm.NVFP4Linear.from_linear(torch.nn.Linear(64, 64), input_scale=0.01)
    with pytest.raises(ValueError, match="gate_up_proj must have activation 'silu_mul'"):
        NVFP4GatedMLP(plain, plain)
