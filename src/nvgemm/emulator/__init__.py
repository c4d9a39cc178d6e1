"""PTX functional emulator: nvgemm's real AOT kernels run on the CPU (fake CUDA runtime + numpy PTX interpreter)."""
