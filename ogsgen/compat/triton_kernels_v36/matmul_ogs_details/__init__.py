"""``triton_kernels.matmul_ogs_details``: the launch heuristic's constraints (``opt_flags``)."""
