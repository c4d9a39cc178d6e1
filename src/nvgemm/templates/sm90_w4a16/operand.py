"""The sm90 W4A16 weight operand: layout, exact packed decode, and its torch references.

Pure torch (no cutlass): :mod:`.launch` prepares weights with it once per weight, the kernels
(:mod:`.mma`, :mod:`.wgmma`) decode exactly what it writes, and the CPU tests check the decode
bit for bit against :mod:`nvgemm.core.formats`.

Layout (``kind`` = the activation dtype, ``"bf16"`` or ``"fp16"``)
------------------------------------------------------------------
Rows are grouped in 16-row tiles (N padded with zero rows), K in 64-element chunks (K padded with
zero codes to a multiple of :data:`~.config.K_ALIGN` = 256). For tile ``t``, chunk ``c`` and lane
``(g, q) = (lane // 4, lane % 4)`` of a warp, one 16-byte vector holds the 32 codes of rows
``16t + g`` and ``16t + g + 8`` in scale block ``4c + q`` (16 K each): its 32-bit word ``s``
(``s = 0..3``) decodes to the four A registers of MMA k-step ``s`` of ``mma.sync.m16n8k16``
(``a0 = (row g, elements 4s, 4s+1)``, ``a1 = (row g+8, 4s, 4s+1)``, ``a2 = (row g, 4s+2, 4s+3)``,
``a3 = (row g+8, 4s+2, 4s+3)`` of the lane's block; the B operand pairs the same K positions of
the activations, so a k-step mixes the four blocks q = 0..3 and each lane only ever needs the
scales of its own block). Memory order ``[tile][chunk][lane][16 bytes]``: a warp's load of one
(tile, chunk) is 512 contiguous bytes.

Scales: ``[tile][chunk // 4][lane][8 bytes]``; byte ``4p + b`` of a lane's 8 belongs to chunk
``4 * (chunk // 4) + 2p + (b % 2)`` and row ``g + 8 * (b // 2)``: bytes ``(g, c0), (g, c1),
(g+8, c0), (g+8, c1)`` per chunk pair, so ``word & 0x00FF00FF`` holds chunk ``c0``'s pair of
scales in the two halves and ``(word >> 8) & 0x00FF00FF`` chunk ``c1``'s.

Decode (exact, 8 integer instructions per 8 elements + 4 packed multiplies)
----------------------------------------------------------------------------
An E2M1 nibble ``s e1 e0 m`` placed at bf16 bits 15, 8, 7, 6 (fp16: 15, 11, 10, 9) is the number
``E2M1 * 2**-126`` (fp16: ``E2M1 * 2**-14``); ``e1 e0 = 0`` lands on subnormals (code 0.5), which
the packed multiply keeps. Each 32-bit word is stored **linearly encoded** (an invertible map
over GF(2), :data:`SCHEMES`) so that each of its four bf16x2 / f16x2 outputs is one ``lop3`` of
at most two rotations of the word::

    oj = (rotr(w, a) ^ rotr(w, b)) & F     (or rotr(w, a) & F)      F: the 8 field bits of a pair

-- 4 rotations (one rotation is the word itself) and 4 ``lop3``. Output bit ``p`` of ``oj`` is the
XOR of word bits ``p + a`` and ``p + b``: the 32 such equations (one per output field bit) have a
unique solution for the word iff, read as edges between word bits (a single rotation: an edge to
a "ground" node), they form a spanning tree; the encoder walks that tree from the ground
(:func:`_word_plan`). ``bench/decode_layout_search.py`` searches both instruction sets: a plain bit
permutation needs 9 instructions (4 rotations, a masked "clean" register, 4 selects -- the
previous scheme), the linear layouts 8, and no linear layout reaches 7.

Block scales are **re-encoded** offline to one byte ``b = (E + 10) << 3 | f`` for ``s = 2**E *
(1 + f / 8)`` (every finite positive e4m3 value, subnormals included, is such a number with E in
[-9, 8]), so that ``(b << 4) + (236 << 7)`` is the bf16 bit pattern of ``s * 2**119`` and ``(b <<
7) + (12 << 10)`` the fp16 pattern of ``s * 2**7`` -- one shift-add per pair of scales. Blocks
whose scale is zero get zero codes (their products are zero either way), negative scales fold
their sign into the codes, NaN scales are rejected. ``E2M1 * 2**-126 * s * 2**119`` (bf16) and
``E2M1 * 2**-14 * s * 2**7`` (fp16) are both ``E2M1 * s * 2**-7``: at most 6 significant bits,
exact in either format (fp16 subnormal only when s is an e4m3 subnormal); the fp32 epilogue
multiplies by 2**7 (:data:`~.config.DECODE_UNSCALE`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from nvgemm.core.formats import E2M1_VALUES, NVFP4, from_blocked, to_blocked

from nvgemm.templates.sm90_w4a16.config import CHUNK, K_ALIGN, ROW_TILE

KINDS = ("bf16", "fp16")
_M32 = 0xFFFFFFFF


@dataclass(frozen=True)
class DecodeScheme:
    """Bit plan of one word (8 elements) for one activation dtype (see the module docstring)."""

    kind: str
    field: tuple  # half-word bit -> code bit: (mantissa m, exponent e0, exponent e1, sign s)
    sources: tuple  # per output o0..o3: the right rotations of w XORed (one or two) before the mask
    scale_shift: int  # scale pair bits = (encoded pair << scale_shift) + scale_add
    scale_add: int

    @property
    def field_mask(self) -> int:
        m = 0
        for h in (0, 16):
            for p in self.field:
                m |= 1 << (p + h)
        return m

    @property
    def rotations(self) -> tuple:
        """The distinct nonzero rotations the decode computes (one ``SHF.R.W`` each)."""
        return tuple(sorted({r for src in self.sources for r in src} - {0}))

    def instructions(self) -> int:
        """Integer instructions per word: one per nonzero rotation, one ``lop3`` per output."""
        return len(self.rotations) + len(self.sources)


# code bit (0 = m, 1 = e0, 2 = e1, 3 = s) at bf16 / fp16 half-word bits (m, e0, e1, s); sources
# checked by bench/decode_layout_search.py (8-instruction linear schemes; 7 is impossible)
SCHEMES = {
    "bf16": DecodeScheme("bf16", field=(6, 7, 8, 15), sources=((0,), (12,), (2, 6), (2, 8)), scale_shift=4,
                         scale_add=(236 << 7) | (236 << 23)),
    "fp16": DecodeScheme("fp16", field=(9, 10, 11, 15), sources=((0,), (3,), (7, 9), (7, 12)), scale_shift=7,
                         scale_add=(12 << 10) | (12 << 26)),
}


def kind_of(dtype: torch.dtype) -> str:
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    raise TypeError(f"nvgemm_cutedsl sm90: activations must be bfloat16 or float16, got {dtype}")


def _terms(kind: str) -> list[tuple[int, int, int]]:
    """The 32 (output j, field bit p) slots of a word's outputs, as (row select 0/1, element 0..3
    of the step, code bit): output j holds row select ``j % 2`` and pair ``j // 2`` (elements
    ``2 (j // 2) + h`` in half ``h``); slot index ``8 j + 4 h + code bit``."""
    sch = SCHEMES[kind]
    return [(j % 2, 2 * (j // 2) + h, cb) for j in range(4) for h in range(2) for cb in range(len(sch.field))]


def _word_plan(kind: str) -> list[tuple[int, ...]]:
    """For each of the 32 bits of a word: the slots (indices into :func:`_terms`) whose XOR it
    stores, so that the decode's outputs hold exactly the slots' code bits.

    Slot (j, p) reads word bits ``p + r`` for ``r`` in ``sources[j]``: one bit -> it equals the
    slot; two -> their XOR does. Solved by walking the spanning tree those edges form from the
    ground node; raises ValueError if they do not form one (the scheme would not be invertible)."""
    sch = SCHEMES[kind]
    edges = []  # (slot, word bit u, word bit v or None)
    for j, src in enumerate(sch.sources):
        for h in range(2):
            for cb, p in enumerate(sch.field):
                pos = p + 16 * h
                bits = [(pos + r) % 32 for r in src]
                edges.append((8 * j + 4 * h + cb, bits[0], bits[1] if len(bits) > 1 else None))
    plan: list = [None] * 32
    todo = list(edges)
    while todo:
        rest = []
        for slot, u, v in todo:
            if v is None:
                if plan[u] is not None:
                    raise ValueError(f"decode scheme {kind}: word bit {u} is constrained twice")
                plan[u] = frozenset({slot})
            elif (plan[u] is None) != (plan[v] is None):
                known, new = (u, v) if plan[u] is not None else (v, u)
                plan[new] = plan[known] ^ {slot}
            elif plan[u] is not None:
                raise ValueError(f"decode scheme {kind}: the equations of word bits {u}, {v} close a cycle")
            else:
                rest.append((slot, u, v))
        if len(rest) == len(todo):
            raise ValueError(f"decode scheme {kind}: word bits not reached from the ground: {sorted({b for e in rest for b in e[1:]})}")
        todo = rest
    if any(t is None for t in plan):
        raise ValueError(f"decode scheme {kind}: word bits {[b for b, t in enumerate(plan) if t is None]} unconstrained")
    return [tuple(sorted(t)) for t in plan]


# --------------------------------------------------------------------------- scale encoding


def encode_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """e4m3 scales (any shape) -> (encoded bytes, zero mask, negative mask); see the module doc.

    Raises ValueError on NaN scales."""
    bits = s.view(torch.uint8) if s.dtype == torch.float8_e4m3fn else s.to(torch.float8_e4m3fn).view(torch.uint8)
    mag = (bits & 0x7F).to(torch.int32)
    if bool((mag == 0x7F).any()):
        raise ValueError("nvgemm_cutedsl sm90: weight_scale holds NaN (e4m3 0x7F/0xFF) block scales")
    neg = (bits & 0x80) != 0
    zero = mag == 0
    e = mag >> 3
    f = mag & 7
    # subnormal e4m3 (e == 0): value f * 2**-9 = 2**E (1 + f'/8) with E = floor(log2 f) - 9
    sub = (e == 0) & ~zero
    lz = torch.where(f >= 4, 2, torch.where(f >= 2, 1, 0))  # floor(log2 f) for f in 1..7
    e_norm = torch.where(sub, lz - 9, e - 7)
    f_norm = torch.where(sub, ((f << (3 - lz)) & 7), f)
    enc = ((e_norm + 10) << 3) | f_norm
    enc = torch.where(zero, torch.full_like(enc, 10 << 3), enc)  # 1.0 for zero blocks (codes are zeroed)
    return enc.to(torch.uint8), zero, neg & ~zero


def decode_scale_bits(enc: torch.Tensor, kind: str) -> torch.Tensor:
    """Encoded bytes -> the kernel's scale operand as fp32: ``s * 2**119`` (bf16) or ``s * 2**7``
    (fp16), built with the kernel's shift-add on the 16-bit pattern."""
    sch = SCHEMES[kind]
    bits16 = (enc.to(torch.int32) << sch.scale_shift) + (sch.scale_add & 0xFFFF)
    dt = torch.bfloat16 if kind == "bf16" else torch.float16
    return bits16.to(torch.int16).view(dt).float()


# --------------------------------------------------------------------------- prepared weight


@dataclass
class Sm90Weight:
    """One weight in the sm90 kernels' operand layout (see the module docstring)."""

    weight: torch.Tensor  # uint8 [n_tiles, n_chunks * 512]
    scale: torch.Tensor  # uint8 [n_tiles, n_chunks * 64]
    weight_scale_2: torch.Tensor  # fp32 (1,) or (N,)
    n: int  # rows of the layer (gate + up for a gated layer)
    k: int  # K of the layer
    n_pad: int
    k_pad: int
    kind: str

    @property
    def n_tiles(self) -> int:
        return self.n_pad // ROW_TILE

    @property
    def n_chunks(self) -> int:
        return self.k_pad // CHUNK

    def nbytes(self) -> int:
        return self.weight.numel() + self.scale.numel()


def _check_packed(packed: torch.Tensor) -> tuple[int, int]:
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(f"nvgemm_cutedsl sm90: weight must be uint8 [N, K/2], got {packed.dtype} {tuple(packed.shape)}")
    n, kh = packed.shape
    if (2 * kh) % 32:
        raise ValueError(f"nvgemm_cutedsl sm90: K={2 * kh} must be a multiple of 32 (16-byte rows of packed FP4)")
    return n, 2 * kh


def pad_rows_for(n: int, gated: bool) -> int:
    """Rows of the prepared weight: N rounded up to whole 16-row tiles."""
    del gated  # a gated layer needs (N/2) % 16 == 0 (checked by the caller); no per-half padding
    return -(-n // ROW_TILE) * ROW_TILE


def _codes_of(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] -> int32 codes [N, K] (even K in the low nibble)."""
    lo = (packed & 0xF).to(torch.int32)
    hi = (packed >> 4).to(torch.int32)
    return torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], -1)


_ROWS_PER_PASS = 2048  # rows re-laid-out per pass (bounds the int32 temporaries)


def prepare_sm90_weight(weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
                        kind: str = "bf16") -> Sm90Weight:
    """The op's weight triple (packed E2M1 [N, K/2], 128x4-swizzled e4m3 scales, fp32 global scale)
    -> the kernels' operand layout for activations of ``kind`` (pure torch, on the weight's device)."""
    if kind not in KINDS:
        raise ValueError(f"nvgemm_cutedsl sm90: kind must be one of {KINDS}, got {kind!r}")
    n, k = _check_packed(weight)
    dev = weight.device
    kb = k // NVFP4.block_size
    ws = weight_scale.view(torch.float8_e4m3fn) if weight_scale.dtype == torch.uint8 else weight_scale
    scale_lin = from_blocked(ws.to(dev).reshape(-1), n, kb).contiguous()  # [N, K/16] e4m3
    enc, zero, neg = encode_scales(scale_lin)
    n_pad = pad_rows_for(n, False)
    k_pad = -(-k // K_ALIGN) * K_ALIGN
    n_tiles, n_chunks = n_pad // ROW_TILE, k_pad // CHUNK
    plan = _word_plan(kind)
    terms = _terms(kind)

    w_out = torch.empty((n_tiles, n_chunks * 512), dtype=torch.uint8, device=dev)
    tiles_per_pass = max(1, _ROWS_PER_PASS // ROW_TILE)
    for t0 in range(0, n_tiles, tiles_per_pass):
        t1 = min(n_tiles, t0 + tiles_per_pass)
        r0, r1 = t0 * ROW_TILE, t1 * ROW_TILE
        codes = torch.zeros((r1 - r0, k_pad), dtype=torch.int32, device=dev)
        rr = min(r1, n) - r0
        if rr > 0:
            c = _codes_of(weight[r0:r0 + rr])
            blk_zero = zero[r0:r0 + rr].repeat_interleave(16, dim=1)
            blk_neg = neg[r0:r0 + rr].repeat_interleave(16, dim=1)
            c = torch.where(blk_zero, torch.zeros_like(c), c ^ (blk_neg.to(torch.int32) << 3))
            codes[:rr, :k] = c
        # [tiles, rowsel(2), g(8), chunk, q(4), el(16)] -> [tiles, chunk, g, q, step(4), rowsel, e(4)]
        v = codes.reshape(t1 - t0, 2, 8, n_chunks, 4, 4, 4).permute(0, 3, 2, 4, 5, 1, 6)
        words = torch.zeros(v.shape[:5], dtype=torch.int64, device=dev)
        slot_bits = [((v[..., rs, e] >> cb) & 1).to(torch.int64) for rs, e, cb in terms]
        for bit, slots in enumerate(plan):
            b = slot_bits[slots[0]]
            for t in slots[1:]:
                b = b ^ slot_bits[t]
            words |= b << bit
        shifts = torch.arange(0, 32, 8, device=dev, dtype=torch.int64)
        by = ((words.unsqueeze(-1) >> shifts) & 0xFF).to(torch.uint8)  # [tiles, chunk, g, q, step, 4]
        w_out[t0:t1] = by.reshape(t1 - t0, -1)

    # scales: [N, K/16] -> [tiles, chunk/4, g, q, pair(2), rowsel(2), c%2]  (bytes (g,c0),(g,c1),(g8,c0),(g8,c1))
    sc = torch.full((n_pad, k_pad // 16), 10 << 3, dtype=torch.uint8, device=dev)
    sc[:n, :kb] = enc
    s6 = sc.reshape(n_tiles, 2, 8, n_chunks // 4, 2, 2, 4).permute(0, 3, 2, 6, 4, 1, 5)
    s_out = s6.contiguous().reshape(n_tiles, n_chunks * 64)
    ws2 = weight_scale_2.to(device=dev, dtype=torch.float32).reshape(-1).contiguous()
    return Sm90Weight(w_out, s_out, ws2, n, k, n_pad, k_pad, kind)


# --------------------------------------------------------------------------- the wgmma family's activation operand


def x_slot_offset(r, pair):
    """Byte offset, in the wgmma family's shared-memory activation tile of one 64-deep chunk (the
    WGMMA B operand: token rows of 128 bytes, K-major, 128-byte swizzle), of token row ``r``'s
    activation pair ``pair`` (K = 2 pair, 2 pair + 1 of the chunk).

    The weight operand fixes the K order: in k-step ``s`` of a chunk, lane ``(g, q)``'s A
    registers hold K = 16 q + 4 s + {0, 1} at MMA k-slots 2q, 2q + 1 and K = 16 q + 4 s + {2, 3}
    at 2q + 8, 2q + 9 (the word layout above). So pair ``8 q + 2 s + v`` goes to k-slot pair
    ``8 s + 4 v + q`` of the row, i.e. 16-byte unit ``2 s + v`` at 4-byte position ``q``, and the
    swizzle stores unit ``j`` of row ``r`` at unit ``j ^ (r % 8)`` (1024-byte atoms of 8 rows).
    Plain integer arithmetic: the kernel evaluates it on DSL integers, the tests on Python ints."""
    q = pair // 8
    s = (pair % 8) // 2
    v = pair % 2
    return r * 128 + (((2 * s + v) ^ (r % 8)) * 16) + 4 * q


def sw128_kmajor_offset(r, k):
    """Byte offset the tensor cores read for element ``(row r, k)`` of a K-major bf16/fp16 operand
    with the 128-byte swizzle whose descriptor starts at a 1024-byte aligned tile (PTX ISA,
    "Shared Memory Matrix Layout", 128B swizzling; ``k`` < 64 within the 128-byte row): the
    16-byte unit ``k // 8`` of row ``r`` lives at unit ``(k // 8) ^ (r % 8)``. A k-step ``s``
    (16 deep) starts its descriptor 32 bytes further, so it reads ``k = 16 s + kk``."""
    return (r // 8) * 1024 + (r % 8) * 128 + (((k // 8) ^ (r % 8)) * 16) + (k % 8) * 2


# --------------------------------------------------------------------------- torch references of the kernel's decode


def _rotr(w: torch.Tensor, r: int) -> torch.Tensor:
    return ((w >> r) | (w << (32 - r))) & _M32 if r else w


def decode_words_ref(words: torch.Tensor, kind: str) -> torch.Tensor:
    """The kernel's integer decode in torch: int64 words (holding uint32) -> int64 [..., 4] outputs
    o0..o3 (bf16x2 / f16x2 bit patterns), with the same rotations, XORs and masks."""
    sch = SCHEMES[kind]
    f = sch.field_mask
    outs = []
    for src in sch.sources:
        v = _rotr(words, src[0])
        for r in src[1:]:
            v = v ^ _rotr(words, r)
        outs.append(v & f)
    return torch.stack(outs, dim=-1)


def _halves(bits32: torch.Tensor, kind: str) -> torch.Tensor:
    """int64 [...] holding uint32 pairs -> fp32 [..., 2] (low, high) read as bf16 / fp16."""
    dt = torch.bfloat16 if kind == "bf16" else torch.float16
    lo = (bits32 & 0xFFFF).to(torch.int32).to(torch.int16)
    hi = ((bits32 >> 16) & 0xFFFF).to(torch.int32).to(torch.int16)
    return torch.stack([lo, hi], dim=-1).view(dt).float()


def decode_ref(p: Sm90Weight, scaled: bool = True) -> torch.Tensor:
    """The prepared weight decoded the kernel's way -> fp32 [n_pad, k_pad].

    ``scaled``: ``E2M1 * s * 2**-7`` -- the packed product the MMA consumes, computed as the
    kernel does (decoded pair times the re-encoded scale, in bf16/fp16, then read as fp32);
    otherwise the raw decoded pairs (``E2M1 * 2**-126`` bf16 / ``E2M1 * 2**-14`` fp16)."""
    nt, nc = p.n_tiles, p.n_chunks
    by = p.weight.reshape(nt, nc, 8, 4, 4, 4).to(torch.int64)  # [t, c, g, q, step, byte]
    words = by[..., 0] | (by[..., 1] << 8) | (by[..., 2] << 16) | (by[..., 3] << 24)
    outs = decode_words_ref(words, p.kind)  # [t, c, g, q, step, 4]
    vals = _halves(outs, p.kind)  # [t, c, g, q, step, j, h]
    if scaled:
        s = p.scale.reshape(nt, nc // 4, 8, 4, 2, 2, 2).to(torch.int64)  # [t, c4, g, q, pair, rowsel, c%2]
        sv = decode_scale_bits(s, p.kind)  # fp32 s * 2**119 | s * 2**7
        sv = sv.permute(0, 1, 4, 6, 2, 3, 5).reshape(nt, nc, 8, 4, 2)  # [t, c, g, q, rowsel]
        dt = torch.bfloat16 if p.kind == "bf16" else torch.float16
        rs = torch.tensor([0, 1, 0, 1], device=vals.device)  # output j -> row select
        sj = sv[..., rs][:, :, :, :, None, :, None]  # [t, c, g, q, 1, j, 1]
        # the packed multiply in the operand dtype (exact by construction; computed in fp32 and
        # rounded once, which is what one bf16/fp16 multiply does)
        vals = (vals * sj).to(dt).float()
    # [t, c, g, q, step, j(rowsel, pair), h] -> rows (rowsel, g), K (c, q, step, pair, h)
    v = vals.reshape(nt, nc, 8, 4, 4, 2, 2, 2)  # j = 2 * pair + rowsel
    v = v.permute(0, 6, 2, 1, 3, 4, 5, 7)  # [t, rowsel, g, c, q, step, pair, h]
    return v.reshape(nt * 16, nc * 64)


def dequant_ref(p: Sm90Weight) -> torch.Tensor:
    """``E2M1 * s`` of the prepared weight, [n, k] fp32 (exact; the unpadded layer)."""
    return decode_ref(p)[: p.n, : p.k] * 128.0


def restore_codes(p: Sm90Weight) -> torch.Tensor:
    """Inverse of the weight re-layout: int32 codes [n, k] of the prepared weight (zero-scale blocks
    zeroed, negative scales folded, as prepared), read back through the kernel's decode."""
    sch = SCHEMES[p.kind]
    nt, nc = p.n_tiles, p.n_chunks
    by = p.weight.reshape(nt, nc, 8, 4, 4, 4).to(torch.int64)
    words = by[..., 0] | (by[..., 1] << 8) | (by[..., 2] << 16) | (by[..., 3] << 24)
    outs = decode_words_ref(words, p.kind)  # [t, c, g, q, step, j]
    codes = torch.zeros((nt, nc, 8, 4, 4, 2, 4), dtype=torch.int64, device=words.device)
    for j in range(4):
        for h in range(2):
            for cb, fp in enumerate(sch.field):
                codes[..., j % 2, 2 * (j // 2) + h] |= ((outs[..., j] >> (fp + 16 * h)) & 1) << cb
    c = codes.permute(0, 5, 2, 1, 3, 4, 6).reshape(nt * 16, nc * 64)
    return c[: p.n, : p.k].to(torch.int32)


def to_modelopt(p: Sm90Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """The checkpoint (ModelOpt) layout back from a prepared weight: packed E2M1 uint8 [n, k/2] and
    the 128x4-swizzled e4m3 block scales (1-D), value-exact: ``E2M1 * s`` of every element equals
    the original's (a negative scale comes back positive with its sign in the codes, a zero-scale
    block as zero codes with scale 1.0: the forms :func:`prepare_sm90_weight` stored)."""
    codes = restore_codes(p)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    nt, nc = p.n_tiles, p.n_chunks
    # inverse of the scale permutation in prepare_sm90_weight
    sc = p.scale.reshape(nt, nc // 4, 8, 4, 2, 2, 2).permute(0, 5, 2, 1, 4, 6, 3).reshape(p.n_pad, p.k_pad // 16)
    enc = sc[: p.n, : p.k // NVFP4.block_size].to(torch.int32)
    value = torch.ldexp((8 + (enc & 7)).float(), (enc >> 3) - 13)  # 2**E * (1 + f/8), E = (enc >> 3) - 10
    return packed, to_blocked(value.to(torch.float8_e4m3fn))


def e2m1_of(codes: torch.Tensor) -> torch.Tensor:
    return E2M1_VALUES.to(codes.device)[codes.long()]


__all__ = [
    "KINDS",
    "SCHEMES",
    "DecodeScheme",
    "Sm90Weight",
    "decode_ref",
    "decode_scale_bits",
    "decode_words_ref",
    "dequant_ref",
    "e2m1_of",
    "encode_scales",
    "kind_of",
    "pad_rows_for",
    "prepare_sm90_weight",
    "restore_codes",
    "to_modelopt",
    "sw128_kmajor_offset",
    "x_slot_offset",
]
