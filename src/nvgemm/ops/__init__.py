"""The ``nvgemm::`` custom ops (importing this package registers them; pure torch)."""

from nvgemm.ops import linear  # noqa: F401  (nvgemm::nvfp4_linear, nvgemm::quantize_nvfp4)
from nvgemm.ops import moe  # noqa: F401  (nvgemm::nvfp4_moe)
from nvgemm.ops import fused  # noqa: F401  (nvgemm::nvfp4_linear_requant / _prequant)
