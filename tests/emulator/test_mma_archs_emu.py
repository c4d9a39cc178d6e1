"""The W4A16 ``mma`` decode kernel compiled for sm_120a (GeForce / workstation Blackwell), sm_89 (Ada) and
sm_80 (Ampere) -- its real AOT artifacts for those archs -- executed on the PTX emulator with the arch's
device profile (RTX5090: 170 SMs, L40S: 142, A100: 108), compared bit for bit with the emulated backend
(``nvgemm.ops.linear.nvfp4_linear_emulated``) on exact data (:func:`nvgemm.emulator.check.exact_operands`:
every fp32 sum exact, so any fragment, lane, scale or epilogue error changes bits).

One kernel source, three archs: sm_120a keeps PDL and ``mul.rn.bf16x2``; sm_89 / sm_80 have neither, so
their configs have ``pdl=False`` and the bf16 scale multiply is ``fma.rn.bf16x2 d, a, b, -0.0``
(:class:`nvgemm.templates.sm90_w4a16.config.ArchCaps`). The cases cover M > 8 (two M tiles), an N tail, a
K tail, uneven split-K (5 pipeline stages over 3 CTAs: 2, 2, 1) in three CTA orders, per-column alpha
!= 1 + bias + residual, and bf16 / fp16 activations.

Default CI: sm_120a and sm_89 (one plain and one split-K case each); ``-m emulator_full`` adds sm_80, sm_121a
(DGX Spark, GB10 profile: 48 SMs) and sm_86 (A10 profile: 72 SMs), the fp16 cases, and every config the policy
picks on sm_120a for the Llama-3.1-8B shapes at M = 1..64 (both activations, scaled down, bit-exact:
``bench/results/mma_sm120_emulator_sweep.md``).
"""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("cutlass")

from nvgemm.emulator.check import exact_operands, reference, run_sm90  # noqa: E402
from nvgemm.templates.sm90_w4a16.config import ARCH_CAPS, Sm90W4A16Config as C, arch_problem  # noqa: E402
from nvgemm.templates.sm90_w4a16.launch import Sm90Workspace  # noqa: E402

pytestmark = pytest.mark.emulator


def _decode(arch: str) -> C:
    return C("mma", tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4, pdl=ARCH_CAPS[arch].pdl)


def _split3(arch: str) -> C:
    return C("mma", tile_m=16, tile_n=128, tile_k=256, num_warps=4, stages=3, split_k=3, pdl=ARCH_CAPS[arch].pdl)


def _equal(cfg, ops, arch, **kw):
    assert arch_problem(cfg, arch) is None
    r = run_sm90(cfg, ops, arch=arch, **kw)
    assert f".target {arch}\n" in r.kernel.ptx  # the arch's own artifact ran
    want = reference(ops)
    assert r.out.dtype == want.dtype and r.out.shape == want.shape
    diff = (r.out.float() - want.float()).abs()
    assert torch.equal(r.out, want), f"{arch}: max |diff| {diff.max()} at {divmod(int(diff.argmax()), want.shape[-1])}"
    return r


DEFAULT = [pytest.param("sm_120a"), pytest.param("sm_89"), pytest.param("sm_80", marks=pytest.mark.emulator_full),
           pytest.param("sm_121a", marks=pytest.mark.emulator_full), pytest.param("sm_86", marks=pytest.mark.emulator_full)]


@pytest.mark.parametrize("arch", DEFAULT)
def test_decode_two_m_tiles_n_and_k_tails_bias_alpha_residual(arch):
    """M = 13 (two M tiles of 8), N = 208 (13 row tiles: a partial CTA), K = 544 (K % 256 = 32: the
    zero-filled tail), per-column alpha != 1, bias and residual."""
    ops = exact_operands(13, 208, 544, alpha="vector", bias=True, residual=True, seed=5)
    assert not torch.all(ops.weight_scale_2 == 1)
    r = _equal(_decode(arch), ops, arch)
    # PDL exactly where the arch has griddepcontrol
    pdl = r.launch.stats.get("griddepcontrol.wait", 0)
    assert (pdl > 0) == ARCH_CAPS[arch].pdl


@pytest.mark.parametrize("arch", DEFAULT)
def test_uneven_split_k_every_cta_order_same_bits(arch):
    """K = 1248 is 5 pipeline stages of 256 (the last a K tail) over 3 splits: 2, 2, 1 stages; the last
    CTA of each tile sums the partials in split order whatever the arrival order; counters return to 0."""
    ws = Sm90Workspace(torch.device("cpu"))
    ops = exact_operands(11, 256, 1248, alpha="vector", bias=True, residual=True, out_dtype=torch.float32, seed=7)
    outs = []
    for order in ("forward", "reverse", 4321):
        r = _equal(_split3(arch), ops, arch, order=order, workspace=ws)
        assert not ws.count.any(), f"split-K counters left non-zero after the {order} order"
        outs.append(r.out)
    assert all(torch.equal(o, outs[0]) for o in outs)


@pytest.mark.emulator_full
@pytest.mark.parametrize("arch", ["sm_120a", "sm_89", "sm_80"])
def test_fp16_activations_bit_exact(arch):
    """fp16 activations: ``mul.rn.f16x2`` exists on every arch (only bf16 needs the fma form)."""
    _equal(_decode(arch), exact_operands(9, 256, 512, x_dtype=torch.float16, bias=True, seed=9), arch)


