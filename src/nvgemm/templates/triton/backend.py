"""The Triton family's backends (named in the family's registration; imported on first dispatch).

Importing this module imports torch only (Triton loads on first use), and:

* registers the fused-quantizer ops (``nvgemm::rmsnorm_quantize_nvfp4``,
  ``nvgemm::add_rmsnorm_quantize_nvfp4``, ``nvgemm::silu_mul_quantize_nvfp4``);
* defines backend ``triton_w4a16`` (:data:`BACKEND`) for ``nvgemm::nvfp4_linear`` with priority
  :data:`PRIORITY` (0: below the CuTeDSL backends, e.g. ``cutedsl_sm100`` at 100, above
  ``emulated`` at -1000). It supports CUDA sm_80+ with Triton importable and bf16/fp16 x, for
  weight-only problems and for W4A4 problems (in-kernel quantize-dequantize of x: same values as a
  W4A4 kernel, see :mod:`nvgemm.templates.triton.gemm_w4a16`);
* registers MoE backend ``triton_moe`` for ``nvgemm::nvfp4_moe`` (:mod:`nvgemm.templates.triton.moe`,
  priority :data:`MOE_PRIORITY`: above ``emulated``) on CUDA sm_80+ with Triton importable.

The activation quantizer (``nvgemm::quantize_nvfp4`` on CUDA, and what the W4A4 kernel backends
quantize with) is :func:`nvgemm.templates.triton.fused_ops.quantize_nvfp4_cuda`, called directly.
"""

from __future__ import annotations

import torch

from nvgemm.core.backend import Backend
from nvgemm.core.validation import LinearProblem, linear_spec

from nvgemm.templates.triton import fused_ops  # noqa: F401  (registers the fused quantizer ops)
from nvgemm.templates.triton.fused_ops import _triton_import_error

NAME = "triton_w4a16"
PRIORITY = 0
MOE_NAME = "triton_moe"
MOE_PRIORITY = 0


def supports(p: LinearProblem) -> str | None:
    """Whether the Triton kernels serve problem ``p`` (a ``LinearProblem`` or a ``MoeProblem``: both have
    device_type, capability and x_dtype; every op feature is supported, and any operand alignment: the
    kernels make no alignment assumption)."""
    if p.device_type != "cuda":
        return f"needs a CUDA device, got {p.device_type}"
    if p.capability is None or tuple(p.capability) < (8, 0):
        return f"needs sm_80 or newer, got {p.capability}"
    if p.x_dtype not in (torch.bfloat16, torch.float16):
        return f"x must be bfloat16 or float16, got {p.x_dtype}"
    return _triton_import_error()


def run(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype):
    """The op's call (validated there) on the Triton kernel."""
    # lazy: triton import cost (the kernel module is loaded on first use)
    from nvgemm.templates.triton.gemm_w4a16 import nvfp4_linear_triton

    return nvfp4_linear_triton(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation,
                               out_dtype, spec=linear_spec(x.dtype, weight_scale_2, bias, residual, activation, out_dtype))


def moe_run(*args):
    # lazy: triton import cost
    from nvgemm.templates.triton.moe import nvfp4_moe_triton

    return nvfp4_moe_triton(*args)


BACKEND = Backend(name=NAME, priority=PRIORITY, supports=supports, run=run)
MOE_BACKEND = Backend(name=MOE_NAME, priority=MOE_PRIORITY, supports=supports, run=moe_run)
