"""nvgemm: NVFP4 decode GEMMs (CuTeDSL kernels) as an out-of-tree TorchInductor backend plugin.

``import nvgemm`` registers the ``nvgemm::`` custom ops (pure torch) and nothing else: no
cutlass, Triton or Inductor import, no device probing. ``nvgemm.enable()`` opts into the
Inductor integration.
"""

__version__ = "0.1.0"

from . import ops  # noqa: F401  (registers torch.ops.nvgemm.*)
from .triton_kernels import fused_ops as _fused_ops  # noqa: F401  (fused quantizer ops; torch only)
from .formats import NVFP4, Nvfp4Format, quantize_weight  # noqa: F401
from .linear import NVFP4Linear  # noqa: F401


def load_modelopt_checkpoint(*args, **kwargs):
    """See :func:`nvgemm.modelopt.load_modelopt_checkpoint` (imports transformers lazily)."""
    from .modelopt import load_modelopt_checkpoint as _load

    return _load(*args, **kwargs)
