"""Rotary position embeddings as frameworks apply them: the kernels each implementation
runs on the queries and on the keys."""

from __future__ import annotations

from typing import Literal, get_args

from gpusim.workload.ops import DTYPE_BYTES

# How a framework applies rotary position embeddings (a stack's ``rope`` choice), as the
# kernels it runs on each of the queries and keys, each way: (name, bytes read, bytes
# written) per rotated element, for activations of ``a`` bytes.
#  fused: one kernel each way (Transformer Engine's fused_apply_rotary_pos_emb, or the one
#    TorchInductor generates), reading the tensor and writing the result.
#  complex: Meta's Llama and torchtitan's apply_rotary_emb: x.float() viewed as complex
#    pairs, multiplied by freqs_cis (complex64), viewed back as real and cast back with
#    type_as; backward runs the same three (the casts' gradients are casts, the product's a
#    product by the conjugate). On fp32 activations the casts do nothing.
#  rotate_half: Hugging Face's apply_rotary_pos_emb, q * cos + rotate_half(q) * sin with
#    rotate_half(x) = cat(-x2, x1) over the head's halves, in the activations' type (cos
#    and sin cast to it). Backward: the two products' gradients, the negation's, and each
#    half-slice's (slice_backward: a zeroed full-size tensor, then the half copied in),
#    the three gradients of x summed by autograd (two adds).
#  real_pairs: torchtune's RotaryPositionalEmbeddings, the complex product written on real
#    (even, odd) pairs in fp32: x.float(), four products of half the elements, a sub and
#    an add, torch.stack of the two halves, type_as back. Backward: the cast, the sub's
#    negation, the four products, each of the four selects' zeroed tensor and copy, three
#    adds summing the gradient of x, the cast back.
RopeImplementation = Literal["fused", "complex", "rotate_half", "real_pairs"]
ROPE_IMPLEMENTATIONS: tuple[str, ...] = get_args(RopeImplementation)


def rope_kernels(impl: str, a: float, backward: bool) -> list[tuple[str, float, float]]:
    """The kernels ``impl`` runs on one rotated tensor (ROPE_IMPLEMENTATIONS)."""
    f = float(DTYPE_BYTES["fp32"])
    if impl == "fused":
        return [("rope_bwd" if backward else "rope", a, a)]
    if impl == "complex":
        suffix = "_bwd" if backward else ""
        mul = [(f"rope_complex_mul{suffix}", f, f)]
        if a >= f:
            return mul
        return [(f"rope_upcast{suffix}", a, f), *mul, (f"rope_cast_back{suffix}", f, a)]
    if impl == "rotate_half":
        if not backward:
            return [("rope_mul_cos", a, a), ("rope_neg", a / 2, a / 2), ("rope_cat", a, a),
                    ("rope_mul_sin", a, a), ("rope_add", 2 * a, a)]
        return [("rope_mul_cos_bwd", a, a), ("rope_mul_sin_bwd", a, a),
                ("rope_neg_bwd", a / 2, a / 2),
                *[(name, reads, writes) for _ in range(2)
                  for name, reads, writes in (("rope_slice_zeros", 0.0, a),
                                              ("rope_slice_copy", a / 2, a / 2))],
                ("rope_grad_add", 2 * a, a), ("rope_grad_add", 2 * a, a)]
    if impl == "real_pairs":
        casts = a < f
        if not backward:
            return [*([("rope_upcast", a, f)] if casts else []),
                    *[("rope_pair_mul", f / 2, f / 2)] * 4, ("rope_pair_sub", f, f / 2),
                    ("rope_pair_add", f, f / 2), ("rope_stack", f, f),
                    *([("rope_cast_back", f, a)] if casts else [])]
        return [*([("rope_upcast_bwd", a, f)] if casts else []),
                ("rope_pair_neg_bwd", f / 2, f / 2),
                *[("rope_pair_mul_bwd", f / 2, f / 2)] * 4,
                *[(name, reads, writes) for _ in range(4)
                  for name, reads, writes in (("rope_select_zeros", 0.0, f),
                                              ("rope_select_copy", f / 2, f / 2))],
                *[("rope_grad_add", 2 * f, f)] * 3,
                *([("rope_cast_back_bwd", f, a)] if casts else [])]
    raise ValueError(f"unknown rotary embedding implementation {impl!r}; "
                     f"known: {', '.join(ROPE_IMPLEMENTATIONS)}")
