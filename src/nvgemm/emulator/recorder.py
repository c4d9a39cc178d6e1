"""Launch recorder: what the real host code of a kernel artifact asks the CUDA runtime for, checked
against what nvgemm's launcher computes.

:func:`record_sm90` / :func:`record_sm100` prepare a call with the production host path on CPU
tensors, launch the kernel's AOT artifact relinked against the fake runtime without executing it,
and return the :class:`~nvgemm.emulator.cuda.LaunchRecord` plus the expectation computed here from the
config and the tensors (independently of the artifact):

* sm90 ``mma`` / ``wgmma``: grid ``(ceil(N_out / features per CTA), split_k, ceil(M / tile_m))`` (mma) or
  ``tiles + tail tiles * (split_k - 1)`` CTAs (wgmma, :func:`~nvgemm.templates.sm90_w4a16.config.wgmma_tail_tiles`),
  block ``32 * num_warps``, no cluster, dynamic smem = the config's ``mma_smem_bytes`` /
  ``wgmma_smem_bytes`` exactly, PDL = ``config.pdl``; every parameter is the ABI's tensor descriptor
  ``{data pointer, int32 dynamic shapes, int64 dynamic strides}`` of the tensor passed;
* sm100: block 192 (6 warps), cluster ``(cluster_m, cluster_n, 1)``, grid ``(cluster_m, cluster_n,
  min(clusters of work, max_active_clusters))`` (the static persistent scheduler over CTA tiles
  rounded to the cluster shape and ``split_k``), dynamic smem within the opt-in limit and the
  kernel's attribute, PDL = ``config.pdl``; the TMA descriptors' global addresses (qword 0) are A,
  B, SFA, SFB (and C where the epilogue stores with TMA), and the raw pointers and (m, n, k) of the
  ABI are passed through unchanged.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import torch

from nvgemm.aot.abi import TensorArg
from nvgemm.aot.artifact import tensor_layout
from nvgemm.core.formats import quantize_weight, to_blocked
from nvgemm.emulator.ptx.machine import DEVICES
from nvgemm.emulator.runner import prepare
from nvgemm.core.epilogue import EpilogueSpec
from nvgemm.templates.sm100_w4a4.launch import CTA_TILE_M, prepare_sm100_args
from nvgemm.templates.sm90_w4a16.backend import compile_spec_for
from nvgemm.templates.sm90_w4a16.config import mma_smem_bytes, wgmma_smem_bytes, wgmma_tail_tiles
from nvgemm.templates.sm90_w4a16.launch import Sm90Workspace, prepare_sm90_args
from nvgemm.templates.sm90_w4a16.operand import prepare_sm90_weight
from nvgemm.templates.sm100_w4a4 import backend as sm100_backend


@dataclass
class Recorded:
    record: Any  # LaunchRecord
    expected: dict
    values: tuple  # the ABI values launched with
    abi: tuple


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def record_sm90(config, m: int, n: int, k: int, activation: str = "none", *, device: str = "H200") -> Recorded:
    g = torch.Generator().manual_seed(m * 131 + n + k)
    q = quantize_weight(torch.randn(n, k, generator=g))
    prepared = prepare_sm90_weight(q.packed, to_blocked(q.scale), q.global_scale.reshape(()), "bf16")
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    args = prepare_sm90_args(x, prepared, None, None, None, activation, torch.bfloat16, config,
                             workspace=Sm90Workspace(torch.device("cpu")))
    sm = DEVICES[device].sm_count
    kern = prepare(compile_spec_for(config, args.spec, x.dtype, sm), device=device)
    values = args.abi_values() + (0,)
    kern.launch(*values, record_only=True)
    rec = kern.records[-1]
    n_out = args.out.shape[1]
    feat = config.tile_n // 2 if activation == "silu_mul" else config.tile_n
    if config.family == "mma":
        grid = (_cdiv(n_out, feat), config.split_k, _cdiv(m, config.tile_m))
        smem = mma_smem_bytes(config)
    else:
        tiles = _cdiv(n_out, feat) * _cdiv(m, config.tile_m)
        grid = (tiles + wgmma_tail_tiles(tiles, config.split_k, sm) * (config.split_k - 1), 1, 1)
        smem = wgmma_smem_bytes(config)
    exp = {"grid": grid, "block": (32 * config.num_warps, 1, 1), "cluster": (1, 1, 1), "dyn_smem": smem,
           "pdl": config.pdl, "params": [_descriptor(a, v) for a, v in zip(kern.kernel.abi, values) if
                                         _is_tensor(a)]}
    return Recorded(rec, exp, values, kern.kernel.abi)


def _is_tensor(a) -> bool:
    return isinstance(a, TensorArg)


def _descriptor(a, t: torch.Tensor) -> list:
    """The exported tensor descriptor of ``t`` for ABI argument ``a``, from the ABI's C layout
    (``void *data``; ``int32/int64 dynamic_shapes[n]``; ``int64 dynamic_strides[m]``, naturally
    aligned), as a list of byte values with None for padding (the host code leaves it unwritten)."""
    shape, stride = tensor_layout(a, t)
    out: list = list(struct.pack("<Q", t.data_ptr()))
    sfmt = "<q" if a.shape_bits == 64 else "<i"
    for d in a.dyn_shape_modes:
        out += list(struct.pack(sfmt, shape[d]))
    if a.dyn_stride_modes:
        out += [None] * (-len(out) % 8)
        for d in a.dyn_stride_modes:
            out += list(struct.pack("<q", stride[d]))
    return out + [None] * (-len(out) % 8)


def descriptor_matches(raw: bytes, want: list) -> bool:
    return len(raw) == len(want) and all(w is None or r == w for r, w in zip(raw, want))


def record_sm100(config, m: int, n: int, k: int, activation: str = "none", *, device: str = "B200") -> Recorded:
    # lazy: cuda/cutlass import cost
    from nvgemm.templates.sm100_w4a4.kernel import max_active_clusters_for

    g = torch.Generator().manual_seed(m * 131 + n + k)
    q = quantize_weight(torch.randn(n, k, generator=g))
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    spec = EpilogueSpec(alpha="scalar", activation=activation, out_dtype=torch.bfloat16)
    args = prepare_sm100_args(x, q.packed, to_blocked(q.scale), q.global_scale.reshape(()), torch.tensor(0.01), None,
                              None, spec, config)
    sm = DEVICES[device].sm_count
    cspec = sm100_backend.compile_spec_for(config, args.spec, "sm_100a", sm)
    kern = prepare(cspec, device=device)
    z = 0
    values = (args.a, args.b, args.sfa, args.sfb, args.out, args.alpha if args.alpha is not None else z,
              args.bias if args.bias is not None else z, args.residual if args.residual is not None else z,
              args.workspace if args.workspace is not None else z, args.counters if args.counters is not None else z,
              args.m, args.n, args.k, 0)
    kern.launch(*values, record_only=True)
    rec = kern.records[-1]
    cta_m = CTA_TILE_M
    tiles_m = _cdiv(_cdiv(args.m, cta_m), config.cluster_m) * config.cluster_m
    tiles_n = _cdiv(_cdiv(args.n, config.tile_n), config.cluster_n) * config.cluster_n
    cs = config.cluster_m * config.cluster_n
    ctas = tiles_m * tiles_n * config.split_k
    mac = max_active_clusters_for(cspec)
    grid = (config.cluster_m, config.cluster_n, min(ctas, mac * cs) // cs)
    ptrs = [v.data_ptr() for v in values[5:10] if isinstance(v, torch.Tensor)]
    exp = {"grid": grid, "block": (192, 1, 1), "cluster": (config.cluster_m, config.cluster_n, 1), "pdl": config.pdl,
           "tma_addresses": sorted(t.data_ptr() for t in (args.a, args.b, args.sfa, args.sfb, args.out)),
           "pointers": ptrs, "mnk": (args.m, args.n, args.k), "smem_optin": DEVICES[device].max_smem_optin}
    return Recorded(rec, exp, values, kern.kernel.abi)


def sm100_tma_addresses(rec) -> list[int]:
    """qword 0 (the global address) of every 128-byte parameter (a CUtensorMap)."""
    return sorted(struct.unpack_from("<Q", p)[0] for p in rec.params if len(p) == 128)


__all__ = ["Recorded", "descriptor_matches", "record_sm100", "record_sm90", "sm100_tma_addresses"]
