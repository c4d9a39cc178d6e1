"""The Triton family's backends (named in the family's registration; imported on first dispatch).

Importing this module imports torch only (Triton loads on first use), and:

* registers the fused-quantizer ops (``nvgemm::rmsnorm_quantize_nvfp4``,
  ``nvgemm::add_rmsnorm_quantize_nvfp4``, ``nvgemm::silu_mul_quantize_nvfp4``);
* defines backend ``triton_w4a16`` (:data:`BACKEND`) for ``nvgemm::nvfp4_linear`` with priority
  :data:`PRIORITY` (0: below the CuTeDSL backends, e.g. ``cutedsl_sm100`` at 100, above
  ``emulated`` at -1000). It supports CUDA sm_80+ with Triton importable and bf16/fp16 x, for
  weight-only problems and for W4A4 problems (in-kernel quantize-dequantize of x: same values as a
  W4A4 kernel, see :mod:`nvgemm.templates.triton.gemm_w4a16`);
* defines MoE backend ``triton_moe`` (:data:`MOE_BACKEND`) for ``nvgemm::nvfp4_moe`` (:mod:`nvgemm.templates.triton.moe`,
  priority :data:`MOE_PRIORITY`: above ``emulated``) on CUDA sm_80+ with Triton importable;
* installs the Triton activation quantizer as the CUDA implementation of
  ``nvgemm::quantize_nvfp4`` (``nvgemm.ops.linear.set_cuda_quantizer``), falling back to the torch
  reference on devices the kernel cannot serve.
"""

from __future__ import annotations

import torch

from nvgemm.ops import linear as nv_ops
from nvgemm.core.backend import Backend, LinearProblem

from nvgemm.templates.triton import fused_ops  # noqa: F401  (registers the fused quantizer ops)
from nvgemm.templates.triton.fused_ops import _triton_import_error, triton_unusable

NAME = "triton_w4a16"
PRIORITY = 0
MOE_NAME = "triton_moe"
MOE_PRIORITY = 0


def supports(p: LinearProblem) -> str | None:
    """Whether the Triton kernels serve problem ``p`` (a ``LinearProblem`` or a ``MoeProblem``: both have
    device_type, capability and x_dtype; every op feature is supported)."""
    if p.device_type != "cuda":
        return f"needs a CUDA device, got {p.device_type}"
    if p.capability is None or tuple(p.capability) < (8, 0):
        return f"needs sm_80 or newer, got {p.capability}"
    if p.x_dtype not in (torch.bfloat16, torch.float16):
        return f"x must be bfloat16 or float16, got {p.x_dtype}"
    return _triton_import_error()


def run(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype):
    from nvgemm.templates.triton.gemm_w4a16 import nvfp4_linear_triton

    return nvfp4_linear_triton(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation,
                               out_dtype)


def moe_run(*args):
    from nvgemm.templates.triton.moe import nvfp4_moe_triton

    return nvfp4_moe_triton(*args)


def cuda_quantizer(x: torch.Tensor, input_scale: torch.Tensor, swizzle: bool):
    if triton_unusable(x.device) is None:
        from nvgemm.templates.triton.quantize import quantize_nvfp4_triton

        return quantize_nvfp4_triton(x, input_scale, swizzle)
    return nv_ops.quantize_nvfp4_emulated(x, input_scale, swizzle)


BACKEND = Backend(name=NAME, priority=PRIORITY, supports=supports, run=run)
MOE_BACKEND = Backend(name=MOE_NAME, priority=MOE_PRIORITY, supports=supports, run=moe_run)
nv_ops.set_cuda_quantizer(cuda_quantizer)
