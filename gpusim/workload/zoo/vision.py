"""Vision models of the zoo: MNIST MLP and CNN, AlexNet, VGG16 and ResNet-50 v1.5.

Shapes follow torchvision (AlexNet, VGG16, ResNet-50 with the stride on the 3x3 convolution,
"v1.5") and PyTorch's MNIST example; builders track the activation shape so each layer gets
its per-sample dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpusim.workload.attention import CrossEntropy
from gpusim.workload.layers import (
    Conv2d,
    Layer,
    Linear,
    batch_norm,
    dropout,
    pool,
    relu,
    residual_add,
)
from gpusim.workload.model import InputSpec, Model

# Input pipelines (assumptions, printed with each estimate): ImageNet JPEG decode plus
# random-resized-crop and flip costs a few milliseconds of one CPU core per image. Decoding
# alone takes 1.2-2.8 ms on one thread (360-864 ImageNet validation images a second across
# five server CPUs and seven decoders: measurements/published/dali_decode.yaml,
# cpu_decode_cost); the crop, flip and conversion come on top. MNIST samples are small
# tensors already in memory.
IMAGENET_INPUT = InputSpec(3 * 224 * 224, 2.5e-3,
                           "ImageNet JPEG, decoded and cropped to 224x224 uint8")
MNIST_INPUT = InputSpec(28 * 28 * 4, 5e-6, "MNIST 28x28 float32 tensor held in memory")


@dataclass
class ShapeBuilder:
    """Appends layers while tracking the (channels, height, width) of the activation."""

    c: int
    h: int
    w: int
    layers: list[Layer] = field(default_factory=list)
    block: str = ""

    def conv(self, name: str, out: int, k: int, stride: int = 1, pad: int = 0,
             bias: bool = False) -> None:
        layer = Conv2d(name, self.c, out, k, self.h, self.w, stride, pad, bias=bias,
                       block=self.block)
        self.layers.append(layer)
        self.c = out
        self.h, self.w = layer.out_hw

    def bn(self, name: str) -> None:
        self.layers.append(batch_norm(name, self.c, self.elements, block=self.block))

    def relu(self, name: str) -> None:
        self.layers.append(relu(name, self.elements, block=self.block, inplace=True))

    def pool(self, name: str, k: int, stride: int, pad: int = 0, op: str = "maxpool") -> None:
        before = self.elements
        self.h = (self.h + 2 * pad - k) // stride + 1
        self.w = (self.w + 2 * pad - k) // stride + 1
        self.layers.append(pool(name, before, self.elements, block=self.block, op=op,
                                args=(k, stride, pad)))

    def global_pool(self, name: str, size: int = 1) -> None:
        before = self.elements
        self.h = self.w = size
        self.layers.append(pool(name, before, self.elements, block=self.block,
                                op="adaptive_avgpool", args=(size,)))

    @property
    def elements(self) -> int:
        return self.c * self.h * self.w

    def classifier(self, widths: list[int], classes: int, drop: bool) -> None:
        """Fully connected layers with ReLU (and dropout) between, then the loss."""
        width = self.elements
        self.block = "classifier"
        for i, out in enumerate(widths):
            if drop:
                self.layers.append(dropout(f"fc{i}.dropout", width, block=self.block))
            self.layers.append(Linear(f"fc{i}", width, out, block=self.block))
            self.layers.append(relu(f"fc{i}.relu", out, block=self.block, inplace=True))
            width = out
        self.layers.append(Linear("fc_out", width, classes, block=self.block))
        self.layers.append(CrossEntropy("loss", classes, block=self.block))


def _imagenet_input(image_size: int) -> InputSpec:
    if image_size == 224:
        return IMAGENET_INPUT
    return InputSpec(3 * image_size**2, IMAGENET_INPUT.loader_cpu_s,
                     f"ImageNet JPEG, decoded and cropped to {image_size}x{image_size} uint8")


def mnist_mlp() -> Model:
    layers: list[Layer] = [
        Linear("fc1", 784, 512), relu("relu1", 512),
        Linear("fc2", 512, 512), relu("relu2", 512),
        Linear("fc3", 512, 10), CrossEntropy("loss", 10),
    ]
    return Model("mnist-mlp", tuple(layers), MNIST_INPUT, "mlp",
                 description="MLP 784-512-512-10 with ReLU on MNIST")


def mnist_cnn() -> Model:
    b = ShapeBuilder(1, 28, 28)
    b.conv("conv1", 32, 3, bias=True)
    b.relu("relu1")
    b.conv("conv2", 64, 3, bias=True)
    b.relu("relu2")
    b.pool("maxpool", 2, 2)
    b.layers.append(dropout("dropout1", b.elements))
    width = b.elements
    b.layers += [Linear("fc1", width, 128), relu("relu3", 128), dropout("dropout2", 128),
                 Linear("fc2", 128, 10), CrossEntropy("loss", 10)]
    return Model("mnist-cnn", tuple(b.layers), MNIST_INPUT, "cnn",
                 description="PyTorch examples/mnist CNN: two 3x3 convolutions, max-pool, two FC")


def alexnet(image_size: int = 224) -> Model:
    b = ShapeBuilder(3, image_size, image_size)
    for i, (out, k, s, p, pooled) in enumerate(
        [(64, 11, 4, 2, True), (192, 5, 1, 2, True), (384, 3, 1, 1, False),
         (256, 3, 1, 1, False), (256, 3, 1, 1, True)]
    ):
        b.block = f"features.{i}"
        b.conv(f"conv{i + 1}", out, k, s, p, bias=True)
        b.relu(f"relu{i + 1}")
        if pooled:
            b.pool(f"maxpool{i + 1}", 3, 2)
    b.global_pool("avgpool", 6)
    b.classifier([4096, 4096], 1000, drop=True)
    return Model("alexnet", tuple(b.layers), _imagenet_input(image_size), "cnn",
                 description="AlexNet as in torchvision (61.1M parameters)")


def vgg16(image_size: int = 224) -> Model:
    b = ShapeBuilder(3, image_size, image_size)
    stage = 0
    for i, v in enumerate([64, 64, "M", 128, 128, "M", 256, 256, 256, "M",
                           512, 512, 512, "M", 512, 512, 512, "M"]):
        b.block = f"stage{stage}"
        if v == "M":
            b.pool(f"pool{stage}", 2, 2)
            stage += 1
        else:
            b.conv(f"conv{i}", int(str(v)), 3, 1, 1, bias=True)
            b.relu(f"relu{i}")
    b.global_pool("avgpool", 7)
    b.classifier([4096, 4096], 1000, drop=True)
    return Model("vgg16", tuple(b.layers), _imagenet_input(image_size), "cnn",
                 description="VGG16 (configuration D) as in torchvision (138.4M parameters)")


def _bottleneck(b: ShapeBuilder, name: str, width: int, stride: int, downsample: bool) -> None:
    b.block = name
    c_in, h_in, w_in = b.c, b.h, b.w
    b.conv(f"{name}.conv1", width, 1)
    b.bn(f"{name}.bn1")
    b.relu(f"{name}.relu1")
    b.conv(f"{name}.conv2", width, 3, stride, 1)
    b.bn(f"{name}.bn2")
    b.relu(f"{name}.relu2")
    b.conv(f"{name}.conv3", width * 4, 1)
    b.bn(f"{name}.bn3")
    if downsample:
        short = Conv2d(f"{name}.downsample", c_in, width * 4, 1, h_in, w_in, stride, block=name)
        b.layers.append(short)
        b.layers.append(batch_norm(f"{name}.downsample.bn", width * 4, b.elements, block=name))
    b.layers.append(residual_add(f"{name}.add", b.elements, block=name))
    b.relu(f"{name}.relu3")


def resnet50(image_size: int = 224) -> Model:
    b = ShapeBuilder(3, image_size, image_size)
    b.block = "stem"
    b.conv("conv1", 64, 7, 2, 3)
    b.bn("bn1")
    b.relu("relu")
    b.pool("maxpool", 3, 2, 1)
    for stage, (blocks, width) in enumerate([(3, 64), (4, 128), (6, 256), (3, 512)]):
        for i in range(blocks):
            stride = 2 if i == 0 and stage > 0 else 1
            _bottleneck(b, f"layer{stage + 1}.{i}", width, stride, downsample=i == 0)
    b.global_pool("avgpool")
    b.block = "classifier"
    b.layers += [Linear("fc", 2048, 1000, block="classifier"),
                 CrossEntropy("loss", 1000, block="classifier")]
    return Model("resnet50", tuple(b.layers), _imagenet_input(image_size), "cnn",
                 description="ResNet-50 v1.5 (stride on the 3x3 convolution), 25.6M parameters",
                 source="He et al. 2016; torchvision resnet50")
