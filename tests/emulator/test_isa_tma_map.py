"""Re-runs the experiment that established the tensor-map decoding of nvgemm.emulator.isa.tma: nvgemm's sm100
kernel (its TMA atoms built by CuTeDSL, which encodes the 128-byte CUtensorMap inline in the host code) is
launched through the emulator's fake CUDA runtime with ``record_only``; the captured maps must decode to the
tensors the host passed (address, element type, dims, strides) and to the kernel's tile boxes and swizzles,
for problems the decoding was not fitted on."""

import pytest
import torch
from isa_env import kernel_test_env

kernel_test_env("sm_100a")
pytestmark = pytest.mark.emulator

import nvgemm.ops.linear  # noqa: E402,F401
from nvgemm.emulator.isa.tma import decode_tensor_map  # noqa: E402
from nvgemm.epilogues import EpilogueSpec  # noqa: E402
from nvgemm.core.formats import quantize_weight, to_blocked  # noqa: E402
from nvgemm.aot.compile_spec import make_spec  # noqa: E402
from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig as C  # noqa: E402
from nvgemm.templates.sm100_w4a4.launch import prepare_sm100_args  # noqa: E402

OUT = {torch.bfloat16: ("bf16", 2, 64), torch.float16: ("f16", 2, 64), torch.float32: ("f32", 4, 128)}


@pytest.mark.parametrize("m,n,k,tile_n,out_dtype", [
    pytest.param(80, 384, 768, 128, torch.float16, id="m80-n384-k768-t128-f16"),
    pytest.param(200, 192, 1536, 64, torch.float32, id="m200-n192-k1536-t64-f32", marks=pytest.mark.slow)])
def test_captured_tensor_maps_decode_to_host_tensors(m, n, k, tile_n, out_dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    from nvgemm.emulator.runner import prepare

    cfg = C(tile_n=tile_n)
    q = quantize_weight(torch.randn(n, k))
    epi = EpilogueSpec(alpha="scalar", out_dtype=out_dtype)
    args = prepare_sm100_args(torch.randn(m, k).to(torch.bfloat16), q.packed, to_blocked(q.scale), q.global_scale,
                              torch.tensor(0.01), None, None, epi, cfg)
    ek = prepare(make_spec("sm100_nvfp4_gemm", cfg, "sm_100a", epilogue=epi))
    ek.records.clear()
    ek.launch(args.a, args.b, args.sfa, args.sfb, args.out, args.alpha, 0, 0, 0, 0, args.m, args.n, args.k, 0,
              record_only=True)
    maps = [decode_tensor_map(p) for p in ek.records[-1].params if len(p) == 128]
    assert len(maps) == 5
    by_addr = {t.data_ptr(): nm for nm, t in (("a", args.a), ("b", args.b), ("sfa", args.sfa), ("sfb", args.sfb),
                                               ("out", args.out))}
    got = {by_addr[tm.address]: tm for tm in maps}
    assert set(got) == {"a", "b", "sfa", "sfb", "out"}
    for nm, rows, box_rows in (("a", m, 128), ("b", n, tile_n)):
        tm = got[nm]
        assert (tm.dtype, tm.dims, tm.strides, tm.box, tm.swizzle) == ("b4", (k, rows), (k // 2,), (256, box_rows), 128)
    for nm, rows in (("sfa", m), ("sfb", n)):  # 128x4 blocks of e4m3 viewed as 16-bit pairs: (256, K/64, row blocks)
        tm = got[nm]
        assert (tm.dtype, tm.dims, tm.strides, tm.box) == ("b16", (256, k // 64, -(-rows // 128)), (512, 512 * k // 64),
                                                          (256, 4, 1))
    name, size, sw = OUT[out_dtype]
    tm = got["out"]
    assert (tm.dtype, tm.dims, tm.strides, tm.swizzle, tm.box) == (name, (n, m), (n * size,), sw, (sw // size, 128))
