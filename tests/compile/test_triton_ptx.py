"""Compile nvgemm's Triton kernels for explicit GPU targets (no GPU needed) and check the PTX.

What the bit-exactness argument relies on, checked in the generated code:
* IEEE division ``div.rn.f32`` and never ``div.approx``/``div.full`` (what plain ``/`` gives);
* no FMA contraction in the quantizers (``enable_fp_fusion=False``);
* PDL: ``griddepcontrol.wait`` / ``griddepcontrol.launch_dependents`` exactly when USE_GDC;
* the kernels build for every target the fallback serves (sm_80, sm_89, sm_90, sm_120).

(About a minute on 2 cores: each target runs Triton's full pipeline through ptxas.)
"""

from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.compile_only

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from nvgemm.templates.triton._common import is_interpreted  # noqa: E402
from nvgemm.templates.triton.fused import rmsnorm_quantize_kernel, silu_mul_quantize_kernel  # noqa: E402
from nvgemm.templates.triton.gemm_w4a16 import w4a16_gemm_kernel  # noqa: E402
from nvgemm.templates.triton.quantize import quantize_nvfp4_kernel  # noqa: E402

if is_interpreted(quantize_nvfp4_kernel):
    pytest.skip("kernels were defined under TRITON_INTERPRET=1; PTX needs the compiler", allow_module_level=True)


def ptx_of(kernel, types: dict, constexprs: dict, arch: int, gdc: bool) -> str:
    signature = {**types, **{k: "constexpr" for k in constexprs}}
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"launch_pdl": gdc, "enable_fp_fusion": False, "num_warps": 4})
    return compiled.asm["ptx"]


QUANT_TYPES = {"x_ptr": "*bf16", "gs_ptr": "*fp32", "q_ptr": "*u8", "sf_ptr": "*u8",
               "M": "i32", "K": "i32", "stride_xm": "i32", "stride_qm": "i32"}


def quant_ptx(arch, gdc):
    return ptx_of(quantize_nvfp4_kernel, QUANT_TYPES,
                  {"SWIZZLE": True, "USE_GDC": gdc, "BLOCK_M": 8, "BLOCK_K": 512}, arch, gdc)


def check_division(ptx: str):
    assert "div.rn.f32" in ptx
    assert not re.search(r"div\.(approx|full)", ptx), "approximate division in a bit-exact kernel"


@pytest.mark.parametrize("gdc", [True, False], ids=["pdl", "nopdl"])
def test_quantizer_sm90(gdc):
    ptx = quant_ptx(90, gdc)
    check_division(ptx)
    assert not re.search(r"\bfma\.", ptx), "FMA contraction in the quantizer"
    assert ("griddepcontrol.wait" in ptx) == gdc
    assert ("griddepcontrol.launch_dependents" in ptx) == gdc
    assert "cvt.rn.satfinite.e4m3" not in ptx  # e4m3 rounding is nvgemm's integer RNE


def test_quantizer_sm80():
    check_division(quant_ptx(80, False))


def test_fused_sm90_pdl():
    types = {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "gs_ptr": "*fp32", "q_ptr": "*u8",
             "sf_ptr": "*u8", "rout_ptr": "*bf16", "y_ptr": "*fp32", "M": "i32", "K": "i32", "KP": "i32",
             "stride_xm": "i32", "stride_rm": "i32", "stride_om": "i32", "stride_qm": "i32", "stride_ym": "i32",
             "eps": "fp32"}
    for one_tile in (True, False):
        ptx = ptx_of(rmsnorm_quantize_kernel, types, {
            "HAS_RESIDUAL": True, "STORE_Y": False, "SWIZZLE": True, "USE_GDC": True, "X_KIND": 1, "ROUND_Y": True,
            "ONE_TILE": one_tile, "BLOCK_M": 1, "BLOCK_K": 4096}, 90, True)
        check_division(ptx)
        assert "sqrt.rn.f32" in ptx and "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
    types = {"x_ptr": "*fp16", "gs_ptr": "*fp32", "q_ptr": "*u8", "sf_ptr": "*u8", "y_ptr": "*fp32",
             "M": "i32", "I": "i32", "stride_xm": "i32", "stride_qm": "i32", "stride_ym": "i32"}
    ptx = ptx_of(silu_mul_quantize_kernel, types, {"STORE_Y": False, "SWIZZLE": True, "USE_GDC": True, "X_KIND": 2,
                                                    "BLOCK_M": 8, "BLOCK_K": 512}, 90, True)
    check_division(ptx)
    assert "griddepcontrol.wait" in ptx


GEMM_TYPES = {"x_ptr": "*bf16", "w_ptr": "*u8", "wsf_ptr": "*u8", "alpha_ptr": "*fp32", "gs_ptr": "*fp32",
              "bias_ptr": "*bf16", "res_ptr": "*bf16", "out_ptr": "*bf16", "M": "i32", "N": "i32", "N_OUT": "i32",
              "K": "i32", "stride_xm": "i32", "stride_wn": "i32", "stride_rm": "i32", "stride_om": "i32"}


@pytest.mark.parametrize("arch", [80, 89, 90, 120])
def test_gemm_builds(arch):
    gdc = arch >= 90
    ptx = ptx_of(w4a16_gemm_kernel, GEMM_TYPES, {
        "QUANT_A": True, "ALPHA_VECTOR": True, "HAS_BIAS": True, "ACTIVATION": 3, "HAS_RESIDUAL": True,
        "X_KIND": 1, "OUT_KIND": 1, "DOT_FP32": False, "USE_GDC": gdc, "BLOCK_M": 16, "BLOCK_N": 64,
        "BLOCK_K": 128}, arch, gdc)
    check_division(ptx)
    assert "mma" in ptx  # tensor-core dot on bf16 operands
    assert ("griddepcontrol.wait" in ptx) == gdc
