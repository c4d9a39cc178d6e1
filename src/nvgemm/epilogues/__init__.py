"""Epilogues: alpha -> bias -> activation -> residual -> cast, each with a torch reference.

The CuTeDSL ``apply`` functors live next to the kernels that use them and import cutlass
lazily; this package's top level imports torch only.
"""

from nvgemm.epilogues.spec import ACTIVATIONS, ALPHA_KINDS, OUT_DTYPES, EpilogueSpec, apply_activation_ref, epilogue_ref

__all__ = ["ACTIVATIONS", "ALPHA_KINDS", "OUT_DTYPES", "EpilogueSpec", "apply_activation_ref", "epilogue_ref"]
