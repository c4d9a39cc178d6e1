"""What the running vLLM engine's config tells nvgemm's linear and MoE methods (:mod:`.method`,
:mod:`.moe`): the model's activation dtype and the token counts to resolve before serving."""

from __future__ import annotations

import torch

from nvgemm.integrations.serving import warmup_sizes
from nvgemm.integrations.vllm import _compat

V = _compat.load()


def model_dtype() -> torch.dtype:
    """The served model's activation dtype (bf16 unless vLLM's model config says fp16)."""
    cfg = V.get_current_vllm_config_or_none()
    dt = getattr(getattr(cfg, "model_config", None), "dtype", None)
    return dt if dt in (torch.bfloat16, torch.float16) else torch.bfloat16


def warmup_token_counts(device: torch.device) -> list[int]:
    """Token counts to resolve before serving: every CUDA-graph capture size vLLM will use, plus the
    upper bound of each of the policy's M buckets up to the scheduler's token budget (eager batches).
    On a CPU device nothing is compiled, so one count (1) only selects the backend for the log."""
    cfg = V.get_current_vllm_config_or_none()
    sizes: list[int] = []
    budget = 256
    if cfg is not None:
        if not cfg.model_config.enforce_eager:
            sizes = [int(s) for s in (cfg.compilation_config.cudagraph_capture_sizes or [])]
        budget = int(cfg.scheduler_config.max_num_batched_tokens)
    return warmup_sizes(sizes, budget, device)


__all__ = ["model_dtype", "warmup_token_counts"]
