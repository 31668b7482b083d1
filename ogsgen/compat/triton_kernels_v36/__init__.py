"""triton_kernels 3.6 (SGLang's bundled version, vLLM's path when 3.6 is installed), served by ogsgen: replace the
package prefix ``triton_kernels`` with ``ogsgen.compat.triton_kernels_v36`` in the imports.

    from ogsgen.compat.triton_kernels_v36.matmul_ogs import (FnSpecs, FusedActivation, GatherIndx, PrecisionConfig,
                                                             RoutingData, ScatterIndx, matmul_ogs)
    from ogsgen.compat.triton_kernels_v36.topk import topk
    from ogsgen.compat.triton_kernels_v36.tensor import BIT, Bitmatrix, SparseMatrix, make_ragged_tensor_metadata

What changed from 3.5 and is mirrored: there is no ``routing`` module (callers import it to tell the generations
apart); ``RoutingData``, ``GatherIndx``, ``ScatterIndx`` live in ``matmul_ogs``; routing is ``topk`` -> a
``SparseMatrix`` (``indx``, ``vals``, ``mask`` and its ``mask_metadata``: ``col_sum``, the expert histogram;
``col_sorted_indx``, the gate at each sorted position; ``row_sorted_indx``, each gate's sorted position) ->
``make_ragged_tensor_metadata(col_sum, n_gates)`` -> ``RoutingData(gate_scal, hist, n_expts_tot, n_expts_act,
metadata)``, where a non-tensor ``hist`` (``metadata.block_sizes``, as vLLM passes) or the metadata's own
``slice_sizes`` becomes the histogram of the ``n_expts_tot`` experts (a bitmatrix counts whole 32-expert words) and
``gate_scal`` of another float dtype becomes float32; ``FnSpecs(..., reduction_n=2)`` carries the activation's
reduction and ``FusedActivation(specs, fn_args)`` has none. The rest (``matmul_ogs``, ``PrecisionConfig``, the
tensor wrappers and layouts, ``numerics_details.mxfp``, ``swiglu_fn``, the opt flags) is as in
``ogsgen.compat.triton_kernels`` (its docstring). Routing is ogsgen's: ``topk`` chooses with
``ogsgen.moe.select_experts``, ``SparseMatrix`` sorts with ``ogsgen.routing_from_topk``, the metadata is
``ogsgen.moe.make_ragged_tensor_metadata``'s.

Raise UnsupportedError (with the alternative): ``topk``'s ``n_rows``, ``all_gather`` and ``symm_mem_pool``, and
what ``ogsgen.compat.triton_kernels`` refuses. A ``Bitmatrix`` that disagrees with the ids it comes with is refused
where the routing checks read back (the CPU, OGSGEN_DEBUG=1).
"""
