"""Validation programs for the emulator's TMA and block-scaled tcgen05 modules, built only from CuTe's own atoms,
layouts and partitioners (no nvgemm kernel code): TMA tile load / store with swizzled shared layouts and an
mbarrier transaction count, and ``tcgen05.mma .kind::mxf4nvf4`` with ``tcgen05.cp`` scale factors. Compiled AOT
through a test-only kernel template (tests/emulator/test_isa_cute_tma_nvfp4.py) so the host code CuTe generates
-- which encodes the tensor maps -- runs against the emulator's fake CUDA runtime. Kept in a file of their own
because ``cute.jit`` needs importable source."""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warpgroup

# -- TMA copy: a (ROWS, COLS) bf16 row-major tensor in (BR, BC) boxes, the last row and column of boxes over the
# tensor's edge (zero fill on load, clipped on store)
ROWS, COLS, BR = 40, 80, 32
SW_ATOM = {128: warpgroup.SmemLayoutAtomKind.K_SW128, 64: warpgroup.SmemLayoutAtomKind.K_SW64,
           32: warpgroup.SmemLayoutAtomKind.K_SW32}


def box_cols(swizzle: int) -> int:
    """Columns of a box: one swizzle span of bf16 (a row of the box is one span)."""
    return swizzle // 2


def grid_of(swizzle: int) -> tuple[int, int]:
    bc = box_cols(swizzle)
    return (COLS + bc - 1) // bc, (ROWS + BR - 1) // BR


def make_tma_copy(swizzle: int):
    BC = box_cols(swizzle)
    NBYTES = BR * BC * 2

    @cute.kernel
    def tma_copy_kernel(tma_ld: cute.CopyAtom, mLd: cute.Tensor, tma_st: cute.CopyAtom, mSt: cute.Tensor,
                        s_layout: cute.ComposedLayout, gRaw: cute.Tensor, gTile: cute.Tensor):
        smem = cutlass.memory.SmemAllocator()
        raw = smem.allocate_tensor(cutlass.Uint8, cute.make_layout(NBYTES), 1024)
        mbar = smem.allocate_tensor(cutlass.Int64, cute.make_layout(1), 8)
        sT = cute.make_tensor(cute.recast_ptr(raw.iterator, s_layout.inner, dtype=cutlass.BFloat16), s_layout.outer)
        tidx, _, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        gLd = cute.local_tile(mLd, (BR, BC), (by, bx))
        gSt = cute.local_tile(mSt, (BR, BC), (by, bx))
        tAs, tAg = cpasync.tma_partition(tma_ld, 0, cute.make_layout(1), cute.group_modes(sT, 0, 2),
                                         cute.group_modes(gLd, 0, 2))
        tSs, tSg = cpasync.tma_partition(tma_st, 0, cute.make_layout(1), cute.group_modes(sT, 0, 2),
                                         cute.group_modes(gSt, 0, 2))
        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(mbar.iterator, 1)
            cute.arch.mbarrier_init_fence()
        cute.arch.barrier()
        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(mbar.iterator, NBYTES)
            cute.copy(tma_ld, tAg, tAs, tma_bar_ptr=mbar.iterator)  # the TMA atom elects its issuing lane
        cute.arch.mbarrier_wait(mbar.iterator, 0)
        cta = by * cute.arch.grid_dim()[0] + bx
        for i in cutlass.range(tidx, NBYTES, 128):  # the shared bytes as they lie (the placement check)
            gRaw[cta, i] = raw[i]
        for i in cutlass.range(tidx, BR * BC, 128):  # the tile through CuTe's swizzled view (zero fill check)
            gTile[cta, i // BC, i % BC] = sT[i // BC, i % BC]
        cute.arch.barrier()
        if warp == 0:
            cute.copy(tma_st, tSs, tSg)
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def tma_copy(src: cute.Pointer, dst: cute.Pointer, raw: cute.Pointer, tile: cute.Pointer,
                 stream: cuda.CUstream):
        """Every (BR, BC) box of ``src`` (ROWS x COLS bf16, row-major) TMA-loaded into a ``swizzle``-byte
        swizzled shared tile (CuTe's K-major atom) and TMA-stored to ``dst``; each CTA also writes its shared
        bytes to ``raw[cta]`` and the tile read through CuTe's swizzled view to ``tile[cta]``."""
        gx, gy = grid_of(swizzle)
        s_layout = cute.tile_to_shape(warpgroup.make_smem_layout_atom(SW_ATOM[swizzle], cutlass.BFloat16), (BR, BC),
                                      (0, 1))
        mSrc = cute.make_tensor(src, cute.make_layout((ROWS, COLS), stride=(COLS, 1)))
        mDst = cute.make_tensor(dst, cute.make_layout((ROWS, COLS), stride=(COLS, 1)))
        gRaw = cute.make_tensor(raw, cute.make_layout((gx * gy, NBYTES), stride=(NBYTES, 1)))
        gTile = cute.make_tensor(tile, cute.make_layout((gx * gy, BR, BC), stride=(BR * BC, BC, 1)))
        tma_ld, mLd = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mSrc, s_layout, (BR, BC))
        tma_st, mSt = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), mDst, s_layout, (BR, BC))
        tma_copy_kernel(tma_ld, mLd, tma_st, mSt, s_layout, gRaw, gTile).launch(
            grid=(gx, gy, 1), block=(128, 1, 1), smem=NBYTES + 1024 + 64, stream=stream)

    return tma_copy
