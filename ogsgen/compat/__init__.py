"""Drop-in modules for code written against other MoE kernel libraries (``ogsgen.compat.triton_kernels``)."""
