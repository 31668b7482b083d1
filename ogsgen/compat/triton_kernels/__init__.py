"""triton_kernels' ``matmul_ogs`` generation (the one vLLM vendors as its "3.5.1" API and gpt-oss's reference uses),
served by ogsgen: replace the package prefix ``triton_kernels`` with ``ogsgen.compat.triton_kernels`` in the imports
and the calls run on ogsgen's kernels.

    from ogsgen.compat.triton_kernels.matmul_ogs import FlexCtx, FnSpecs, FusedActivation, PrecisionConfig, matmul_ogs
    from ogsgen.compat.triton_kernels.routing import routing
    from ogsgen.compat.triton_kernels.swiglu import swiglu_fn
    from ogsgen.compat.triton_kernels.matmul_ogs_details import opt_flags

Mirrored: ``matmul_ogs`` (2-D x returns 2-D y, also when ``y`` is given 3-D with a batch of one),
``matmul_ogs_torch``, ``PrecisionConfig``, ``FlexCtx``, ``InFlexData``, ``OutFlexData``, ``FnSpecs`` (name, fn,
fn_arg_names, fn_arg_do_not_specialize; of ``swiglu_fn``: ogsgen's SwiGLU, with its torch reference and backward,
so autograd runs through it), ``FusedActivation`` (specs, fn_args, reduction_n; a reduction_n other than the
function's, as ``swiglu_fn`` with the default 1, is refused as triton_kernels refuses it), ``Epilogue``,
``RoutingData``, ``GatherIndx``, ``ScatterIndx``, ``InnerRoutingData`` (ragged K; masked, so padding is optional),
``FusedComm`` and ``post_matmul_comm_torch`` (without a scatter: the sorted rows are sent),
``routing``, ``swiglu_fn`` and the process-wide
``update_opt_flags_constraints`` / ``reset_opt_flags_constraints``. Not mirrored: triton_kernels' tensor wrappers and
layouts (``wrap_torch_tensor``, ``convert_layout``): pass torch tensors, or weights prepared by
``ogsgen.prepare_expert_weights``; ``simulated_ep`` and ``n_rows`` of ``routing`` and ``set_opt_flags``, which
raise ``UnsupportedError``.
"""
