"""nvgemm's CPU performance model of its kernels -- a MODEL: a GPU measurement overrides it.

Two halves:

* **analytic** (this package; importable from ``nvgemm.heuristics``, no compile, ~0.1 ms per
  full estimate, ~11 us per config scalar, a few us per config on the ranking's batch path,
  :mod:`.batch`): :func:`estimate` / :func:`estimate_us` /
  :func:`rank` / :func:`best` turn a kernel config and a shape (M, N, K) into a modelled time range
  for a named GPU -- a grid in rounds over the SMs with fill, tails and co-limits
  (:mod:`.model`) -- from the static facts
  of the compiled kernel in the committed table (``sass_facts.json``, :mod:`.table`), the
  family's geometry (:mod:`.facts`, each family's ``perf.py``) and the hardware description
  (:mod:`.hardware`). :func:`bf16_baseline` models bf16 cuBLAS with the same bandwidth, fill and
  launch (one efficiency assumption for both sides of every ratio). Spills are per compiled
  variant (:func:`.table.spill_status`).
* **compiling** (:mod:`nvgemm.cli.sass_tool`; in the CLI, above the compile path it imports --
  templates, :mod:`nvgemm.aot`, the candidate policy -- and not imported by this package): compiles a config for its arch
  without a GPU, reads its SASS (:mod:`.sass`) and derives the static facts; it also regenerates
  the table (``nvgemm model --regen-table``).

The per-family **facts hook** is :class:`FamilyFacts` (:mod:`.facts` documents how to add a
family); the model equations are in :mod:`.model`. Imports stay below the heuristics:
templates' pure-Python config modules and the standard library.

CLI: ``nvgemm model`` (``nvgemm.cli.model``); reports: ``bench/perf_model.py``
(``bench/results/sm90_model.md``, ``bench/results/sm100_model.md``).
"""

from nvgemm.heuristics.perfmodel.baseline import BaselineEstimate, bf16_baseline
from nvgemm.heuristics.perfmodel.facts import (
    FamilyFacts,
    Geometry,
    KernelFacts,
    SplitKReduce,
    family_for,
    registered_families,
)
from nvgemm.heuristics.perfmodel.hardware import GPUS, Hardware, get_hardware
from nvgemm.heuristics.perfmodel.model import (
    MODEL_TIE,
    Estimate,
    best,
    estimate,
    estimate_us,
    estimate_with,
    rank,
    why_not,
)
from nvgemm.heuristics.perfmodel.table import lookup, table_header

__all__ = [
    "GPUS",
    "BaselineEstimate",
    "Estimate",
    "FamilyFacts",
    "Geometry",
    "Hardware",
    "KernelFacts",
    "SplitKReduce",
    "best",
    "bf16_baseline",
    "estimate",
    "estimate_us",
    "estimate_with",
    "family_for",
    "get_hardware",
    "lookup",
    "rank",
    "MODEL_TIE",
    "registered_families",
    "table_header",
    "why_not",
]
