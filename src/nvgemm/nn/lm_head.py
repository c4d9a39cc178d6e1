"""Optional NVFP4 ``lm_head``: quantize a causal LM's bf16 output projection with ModelOpt's recipe.

ModelOpt exports keep ``lm_head`` in bf16 (``exclude_modules``); at decode batch 1 it is the largest
single GEMM of a small-vocabulary-heavy model (Llama-3.1-8B: 128256 x 4096, 1 GB in bf16, ~13% of the
step's weight bytes). :func:`quantize_lm_head` replaces it by an :class:`~nvgemm.nn.linear.NVFP4Linear`
built by nvgemm's ModelOpt-exact weight quantizer (:func:`nvgemm.core.formats.quantize_weight`:
global scale ``amax(W) / (6 * 448)``, e4m3 block scales per 16 elements of K, e2m1 codes).

Modes:
  * ``"w4a16"``: weight-only (the sm90 family on Hopper; the emulated path elsewhere);
  * ``"w4a4"``: activations quantized too, with a static ``input_scale`` (the sm100 family on
    Blackwell; the emulated path elsewhere);
  * ``"auto"``: ``"w4a4"`` on an sm_100-family GPU (capability 10.x), ``"w4a16"`` everywhere else.

The static activation scale (W4A4). ModelOpt calibrates ``input_scale = amax(x) / 2688`` on data; a
checkpoint brings none for ``lm_head``. Unless the caller passes one, nvgemm uses the supremum of the
final norm's output instead, found by running the norm module itself on +-one-hot inputs: for
RMSNorm (and LayerNorm), ``|norm(x)_j| = |x_j| / rms(x) * |g_j| <= sqrt(K) * |g_j|`` with equality at a
one-hot x, so the probe's amax bounds every input the head can see and the activation quantizer never
saturates. The price is precision only where a block's amax falls below ``bound / (448 * 64)``
(the e4m3 block scale turns subnormal): at K = 4096 that is a block 448x smaller than the largest norm
weight, which real final hidden states do not reach. A calibrated scale can be passed instead.

This changes the model's numerics (the logits carry NVFP4's weight error, and in W4A4 the
activation's): it is never applied unless asked for.
"""

from __future__ import annotations

import torch
from torch import nn

from nvgemm.core.formats import NVFP4, global_scale_from_amax
from nvgemm.nn.linear import NVFP4Linear

LM_HEAD_MODES = ("auto", "w4a16", "w4a4")
#: attribute names of the final norm on the decoder of common causal LMs (Llama/Qwen/Mistral: ``norm``,
#: NemotronH: ``norm_f``, GPT-2: ``ln_f``, Phi/StableLM: ``final_layernorm``)
FINAL_NORM_NAMES = ("norm", "norm_f", "ln_f", "final_layernorm")


def resolve_lm_head_mode(mode: str | bool, device: torch.device | str) -> str:
    """``True`` / ``"auto"`` -> ``"w4a4"`` on an sm_100-family GPU, else ``"w4a16"``; checks the name."""
    if mode is True:
        mode = "auto"
    if mode not in LM_HEAD_MODES:
        raise ValueError(f"quantize_lm_head: expected True, False or one of {LM_HEAD_MODES}, got {mode!r}")
    if mode != "auto":
        return mode
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 10:
        return "w4a4"
    return "w4a16"


def final_norm_of(model: nn.Module) -> nn.Module | None:
    """The decoder's final norm module (whose output feeds ``lm_head``), or None if not recognised."""
    roots = [model]
    get_decoder = getattr(model, "get_decoder", None)
    if callable(get_decoder):
        try:
            roots.insert(0, get_decoder())
        except (AttributeError, NotImplementedError, TypeError):
            pass
    for root in roots:
        for name in FINAL_NORM_NAMES:
            mod = getattr(root, name, None)
            if isinstance(mod, nn.Module) and isinstance(getattr(mod, "weight", None), torch.Tensor):
                return mod
    return None


