"""``triton_kernels.tensor_details`` (3.6): the layouts (``layout``) and the ragged metadata (``ragged_tensor``)."""
