"""Digits generation: draw 8x8 digits of a given class, scored by a fixed digits classifier.

The model learns from the ``digits`` task's training images and labels. It is scored on the
test split's labels: one sample per test image, of that image's class, from seeded noise.

- ``classifier_accuracy``: the share of samples that the fixed classifier assigns to the class
  asked for (class-conditional accuracy).
- ``frechet_distance`` (the headline, lower is better): the Frechet distance between Gaussians
  fitted to the classifier's 64 penultimate features of the real test images and of the
  samples. This is FID (Heusel et al. 2017), with a digits classifier in place of Inception.

The classifier (:class:`DigitsClassifier`) was trained once on the ``digits`` training split
by :func:`train_digits_classifier`. Its weights ship with the package (``digits_classifier.safetensors``),
so every model is scored by the same network; ``python -m transformer_zoo.plugins.tasks.digits_generation``
trains it again.

The baselines are the same scores for real digits: the classifier's accuracy on the test images
(which it never saw), and the Frechet distance of as many real training images, of the same
classes, from the test images. A generator can score higher accuracy than real digits by drawing
only clear, typical ones; the Frechet distance also counts how varied the samples are.

A model for this task (``objective = "image-generation"``, such as ``sagan-gan``) provides
``phases()``, ``adversarial_loss(images, labels, phase)``, ``sample(labels, generator)``, and a
``forward(label)`` that returns the images as ``logits``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import safetensors.torch
import torch
import torch.nn.functional as F
from pydantic import field_validator
from torch import Tensor, nn

from transformer_zoo.core.tasks import Better, Task, TaskOptions, objective_reason

from .digits import DigitsOptions

if TYPE_CHECKING:
    import datasets

CLASSIFIER_WEIGHTS = Path(__file__).with_name("digits_classifier.safetensors")
SAMPLE_SEED = 0  # noise of the scored samples and of the sample grid


class DigitsClassifier(nn.Module):
    """The scoring network: three 3x3 convolutions (16, 32, 64 channels; 2x2 max pooling after
    the second), global average pooling to 64 features, and a linear layer to 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(64, 10)

    def features(self, images: Tensor) -> Tensor:
        """``(B, 1, 8, 8)`` images in [0, 1] to ``(B, 64)`` features."""
        return self.body(images)

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.features(images))


def train_digits_classifier(seed: int = 0, steps: int = 2000, batch_size: int = 64) -> DigitsClassifier:
    """Train :class:`DigitsClassifier` on the ``digits`` training split (AdamW, lr 2e-3, cosine)."""
    torch.manual_seed(seed)
    data = DigitsOptions().build().dataset("train").with_format("torch")[:]
    images, labels = data["image"], data["label"]
    model = DigitsClassifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        index = torch.randint(len(labels), (batch_size,), generator=generator)
        loss = F.cross_entropy(model(images[index]), labels[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return model.eval()


@functools.cache
def digits_classifier() -> DigitsClassifier:
    """The fixed scoring classifier, in eval mode, with the shipped weights."""
    model = DigitsClassifier()
    safetensors.torch.load_model(model, str(CLASSIFIER_WEIGHTS))
    return model.eval().requires_grad_(False)


def frechet_distance(a: Tensor, b: Tensor) -> float:
    """Frechet distance between Gaussians fitted to the rows of ``a`` and ``b`` ``(N, D)``:
    ``|mu_a - mu_b|^2 + tr(S_a + S_b - 2 (S_a S_b)^(1/2))``."""
    a, b = a.double().numpy(), b.double().numpy()
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    # tr((S_a S_b)^(1/2)) is the sum of the square roots of S_a S_b's eigenvalues, which are real
    # and non-negative (a product of covariances); this holds for singular ones too, where sqrtm fails
    eigenvalues = np.linalg.eigvals(cov_a @ cov_b).real.clip(min=0)
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a) + np.trace(cov_b) - 2 * np.sqrt(eigenvalues).sum())


@torch.no_grad()
def score_images(images: Tensor, labels: Tensor, real: Tensor) -> dict[str, float]:
    """The task's scores of ``images`` meant to be of classes ``labels``, against ``real`` images."""
    classifier = digits_classifier()
    features = classifier.features(images.float().cpu())
    return {
        "classifier_accuracy": _accuracy(classifier.head(features), labels),
        "frechet_distance": frechet_distance(features, classifier.features(real)),
    }


def _accuracy(logits: Tensor, labels: Tensor) -> float:
    return float((logits.argmax(-1) == labels.cpu()).float().mean())


class DigitsGenerationOptions(TaskOptions):
    """Generate 8x8 digits of a given class; scored by a fixed classifier (accuracy, Frechet distance)."""

    kind: Literal["digits-generation"] = "digits-generation"

    @field_validator("seed")
    @classmethod
    def _default_split(cls, seed: int) -> int:
        if seed != 0:
            raise ValueError(
                "digits-generation uses the digits split of seed 0, on whose training images its scoring "
                "classifier was trained (another split would show it test images); leave seed at 0"
            )
        return seed

    def build(self) -> DigitsGenerationTask:
        return DigitsGenerationTask(self)


