"""Drop-in packages for code written against other MoE kernel libraries: triton_kernels' three API generations,
``ogsgen.compat.triton_kernels`` (<= 3.5, ``matmul_ogs`` with the ``routing`` module), ``triton_kernels_v36`` (3.6:
``topk`` -> ``SparseMatrix``) and ``triton_kernels_v3`` (upstream main: ``matmul`` with ragged metadata and
``reduce``). docs/compat.md compares them."""
