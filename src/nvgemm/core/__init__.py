"""The contract every other layer builds on: the NVFP4 format reference (:mod:`.formats`), the GEMM problem
descriptor (:mod:`.problem`), one call's validation, problem, operand alignment and ``alpha``
(:mod:`.validation`), ``Status`` (:mod:`.status`) and safe file reading (:mod:`.files`).
Imports no other nvgemm module, except the epilogue spec (:mod:`nvgemm.epilogues.spec`, torch only) that
validation returns."""
