"""``triton_kernels.numerics_details``: MX quantization (``mxfp``)."""
