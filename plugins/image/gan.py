"""SAGAN: a class-conditional GAN with self-attention in the generator and the discriminator
(Zhang et al. 2018, "Self-Attention Generative Adversarial Networks", arXiv 1805.08318).

As in the paper (section 4 and 5):

- residual blocks, up-sampling in the generator and down-sampling in the discriminator
  (Miyato et al. 2018's SN-GAN architecture), with a :class:`~transformer_zoo.plugins.image.blocks.SelfAttention2d`
  block after the chosen blocks of each network;
- spectral normalisation on every convolution, linear map and class embedding of **both**
  networks (not on the conditional batch norm's gains and biases);
- class conditioning by conditional batch norm in the generator and a projection
  discriminator (Miyato & Koyama 2018): ``D(x, y) = psi(phi(x)) + embed(y) . phi(x)``;
- the hinge loss: ``L_D = E[relu(1 - D(x, y))] + E[relu(1 + D(G(z, y), y))]``,
  ``L_G = -E[D(G(z, y), y)]``;
- two time-scale updates: one discriminator step, then one generator step, each with its own
  Adam (beta1 = 0, beta2 = 0.9) and the generator at a quarter of the discriminator's rate
  (1e-4 against 4e-4). These are the model's :meth:`~SaganGan.phases`.

Sized for 8x8 digits: the generator grows 2x2 -> 4x4 -> 8x8, the discriminator shrinks 8x8 ->
4x4 -> 2x2; both attend at 8x8. Generated images are in [0, 1], like the data.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor, nn
from torch.nn.utils import parametrizations, parametrize

from transformer_zoo.core.embedding import check_not_empty, check_tensor
from transformer_zoo.core.model import ZooModel
from transformer_zoo.core.output import ModelOutput
from transformer_zoo.core.tasks import Phase
from transformer_zoo.core.validation import MAX_WIDTH, Width

from .blocks import SelfAttention2d
from .config import ImageConfig, check_float_dtype, check_image


class ConditionalBatchNorm2d(nn.Module):
    """Batch norm whose gain and bias are looked up by class (de Vries et al. 2017)."""

    category: ClassVar[str] = "norm"

    def __init__(self, channels: int, num_classes: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(channels, affine=False)
        self.gain = nn.Embedding(num_classes, channels)
        self.bias = nn.Embedding(num_classes, channels)
        nn.init.ones_(self.gain.weight)
        nn.init.zeros_(self.bias.weight)

    def forward(self, x: Tensor, labels: Tensor) -> Tensor:
        return self.norm(x) * self.gain(labels)[:, :, None, None] + self.bias(labels)[:, :, None, None]


class GeneratorBlock(nn.Module):
    """Norm, ReLU, 2x nearest up-sampling, 3x3 conv, norm, ReLU, 3x3 conv; plus an up-sampled 1x1 shortcut."""

    def __init__(self, c_in: int, c_out: int, num_classes: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = ConditionalBatchNorm2d(c_in, num_classes), ConditionalBatchNorm2d(c_out, num_classes)
        self.conv1, self.conv2 = nn.Conv2d(c_in, c_out, 3, padding=1), nn.Conv2d(c_out, c_out, 3, padding=1)
        self.shortcut = nn.Conv2d(c_in, c_out, 1)

    def forward(self, x: Tensor, labels: Tensor) -> Tensor:
        h = self.conv1(F.interpolate(F.relu(self.norm1(x, labels)), scale_factor=2))
        h = self.conv2(F.relu(self.norm2(h, labels)))
        return h + self.shortcut(F.interpolate(x, scale_factor=2))


class DiscriminatorBlock(nn.Module):
    """ReLU, 3x3 conv, ReLU, 3x3 conv, optional 2x2 average pooling; plus a 1x1 shortcut. The
    first block of the network has no leading ReLU (its input is the image)."""

    def __init__(self, c_in: int, c_out: int, *, down: bool, first: bool) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(c_in, c_out, 3, padding=1), nn.Conv2d(c_out, c_out, 3, padding=1)
        self.shortcut = nn.Conv2d(c_in, c_out, 1)
        self.down, self.first = down, first

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv2(F.relu(self.conv1(x if self.first else F.relu(x))))
        shortcut = self.shortcut(x)
        if self.down:
            h, shortcut = F.avg_pool2d(h, 2), F.avg_pool2d(shortcut, 2)
        return h + shortcut


class Generator(nn.Module):
    """Noise and a class to an image in [0, 1]: a linear map to the smallest feature map, up-
    sampling blocks, SAGAN blocks after the chosen ones, then norm, ReLU, 3x3 conv and tanh."""

    category: ClassVar[str] = "generator"

    def __init__(
        self,
        *,
        noise_dim: int,
        num_classes: int,
        channels: int,
        widths: list[int],
        start: tuple[int, int],
        attention_at: list[int],
        reduction: int,
    ) -> None:
        super().__init__()
        self.start, self.widths = start, widths
        self.linear = nn.Linear(noise_dim, widths[0] * start[0] * start[1])
        self.blocks = nn.ModuleList(GeneratorBlock(a, b, num_classes) for a, b in zip(widths, widths[1:]))
        self.attention = nn.ModuleDict({str(i): SelfAttention2d(widths[i + 1], reduction) for i in attention_at})
        self.out_norm = nn.BatchNorm2d(widths[-1])
        self.out_conv = nn.Conv2d(widths[-1], channels, 3, padding=1)

    def forward(self, noise: Tensor, labels: Tensor, *, need_weights: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
        x = self.linear(noise).view(-1, self.widths[0], *self.start)
        maps = {}
        for i, block in enumerate(self.blocks):
            x = block(x, labels)
            if str(i) in self.attention:
                x, weights = self.attention[str(i)](x, need_weights=need_weights)
                if need_weights:
                    maps[f"block{i}"] = weights
        image = torch.tanh(self.out_conv(F.relu(self.out_norm(x))))
        return (image + 1) / 2, maps  # tanh's [-1, 1] to the data's [0, 1]


class Discriminator(nn.Module):
    """An image and a class to a score (higher: real): down-sampling blocks (the first keeps the
    size), SAGAN blocks after the chosen ones, ReLU, sum pooling and a projection head."""

    category: ClassVar[str] = "discriminator"

    def __init__(
        self, *, num_classes: int, channels: int, widths: list[int], attention_at: list[int], reduction: int
    ) -> None:
        super().__init__()
        ins = [channels, *widths[:-1]]
        self.blocks = nn.ModuleList(
            DiscriminatorBlock(a, b, down=i > 0, first=i == 0) for i, (a, b) in enumerate(zip(ins, widths))
        )
        self.attention = nn.ModuleDict({str(i): SelfAttention2d(widths[i], reduction) for i in attention_at})
        self.linear = nn.Linear(widths[-1], 1)
        self.embed = nn.Embedding(num_classes, widths[-1])

    def forward(self, image: Tensor, labels: Tensor, *, need_weights: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
        x, maps = image * 2 - 1, {}  # the data's [0, 1] to [-1, 1], as the generator's tanh
        for i, block in enumerate(self.blocks):
            x = block(x)
            if str(i) in self.attention:
                x, weights = self.attention[str(i)](x, need_weights=need_weights)
                if need_weights:
                    maps[f"block{i}"] = weights
        features = F.relu(x).sum(dim=(2, 3))  # (B, C)
        return self.linear(features).squeeze(1) + (self.embed(labels) * features).sum(1), maps


class _SpectralNorm(parametrizations._SpectralNorm):
    """torch's spectral norm (``parametrizations.spectral_norm``: the same buffers and names),
    whose power iterations do nothing on the meta device: there they compute no value, and the
    15 that start ``u`` and ``v`` took seconds of a memory check's or a skeleton's build."""

    def _power_method(self, weight_mat: Tensor, n_power_iterations: int) -> None:
        if not weight_mat.is_meta:
            super()._power_method(weight_mat, n_power_iterations)


def _spectral_norm_all(module: nn.Module) -> None:
    """Spectral normalisation (one power iteration a step, as torch's default) on every
    convolution, linear map and embedding in ``module``, but not on conditional batch norm's
    gains and biases."""
    for parent in list(module.modules()):
        if isinstance(parent, ConditionalBatchNorm2d):
            continue
        for child in parent.children():
            if isinstance(child, (nn.Conv2d, nn.Linear, nn.Embedding)):
                parametrize.register_parametrization(child, "weight", _SpectralNorm(child.weight))


class SaganGan(ZooModel):
    """The generator and discriminator of a class-conditional SAGAN.

    What a generation task uses: :meth:`sample` (images for given classes), :meth:`discriminate`,
    :meth:`adversarial_loss` for each of the two :meth:`phases`, and ``forward`` (the generator,
    with its attention maps when asked).
    """

    def __init__(
        self,
        *,
        generator: Generator,
        discriminator: Discriminator,
        noise_dim: int,
        channels: int,
        image_size: tuple[int, int],
        num_classes: int,
        generator_lr_scale: float,
        betas: tuple[float, float],
    ) -> None:
        super().__init__()
        self.generator, self.discriminator = generator, discriminator
        self.noise_dim, self.channels, self.image_size, self.num_classes = noise_dim, channels, image_size, num_classes
        self.generator_lr_scale, self.betas = generator_lr_scale, betas

    def phases(self) -> list[Phase]:
        """A discriminator step, then a generator step: Adam without weight decay, two time-scales."""
        return [
            Phase("discriminator", tuple(self.discriminator.parameters()), 1.0, self.betas, 0.0),
            Phase("generator", tuple(self.generator.parameters()), self.generator_lr_scale, self.betas, 0.0),
        ]

    def _check_labels(self, labels: Tensor) -> None:
        check_tensor(labels, "labels", "of class ids, of shape (batch,) and dtype long")
        check_not_empty(labels, "labels", "label")
        if labels.dim() != 1 or labels.dtype != torch.long:
            raise ValueError(
                f"labels must be class ids of shape (batch,) and dtype long, got {tuple(labels.shape)} {labels.dtype}"
            )
        if torch.compiler.is_compiling():  # reading values would break a compiled or exported graph
            return
        if labels.numel() and not 0 <= int(labels.min()) <= int(labels.max()) < self.num_classes:
            raise ValueError(f"labels must be classes 0 to {self.num_classes - 1}, got {labels.tolist()}")

    @property
    def _dtype(self) -> torch.dtype:
        """The dtype inputs must have (outside autocast): the parameters'."""
        return next(self.parameters()).dtype

    def noise(self, batch: int, generator: torch.Generator | None = None) -> Tensor:
        """Standard normal noise ``(batch, noise_dim)``, drawn on the CPU from ``generator``, on the
        model's device and in its dtype."""
        parameter = next(self.parameters())
        return torch.randn(batch, self.noise_dim, generator=generator).to(parameter.device, parameter.dtype)

    def forward(self, label: Tensor, *, noise: Tensor | None = None, need_weights: bool = False) -> ModelOutput:
        """Generate one image per ``label`` ``(B,)``. ``logits`` are the images ``(B, C, H, W)``
        in [0, 1]; with ``need_weights``, ``attentions["generator-block{i}"]`` holds the weights
        ``(B, 1, h*w, h*w)`` of the SAGAN block after block ``i``, over its feature map."""
        self._check_labels(label)
        batch = label.size(0)  # not len(label), which would fix the batch size of an exported program
        noise = self.noise(batch) if noise is None else noise
        check_tensor(noise, "noise", f"of shape (batch, {self.noise_dim})")
        if noise.shape != (batch, self.noise_dim):
            raise ValueError(f"noise must be (batch, {self.noise_dim}) for {batch} labels, got {tuple(noise.shape)}")
        check_float_dtype(noise, "noise", self._dtype)
        images, maps = self.generator(noise, label, need_weights=need_weights)
        return ModelOutput(
            logits=images,
            hidden=noise[:, None],
            attentions={f"generator-{name}": [{"self": w[:, None]}] for name, w in maps.items()},
        )

    def sample(self, labels: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Images ``(B, C, H, W)`` in [0, 1] of the classes ``labels``, from noise drawn by ``generator``."""
        return self(labels, noise=self.noise(len(labels), generator)).logits

    def discriminate(self, images: Tensor, labels: Tensor, *, need_weights: bool = False) -> tuple[Tensor, dict]:
        """Scores ``(B,)`` (higher: real) and, with ``need_weights``, the discriminator's attention
        weights ``(B, h*w, h*w)`` by block. Pixel values are not checked: a NaN pixel makes its
        image's score NaN (and, in training, a NaN loss, which stops the run)."""
        check_image(images, self.channels, self.image_size, dtype=self._dtype)
        self._check_labels(labels)
        if labels.size(0) != images.size(0):
            raise ValueError(f"expected one label per image, got {labels.size(0)} labels for {images.size(0)} images")
        return self.discriminator(images, labels, need_weights=need_weights)

    def adversarial_loss(self, images: Tensor, labels: Tensor, phase: str) -> Tensor:
        """The hinge loss of ``phase`` on a batch of real ``images`` of classes ``labels``; the
        fakes are of the same classes."""
        if phase == "discriminator":
            with torch.no_grad():
                fake = self(labels).logits
            real_score, _ = self.discriminate(images, labels)
            fake_score, _ = self.discriminate(fake, labels)
            return F.relu(1 - real_score).mean() + F.relu(1 + fake_score).mean()
        if phase == "generator":
            return -self.discriminate(self(labels).logits, labels)[0].mean()
        raise ValueError(f"a GAN trains in phases 'discriminator' and 'generator', not {phase!r}")


Beta = Annotated[float, Field(ge=0.0, lt=1.0)]
"""One of Adam's betas: a decay rate in [0, 1)."""


class SaganGanConfig(ImageConfig):
    """A class-conditional SAGAN: residual generator and projection discriminator, spectral norm,
    hinge loss, SAGAN blocks in both. Train with ``lr`` 4e-4 (the discriminator's; the
    generator's is ``generator_lr_scale`` times it), no warm-up and a constant schedule."""

    objective: ClassVar[str] = "image-generation"

    variant: str = Field("sagan-gan", description="the registered variant this config started from")
    noise_dim: int = Field(32, ge=1, le=MAX_WIDTH, description="size of the generator's noise vector z")
    generator_widths: list[Width] = Field(
        [64, 64, 32], min_length=2, description="channels from the smallest feature map up; each block doubles the size"
    )
    discriminator_widths: list[Width] = Field(
        [32, 64, 64], min_length=2, description="channels of each block; the first keeps the size, the others halve it"
    )
    generator_attention: list[int] = Field(
        [1], description="generator blocks followed by a SAGAN block (0 is the first)"
    )
    discriminator_attention: list[int] = Field(
        [0], description="discriminator blocks followed by a SAGAN block (0 is the first)"
    )
    reduction: int = Field(
        8, ge=1, le=MAX_WIDTH, description="query/key/value channels are width / reduction (8 in the paper)"
    )
    generator_lr_scale: float = Field(0.25, gt=0, description="the generator's learning rate over the discriminator's")
    betas: tuple[Beta, Beta] = Field((0.0, 0.9), description="Adam's betas for both networks, each in [0, 1)")

    @property
    def start(self) -> tuple[int, int]:
        scale = 2 ** (len(self.generator_widths) - 1)
        return self.image_size[0] // scale, self.image_size[1] // scale

    @model_validator(mode="after")
    def _check(self) -> SaganGanConfig:
        scale = 2 ** (len(self.generator_widths) - 1)
        if self.image_size[0] % scale or self.image_size[1] % scale:
            blocks = len(self.generator_widths) - 1
            raise ValueError(
                f"the generator's {blocks} blocks double the size {blocks} times, so image_size must be a "
                f"multiple of {scale} on each side, got {list(self.image_size)}; use fewer generator_widths"
            )
        down = 2 ** (len(self.discriminator_widths) - 1)
        if self.image_size[0] % down or self.image_size[1] % down:
            blocks = len(self.discriminator_widths) - 1
            raise ValueError(
                f"the discriminator's blocks after the first halve the size {blocks} times, so image_size "
                f"must be a multiple of {down} on each side, got {list(self.image_size)}; "
                "use fewer discriminator_widths"
            )
        for name, widths, offset in (
            ("generator", self.generator_widths, 1),
            ("discriminator", self.discriminator_widths, 0),
        ):
            blocks = len(widths) - offset
            at = getattr(self, f"{name}_attention")
            bad = [i for i in at if not 0 <= i < blocks]
            if bad:
                raise ValueError(f"{name}_attention {bad} names no block; the {name}'s blocks are 0..{blocks - 1}")
            for i in at:
                if widths[i + offset] % self.reduction:
                    raise ValueError(
                        f"reduction={self.reduction} does not divide the width {widths[i + offset]} of {name} block {i}"
                    )
        return self

    def build(self) -> SaganGan:
        generator = Generator(
            noise_dim=self.noise_dim,
            num_classes=self.num_classes,
            channels=self.channels,
            widths=self.generator_widths,
            start=self.start,
            attention_at=self.generator_attention,
            reduction=self.reduction,
        )
        discriminator = Discriminator(
            num_classes=self.num_classes,
            channels=self.channels,
            widths=self.discriminator_widths,
            attention_at=self.discriminator_attention,
            reduction=self.reduction,
        )
        _spectral_norm_all(generator)
        _spectral_norm_all(discriminator)
        return SaganGan(
            generator=generator,
            discriminator=discriminator,
            noise_dim=self.noise_dim,
            channels=self.channels,
            image_size=tuple(self.image_size),
            num_classes=self.num_classes,
            generator_lr_scale=self.generator_lr_scale,
            betas=tuple(self.betas),
        )
