"""Numerics: which precision each part of a layer computes and stores in.

A training precision (``fp32``, ``tf32``, ``fp16``, ``bf16``, ``fp8``) sets the math of matrix
products and convolutions and the storage type of activations. The plan resolves it against a
device; the workload only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpusim.workload.ops import DTYPE_BYTES


@dataclass(frozen=True, slots=True)
class Numerics:
    """Precisions of one training job.

    ``matmul`` and ``conv`` are the math precisions of matrix products and convolutions
    (PyTorch's defaults let cuDNN use TF32 for fp32 convolutions but not cuBLAS for matrix
    products, so they may differ); ``activation`` is the storage type of activations and
    activation gradients; master weights, gradients and optimizer states are fp32.
    """

    matmul: str = "fp32"
    conv: str = "fp32"
    activation: str = "fp32"
    # The type attention's softmax keeps its probabilities in ("": the activation type;
    # autocast runs softmax in fp32).
    softmax: str = ""
    # How fp8 linear layers find their scales and make their second layout (workload/fp8.py).
    fp8_recipe: str = "tensorwise"

    @property
    def act_bytes(self) -> int:
        return DTYPE_BYTES[self.activation]

    @property
    def softmax_bytes(self) -> int:
        return DTYPE_BYTES[self.softmax or self.activation]

    @property
    def gemm_operand_bytes(self) -> int:
        """Bytes per element a matrix-product kernel reads (fp8 operands are 1 byte)."""
        return DTYPE_BYTES[self.matmul]


FP32 = Numerics()
