"""Diffusion transformers (DiT): Peebles & Xie, "Scalable Diffusion Models with
Transformers", ICCV 2023 (arXiv 2212.09748), as the official code builds them.

Line references are to facebookresearch/DiT at commit ed81ce2 (``models.py`` and
``train.py``). A DiT denoises the Stable Diffusion VAE's latent of an image (``train.py``
L140-141: image / 8 on a side, 4 channels; 32x32x4 for 256x256 images):

* the latent cut into p x p patches, each embedded by a strided convolution (timm's
  ``PatchEmbed``, ``models.py`` L169) and added to a fixed sin-cos position table that is
  a frozen parameter (L174, ``requires_grad=False``): not trained, so not counted here;
* the conditioning vector c = t + y (L241-243): the timestep's 256 sinusoidal frequencies
  through Linear(256, d), SiLU, Linear(d, d) (L31-37), plus a row of the class table of
  1000 classes and one "no class" row for classifier-free guidance (L74);
* N blocks (L101-122), each normalizing with a LayerNorm without affine parameters (L107,
  L109) and modulating it with shift, scale and gate regressed from c by SiLU and
  Linear(d, 6d) (adaLN-Zero, L113-116): ``x + gate * attn(norm(x) * (1 + scale) + shift)``
  and the same around a GELU-tanh MLP of ratio 4 (L110-112); attention is timm's, with
  the q, k, v bias (L108);
* the final layer (L125-142): LayerNorm, modulation by Linear(d, 2d), Linear(d, p*p*2C):
  learned sigma doubles the 4 latent channels to 8 (L160, L165); then unpatchify (L218-231).

The loss (``diffusion/gaussian_diffusion.py`` L746-783) is the mean squared error of the
predicted noise against the true noise plus the variational bound that trains the
predicted variance (``learn_sigma=True``), both elementwise over the 8 x H x W output:
modelled as one memory-bound elementwise loss layer (the zoo had no regression loss).

Not modelled: the official ``train.py`` L203 encodes every batch with the VAE encoder on
the GPU (under no_grad) before the DiT step; gpusim's DiT trains on latents extracted
beforehand (as fast-DiT does), so the encoder's time is not in the step. The label dropout
(L78-87) and the timestep's frequency table are a few kernels over a few hundred elements
per sample, folded into the layers beside them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpusim.errors import UnknownModel
from gpusim.workload.attention import Attention, Embedding
from gpusim.workload.layers import (
    Conv2d,
    Elementwise,
    Layer,
    Linear,
    gelu,
    residual_add,
)
from gpusim.workload.model import InputSpec, Model

LATENT_CHANNELS = 4  # the Stable Diffusion VAE's latent (train.py L140-141, L151)
VAE_DOWNSAMPLE = 8  # image pixels per latent pixel on a side
FREQUENCY_EMBEDDING = 256  # TimestepEmbedder's sinusoid width (models.py L31)
CLASSES = 1000  # ImageNet; one more table row is the "no class" label (models.py L74)

_SOURCE = ("Peebles & Xie 2023 (DiT, arXiv 2212.09748), Tables 1 and 4; "
           "facebookresearch/DiT models.py")


@dataclass(frozen=True)
class DiTConfig:
    """One DiT variant (models.py L328-362): depth N, hidden d, heads, patch p."""

    name: str
    size: str  # S, B, L or XL
    depth: int
    hidden: int
    heads: int
    patch: int
    image_size: int = 256
    mlp_ratio: int = 4  # models.py L157

    @property
    def latent(self) -> int:
        return self.image_size // VAE_DOWNSAMPLE

    @property
    def tokens(self) -> int:
        return (self.latent // self.patch) ** 2

    @property
    def out_channels(self) -> int:
        return 2 * LATENT_CHANNELS  # learned sigma (models.py L165)


# Table 1 of the paper (layers, hidden size, heads); the same dimensions as models.py
# L328-362. Patch 2: the paper's best and most used setting (DiT-XL/2).
DITS: dict[str, DiTConfig] = {c.name: c for c in [
    DiTConfig("dit-s-2", "S", 12, 384, 6, 2),
    DiTConfig("dit-b-2", "B", 12, 768, 12, 2),
    DiTConfig("dit-l-2", "L", 24, 1024, 16, 2),
    DiTConfig("dit-xl-2", "XL", 28, 1152, 16, 2),
]}


def _silu(name: str, elements: int, *, block: str = "") -> Elementwise:
    """SiLU (x * sigmoid(x)), one kernel each way."""
    return Elementwise(name, elements, flops_per_element=4, block=block, op="silu")


def _affine_free_norm(name: str, width: int, rows: int, block: str) -> Elementwise:
    """nn.LayerNorm(elementwise_affine=False) (models.py L107, L109, L131): the norm's
    kernels, no weight or bias."""
    return Elementwise(name, width * rows, flops_per_element=5, block=block,
                       op="layer_norm", args=(width,), tp="sequence")


def _modulate(prefix: str, elements: int, block: str) -> list[Layer]:
    """``x * (1 + scale) + shift`` with per-sample scale and shift broadcast over the
    tokens (models.py L19-20): two kernels. The product keeps x for the scale's gradient,
    which is (dy * x) summed over the tokens (a product, then a reduction); the shift's
    gradient is dy summed over the tokens, and dy passes through the sum unchanged."""
    return [
        Elementwise(f"{prefix}.scale", elements, bwd_reads=4, bwd_writes=2, block=block,
                    op="mul", tp="sequence"),
        Elementwise(f"{prefix}.shift", elements, bwd_reads=1, bwd_writes=0, saves=0,
                    block=block, op="add", tp="sequence"),
    ]


def _gated_residual(prefix: str, elements: int, block: str) -> list[Layer]:
    """``x + gate * f(x)`` (models.py L120-121): the product keeps f(x) for the gate's
    gradient (a product and a reduction over the tokens, as for the scale), then the
    residual add."""
    return [
        Elementwise(f"{prefix}.gate", elements, bwd_reads=4, bwd_writes=2, block=block,
                    op="mul", tp="sequence"),
        _seq(residual_add(f"{prefix}.add", elements, block=block)),
    ]


def _seq(layer: Elementwise) -> Elementwise:
    return replace(layer, tp="sequence")


def _adaln(prefix: str, d: int, chunks: int, block: str) -> list[Layer]:
    """SiLU(c) then Linear(d, chunks x d) on the one conditioning row of each sample
    (models.py L113-116, L133-136): many parameters, few FLOPs."""
    return [_silu(f"{prefix}.act", d, block=block),
            Linear(f"{prefix}.linear", d, chunks * d, 1, True, block=block)]


def _block(cfg: DiTConfig, i: int) -> list[Layer]:
    b = f"blocks.{i}"
    s, d, heads = cfg.tokens, cfg.hidden, cfg.heads
    e = s * d
    ffn = cfg.mlp_ratio * d
    return [
        *_adaln(f"{b}.adaLN", d, 6, b),
        _affine_free_norm(f"{b}.norm1", d, s, b),
        *_modulate(f"{b}.attn.modulate", e, b),
        Linear(f"{b}.attn.qkv", d, 3 * d, s, True, block=b, tp="column"),
        Attention(f"{b}.attn.core", heads, d // heads, s, block=b, tp="sharded"),
        Linear(f"{b}.attn.proj", d, d, s, True, block=b, tp="row"),
        *_gated_residual(f"{b}.attn", e, b),
        _affine_free_norm(f"{b}.norm2", d, s, b),
        *_modulate(f"{b}.mlp.modulate", e, b),
        Linear(f"{b}.mlp.fc1", d, ffn, s, True, block=b, tp="column"),
        replace(gelu(f"{b}.mlp.act", s * ffn, block=b), tp="sharded"),  # tanh form
        Linear(f"{b}.mlp.fc2", ffn, d, s, True, block=b, tp="row"),
        *_gated_residual(f"{b}.mlp", e, b),
    ]


def build_dit(cfg: DiTConfig, image_size: int | None = None) -> Model:
    """The layers of DiT ``cfg`` for square images of ``image_size`` pixels (default 256;
    the latent is image_size / 8 on a side)."""
    if image_size is not None:
        step = VAE_DOWNSAMPLE * cfg.patch
        if image_size <= 0 or image_size % step:
            raise UnknownModel(f"{cfg.name} takes images whose side is a multiple of {step} "
                               f"(the VAE's 8 times the patch {cfg.patch}); got {image_size}")
        cfg = replace(cfg, image_size=image_size)
    d, p, c, s = cfg.hidden, cfg.patch, LATENT_CHANNELS, cfg.tokens
    latent = cfg.latent
    layers: list[Layer] = [
        Conv2d("x_embedder", c, d, p, latent, latent, stride=p, bias=True, block="embed"),
        # + the frozen sin-cos table (models.py L240): an add with no gradient of its own
        Elementwise("pos_embed.add", s * d, reads=2, saves=0, has_backward_kernel=False,
                    block="embed", op="add"),
        Linear("t_embedder.fc1", FREQUENCY_EMBEDDING, d, 1, True, block="embed"),
        _silu("t_embedder.act", d, block="embed"),
        Linear("t_embedder.fc2", d, d, 1, True, block="embed"),
        Embedding("y_embedder", CLASSES + 1, d, 1, block="embed"),
        residual_add("c.add", d, block="embed"),  # c = t + y
    ]
    for i in range(cfg.depth):
        layers += _block(cfg, i)
    out = p * p * cfg.out_channels
    layers += [
        *_adaln("final.adaLN", d, 2, "head"),
        _affine_free_norm("final.norm", d, s, "head"),
        *_modulate("final.modulate", s * d, "head"),
        Linear("final.linear", d, out, s, True, block="head"),
        # unpatchify: an einsum over a reshaped view, copied back contiguous (L228-230)
        Elementwise("unpatchify", s * out, saves=0, bwd_reads=1, flops_per_element=0,
                    block="head", op="copy"),
        # MSE on the noise half and the variational bound on all 8 channels: reads the
        # output, the noise and x_t, writes the squared error (kept for backward)
        Elementwise("loss", s * out, reads=3, flops_per_element=6, block="head",
                    op="diffusion_loss"),
    ]
    # A latent extracted beforehand (fp32, 4 x 32 x 32 at 256x256) and its int64 label
    # read from memory-mapped files: a few microseconds of loader CPU per sample.
    latents = InputSpec(4 * c * latent**2 + 8, 1e-5,
                        f"precomputed {c}x{latent}x{latent} fp32 VAE latents of "
                        f"{cfg.image_size}x{cfg.image_size} images and labels, read from "
                        f"memory (the VAE encoder is not in the step)")
    description = (f"DiT-{cfg.size}/{p} diffusion transformer, {cfg.image_size}x"
                   f"{cfg.image_size} images ({latent}x{latent}x{c} VAE latents)")
    return Model(cfg.name, tuple(layers), latents, "transformer", tokens_per_sample=0,
                 description=description, source=_SOURCE)


__all__ = ["DITS", "DiTConfig", "build_dit"]
