"""``ldmatrix`` / ``stmatrix`` (m8n8, b16, x1/x2/x4, with and without .trans) on hand-written PTX against a
per-lane reference written here from the PTX ISA text: lane ``8 i + r`` gives the address of row ``r`` of matrix
``i``; register ``i`` of lane ``t`` holds row ``t / 4``, columns ``2 (t % 4)``, ``2 (t % 4) + 1`` of matrix ``i``
(low half first), or with ``.trans`` rows ``2 (t % 4)``, ``2 (t % 4) + 1`` of column ``t / 4``. The row addresses
are a random permutation of the 32 rows of shared memory, so a lane / row mix-up cannot cancel out. (NVIDIA's
CuTeDSL tensorop_gemm example, which loads its fragments with ldmatrix, also runs bit-exact on the emulator:
bench/results/emulator_nvidia_examples.md.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nvgemm.emulator.ptx import EmulationError
from nvgemm.emulator.runner import launch_ptx

pytestmark = pytest.mark.emulator

HEAD = ".version 9.4\n.target sm_90a\n.address_size 64\n.extern .shared .align 16 .b8 smem[];\n"
PARAMS = ".param .u64 p_in, .param .u64 p_perm, .param .u64 p_out"
DECL = ".reg .b32 %r<32>;\n.reg .b64 %rd<16>;\n"
PROLOGUE = """
    ld.param.u64 %rd1, [p_in]; ld.param.u64 %rd2, [p_perm]; ld.param.u64 %rd3, [p_out];
    mov.u32 %r1, %tid.x; shl.b32 %r2, %r1, 4; mov.u32 %r3, smem; add.u32 %r4, %r3, %r2;
    cvt.u64.u32 %rd4, %r2; add.s64 %rd5, %rd1, %rd4; add.s64 %rd9, %rd3, %rd4;
    ld.global.v4.b32 {%r5, %r6, %r7, %r8}, [%rd5];
    shl.b32 %r9, %r1, 2; cvt.u64.u32 %rd6, %r9; add.s64 %rd7, %rd2, %rd6;
    ld.global.b32 %r10, [%rd7]; shl.b32 %r11, %r10, 4; add.u32 %r12, %r3, %r11;
    mov.b32 %r13, 0; mov.b32 %r14, 0; mov.b32 %r15, 0; mov.b32 %r16, 0;
"""
LD = PROLOGUE + """
    st.shared.v4.b32 [%r4], {%r5, %r6, %r7, %r8};
    bar.sync 0;
    ldmatrix.sync.aligned.m8n8.NUM.shared.b16 REGS, [%r12];
    st.global.v4.b32 [%rd9], {%r13, %r14, %r15, %r16};
    ret;
"""
ST = PROLOGUE + """
    stmatrix.sync.aligned.m8n8.NUM.shared.b16 [%r12], REGS;
    bar.sync 0;
    ld.shared.v4.b32 {%r13, %r14, %r15, %r16}, [%r4];
    st.global.v4.b32 [%rd9], {%r13, %r14, %r15, %r16};
    ret;
"""


def _kernel(body: str, n: int, trans: bool, regs: list[str]) -> str:
    num = f"x{n}" + (".trans" if trans else "")
    body = body.replace("NUM", num).replace("REGS", "{" + ", ".join(regs[:n]) + "}")
    return f"{HEAD}\n.visible .entry k({PARAMS})\n{{\n{DECL}\n{body}\n}}\n"


def _fragment_position(t: int, h: int, trans: bool) -> tuple[int, int]:
    """(row, column) in its 8 x 8 matrix of half ``h`` of a register of lane ``t`` (PTX ISA)."""
    return ((t & 3) * 2 + h, t >> 2) if trans else (t >> 2, (t & 3) * 2 + h)


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_matches_the_isa(n, trans):
    rng = np.random.default_rng(10 * n + trans)
    data = rng.integers(0, 1 << 16, 256, dtype=np.uint16)  # 32 rows x 8 halves of shared memory
    perm = rng.permutation(32).astype(np.int32)  # lane l: address of shared row perm[l]
    out = torch.zeros(128, dtype=torch.int32)
    launch_ptx(_kernel(LD, n, trans, ["%r13", "%r14", "%r15", "%r16"]), (1, 1, 1), (32, 1, 1),
               [torch.from_numpy(data.view(np.int32).copy()), torch.from_numpy(perm), out], dyn_smem=512)
    got = out.numpy().view(np.uint32).reshape(32, 4)
    want = np.zeros((32, 4), np.uint32)
    for t in range(32):
        for i in range(n):
            for h in range(2):
                r, c = _fragment_position(t, h, trans)
                want[t, i] |= np.uint32(data[8 * perm[8 * i + r] + c]) << np.uint32(16 * h)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("trans", [False, True])
def test_stmatrix_matches_the_isa(trans):
    rng = np.random.default_rng(7 + trans)
    regs = rng.integers(0, 1 << 32, (32, 4), dtype=np.uint32)  # lane t's four source registers
    perm = rng.permutation(32).astype(np.int32)
    out = torch.zeros(128, dtype=torch.int32)
    launch_ptx(_kernel(ST, 4, trans, ["%r5", "%r6", "%r7", "%r8"]), (1, 1, 1), (32, 1, 1),
               [torch.from_numpy(regs.view(np.int32).copy()), torch.from_numpy(perm), out], dyn_smem=512)
    got = out.numpy().view(np.uint16).reshape(32, 8)  # shared row j -> out row j
    want = np.zeros((32, 8), np.uint16)
    for t in range(32):
        for i in range(4):
            for h in range(2):
                r, c = _fragment_position(t, h, trans)
                want[perm[8 * i + r], c] = (regs[t, i] >> np.uint32(16 * h)) & np.uint32(0xFFFF)
    np.testing.assert_array_equal(got, want)


def test_ldmatrix_misaligned_row_is_an_error():
    perm = torch.arange(32, dtype=torch.int32)
    src = _kernel(LD, 4, False, ["%r13", "%r14", "%r15", "%r16"]).replace("add.u32 %r12, %r3, %r11;",
                                                                          "add.u32 %r12, %r3, %r11; add.u32 %r12, %r12, 4;")
    with pytest.raises(EmulationError, match="16-byte aligned"):
        launch_ptx(src, (1, 1, 1), (32, 1, 1), [torch.zeros(128, dtype=torch.int32), perm,
                                                torch.zeros(128, dtype=torch.int32)], dyn_smem=1024)
