"""ModelOpt (and compressed-tensors) NVFP4 checkpoints -> transformers models with NVFP4Linear."""

from nvgemm.integrations.modelopt.checkpoint import (
    CheckpointError,
    QuantConfig,
    load_modelopt_checkpoint,
    read_quant_config,
)
from nvgemm.nn.mlp import NVFP4GatedMLP, fuse_gated_mlps

__all__ = ["CheckpointError", "NVFP4GatedMLP", "QuantConfig", "fuse_gated_mlps", "load_modelopt_checkpoint",
           "read_quant_config"]
