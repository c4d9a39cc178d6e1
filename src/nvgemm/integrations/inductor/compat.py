"""The TorchInductor pieces nvgemm's integration uses, probed in one place, per torch version.

nvgemm's Inductor integration is built from public extension points where PyTorch has them and
from a few private names where it has none. Every such piece is listed here once, with the first
torch release that has it in the form nvgemm needs and the releases it was checked against.
``nvgemm.enable()`` probes them (the probe looks at the running torch, not at its version string):

* a **required** piece that is missing makes ``enable()`` raise, naming the piece and the torch
  release that has it; the rest of nvgemm (ops, kernels, checkpoint loading, eager
  ``NVFP4Linear``) keeps working;
* an **optional** piece that is missing is skipped with one warning naming it, and compiled
  graphs stay correct without it (no PDL chain, default benchmarking, ...).

``nvgemm.integrations.inductor.compat.report()`` prints the table for the running torch.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from dataclasses import dataclass
from typing import Callable, Optional

import torch

log = logging.getLogger("nvgemm_cutedsl")

#: torch releases on which every probe below was run and the integration's CPU tests passed.
CHECKED_TORCH = ("2.11.0", "2.12.1", "2.13.0", "2.14.0", "2.15.0")

#: the key of nvgemm's Inductor counters in ``torch._dynamo.utils.counters``
COUNTER = "nvgemm_cutedsl"


def nvgemm_counters():
    """nvgemm's Inductor counters (``lowered``, ``scaled_mm_claimed``, ``requant_fused``, ...):
    ``torch._dynamo.utils.counters["nvgemm_cutedsl"]``. ``torch._dynamo.utils.counters`` is a private
    name of torch, used here only (present in every release of :data:`CHECKED_TORCH`)."""
    from torch._dynamo.utils import counters

    return counters[COUNTER]


def _torch_release() -> tuple[int, ...]:
    from packaging.version import Version

    return Version(torch.__version__.split("+")[0]).release


def _attr(path: str):
    """``module.attr.attr`` -> the object, or raise LookupError naming what is missing."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        mod_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(mod_name)
        except ImportError:
            continue
        for a in parts[i:]:
            if not hasattr(obj, a):
                raise LookupError(f"{path} (no {a!r} in {mod_name})")
            obj = getattr(obj, a)
        return obj
    raise LookupError(f"{path} (module not found)")


def _params(path: str) -> set[str]:
    return set(inspect.signature(_attr(path)).parameters)


def _source(path: str) -> str:
    return inspect.getsource(_attr(path))


# --------------------------------------------------------------------------- probes
# Each probe returns None when the piece is usable, else a short reason; it never raises.

_AUTOTUNE = "torch._inductor.kernel.custom_op.register_custom_op_autotuning"


def _probe_custom_op_autotuning() -> Optional[str]:
    need = {"config_generator", "name", "input_gen_fns", "dispatch_on", "split_points"}
    missing = need - _params(_AUTOTUNE)
    if missing:
        return f"{_AUTOTUNE} lacks {sorted(missing)}"
    _attr("torch._inductor.kernel.custom_op.CustomOpConfig")
    if "range_upper_bound" not in inspect.getsource(_attr("torch._inductor.kernel.custom_op")):
        return "custom-op autotuning has no range dispatch (dispatch_on range_upper_bound)"
    lowering_table()
    _attr("torch._inductor.lowering.fallback_handler")
    return None


def lowering_table() -> dict:
    """The table custom-op autotuning registers into, which nvgemm's lowering goes into too.

    torch >= 2.12: ``torch._inductor.lowering.user_lowerings`` (checked before the built-in
    lowerings); 2.11: the built-in ``lowerings`` dict itself (custom ops have no entry there, so
    nvgemm's takes the place of Inductor's fallback).
    """
    from torch._inductor import lowering

    table = getattr(lowering, "user_lowerings", None)
    return table if table is not None else lowering.lowerings


def _probe_cudagraph_benchmarking() -> Optional[str]:
    if "benchmark_with_cudagraphs" in _params(_AUTOTUNE):
        return None
    return f"{_AUTOTUNE} has no benchmark_with_cudagraphs"


def _probe_post_grad_pre_pass() -> Optional[str]:
    from torch._inductor import config

    if not hasattr(config, "post_grad_custom_pre_pass"):
        return "torch._inductor.config has no post_grad_custom_pre_pass"
    _attr("torch._inductor.custom_graph_pass.CustomGraphPass")
    _attr("torch._inductor.custom_graph_pass.get_hash_for_files")
    return None


def _probe_pdl() -> Optional[str]:
    sched = _attr("torch._inductor.codegen.nv_universal_gemm.nv_universal_gemm_scheduling.NVUniversalGemmScheduling")
    if "is_pdl_enabled_template" not in sched.__dict__:
        return "NVUniversalGemmScheduling has no is_pdl_enabled_template (selective PDL)"
    if not hasattr(_attr("torch._inductor.codegen.triton.TritonKernel"), "_enable_pdl_codegen"):
        return "TritonKernel has no _enable_pdl_codegen (selective PDL)"
    scheduler = _attr("torch._inductor.scheduler.Scheduler")
    if not hasattr(scheduler, "codegen_extern_call") or "previous_node" not in inspect.getsource(scheduler):
        return "Scheduler lacks codegen_extern_call / previous_node"
    return None


