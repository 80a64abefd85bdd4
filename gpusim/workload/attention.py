"""Token layers: attention (plain or fused), embeddings and the language-model loss."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpusim.workload.layers import Elementwise, Layer, rms_norm
from gpusim.workload.numerics import Numerics
from gpusim.workload.ops import (
    DTYPE_BYTES,
    AttentionShape,
    GemmShape,
    Op,
    gemm_op,
    memory_op,
)
from gpusim.workload.rotary import RopeImplementation, rope_kernels

# The kernel family of unfused attention's score-sized kernels: the batched products that
# write or read the seq x seq scores and the softmax over them (forward and backward). They
# stream below a plain copy's rate (calibrated from published timings of the unfused chain;
# see gpusim.calibrate.groups); the elementwise passes over the scores (scale, mask, dropout)
# do not, and keep the plain rate.
UNFUSED_ATTENTION = "unfused_attention"

def fused_math(num: Numerics) -> str:
    """The math of a fused attention kernel: the training's 16-bit type, or on fp32 inputs
    fp32 whether TF32 is allowed or not. FlashAttention and cuDNN take 16-bit inputs only,
    so SDPA runs fp32 attention in its memory-efficient kernel, whose fp32 products are
    its own (PyTorch's mem_eff_attention picks them by input type, not by the TF32 flag)."""
    return "fp32" if num.activation == "fp32" else num.matmul


@dataclass(frozen=True)
class Attention(Layer):
    """Scaled dot-product attention after the Q, K, V projections.

    ``fused`` is a FlashAttention-style kernel: scores never reach memory, the backward pass
    recomputes them (5 matrix products against forward's 2). Unfused attention writes the
    ``seq x seq`` scores, runs softmax (and dropout) over them and keeps them for backward.
    ``causal`` halves the work of a fused kernel, which skips masked tiles.
    """

    heads: int
    head_dim: int
    seq: int
    kv_heads: int = 0
    causal: bool = False
    fused: bool = True
    dropout: bool = False
    # Grouped-query K and V copied out to every query head before the kernel (a stack's
    # repeat_kv), rather than read in groups by it.
    expand_kv: bool = False
    # The fused kernel by name (flash2, cudnn, efficient, flash3); empty: the one SDPA picks
    # on the device, which the calibration's default attention efficiency describes.
    kernel: str = ""
    # Keys and values per sample when they span more than this rank's ``seq`` queries:
    # context parallelism gives each rank a slice of the sequence and gathers K and V from
    # the others (0: the same as ``seq``).
    kv_seq: int = 0
    # Sliding-window attention: each query attends to the last ``window`` keys only (0: all)
    window: int = 0
    # Whether merging the heads for the output projection copies: the kernel writes its
    # output as (batch, heads, seq, dim), as unfused attention and PyTorch SDPA's cuDNN
    # backend do (copies of their own in the profiled H100 steps). FlashAttention, the
    # memory-efficient kernel and Transformer Engine write (batch, seq, heads, dim), so the
    # merge is a view and the projection keeps the kernel's own output.
    merge_copy: bool = True
    # Context parallelism's ring steps: the kernel runs once per step on one block of keys
    # (PyTorch's context_parallel, torch/distributed/tensor/experimental/_attention.py,
    # _templated_ring_attention), so the whole work is the same, but the blocks' outputs are
    # merged in fp32 and the gradients accumulated in fp32 (_SDPAMerger, convert_to_f32;
    # _templated_ring_attention_backward). 1: no context parallelism.
    cp_steps: int = 1
    # Unfused attention written by hand (Hugging Face's and DeepLearningExamples' BERT): the
    # scores divided by sqrt(head_dim) and the attention mask added, each its own pass over
    # the seq x seq scores before the softmax; the division's gradient is a pass in backward
    # (the addition's is the incoming gradient itself). False: PyTorch's math SDPA, which
    # scales Q and K instead, with no mask.
    scale_and_mask: bool = False
    # Rotary position embeddings on the queries and keys before the kernel: the dimensions
    # of each head they rotate (0: none), how the framework applies them (``rope``, one of
    # ROPE_IMPLEMENTATIONS), and whether the keys' rotary part is one head that every head
    # shares (DeepSeek's multi-head latent attention, whose k_pe is a single head).
    rotary_dim: int = 0
    rope: RopeImplementation = "rotate_half"
    rotary_shared_key: bool = False
    # Queries and keys RMS-normalized per head over head_dim before the rotary embedding
    # (Qwen3's q_norm and k_norm), written as the stack writes its RMS norms
    # (``qk_norm_upcast``: Elementwise.upcast, "" for a fused kernel).
    qk_norm: bool = False
    qk_norm_upcast: str = ""

    @property
    def params(self) -> int:
        return 2 * self.head_dim if self.qk_norm else 0

    def tensor_sizes(self) -> list[int]:
        return [self.head_dim, self.head_dim] if self.qk_norm else []

    def _qk_norms(self) -> list[Elementwise]:
        """The per-head norms of the queries and of the keys (none without QK-norm)."""
        if not self.qk_norm:
            return []
        return [replace(rms_norm(f"{self.name}.{which}_norm", self.head_dim,
                                 self.seq * heads), upcast=self.qk_norm_upcast)
                for which, heads in (("q", self.heads), ("k", self._groups))]

    def _rope(self, n: int, num: Numerics, backward: bool) -> list[Op]:
        """The rotary embedding's kernels on the queries, then the keys (as projected,
        before any repeat to every head)."""
        if not self.rotary_dim:
            return []
        keys = 1 if self.rotary_shared_key else self._groups
        ops = []
        for which, heads in (("q", self.heads), ("k", keys)):
            e = n * self.seq * heads * self.rotary_dim
            ops += [memory_op(f"{self.name}.{which}_{name}", e * reads, e * writes, 1, 0,
                              layer=self.name)
                    for name, reads, writes in rope_kernels(self.rope, num.act_bytes,
                                                            backward)]
        return ops

    @property
    def _kv(self) -> int:
        return self.heads if self.expand_kv else self.kv_heads or self.heads

    @property
    def _groups(self) -> int:
        """Key/value heads as the layer's projection makes them."""
        return self.kv_heads or self.heads

    @property
    def keys(self) -> int:
        """Keys (and values) each query attends over, per sample."""
        return self.kv_seq or self.seq

    @property
    def out_elements(self) -> int:
        return self.seq * self.heads * self.head_dim

    def _qkvo_elements(self, n: int) -> float:
        """Q and O at full heads, K and V at ``kv_heads`` (grouped-query attention)."""
        return n * self.head_dim * (2 * self.heads * self.seq + 2 * self._kv * self.keys)

    def _shape(self, n: int) -> AttentionShape:
        return AttentionShape(n * self.heads, self.seq, self.keys, self.causal,
                              self._window, self.head_dim)

    @property
    def _window(self) -> int:
        """The window where it is shorter than the keys (0: every key counts)."""
        return self.window if 0 < self.window < self.keys else 0

    def _fused_flops(self, n: int) -> float:
        # Causal context parallelism deals each rank matching chunks from both ends of the
        # sequence (torchtitan's load balancing), so half its score tiles are masked too.
        per_pair = 4.0 * n * self.heads * self.head_dim
        w = self._window
        if w:  # query i attends to min(i, w) keys: s w - w (w - 1) / 2 pairs in all
            return per_pair * self.seq / self.keys * (self.keys * w - w * (w - 1) / 2)
        flops = per_pair * self.seq * self.keys
        return flops / 2 if self.causal else flops

    def _score_gemms(self, n: int, names: tuple[str, ...], num: Numerics) -> list[Op]:
        s, d, b = self.seq, self.head_dim, n * self.heads
        shapes = {"qk": GemmShape(s, s, d, b), "av": GemmShape(s, d, s, b),
                  "dv": GemmShape(s, d, s, b), "dp": GemmShape(s, s, d, b),
                  "dq": GemmShape(s, d, s, b), "dk": GemmShape(s, d, s, b)}
        return [replace(gemm_op(f"{self.name}.{key}", shapes[key], num.matmul, num.act_bytes,
                                layer=self.name), family=UNFUSED_ATTENTION)
                for key in names]

    def _layout(self, name: str, elements: float, num: Numerics) -> Op:
        """A copy between the projections' (batch, seq, heads x dim) layout and the
        kernels' (batch, heads, seq, dim): the heads' output merged back in forward, its
        gradient split in backward."""
        return memory_op(f"{self.name}.{name}", elements, elements, num.act_bytes, 0,
                         layer=self.name)

    def _qkv_grad_pack(self, n: int, num: Numerics) -> Op:
        """dq, dk and dv concatenated into the packed QKV projection's gradient (the
        backward of splitting one projection's output into heads)."""
        e = n * self.seq * self.head_dim * (self.heads + 2 * self._groups)
        return memory_op(f"{self.name}.dqkv_pack", e, e, num.act_bytes, 0, layer=self.name)

    def _repeat_kv(self, n: int, num: Numerics, backward: bool) -> list[Op]:
        """K and V copied out to every head (forward), and the copies' gradients summed
        back over each group (backward)."""
        if not self.expand_kv or self._groups == self.heads:
            return []
        grouped = 2 * n * self.seq * self.head_dim * self._groups
        full = 2 * n * self.seq * self.head_dim * self.heads
        if backward:
            return [memory_op(f"{self.name}.repeat_kv_grad", full, grouped, num.act_bytes, 1,
                              layer=self.name)]
        return [memory_op(f"{self.name}.repeat_kv", grouped, full, num.act_bytes, 0,
                          layer=self.name)]

    def _merges(self, num: Numerics) -> bool:
        """Whether merging the heads copies (``merge_copy``); on fp32 inputs a fused kernel
        is SDPA's memory-efficient one, which writes (batch, seq, heads, dim): a view."""
        return self.merge_copy and not (self.fused and fused_math(num) == "fp32")

    def forward(self, n: int, num: Numerics) -> list[Op]:
        out = n * self.out_elements
        ops = [op for norm in self._qk_norms() for op in norm.forward(n, num)]
        ops += self._rope(n, num, backward=False)
        ops += self._repeat_kv(n, num, backward=False)
        if self.fused:
            ops += [Op(f"{self.name}.flash_fwd", "attention", self._fused_flops(n),
                      self._qkvo_elements(n) * num.act_bytes, fused_math(num),
                      alloc_bytes=out * num.act_bytes, kernel=self.kernel,
                      attention=self._shape(n), layer=self.name)]
        else:
            scores = n * self.heads * self.seq**2
            ops += self._score_gemms(n, ("qk",), num)
            if self.scale_and_mask:
                ops += [memory_op(f"{self.name}.{name}", scores, scores, num.act_bytes, 1,
                                  layer=self.name)
                        for name in ("scale", "mask_add")]
            ops.append(memory_op(f"{self.name}.softmax", scores, scores, num.act_bytes, 5,
                                 layer=self.name, family=UNFUSED_ATTENTION))
            if self.dropout:
                ops.append(memory_op(f"{self.name}.dropout", scores, scores, num.act_bytes,
                                     mask_written=scores, layer=self.name))
            ops += self._score_gemms(n, ("av",), num)
        if self.fused and self.cp_steps > 1:
            ops += self._ring_forward(n, num)
        if self._merges(num):
            ops.append(self._layout("merge_heads", out, num))
        return self._tag(ops)

    def _ring_sizes(self, n: int) -> tuple[float, float]:
        """Elements of this rank's output (its queries) and of its K and V together."""
        return (n * self.heads * self.seq * self.head_dim,
                2.0 * n * self._kv * self.seq * self.head_dim)

    def _ring_forward(self, n: int, num: Numerics) -> list[Op]:
        """The ring's forward beyond its kernels, as bytes: every step but the last packs K
        and V into one buffer to pass on (torch.cat); every block's output and log-sum-exp
        are converted to fp32, and each after the first merged into the running output
        (out - sigmoid(lse_block - lse) * (out - out_block): five fp32 reads and three
        writes an element); the result is cast back to the compute type."""
        c, act, f32 = self.cp_steps, num.act_bytes, DTYPE_BYTES["fp32"]
        q, kv = self._ring_sizes(n)
        pack = (c - 1) * kv * act
        merge_read = c * q * act + (c - 1) * q * 5 * f32 + q * f32
        merge_written = c * q * f32 + (c - 1) * q * 3 * f32 + q * act
        return [memory_op(f"{self.name}.ring_kv_pack", pack, pack, 1, 0, layer=self.name),
                memory_op(f"{self.name}.ring_merge", merge_read, merge_written, 1, 0,
                          layer=self.name)]

    def _ring_backward(self, n: int, num: Numerics) -> list[Op]:
        """The ring's backward beyond its kernels, as bytes: fp32 gradient buffers zeroed;
        each step adds its block's dq into the fp32 dq, and its dk and dv into the fp32
        buffer that arrived from the previous rank, which is packed (torch.cat) to pass
        on; K and V are packed to pass on as in forward; dq, dk and dv are cast back."""
        c, act, f32 = self.cp_steps, num.act_bytes, DTYPE_BYTES["fp32"]
        q, kv = self._ring_sizes(n)
        read = (c * q * (f32 + act) + c * kv * (f32 + act) + c * kv * f32
                + (c - 1) * kv * act + (q + kv) * f32)
        written = ((q + kv) * f32 + c * q * f32 + c * kv * f32 + c * kv * f32
                   + (c - 1) * kv * act + (q + kv) * act)
        return [memory_op(f"{self.name}.ring_grad_accumulate", read, written, 1, 0,
                          layer=self.name)]

    def backward_input(self, n: int, num: Numerics) -> list[Op]:
        ops = [self._layout("split_heads_grad", n * self.out_elements, num)] \
            if self._merges(num) else []
        if self.fused:
            moved = (self._qkvo_elements(n) * 2) * num.act_bytes
            grads = self._qkvo_elements(n) * num.act_bytes / 2  # dq, dk, dv
            ops.append(Op(f"{self.name}.flash_bwd", "attention", 2.5 * self._fused_flops(n),
                          moved, fused_math(num), alloc_bytes=grads,
                          family="attention_backward",
                          kernel=self.kernel, attention=self._shape(n), layer=self.name))
        else:
            scores = n * self.heads * self.seq**2
            ops += self._score_gemms(n, ("dv", "dp"), num)
            if self.dropout:
                ops.append(memory_op(f"{self.name}.dropout_bwd", scores, scores,
                                     num.act_bytes, mask_read=scores, layer=self.name))
            ops.append(memory_op(f"{self.name}.softmax_bwd", 2 * scores, scores,
                                 num.act_bytes, 3, layer=self.name, family=UNFUSED_ATTENTION))
            if self.scale_and_mask:
                ops.append(memory_op(f"{self.name}.scale_bwd", scores, scores, num.act_bytes,
                                     1, layer=self.name))
            ops += self._score_gemms(n, ("dq", "dk"), num)
        if self.fused and self.cp_steps > 1:
            ops += self._ring_backward(n, num)
        ops += self._repeat_kv(n, num, backward=True)
        ops += self._rope(n, num, backward=True)
        ops += [op for norm in self._qk_norms() for op in norm.backward_input(n, num)]
        return self._tag([*ops, self._qkv_grad_pack(n, num)])

    def io_bytes(self, n: int, num: Numerics) -> float:
        """Q, K and V: what selective recompute keeps (the core re-runs from them; its
        output is kept by the projection that reads it)."""
        return n * self.seq * self.head_dim * (self.heads + 2 * self._kv) * num.act_bytes

    def saved_bytes(self, n: int, num: Numerics) -> float:
        # the QK norms keep their inputs (the rotary embedding keeps only its cos/sin table)
        saved = self.io_bytes(n, num) + sum(norm.saved_bytes(n, num)
                                            for norm in self._qk_norms())
        if not self.fused:
            scores = n * self.heads * self.seq**2
            # softmax's output, and with dropout its bool mask and the dropped probabilities
            # that the AV product keeps (5 bytes an element in fp16, Korthikanti et al.
            # 2022); under autocast the probabilities are fp32 and the product keeps its
            # own 16-bit copy of them
            kept = num.softmax_bytes + (1 if self.dropout else 0)
            if self.dropout or num.softmax_bytes != num.act_bytes:
                kept += num.act_bytes
            saved += scores * kept
        else:
            # the kernel's own output, which its backward reads, and an fp32 log-sum-exp
            # per row
            saved += self.output_bytes(n, num) + n * self.heads * self.seq * 4
        return saved

    def output_bytes(self, n: int, num: Numerics) -> float:
        """The fused kernel's output, which its backward keeps (0 for unfused attention,
        whose backward keeps the scores instead)."""
        return n * self.out_elements * num.act_bytes if self.fused else 0.0

    def shared_output_bytes(self, n: int, num: Numerics) -> float:
        """What the output projection keeps of this layer's own tensors: the kernel's
        output itself when merging the heads is a view (``merge_copy`` False)."""
        return 0.0 if self._merges(num) else self.output_bytes(n, num)


@dataclass(frozen=True)
class Embedding(Layer):
    """A lookup table: gather rows in forward, scatter-add into a dense gradient in backward."""

    num_embeddings: int
    dim: int
    rows: int = 1

    @property
    def params(self) -> int:
        return self.num_embeddings * self.dim

    def factored_sizes(self) -> list[int]:
        return [self.num_embeddings + self.dim]

    @property
    def out_elements(self) -> int:
        return self.rows * self.dim

    def forward(self, n: int, num: Numerics) -> list[Op]:
        e = n * self.rows * self.dim
        return self._tag([memory_op(f"{self.name}.gather", e, e, num.act_bytes, 0,
                                    layer=self.name)])

    def backward_input(self, n: int, num: Numerics) -> list[Op]:
        return []  # indices have no gradient

    def backward_weight(self, n: int, num: Numerics) -> list[Op]:
        e = n * self.rows * self.dim
        table = self.num_embeddings * self.dim
        return self._tag([
            memory_op(f"{self.name}.zero_grad_table", 0, table, DTYPE_BYTES["fp32"], 0,
                      layer=self.name),
            memory_op(f"{self.name}.scatter_add", 2 * e, e, DTYPE_BYTES["fp32"], layer=self.name),
        ])

    def saved_bytes(self, n: int, num: Numerics) -> float:
        return n * self.rows * DTYPE_BYTES["int64"]


@dataclass(frozen=True)
class CrossEntropy(Layer):
    """Softmax cross-entropy over ``classes`` for ``rows`` predictions per sample, as
    PyTorch's ``cross_entropy`` runs it: log-softmax, then the negative log-likelihood.

    It computes in fp32 (autocast lists it there), so 16-bit logits are cast up first and
    their gradient cast back. Forward: cast, log-softmax (kept for backward), a gather of
    one log-probability per row. Backward: the likelihood's gradient is a zero-filled
    tensor of the logits' size with one entry per row set, then the log-softmax gradient,
    which reads that gradient and the kept output.
    """

    classes: int
    rows: int = 1
    # False: the loss runs on 16-bit logits as they come (a stack that calls cross_entropy
    # without .float() first, outside autocast), keeping 16-bit log-probabilities.
    upcast: bool = True
    # Cross-entropy taken a chunk at a time (``chunks`` of the batch's rows, or chunks of
    # ``chunk_rows`` rows), each chunk's backward before the next: one chunk's gradients
    # are alive at once.
    chunks: int = 1
    chunk_rows: int = 0
    # One fused kernel (flash-attn's and apex's xentropy, Liger's, Transformer Engine's):
    # forward reads the 16-bit logits once and keeps them with an fp32 log-sum-exp a row;
    # backward reads them again and writes their gradient in their own type.
    fused: bool = False

    @property
    def out_elements(self) -> int:
        return 1

    def _type(self, num: Numerics) -> int:
        """Bytes per element the loss computes and keeps in."""
        return DTYPE_BYTES["fp32"] if self.upcast else num.act_bytes

    def _cast_up(self, e: int, num: Numerics) -> list[Op]:
        """16-bit logits cast to fp32 before the loss (nothing for fp32 logits)."""
        f32 = DTYPE_BYTES["fp32"]
        if num.act_bytes == f32 or not self.upcast:
            return []
        return [Op(f"{self.name}.cast", "memory", 0.0, e * (num.act_bytes + f32), "fp32",
                   alloc_bytes=e * f32, layer=self.name)]

    def _cast_down(self, e: int, num: Numerics) -> list[Op]:
        """The fp32 gradient of the logits cast back to their type."""
        f32 = DTYPE_BYTES["fp32"]
        if num.act_bytes == f32 or not self.upcast:
            return []
        return [Op(f"{self.name}.cast_bwd", "memory", 0.0, e * (f32 + num.act_bytes), "fp32",
                   alloc_bytes=e * num.act_bytes, layer=self.name)]

    def forward(self, n: int, num: Numerics) -> list[Op]:
        rows = n * self.rows
        e = rows * self.classes
        if self.fused:  # the loss and the log-sum-exp a row, both fp32
            return self._tag([Op(f"{self.name}.fused_xent", "memory", 5.0 * e,
                                 e * num.act_bytes + 2 * rows * DTYPE_BYTES["fp32"], "fp32",
                                 alloc_bytes=2 * rows * DTYPE_BYTES["fp32"], layer=self.name)])
        f32 = self._type(num)
        return self._tag([*self._cast_up(e, num),
                          memory_op(f"{self.name}.log_softmax", e, e, f32, 5.0, layer=self.name),
                          memory_op(f"{self.name}.nll", rows, 1, f32, layer=self.name)])

    def backward_input(self, n: int, num: Numerics) -> list[Op]:
        rows = n * self.rows
        e = rows * self.classes
        if self.fused:  # softmax less one at the target, from the logits and their lse
            return self._tag([memory_op(f"{self.name}.fused_xent_bwd", e, e, num.act_bytes,
                                        3.0, layer=self.name)])
        f32 = self._type(num)
        return self._tag([memory_op(f"{self.name}.nll_bwd", rows, e, f32, 0.0, layer=self.name),
                          memory_op(f"{self.name}.log_softmax_bwd", 2 * e, e, f32, 2.0,
                                    layer=self.name),
                          *self._cast_down(e, num)])

    def vocab_parallel_forward(self, n: int, num: Numerics) -> list[Op]:
        """Megatron-LM's vocab-parallel cross-entropy on logits cast to fp32, pass by pass:
        a max over the vocabulary, subtract it, exponentiate, sum, divide (the softmax is
        kept for backward); the max and the sum are all-reduced across TP (a few bytes a
        row, not counted)."""
        rows = n * self.rows
        e = rows * self.classes
        f32 = DTYPE_BYTES["fp32"]
        return self._tag([*self._cast_up(e, num),
                          memory_op(f"{self.name}.max", e, rows, f32, layer=self.name),
                          memory_op(f"{self.name}.sub_", e, e, f32, allocates=False,
                                    layer=self.name),
                          memory_op(f"{self.name}.exp", e, e, f32, 3.0, allocates=False,
                                    layer=self.name),
                          memory_op(f"{self.name}.sum", e, rows, f32, layer=self.name),
                          memory_op(f"{self.name}.div_", e, e, f32, allocates=False,
                                    layer=self.name)])

    def vocab_parallel_backward(self, n: int, num: Numerics) -> list[Op]:
        """The kept softmax, less one at each target, scaled in place by the loss gradient,
        then cast back to the logits' type."""
        e = n * self.rows * self.classes
        f32 = DTYPE_BYTES["fp32"]
        return self._tag([memory_op(f"{self.name}.mul_", e, e, f32, 2.0, allocates=False,
                                    layer=self.name),
                          *self._cast_down(e, num)])

    def saved_bytes(self, n: int, num: Numerics) -> float:
        if self.fused:  # the logits themselves and an fp32 log-sum-exp a row
            return n * self.rows * (self.classes * num.act_bytes + DTYPE_BYTES["fp32"])
        return n * self.rows * self.classes * self._type(num)

    def transient_bytes(self, n: int, num: Numerics) -> float:
        """In backward, the likelihood's gradient (a logits-sized tensor, zero but one entry
        a row) and the log-softmax's gradient are alive together, in the loss's type, for
        one chunk of rows at a time; a fused loss writes only the logits' gradient."""
        rows = n * self.rows
        chunks = max(self.chunks, -(-rows // self.chunk_rows) if self.chunk_rows else 1)
        if self.fused:
            return float(rows * self.classes * num.act_bytes) / min(chunks, rows)
        return 2.0 * rows * self.classes * self._type(num) / min(chunks, rows)
