"""Transformer-XL's adaptive input and projected adaptive softmax (Grave et al. 2017,
"Efficient softmax approximation for GPUs"; Baevski & Auli 2019, adaptive input), as
NVIDIA DeepLearningExamples writes them (commit 729963dd4,
PyTorch/LanguageModeling/Transformer-XL/pytorch: ``mem_transformer.py`` AdaptiveEmbedding,
``utils/proj_adaptive_softmax.py`` ProjectedAdaptiveLogSoftmax).

The vocabulary is sorted by frequency (``utils/vocabulary.py`` build_vocab adds
``counter.most_common``) and cut at ``cutoffs`` into a head cluster and tail clusters. The
softmax runs a head over every token: the head cluster's words plus one logit per tail
cluster. Each tail cluster's projection, logits and log-softmax run over only the tokens
whose target falls in it, picked by a mask and ``nonzero()``. How many tokens fall in each
cluster depends on the text; ``zipf_fractions`` says what this model assumes.

With ``div_val`` 1 the softmax's weights are slices of the embedding table (tied):
``weight[l:r]`` in forward, so each slice's gradient is a zero-filled table with the slice
copied in (SliceBackward), and autograd adds those tables into the embedding's gradient.
With ``div_val`` > 1 each cluster has its own smaller table (``d_embed // div_val**i``
wide) and a projection to ``d_model``, tied between input and output except the head's
output projection (``tie_projs`` [False, True, True, True], train.py).

Gradients of weights are costed in the activation type (16-bit under apex's O2, which
DeepLearningExamples' --fp16 uses; fp32 under TF32), and the cast autocast would make of
each weight slice is not costed.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from gpusim.workload.layers import Layer
from gpusim.workload.numerics import Numerics
from gpusim.workload.ops import DTYPE_BYTES, GemmShape, Op, gemm_op, memory_op

EULER_GAMMA = 0.5772156649015329
ID_BYTES = DTYPE_BYTES["int64"]


def _harmonic(n: int) -> float:
    """H(n) = 1 + 1/2 + ... + 1/n (its asymptotic series, exact to 1e-9 beyond n = 10)."""
    if n <= 10:
        return sum(1.0 / r for r in range(1, n + 1))
    return math.log(n) + EULER_GAMMA + 1 / (2 * n) - 1 / (12 * n * n)


def zipf_fractions(vocab: int, cutoffs: tuple[int, ...]) -> tuple[float, ...]:
    """The share of tokens whose target falls in each cluster, if word frequencies follow
    Zipf's law with exponent 1 (the word of rank r has frequency proportional to 1/r), the
    law Grave et al. 2017 (section 3) build the adaptive softmax on: cluster (a, b] of the
    ranks holds (H(b) - H(a)) / H(vocab).

    An assumption, not a measurement of WikiText-103: with its 267,735 words and the wt103
    cutoffs this gives the head 80.2% of the tokens and the three tails 5.3%, 12.3% and
    2.2%. Real text is more concentrated than that: Grave et al. report 87% of Penn
    Treebank covered by the 20% most frequent words, where this law gives 83.6% (2,000 of
    10,000), so the tails, and the softmax's cost, are more likely over- than under-stated.
    """
    ends = (0, *cutoffs, vocab)
    total = _harmonic(vocab)
    return tuple((_harmonic(b) - (_harmonic(a) if a else 0.0)) / total
                 for a, b in itertools.pairwise(ends))


@dataclass(frozen=True)
class _Clusters(Layer):
    """What the adaptive embedding and softmax share: the clusters' sizes and widths, and
    how many of a batch's tokens fall in each."""

    vocab: int
    d_embed: int
    d_proj: int
    cutoffs: tuple[int, ...]
    div_val: int
    rows: int  # tokens per sample (tgt_len)
    fractions: tuple[float, ...]

    @property
    def sizes(self) -> list[int]:
        ends = (0, *self.cutoffs, self.vocab)
        return [b - a for a, b in itertools.pairwise(ends)]

    @property
    def dims(self) -> list[int]:
        """Each cluster's table width (all ``d_embed`` when ``div_val`` is 1)."""
        return [self.d_embed // self.div_val**i for i in range(len(self.sizes))]

    @property
    def projects(self) -> bool:
        """Whether cluster outputs are projected to ``d_proj`` (tables narrower than it)."""
        return self.div_val > 1 or self.d_proj != self.d_embed

    def tokens(self, n: int) -> list[int]:
        """Tokens of a batch of ``n`` samples falling in each cluster (at least one)."""
        return [max(1, round(f * n * self.rows)) for f in self.fractions]

    def _select(self, i: int, n: int, t: int) -> list[Op]:
        """A cluster's tokens found: the range mask over the ids, nonzero (which waits for
        the device), the picked ids."""
        ids = float(n * self.rows)
        return [memory_op(f"{self.name}.c{i}.mask", ids, ids, ID_BYTES, 3.0),
                memory_op(f"{self.name}.c{i}.nonzero", ids, t, ID_BYTES, 0.0),
                memory_op(f"{self.name}.c{i}.ids", t, t, ID_BYTES, 1.0)]

    def _gemm(self, name: str, shape: GemmShape, num: Numerics) -> Op:
        return gemm_op(f"{self.name}.{name}", shape, num.matmul, num.act_bytes)

    def _copy(self, name: str, read: float, written: float, num: Numerics,
              flops: float = 0.0, allocates: bool = True) -> Op:
        return memory_op(f"{self.name}.{name}", read, written, num.act_bytes, flops,
                         allocates=allocates)


@dataclass(frozen=True)
class AdaptiveEmbedding(_Clusters):
    """AdaptiveEmbedding with ``div_val`` > 1 (or a table narrower than the model): one
    table and one projection per cluster; each cluster's ids are looked up, projected and
    copied into a zero-filled (tokens x d_proj) output."""

    @property
    def params(self) -> int:
        return sum(self.tensor_sizes())

    def tensor_sizes(self) -> list[int]:
        tables = [s * d for s, d in zip(self.sizes, self.dims, strict=False)]
        if self.div_val == 1:  # one table, one projection
            return [self.vocab * self.d_embed, self.d_proj * self.d_embed]
        return [*tables, *(self.d_proj * d for d in self.dims)]

    @property
    def out_elements(self) -> int:
        return self.rows * self.d_proj

    def forward(self, n: int, num: Numerics) -> list[Op]:
        tokens = n * self.rows
        if self.div_val == 1:
            e = float(tokens * self.d_embed)
            return self._tag([self._copy("gather", e, e, num),
                              self._gemm("proj", GemmShape(tokens, self.d_proj, self.d_embed),
                                         num)])
        ops = [self._copy("zeros", 0, tokens * self.d_proj, num)]
        for i, (t, d) in enumerate(zip(self.tokens(n), self.dims, strict=False)):
            ops += [*self._select(i, n, t), self._copy(f"c{i}.gather", t * d, t * d, num),
                    self._gemm(f"c{i}.proj", GemmShape(t, self.d_proj, d), num),
                    self._copy(f"c{i}.index_copy", t * self.d_proj, t * self.d_proj, num,
                               allocates=False)]
        return self._tag(ops)

    def backward_input(self, n: int, num: Numerics) -> list[Op]:
        return []  # ids have no gradient

    def backward_weight(self, n: int, num: Numerics) -> list[Op]:
        """Per cluster: its rows of the output gradient picked, the projection's two
        gradients, the table's gradient (zero-filled, then the rows added in)."""
        if self.div_val == 1:
            groups = [(n * self.rows, self.vocab, self.d_embed)]
        else:
            groups = list(zip(self.tokens(n), self.sizes, self.dims, strict=False))
        ops: list[Op] = []
        for i, (t, s, d) in enumerate(groups):
            ops += [self._copy(f"c{i}.pick_grad", t * self.d_proj, t * self.d_proj, num),
                    self._gemm(f"c{i}.proj_dgrad", GemmShape(t, d, self.d_proj), num),
                    self._gemm(f"c{i}.proj_wgrad", GemmShape(self.d_proj, d, t), num),
                    self._copy(f"c{i}.table_grad_zero", 0, s * d, num),
                    self._copy(f"c{i}.table_grad_add", 2 * t * d, t * d, num, 1.0)]
        return self._tag(ops)

    def saved_bytes(self, n: int, num: Numerics) -> float:
        """The ids, and each cluster's looked-up rows (its projection's input)."""
        looked = sum(t * d for t, d in zip(self.tokens(n), self.dims, strict=False)) \
            if self.div_val > 1 else n * self.rows * self.d_embed
        return looked * num.act_bytes + n * self.rows * ID_BYTES


@dataclass(frozen=True)
class AdaptiveSoftmax(_Clusters):
    """ProjectedAdaptiveLogSoftmax over ``rows`` tokens a sample (its loss, one value a
    token). Owns the cluster logits' weight and bias, every word's bias and, with
    projections, the head's own output projection; the words' weights are the embedding's
    (tied), and so are the tails' projections."""

    @property
    def clusters(self) -> int:
        return len(self.cutoffs)

    @property
    def head_size(self) -> int:
        """The head's logits: the shortlist and one per tail cluster."""
        return self.cutoffs[0] + self.clusters

    @property
    def params(self) -> int:
        return sum(self.tensor_sizes())

    def tensor_sizes(self) -> list[int]:
        biases = [self.vocab] if self.div_val == 1 else self.sizes
        head_proj = [self.d_proj * self.dims[0]] if self.projects else []
        return [self.clusters * self.d_embed, self.clusters, *biases, *head_proj]

    @property
    def out_elements(self) -> int:
        return 1

    def forward(self, n: int, num: Numerics) -> list[Op]:
        tokens, hs, d0 = n * self.rows, self.head_size, self.dims[0]
        # torch.cat([weight_0, cluster_weight]) (and the biases) every forward
        ops = [self._copy("head_weight_cat", hs * d0, hs * d0, num)]
        if self.projects:  # einsum('bd,de,ev->bv'): hidden @ proj, then @ weight.T
            ops.append(self._gemm("head_proj", GemmShape(tokens, d0, self.d_proj), num))
        ops += [self._gemm("head_logits", GemmShape(tokens, hs, d0,
                                                    row_lengths=(d0, d0), layout="nt"), num),
                self._copy("head_bias", tokens * hs, tokens * hs, num, 1.0),
                self._copy("head_log_softmax", tokens * hs, tokens * hs, num, 5.0)]
        for i, t in enumerate(self.tokens(n)):
            ops += [*self._select(i, n, t),
                    self._copy(f"c{i}.head_logprob_rows", t * hs, t * hs, num)]
            if i == 0:
                ops.append(self._copy("c0.gather", t, t, num))
            else:
                s, d = self.sizes[i], self.dims[i]
                ops.append(self._copy(f"c{i}.hidden_rows", t * self.d_proj, t * self.d_proj,
                                      num))
                if self.projects:
                    ops.append(self._gemm(f"c{i}.proj", GemmShape(t, d, self.d_proj), num))
                ops += [self._gemm(f"c{i}.logits", GemmShape(t, s, d, row_lengths=(d, d),
                                                             layout="nt"), num),
                        self._copy(f"c{i}.bias", t * s, t * s, num, 1.0),
                        self._copy(f"c{i}.log_softmax", t * s, t * s, num, 5.0),
                        self._copy(f"c{i}.gather_add", 2 * t, t, num, 1.0)]
            ops.append(self._copy(f"c{i}.nll_copy", t, t, num))
        return self._tag(ops)

    def backward_input(self, n: int, num: Numerics) -> list[Op]:
        """Each tail's log-softmax and products back to the picked hidden rows, which
        index_select's backward adds into a zero-filled gradient of all the rows; each
        cluster's picked head log-probabilities likewise, those gradients summed, then the
        head's log-softmax and product."""
        tokens, hs, d0, dp = n * self.rows, self.head_size, self.dims[0], self.d_proj
        ops: list[Op] = []
        for i, t in enumerate(self.tokens(n)):
            if i:
                s, d = self.sizes[i], self.dims[i]
                ops += [self._copy(f"c{i}.gather_bwd", t, t * s, num),
                        self._copy(f"c{i}.log_softmax_bwd", 2 * t * s, t * s, num, 2.0),
                        self._gemm(f"c{i}.logits_dgrad", GemmShape(t, d, s), num)]
                if self.projects:
                    ops.append(self._gemm(f"c{i}.proj_dgrad", GemmShape(t, dp, d), num))
                ops += [self._copy(f"c{i}.hidden_grad_zero", 0, tokens * dp, num),
                        self._copy(f"c{i}.hidden_grad_add", 2 * t * dp, t * dp, num, 1.0)]
            # the head log-probabilities this cluster read: a gather's or a column
            # select's backward, then index_select's
            ops += [self._copy(f"c{i}.pick_bwd", t, t * hs, num),
                    self._copy(f"c{i}.logprob_grad_zero", 0, tokens * hs, num),
                    self._copy(f"c{i}.logprob_grad_add", 2 * t * hs, t * hs, num, 1.0)]
        for j in range(self.clusters):
            ops.append(self._copy(f"logprob_grad_sum{j}", 2 * tokens * hs, tokens * hs, num,
                                  1.0))
        ops += [self._copy("head_log_softmax_bwd", 2 * tokens * hs, tokens * hs, num, 2.0),
                self._gemm("head_dgrad", GemmShape(tokens, d0, hs), num)]
        if self.projects:
            ops.append(self._gemm("head_proj_dgrad", GemmShape(tokens, dp, d0), num))
        ops += [self._copy(f"hidden_grad_sum{j}", 2 * tokens * dp, tokens * dp, num, 1.0)
                for j in range(self.clusters)]
        return self._tag(ops)

    def backward_weight(self, n: int, num: Numerics) -> list[Op]:
        """The products' weight gradients and the biases' sums; then the tied tables'
        gradients: with ``div_val`` 1 every cluster's slice becomes a zero-filled gradient
        of the whole table, added into the embedding's; else each cluster's table gradient
        is added into the embedding's."""
        tokens, hs, d0, dp = n * self.rows, self.head_size, self.dims[0], self.d_proj
        ops = [self._gemm("head_wgrad", GemmShape(hs, d0, tokens, row_lengths=(d0, d0),
                                                  layout="tn"), num),
               self._copy("head_bias_grad", tokens * hs, hs, num, 1.0)]
        if self.projects:
            ops.append(self._gemm("head_proj_wgrad", GemmShape(dp, d0, tokens), num))
        for i, t in enumerate(self.tokens(n)):
            if i:
                s, d = self.sizes[i], self.dims[i]
                ops += [self._gemm(f"c{i}.wgrad", GemmShape(s, d, t, row_lengths=(d, d),
                                                            layout="tn"), num),
                        self._copy(f"c{i}.bias_grad", t * s, s, num, 1.0)]
                if self.projects:
                    ops.append(self._gemm(f"c{i}.proj_wgrad", GemmShape(dp, d, t), num))
        for i, (s, d) in enumerate(zip(self.sizes, self.dims, strict=False)):
            if self.div_val == 1:
                table = float(self.vocab * self.d_embed)
                ops += [self._copy(f"c{i}.slice_grad_zero", 0, table, num),
                        self._copy(f"c{i}.slice_grad_copy", s * d, s * d, num),
                        self._copy(f"c{i}.table_grad_sum", 2 * table, table, num, 1.0)]
            else:
                ops.append(self._copy(f"c{i}.table_grad_sum", 2 * s * d, s * d, num, 1.0))
        return self._tag(ops)

    def saved_bytes(self, n: int, num: Numerics) -> float:
        """The hidden rows the head reads (and its projection of them), the concatenated
        head weight, the head log-probabilities; each tail's picked rows, their projection
        and log-probabilities; the ids each cluster picked."""
        tokens, hs, d0 = n * self.rows, self.head_size, self.dims[0]
        kept = tokens * (self.d_proj + (d0 if self.projects else 0) + hs) + hs * d0
        for i, t in enumerate(self.tokens(n)):
            if i:
                kept += t * (self.d_proj + (self.dims[i] if self.projects else 0)
                             + self.sizes[i])
        return kept * num.act_bytes + tokens * (self.clusters + 1) * ID_BYTES

    def transient_bytes(self, n: int, num: Numerics) -> float:
        """The larger of the head's logits with their zero-filled gradients (three
        tokens x head tensors) and, with ``div_val`` 1, a slice's table-sized gradient with
        the sum it is added into."""
        head = 3.0 * n * self.rows * self.head_size
        table = 2.0 * self.vocab * self.d_embed if self.div_val == 1 else 0.0
        return max(head, table) * num.act_bytes


__all__ = ["AdaptiveEmbedding", "AdaptiveSoftmax", "zipf_fractions"]
