"""Facts the generated kernels and the runtime's launch arguments must agree on: the renderer writes them into
the kernels, the runtime builds arguments with them."""

# The ragged TMA descriptors' row bound (ogsgen.runtime.descriptors explains the address arithmetic): the kernels
# compute coordinates relative to it.
RAGGED_ROWS_BOUND = 1 << 30
