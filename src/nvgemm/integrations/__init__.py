"""Integrations with host projects: Inductor (``torch.compile``), vLLM, SGLang, ModelOpt checkpoints; the
serving layer both engine plugins share (:mod:`nvgemm.integrations.serving`)."""
