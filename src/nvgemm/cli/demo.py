"""``nvgemm demo``: quantize (or load) an NVFP4 checkpoint, greedy-decode with nvgemm, check it.

With no arguments: builds a small Llama-style model (``--model moe``: a tiny Qwen3-MoE; also
mixtral, deepseek_v3, llama4) from an embedded config, quantizes it with
ModelOpt (NVFP4_DEFAULT_CFG, random calibration), exports it with ModelOpt's HF exporter, loads
it with nvgemm, greedy-decodes a few tokens (KV cache), and prints per-token latency, the path
(backend) each linear ran, and agreement with the checkpoint's dequantize-and-matmul reference.
No network. ``--checkpoint DIR`` runs an existing exported checkpoint instead.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import logging
import re
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

from nvgemm import settings
from nvgemm.integrations.inductor import enable
from nvgemm.integrations.modelopt import CheckpointError, load_modelopt_checkpoint
from nvgemm.integrations.modelopt.reference import DequantExperts, build_reference_model, dequant_linear_of
from nvgemm.nn.experts import NVFP4Experts
from nvgemm.nn.linear import NVFP4Linear
from nvgemm.testing import build_tiny_model, quantize_and_export

MOE_DEMO_KINDS = ("qwen3_moe", "mixtral", "deepseek_v3", "llama4", "nemotron_h")  # nvgemm.testing.TINY_CONFIGS
DEMO_CONFIG = dict(
    kind="llama", hidden_size=256, intermediate_size=768, num_hidden_layers=4,
    num_attention_heads=8, num_key_value_heads=4, vocab_size=1024, max_position_embeddings=512,
)


#: ``--emulate-kernels`` choice -> the target whose Triton PTX runs on the emulator beside ``emu_<choice>``
EMULATED_TRITON_ARCH = {"sm90": "sm_90a", "sm100": "sm_100a", "sm120": "sm_120a"}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("demo", help="quantize a small Llama or MoE model with ModelOpt, decode it with nvgemm, check it",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, help="an exported ModelOpt NVFP4 checkpoint folder (default: build one)")
    p.add_argument("--model", choices=["llama", "moe", *MOE_DEMO_KINDS], default="llama",
                   help="built-in model: a small Llama (default), or a tiny MoE (moe = qwen3_moe; also mixtral, "
                        "deepseek_v3 with shared expert and dense layer, llama4 with stacked experts, "
                        "nemotron_h with non-gated relu2 experts)")
    p.add_argument("--algo", choices=["NVFP4", "W4A16_NVFP4"], default="NVFP4",
                   help="quantization for the built-in model (default NVFP4 = W4A4)")
    p.add_argument("--tokens", type=positive_int, default=8, help="tokens to generate (default 8)")
    p.add_argument("--prompt-len", type=positive_int, default=16, help="random prompt length (default 16)")
    p.add_argument("--batch", type=positive_int, default=1, help="decode batch size (default 1)")
    p.add_argument("--device", type=device_arg, default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--compile", action="store_true",
                   help="run the decode step under torch.compile(mode='max-autotune') with nvgemm enabled")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quantize-lm-head", action="store_true",
                   help="also quantize the bf16 lm_head to NVFP4 at load (load_modelopt_checkpoint("
                        "quantize_lm_head=True): W4A4 on an sm_100-family GPU, W4A16 elsewhere; changes the logits) "
                        "and print its logit and greedy-token agreement with the bf16 lm_head")
    p.add_argument("--emulate-kernels", choices=list(EMULATED_TRITON_ARCH), default=None,
                   help="run every linear on the real sm_90a / sm_100a / sm_120a kernel executed by the CPU PTX "
                        "emulator (NVGEMM_BACKEND=emu_sm90 / emu_sm100 / emu_sm120; slow: use few --tokens) and print "
                        "each linear's agreement (sm100 and sm120 run their W4A4 kernel for the default --algo NVFP4, "
                        "sm120 the mma W4A16 kernel compiled for sm_120a for W4A16); the Triton kernels on "
                        "that path (activation quantizer, W4A4 qdq, MoE prep / finalize) run from their PTX on the "
                        "emulator too, and a last line names them")
    p.set_defaults(func=run)
    return p


#: Warnings raised *inside third-party code* on the demo's path, silenced for the demo only (never
#: globally, never in the library): (logger or warning module, message prefix, why it is not ours).
THIRD_PARTY_NOISE = (
    ("torch.jit._script", "`torch.jit.script",
     "ModelOpt 0.47 calls torch.jit.script at import (modelopt/torch/quantization/tensor_quant.py); "
     "torch 2.11's own modules call torch.jit.script_method"),
    ("modelopt.torch", "transformers ",
     "ModelOpt 0.47 warns that transformers >= 5.15 is outside its tested range; nvgemm's tests check "
     "the exported bytes and logits with the installed transformers"),
    ("transformers.configuration_utils", "`torch_dtype` is deprecated",
     "ModelOpt's HF exporter reads config.torch_dtype (modelopt/torch/export/unified_export_hf.py)"),
    ("modelopt.torch.quantization.qtensor.nvfp4_tensor", "torch.searchsorted(): input value tensor is non-contiguous",
     "ModelOpt 0.47 quantizes Llama-4's stacked BMM experts through a non-contiguous view (--model llama4)"),
    ("torch.utils.cpp_extension", "No CUDA runtime is found",
     "torch.utils.cpp_extension, imported by ModelOpt, logs this on every GPU-less machine"),
)


class _DropMessages(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.prefixes)


@contextlib.contextmanager
def quiet_third_party():
    """Silence exactly :data:`THIRD_PARTY_NOISE` for the duration of the demo (restored on exit)."""
    with warnings.catch_warnings():
        installed = []
        for where, prefix, _why in THIRD_PARTY_NOISE:
            warnings.filterwarnings("ignore", message=re.escape(prefix), module=re.escape(where))
            logger, filt = logging.getLogger(where), _DropMessages((prefix,))
            logger.addFilter(filt)
            installed.append((logger, filt))
        try:
            yield
        finally:
            for logger, filt in installed:
                logger.removeFilter(filt)


def _cache_name(model) -> str:
    """The KV-cache keyword of the model's forward: ``cache`` (transformers >= 5.2x) or ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _cache_of(res, name: str):
    return res[name] if name in res else getattr(res, name)


