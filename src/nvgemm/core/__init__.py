"""The contract every other layer builds on: the NVFP4 format reference (:mod:`.formats`), the GEMM problem
descriptor (:mod:`.problem`), ``Status`` (:mod:`.status`) and safe file reading (:mod:`.files`).
Imports no other nvgemm module."""
