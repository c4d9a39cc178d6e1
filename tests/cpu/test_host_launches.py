"""What one decode call of an nvgemm op puts on the GPU, counted on CPU through the production host launchers
(:func:`nvgemm.testing.host_path_stand_in`: the real ``run`` of ``cutedsl_sm100`` / ``cutedsl_sm90`` on a
stand-in device, the kernel's arguments packed with its real ABI, every torch op the backend executes
recorded).

Contract, per warm call (after the first call of a layer, which derives its prepared operands once):

* sm100 ``nvfp4_linear``: the activation quantizer, then the GEMM -- plain or gated (gate/up interleaved),
  scalar or per-column alpha, with bias;
* sm100 ``nvfp4_linear_requant``: the quantizer, then the GEMM whose epilogue writes the next layer's input;
* sm100 ``nvfp4_linear_prequant``: the GEMM;
* sm90 ``nvfp4_linear`` (W4A16): the GEMM.

No other device work: no alpha multiply, no permutation, no ``cat``, no memset, no host-to-device copy of a
host scale. Outputs are ``torch.empty`` (the kernels write every byte, see the emulator tests), split-K
workspaces and counters are the same buffers on every call (the kernels leave the counters at zero), and
nothing in the call path reads a device value back to the host (a CUDA graph can capture the call).
On the code before this change the same harness counted, per sm100 call: linear 3 (quantize, alpha mul,
GEMM) plus 3 scale conversions; gated 7-8 (+ arange, add, stack, index); requant 13-14 (+ cat, two zeros);
prequant 2 (alpha mul, GEMM).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import nvgemm  # noqa: F401  (registers the ops)
import nvgemm.ops.linear as L
from nvgemm.core.formats import NVFP4, blocked_numel, quantize_weight, to_blocked
from nvgemm.core.validation import check_scale_values
from nvgemm.dispatch import registry as B
from nvgemm.testing import NO_DEVICE_WORK, host_path_stand_in

QUANT, SM100, SM90 = "quantize", "gemm:sm100_nvfp4_gemm", "gemm:sm90_w4a16_mma"


def _layer(n, k, *, vector_alpha=False, bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = quantize_weight(torch.randn(n, k, generator=g))
    ws2 = q.global_scale.reshape(()) * (torch.linspace(0.5, 2.0, n) if vector_alpha else 1.0)
    b = torch.randn(n, generator=g).to(torch.bfloat16) if bias else None
    return q.packed, to_blocked(q.scale), ws2.float(), torch.tensor(0.01), b


def _warm(rec, call, n=3):
    """Work of each of ``n`` calls after a first (deriving) one."""
    call()
    per_call = []
    for _ in range(n):
        rec.clear()
        call()
        per_call.append(rec.device_work())
    return per_call


SM100_CASES = [
    pytest.param(act, vec, bias, id=f"{act}-{'vector' if vec else 'scalar'}{'-bias' if bias else ''}")
    for act in ("none", "silu_mul") for vec in (False, True) for bias in (False, True)
]


@pytest.mark.parametrize("activation,vector_alpha,bias", SM100_CASES)
def test_sm100_linear_launches_quantizer_and_gemm_only(activation, vector_alpha, bias):
    w, s, ws2, ins, b = _layer(256, 512, vector_alpha=vector_alpha, bias=bias)
    x = torch.randn(2, 512).to(torch.bfloat16)
    with host_path_stand_in("sm100") as rec:
        work = _warm(rec, lambda: torch.ops.nvgemm.nvfp4_linear(x, w, s, ws2, ins, b, None, activation, None))
        assert B.last_selected() == "cutedsl_sm100"
    assert work == [[QUANT, SM100]] * 3


@pytest.mark.parametrize("vector_alpha", [False, True], ids=["scalar", "vector"])
def test_sm100_requant_and_prequant_launch_no_helpers(vector_alpha):
    w, s, ws2, ins, b = _layer(256, 512, vector_alpha=vector_alpha, bias=True, seed=1)
    dw, ds, dws2, dins, _ = _layer(64, 128, seed=2)
    x = torch.randn(3, 512).to(torch.bfloat16)
    with host_path_stand_in("sm100") as rec:
        requant = _warm(rec, lambda: torch.ops.nvgemm.nvfp4_linear_requant(x, w, s, ws2, ins, b, dins, None))
        packed = torch.empty(3, 64, dtype=torch.uint8)
        scales = torch.empty(blocked_numel(3, 128 // NVFP4.block_size), dtype=torch.float8_e4m3fn)
        prequant = _warm(rec, lambda: torch.ops.nvgemm.nvfp4_linear_prequant(packed, scales, dw, ds, dws2, dins,
                                                                             None, None, torch.bfloat16))
    assert requant == [[QUANT, SM100]] * 3
    assert prequant == [[SM100]] * 3


def test_sm90_linear_launches_the_gemm_only():
    w, s, ws2, _ins, b = _layer(256, 512, bias=True, seed=3)
    x = torch.randn(4, 512).to(torch.bfloat16)
    with host_path_stand_in("sm90") as rec:
        work = _warm(rec, lambda: torch.ops.nvgemm.nvfp4_linear(x, w, s, ws2, None, b, None, "none", None))
        assert B.last_selected() == "cutedsl_sm90"
    assert work == [[SM90]] * 3


def test_a_helper_kernel_is_counted():
    """The harness sees device work the launcher does besides the launches (here: the residual copied per
    call by the bound launcher, which reads an aligned residual in place)."""
    import nvgemm.templates.sm100_w4a4.backend as SB

    w, s, ws2, ins, _ = _layer(256, 512, seed=4)
    x = torch.randn(2, 512).to(torch.bfloat16)
    res = torch.randn(2, 256).to(torch.bfloat16)
    real = SB._aligned16
    with host_path_stand_in("sm100") as rec:
        SB._aligned16 = lambda t: t.clone()
        try:
            work = _warm(rec, lambda: torch.ops.nvgemm.nvfp4_linear(x, w, s, ws2, ins, None, res, "none", None), 1)
        finally:
            SB._aligned16 = real
    assert work[0][:2] == [QUANT, SM100] and len(work[0]) > 2, work


# ------------------------------------------------------------------------------ static workspaces


def test_sm100_split_k_workspace_and_alpha_are_static():
    """Split-K: workspace and counters are the same buffers on every call (nothing re-zeroes them: the last
    split of a tile resets its counter); alpha is one device-resident buffer."""
    from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig

    w, s, ws2, ins, _ = _layer(256, 1024, seed=5)
    x = torch.randn(2, 1024).to(torch.bfloat16)
    with host_path_stand_in("sm100") as rec:
        run = B.registered("linear", "cutedsl_sm100").run
        cfg = Sm100Nvfp4GemmConfig(tile_n=16, swap_ab=True, split_k=2)
        for _ in range(4):
            run(x, w, s, ws2, ins, None, None, "none", None, cfg)
        assert rec.events == [QUANT, SM100] * 4
        alpha, ws, cnt = ({p[i] for p in rec.pointers} for i in (5, 8, 9))
    assert len(alpha) == 1 and len(ws) == 1 and len(cnt) == 1 and 0 not in ws | cnt


def test_sm90_split_k_workspace_is_static():
    from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config

    w, s, ws2, _ins, _ = _layer(256, 1024, seed=6)
    x = torch.randn(8, 1024).to(torch.bfloat16)
    cfg = Sm90W4A16Config("mma", tile_m=8, tile_n=128, tile_k=256, split_k=2, num_warps=4, stages=4, pdl=True)
    with host_path_stand_in("sm90") as rec:
        run = B.registered("linear", "cutedsl_sm90").run
        run(x, w, s, ws2, None, None, None, "none", None, cfg)  # prepares the weight once
        rec.clear()
        for _ in range(3):
            run(x, w, s, ws2, None, None, None, "none", None, cfg)
        assert rec.device_work() == [SM90] * 3
        work, count = ({p[i] for p in rec.pointers} for i in (7, 8))
    assert len(work) == 1 and len(count) == 1


# ------------------------------------------------------------------------------ no host sync


#: ops that make the host wait for the device when their input lives on a GPU
SYNCING = {"_local_scalar_dense", "item", "nonzero", "is_nonzero", "equal", "_assert_async", "masked_select",
           "unique", "_unique2", "allclose", "tolist"}


class _AllOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ptrs = tuple(a.data_ptr() for a in args if isinstance(a, torch.Tensor) and a.device.type == "cpu")
        self.calls.append((func.overloadpacket.__name__, ptrs))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("family", ["sm100", "sm90"])
def test_decode_call_path_reads_no_device_value(family):
    """The whole eager call (the op's body: call key, plan, scale checks; the backend's host path) under a
    dispatch mode: the only values read back are the host scalars' own (``weight_scale_2``/``input_scale``
    held on the CPU are checked per call; the same check skips device tensors, below). A ``.item()``,
    ``nonzero`` or ``.cpu()`` of anything else would stall the stream and break CUDA-graph capture."""
    w, s, ws2, ins, b = _layer(256, 512, bias=True, seed=7)
    x = torch.randn(2, 512).to(torch.bfloat16)
    ins = ins if family == "sm100" else None
    body = L.nvfp4_linear._init_fn  # the op's Python body, so the mode sees the ops inside it
    with host_path_stand_in(family) as rec:
        body(x, w, s, ws2, ins, b, None, "none", None)
        with _AllOps() as m:
            body(x, w, s, ws2, ins, b, None, "none", None)
        assert rec.events[-1].startswith("gemm")
    host_scalars = {ws2.data_ptr()} | ({ins.data_ptr()} if ins is not None else set())
    reads = [(op, p) for op, p in m.calls if op in SYNCING or op in ("to", "_to_copy", "copy_")]
    assert all(op == "_local_scalar_dense" and set(p) <= host_scalars for op, p in reads), reads
    assert {op for op, _ in m.calls} - NO_DEVICE_WORK - {"_local_scalar_dense"} == set(), m.calls


def test_scale_value_checks_never_read_a_device_tensor():
    """``check_scale_values`` reads host tensors only: on tensors of any other device it reads nothing
    (meta tensors hold no values: any read would raise)."""
    check_scale_values(torch.empty((), device="meta"), torch.empty((), device="meta"))
    check_scale_values(torch.empty(8, device="meta"), torch.empty(1, device="meta"))
    with pytest.raises(ValueError, match="input_scale is nan"):
        check_scale_values(torch.tensor(1.0), torch.tensor(float("nan")))
    with pytest.raises(ValueError, match="weight_scale_2 holds -1"):
        check_scale_values(torch.tensor(-1.0), None)