class DigitsGenerationTask(Task):
    """The digits images and labels, for class-conditional image generators."""

    inputs: ClassVar[frozenset[str]] = frozenset({"image"})
    objective: ClassVar[str] = "image-generation"
    metrics: ClassVar[dict[str, Better]] = {"frechet_distance": "lower", "classifier_accuracy": "higher"}
    bounds: ClassVar[dict[str, tuple[float, float]]] = {"classifier_accuracy": (0.0, 1.0)}
    baseline: ClassVar[str] = "Real digits (the classifier on the test images; training images against them)"
    splits: ClassVar[tuple[str, ...]] = ("train", "test")
    num_classes = 10

    def __init__(self, options: DigitsGenerationOptions) -> None:
        self.options = options
        self.digits = DigitsOptions().build()

    def dataset(self, split: str) -> datasets.Dataset:
        return self.digits.dataset(split)

    def unfit_reason(self, config: Any) -> str | None:
        if super().unfit_reason(config):
            return "digits-generation needs an image generator, such as sagan-gan"
        return objective_reason(config, self.objective)

    def model_overrides(self, config: Any) -> dict[str, Any]:
        return self.digits.model_overrides(config)  # the image size, channels and classes of digits

    def collate(self, rows: list[dict[str, Any]]) -> dict[str, Tensor]:
        return {
            "image": torch.tensor([r["image"] for r in rows], dtype=torch.float32),
            "label": torch.tensor([r["label"] for r in rows]),
        }

    def model_inputs(self, model: nn.Module, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        return {"label": batch["label"]}  # a generator draws images of these classes

    def loss(self, model: nn.Module, batch: dict[str, Tensor], phase: str = "model") -> Tensor:
        return model.adversarial_loss(batch["image"], batch["label"], phase)

    def tokens_in(self, batch: dict[str, Tensor]) -> int:
        return int(batch["image"][:, 0].numel())  # pixels of the real images

    def _real(self, split: str) -> tuple[Tensor, Tensor]:
        data = self.dataset(split).with_format("torch")[:]
        return data["image"], data["label"]

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, batch_size: int = 256) -> dict[str, float]:
        """One sample per ``split`` image, of its class, scored against the real images."""
        real, labels = self._real(split)
        return score_images(self._samples(model, labels, batch_size), labels, real)

    @staticmethod
    @torch.no_grad()
    def _samples(model: nn.Module, labels: Tensor, batch_size: int = 256) -> Tensor:
        """Images of classes ``labels`` on the CPU, in eval mode, from the scoring noise."""
        was_training = model.training
        model.eval()
        generator = torch.Generator().manual_seed(SAMPLE_SEED)
        device = next(model.parameters()).device
        samples = torch.cat(
            [
                model.sample(labels[i : i + batch_size].to(device), generator).float().cpu()
                for i in range(0, len(labels), batch_size)
            ]
        )
        model.train(was_training)
        return samples

    def baselines(self, split: str) -> dict[str, float]:
        """Real digits' scores: the classifier's accuracy on the ``split`` images, and the Frechet
        distance of as many training images, of the same classes, from them."""
        real, labels = self._real(split)
        train, train_labels = self._real("train")
        rng = np.random.default_rng(SAMPLE_SEED)
        index = torch.tensor([rng.choice(np.flatnonzero(train_labels.numpy() == y)) for y in labels.tolist()])
        with torch.no_grad():
            accuracy = _accuracy(digits_classifier()(real), labels)
        return {
            "classifier_accuracy": accuracy,
            "frechet_distance": score_images(train[index], labels, real)["frechet_distance"],
        }

    def example_inputs(self, model: nn.Module, row: dict[str, Any]) -> dict[str, Tensor]:
        return {"label": torch.tensor([row["label"]], device=next(model.parameters()).device)}

    @torch.no_grad()
    def plot_samples(self, model: nn.Module, path: Path, per_class: int = 8) -> Path:
        """A grid of samples, a row per class, from the scoring noise; written to ``path`` (PNG)."""
        import matplotlib.pyplot as plt

        images = self._samples(model, torch.arange(self.num_classes).repeat_interleave(per_class))
        grid = images[:, 0].view(self.num_classes, per_class, *images.shape[-2:])  # (classes, per class, H, W)
        grid = F.pad(grid, (1, 1, 1, 1), value=1.0).permute(0, 2, 1, 3).flatten(2).flatten(0, 1)
        fig, ax = plt.subplots(figsize=(per_class * 0.55, self.num_classes * 0.55))
        ax.imshow(grid.numpy(), cmap="gray_r", vmin=0.0, vmax=1.0)
        ax.set_yticks(
            [(grid.shape[0] / self.num_classes) * (i + 0.5) for i in range(self.num_classes)],
            [str(i) for i in range(self.num_classes)],
            fontsize=7,
        )
        ax.set_xticks([])
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


if __name__ == "__main__":  # retrain the shipped classifier
    classifier = train_digits_classifier()
    test = DigitsOptions().build().dataset("test").with_format("torch")[:]
    accuracy = (classifier(test["image"]).argmax(-1) == test["label"]).float().mean()
    safetensors.torch.save_model(classifier, str(CLASSIFIER_WEIGHTS))
    print(f"test accuracy {accuracy:.4f}; weights written to {CLASSIFIER_WEIGHTS}")
