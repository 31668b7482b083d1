"""``triton_kernels.tensor_details``: the layouts (``layout``)."""
