"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from gpusim.workload.ops import GemmShape, Op, gemm_op, memory_op

dims = st.integers(min_value=1, max_value=16384)
precisions = st.sampled_from(["fp32", "tf32", "fp16", "bf16"])


@st.composite
def gemm_ops(draw: st.DrawFn) -> Op:
    shape = GemmShape(draw(dims), draw(dims), draw(dims), draw(st.integers(1, 64)))
    return gemm_op("g", shape, draw(precisions), 2)


@st.composite
def memory_ops(draw: st.DrawFn) -> Op:
    elements = draw(st.floats(min_value=1, max_value=1e10))
    return memory_op("m", elements, elements, 2)


any_op = st.one_of(gemm_ops(), memory_ops())
