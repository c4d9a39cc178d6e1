"""PTX functional emulator: runs the kernels' PTX on the CPU (see issue 21)."""