def _probe_decode_benchmark() -> Optional[str]:
    from torch._inductor import config

    if not hasattr(config, "autotune_cudagraph_benchmarking_iters"):
        return "torch._inductor.config has no autotune_cudagraph_benchmarking_iters"
    caller = _attr("torch._inductor.codegen.subgraph.SubgraphChoiceCaller")
    if not hasattr(caller, "_create_benchmark_request"):
        return "SubgraphChoiceCaller has no _create_benchmark_request"
    src = inspect.getsource(_attr("torch._inductor.autotune_process"))
    if "cudagraph_unroll" not in src or "cudagraph_cold_cache_input_indices" not in src:
        return "benchmark requests have no cudagraph_unroll / cold-cache inputs"
    return None


def _probe_include_fallback() -> Optional[str]:
    return None if "include_fallback" in _params(_AUTOTUNE) else f"{_AUTOTUNE} has no include_fallback"


def _probe_scaled_mm_fold() -> Optional[str]:
    post_grad = _attr("torch._inductor.fx_passes.post_grad")
    if not hasattr(post_grad, "_can_fold_scaled_mm_output_scale"):
        return "this torch has no mul(_scaled_mm, alpha) -> _scaled_mm(scale_result=alpha) fold"
    return None


@dataclass(frozen=True)
class Piece:
    name: str
    what: str
    since: str  # first torch release that has it in the form nvgemm uses
    required: bool
    without: str  # what enable() does when the piece is missing
    probe: Callable[[], Optional[str]]

    def missing(self) -> Optional[str]:
        """None when usable on the running torch, else why not (never raises)."""
        try:
            return self.probe()
        except Exception as e:  # an import or lookup failure means "missing", with the reason
            return f"{type(e).__name__}: {e}"


PIECES: tuple[Piece, ...] = (
    Piece("custom_op_autotuning",
          "register_custom_op_autotuning with config_generator and M-range dispatch (dispatch_on with "
          "range_upper_bound, split_points); its lowering table (user_lowerings, or lowerings on 2.11)",
          "2.11", True, "enable() raises", _probe_custom_op_autotuning),
    Piece("post_grad_pre_pass",
          "config.post_grad_custom_pre_pass with CustomGraphPass (runs before Inductor's pattern passes)",
          "2.11", True, "enable() raises", _probe_post_grad_pre_pass),
    Piece("cudagraph_benchmarking",
          "register_custom_op_autotuning(benchmark_with_cudagraphs=True): candidates timed inside CUDA graphs",
          "2.12", False, "candidates are timed with Inductor's default (eager) benchmarking (one warning)",
          _probe_cudagraph_benchmarking),
    Piece("pdl_hook",
          "selective PDL into Triton consumers (NVUniversalGemmScheduling.is_pdl_enabled_template, "
          "TritonKernel._enable_pdl_codegen, Scheduler.previous_node)",
          "2.15", False, "no PDL chain into Triton consumers (one warning)", _probe_pdl),
    Piece("decode_benchmark_policy",
          "CUDA-graph benchmarking with 16 calls per graph and cold weights "
          "(cudagraph_unroll / cudagraph_cold_cache_input_indices, autotune_cudagraph_benchmarking_iters)",
          "2.15", False, "Inductor's default benchmarking of each candidate (one warning)", _probe_decode_benchmark),
    Piece("include_fallback",
          "register_custom_op_autotuning(include_fallback=False)",
          "2.15", False, "the op's eager implementation is one more (correct) autotuning choice", _probe_include_fallback),
    Piece("scaled_mm_fold",
          "PyTorch's own mul(_scaled_mm, alpha) fold, which nvgemm's pass claims NVFP4 chains ahead of",
          "2.15", False, "hand-written _scaled_mm * alpha chains are left to PyTorch by default", _probe_scaled_mm_fold),
)
BY_NAME = {p.name: p for p in PIECES}


def probe() -> dict[str, Optional[str]]:
    """``{piece name: None if usable else reason}`` for the running torch."""
    return {p.name: p.missing() for p in PIECES}


def available(name: str) -> bool:
    return BY_NAME[name].missing() is None


def check_required() -> dict[str, Optional[str]]:
    """Probe every piece; raise RuntimeError naming each missing *required* piece."""
    state = probe()
    bad = [p for p in PIECES if p.required and state[p.name] is not None]
    if bad:
        lines = "; ".join(f"{p.name} ({p.what}; torch >= {p.since} has it): {state[p.name]}" for p in bad)
        raise RuntimeError(
            f"nvgemm_cutedsl: the TorchInductor integration cannot run on torch {torch.__version__}: missing "
            f"{lines}. Everything else in nvgemm (ops, kernels, checkpoint loading, eager NVFP4Linear) works "
            f"on this torch."
        )
    return state


def report() -> str:
    """A human-readable table of the pieces on the running torch."""
    state = probe()
    rows = [f"torch {torch.__version__} (integration checked on {', '.join(CHECKED_TORCH)})"]
    for p in PIECES:
        st = "yes" if state[p.name] is None else f"NO: {state[p.name]}"
        rows.append(f"  {p.name:<24} {'required' if p.required else 'optional'}  torch>={p.since}  {st}")
        if state[p.name] is not None:
            rows.append(f"  {'':<24} without it: {p.without}")
    return "\n".join(rows)


def unchecked_release() -> Optional[str]:
    """A warning text when the running torch is not one the integration was checked on."""
    rel = ".".join(map(str, _torch_release()[:2]))
    if any(c.startswith(rel + ".") for c in CHECKED_TORCH):
        return None
    return (f"nvgemm_cutedsl: torch {torch.__version__} is not among the releases the Inductor integration was "
            f"checked on ({', '.join(CHECKED_TORCH)}); every piece it uses probed present, continuing")
