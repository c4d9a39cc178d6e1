"""nvgemm's sm90 ``mma`` (decode) kernels executed on the PTX emulator through their real AOT
artifacts (production ``AotKernel`` host path relinked against the fake CUDA runtime), compared
with the emulated backend (``nvgemm.ops.linear.nvfp4_linear_emulated``):

* bit for bit on exact data (:func:`nvgemm.emulator.check.exact_operands`: every fp32 sum exact);
* within :data:`~nvgemm.emulator.check.RANDOM_RTOL` on random data and for ``silu_mul`` (its
  ``ex2.approx`` is implementation-defined on hardware);
* M = 1..16 incl. odd M, N and K tails, split-K with the CTAs run forward / reverse / shuffled
  (identical bits, every tile counter back at zero, a second launch on the same workspace),
  scalar / per-column alpha, bias, residual, silu_mul, bf16 / fp16 activations, bf16 / fp16 / fp32
  out; the policy's mma picks for the preset Llama shapes on small N / K;
* mutations of the real PTX (lane pairing of the B fragments, the K-tail zero-fill predicate, the PDL
  wait moved late) make the comparison (or the PDL-hazard record) fail.

Default CI runs a representative subset; ``pytest -m emulator_full`` runs every sm90 pick, mma and
wgmma (``bench/emulator_sweep.py`` writes its result file).
"""

from __future__ import annotations

import dataclasses
import os
import re

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("cutlass")

from nvgemm.emulator.check import RANDOM_RTOL, exact_operands, random_operands, reference, rel_err, run_sm90  # noqa: E402
from nvgemm.emulator.ptx import EmulationError  # noqa: E402
from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config as C  # noqa: E402
from nvgemm.templates.sm90_w4a16.launch import Sm90Workspace  # noqa: E402

pytestmark = pytest.mark.emulator

DECODE = C("mma", tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4, pdl=True)
SPLIT3 = C("mma", tile_m=16, tile_n=128, tile_k=256, num_warps=4, stages=4, split_k=3, pdl=True)


def _equal(cfg, ops, **kw):
    r = run_sm90(cfg, ops, **kw)
    want = reference(ops)
    assert r.out.dtype == want.dtype and r.out.shape == want.shape
    diff = (r.out.float() - want.float()).abs()
    assert torch.equal(r.out, want), f"max |diff| {diff.max()} at {divmod(int(diff.argmax()), want.shape[-1])}"
    return r


@pytest.mark.parametrize("m,n,k", [(1, 256, 512), (3, 208, 544), (8, 256, 512), (13, 144, 320), (5, 128, 448)])
def test_decode_kernel_bit_exact(m, n, k):
    """Odd M (two M tiles at 13), N tails (208 = 13 row tiles, 144), K % 256 in {32, 64, 192}."""
    r = _equal(DECODE, exact_operands(m, n, k, seed=m * 7 + k))
    assert r.launch.stats["griddepcontrol.wait"] == r.launch.stats["griddepcontrol.launch_dependents"] > 0


def test_pdl_kernel_touches_only_the_weights_before_griddepcontrol_wait():
    """The PDL design (mma.py): weight and scale copies are issued before ``griddepcontrol.wait``
    (the host synchronises once after preparing a weight), activations and every store after it."""
    r = run_sm90(DECODE, exact_operands(8, 256, 512, seed=2))
    assert r.launch.ext.get("pdl_pre_wait_reads", set()) <= {"mW", "mS"}
    assert r.launch.ext["pdl_pre_wait_reads"], "no weight copy before the wait: the PDL prologue is gone"
    assert not r.launch.ext.get("pdl_pre_wait_writes")


def test_decode_kernel_random_data_within_tolerance():
    ops = random_operands(8, 256, 512, seed=3)
    assert rel_err(run_sm90(DECODE, ops).out, reference(ops)) < RANDOM_RTOL


