"""Programmatic dependent launch from an nvgemm GEMM into the Inductor Triton kernel consuming it.

The GEMMs are the compiled calls of nvgemm's choice ops (:data:`nvgemm.integrations.inductor.choices.CHOICE_DEFS`:
``nvfp4_linear``, the sm90-prepared linear, the fused requant, prequant and prequant-requant) whose candidate is a
kernel backend.

PyTorch 2.15's selective PDL (``TritonKernel._enable_pdl_codegen``, ``codegen/triton.py``) gives a
Triton kernel ``tl.extra.cuda.gdc_wait()`` before its first dependent access and
``launch_pdl=True`` when ``scheduler.previous_node`` -- the node generated just before it on the
same stream -- is a PDL-enabled NVGEMM (``NVUniversalGemmScheduling.is_pdl_enabled_template``)
whose output it reads. It never fires for nvgemm for two reasons, both verified in the 2.15
sources:

1. ``is_pdl_enabled_template`` recognises only ``NVUniversalGemmBuffer`` / an NVGEMM
   ``MultiTemplateBuffer``;
2. ``Scheduler._codegen`` records a node as "previous" only when all its nodes are plain
   ``SchedulerNode`` s; after an extern kernel (which is what an inlined nvgemm choice op is)
   ``previous_node`` is ``None``.

:func:`install` patches, while nvgemm is enabled and only then, (1) the predicate to also accept
an nvgemm producer, and (2) ``Scheduler.previous_node`` (a property) so that, when the loop
would set it to ``None`` right after generating an nvgemm producer, it keeps that producer.
Every other Triton kernel is unaffected: ``triton.enable_pdl`` stays off and PyTorch's own
conditions (single-launch kernel, same stream, a real data dependency on the producer's output,
``nvgemm_pdl != "0"``, sm_90+) still apply. :func:`uninstall` restores the originals.

Correctness does not depend on when the producer triggers: per the PTX ISA, ``griddepcontrol.wait``
waits until all prerequisite grids in flight have *completed* and all their memory operations are
performed and made visible to the current grid. ``launch_dependents`` only lets the dependent grid
be *scheduled* early (once every CTA of the producer has executed it or exited); it never releases
a ``wait``. A consumer launched with PDL after a producer that never calls ``launch_dependents``
merely starts later (when the producer completes), and what the consumer does before its ``wait``
must not read the producer's output.
"""

from __future__ import annotations

import logging

import torch

from nvgemm.integrations.inductor.choices import CHOICE_DEFS, Candidate, choice_keys
from nvgemm.templates.sm90_w4a16.config import config_from_name

#: the W4A16 ``mma`` kernel's backend off Hopper (``templates.sm90_w4a16.backend.MMA_BACKEND_NAME``)
MMA_W4A16 = "cutedsl_mma_w4a16"

log = logging.getLogger("nvgemm_cutedsl")

_SAVED: dict = {}
_PENDING = "_nvgemm_cutedsl_pending_producer"
_PREV = "_nvgemm_cutedsl_previous_node"


def _choice_ops() -> dict:
    """nvgemm's choice ops (one GEMM candidate each: ``nvfp4_linear``, the sm90-prepared linear, requant,
    prequant, prequant-requant), by OpOverload."""
    return {d.choice_overload(): d for d in CHOICE_DEFS.values()}


def _is_pdl_kernel(key: str) -> bool:
    # Kernel backends launch with PDL; the emulated reference (a chain of torch ops), the unfused fallback
    # and cuBLASLt gain nothing from it, so their consumers are left alone. The W4A16 mma kernel off Hopper
    # uses PDL only where the arch has griddepcontrol (sm_120 / sm_121; its configs say so, ``_pdl``), never
    # on sm_80 / sm_86 / sm_89.
    if not key.startswith("backend:") or key in ("backend:emulated", "backend:unfused"):
        return False
    cand = Candidate(key)
    if cand.backend == MMA_W4A16:
        if cand.config is not None:
            return config_from_name(cand.config).pdl
        return torch.cuda.get_device_capability()[0] >= 9  # the backend's own pick: PDL where the arch has it
    return True


def producer_choice(node) -> str | None:
    """The choice key when scheduler ``node`` is (an output of) an nvgemm GEMM choice op that uses PDL
    (a range-table choice: when one of its ranges' candidates does)."""
    from torch._inductor import ir
    from torch._inductor.scheduler import ExternKernelSchedulerNode

    if not isinstance(node, ExternKernelSchedulerNode):
        return None
    k = node.node
    if isinstance(k, ir.MultiOutput) and k.inputs:
        k = k.inputs[0]
    if not isinstance(k, ir.FallbackKernel):
        return None
    if getattr(k, "op_overload", None) not in _choice_ops():
        return None
    choice = k.constant_args[-1] if k.constant_args and isinstance(k.constant_args[-1], str) else None
    if choice is None:
        choice = (getattr(k, "kwargs", None) or {}).get("choice")
    if not isinstance(choice, str):
        return None
    if not any(_is_pdl_kernel(key) for key in choice_keys(choice)):
        return None
    return choice


def install() -> None:
    if _SAVED:
        return
    from torch._inductor.codegen.nv_universal_gemm.nv_universal_gemm_scheduling import NVUniversalGemmScheduling
    from torch._inductor.scheduler import Scheduler

    orig_pred = NVUniversalGemmScheduling.__dict__["is_pdl_enabled_template"]
    orig_extern = Scheduler.codegen_extern_call
    had_prev_attr = "previous_node" in Scheduler.__dict__
    _SAVED.update(pred=orig_pred, extern=orig_extern, had_prev=had_prev_attr,
                  prev=Scheduler.__dict__.get("previous_node"))

    def is_pdl_enabled_template(node) -> bool:
        return orig_pred.__func__(node) or producer_choice(node) is not None

    def codegen_extern_call(self, scheduler_node):
        out = orig_extern(self, scheduler_node)
        self.__dict__[_PENDING] = scheduler_node if producer_choice(scheduler_node) is not None else None
        return out

    def _get_prev(self):
        return self.__dict__.get(_PREV)

    def _set_prev(self, value):
        pending = self.__dict__.pop(_PENDING, None)
        if value is None and pending is not None:
            value = pending
            log.debug("nvgemm_cutedsl: PDL chain from %s into the next Triton kernel", pending.get_name())
        self.__dict__[_PREV] = value

    NVUniversalGemmScheduling.is_pdl_enabled_template = staticmethod(is_pdl_enabled_template)
    Scheduler.codegen_extern_call = codegen_extern_call
    Scheduler.previous_node = property(_get_prev, _set_prev)


def uninstall() -> None:
    if not _SAVED:
        return
    from torch._inductor.codegen.nv_universal_gemm.nv_universal_gemm_scheduling import NVUniversalGemmScheduling
    from torch._inductor.scheduler import Scheduler

    NVUniversalGemmScheduling.is_pdl_enabled_template = _SAVED["pred"]
    Scheduler.codegen_extern_call = _SAVED["extern"]
    if _SAVED["had_prev"]:
        Scheduler.previous_node = _SAVED["prev"]
    else:
        del Scheduler.previous_node
    _SAVED.clear()


def installed() -> bool:
    return bool(_SAVED)
