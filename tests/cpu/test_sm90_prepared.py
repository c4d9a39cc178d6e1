"""Hopper layers held once, in the sm90 layout (issue 22 item 14): ``NVFP4Linear.prepare_for_sm90``
and ``nvgemm::nvfp4_linear_sm90_prepared``.

On CPU the op's kernel branch is exercised with the sm90 host path and its torch view of the
kernel's arithmetic (``kernel_view_ref``) standing in for the launch; the fallback branch (any
other backend) is the real one. Tolerances: the fallback rebuilds the checkpoint layout exactly,
so it is compared bit for bit; the kernel view differs from the emulated op only in summation
order (fp64 vs fp32) and one output rounding: 1 ulp of bf16 relative plus K * 2**-24 * max|y|.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import nvgemm  # noqa: F401
from nvgemm.core.formats import dequantize, from_blocked, quantize_weight, to_blocked
from nvgemm.nn.linear import NVFP4Linear
from nvgemm.core import backend as core_backend
from nvgemm.dispatch import registry as B
from nvgemm.templates.sm90_w4a16 import launch as L90
from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config
from nvgemm.templates.sm90_w4a16.operand import prepare_sm90_weight, to_modelopt


def _layer(n, k, seed, *, w4a4=True, bias=False, activation="none"):
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g))
        if bias:
            lin.bias.copy_(torch.randn(n, generator=g))
    return NVFP4Linear.from_linear(lin, input_scale=0.01 if w4a4 else None, activation=activation)


@pytest.mark.parametrize("kind", ["bf16", "fp16"])
@pytest.mark.parametrize("n,k", [(16, 256), (40, 96), (33, 1024)])
def test_to_modelopt_is_value_exact_for_every_scale(kind, n, k):
    """Random codes, random scale bytes (negative, zero, subnormal included): the re-encoded
    checkpoint layout dequantizes to exactly the original values."""
    g = torch.Generator().manual_seed(n * k)
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    sb = torch.randint(0, 256, (n, k // 16), dtype=torch.uint8, generator=g)
    sb[(sb & 0x7F) == 0x7F] = 0x38  # no NaN scales (refused at preparation)
    s = sb.view(torch.float8_e4m3fn)
    packed, scale = to_modelopt(prepare_sm90_weight(w, to_blocked(s), torch.tensor(1.0), kind))
    assert packed.shape == w.shape and scale.dtype == torch.float8_e4m3fn
    assert torch.equal(dequantize(packed, from_blocked(scale, n, k // 16)), dequantize(w, s))


@pytest.mark.parametrize("w4a4,bias,activation", [(True, False, "none"), (False, True, "silu_mul"),
                                                  (True, True, "gelu_tanh")])
def test_prepared_layer_holds_one_copy_and_computes_the_same(w4a4, bias, activation, monkeypatch):
    mod = _layer(128, 256, 1, w4a4=w4a4, bias=bias, activation=activation)
    x = torch.randn(3, 256).bfloat16()
    want = mod(x)
    ckpt_bytes = mod.weight.numel() + mod.weight_scale.numel()
    held = mod.prepare_for_sm90("bf16")
    assert mod.weight is None and mod.weight_scale is None
    assert {n for n, _ in mod.named_buffers()} >= {"sm90_weight", "sm90_scale"}
    assert held == mod.sm90_weight.numel() + mod.sm90_scale.numel() and held <= ckpt_bytes * 1.01
    monkeypatch.setattr(core_backend, "_WARNED", set())
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = mod(x)
        mod(x)
    assert torch.equal(got, want)  # CPU: the emulated op on the rebuilt checkpoint layout
    assert sum("checkpoint layout is rebuilt" in str(r.message) for r in w) == 1
    assert "held in the sm90 layout (bf16)" in repr(mod)


def test_state_dict_is_the_checkpoint_layout_and_loading_refills():
    mod = _layer(64, 256, 2)
    ref = {k: v.clone() for k, v in mod.state_dict().items()}
    deq = mod.dequantized_weight()
    mod.prepare_for_sm90()
    sd = mod.state_dict()
    assert set(sd) == set(ref)
    assert sd["weight"].shape == ref["weight"].shape and sd["weight_scale"].shape == ref["weight_scale"].shape
    assert torch.equal(mod.dequantized_weight(), deq)
    fresh = NVFP4Linear(256, 64)
    fresh.load_state_dict(sd)  # a plain layer takes the saved state
    assert torch.equal(fresh.dequantized_weight(), deq)
    # loading another layer's state into the prepared one keeps its buffers (graphs stay valid)
    other = _layer(64, 256, 3)
    ptrs = (mod.sm90_weight.data_ptr(), mod.sm90_scale.data_ptr())
    mod.load_state_dict(other.state_dict())
    assert (mod.sm90_weight.data_ptr(), mod.sm90_scale.data_ptr()) == ptrs
    assert torch.equal(mod.dequantized_weight(), other.dequantized_weight())
    x = torch.randn(2, 256).bfloat16()
    assert torch.equal(mod(x), other(x))


def test_kernel_branch_runs_on_the_prepared_weight(monkeypatch):
    """When the registry picks cutedsl_sm90, the op hands the prepared tensors to
    sm90_backend.run_prepared (here: the host path + kernel_view_ref on CPU), no re-encoding."""
    from nvgemm.ops.linear import nvfp4_linear_emulated
    from nvgemm.templates.sm90_w4a16 import backend as sm90_backend
    from nvgemm.templates.sm90_w4a16 import operand

    cfg = Sm90W4A16Config("mma", tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4, pdl=True)
    calls = []

    def run_prepared(x, p, input_scale, bias, residual, activation, out_dtype, config=None):
        calls.append(p)
        args = L90.prepare_sm90_args(x, p, input_scale, bias, residual, activation, out_dtype, cfg)
        return L90.kernel_view_ref(args, cfg).reshape(*x.shape[:-1], -1)

    fake = B.Backend(name="cutedsl_sm90", priority=10_000, supports=lambda p: None, run=None)
    monkeypatch.setattr("nvgemm.ops.prepared.select_backend", lambda problem: fake)
    monkeypatch.setattr(sm90_backend, "run_prepared", run_prepared)
    monkeypatch.setattr(sm90_backend, "bind_prepared", lambda *a: None)  # no device to bind a launch on
    monkeypatch.setattr(operand, "to_modelopt", lambda p: pytest.fail("re-encoded on the kernel path"))
    mod = _layer(128, 512, 4, w4a4=True, bias=True)
    mod.bias = mod.bias.bfloat16()
    x = torch.randn(5, 512).bfloat16()
    w, s = mod.weight.clone(), mod.weight_scale.clone()
    want = nvfp4_linear_emulated(x, w, s, mod.weight_scale_2, mod.input_scale, mod.bias, None, "none", None)
    mod.prepare_for_sm90("bf16")
    got = mod(x)
    assert len(calls) == 1 and calls[0].weight is mod.sm90_weight and calls[0].scale is mod.sm90_scale
    atol = 512 * 2.0**-24 * float(want.float().abs().max()) * 4 + 1e-6
    torch.testing.assert_close(got.float(), want.float(), rtol=2.0**-7, atol=atol)


def test_prepared_op_refuses_mismatched_tensors():
    mod = _layer(64, 256, 5)
    mod.prepare_for_sm90()
    x = torch.randn(2, 256).bfloat16()
    with pytest.raises(ValueError, match="prepared weight/scale must be uint8"):
        torch.ops.nvgemm.nvfp4_linear_sm90_prepared(x, mod.sm90_weight[:, :-1], mod.sm90_scale, mod.weight_scale_2,
                                                    mod.input_scale, None, None, "none", None, 64, 256, "bf16")
    with pytest.raises(ValueError, match="x has K=128"):
        torch.ops.nvgemm.nvfp4_linear_sm90_prepared(torch.randn(2, 128).bfloat16(), mod.sm90_weight, mod.sm90_scale,
                                                    mod.weight_scale_2, mod.input_scale, None, None, "none", None,
                                                    64, 256, "bf16")
    with pytest.raises(ValueError, match="fuse before prepare_for_sm90"):
        NVFP4Linear.fuse([mod, _layer(64, 256, 6)])
    with pytest.raises(RuntimeError, match="already prepared"):
        mod.prepare_for_sm90()


def test_prepared_op_passes_opcheck():
    """Schema, fake (meta) implementation and dynamic-shape tracing agree with the real op."""
    mod = _layer(64, 256, 7, bias=True)
    mod.bias = mod.bias.bfloat16()
    mod.prepare_for_sm90()
    x = torch.randn(3, 256).bfloat16()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = torch.library.opcheck(
            torch.ops.nvgemm.nvfp4_linear_sm90_prepared.default,
            (x, mod.sm90_weight, mod.sm90_scale, mod.weight_scale_2, mod.input_scale, mod.bias, None, "none", None,
             64, 256, "bf16"))
    assert set(res.values()) == {"SUCCESS"}, res


# --------------------------------------------------------------------------- under torch.compile


def test_compiled_prepared_layer_is_lowered_by_nvgemm_and_equals_eager():
    """With nvgemm enabled, Inductor lowers the prepared-weight op itself (not an opaque fallback): the compiled
    code calls its choice op (on CPU the emulated reference, the only candidate) and equals eager bit for bit
    (both run the emulated op on the same re-encoded checkpoint layout)."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache, run_and_get_code

    mod = _layer(128, 256, 8, w4a4=False, bias=True)
    mod.bias = mod.bias.bfloat16()
    mod.prepare_for_sm90("bf16")
    x, res = torch.randn(3, 256).bfloat16(), torch.randn(3, 128).bfloat16()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = mod(x, residual=res)
        torch._dynamo.reset()
        counters.clear()
        with fresh_cache(), nvgemm.enabled():
            out, codes = run_and_get_code(torch.compile(lambda x, r: mod(x, residual=r), fullgraph=True), x, res)
    code = "\n".join(codes)
    assert counters["nvgemm_cutedsl"]["lowered_nvfp4_linear_sm90_prepared"] == 1, dict(counters["nvgemm_cutedsl"])
    assert "torch.ops.nvgemm.nvfp4_linear_sm90_prepared_choice.default(" in code and "'backend:emulated'" in code
    assert "torch.ops.nvgemm.nvfp4_linear_sm90_prepared.default(" not in code
    assert torch.equal(out, want)


