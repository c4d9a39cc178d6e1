"""nvgemm: NVFP4 decode GEMMs (CuTeDSL kernels) as an out-of-tree TorchInductor backend plugin.

``import nvgemm`` registers the ``nvgemm::`` custom ops (pure torch) and nothing else: no
cutlass, Triton or Inductor import, no device probing. ``nvgemm.enable()`` opts into the
Inductor integration.
"""

__version__ = "0.1.0"

from nvgemm.core.family import add_family_root as _add_family_root

# The built-in kernel families are the folders of nvgemm.templates: each registers itself when the family
# registry is first consulted (nothing is imported here).
_add_family_root("nvgemm.templates")
from nvgemm import ops  # noqa: F401  (registers torch.ops.nvgemm.*)
from nvgemm.templates.triton import fused_ops as _fused_ops  # noqa: F401  (fused quantizer ops; torch only)
from nvgemm.core.formats import NVFP4, Nvfp4Format, quantize_weight  # noqa: F401
from nvgemm.nn.linear import NVFP4Linear  # noqa: F401
from nvgemm.nn.experts import NVFP4Experts  # noqa: F401  (registers torch.ops.nvgemm.nvfp4_moe)
from nvgemm.integrations.requant_pass import make_fused_requant_pass as _make_pass, pass_uuid as _pass_uuid

def load_modelopt_checkpoint(*args, **kwargs):
    """See :func:`nvgemm.integrations.modelopt.load_modelopt_checkpoint` (imports transformers lazily)."""
    # lazy: keeps integrations.modelopt out of `import nvgemm`
    from nvgemm.integrations.modelopt import load_modelopt_checkpoint as _load

    return _load(*args, **kwargs)

# Inductor integration (opt-in; nvgemm.integrations.inductor imports torch._inductor only inside enable()).
def enable(*args, **kwargs):
    """Route NVFP4 linears in ``torch.compile`` graphs through nvgemm; see :func:`nvgemm.integrations.inductor.enable`."""
    # lazy: keeps integrations.inductor out of `import nvgemm`
    from nvgemm.integrations.inductor import enable as _enable

    return _enable(*args, **kwargs)

def disable():
    """Undo :func:`enable`; PyTorch's own behaviour is restored."""
    # lazy: keeps integrations.inductor out of `import nvgemm`
    from nvgemm.integrations.inductor import disable as _disable

    return _disable()

def enabled(*args, **kwargs):
    """Context manager: ``with nvgemm.enabled(): ...`` (see :func:`nvgemm.integrations.inductor.enabled`)."""
    # lazy: keeps integrations.inductor out of `import nvgemm`
    from nvgemm.integrations.inductor import enabled as _enabled

    return _enabled(*args, **kwargs)

# The fused requant rewrite as a pass named by qualified name (vLLM's inductor_passes); its source text, which
# vLLM hashes into its compile-cache keys, carries nvgemm's version and a hash of the rewrite's sources.
fused_requant_pass = _make_pass(_pass_uuid(__version__))
