"""One copy of every NVFP4 weight on Hopper (issue 22 item 14), on an H100/H200.

NOT RUN YET: no GPU was available when this was written (markers ``gpu`` + ``sm90``; kernels come
from the kernel cache as in ``tests/gpu/test_sm90_kernels.py``). A held layer runs the same kernel
on the same prepared bytes as the two-copy path (which derives them from the checkpoint layout), so
outputs are compared bit for bit; the GPU memory the layers hold drops by the checkpoint layout's
bytes (allocator rounding: 512-byte blocks, hence the 1% slack).
"""

import gc

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]


def _layers(n_layers, n, k, seed):
    from nvgemm.nn.linear import NVFP4Linear

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_layers):
        lin = torch.nn.Linear(k, n, bias=False)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(n, k, generator=g))
        out.append(NVFP4Linear.from_linear(lin, input_scale=0.01))
    return torch.nn.Sequential(*out).cuda()


@pytest.mark.parametrize("m", [1, 64])
def test_held_layers_compute_the_same_and_free_the_checkpoint_layout(m):
    from nvgemm.nn.linear import prepare_for_sm90

    model = _layers(4, 4096, 4096, m)
    x = torch.randn(m, 4096, device="cuda").bfloat16()
    want = [layer(x) for layer in model]  # two copies: the checkpoint's and the derived prepared one
    assert all(layer.last_path == "cutedsl_sm90" for layer in model)
    ckpt = sum(layer.weight.numel() + layer.weight_scale.numel() for layer in model)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    held = prepare_for_sm90(model)
    gc.collect()
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    assert len(held) == 4 and all(layer.weight is None for layer in model)
    assert before - after >= 0.99 * ckpt, (before, after, ckpt)
    got = [layer(x) for layer in model]
    assert all(layer.last_path == "cutedsl_sm90" for layer in model)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_vllm_fused_layer_held_once_is_bit_identical():
    """A fused q/k/v of two GEMMs (unequal input scales), held in one stacked tensor, vs the
    checkpoint layout the kernels derive their copy from."""
    from nvgemm.core.formats import quantize_weight
    from nvgemm.integrations.serving import hold_sm90, plan_gemms, run_gemms, sm90_serve_reason

    g = torch.Generator().manual_seed(22)
    k, widths = 4096, [4096, 1024, 1000]  # v's 1000 rows: not a whole tile
    qs = [quantize_weight(torch.randn(n, k, generator=g)) for n in widths]
    w = torch.cat([q.packed for q in qs]).cuda()
    s = torch.cat([q.scale for q in qs]).cuda()
    ws2 = torch.stack([q.global_scale.reshape(()) for q in qs]).cuda()
    x = torch.randn(8, k, device="cuda").bfloat16()
    a = float(x.float().abs().amax()) / 2688
    gemms = plan_gemms(w, s, ws2, torch.tensor([a, a, 2 * a], device="cuda"), widths)
    assert len(gemms) == 2
    assert sm90_serve_reason(gemms, k, x.device, torch.bfloat16, False, [1, 8, 64]) is None
    want = {m: run_gemms(x[:m], w, gemms, None) for m in (1, 8)}
    pw, held = hold_sm90(w, gemms, "bf16")
    for m in (1, 8):
        assert torch.equal(run_gemms(x[:m], pw, gemms, None, held), want[m])
