"""CuTe atom queries for tests/compile/test_emu_isa_cute_oracle.py (a file of its own: ``cute.jit`` needs
importable source). Each function records the atom's static layouts as strings into ``out``."""

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup


@cute.jit
def wgmma_tv_layouts(out: cutlass.Constexpr, n: cutlass.Constexpr, a_from_regs: cutlass.Constexpr):
    src = warpgroup.OperandSource.RMEM if a_from_regs else warpgroup.OperandSource.SMEM
    op = warpgroup.MmaF16BF16Op(cutlass.BFloat16, cutlass.Float32, (64, n, 16), src,
                                OperandMajorMode.K, OperandMajorMode.K)
    atom = cute.make_mma_atom(op)
    out["A"] = str(atom.tv_layout_A)
    out["C"] = str(atom.tv_layout_C)
