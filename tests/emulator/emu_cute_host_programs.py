"""A small CuTeDSL host function + kernel for tests/emulator/test_cute_host.py (own code; ``cute.jit`` needs
importable source): ``mC = alpha * mA + mB`` over 2-D tensors of any shape, one 128-thread CTA per 4 x 32 tile,
the tail predicated with an identity tensor. The grid is computed by the host code from the dynamic shape."""

import cutlass
import cutlass.cute as cute

TILE = (4, 32)


@cute.kernel
def _axpy_kernel(gA: cute.Tensor, gB: cute.Tensor, gC: cute.Tensor, cC: cute.Tensor, shape: cute.Shape,
                 alpha: cutlass.Float32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i, j = tidx // TILE[1], tidx % TILE[1]
    crd = cC[(i, j), bidx]
    if cute.elem_less(crd, shape):
        gC[(i, j), bidx] = alpha * gA[(i, j), bidx] + gB[(i, j), bidx]


@cute.jit
def axpy(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, alpha: cutlass.Float32):
    gA = cute.zipped_divide(mA, TILE)
    gB = cute.zipped_divide(mB, TILE)
    gC = cute.zipped_divide(mC, TILE)
    cC = cute.zipped_divide(cute.make_identity_tensor(mC.shape), tiler=TILE)
    _axpy_kernel(gA, gB, gC, cC, mC.shape, alpha).launch(grid=[cute.size(gC, mode=[1]), 1, 1],
                                                         block=[TILE[0] * TILE[1], 1, 1])


@cute.jit
def axpy_swapped(mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, alpha: cutlass.Float32):
    """The same kernel (same image and PTX) behind other host code: ``mC = alpha * mB + mA``."""
    axpy(mB, mA, mC, alpha)
