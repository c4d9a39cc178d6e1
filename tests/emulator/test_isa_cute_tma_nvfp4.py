"""Validation programs (issue 21 item 4), second set: TMA tile copies with swizzled shared layouts and the
block-scaled ``tcgen05.mma .kind::mxf4nvf4`` (one CTA, and a ``.cta_group::2`` CTA pair), built only from CuTe's
own atoms, layouts and partitioners (tests/emulator/emu_cute_tma_nvfp4_programs.py) and run on the emulator
against torch on the CPU.

Unlike the pointer-only programs of test_isa_cute_programs.py these need CuTe's *host* code: it encodes the
128-byte tensor maps inline. So each program is compiled AOT through a test-only kernel template
(:class:`CuteProgramTemplate`, cached by spec in the kernel cache like nvgemm's own kernels, the program
source's sha256 in the config so an edited program is rebuilt) and launched with the production AOT loader
against the emulator's fake CUDA runtime (:func:`nvgemm.emulator.runner.prepare`).

References are independent of the emulator's code: the TMA copies must reproduce the input tile bit for bit
(zeros where the box leaves the tensor), and the shared-memory bytes must lie where the PTX ISA's swizzle
function puts them (PTX ISA 5.5.6 "Swizzling Modes", 5.5.7 in ISA 9.x: within a 128-byte line the 16-byte chunk
index is XORed with the line index modulo the span's chunk count, over a span-aligned base), computed here from
the ISA text. Mutations seen to fail these tests: the swizzle's line index taken from bit 8 instead of 7, an
out-of-bounds fill of 0x3F instead of zero, a transaction count 16 bytes short (a deadlock error); for the
NVFP4 tiles, the scale-factor K-block order within a TMEM cell reversed, the scale of row m read from lane
m + 1 of its partition, and (CTA pair) the two CTAs' halves of B taken in the wrong order.
"""

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from isa_env import kernel_test_env

kernel_test_env("sm_100a")
pytestmark = pytest.mark.emulator

from nvgemm.aot.compile_spec import make_spec  # noqa: E402
from nvgemm.aot.abi import (  # noqa: E402
    PointerArg,
    StreamArg,
    compile_for_target,
    fake_args,
    register_template,
)
from nvgemm.core.status import Status  # noqa: E402

PROGRAMS = Path(__file__).with_name("emu_cute_tma_nvfp4_programs.py")
SOURCE_SHA = hashlib.sha256(PROGRAMS.read_bytes()).hexdigest()[:16]


@dataclass(frozen=True)
class CuteProgramConfig:
    program: str  # "tma_copy"
    swizzle: int = 128
    source_sha: str = SOURCE_SHA

    def name(self) -> str:
        return f"emu_cute_{self.program}_sw{self.swizzle}_{self.source_sha}"


class CuteProgramTemplate:
    """Test-only template around the standalone CuTe programs (never proposed by nvgemm's heuristics)."""

    template_id = "emu_cute_program"
    config_type = CuteProgramConfig
    archs = ("sm_90a", "sm_100a")

    def can_implement(self, spec):
        return Status.success()

    def abi(self, spec):
        if spec.config.program == "tma_copy":
            return (PointerArg("src", "BFloat16"), PointerArg("dst", "BFloat16"), PointerArg("raw", "Uint8"),
                    PointerArg("tile", "BFloat16"), StreamArg())
        if spec.config.program in ("nvfp4_tile", "nvfp4_pair_tile"):
            return (PointerArg("a", "Float4E2M1FN"), PointerArg("b", "Float4E2M1FN"), PointerArg("sfa", "Float8E4M3FN"),
                    PointerArg("sfb", "Float8E4M3FN"), PointerArg("c", "Float32"), StreamArg())
        raise ValueError(spec.config.program)

    def compile(self, spec, *, keep_ptx: bool = False):
        import emu_cute_tma_nvfp4_programs as P

        c = spec.config
        fn = P.make_tma_copy(c.swizzle) if c.program == "tma_copy" else getattr(P, f"make_{c.program}")()
        return compile_for_target(fn, fake_args(self.abi(spec)), spec, "--keep-ptx" if keep_ptx else "")


register_template(CuteProgramTemplate(), replace=True)


def _kernel(arch, **cfg):
    from nvgemm.emulator.runner import prepare

    return prepare(make_spec("emu_cute_program", CuteProgramConfig(**cfg), arch))


def ptx_swizzle(offset: torch.Tensor, span: int) -> torch.Tensor:
    """PTX ISA tensor swizzling on a byte offset from a span-aligned base: within each 128-byte line, the 16-byte
    chunk index (bits 4..6) is XORed with bits 7.. of the offset (the line index), masked to the chunks of one
    ``span``-byte swizzle atom (128B: 8 chunks, 64B: 4, 32B: 2)."""
    mask = span // 16 - 1
    return offset ^ (((offset >> 7) & mask) << 4)