def test_fma_form_is_what_changes_between_archs():
    """The sm_89 artifact's PTX multiplies the bf16 scales with ``fma.rn.bf16x2`` and has no
    ``griddepcontrol``; the sm_120a one keeps ``mul.rn.bf16x2`` and PDL (same kernel source)."""
    ops = exact_operands(8, 128, 256, seed=1)
    r89 = run_sm90(_decode("sm_89"), ops, arch="sm_89")
    r120 = run_sm90(_decode("sm_120a"), ops, arch="sm_120a")
    p89, p120 = r89.kernel.ptx, r120.kernel.ptx
    assert "fma.rn.bf16x2" in p89 and "mul.rn.bf16x2" not in p89 and "griddepcontrol" not in p89
    assert "mul.rn.bf16x2" in p120 and "fma.rn.bf16x2" not in p120 and "griddepcontrol.wait" in p120
    assert ".target sm_89" in p89 and ".target sm_120a" in p120
    assert torch.equal(r89.out, r120.out)


# ------------------------------------------------------------------------------------------ sm_120a policy picks


#: (arch, SM count of its emulator profile) whose policy picks the opt-in sweeps run: RTX 5090, L40S, A100
PICK_ARCHS = {"sm_120a": 170, "sm_89": 142, "sm_80": 108}


def _sm120_picks(arch: str = "sm_120a"):
    """Every config the W4A16 policy picks on ``arch`` (sm_120a: the RTX 5090 profile, 170 SMs; see
    :data:`PICK_ARCHS`) for the Llama-3.1-8B shapes at M = 1..64, both activations: ((config, activation), first
    M it was picked at)."""
    from nvgemm.cli import sass_tool
    from nvgemm.templates.sm90_w4a16.backend import pick_config

    picks = {}
    for n, k in sass_tool.LLAMA_SHAPES:
        for m in (1, 2, 4, 8, 16, 32, 64):
            for act in ("none", "silu_mul"):
                picks.setdefault((pick_config(m, n, k, torch.bfloat16, act, PICK_ARCHS[arch], arch), act), m)
    return sorted(picks.items(), key=lambda kv: (kv[0][0].name(), kv[0][1]))


def sm120_pick_problem(cfg: C, act: str, m: int) -> tuple[int, int, int]:
    """The pick's config on a small problem: M capped at two M tiles less one, N two CTAs wide (a 16-row tail
    in the second unless gated), K with a stage for every split and a 32-element K tail."""
    n = 2 * cfg.tile_n if act == "silu_mul" else 2 * cfg.tile_n - 16
    k = max(2, cfg.split_k) * cfg.tile_k + 32
    return min(m, 2 * cfg.tile_m - 1), n, k


def run_sm120_pick(cfg: C, act: str, m: int, arch: str = "sm_120a"):
    """One pick bit for bit against the emulated op on exact data (vector alpha, bias). ``silu_mul``: the gate
    columns get a bias of 4096, so every gate is above 18, where ``exp(-g) < 2**-25`` and ``1 + exp(-g)`` rounds
    to 1 in fp32 however ``exp`` is computed: ``silu(g) == g`` exactly, and ``h = g * up`` is one fp32 product
    on both sides (``acc * alpha`` is exact, alpha a power of two; ``+ bias`` one fp32 rounding on both): bit-exact
    too."""
    mm, n, k = sm120_pick_problem(cfg, act, m)
    ops = exact_operands(mm, n, k, alpha="vector", bias=True, activation=act, seed=mm + k)
    if act == "silu_mul":
        ops.bias[: n // 2] = 4096.0
        pre = reference(dataclasses.replace(ops, activation="none"))  # the pre-activation, rounded
        assert pre[:, : n // 2].float().min() > 18, "a gate left the range where silu(g) == g in fp32"
    ws = Sm90Workspace(torch.device("cpu"))
    r = _equal(cfg, ops, arch, workspace=ws)
    assert not ws.count.any(), "split-K counters left non-zero"
    return r


@pytest.mark.emulator_full
@pytest.mark.parametrize("pick", _sm120_picks(), ids=lambda p: f"{p[0][0].name()}-{p[0][1]}-m{p[1]}")
def test_every_sm120a_policy_pick_bit_exact_scaled_down(pick, tmp_path, monkeypatch):
    """Every W4A16 ``mma`` config the policy picks on sm_120a for the Llama-3.1-8B shapes (M = 1..64) runs its
    sm_120a artifact bit-exact on the RTX 5090 profile (``bench/results/mma_sm120_emulator_sweep.md``)."""
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    (cfg, act), m = pick
    assert cfg.family == "mma" and arch_problem(cfg, "sm_120a") is None
    run_sm120_pick(cfg, act, m)


@pytest.mark.emulator_full
@pytest.mark.parametrize("arch", ["sm_89", "sm_80"])
def test_every_ampere_ada_policy_pick_bit_exact_scaled_down(arch, tmp_path, monkeypatch):
    """Every W4A16 ``mma`` config the policy picks on sm_89 (L40S profile) and sm_80 (A100 profile) for the
    Llama-3.1-8B shapes (M = 1..64) runs its own arch's artifact (no PDL, the ``fma`` bf16 multiply before sm_90)
    bit-exact, as :func:`run_sm120_pick` does on sm_120a (``bench/results/mma_sm120_emulator_sweep.md``)."""
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    picks = _sm120_picks(arch)
    assert picks
    for (cfg, act), m in picks:
        assert cfg.family == "mma" and not cfg.pdl and arch_problem(cfg, arch) is None, cfg.name()
        run_sm120_pick(cfg, act, m, arch)
    print(f"{arch}: {len(picks)} picks bit-exact")
