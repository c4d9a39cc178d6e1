"""NVFP4 Mixture-of-Experts: the ``nvgemm::nvfp4_moe`` op, its backend registry and the ``NVFP4Experts`` module."""

from .backends import MoeBackend, MoeProblem, register_moe_backend, select_moe_backend  # noqa: F401
from .ops import MOE_ACTIVATIONS, check_moe_args, nvfp4_moe, nvfp4_moe_emulated  # noqa: F401
from .experts import NVFP4Experts  # noqa: F401
