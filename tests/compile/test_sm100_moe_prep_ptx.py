"""Compile the sm100 grouped-MoE prep Triton kernel (work list + activations) for explicit GPU targets (no GPU):
it builds for sm_90 and sm_100 with IEEE division only and no FMA contraction (its contract with
``nvgemm.core.formats``; the bytes are checked under the interpreter in
``tests/cpu/triton_interp/interp_sm100_moe_prep.py``), and with ``PREFETCH`` its two predicated
``prefetch.global.L2::evict_last`` loops (GEMM1's weight and scale lines) survive to the PTX; the lines
they name are checked on the emulator (``tests/emulator/test_sm100_moe_prep_prefetch_emu.py``)."""

from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.compile_only

from nvgemm.templates.sm100_moe.prep_triton import _moe_prep_kernel  # noqa: E402
from nvgemm.templates.triton._common import is_interpreted  # noqa: E402

if is_interpreted(_moe_prep_kernel):
    pytest.skip("kernels were defined under TRITON_INTERPRET=1; PTX needs the compiler", allow_module_level=True)

from test_triton_ptx import check_division, ptx_of  # noqa: E402

TYPES = {"x_ptr": "*bf16", "ids_ptr": "*i32", "map_ptr": "*i32", "ins_ptr": "*fp32", "rows_ptr": "*i32",
         "tiles_ptr": "*i32", "pos_ptr": "*i64", "valid_ptr": "*i8", "counts_ptr": "*i64", "yrow_ptr": "*i64", "yfin_ptr": "*i32",
         "q_ptr": "*u8", "sf_ptr": "*u8", "sf2_ptr": "*u8", "w13_ptr": "*u8", "w13_sf_ptr": "*u8", "K": "i32",
         "stride_xm": "i32", "P": "i32", "E": "i32", "KB2": "i32", "KB2_TILES": "i32", "W13_LINES": "i32",
         "W13_SF_LINES": "i32"}
#: the L2 prefetch of GEMM1's weights (one per 128-byte line, predicated per lane): one in the weight loop, one in
#: the scale loop
PREFETCH = re.compile(r"@%\w+ prefetch\.global\.L2::evict_last \[%rd\d+\];")


@pytest.mark.parametrize("arch,tn,prefetch,gdc", [(100, 8, True, True), (100, 64, False, False), (90, 16, True, True)])
def test_prep_compiles_exact(arch, tn, prefetch, gdc):
    ptx = ptx_of(_moe_prep_kernel, TYPES, {"TOPK": 8, "TN": tn, "BLOCK": 16, "BLOCK_K": 128, "FUSED": True,
                                           "HAS_MAP": False, "ZERO_SF2": True, "PREFETCH": prefetch,
                                           "USE_GDC": gdc}, arch, False)
    # PDL: the wait comes before the first global load (the ids are the predecessor's), the signal right after it
    assert ptx.count("griddepcontrol.wait") == ptx.count("griddepcontrol.launch_dependents") == (1 if gdc else 0)
    if gdc:
        assert ptx.index("griddepcontrol.wait") < ptx.index("griddepcontrol.launch_dependents") < ptx.index("ld.global")
    check_division(ptx)
    assert not re.search(r"\bfma\.rn\.f32", ptx), "FMA contraction in the quantizer"
    assert "atom." not in ptx
    assert len(PREFETCH.findall(ptx)) == (2 if prefetch else 0)
    assert ptx.count("prefetch") == (2 if prefetch else 0)  # nothing else prefetches
