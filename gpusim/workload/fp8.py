"""FP8 training as frameworks run it: only linear layers' three matrix products (forward,
input gradient, weight gradient) run in fp8; attention, norms, the loss and the output head
stay in bf16. Each quantized tensor pays its scale and cast, and the layout its second
product needs, as memory-bound kernels of their own.

Every linear layer quantizes three tensors, each read in two layouts: its input x (forward,
and transposed for the weight gradient), its weight W (forward, and transposed for the input
gradient) and the output gradient dy (input gradient, and transposed for the weight
gradient). The recipes differ in how the scales are found and how the second layout is made
(torchao's float8 recipes; Transformer Engine's delayed scaling):

- tensorwise: one scale per tensor from a full-tensor abs-max reduction (one read of the
  bf16 tensor), then a cast that writes both layouts (one read, two fp8 writes).
- rowwise: a scale per row for one layout and per column for the other, each found as its
  cast runs: a cast per layout (one read, one fp8 write each).
- delayed: the scale from earlier steps' abs-max history, the abs-max of this step taken as
  the cast runs: one read, two fp8 writes, no separate reduction.
- mxfp8: a scale per 32 elements found as the cast runs, a cast per layout (one read, one
  fp8 write and a byte of scale per 32 elements each).
- blockwise (DeepSeek-V3's, Transformer Engine's Float8BlockScaling on Hopper): an fp32
  scale per 128 elements (1x128 for activations and gradients, 128x128 for weights) found
  as the cast runs, both layouts from one kernel (TE v2.18 common/transpose/
  quantize_transpose_vector_blockwise.cu, block_scaled_1d_cast_transpose_kernel: one read,
  two fp8 writes and their scales). Its products run at the fp8 rate: DeepGEMM's published
  1x128/128x128 block-scaled GEMMs on H800 (README @37aa127~1) land within 5% on average of
  the per-tensor rate this calibration gives at M 4096.
"""

from __future__ import annotations

from gpusim.workload.numerics import Numerics
from gpusim.workload.ops import Op, memory_op

FP8_RECIPES = ("tensorwise", "rowwise", "delayed", "mxfp8", "blockwise")
# fp32 scale bytes per element under block scaling (one per 128 elements)
BLOCK_SCALE_BYTES = 4 / 128


def quantize_ops(name: str, elements: float, num: Numerics) -> list[Op]:
    """The kernels that turn one 16-bit tensor of ``elements`` into fp8 in both layouts
    (fp8 elements are one byte: written as ``mask_written`` bytes)."""
    b = num.act_bytes
    recipe = num.fp8_recipe
    if recipe == "tensorwise":
        return [memory_op(f"{name}.amax", elements, 0, b),
                memory_op(f"{name}.to_fp8", elements, 0, b, mask_written=2 * elements)]
    if recipe == "delayed":
        return [memory_op(f"{name}.to_fp8", elements, 0, b, mask_written=2 * elements)]
    if recipe == "blockwise":
        return [memory_op(f"{name}.to_fp8", elements, 0, b,
                          mask_written=2 * elements * (1 + BLOCK_SCALE_BYTES))]
    if recipe in ("rowwise", "mxfp8"):
        scales = elements / 32 if recipe == "mxfp8" else 0.0
        return [memory_op(f"{name}.to_fp8_{layout}", elements, 0, b,
                          mask_written=elements + scales)
                for layout in ("rows", "cols")]
    raise ValueError(f"unknown fp8 recipe {recipe!r}")
