"""``NVFP4Linear``: an inference ``nn.Module`` holding one NVFP4 weight, calling ``nvgemm::nvfp4_linear``."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from nvgemm.core.formats import (
    NVFP4,
    blocked_numel,
    blocked_shape,
    dequantize,
    from_blocked,
    is_blocked,
    quantize_weight,
    to_blocked,
)
from nvgemm.ops import prepared as _prepared  # noqa: F401  (registers nvgemm::nvfp4_linear_sm90_prepared)
from nvgemm.core.validation import LinearProblem, aligned, check_linear_args, check_scale_values
from nvgemm.dispatch.registry import last_selected
from nvgemm.ops.prepared import DECISION_M, sm90_serve_reason, sm90_weight_of
from nvgemm.templates.sm90_w4a16.operand import prepare_sm90_weight


class NVFP4Linear(nn.Module):
    """``y = epilogue(alpha * x @ dequant(W).T)`` with W stored as NVFP4.

    Buffers (what a ModelOpt export holds, with the block scales swizzled once at load):
      weight          uint8 [N, K/2]     packed E2M1, even K in the low nibble
      weight_scale    float8_e4m3fn      128x4 swizzled block scales (padding zero), tiled shape
                                         ``nvgemm.core.formats.blocked_shape(N, K/16)``
      weight_scale_2  float32 () or (N,) per-tensor global scale (a vector after ``fuse``)
      input_scale     float32 () or None static activation scale; None = weight-only (W4A16)
      bias            [N] or None

    ``activation`` ("none", "silu", "gelu_tanh", "silu_mul") is applied in the GEMM epilogue.
    ``last_path`` names the backend the most recent eager forward ran on.

    On Hopper, :meth:`prepare_for_sm90` replaces ``weight`` / ``weight_scale`` by the sm90 kernels'
    layout (buffers ``sm90_weight`` / ``sm90_scale``), so the layer holds its weight once; its
    ``state_dict`` still holds the checkpoint layout (re-encoded, value-exact) and loading one
    re-prepares into the same buffers.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        weight_only: bool = False,
        activation: str = "none",
        bias_dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        if in_features % NVFP4.block_size:
            raise ValueError(f"NVFP4Linear: in_features must be a multiple of 16, got {in_features}")
        self.in_features = in_features
        self.out_features = out_features
        self.activation = activation
        kb = in_features // NVFP4.block_size
        self.register_buffer("weight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device))
        self.register_buffer(
            "weight_scale", torch.zeros(blocked_shape(out_features, kb), dtype=torch.float8_e4m3fn, device=device)
        )
        self.register_buffer("weight_scale_2", torch.ones((), dtype=torch.float32, device=device))
        self.register_buffer(
            "input_scale", None if weight_only else torch.ones((), dtype=torch.float32, device=device)
        )
        self.register_buffer("bias", torch.zeros(out_features, dtype=bias_dtype, device=device) if bias else None)
        self.last_path: str | None = None
        self.sm90_kind: str | None = None  # set by prepare_for_sm90

    # ------------------------------------------------------------------ construction

    @property
    def weight_only(self) -> bool:
        return self.input_scale is None

    @classmethod
    def from_tensors(
        cls,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        weight_scale_2: torch.Tensor,
        input_scale: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        activation: str = "none",
    ) -> "NVFP4Linear":
        """Build from checkpoint tensors.

        ``weight_scale`` is either the checkpoint's linear [N, K/16] matrix (swizzled here) or
        already-swizzled scales in their tiled shape ``nvgemm.core.formats.blocked_shape(N, K/16)``.
        1-D scales are refused: a flattened linear matrix has the swizzled size whenever
        N % 128 == 0 and K % 64 == 0, so the layout cannot be told from the tensor. Pass swizzled
        bytes as ``scale.view(blocked_shape(N, K // 16))`` and linear ones as ``scale.view(N, K // 16)``.
        """
        if weight.dtype != torch.uint8 or weight.dim() != 2:
            raise ValueError(f"NVFP4Linear: weight must be uint8 [N, K/2], got {weight.dtype} {tuple(weight.shape)}")
        n, k = weight.shape[0], weight.shape[1] * 2
        kb = k // NVFP4.block_size
        if weight_scale.dim() == 2:
            if tuple(weight_scale.shape) != (n, kb):
                raise ValueError(
                    f"NVFP4Linear: weight_scale shape {tuple(weight_scale.shape)} does not match weight "
                    f"{tuple(weight.shape)}: expected ({n}, {kb})"
                )
            weight_scale = to_blocked(weight_scale)
        elif not is_blocked(weight_scale, n, kb):
            raise ValueError(
                f"NVFP4Linear: weight_scale shape {tuple(weight_scale.shape)} is neither the linear ({n}, {kb}) "
                f"matrix nor the swizzled tiled shape {blocked_shape(n, kb)}; 1-D scales are ambiguous (a "
                f"flattened linear matrix can have the swizzled size): reshape genuinely swizzled bytes with "
                f".view{blocked_shape(n, kb)}, linear ones to ({n}, {kb})"
            )
        mod = cls(k, n, bias=bias is not None, weight_only=input_scale is None, activation=activation,
                  bias_dtype=bias.dtype if bias is not None else torch.bfloat16, device="meta")
        mod.weight = aligned(weight)  # the kernels read both in place (16-byte aligned)
        mod.weight_scale = aligned(weight_scale)
        mod.weight_scale_2 = weight_scale_2.float().reshape(weight_scale_2.shape if weight_scale_2.dim() == 1 else ())
        mod.input_scale = None if input_scale is None else input_scale.float().reshape(())
        mod.bias = None if bias is None else aligned(bias)
        mod._validate()
        return mod

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, input_scale: torch.Tensor | float | None = None, activation: str = "none"
    ) -> "NVFP4Linear":
        """Quantize an ``nn.Linear`` with nvgemm's ModelOpt-exact recipe (input_scale None = W4A16)."""
        q = quantize_weight(linear.weight.detach())
        ins = None if input_scale is None else torch.as_tensor(input_scale, dtype=torch.float32).reshape(())
        bias = None if linear.bias is None else linear.bias.detach()
        return cls.from_tensors(q.packed, q.scale, q.global_scale, ins, bias, activation)

    @classmethod
    def fuse(cls, layers: Sequence["NVFP4Linear"]) -> "NVFP4Linear":
        """Concatenate shards (q/k/v, gate/up) along N into one GEMM, exactly.

        Unequal ``weight_scale_2`` become a per-output-column alpha vector (no re-quantization).
        W4A4 shards must share ``input_scale``: the activation is quantized once for the fused
        GEMM, so unequal input scales cannot be fused exactly and raise instead.
        """
        if not layers:
            raise ValueError("NVFP4Linear.fuse needs at least one layer")
        k = layers[0].in_features
        for i, l in enumerate(layers):
            if l.sm90_kind is not None:
                raise ValueError(f"NVFP4Linear.fuse: shard {i} is held in the sm90 layout; fuse before prepare_for_sm90")
            if l.in_features != k:
                raise ValueError(f"NVFP4Linear.fuse: shard {i} has in_features={l.in_features}, expected {k}")
            if l.weight_only != layers[0].weight_only:
                raise ValueError("NVFP4Linear.fuse: cannot fuse weight-only and W4A4 shards")
            if l.activation != "none":
                raise ValueError("NVFP4Linear.fuse: shards must not carry an activation")
            if (l.bias is None) != (layers[0].bias is None):
                raise ValueError("NVFP4Linear.fuse: either all shards have a bias or none")
        if not layers[0].weight_only:
            scales = torch.stack([l.input_scale.reshape(()) for l in layers])
            if not bool((scales == scales[0]).all()):
                raise ValueError(
                    f"NVFP4Linear.fuse: shards have unequal input_scale {scales.tolist()}; one activation "
                    "quantization cannot serve them exactly, keep them as separate GEMMs"
                )
        kb = k // NVFP4.block_size
        weight = torch.cat([l.weight for l in layers])
        scale = torch.cat([from_blocked(l.weight_scale, l.out_features, kb) for l in layers])
        ws2 = [l.weight_scale_2.expand(l.out_features) for l in layers]
        ws2 = torch.cat(ws2)
        if bool((ws2 == ws2[0]).all()) and all(l.weight_scale_2.dim() == 0 for l in layers):
            ws2 = ws2[0].clone().reshape(())
        bias = torch.cat([l.bias for l in layers]) if layers[0].bias is not None else None
        ins = None if layers[0].weight_only else layers[0].input_scale.clone()
        return cls.from_tensors(weight, scale, ws2, ins, bias)

    # ------------------------------------------------------------------ one copy on Hopper

    def prepare_for_sm90(self, kind: str = "bf16") -> int:
        """Hold the weight only in the sm90 kernels' layout for ``kind`` ("bf16" / "fp16")
        activations (:mod:`nvgemm.ops.prepared`); returns the bytes the layer now holds for it.
        Activations of the other dtype, and devices other than an sm_90 GPU, still work (the
        checkpoint layout is rebuilt per call, with a warning)."""
        if self.sm90_kind is not None:
            raise RuntimeError(f"NVFP4Linear: already prepared for sm90 ({self.sm90_kind})")
        if self.in_features % 32:
            raise ValueError(f"NVFP4Linear.prepare_for_sm90: K={self.in_features} is not a multiple of 32")
        p = prepare_sm90_weight(self.weight, self.weight_scale, self.weight_scale_2, kind)
        self.weight = None
        self.weight_scale = None
        self.register_buffer("sm90_weight", p.weight, persistent=False)
        self.register_buffer("sm90_scale", p.scale, persistent=False)
        self.sm90_kind = kind
        if not getattr(self, "_sm90_hooks", False):
            self._register_state_dict_hook(_sm90_state_dict_hook)
            self._register_load_state_dict_pre_hook(_sm90_load_pre_hook, with_module=True)
            self._sm90_hooks = True
        return p.nbytes()

    def _sm90_prepared(self):
        return sm90_weight_of(self.sm90_weight, self.sm90_scale, self.weight_scale_2, self.out_features,
                              self.in_features, self.sm90_kind)

    def checkpoint_layout(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight, weight_scale) in the checkpoint layout (re-encoded when prepared for sm90)."""
        if self.sm90_kind is None:
            return self.weight, self.weight_scale
        # lazy: looked up at call time (tests patch operand.to_modelopt)
        from nvgemm.templates.sm90_w4a16.operand import to_modelopt

        return to_modelopt(self._sm90_prepared())

    def _validate(self) -> None:
        """Shapes and dtypes, and (once, at construction: a device sync is fine here) the scale values
        the op checks per call only for host tensors."""
        x = torch.empty((1, self.in_features), dtype=torch.bfloat16, device="meta")
        check_linear_args(
            x, self.weight.to("meta"), self.weight_scale.to("meta"), self.weight_scale_2.to("meta"),
            None if self.input_scale is None else self.input_scale.to("meta"),
            None if self.bias is None else self.bias.to("meta"), None, self.activation, None,
        )
        if self.weight_scale_2.is_meta or self.weight.is_meta:
            return
        ws2 = self.weight_scale_2.detach().float().cpu()
        check_scale_values(ws2, None if self.input_scale is None else self.input_scale.detach().cpu(), "NVFP4Linear")
        zero = (ws2.expand(self.out_features) == 0).to(self.weight.device)
        if bool(zero.any()) and bool(self.weight[zero].any()):
            raise ValueError("NVFP4Linear: weight_scale_2 is 0 for rows whose codes are not all zero; their "
                             "output would be 0 (a zero global scale belongs only to an all-zero weight)")

    # ------------------------------------------------------------------ compute

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.sm90_kind is not None:
            out = torch.ops.nvgemm.nvfp4_linear_sm90_prepared(
                x, self.sm90_weight, self.sm90_scale, self.weight_scale_2, self.input_scale, self.bias, residual,
                self.activation, None, self.out_features, self.in_features, self.sm90_kind)
        else:
            out = torch.ops.nvgemm.nvfp4_linear(x, self.weight, self.weight_scale, self.weight_scale_2,
                                                self.input_scale, self.bias, residual, self.activation, None)
        if not torch.compiler.is_compiling():
            self.last_path = last_selected()
        return out

    def dequantized_weight(self) -> torch.Tensor:
        """fp32 [N, K] = E2M1 * block scale * weight_scale_2 (the reference weight)."""
        kb = self.in_features // NVFP4.block_size
        w, s = self.checkpoint_layout()
        return dequantize(w, from_blocked(s, self.out_features, kb), self.weight_scale_2)

    def extra_repr(self) -> str:
        mode = "W4A16" if self.weight_only else "W4A4"
        held = "" if self.sm90_kind is None else f", held in the sm90 layout ({self.sm90_kind})"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"{mode}, activation={self.activation}{held}")


def _sm90_state_dict_hook(module: NVFP4Linear, state_dict, prefix, local_metadata):
    """A prepared layer saves the checkpoint layout (value-exact re-encoding)."""
    if module.sm90_kind is not None:
        w, s = module.checkpoint_layout()
        state_dict[prefix + "weight"] = w
        state_dict[prefix + "weight_scale"] = s
    return state_dict


def _sm90_load_pre_hook(module: NVFP4Linear, state_dict, prefix, local_metadata, strict, missing_keys,
                        unexpected_keys, error_msgs):
    """Loading a checkpoint-layout state into a prepared layer re-prepares it into the same buffers
    (CUDA graphs captured on them replay the new weight)."""
    if module.sm90_kind is None or prefix + "weight" not in state_dict:
        return

    w = state_dict.pop(prefix + "weight")
    s = state_dict.pop(prefix + "weight_scale", None)
    if s is None:
        error_msgs.append(f"{prefix}weight_scale missing (needed with {prefix}weight)")
        return
    ws2 = state_dict.get(prefix + "weight_scale_2", module.weight_scale_2)
    dev = module.sm90_weight.device
    p = prepare_sm90_weight(w.to(dev), s.to(dev), ws2.to(dev), module.sm90_kind)
    if p.weight.shape != module.sm90_weight.shape:
        error_msgs.append(f"{prefix}weight: shape {tuple(w.shape)} does not match the layer "
                          f"({module.out_features}, {module.in_features // 2})")
        return
    with torch.no_grad():
        module.sm90_weight.copy_(p.weight)
        module.sm90_scale.copy_(p.scale)


def prepare_for_sm90(model: nn.Module, kind: str = "bf16", *, log=None) -> dict[str, int]:
    """:meth:`NVFP4Linear.prepare_for_sm90` on every NVFP4Linear of ``model`` the sm90 kernels will
    serve for ``kind`` activations (:func:`nvgemm.ops.prepared.sm90_serve_reason` at M in
    :data:`~nvgemm.ops.prepared.DECISION_M`: an sm_90 GPU, K % 32 == 0, the kernel passing its first-use
    check, no ``NVGEMM_BACKEND`` naming another backend). Logs one line per prepared layer (bytes
    held, checkpoint bytes freed) and a total; returns {layer name: bytes held}."""
    import logging

    log = log or logging.getLogger("nvgemm_cutedsl")
    x_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[kind]
    out, ckpt, kept = {}, 0, {}
    hopper = False
    for name, mod in model.named_modules():
        if not isinstance(mod, NVFP4Linear) or mod.sm90_kind is not None:
            continue
        dev = mod.weight.device
        cap = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
        hopper |= cap == (9, 0)
        why = sm90_serve_reason(
            LinearProblem(m=m, n=mod.out_features, k=mod.in_features, device_type=dev.type, capability=cap,
                          weight_only=mod.weight_only, x_dtype=x_dtype, out_dtype=x_dtype,
                          alpha="vector" if mod.weight_scale_2.dim() == 1 else "scalar", bias=mod.bias is not None,
                          activation=mod.activation, residual=False) for m in DECISION_M)
        if why is not None:
            kept.setdefault(why, []).append(name)
            continue
        before = sum(t.numel() * t.element_size() for t in (mod.weight, mod.weight_scale))
        out[name] = mod.prepare_for_sm90(kind)
        ckpt += before
        log.info("nvgemm: %s held in the sm90 layout only: %.2f MiB (its checkpoint layout, %.2f MiB, freed; "
                 "re-encoded on save)", name, out[name] / 2**20, before / 2**20)
    if out and torch.cuda.is_available():  # the PDL kernels stream weights before griddepcontrol.wait
        torch.cuda.synchronize()
    if out or hopper:
        why = "; ".join(f"{len(v)} ({v[0]}{', ...' if len(v) > 1 else ''}): {r}" for r, v in kept.items())
        log.info("nvgemm: %d NVFP4 layers held once, in the sm90 layout: %.2f MiB (checkpoint layout %.2f MiB, "
                 "not kept)%s", len(out), sum(out.values()) / 2**20, ckpt / 2**20,
                 f"; kept in the checkpoint layout: {why}" if why else "")
    return out
