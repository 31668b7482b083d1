"""``triton_kernels.matmul_ogs_details.opt_flags``: as ``ogsgen.compat.triton_kernels``'s (the constraints are
process-wide, shared by the packages of every generation)."""
from ...triton_kernels.matmul_ogs_details.opt_flags import *  # noqa: F403
from ...triton_kernels.matmul_ogs_details.opt_flags import __all__  # noqa: F401
