"""Epilogues: alpha -> bias -> activation -> residual -> cast. The host spec and its torch reference are
:mod:`nvgemm.core.epilogue` (re-exported here); this package adds the CuTeDSL ``apply`` functors
(:mod:`.cute_apply`, cutlass imported lazily) and the requant PTX helpers (:mod:`.requant`).
"""

from nvgemm.core.epilogue import ACTIVATIONS, ALPHA_KINDS, OUT_DTYPES, EpilogueSpec, apply_activation_ref, epilogue_ref

__all__ = ["ACTIVATIONS", "ALPHA_KINDS", "OUT_DTYPES", "EpilogueSpec", "apply_activation_ref", "epilogue_ref"]
