"""PTX parser and numpy interpreter (lanes vectorised per warp, warps as coroutines); see :mod:`.machine`."""

from nvgemm.emulator.ptx.errors import DeadlockError, EmulationError, UnknownOpcodeError
from nvgemm.emulator.ptx.machine import Cta, GlobalMemory, Launch, SharedMemory, Wait, Warp
from nvgemm.emulator.ptx.parser import parse_module
from nvgemm.emulator.ptx.program import Program, compile_entry

__all__ = ["Cta", "DeadlockError", "EmulationError", "GlobalMemory", "Launch", "Program", "SharedMemory",
           "UnknownOpcodeError", "Wait", "Warp", "compile_entry", "parse_module"]
