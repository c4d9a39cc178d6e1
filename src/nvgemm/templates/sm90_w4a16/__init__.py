"""The sm_90a NVFP4 weight-only (W4A16) kernel families, one folder: config space and validity rule
(:mod:`.config`), the weight operand layout and its exact decode in torch (:mod:`.operand`), the
CuTeDSL kernels (:mod:`.mma` decode kernel, :mod:`.wgmma`; shared pieces in :mod:`.common`) and the
pure-torch host launcher (:mod:`.launch`). Importing this package imports nothing heavy: the
kernel modules import cutlass and are loaded only to compile
(``nvgemm.aot.abi.BUILTIN_TEMPLATE_MODULES``); the run-time wiring (config choice,
kernel cache, backend registration) is ``nvgemm.templates.sm90_w4a16.backend``.
"""
