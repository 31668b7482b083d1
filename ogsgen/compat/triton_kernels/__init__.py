"""triton_kernels' ``matmul_ogs`` generation, triton_kernels <= 3.5 (the one vLLM vendors as its "3.5.1" API and
gpt-oss's reference uses), served by ogsgen: replace the package prefix ``triton_kernels`` with
``ogsgen.compat.triton_kernels`` in the imports and the calls run on ogsgen's kernels.

    from ogsgen.compat.triton_kernels.matmul_ogs import FlexCtx, FnSpecs, FusedActivation, PrecisionConfig, matmul_ogs
    from ogsgen.compat.triton_kernels.routing import routing, routing_from_bitmatrix
    from ogsgen.compat.triton_kernels.tensor import FP4, convert_layout, wrap_torch_tensor
    from ogsgen.compat.triton_kernels.tensor_details import layout

Mirrored: ``matmul_ogs`` (2-D x returns 2-D y, also when ``y`` is given 3-D with a batch of one; betas and gammas
of any float dtype, read as float32), ``matmul_ogs_torch``, ``PrecisionConfig`` (``weight_scale`` may be a wrapped
Tensor), ``FlexCtx``, ``InFlexData``, ``OutFlexData``, ``FnSpecs`` (name, fn, fn_arg_names,
fn_arg_do_not_specialize; of ``swiglu_fn``: ogsgen's SwiGLU, with its torch reference and backward, so autograd runs
through it), ``FusedActivation`` (specs, fn_args, reduction_n; a reduction_n other than the function's, as
``swiglu_fn`` with the default 1, is refused as triton_kernels refuses it), ``Epilogue``, ``RoutingData``,
``GatherIndx``, ``ScatterIndx``, ``InnerRoutingData`` (ragged K; masked, so padding is optional), ``FusedComm`` and
``post_matmul_comm_torch`` (without a scatter: the sorted rows are sent), ``routing``, ``routing_from_bitmatrix``,
``topk`` (``(vals, indx, bitmatrix)``), ``swiglu_fn``, the process-wide ``update_opt_flags_constraints`` /
``reset_opt_flags_constraints`` and the scoped ``scoped_opt_flags_constraints``.
Tensor wrappers (``tensor``: ``Tensor``, ``Storage``, ``FP4``, ``BIT``, ``Bitmatrix``, ``wrap_torch_tensor``,
``convert_layout``; ``tensor_details.layout``: ``StridedLayout``, ``HopperMXValueLayout``, ``HopperMXScaleLayout``,
``make_default_matmul_mxfp4_w_layout``, ``make_default_matmul_mxfp4_w_scale_layout``) hold ogsgen's storage: the
hopper value layout is ``ogsgen.swizzle_mx_values``' and the hopper scale layout N-contiguous e8m0 scales; the
default helpers pick the hopper layouts on a GPU with wgmma and the strided ones elsewhere. ``numerics_details.mxfp``:
``downcast_to_mxfp`` (ROUND_UP: ogsgen's ``quantize_mx(rounding="up")``) and ``upcast_from_mxfp``.

Raise UnsupportedError (with the alternative): ``simulated_ep`` and ``n_rows`` of ``routing`` and ``topk``,
``set_opt_flags``, the Blackwell and AMD layouts (``BlackwellMXValueLayout``, ``BlackwellMXScaleLayout``,
``CDNA4MXScaleLayout``, ``GFX950MXScaleLayout``), storage swizzled by triton_kernels itself or mxfp4 packed along N,
and ``downcast_to_mxfp``'s ROUND_DOWN.
"""
