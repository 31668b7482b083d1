"""triton_kernels' ``matmul`` generation (upstream main since 2026-01-10; OpenAI's bench_mlp, AMD's ATOM,
tokenspeed), served by ogsgen: replace the package prefix ``triton_kernels`` with ``ogsgen.compat.triton_kernels_v3``
in the imports.

    from ogsgen.compat.triton_kernels_v3.matmul import FnSpecs, FusedActivation, PrecisionConfig, matmul
    from ogsgen.compat.triton_kernels_v3.reduce import reduce
    from ogsgen.compat.triton_kernels_v3.topk import topk
    from ogsgen.compat.triton_kernels_v3.tensor import make_ragged_tensor_metadata

Mirrored: ``matmul(a, b, bias, a_ragged_metadata, b_ragged_metadata, gather_indx, scatter_indx, precision_config,
betas, gammas, out_alpha, c, fused_comm, fused_activation, epilogue, c_acc_in)`` with plain index tensors
(``gather_indx[p]``: a's row for row p; ``scatter_indx[p]``: p's output row) and ``RaggedTensorMetadata``; its
results are this generation's: with a scatter, one output row per scattered row, which ``reduce(y.view(-1, k, N),
dim=1)`` sums. ``matmul(..., n_expts_act=k)``, an ogsgen extension, sums the k rows of each token in the
matmul instead (ogsgen's fused top-k combine, the fast path) and makes the ``reduce`` unnecessary. A gather that
names each of a's rows at most k = len(gather_indx) / len(a) times is read in place by the kernel; another is
copied first (``ogsgen.moe.gather_rows``). Ragged K (``b_ragged_metadata``, per-expert weight gradients) takes one
metadata for a and b. ``PrecisionConfig(a_mx_scale, b_mx_scale, c_mx_scale, ...)``: ogsgen's act_scale,
weight_scale, out_scale; wrapped Tensors read as ogsgen's storage. ``reduce`` (sum over a dimension with mask and
scale, in float32), ``topk`` (a ``SparseMatrix``), ``FnSpecs(..., reduction_n)``, ``FusedActivation(specs,
fn_args)``, ``Epilogue``, ``FlexCtx``, the tensor wrappers and layouts (``convert_layout`` takes a layout class with
its options or a layout; the default helpers return a layout that also unpacks as ``(layout, {})``),
``numerics_details.mxfp``, ``swiglu_fn`` and the opt flags, as in ``ogsgen.compat.triton_kernels_v36``.

Raise UnsupportedError (with the alternative): ``FusedComm``'s destination closures (pass an ``ogsgen.FusedComm``),
``remap_ragged_tensor_metadata`` and ``topk``'s ``all_gather`` / ``symm_mem_pool`` (expert parallelism:
``ogsgen.expert_parallel_routing``), gather or scatter without ``a_ragged_metadata``, two different metadata for
ragged K, NVFP4 microblocks (16), packed outputs (``c_value_pack_factor``), ``reduce``'s microscaled, flexpoint
and post-processed forms. Not
mirrored: ``triton_kernels.distributed``, ``matmul_torch`` (use ``ogsgen.matmul_ogs_torch``).
"""
