"""sm_90a grouped MoE kernels: the W4A16 mma.sync decode family over stacked experts and a work list."""