@pytest.mark.parametrize("swizzle", [128, 64, 32])
def test_cute_tma_copy_tiles_and_swizzle_placement(swizzle, seed):
    import emu_cute_tma_nvfp4_programs as P

    k = _kernel("sm_100a", program="tma_copy", swizzle=swizzle)
    assert "cp.async.bulk.tensor.2d.shared::cta.global.tile.mbarrier::complete_tx::bytes" in k.ptx
    assert "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group" in k.ptx
    bc = P.box_cols(swizzle)
    gx, gy = P.grid_of(swizzle)
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(-30000, 30000, (P.ROWS, P.COLS), generator=g, dtype=torch.int16).view(torch.bfloat16)
    src[src.isnan()] = 1.0  # bit patterns compared below; keep NaN payloads out of the data
    dst = torch.zeros_like(src)
    raw = torch.full((gx * gy, P.BR * bc * 2), 0xAB, dtype=torch.uint8)
    tile = torch.full((gx * gy, P.BR, bc), float("nan"), dtype=torch.bfloat16)
    k.launch(src, dst, raw, tile, 0)
    assert torch.equal(dst.view(torch.int16), src.view(torch.int16))
    pad = torch.zeros(gy * P.BR, gx * bc, dtype=torch.bfloat16)
    pad[:P.ROWS, :P.COLS] = src
    r, c = torch.meshgrid(torch.arange(P.BR), torch.arange(bc), indexing="ij")
    logical = (r * bc + c) * 2  # byte offset of element (r, c) in the dense box (row-major, 2-byte elements)
    phys = ptx_swizzle(logical.flatten(), swizzle)
    for by in range(gy):
        for bx in range(gx):
            cta = by * gx + bx
            want = pad[by * P.BR:(by + 1) * P.BR, bx * bc:(bx + 1) * bc]
            assert torch.equal(tile[cta].view(torch.int16), want.view(torch.int16)), (bx, by)
            got = raw[cta].view(torch.int16)[phys // 2].view(torch.bfloat16).reshape(P.BR, bc)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (bx, by)


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
POW2_E4M3 = torch.tensor([0x28, 0x30, 0x38, 0x40, 0x48], dtype=torch.uint8)  # 0.25, 0.5, 1, 2, 4


def e2m1_values(packed: torch.Tensor) -> torch.Tensor:
    """(rows, K) fp64 values of (rows, K / 2) packed E2M1 codes: element 2i in the low nibble of byte i, sign in
    bit 3 of the nibble (the OCP MX / NVFP4 encoding)."""
    nib = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1).long()
    return E2M1[nib & 7] * (1 - 2 * (nib >> 3)).double()


def blocked_sf(sf: torch.Tensor) -> torch.Tensor:
    """(rows, K / 16) e4m3 scales laid out as CuTe's block-scaled basic chunk tiled over the tensor
    (``tile_atom_to_shape_SF``: 128 rows x 4 K-blocks per 512-byte atom, byte 16 (r % 32) + 4 ((r // 32) % 4) +
    kb % 4; atoms K-block-major within a 128-row group), written here from that layout's strides."""
    rows, nkb = sf.shape
    r = torch.arange(rows)[:, None]
    kb = torch.arange(nkb)[None, :]
    off = (r // 128) * 512 * (nkb // 4) + (kb // 4) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + kb % 4
    out = torch.zeros(rows * nkb, dtype=torch.uint8)
    out[off.flatten()] = sf.view(torch.uint8).flatten()
    return out


@pytest.mark.parametrize("program", ["nvfp4_tile", "nvfp4_pair_tile"])
def test_cute_nvfp4_block_scaled_tile_matches_torch(program, seed):
    """Exact data: E2M1 codes times power-of-two e4m3 scales; every product is a multiple of 2^-6 below 2^10 and
    the 256-term sums stay below 2^18, so fp32 holds every partial sum exactly (tolerance 0). ``nvfp4_pair_tile``
    is the same tile with M = 256 as one ``.cta_group::2`` MMA over a CTA pair (SFB multicast to both CTAs)."""
    import emu_cute_tma_nvfp4_programs as P

    pair = program == "nvfp4_pair_tile"
    k = _kernel("sm_100a", program=program, swizzle=0)
    grp = "cta_group::2" if pair else "cta_group::1"
    assert f"tcgen05.mma.{grp}.kind::mxf4nvf4.block_scale.block16" in k.ptx
    assert f"tcgen05.cp.{grp}.32x128b.warpx4" in k.ptx and "tcgen05.ld.sync.aligned.32x32b" in k.ptx
    fm = P.PM if pair else P.FM
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 256, (fm, P.FK // 2), generator=g, dtype=torch.uint8)
    b = torch.randint(0, 256, (P.FN, P.FK // 2), generator=g, dtype=torch.uint8)
    sfa = POW2_E4M3[torch.randint(0, 5, (fm, P.FK // 16), generator=g)].view(torch.float8_e4m3fn)
    sfb = POW2_E4M3[torch.randint(0, 5, (P.FN, P.FK // 16), generator=g)].view(torch.float8_e4m3fn)
    c = torch.full((fm, P.FN), float("nan"))
    launch = k.launch(a, b, blocked_sf(sfa), blocked_sf(sfb), c, 0)
    assert launch.cluster == ((2, 1, 1) if pair else (1, 1, 1))
    av = e2m1_values(a) * sfa.double().repeat_interleave(16, dim=1)
    bv = e2m1_values(b) * sfb.double().repeat_interleave(16, dim=1)
    torch.testing.assert_close(c, (av @ bv.T).float(), rtol=0, atol=0)
