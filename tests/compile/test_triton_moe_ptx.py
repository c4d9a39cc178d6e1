"""Compile the Triton grouped MoE kernels for explicit GPU targets (no GPU needed) and check the PTX:
they build for sm_80 / sm_90 / sm_100 / sm_120, use IEEE division only, contract no FMA (the
kernels' contract with the emulated op), use tensor-core MMA for the grouped GEMMs, and the finalize
kernel uses no atomics (deterministic slot-ordered top-k sum)."""

from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.compile_only

from nvgemm.templates.triton._common import is_interpreted  # noqa: E402
from nvgemm.templates.triton.moe import moe_finalize_kernel, moe_gemm1_kernel, moe_gemm2_kernel  # noqa: E402

if is_interpreted(moe_gemm1_kernel):
    pytest.skip("kernels were defined under TRITON_INTERPRET=1; PTX needs the compiler", allow_module_level=True)

from test_triton_ptx import check_division, ptx_of  # noqa: E402

I32 = "i32"
G1_TYPES = {"x_ptr": "*bf16", "tw_ptr": "*fp32", "pairs_ptr": "*i32", "bexp_ptr": "*i32", "w_ptr": "*u8",
            "wsf_ptr": "*u8", "ws2_ptr": "*fp32", "ins_ptr": "*fp32", "h_ptr": "*bf16",
            **{k: I32 for k in ("P", "TOPK", "N", "N_OUT", "K", "stride_xm", "stride_we", "stride_wn",
                                "stride_sfe", "stride_ws2e", "stride_hm")}}
G2_TYPES = {"h_ptr": "*bf16", "tw_ptr": "*fp32", "pairs_ptr": "*i32", "bexp_ptr": "*i32", "w_ptr": "*u8",
            "wsf_ptr": "*u8", "ws2_ptr": "*fp32", "ins_ptr": "*fp32", "y_ptr": "*fp32",
            **{k: I32 for k in ("P", "N", "K", "stride_hm", "stride_we", "stride_wn", "stride_sfe", "stride_ym")}}
FIN_TYPES = {"y_ptr": "*fp32", "ids_ptr": "*i32", "sh_ptr": "*bf16", "res_ptr": "*bf16", "out_ptr": "*bf16",
             **{k: I32 for k in ("M", "N", "stride_ym", "stride_sm", "stride_rm", "stride_om")}}
TILES = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128}


@pytest.mark.parametrize("arch", [80, 90, 100, 120])
def test_grouped_gemms_compile_exact_and_on_tensor_cores(arch):
    g1 = ptx_of(moe_gemm1_kernel, G1_TYPES, {"QUANT_A": True, "ALPHA_ROW": False, "ROUTER_ON_INPUT": False,
                                             "ACTIVATION": 3, "X_KIND": 1, "DOT_FP32": False, **TILES}, arch, False)
    g2 = ptx_of(moe_gemm2_kernel, G2_TYPES, {"QUANT_A": True, "APPLY_WEIGHT": True, "DOT_FP32": False, **TILES},
                arch, False)
    for ptx in (g1, g2):
        check_division(ptx)
        assert not re.search(r"\bfma\.rn\.f32", ptx), "FMA contraction in the epilogue or quantizer"
        assert re.search(r"\bmma\.sync|wgmma|tcgen05\.mma", ptx), "grouped GEMM not on tensor cores"


def test_finalize_has_no_atomics():
    ptx = ptx_of(moe_finalize_kernel, FIN_TYPES, {"TOPK": 8, "HAS_SHARED": True, "HAS_RESIDUAL": True,
                                                  "OUT_KIND": 1, "BLOCK_M": 16, "BLOCK_N": 128}, 90, False)
    assert "atom." not in ptx and "red." not in ptx