def _greedy(model, ids, n_tokens, step_fn=None):
    import torch

    step = step_fn if step_fn is not None else model
    kv = _cache_name(model)
    times, out = [], []
    with torch.no_grad():
        t0 = time.perf_counter()
        res = model(input_ids=ids, use_cache=True)
        _sync(ids)
        prefill = time.perf_counter() - t0
        pkv, nxt = _cache_of(res, kv), res.logits[:, -1].argmax(-1, keepdim=True)
        logits = [res.logits[:, -1].float()]
        if step_fn is not None:  # decode steps run compiled: eager paths recorded by the prefill are stale
            for mod in model.modules():
                if isinstance(mod, (NVFP4Linear, NVFP4Experts)):
                    mod.last_path = None
        out.append(nxt)
        for _ in range(n_tokens - 1):
            t0 = time.perf_counter()
            res = step(input_ids=nxt, use_cache=True, **{kv: pkv})
            _sync(ids)
            times.append(time.perf_counter() - t0)
            pkv, nxt = _cache_of(res, kv), res.logits[:, -1].argmax(-1, keepdim=True)
            logits.append(res.logits[:, -1].float())
            out.append(nxt)
    return torch.cat(out, dim=1), logits, prefill, times


def _sync(t):
    import torch

    if t.is_cuda:
        torch.cuda.synchronize(t.device)


