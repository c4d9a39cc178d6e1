"""The contract every other layer builds on: the NVFP4 format reference (:mod:`.formats`), the GEMM problem
descriptor (:mod:`.problem`), one call's validation, problem, operand alignment and ``alpha``
(:mod:`.validation`), ``Status`` (:mod:`.status`), safe file reading (:mod:`.files`), what a dispatch
backend is (:mod:`.backend`) and the kernel-family registry (:mod:`.family`)."""
