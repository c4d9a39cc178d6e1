"""The PDL prologue check of the emulator kernel tests, from the emulator's record of the global accesses each
warp makes before its ``griddepcontrol.wait`` (``Launch.ext["pdl_pre_wait_*"]``; plain and bulk tensor (TMA)
loads and stores, ``cp.async``, and TMA L2 prefetches)."""


def check_pdl_prologue(launch, weights, prefetch=True, routing=frozenset(), early_weights=False):
    """Before ``griddepcontrol.wait`` a grid reads or prefetches only ``weights`` (the allocation names of the
    weights and their scales: no grid of the stream writes them) and ``routing`` (the allocation names of a
    work list / routing ids / row table written by a grid that *completed before the producer's wait*: a
    grouped GEMM2, whose producer GEMM1 signals only after its own wait -- see the sm100 / sm90 MoE kernels'
    docstrings) and writes nothing. Anything else -- the activations above all, the producer's output --
    read before the wait fails. ``prefetch``: it warms L2 with weight tiles there (TMA prefetch: the dense
    sm100 kernel's prologue, the grouped sm100 GEMM2's); ``early_weights``: it reads weight bytes there (the
    grouped GEMM2's first weight copies / prefetches: the prologue the PDL overlap is for)."""
    ext = launch.ext
    assert launch.stats.get("griddepcontrol.wait", 0) > 0, "no griddepcontrol.wait executed"
    reads = ext.get("pdl_pre_wait_reads", set())
    early = reads | ext.get("pdl_pre_wait_prefetches", set())
    allowed = set(weights) | set(routing)
    assert early <= allowed, f"read before griddepcontrol.wait: {sorted(early - allowed)}"
    assert not ext.get("pdl_pre_wait_writes"), f"written before the wait: {sorted(ext['pdl_pre_wait_writes'])}"
    if prefetch:
        assert ext.get("pdl_pre_wait_prefetches"), "no weight prefetch before the wait: the PDL prologue is gone"
    # a TMA prefetch is per thread: one lane issues it, not every lane of the warp (the emulator records a
    # warp-wide instruction lane by lane, so a per-lane repeat is the same (CTA, tensor, box) twice in a row)
    boxes = ext.get("l2_prefetch_boxes", [])
    dup = sum(a == b for a, b in zip(boxes, boxes[1:]))
    assert not dup, f"{dup} of {len(boxes)} TMA L2 prefetches repeat the box the same CTA just requested"
    if early_weights:
        assert early & set(weights), f"no weight read before the wait (early: {sorted(early)}): the prologue is gone"


def check_signals_after_wait(launch):
    """Every CTA of a PDL grid counts for its dependents (first ``launch_dependents``, or exit) only after a
    ``griddepcontrol.wait`` returned: no warp signals before its own wait (program order) and no CTA exits
    with none of its threads past a wait. So the dependent grid starts only once this grid's prerequisite
    completed (PTX ISA ``griddepcontrol``) and may read that prerequisite's output before its own wait."""
    ext = launch.ext
    assert launch.stats.get("griddepcontrol.launch_dependents", 0) > 0, "no griddepcontrol.launch_dependents"
    assert not ext.get("pdl_signals_before_wait"), \
        f"{ext['pdl_signals_before_wait']} launch_dependents before the warp's wait: a dependent may start early"
    assert not ext.get("pdl_ctas_without_wait"), f"{ext['pdl_ctas_without_wait']} CTAs exited without a wait"
