"""nvgemm's TorchInductor integration; the only nvgemm package that imports ``torch._inductor``.

Opt-in: ``nvgemm.enable()`` (or ``with nvgemm.enabled(): ...``) registers it; importing this
package does not touch ``torch._inductor`` (it only defines the ``nvgemm::nvfp4_linear_choice``
op that compiled code calls).
"""

from nvgemm.integrations.inductor import choices as _choices  # noqa: F401  (defines nvgemm::nvfp4_linear_choice)
from nvgemm.integrations.inductor.registration import check_torch_version, disable, enable, enabled, is_enabled

__all__ = ["enable", "disable", "enabled", "is_enabled", "check_torch_version"]
