"""``triton_kernels.matmul_details``: the launch heuristic's constraints (``opt_flags``)."""
