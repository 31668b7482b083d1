"""Mixture-of-experts routing: top-k expert choice, the gather/scatter permutations and the ragged metadata."""
from .gather import gather_rows
from .metadata import (BLOCK_SIZES, RaggedTensorMetadata, expert_histogram, make_ragged_tensor_metadata,
                       make_ragged_tensor_metadata_torch, max_n_tiles)
from .reference import routing_from_topk_torch, routing_torch
from .routing import expert_parallel_routing, routing, routing_from_topk, select_experts
from .weights import PreparedWeights, prepare_expert_weights

__all__ = ["BLOCK_SIZES", "RaggedTensorMetadata", "expert_histogram", "gather_rows", "make_ragged_tensor_metadata",
           "make_ragged_tensor_metadata_torch", "max_n_tiles", "expert_parallel_routing", "routing",
           "routing_from_topk", "select_experts", "routing_from_topk_torch", "routing_torch", "PreparedWeights",
           "prepare_expert_weights"]