def positive_int(s: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def device_arg(s: str) -> str:
    """argparse type: ``cpu``, ``cuda`` or ``cuda:N``."""
    if s == "cpu" or s == "cuda" or (s.startswith("cuda:") and s[5:].isdigit()):
        return s
    raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {s!r}")


def run(args) -> int:
    with quiet_third_party(), _emulated_kernels(getattr(args, "emulate_kernels", None)):
        if args.device and args.device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                print(f"nvgemm demo: --device {args.device}: no CUDA device is available", file=sys.stderr)
                return 2
        try:
            return _run(args)
        except CheckpointError as e:
            print(f"nvgemm demo: {e}", file=sys.stderr)
            return 2


@contextlib.contextmanager
def _emulated_kernels(arch):
    """``--emulate-kernels sm90``: force the emulator backend (CPU) for the run."""
    if arch is None:
        yield
        return
    from nvgemm import emulator  # lazy: the emulator is imported only when asked for

    triton_arch = EMULATED_TRITON_ARCH[arch]
    emulator.enable(triton_arch=triton_arch)
    print(f"nvgemm demo: every linear runs the real {arch} kernel on the CPU PTX emulator (NVGEMM_BACKEND=emu_{arch}); "
          f"the Triton kernels on its path run from their {triton_arch} PTX on the emulator too")
    n0 = _triton_launches()
    try:
        with settings.override(NVGEMM_BACKEND=f"emu_{arch}"):
            yield
    finally:
        emulator.disable_triton()
        from nvgemm.emulator.triton_ptx import LAUNCHES, summary  # lazy: as above

        print(summary(LAUNCHES[n0:]))


def _triton_launches() -> int:
    from nvgemm.emulator.triton_ptx import LAUNCHES  # lazy: the emulator is imported only when asked for

    return len(LAUNCHES)


def _run(args) -> int:
    import torch

    emulate = getattr(args, "emulate_kernels", None)
    device = "cpu" if emulate else (args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tmp = None
    if args.checkpoint is None:
        cfg = dict(DEMO_CONFIG) if args.model == "llama" else {}
        kind = cfg.pop("kind", "qwen3_moe" if args.model == "moe" else args.model)
        built = build_tiny_model(kind, args.seed, **cfg)
        c = built.config
        print(f"nvgemm demo: building a {c.num_hidden_layers}-layer {type(built).__name__} "
              f"(hidden {c.hidden_size}, vocab {c.vocab_size}), quantizing with ModelOpt {args.algo} ...")
        t0 = time.perf_counter()
        tmp = tempfile.TemporaryDirectory(prefix="nvgemm_demo_")
        ckpt = quantize_and_export(built, Path(tmp.name) / "ckpt", args.algo, args.seed)
        print(f"  quantized and exported with ModelOpt in {time.perf_counter() - t0:.1f} s -> {ckpt}")
    else:
        ckpt = args.checkpoint
    t0 = time.perf_counter()
    model = load_modelopt_checkpoint(ckpt, device=device, quantize_lm_head=getattr(args, "quantize_lm_head", False))
    n_moe = len(getattr(model, "nvgemm_moe_layers", ()))
    print(f"  loaded with nvgemm on {device} in {time.perf_counter() - t0:.2f} s "
          f"({len(model.nvgemm_quantized_layers)} NVFP4 linears" + (f", {n_moe} NVFP4 MoE layers" if n_moe else "") +
          f", quant_algo {model.nvgemm_quant_config.quant_algo}" +
          (f"; lm_head quantized at load: NVFP4 {model.nvgemm_lm_head}" if model.nvgemm_lm_head else "") + ")")
    ref = build_reference_model(model)

    gen = torch.Generator().manual_seed(args.seed)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=gen).to(device)

    step_fn = None
    if args.compile:
        enable()
        step_fn = torch.compile(model, mode="max-autotune", dynamic=True)

    captured: dict[str, tuple] = {}

    def capture(name):
        def hook(mod, inp, kw, out):
            captured[name] = (inp, kw, out.detach())
        return hook

    handles = [mod.register_forward_hook(capture(name), with_kwargs=True) for name, mod in model.named_modules()
               if isinstance(mod, (NVFP4Linear, NVFP4Experts))]
    toks, logits, prefill, times = _greedy(model, ids, args.tokens, step_fn)
    for h in handles:
        h.remove()
    ref_toks, ref_logits, _, _ = _greedy(ref, ids, args.tokens)
    head_note = None
    if model.nvgemm_lm_head is not None:  # the same checkpoint with its bf16 lm_head: what quantizing it changed
        bf16_head = load_modelopt_checkpoint(ckpt, device=device)
        b_toks, b_logits, _, _ = _greedy(bf16_head, ids, args.tokens)
        b_rel = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)) for a, b in zip(logits, b_logits))
        prefix = (toks == b_toks).long().cumprod(1).sum(1).tolist()  # identical tokens before the first divergence
        head_note = (f"  NVFP4 lm_head ({model.nvgemm_lm_head}) vs the bf16 lm_head: max|logit diff|/max|logit| "
                     f"= {b_rel:.2e} over {len(logits)} steps; greedy tokens identical: "
                     f"{int((toks == b_toks).sum())} of {toks.numel()} (identical prefix per sequence: {prefix})")

    kinds: dict[str, Counter] = {}
    worst, worst_name = 0.0, ""
    per_linear: list[tuple[str, float]] = []
    for name, mod in model.named_modules():
        if isinstance(mod, (NVFP4Linear, NVFP4Experts)):
            parts = name.rsplit(".", 2)
            label = parts[-2] if parts[-1] == "fused" and len(parts) > 1 else parts[-1]  # qkv_proj.fused -> qkv_proj
            kinds.setdefault(label, Counter())[mod.last_path or "torch.compile (nvgemm)"] += 1
            if name in captured:
                inp, kw, y = captured[name]
                want = (dequant_linear_of(mod) if isinstance(mod, NVFP4Linear) else DequantExperts(mod))(*inp, **kw).float()
                err = float((y.float() - want).abs().max() / want.abs().max().clamp_min(1e-12))
                per_linear.append((name, err))
                if err >= worst:
                    worst, worst_name = err, name

    print(f"\nprefill ({args.batch}x{args.prompt_len} tokens): {prefill * 1e3:.2f} ms")
    if times:
        print(f"decode: {len(times)} steps, per-token latency median {statistics.median(times) * 1e3:.2f} ms "
              f"(min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f})")
    print("\npath each linear / MoE experts layer ran (last decode step):")
    for layer, c in sorted(kinds.items()):
        print(f"  {layer:<12} " + ", ".join(f"{p} x{n}" for p, n in sorted(c.items())))
    same = bool((toks == ref_toks).all())
    rel = float((logits[0] - ref_logits[0]).abs().max() / ref_logits[0].abs().max().clamp_min(1e-12))
    if emulate:
        print(f"\nper linear, last decode step ({emulate} kernel on the emulator vs the dequantize-and-matmul reference):")
        for name, err in per_linear:
            print(f"  {name:<40} max|diff|/max|ref| = {err:.2e}")
    print("\nagreement with the checkpoint's dequantize-and-matmul reference:")
    print(f"  every linear{' and MoE layer' if n_moe else ''}, last decode step: worst max|diff|/max|ref| = "
          f"{worst:.2e} ({worst_name})")
    print(f"  first-step logits: max|diff|/max|logit| = {rel:.2e}; greedy tokens identical: {same}")
    print(f"  generated: {toks[0].tolist()}")
    if head_note is not None:
        print(head_note)
    if tmp is not None:
        tmp.cleanup()
    # per linear / MoE layer: the same math, up to fp32 summation order and one bf16 rounding (2^-8 relative)
    ok = worst <= 2.0**-7
    print("\nOK" if ok else "\nMISMATCH: an nvgemm linear disagrees with the reference beyond bf16 rounding")
    return 0 if ok else 1