@torch.no_grad()
def norm_output_bound(norm: nn.Module, hidden: int, chunk: int = 1024) -> float:
    """max |norm(x)| over all x, probed with the +-one-hot inputs where an RMSNorm / LayerNorm reaches it.

    The probe's magnitude (2**8 in the norm weight's dtype) makes the norm's epsilon negligible
    (mean square 2**16 / K against eps ~ 1e-6), so the probe returns the supremum as the norm
    module computes and rounds it."""
    w = norm.weight
    amax = 0.0
    for start in range(0, hidden, chunk):
        rows = min(chunk, hidden - start)
        x = torch.zeros(rows, hidden, dtype=w.dtype, device=w.device)
        x[torch.arange(rows), torch.arange(start, start + rows)] = 2.0**8
        for sign in (1.0, -1.0):
            y = norm(x * sign)
            if not bool(torch.isfinite(y).all()):
                raise ValueError(f"quantize_lm_head: the final norm ({type(norm).__name__}) returned non-finite "
                                 "values on the one-hot probe; pass lm_head_input_scale")
            amax = max(amax, float(y.float().abs().max()))
    return amax


def quantize_lm_head(model: nn.Module, mode: str | bool = "auto", *, input_scale: float | None = None,
                     device: torch.device | str | None = None) -> NVFP4Linear:
    """Replace ``model.get_output_embeddings()`` (an ``nn.Linear``) by an NVFP4Linear, in place.

    ``mode``: ``"w4a16"``, ``"w4a4"`` or ``"auto"`` / ``True`` (see the module docstring). ``input_scale``
    (W4A4 only): a calibrated static activation scale (``amax(x) / 2688``); by default the final-norm
    bound. A tied head (``tie_word_embeddings``) is untied: the embedding stays bf16 and the config
    says ``tie_word_embeddings=False`` so that transformers never re-ties the quantized head.
    Returns the new layer; ``model.nvgemm_lm_head`` names the mode."""
    head = model.get_output_embeddings()
    if isinstance(head, NVFP4Linear):
        raise ValueError("quantize_lm_head: lm_head is already NVFP4 (the checkpoint quantized it)")
    if not isinstance(head, nn.Linear):
        raise ValueError(f"quantize_lm_head: the output embedding is {type(head).__name__}, not an nn.Linear")
    k = head.in_features
    if k % NVFP4.block_size:
        raise ValueError(f"quantize_lm_head: lm_head in_features={k} is not a multiple of {NVFP4.block_size}")
    mode = resolve_lm_head_mode(mode, device if device is not None else head.weight.device)
    if mode == "w4a16":
        if input_scale is not None:
            raise ValueError("quantize_lm_head: input_scale is given but the mode is w4a16 (weight-only)")
        ins = None
    elif input_scale is not None:
        ins = torch.as_tensor(input_scale, dtype=torch.float32).reshape(())
        if not bool(torch.isfinite(ins)) or float(ins) <= 0:
            raise ValueError(f"quantize_lm_head: input_scale {float(ins)} is not a positive finite scale")
    else:
        norm = final_norm_of(model)
        if norm is None:
            raise ValueError(
                f"quantize_lm_head: W4A4 needs a static activation scale, and no final norm was found on "
                f"{type(model).__name__} (looked for {', '.join(FINAL_NORM_NAMES)}) to bound lm_head's input; "
                "pass lm_head_input_scale (a calibrated amax(x) / 2688) or use w4a16")
        ins = global_scale_from_amax(norm_output_bound(norm, k))
    new = NVFP4Linear.from_linear(head, input_scale=ins).to(head.weight.device)
    model.set_output_embeddings(new)
    for cfg in (getattr(model, "config", None), getattr(getattr(model, "config", None), "text_config", None)):
        if cfg is not None and getattr(cfg, "tie_word_embeddings", False):
            cfg.tie_word_embeddings = False
    model.nvgemm_lm_head = mode
    return new
