"""PTX parser and numpy interpreter (lanes vectorised per warp, warps as coroutines); see :mod:`.machine`."""

from .errors import DeadlockError, EmulationError, UnknownOpcodeError
from .machine import Cta, GlobalMemory, Launch, SharedMemory, Wait, Warp
from .parser import parse_module
from .program import Program, compile_entry

__all__ = ["Cta", "DeadlockError", "EmulationError", "GlobalMemory", "Launch", "Program", "SharedMemory",
           "UnknownOpcodeError", "Wait", "Warp", "compile_entry", "parse_module"]
