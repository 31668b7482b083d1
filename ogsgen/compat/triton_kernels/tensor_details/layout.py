"""``triton_kernels.tensor_details.layout``: the layouts ogsgen reads (``StridedLayout``, ``HopperMXValueLayout``,
``HopperMXScaleLayout``) and the helpers that pick the default mxfp4 ones for the current GPU; the Blackwell and AMD
layouts' names raise UnsupportedError when made."""
from ..._tensor import (BlackwellMXScaleLayout, BlackwellMXValueLayout, CDNA4MXScaleLayout, GFX950MXScaleLayout,
                        HopperMXScaleLayout, HopperMXValueLayout, Layout, StridedLayout,
                        make_default_matmul_mxfp4_w_layout, make_default_matmul_mxfp4_w_scale_layout)

__all__ = ["BlackwellMXScaleLayout", "BlackwellMXValueLayout", "CDNA4MXScaleLayout", "GFX950MXScaleLayout",
           "HopperMXScaleLayout", "HopperMXValueLayout", "Layout", "StridedLayout",
           "make_default_matmul_mxfp4_w_layout", "make_default_matmul_mxfp4_w_scale_layout"]
