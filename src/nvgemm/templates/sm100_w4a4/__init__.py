"""The Blackwell (sm_100a family) NVFP4 W4A4 GEMM family, in one place.

==================  ==========================================================================
``config``          :class:`Sm100Nvfp4GemmConfig` (the config space) and ``validate_config``
``validity``        ``can_implement_problem``: the problem-level rule (shapes, alignment,
                    narrow tiles, split-K) the policy and the launcher both apply
``occupancy``       clusters resident at once per arch (the AOT ``max_active_clusters``)
``kernel``          the CuTeDSL kernel (TMA / MMA roles, host ``__call__``) and its template
``epilogue``        the epilogue warps (TMEM load, epilogue math, stores, split-K reduce)
``launch``          host launcher: argument preparation, split-K workspaces, launch (torch)
==================  ==========================================================================

``config``, ``validity`` and ``occupancy`` are pure Python; ``kernel`` and ``epilogue`` import
cutlass (only the cache's compile path imports them); ``launch`` imports torch. Selecting a
config (``nvgemm.heuristics``), fetching the compiled kernel and registering the backend
(``nvgemm.templates.sm100_w4a4.backend``) stay outside this folder. This ``__init__`` imports nothing.
"""