def test_split_k_every_cta_order_same_bits_and_counters_return_to_zero():
    ws = Sm90Workspace(torch.device("cpu"))
    ops = exact_operands(13, 256, 992, alpha="vector", bias=True, residual=True, out_dtype=torch.float32, seed=11)
    outs = []
    for order in ("forward", "reverse", 1234, "forward"):  # the last: a second launch on the same workspace
        r = _equal(SPLIT3, ops, order=order, workspace=ws)
        assert not ws.count.any(), f"split-K counters left non-zero after the {order} order"
        outs.append(r.out.clone())
    assert all(torch.equal(o, outs[0]) for o in outs)


def test_silu_mul_gate_up_pairing_within_tolerance():
    ops = exact_operands(7, 256, 768, activation="silu_mul", seed=5)
    r = run_sm90(SPLIT3, ops)
    assert r.out.shape == (7, 128)
    assert rel_err(r.out, reference(ops)) < RANDOM_RTOL


def test_fp16_activations_fp16_out_with_bias_bit_exact():
    _equal(DECODE, exact_operands(9, 256, 512, x_dtype=torch.float16, bias=True, seed=9))


def test_fp16_path_with_e4m3_subnormal_block_scales_bit_exact():
    """fp16 activations re-encode the block scales for f16 (``s * 2**7``): e4m3 subnormals (m * 2**-9)
    must survive that exactly."""
    ops = exact_operands(6, 256, 512, x_dtype=torch.float16, bias=True, seed=31)
    g = torch.Generator().manual_seed(31)
    sub = (torch.randint(1, 8, (256, 512 // 16), generator=g).float() * 2.0**-9).to(torch.float8_e4m3fn)
    from nvgemm.core.formats import to_blocked

    ops.weight_scale = to_blocked(sub)
    ops.weight_scale_2 = torch.tensor(64.0)
    _equal(DECODE, ops)


def test_strided_activation_and_residual_rows():
    """Row strides larger than the row (views of wider buffers) reach the kernel as dynamic strides."""
    ops = exact_operands(11, 256, 768, alpha="vector", bias=True, residual=True, out_dtype=torch.float32, seed=41)
    xw = torch.zeros(11, 768 + 64, dtype=ops.x.dtype)
    xw[:, :768] = ops.x
    rw = torch.zeros(11, 256 + 48, dtype=torch.float32)
    rw[:, :256] = ops.residual
    ops.x, ops.residual = xw[:, :768], rw[:, :256]
    r = _equal(SPLIT3, ops)
    assert r.args.x.stride(0) == 768 + 64 and r.args.residual.stride(0) == 256 + 48


# ------------------------------------------------------------------------------------------ mutations


def _mutate(kernel, pattern: str, repl, count_min: int = 1):
    new, n = re.subn(pattern, repl, kernel.ptx)
    assert n >= count_min, f"mutation pattern {pattern!r} matched {n} times"
    return dataclasses.replace(kernel, ptx=new, records=[])


def test_mutations_of_the_real_ptx_fail_the_comparison():
    ops = exact_operands(8, 256, 544, seed=21)
    want = reference(ops)
    good = run_sm90(DECODE, ops)
    assert torch.equal(good.out, want)
    k = good.kernel
    # (1) wrong lane pairing: the two B registers of every mma.sync swapped (k 0-7 <-> 8-15)
    swapped = _mutate(k, r"(mma\.sync\.aligned[^;]*\{[^}]*\}, \{[^}]*\}, )\{(%r\d+), (%r\d+)\}", r"\1{\3, \2}", 16)
    bad = run_sm90(DECODE, ops, kernel=swapped)
    assert not torch.equal(bad.out, want)
    # (2) a wrong K-tail predicate: the activation copies always read 16 bytes (no zero-fill past K)
    ztail = _mutate(k, r"(cp\.async\.ca\.shared\.global \[%r\d+\], \[%rd\d+\], 16), %r\d+;", r"\1;", 4)
    try:
        failed = not torch.equal(run_sm90(DECODE, ops, kernel=ztail).out, want)
    except EmulationError as e:  # K = 544: the last row's copy past K leaves the activation tensor
        failed = "out-of-bounds global access" in str(e)
    assert failed
    # (3) the PDL wait moved to the end (after every activation copy): the hazard record names mX
    nowait = _mutate(k, r"griddepcontrol\.wait;", "", 1)
    nowait = dataclasses.replace(nowait, ptx=nowait.ptx.replace("griddepcontrol.launch_dependents;",
                                                                "griddepcontrol.launch_dependents; griddepcontrol.wait;"))
    late = run_sm90(DECODE, ops, kernel=nowait)
    assert torch.equal(late.out, want) and "mX" in late.launch.ext["pdl_pre_wait_reads"]
    # the unmutated kernel still passes afterwards (its PTX is re-registered per launch)
    assert torch.equal(run_sm90(DECODE, ops).out, want)


# ------------------------------------------------------------------------------------------ policy picks


def _policy_picks(families=("mma",), ms=(1, 2, 4, 8, 16, 32)):
    from nvgemm.cli import sass_tool
    from nvgemm.templates.sm90_w4a16.backend import pick_config

    picks = {}
    for n, k in sass_tool.LLAMA_SHAPES:
        for m in ms:
            for act in ("none", "silu_mul"):
                c = pick_config(m, n, k, torch.bfloat16, act, 132)
                if c.family in families:
                    picks.setdefault((c, act), (m, n, k))
    return picks


def _policy_mma_picks():
    return _policy_picks()


def _scaled_down(cfg, act, m):
    """The same config on a small problem: N two CTAs wide (a tail in the second), K with enough
    stages for every split (and a K tail when there are stages to spare)."""
    n = 2 * cfg.tile_n - 16
    if act == "silu_mul":
        n = 2 * cfg.tile_n if cfg.tile_n % 32 == 0 else 2 * cfg.tile_n
    stages_needed = cfg.split_k * max(1, 256 // cfg.tile_k) if cfg.split_k > 1 else 2
    k = max(512, stages_needed * cfg.tile_k)
    if k <= 1024 and k - 32 >= cfg.split_k * cfg.tile_k:
        k -= 32
    return min(m, 2 * cfg.tile_m - 1), n, k


def _run_pick(cfg, act, m):
    mm, n, k = _scaled_down(cfg, act, m)
    ws = Sm90Workspace(torch.device("cpu"))
    if act == "silu_mul":
        ops = exact_operands(mm, n, k, activation=act, seed=mm + k)
        r = run_sm90(cfg, ops, workspace=ws)
        assert rel_err(r.out, reference(ops)) < RANDOM_RTOL, (cfg.name(), act, mm, n, k)
    else:
        r = _equal(cfg, exact_operands(mm, n, k, seed=mm + k), workspace=ws)
    assert not ws.count.any()
    return r


DEFAULT_PICKS = 2


def test_policy_mma_picks_representative_subset():
    picks = sorted(_policy_mma_picks().items(), key=lambda kv: kv[0][0].name())
    assert picks, "the policy emitted no mma config for the preset shapes"
    chosen = [p for p in picks if p[0][1] == "none"][:DEFAULT_PICKS]
    for (cfg, act), (m, _n, _k) in chosen:
        _run_pick(cfg, act, m)


def _all_picks():
    return sorted(_policy_picks(("mma", "wgmma"), (1, 2, 4, 8, 16, 32, 64)).items(),
                  key=lambda kv: (kv[0][0].name(), kv[0][1]))


@pytest.mark.emulator_full
@pytest.mark.parametrize("i", range(60))
def test_policy_picks_full(i):
    """Every sm90 pick (mma and wgmma, M up to 64) for the preset shapes, scaled down."""
    picks = _all_picks()
    if i >= len(picks):
        pytest.skip(f"only {len(picks)} picks")
    (cfg, act), (m, _n, _k) = picks[i]
    _run_pick(cfg, act, m)


# ------------------------------------------------------------------------------------------ backend


def test_emu_sm90_backend_is_forced_only_and_matches(monkeypatch):
    """``NVGEMM_BACKEND=emu_sm90`` runs ``nvgemm::nvfp4_linear`` on the emulated kernel; without the
    override the CPU op never picks it (priority below the emulated reference)."""
    from nvgemm.dispatch.registry import last_selected

    ops = exact_operands(3, 256, 512, seed=17)
    want = reference(ops)
    torch.ops.nvgemm.nvfp4_linear(*ops.args())
    assert last_selected() != "emu_sm90"
    monkeypatch.setenv("NVGEMM_BACKEND", "emu_sm90")
    got = torch.ops.nvgemm.nvfp4_linear(*ops.args())
    assert last_selected() == "emu_sm90"
    assert torch.equal(got, want)


def test_emu_sm100_backend_runs_the_w4a4_kernel(monkeypatch):
    """``NVGEMM_BACKEND=emu_sm100``: the sm_100a W4A4 kernel (policy pick for the B200 profile) on the
    emulator agrees with the emulated op (both quantize the activations the same way; they differ by
    fp32 summation order and the output rounding)."""
    import nvgemm.ops.linear  # noqa: F401
    from nvgemm.dispatch.registry import last_selected

    ops = random_operands(4, 256, 512, seed=23)
    ops.input_scale = (ops.x.float().abs().amax() / 2688).reshape(())
    want = reference(ops)
    monkeypatch.setenv("NVGEMM_BACKEND", "emu_sm100")
    got = torch.ops.nvgemm.nvfp4_linear(*ops.args())
    assert last_selected() == "emu_sm100"
    assert rel_err(got, want) < RANDOM_RTOL


def _at_offset(t: torch.Tensor, off: int) -> torch.Tensor:
    """``t``'s bytes in a uint8 buffer sliced ``off`` bytes past a 16-byte boundary and viewed as ``t``: how a
    CPU safetensors load holds a tensor stored at an unaligned file offset."""
    nbytes = t.numel() * t.element_size()
    buf = torch.empty(nbytes + 32, dtype=torch.uint8)
    start = (-buf.data_ptr()) % 16 + off
    out = buf[start:start + nbytes].view(t.dtype).view(t.shape)
    out.copy_(t)
    return out


def test_emu_sm100_misaligned_weight_is_refused_by_name_and_runs_aligned(monkeypatch):
    """A weight at an unaligned address never reaches the kernel ABI's 16-byte pointer check (which raised
    ``ValueError: a_ptr: pointer must be 16-byte aligned`` at launch): forced, ``emu_sm100`` refuses the call
    naming the tensor; the same bytes held by ``NVFP4Linear`` (aligned at construction) run on the kernel."""
    from nvgemm import NVFP4Linear
    from nvgemm.dispatch.registry import last_selected

    ops = random_operands(4, 256, 512, seed=31)
    ops.input_scale = (ops.x.float().abs().amax() / 2688).reshape(())
    want = reference(ops)
    ops.weight = _at_offset(ops.weight, 3)
    assert ops.weight.data_ptr() % 16 == 3
    monkeypatch.setenv("NVGEMM_BACKEND", "emu_sm100")
    with pytest.raises(RuntimeError, match="NVGEMM_BACKEND=emu_sm100 cannot run .*weight is not 16-byte aligned"):
        torch.ops.nvgemm.nvfp4_linear(*ops.args())
    layer = NVFP4Linear.from_tensors(ops.weight, ops.weight_scale, ops.weight_scale_2, ops.input_scale)
    got = layer(ops.x)
    assert last_selected() == "emu_sm100"
    assert rel_err(got, want) < RANDOM_RTOL
