"""Integrations with host projects: Inductor (``torch.compile``), vLLM, ModelOpt checkpoints."""
