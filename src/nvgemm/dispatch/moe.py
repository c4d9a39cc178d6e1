"""Backend selection for ``nvgemm::nvfp4_moe`` (same mechanism as ``nvfp4_linear``'s).

A MoE backend is a :class:`~nvgemm.core.backend.Backend` of op kind ``moe`` in the one registry
(:mod:`nvgemm.dispatch.registry`) with a ``supports(MoeProblem) -> reason | None`` predicate and a
``run`` taking the op's arguments in schema order. The op runs the
highest-priority backend that supports the problem; ``emulated`` (``nvgemm.ops.moe``) supports
everything and is last. Before a kernel backend serves a problem kind for the first time it runs
it once on random data and is compared with the emulated op (``NVGEMM_SELFCHECK=0`` turns this
off); a backend that disagrees or raises is disabled for that problem with one warning.

Override: ``NVGEMM_MOE_BACKEND=<name>`` forces a MoE backend (an error if it cannot run the
problem); otherwise ``NVGEMM_BACKEND=<name>`` forces it too when ``<name>`` is a registered MoE
backend (``NVGEMM_BACKEND=emulated`` makes both ops emulated). Kernel families name their MoE backends
in their registration (loaded on first dispatch, never at ``import nvgemm``). Selection and the
first-use check are shared with ``nvfp4_linear`` (``nvgemm.dispatch.registry``: ``choose_backend``,
``checked_verdict``).
"""

from __future__ import annotations

import threading

import torch

from nvgemm import settings
from nvgemm.core.backend import MOE, Backend, MoeProblem
from nvgemm.dispatch.registry import backends, checked_verdict, choose_backend, registered, warn_once
from nvgemm.core.formats import quantize_weight, to_blocked

_LAST = threading.local()
_CHECKED: dict[tuple, str | None] = {}
#: Element-wise |kernel - emulated| allowed in the first-use check, relative to the largest output of the
#: same token: both quantize the same operands; a kernel may sum in another order, which can move the
#: bf16 rounding of the intermediate h and then one FP4 code of its requantization (~1e-2 of that
#: element, well under 2^-6 of the token's largest output); a wrong kernel is off by O(1) on the
#: elements it breaks, and every element is checked (a single wrong column fails).
SELFCHECK_RTOL = 2.0**-6
_OUT_ULP = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-23}


def selfcheck_bound(args, want: torch.Tensor) -> torch.Tensor:
    """Element-wise allowance of the MoE first-use check for the call ``args`` (emulated output ``want``)."""
    ulp = _OUT_ULP.get(args[16] or args[0].dtype, 2.0**-8)
    row = want.abs().amax(dim=-1, keepdim=True)
    return SELFCHECK_RTOL * row + 2 * ulp * want.abs() + 2.0**-20


def last_moe_selected() -> str | None:
    """Name of the backend the most recent eager ``nvfp4_moe`` in this thread ran on."""
    return getattr(_LAST, "name", None)


def selfcheck_inputs(p: MoeProblem, device: torch.device) -> tuple:
    """Random op arguments (schema order) for problem ``p``: ids cover every slot kind."""
    g = torch.Generator(device="cpu").manual_seed(4321)
    e, h, i = p.num_experts, p.hidden, p.intermediate
    r13 = 2 * i if p.gated else i

    def stack(rows, k):
        qs = [quantize_weight(torch.randn(rows, k, generator=g)) for _ in range(e)]
        return (torch.stack([q.packed for q in qs]), torch.stack([to_blocked(q.scale) for q in qs]),
                torch.stack([q.global_scale.reshape(()) for q in qs]))

    w13, s13, g13 = stack(r13, h)
    if p.alpha13 == "row":
        g13 = g13[:, None] * torch.linspace(0.5, 2.0, r13)
    w2, s2, g2 = stack(h, i)
    x = torch.randn(p.m, h, generator=g)
    ins13 = ins2 = None
    if not p.weight_only:
        ins13 = float(x.abs().amax()) / 2688 * torch.linspace(0.8, 1.2, e)
        ins2 = torch.full((e,), 0.5 / 2688) * torch.linspace(1.2, 0.8, e)
    ids = torch.randint(0, p.num_global_experts, (p.m, p.top_k), generator=g, dtype=torch.int32)
    emap = None
    if p.expert_map:
        emap = torch.full((p.num_global_experts,), -1, dtype=torch.int32)
        emap[: e] = torch.arange(e, dtype=torch.int32)
    if p.m * p.top_k > 1:
        ids.view(-1)[-1] = -1  # an invalid slot
    wts = torch.rand(p.m, p.top_k, generator=g)
    shared = torch.randn(p.m, h, generator=g) if p.shared_out else None
    res = torch.randn(p.m, h, generator=g) if p.residual else None
    xd = p.x_dtype

    def to(t, dtype=None):
        return None if t is None else t.to(device=device, dtype=dtype or t.dtype)

    return (to(x, xd), to(ids), to(wts), to(w13), to(s13), to(g13), to(ins13), to(w2), to(s2), to(g2), to(ins2),
            p.activation, p.router_weight_on_input, to(emap), to(shared, xd), to(res, xd), p.out_dtype)


def _selfcheck(backend: Backend, p: MoeProblem) -> str | None:
    return checked_verdict(_CHECKED, backend, p, selfcheck_inputs, registered(MOE, "emulated").run, selfcheck_bound,
                           "MoE backend")


def select_moe_backend(p: MoeProblem, check: bool = True) -> Backend:
    """The backend ``nvfp4_moe`` runs for ``p`` (deterministic; see the module docstring)."""
    all_b = backends(MOE)
    forced, var = settings.NVGEMM_MOE_BACKEND, "NVGEMM_MOE_BACKEND"
    if not forced and settings.NVGEMM_BACKEND in {b.name for b in all_b}:
        forced, var = settings.NVGEMM_BACKEND, "NVGEMM_BACKEND"

    def on_emulated(reasons):
        warn_once(f"moe-emulated-{p.capability}-{p.weight_only}",
                  "nvgemm_cutedsl: no NVFP4 MoE kernel for this problem "
                  f"({'; '.join(reasons) or 'no MoE kernel backends registered'}); using the emulated "
                  "MoE path (per-expert dequantize + fp32 matmul), which is correct but slow")

    b = choose_backend(all_b, p, forced, var, _selfcheck if check else None, "MoE backend", on_emulated)
    _LAST.name = b.name
    return b
