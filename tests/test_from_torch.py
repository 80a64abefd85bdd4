"""PyTorch modules as gpusim models (gpusim.from_torch): parameters as the module counts
them, matrix-product FLOPs as torch's FlopCounterMode counts them, nothing dropped silently."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from gpusim.cli import main  # noqa: E402
from gpusim.errors import InvalidModel  # noqa: E402
from gpusim.estimation import estimate  # noqa: E402
from gpusim.workload.attention import Attention, CrossEntropy  # noqa: E402
from gpusim.workload.from_torch import from_torch  # noqa: E402
from gpusim.workload.layers import Linear  # noqa: E402
from gpusim.workload.numerics import FP32  # noqa: E402


class Block(nn.Module):
    """A nanoGPT-style block: fused QKV, SDPA, GELU MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 1000, d: int = 128, heads: int = 4, layers: int = 3,
                 seq: int = 64) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2's

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def small_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 32, 7, 2, 3, bias=False), nn.BatchNorm2d(32),
                         nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1),
                         nn.Conv2d(32, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def _matrix_flops(model, kinds: tuple[type, ...] | None = None) -> float:
    return sum(op.flops for la in model.layers if kinds is None or isinstance(la, kinds)
               for op in la.forward(1, FP32) if op.kind != "memory")


def _torch_flops(module: nn.Module, x: torch.Tensor) -> float:
    with FlopCounterMode(display=False) as counter:
        module(x)
    return counter.get_total_flops() / x.shape[0]


def test_a_cnn_matches_the_flop_counter_and_its_parameters() -> None:
    net, x = small_cnn(), torch.zeros(2, 3, 64, 64)
    model = from_torch(net, x)
    assert model.parameters == sum(p.numel() for p in net.parameters())
    assert _matrix_flops(model) == pytest.approx(_torch_flops(net, x), rel=0.02)
    assert isinstance(model.layers[-1], CrossEntropy)  # the loss training needs
    assert "not costed" not in model.description


def test_a_transformer_counts_tied_weights_once_and_keeps_its_blocks() -> None:
    net, x = TinyGPT(), torch.zeros(4, 64, dtype=torch.long)
    model = from_torch(net, x)
    assert model.parameters == sum(p.numel() for p in net.parameters())
    head = next(la for la in model.layers if isinstance(la, Linear) and la.shared)
    assert head.tied_to == "wte.embedding"
    # FlopCounterMode on the CPU counts the products, not SDPA's CPU kernel.
    assert _matrix_flops(model, (Linear,)) == pytest.approx(_torch_flops(net, x), rel=0.02)
    attention = [la for la in model.layers if isinstance(la, Attention)]
    assert len(attention) == 3 and all(a.causal and a.heads == 4 for a in attention)
    assert {la.block for la in attention} == {"blocks.0", "blocks.1", "blocks.2"}
    assert model.tokens_per_sample == 64


def test_an_unknown_function_is_listed_not_dropped() -> None:
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cumsum(self.fc(x), dim=-1)

    model = from_torch(Odd(), torch.zeros(8, 16))
    assert "not costed: cumsum (1)" in model.description


def test_a_module_that_fails_is_one_clear_error() -> None:
    with pytest.raises(InvalidModel, match="did not run on the meta device"):
        from_torch(nn.Linear(16, 4), torch.zeros(8, 15))


def test_the_original_module_is_left_as_it_was() -> None:
    net = small_cnn()
    from_torch(net, torch.zeros(2, 3, 32, 32))
    assert all(not p.is_meta for p in net.parameters())


def test_an_imported_module_trains_like_any_model() -> None:
    model = from_torch(TinyGPT(), torch.zeros(8, 64, dtype=torch.long))
    result = estimate(model, "h100-sxm", 8, steps=10)
    assert result.step.step_time_s > 0 and result.precision == "bf16"


def test_the_command_line_builds_a_module_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "my_net.py").write_text(
        "import torch.nn as nn\n\n\ndef build():\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(),"
        " nn.Linear(512, 10))\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    assert main(["estimate", "--model", "my_net:build", "--input-shape", "64,1,28,28",
                 "--gpu", "h100-sxm", "--batch-size", "64"]) == 0
    assert "my_net:build on NVIDIA H100" in capsys.readouterr().out
    assert main(["models", "show", "my_net:build", "--input-shape", "1,1,28,28",
                 "--json"]) == 0
    assert '"parameters": 407050' in capsys.readouterr().out
    assert main(["estimate", "--model", "my_net:build", "--gpu", "h100-sxm",
                 "--batch-size", "64"]) == 2
    assert "--input-shape" in capsys.readouterr().err
