"""nvgemm's Triton kernels: NVFP4 activation quantizers (plain and fused) and the W4A16 fallback GEMM.

Importing this package imports nothing heavy; the modules are:

* :mod:`.quantize` — activation quantizer (bf16/fp16/fp32 [M, K] -> packed E2M1 + swizzled e4m3);
* :mod:`.prebound` — a pre-bound Triton launch (first call through ``JITFunction.run``, then only the
  pointers change), used by the quantizer;
* :mod:`.fused` — RMSNorm / add+RMSNorm / SiLU-mul fused with the quantizer;
* :mod:`.gemm_w4a16` — weight-only NVFP4 GEMM with the full nvgemm epilogue (and W4A4 by
  in-kernel quantize-dequantize of x);
* :mod:`.rope` — RoPE of q / k and the KV-cache write of k / v in one launch (the decode step's
  ``nvgemm::rope_kv_write``);
* :mod:`.reference` — pure-torch references of the fused quantizers and of the RoPE + KV write;
* :mod:`.fused_ops` — the ``nvgemm::*_quantize_nvfp4`` and ``nvgemm::rope_kv_write`` torch ops (torch only);
* :mod:`.moe` — the grouped MoE kernels behind ``triton_moe``;
* :mod:`.backend` — the ``triton_w4a16`` and ``triton_moe`` backends (named below; imported on first
  dispatch), which also registers the fused quantizer ops and installs the CUDA quantizer.

All kernels are bit-exact with :mod:`nvgemm.core.formats` by construction (IEEE division, integer RNE
conversions) and are tested on CPU under ``TRITON_INTERPRET=1``. This ``__init__`` registers the family
by name and imports nothing else.
"""

from nvgemm.core.family import register_family

_P = __name__

register_family(
    name="triton",
    package=_P,
    summary="Triton NVFP4 fallback GEMM and grouped MoE for CUDA sm_80+, and the activation quantizers",
    backends=(("linear", f"{_P}.backend:BACKEND"), ("moe", f"{_P}.backend:MOE_BACKEND")),
    can_implement=f"{_P}.backend:supports",
    launcher=f"{_P}.gemm_w4a16",
    omits=(
        ("configs", "no config type: block sizes are picked per call (gemm_w4a16.gemm_config, moe.moe_config)"),
        ("kernels", "Triton compiles at first call (JIT); nothing is precompiled into the AOT cache"),
        ("policy", "no candidate list: the per-call block-size rule in gemm_w4a16 / moe is the whole choice"),
        ("perf", "not ranked by the performance model: a portable fallback below the CuTeDSL backends"),
    ),
)
