"""nvgemm's sm90 wgmma kernel executed on the PTX emulator with the ISA wgmma opcode module
(nvgemm.emulator.isa.ops_wgmma): the real AOT artifact, relinked against the fake CUDA runtime, must produce
the bits of the emulated backend's arithmetic (``kernel_view_ref``; activations chosen so every fp32 sum is
exact, so the summation order cannot matter).

Mutation check (by hand, see the commit message): swapping the register-A fragment's row and column halves in
``wgmma.a_fragment_coords`` makes the first case differ by up to 107; swapping the descriptor's leading and
stride byte offsets, or a split range that drops the leftover K stage, fails the M = 13 case.
"""

import pytest
import torch
from isa_env import kernel_test_env

kernel_test_env("sm_90a")

from nvgemm.core.formats import quantize_weight  # noqa: E402
from nvgemm.aot.compile_spec import make_spec  # noqa: E402
from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config as C  # noqa: E402
from nvgemm.templates.sm90_w4a16.launch import cached_sm90_weight, kernel_view_ref, prepare_sm90_args  # noqa: E402

CASES = [
    pytest.param(5, 256, 512, 32, 1, id="m5-n256-k512-t32", marks=pytest.mark.emulator),
    # tokens across two 8-row core matrices of the activation operand (the descriptor's stride fields), a K
    # tail (704 of 3 x 256) and an uneven split of the 3 K stages over 2 CTAs (the one tile is the last wave)
    pytest.param(13, 128, 704, 16, 2, id="m13-n128-k704-t16-sk2-ktail", marks=pytest.mark.emulator),
    pytest.param(37, 384, 1024, 64, 2, id="m37-n384-k1024-t64-splitk2", marks=[pytest.mark.emulator,
                                                                             pytest.mark.slow]),
]


@pytest.mark.parametrize("m,n,k,tile_m,split_k", CASES)
def test_sm90_wgmma_kernel_on_emulator_matches_reference(m, n, k, tile_m, split_k, tmp_path, monkeypatch, seed):
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    from nvgemm.emulator.runner import prepare

    cfg = C("wgmma", tile_m=tile_m, tile_n=128, tile_k=256, num_warps=4, stages=3, split_k=split_k)
    q = quantize_weight(torch.randn(n, k))
    prep = cached_sm90_weight(q.packed, q.scale, q.global_scale, "bf16")
    x = (torch.randint(-8, 9, (m, k)) * 0.25).to(torch.bfloat16)  # decoded weights are E2M1 * s * 2**-7: exact sums
    args = prepare_sm90_args(x, prep, None, None, None, "none", torch.float32, cfg)
    spec = make_spec("sm90_w4a16_wgmma", cfg, "sm_90a", epilogue=args.spec, a_format="bf16")
    launch = prepare(spec).launch(*args.abi_values(), 0)
    assert launch is not None and launch.stats["warp_instructions"] > 0
    torch.testing.assert_close(args.out, kernel_view_ref(args, cfg), rtol=0, atol=0)
