"""``torch.nn`` modules: :class:`NVFP4Linear`, :class:`NVFP4Experts`, the gated MLP."""
