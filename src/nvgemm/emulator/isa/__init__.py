"""Pure PTX ISA semantics as numpy functions: smem descriptors and swizzles, wgmma, mbarrier, tcgen05."""
