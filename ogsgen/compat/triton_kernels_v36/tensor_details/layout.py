"""``triton_kernels.tensor_details.layout``: as ``ogsgen.compat.triton_kernels.tensor_details.layout``."""
from ...triton_kernels.tensor_details.layout import *  # noqa: F403
from ...triton_kernels.tensor_details.layout import __all__  # noqa: F401
