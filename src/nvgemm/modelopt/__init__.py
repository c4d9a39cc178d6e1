"""ModelOpt (and compressed-tensors) NVFP4 checkpoints -> transformers models with NVFP4Linear."""

from .checkpoint import CheckpointError, QuantConfig, load_modelopt_checkpoint, read_quant_config

__all__ = ["CheckpointError", "QuantConfig", "load_modelopt_checkpoint", "read_quant_config"]