def test_prepared_choice_runs_the_named_sm90_config_on_the_prepared_weight(monkeypatch):
    """The choice compiled code calls for a ``cutedsl_sm90:<config>`` candidate hands the prepared tensors and
    that config to ``run_prepared`` (here: the host path + kernel_view_ref on CPU); no re-encoding."""
    from nvgemm.integrations.inductor import choices as choices_mod
    from nvgemm.integrations.inductor.choices import prepared_candidates
    from nvgemm.ops.linear import nvfp4_linear_emulated
    from nvgemm.templates.sm90_w4a16 import backend as sm90_backend
    from nvgemm.templates.sm90_w4a16 import operand
    from nvgemm.templates.sm90_w4a16.config import config_from_name

    mod = _layer(128, 512, 9, w4a4=False)
    x = torch.randn(5, 512).bfloat16()
    want = nvfp4_linear_emulated(x, mod.weight, mod.weight_scale, mod.weight_scale_2, None, None, None, "none", None)
    mod.prepare_for_sm90("bf16")
    problem = B.LinearProblem(m=5, n=128, k=512, device_type="cuda", capability=(9, 0), weight_only=True,
                              x_dtype=torch.bfloat16, out_dtype=torch.bfloat16, alpha="scalar", bias=False,
                              activation="none", residual=False)
    cands = prepared_candidates(problem)
    # the sm90 kernel's policy configs (bounded, ranked), then the reference; no backend that re-encodes
    assert 2 <= len(cands) <= 9 and cands[-1].key == "backend:emulated", cands
    assert all(c.backend == "cutedsl_sm90" and c.config for c in cands[:-1]), cands
    key = cands[1].key  # the second-ranked config: what the autotuner may pick
    calls = []

    def run_prepared(x, p, input_scale, bias, residual, activation, out_dtype, config=None):
        calls.append((p, config))
        cfg = config_from_name(config)
        args = L90.prepare_sm90_args(x, p, input_scale, bias, residual, activation, out_dtype, cfg)
        return L90.kernel_view_ref(args, cfg).reshape(*x.shape[:-1], -1)

    real = next(b for b in B.backends() if b.name == "cutedsl_sm90")
    fake = B.Backend(name="cutedsl_sm90", priority=real.priority, supports=lambda p: None, run=real.run)
    B.register_backend(fake)
    try:
        monkeypatch.setattr(sm90_backend, "run_prepared", run_prepared)
        for where in (operand, choices_mod):
            monkeypatch.setattr(where, "to_modelopt", lambda p: pytest.fail("re-encoded on the kernel path"))
        got = torch.ops.nvgemm.nvfp4_linear_sm90_prepared_choice(
            x, mod.sm90_weight, mod.sm90_scale, mod.weight_scale_2, None, None, None, "none", None, 128, 512, "bf16",
            key)
    finally:
        B.register_backend(real)
    assert len(calls) == 1 and calls[0][0].weight is mod.sm90_weight and calls[0][1] == key.split(":", 2)[2]
    # summation order (fp64 vs fp32) and one output rounding, as test_kernel_branch_runs_on_the_prepared_weight
    atol = 512 * 2.0**-24 * float(want.float().abs().max()) * 4 + 1e-6
    torch.testing.assert_close(got.float(), want.float(), rtol=2.0**-7, atol=atol)
