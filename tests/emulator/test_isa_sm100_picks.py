"""Every distinct sm100 config the policy picks for the preset Llama decode shapes (M = 1..64, plain and
``silu_mul``; at the time of writing all tile_m 128, cta_group::1, 1x1 clusters, swap-AB, tile_n 8..64,
split-K 1..16), scaled down to N = 256 and the smallest K that feeds every split, with M = tile_n - 3 tokens
(at least 1), plain and ``silu_mul`` + bias epilogues, run on the emulator and compared bit for bit with
``kernel_view_ref`` on exact data (the data of test_isa_sm100_kernel.py); the split-K counters must be back at
zero. Opt-in (``-m emulator_full``): ~30 launches, several minutes on 2 cores.

``test_policy_picks_are_modelled`` (default run, no compile) covers the policy's picks for decode and prefill
(M up to 512, where it picks 2-CTA tiles): each must have a form the ISA modules model and that
test_isa_sm100_kernel.py ran bit-exact on the emulator, so a new form (a cluster shape, cta_group::2 without a
pair along M, ...) fails it.
"""

import pytest
import torch
from isa_env import kernel_test_env

kernel_test_env("sm_100a")
pytestmark = pytest.mark.emulator

import nvgemm.ops.linear  # noqa: E402,F401
from nvgemm.epilogues import EpilogueSpec  # noqa: E402
from nvgemm.core.formats import to_blocked  # noqa: E402
from nvgemm.aot.compile_spec import make_spec  # noqa: E402
from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig as C  # noqa: E402
from nvgemm.templates.sm100_w4a4.launch import kernel_view_ref, prepare_sm100_args  # noqa: E402

POW2_E4M3 = torch.tensor([0x28, 0x30, 0x38, 0x40, 0x48], dtype=torch.uint8)


def _policy_picks():
    from nvgemm.cli import sass_tool
    from nvgemm.templates.sm100_w4a4.backend import _policy_config

    out = []
    for n, k in sass_tool.LLAMA_SHAPES:
        for m in (1, 2, 4, 8, 16, 32, 64):
            for act in ("none", "silu_mul"):
                out.append(_policy_config(m, n, k, torch.bfloat16, act, "sm_100a", 148))
    return out


PICKS = sorted({(c.tile_n, c.split_k) for c in _policy_picks()})


def _codes(g, rows, k):
    return (torch.randint(0, 256, (rows, k // 2), generator=g, dtype=torch.uint8),
            POW2_E4M3[torch.randint(0, 5, (rows, k // 16), generator=g)].view(torch.float8_e4m3fn))


def _form(tile_m=128, cluster_m=1, cluster_n=1, swap_ab=False, **_):
    return tile_m, cluster_m, cluster_n, swap_ab


@pytest.mark.parametrize("ms", [(1, 2, 4, 8, 16, 32, 64), (128, 256, 512)], ids=["decode", "prefill"])
def test_policy_picks_are_modelled(ms):
    """What the emulator models: cta_group::1 tiles (tile_m 128) and cta_group::2 tiles (tile_m 256, the CTA
    pair along cluster M, so cluster_m even; the ISA modules reject cta_group::2 with M = 128 or without a peer),
    with or without multicast clusters. Every pick must be such a tile *and* have its (tile_m, cluster, swap-AB)
    form among the cases test_isa_sm100_kernel.py runs bit-exact."""
    from nvgemm.cli import sass_tool
    from nvgemm.templates.sm100_w4a4.backend import _policy_config
    from test_isa_sm100_kernel import CASES

    ran = {_form(**p.values[3]) for p in CASES}
    seen = set()
    for n, k in sass_tool.LLAMA_SHAPES:
        for m in ms:
            for act in ("none", "silu_mul"):
                c = _policy_config(m, n, k, torch.bfloat16, act, "sm_100a", 148)
                assert c is not None, (m, n, k, act)
                assert c.tile_m in (128, 256) and c.use_2cta == (c.tile_m == 256), c
                assert not c.use_2cta or c.cluster_m % 2 == 0, f"cta_group::2 without a CTA pair along M: {c}"
                form = _form(c.tile_m, c.cluster_m, c.cluster_n, c.swap_ab)
                assert form in ran, f"{c.name()}: form {form} never ran on the emulator (ran: {sorted(ran)})"
                seen.add(form)
    if ms[-1] >= 128:
        assert any(f[0] == 256 for f in seen), "prefill picks no 2-CTA tile any more: revisit this test"


@pytest.mark.emulator_full
@pytest.mark.parametrize("act", ["none", "silu_mul"])
@pytest.mark.parametrize("tile_n,split_k", PICKS, ids=[f"t{a}-sk{b}" for a, b in PICKS])
def test_sm100_pick_on_emulator(tile_n, split_k, act, tmp_path, monkeypatch, seed):
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    from nvgemm.emulator.runner import prepare

    m, n, k = max(tile_n - 3, 1), 256, max(512, split_k * 256)
    cfg = C(tile_n=tile_n, swap_ab=True, split_k=split_k)
    g = torch.Generator().manual_seed(seed)
    w_packed, w_scale = _codes(g, n, k)
    bias = (torch.randint(-8, 9, (n,), generator=g) * 0.25).to(torch.bfloat16) if act == "silu_mul" else None
    epi = EpilogueSpec(alpha="scalar", bias=bias is not None, activation=act, out_dtype=torch.bfloat16)
    one = torch.tensor(1.0)
    args = prepare_sm100_args(torch.zeros(m, k, dtype=torch.bfloat16), w_packed, to_blocked(w_scale), one, one, bias,
                              None, epi, cfg)
    x_packed, x_scale = _codes(g, m, k)
    args.b.copy_(x_packed)  # swap-AB: the activations are the B operand
    args.sfb.view(torch.uint8).copy_(to_blocked(x_scale).view(torch.uint8).reshape(args.sfb.shape))
    z = lambda t: t if t is not None else 0  # noqa: E731
    prepare(make_spec("sm100_nvfp4_gemm", cfg, "sm_100a", epilogue=epi)).launch(
        args.a, args.b, args.sfa, args.sfb, args.out, args.alpha, z(args.bias), z(args.residual), z(args.workspace),
        z(args.counters), args.m, args.n, args.k, 0)
    torch.testing.assert_close(args.out, kernel_view_ref(args), rtol=0, atol=0)
    if args.counters is not None:
        assert int(args.counters.abs().sum()) == 0, "split-K counters not reset"
