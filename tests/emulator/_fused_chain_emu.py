"""Exact operands of the fused gated-MLP emulator tests (the sm_100a and sm_120a fused requant / prequant
kernels): E2M1 codes with power-of-two block scales and a gate_up -> down pair whose chain the kernels must
reproduce bit for bit (see ``test_isa_sm100_requant.py`` for why every step is exact)."""

from __future__ import annotations

import torch

from nvgemm.core.formats import dequantize

POW2_E4M3 = torch.tensor([0x28, 0x30, 0x38, 0x40, 0x48], dtype=torch.uint8)  # 2**-2 .. 2**2


def exact_codes(g, rows, k):
    packed = torch.randint(0, 256, (rows, k // 2), generator=g, dtype=torch.uint8)
    scales = POW2_E4M3[torch.randint(0, 5, (rows, k // 16), generator=g)].view(torch.float8_e4m3fn)
    return packed, scales


def exact_chain():
    """(gate_up NVFP4Linear with silu_mul, down NVFP4Linear, x) on exact data: gate rows biased by 4096 (every
    gate in the range where ``silu(g) == g`` in fp32), x whose own NVFP4 quantization is exact (every 16-block
    holds +-6 * 2**j, input_scale 1)."""
    import nvgemm

    g = torch.Generator().manual_seed(3)
    m, i, k, h = 5, 32, 256, 64
    w_packed, w_scale = exact_codes(g, 2 * i, k)
    bias = torch.cat([torch.full((i,), 4096.0), torch.zeros(i)]).to(torch.bfloat16)
    gu = nvgemm.NVFP4Linear.from_tensors(w_packed, w_scale, torch.tensor(1.0), torch.tensor(1.0), bias,
                                         activation="silu_mul")
    # bias in the activation dtype: the kernels read bias in the output dtype (an fp32 bias runs emulated)
    torch.manual_seed(3)
    down = nvgemm.NVFP4Linear.from_linear(torch.nn.Linear(i, h).to(torch.bfloat16),
                                          input_scale=torch.tensor(3e6 / 2688))
    x_packed, x_scale = exact_codes(g, m, k)
    x_packed.view(m, k // 16, 8)[:, :, 0] = 0x07  # element 0 of every block = +6 (code 7), element 1 = 0
    return gu, down, dequantize(x_packed, x_scale).to(torch.bfloat16)
