"""Host side of the sm90 W4A16 kernels (nvgemm.runtime.sm90_launch), tested on CPU.

* the weight re-layout is a bijection with an exact inverse (all 2**32 word values are covered
  by the per-element bit map; tested on every byte value and random words);
* the kernel's decode, written in torch with the same shift/mask operations
  (``decode_relaid_ref``), yields exactly ``E2M1 * 2**-14`` for every code;
* ``kernel_view_ref`` (the kernel's arithmetic on the prepared arguments: per-16-block sums
  folded with their e4m3 scale, splits summed, times 2**14, epilogue) agrees with the emulated op.

Tolerance for the last point: both sides compute exact products (E2M1 x e4m3 x activation fits
fp32/fp64 exactly) and differ only in summation order and in fp64 vs fp32 accumulation, a
difference <= K * 2**-24 * sum|a*b| (far below half an output ulp for these K), so after the
single rounding at the output cast the results are within one ulp of the output dtype:
rtol = 1 ulp, plus atol = K * 2**-24 * max|y| for values near zero.
"""

import hashlib

import pytest
import torch

import nvgemm  # noqa: F401  (registers the ops)
from nvgemm.formats import E2M1_VALUES, dequantize, quantize_activation, quantize_weight, to_blocked, unpack_e2m1
from nvgemm.ops import nvfp4_linear_emulated
from nvgemm.runtime.backends import LinearProblem, select_backend
from nvgemm.runtime.sm90_launch import (
    decode_relaid_ref,
    kernel_view_ref,
    pick_config,
    prepare_sm90_args,
    prepare_sm90_weight,
    qdq_activation,
    relayout_weight,
    restore_weight,
    supports,
)
from nvgemm.templates.sm90_config import WORD_LAYOUT, Sm90W4A16Config, validate_config

ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-23}


@pytest.fixture
def seed(request):
    s = int(hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:8], 16)
    torch.manual_seed(s)
    return s


def _layer(n, k, *, vector_alpha=False, dtype=torch.bfloat16):
    w = torch.randn(n, k) * (torch.rand(n, 1) * 2 + 0.1)
    q = quantize_weight(w)
    ws2 = q.global_scale.reshape(())
    if vector_alpha:  # fused shards with unequal global scales
        ws2 = ws2 * (1 + torch.arange(n, dtype=torch.float32) % 3)
    return q.packed, to_blocked(q.scale), ws2.float()


# --------------------------------------------------------------------------- re-layout


def test_word_layout_is_a_permutation_of_32_bits():
    bits = []
    for mag, sign in WORD_LAYOUT:
        bits += [mag, mag + 1, mag + 2, sign]
    assert sorted(bits) == list(range(32))


@pytest.mark.parametrize("n,k", [(1, 32), (3, 64), (17, 96), (64, 4096)])
def test_relayout_round_trip(seed, n, k):
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    r = relayout_weight(w)
    assert r.shape == w.shape and r.dtype == torch.uint8
    assert torch.equal(restore_weight(r), w)
    if n * k >= 4096:
        assert not torch.equal(r, w)  # it really permutes bits


def test_relayout_round_trip_every_byte_in_every_position():
    # each of the 4 bytes of a word takes all 256 values (other bytes random)
    rows = []
    for pos in range(4):
        b = torch.randint(0, 256, (256, 16), dtype=torch.uint8)
        b[:, pos] = torch.arange(256, dtype=torch.uint8)
        rows.append(b)
    w = torch.cat(rows)
    assert torch.equal(restore_weight(relayout_weight(w)), w)


def test_decode_matches_e2m1_exactly(seed):
    n, k = 8, 256
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    want = E2M1_VALUES[unpack_e2m1(w).long()] * 2.0**-14
    got = decode_relaid_ref(relayout_weight(w))
    assert torch.equal(got, want)  # bitwise, incl. the fp16-subnormal code 0.5 and -0


