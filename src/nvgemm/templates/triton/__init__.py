"""nvgemm's Triton kernels: NVFP4 activation quantizers (plain and fused) and the W4A16 fallback GEMM.

Importing this package imports nothing heavy; the modules are:

* :mod:`.quantize` — activation quantizer (bf16/fp16/fp32 [M, K] -> packed E2M1 + swizzled e4m3);
* :mod:`.fused` — RMSNorm / add+RMSNorm / SiLU-mul fused with the quantizer;
* :mod:`.gemm_w4a16` — weight-only NVFP4 GEMM with the full nvgemm epilogue (and W4A4 by
  in-kernel quantize-dequantize of x);
* :mod:`.reference` — pure-torch references of the fused quantizers;
* :mod:`.fused_ops` — the ``nvgemm::*_quantize_nvfp4`` torch ops (torch only);
* :mod:`.backend` — registers the ops, the ``triton_w4a16`` and ``triton_moe`` backends and the CUDA quantizer; it is
  listed in ``nvgemm.dispatch.registry`` built-in modules and loaded on first dispatch.

All kernels are bit-exact with :mod:`nvgemm.core.formats` by construction (IEEE division, integer RNE
conversions) and are tested on CPU under ``TRITON_INTERPRET=1``.
"""
