"""``triton_kernels.tensor_details`` (upstream main): the layouts (``layout``) and the ragged metadata
(``ragged_tensor``)."""
