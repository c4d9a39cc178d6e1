"""The PDL prologue check of the emulator kernel tests, from the emulator's record of the global accesses each
warp makes before its ``griddepcontrol.wait`` (``Launch.ext["pdl_pre_wait_*"]``; plain and bulk tensor (TMA)
loads and stores, and TMA L2 prefetches)."""


def check_pdl_prologue(launch, weights, prefetch=True):
    """Before ``griddepcontrol.wait`` a grid reads or prefetches only ``weights`` (the allocation names of the
    weights and their scales: a predecessor never writes them) and writes nothing; ``prefetch``: it warms L2
    with weight tiles there (the dense sm100 kernel's prologue)."""
    ext = launch.ext
    assert launch.stats.get("griddepcontrol.wait", 0) > 0, "no griddepcontrol.wait executed"
    early = ext.get("pdl_pre_wait_reads", set()) | ext.get("pdl_pre_wait_prefetches", set())
    assert early <= weights, f"read before griddepcontrol.wait: {sorted(early - weights)}"
    assert not ext.get("pdl_pre_wait_writes"), f"written before the wait: {sorted(ext['pdl_pre_wait_writes'])}"
    if prefetch:
        assert ext.get("pdl_pre_wait_prefetches"), "no weight prefetch before the wait: the PDL prologue is gone"
