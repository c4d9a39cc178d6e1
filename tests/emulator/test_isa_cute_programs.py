"""Validation programs (issue 21 item 4): small CuTeDSL kernels built only from CuTe's own atoms, layouts and
partitioners (tests/emulator/emu_isa_cute_programs.py), compiled with ``keep_ptx`` for their target and executed
on the emulator's core with the ISA opcode modules; results are compared with torch (exact data: bf16 values
k / 4 and k / 2 with |k| <= 8, so every fp32 partial sum is exact and the summation order cannot matter).

These check the emulator against NVIDIA's hardware-validated CuTe code paths -- its 128B-swizzled K-major
shared-memory layouts, the descriptors its SS WGMMA atom builds (A and B from shared memory), the accumulate
flag and its accumulator partitioning; the tcgen05 f16 atom with a TMEM accumulator; and the warp-level
``mma.sync`` m16n8k16 atom on a 2 x 2 warp layout fed by ``cp.async`` and ``ldmatrix.x4`` through CuTe's
MMA-matched copy partitioners from a 128B-swizzled smem layout -- independently of nvgemm's hand-written kernels.
Mutations of the emulator seen to fail the mma.sync test (bf16 and fp16): A fragment registers a1 / a2 swapped,
B fragment registers swapped, C / D column pair swapped, ldmatrix row address taken from the next lane, ldmatrix
register i filled from matrix i + 1.
"""

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
if "CUTE_DSL_DUMP_DIR" not in os.environ:
    import tempfile

    os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="nvgemm_cute_dump_")

import pytest
import torch

pytest.importorskip("cutlass")
pytestmark = pytest.mark.emulator

from nvgemm.emulator.ptx.interp import run_launch  # noqa: E402
from nvgemm.emulator.ptx.machine import GlobalMemory, Launch  # noqa: E402
from nvgemm.emulator.ptx.program import compile_entry  # noqa: E402


def _launch_pointer_kernel(ptx: str, tensors, grid, block, dyn_smem):
    """Run a kernel whose 8-byte parameters are the given tensors' pointers, in order."""
    prog = compile_entry(ptx)
    gm = GlobalMemory()
    for i, t in enumerate(tensors):
        gm.register_tensor(t, f"arg{i}")
    params = bytearray(prog.entry.param_bytes)
    ptrs = [t.data_ptr() for t in tensors]
    for p in prog.entry.params:
        if p.size == 8:
            params[p.offset:p.offset + 8] = ptrs.pop(0).to_bytes(8, "little")
    assert not ptrs, "fewer pointer parameters than tensors"
    return run_launch(Launch(prog, grid, block, (1, 1, 1), dyn_smem, bytes(params), gm))


def test_cute_wgmma_ss_tile_matches_torch(seed):
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr
    from emu_isa_cute_programs import WG_K, WG_M, WG_N, wgmma_ss_tile

    ptr = lambda dt: make_ptr(dt, 0, cute.AddressSpace.gmem, assumed_align=16)  # noqa: E731
    compiled = cute.compile(wgmma_ss_tile, ptr(cutlass.BFloat16), ptr(cutlass.BFloat16), ptr(cutlass.Float32),
                            options="--gpu-arch sm_90a --keep-ptx")
    ptx = compiled.__ptx__
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in ptx
    g = torch.Generator().manual_seed(seed)
    a = (torch.randint(-8, 9, (WG_M, WG_K), generator=g) * 0.25).to(torch.bfloat16)
    b = (torch.randint(-8, 9, (WG_N, WG_K), generator=g) * 0.5).to(torch.bfloat16)
    c = torch.full((WG_M, WG_N), float("nan"))
    launch = _launch_pointer_kernel(ptx, (a, b, c), (1, 1, 1), (128, 1, 1), 48 * 1024)
    assert launch.stats["warp_instructions"] > 0
    torch.testing.assert_close(c, (a.double() @ b.double().T).float(), rtol=0, atol=0)


def test_cute_tcgen05_f16_tile_matches_torch(seed):
    """CuTe's ``tcgen05.mma.kind::f16`` SS atom with its own UMMA smem layouts / descriptors and instruction
    descriptor, a TMEM accumulator (alloc, relinquish, dealloc), ``tcgen05.commit`` to an mbarrier, and
    ``tcgen05.ld.32x32b`` through CuTe's TMEM copy partitioner."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr
    from emu_isa_cute_programs import TC_K, TC_M, TC_N, tcgen05_f16_tile

    ptr = lambda dt: make_ptr(dt, 0, cute.AddressSpace.gmem, assumed_align=16)  # noqa: E731
    compiled = cute.compile(tcgen05_f16_tile, ptr(cutlass.BFloat16), ptr(cutlass.BFloat16), ptr(cutlass.Float32),
                            options="--gpu-arch sm_100a --keep-ptx")
    ptx = compiled.__ptx__
    assert "tcgen05.mma.cta_group::1.kind::f16" in ptx and "tcgen05.ld.sync.aligned.32x32b" in ptx
    g = torch.Generator().manual_seed(seed)
    a = (torch.randint(-8, 9, (TC_M, TC_K), generator=g) * 0.25).to(torch.bfloat16)
    b = (torch.randint(-8, 9, (TC_N, TC_K), generator=g) * 0.5).to(torch.bfloat16)
    c = torch.full((TC_M, TC_N), float("nan"))
    _launch_pointer_kernel(ptx, (a, b, c), (1, 1, 1), (128, 1, 1), 64 * 1024)
    torch.testing.assert_close(c, (a.double() @ b.double().T).float(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype_name", ["BFloat16", "Float16"])
def test_cute_mma_sync_tile_matches_torch(seed, dtype_name):
    """CuTe's ``mma.sync.m16n8k16`` atom on a 2 x 2 warp layout, operands staged with ``cp.async`` (two commit
    groups, waited one at a time) and loaded with ``ldmatrix.x4`` through CuTe's MMA-matched copy partitioners
    from a swizzled smem layout, compiled for sm_90a (nvgemm's mma family's arch)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr
    from emu_isa_cute_programs import MS_K, MS_M, MS_N, make_mma_sync_tile

    dt = getattr(cutlass, dtype_name)
    tdt = {"BFloat16": torch.bfloat16, "Float16": torch.float16}[dtype_name]
    ptr = lambda d: make_ptr(d, 0, cute.AddressSpace.gmem, assumed_align=16)  # noqa: E731
    compiled = cute.compile(make_mma_sync_tile(dt), ptr(dt), ptr(dt), ptr(cutlass.Float32),
                            options="--gpu-arch sm_90a --keep-ptx")
    ptx = compiled.__ptx__
    short = {"BFloat16": "bf16", "Float16": "f16"}[dtype_name]
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{short}.{short}.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx and "cp.async.cg.shared.global" in ptx
    g = torch.Generator().manual_seed(seed)
    a = (torch.randint(-8, 9, (MS_M, MS_K), generator=g) * 0.25).to(tdt)
    b = (torch.randint(-8, 9, (MS_N, MS_K), generator=g) * 0.5).to(tdt)
    c = torch.full((MS_M, MS_N), float("nan"))
    launch = _launch_pointer_kernel(ptx, (a, b, c), (1, 1, 1), (128, 1, 1), 2 * 2 * MS_M * MS_K + 1024)
    assert launch.stats["warp_instructions"] > 0
    torch.testing.assert_close(c, (a.double() @ b.double().T).float(), rtol=0, atol=0)
