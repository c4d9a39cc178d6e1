"""Formats: the bit-exact NVFP4 reference (pure torch, no kernel choice)."""

from .nvfp4 import *  # noqa: F401,F403
from .nvfp4 import __all__  # noqa: F401
