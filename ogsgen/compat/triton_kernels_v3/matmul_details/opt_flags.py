"""``triton_kernels.matmul_details.opt_flags``: as ``ogsgen.compat.triton_kernels``'s (the constraints are
process-wide, shared by the packages of every generation), ``scoped_opt_flags_constraints`` included."""
from ...triton_kernels.matmul_ogs_details.opt_flags import *  # noqa: F403
from ...triton_kernels.matmul_ogs_details.opt_flags import __all__  # noqa: F401