def test_relayout_rejects_bad_shapes():
    with pytest.raises(ValueError, match="multiple of 32"):
        relayout_weight(torch.zeros(4, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        relayout_weight(torch.zeros(4, 16, dtype=torch.int8))


# --------------------------------------------------------------------------- prepared weight


def test_prepare_weight_unswizzles_scales(seed):
    n, k = 200, 160  # rows not a multiple of 128, K/16 = 10 not a multiple of 4 (padding)
    packed, ws, ws2 = _layer(n, k)
    p = prepare_sm90_weight(packed, ws, ws2)
    from nvgemm.formats import from_blocked

    assert torch.equal(p.scale.view(torch.float8_e4m3fn).float(), from_blocked(ws, n, k // 16).float())
    assert torch.equal(restore_weight(p.weight), packed)
    assert p.weight_scale_2.shape == (1,) and p.weight_scale_2.dtype == torch.float32


# --------------------------------------------------------------------------- kernel view vs emulated op

CASES = [
    # (m, n, k, activation, bias, residual, vector_alpha, x dtype, out dtype, w4a4, split_k)
    (1, 64, 256, "none", False, False, False, torch.bfloat16, None, False, 1),
    (3, 96, 512, "silu", True, False, False, torch.bfloat16, None, False, 2),
    (5, 128, 1024, "gelu_tanh", True, True, True, torch.float16, None, False, 1),
    (2, 128, 384, "silu_mul", True, False, False, torch.bfloat16, None, False, 3),
    (7, 48, 224, "none", False, True, False, torch.bfloat16, torch.float32, False, 1),
    (4, 64, 512, "none", False, False, False, torch.bfloat16, None, True, 1),  # W4A4 via qdq
    (33, 40, 128, "silu_mul", False, True, True, torch.float16, torch.float16, True, 1),
    (70, 96, 192, "gelu_tanh", True, False, False, torch.bfloat16, None, False, 2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"m{c[0]}-n{c[1]}-k{c[2]}-{c[3]}-w4a{'4' if c[9] else '16'}")
def test_kernel_view_matches_emulated(seed, case):
    m, n, k, act, has_bias, has_res, vec, xdt, odt, w4a4, split = case
    packed, ws, ws2 = _layer(n, k, vector_alpha=vec)
    x = torch.randn(m, k).to(xdt)
    input_scale = (x.float().abs().amax() / 2688).reshape(()) if w4a4 else None
    n_out = n // 2 if act == "silu_mul" else n
    out_dt = odt or xdt
    bias = torch.randn(n).to(xdt) if has_bias else None
    res = torch.randn(m, n_out).to(out_dt) if has_res else None
    ref = nvfp4_linear_emulated(x, packed, ws, ws2, input_scale, bias, res, act, odt)

    cfg = Sm90W4A16Config(family="gemv", tile_m=1, tile_n=8, tile_k=4096, split_k=split, num_warps=4)
    if m > 32:  # the WGMMA family takes the same arguments
        cfg = Sm90W4A16Config(family="wgmma", tile_m=64, tile_n=64, tile_k=64, split_k=split, num_warps=4, stages=2)
    prepared = prepare_sm90_weight(packed, ws, ws2)
    args = prepare_sm90_args(x, prepared, input_scale, bias, res, act, odt, cfg)
    assert args.out.shape == (m, n_out) and args.out.dtype == out_dt
    assert args.spec.alpha == ("vector" if vec else "scalar")
    assert args.work.numel() == (split * m * n if split > 1 else 1)
    got = kernel_view_ref(args, cfg)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    atol = k * 2.0**-24 * ref.float().abs().max().item() + 1e-30
    torch.testing.assert_close(got.float(), ref.float(), rtol=ULP[out_dt], atol=atol)


def test_w4a4_qdq_is_exact_and_faithful(seed):
    m, k = 6, 512
    for dt in (torch.bfloat16, torch.float16):
        x = (torch.randn(m, k) * 3).to(dt)
        x[0, :16] = 0  # an all-zero block
        s = (x.float().abs().amax() / 2688).reshape(())
        xq = qdq_activation(x, s)
        q, sx = quantize_activation(x, s)
        want = dequantize(q, sx)  # E2M1 * s_x in fp32, no global scale
        assert xq.dtype == dt
        assert torch.equal(xq.float(), want), "E2M1*e4m3 must be exact in the activation dtype"


def test_args_validation():
    packed, ws, ws2 = _layer(16, 64)
    p = prepare_sm90_weight(packed, ws, ws2)
    cfg = Sm90W4A16Config()
    with pytest.raises(ValueError, match="K=32"):
        prepare_sm90_args(torch.randn(2, 32).bfloat16(), p, None, None, None, "none", None, cfg)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        prepare_sm90_args(torch.randn(2, 64), p, None, None, None, "none", None, cfg)
    with pytest.raises(TypeError, match="residual"):
        prepare_sm90_args(torch.randn(2, 64).bfloat16(), p, None, None, torch.randn(2, 16), "none", None, cfg)


# --------------------------------------------------------------------------- backend / policy


def _problem(**kw):
    d = dict(m=1, n=4096, k=4096, device_type="cuda", capability=(9, 0), weight_only=True, x_dtype=torch.bfloat16,
             out_dtype=torch.bfloat16, alpha="scalar", bias=False, activation="none", residual=False)
    d.update(kw)
    return LinearProblem(**d)


def test_supports():
    assert supports(_problem()) is None
    assert supports(_problem(weight_only=False)) is None  # W4A4 runs as quantize-dequantize
    assert "CUDA" in supports(_problem(device_type="cpu", capability=None))
    assert "sm_90" in supports(_problem(capability=(10, 0)))
    assert "sm_90" in supports(_problem(capability=(8, 9)))
    assert "multiple of 32" in supports(_problem(k=4112))
    assert "bfloat16 or float16" in supports(_problem(x_dtype=torch.float32))


def test_backend_selected_on_sm90_only():
    assert select_backend(_problem(), check=False).name == "cutedsl_sm90"  # no first-use run on CPU
    assert select_backend(_problem(device_type="cpu", capability=None), check=False).name == "emulated"


@pytest.mark.parametrize("m", [1, 2, 3, 8, 16, 32, 64, 200])
@pytest.mark.parametrize("n,k", [(28672, 4096), (4096, 14336), (1024, 8192), (57344, 8192)])
def test_pick_config_family_by_m(m, n, k):
    fam = "gemv" if m <= 32 else "wgmma"
    cfg = pick_config(m, n, k, torch.bfloat16, "none", 132)
    assert cfg.family == fam and validate_config(cfg), cfg
    cfg = pick_config(m, n, k, torch.bfloat16, "silu_mul", 132)
    assert cfg.family == fam and cfg.tile_n % 2 == 0 and validate_config(cfg)
    if m > 32:  # K not a multiple of the WGMMA K step: the gemv kernel over M tiles
        assert pick_config(m, n, k + 32, torch.bfloat16, "none", 132).family == "gemv"


def test_wgmma_needs_k_multiple_of_64():
    packed, ws, ws2 = _layer(16, 96)
    p = prepare_sm90_weight(packed, ws, ws2)
    cfg = Sm90W4A16Config(family="wgmma", tile_m=64, tile_n=64, tile_k=64, num_warps=4, stages=2)
    with pytest.raises(ValueError, match="K % 64"):
        prepare_sm90_args(torch.randn(40, 96).bfloat16(), p, None, None, None, "none", None, cfg)


def test_e2m1_times_every_e4m3_scale_is_exact_in_bf16_and_fp16():
    """The WGMMA family stores ``(E2M1 * 2**-14) * s * 2**14`` (fp32) into bf16/fp16 shared memory,
    and W4A4 runs on ``E2M1 * s_x`` in the activation dtype: both rely on every E2M1 x e4m3 product
    being exact in bf16 and fp16. Checked for all 16 codes x all 127 non-negative finite e4m3 values."""
    codes = E2M1_VALUES.double()  # 16
    s = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).double()  # 0 .. 448
    exact = codes[:, None] * s[None, :]  # fp64: exact
    kernel_f32 = ((codes * 2.0**-14).float()[:, None] * s.float()[None, :]) * 16384.0
    for dt in (torch.bfloat16, torch.float16):
        assert torch.equal(kernel_f32.to(dt).double(), exact), dt


def test_mma_family_takes_the_same_arguments_and_needs_k_multiple_of_128(seed):
    m, n, k = 12, 64, 256
    packed, ws, ws2 = _layer(n, k)
    x = torch.randn(m, k).bfloat16()
    p = prepare_sm90_weight(packed, ws, ws2)
    cfg = Sm90W4A16Config(family="mma", tile_m=8, tile_n=16, tile_k=512, num_warps=4, stages=1)
    args = prepare_sm90_args(x, p, None, None, None, "none", None, cfg)
    ref = nvfp4_linear_emulated(x, packed, ws, ws2, None, None, None, "none", None)
    torch.testing.assert_close(kernel_view_ref(args, cfg).float(), ref.float(), rtol=ULP[torch.bfloat16],
                               atol=k * 2.0**-24 * ref.float().abs().max().item())
    packed, ws, ws2 = _layer(n, 192)
    with pytest.raises(ValueError, match="K % 128"):
        prepare_sm90_args(torch.randn(2, 192).bfloat16(), prepare_sm90_weight(packed, ws, ws2), None, None, None,
                          "none", None, cfg)
    assert pick_config(16, 4096, 4096, torch.bfloat16, "none", 132).family != "mma"  # not chosen until measured
