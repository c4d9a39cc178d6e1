"""sm_100a grouped MoE kernels: the swap-AB tcgen05 W4A4 decode kernel over stacked experts and a work list."""
