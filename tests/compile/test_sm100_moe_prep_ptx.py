"""Compile the sm100 grouped-MoE activation prep Triton kernel for explicit GPU targets (no GPU):
it builds for sm_90 and sm_100 with IEEE division only and no FMA contraction (its contract with
``nvgemm.core.formats``; the bytes are checked under the interpreter in
``tests/cpu/triton_interp/interp_sm100_moe_prep.py``)."""

from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.compile_only

from nvgemm.templates.sm100_moe.prep_triton import _slot_quant_kernel  # noqa: E402
from nvgemm.templates.triton._common import is_interpreted  # noqa: E402

if is_interpreted(_slot_quant_kernel):
    pytest.skip("kernels were defined under TRITON_INTERPRET=1; PTX needs the compiler", allow_module_level=True)

from test_triton_ptx import check_division, ptx_of  # noqa: E402

TYPES = {"x_ptr": "*bf16", "rows_ptr": "*i32", "tiles_ptr": "*i32", "ins_ptr": "*fp32", "q_ptr": "*u8",
         "sf_ptr": "*u8", "rop_ptr": "*i64", "K": "i32", "stride_xm": "i32", "P": "i32"}


@pytest.mark.parametrize("arch,tn", [(100, 8), (100, 64), (90, 16)])
def test_prep_compiles_exact(arch, tn):
    ptx = ptx_of(_slot_quant_kernel, TYPES, {"TN": tn, "BLOCK_K": 128}, arch, False)
    check_division(ptx)
    assert not re.search(r"\bfma\.rn\.f32", ptx), "FMA contraction in the quantizer"
    assert "atom." not in ptx
