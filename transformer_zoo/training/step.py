"""A training step: a trainer's stepper, and what a step costs.

:class:`Stepper` holds the model being trained and what one step needs: each phase's
optimizers (AdamW, or Muon for the hidden matrices and AdamW for the rest: :func:`phase_optimizers`)
and their learning-rate schedules, the batch of a step (drawn by a generator seeded from (seed,
step), so a run resumed from step k sees exactly the batches an uninterrupted run sees), each
phase's loss, backward, clipping and optimizer steps, and the check that stops a run whose loss
is no longer finite. :meth:`Stepper.counted_step` takes a step under PyTorch's FLOP counter;
:func:`flop_rates` turns the count into the summary's rates and utilisation.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.flop_counter import FlopCounterMode

from ..core.errors import ZooError
from ..core.tasks import Phase
from .config import TrainConfig, lr_factor
from .placement import Placement


class TrainingDiverged(ZooError, RuntimeError):
    """A loss, weight or optimizer state became NaN or infinite. Nothing non-finite is saved:
    the message says which checkpoint the run folder keeps (if any) and what to try."""


def fused_adamw(device: torch.device, sharded: bool = False) -> bool:
    """Whether AdamW takes its fused kernel: on CUDA, where it updates every parameter in a few
    launches instead of a dozen per parameter group (a bert-base step spent 4% of its time in the
    unfused update); not over FSDP's sharded parameters."""
    return device.type == "cuda" and not sharded


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The parameters Muon trains under ``optimizer: muon``: the hidden layers' matrices.

    Muon is for the 2-D weights of the hidden layers, and AdamW for the rest: the embeddings,
    the output head, and every scalar and vector parameter (Jordan et al. 2024, "Muon: An
    optimizer for hidden layers in neural networks", https://kellerjordan.github.io/posts/muon/;
    Liu et al. 2025, "Muon is Scalable for LLM Training", arXiv 2502.16982). Here the hidden
    matrices are the weight of every ``nn.Linear`` inside the model's stacks: the modules whose
    ``category`` is ``stack`` (every module a stack kind builds carries it: the encoder and the
    decoder of :class:`~transformer_zoo.core.model.EncoderDecoder`, an image encoder's, a
    recurrent stack with its shared layer). That takes the attention projections, the feed-forward
    and expert matrices and a mixture's router, in the model's order, each once (a layer shared by
    two stacks too); a map to or from one number (adaptive computation time's halting unit) is a
    vector, not a matrix, and stays AdamW's, as a head's would. A fused projection (queries, keys
    and values in one ``in_proj``; a gated feed-forward's ``gate_up``) is orthogonalised whole, as
    ``torch.optim.Muon`` takes a parameter: modded-nanogpt splits queries, keys and values.

    Everything else is AdamW's: the token and positional embeddings and the head, which lie
    outside the stacks (a tied head is the embedding table), norms' gains, biases, scalars, and
    the matrices a stack holds other than as a linear map's weight (relative-position tables,
    talking heads' mixing, Linformer's projections along the sequence), as is a weight under a
    parametrisation (spectral normalisation). A model without stacks (the convolutional SAGAN
    models) has none: it trains with AdamW alone.
    """
    found: dict[int, nn.Parameter] = {}
    for stack in (module for module in model.modules() if getattr(module, "category", None) == "stack"):
        for module in stack.modules():
            weight = getattr(module, "weight", None) if isinstance(module, nn.Linear) else None
            if isinstance(weight, nn.Parameter) and weight.dim() == 2 and min(weight.shape) > 1:
                found.setdefault(id(weight), weight)
    return list(found.values())


def muon_name(phase: str) -> str:
    """The name of ``phase``'s Muon optimizer (and its schedule) under ``optimizer: muon``; the
    phase's AdamW keeps the phase's own name."""
    return f"{phase}.muon"


def phase_parts(phase: Phase, hidden: set[int], optimizer: str) -> dict[str, list[nn.Parameter]]:
    """The optimizers that step ``phase``, by name, each with its parameters in the phase's order:
    with ``adamw``, one (the phase's name) over them all; with ``muon``, :func:`muon_name` over
    the phase's parameters whose ids are in ``hidden``, and the phase's name over the rest, either
    left out when it would have none."""
    if optimizer == "adamw":
        return {phase.name: list(phase.parameters)}
    parts = {
        phase.name: [p for p in phase.parameters if id(p) not in hidden],
        muon_name(phase.name): [p for p in phase.parameters if id(p) in hidden],
    }
    return {name: parameters for name, parameters in parts.items() if parameters}


def optimized_parameters(model: nn.Module, config: TrainConfig) -> dict[str, list[nn.Parameter]]:
    """Every optimizer's parameters, by name, in the order the optimizer holds them
    (:func:`phase_parts` of each phase): what a checkpoint's optimizer states must fit."""
    hidden = {id(p) for p in hidden_matrices(model)} if config.optimizer == "muon" else set()
    return {
        name: parameters
        for phase in model.phases()
        for name, parameters in phase_parts(phase, hidden, config.optimizer).items()
    }


def phase_optimizers(model, config: TrainConfig, fused: bool = False) -> tuple[list, dict, dict]:
    """The model's phases, and their optimizers and learning-rate schedules, by name (see
    :func:`phase_parts`): each phase's AdamW (``fused``: its fused kernel) under the phase's name,
    and with ``optimizer: muon`` its Muon over its :func:`hidden_matrices` under :func:`muon_name`.

    Every optimizer takes the phase's learning rate (``lr`` times its ``lr_scale``) and weight
    decay, and follows the same schedule. Muon keeps torch's momentum (0.95, Nesterov) and
    scales each matrix's step by ``0.2 * sqrt(max(rows, columns))``, which gives its update the
    root-mean-square of AdamW's, so that one learning rate and weight decay serve both
    (``adjust_lr_fn="match_rms_adamw"``, from Liu et al. 2025, "Muon is Scalable for LLM
    Training", arXiv 2502.16982).

    Raises:
        ValueError: the phases are unnamed, named twice, or do not train every trainable
            parameter exactly once.
    """
    phases = model.phases()
    names = [phase.name for phase in phases]
    if len(set(names)) != len(names) or not phases:
        raise ValueError(f"{type(model).__name__}.phases() must name one or more phases, each once; got {names}")
    trained = [id(p) for phase in phases for p in phase.parameters if p.requires_grad]
    if len(set(trained)) != len(trained) or set(trained) != {id(p) for p in model.parameters() if p.requires_grad}:
        raise ValueError(
            f"{type(model).__name__}.phases() {names} must train every trainable parameter of the model "
            "exactly once: one phase's parameters may not be in another, and none may be left out"
        )
    hidden = {id(p) for p in hidden_matrices(model)} if config.optimizer == "muon" else set()
    optimizers, schedulers = {}, {}
    for phase in phases:
        lr = config.lr * phase.lr_scale
        decay = config.weight_decay if phase.weight_decay is None else phase.weight_decay
        for name, parameters in phase_parts(phase, hidden, config.optimizer).items():
            if name == phase.name:
                settings = ({} if phase.betas is None else {"betas": phase.betas}) | ({"fused": True} if fused else {})
                optimizers[name] = torch.optim.AdamW(parameters, lr=lr, weight_decay=decay, **settings)
            else:
                optimizers[name] = torch.optim.Muon(
                    parameters, lr=lr, weight_decay=decay, adjust_lr_fn="match_rms_adamw"
                )
            schedulers[name] = LambdaLR(optimizers[name], lambda step: lr_factor(step, config))
    return phases, optimizers, schedulers


@contextlib.contextmanager
def trains_only(parameters, model) -> Iterator[None]:
    """Freeze every parameter of ``model`` but ``parameters`` (no gradient is computed for them)."""
    keep = {id(p) for p in parameters}
    frozen = [p for p in model.parameters() if p.requires_grad and id(p) not in keep]
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(True)


class Stepper:
    """The steps of one model on one task: batches, losses and optimizer steps.

    Attributes:
        model: the model trained (sharded in place under ``parallel: fsdp``).
        phases: the model's training phases, stepped in turn on every batch.
        optimizers, schedulers: the optimizers and their learning-rate schedules, by name: each
            phase's AdamW under the phase's name, and its Muon under :func:`muon_name` with
            ``optimizer: muon`` (:func:`phase_optimizers`).
        stepped: the names of each phase's optimizers, by phase name.
        bf16: whether the forward runs under bfloat16 autocast (asked for, and on CUDA).
        grad_norms: each phase's gradient norm (before clipping) at the last step the curve
            records (at every step with clipping), a tensor.
    """

    def __init__(
        self, config: TrainConfig, task: Any, model: torch.nn.Module, placement: Placement | None = None
    ) -> None:
        """Train ``model`` (on ``placement.home``, in train mode) from here: spread over the
        processes (:meth:`~transformer_zoo.training.placement.Placement.distribute`), with each
        phase's optimizer and schedule, and its loss compiled with ``compile: true``.

        Args:
            placement: the device and processes; None: ``config.device`` in this process alone.
        """
        self.config, self.task, self.model = config, task, model
        self.placement = Placement(config.device) if placement is None else placement
        self.bf16 = config.bf16 and self.placement.device.type == "cuda"
        self._replica = self.placement.distribute(model)  # what the loss calls: the model, or DDP's replica of it
        self.phases, self.optimizers, self.schedulers = phase_optimizers(
            model, config, fused_adamw(self.placement.device, self.placement.sharded)
        )
        self.stepped = {
            phase.name: [name for name in (phase.name, muon_name(phase.name)) if name in self.optimizers]
            for phase in self.phases
        }
        self.grad_norms: dict[str, torch.Tensor] = {}  # each phase's gradient norm at its last step, before clipping
        # compiled, the task's loss is one graph with the model: the float32 cross-entropy over the vocabulary fuses
        # with the logits' cast (a compiled bf16 step of bert-base took 17% less time than with the loss left eager)
        self._trained_loss = torch.compile(self.eager_loss) if config.compile else self.eager_loss

    @functools.cached_property
    def train_data(self):
        """The task's training split."""
        return self.task.dataset("train")

    def step_seed(self, step: int) -> int:
        """The seed of step ``step``'s batch: the same whatever ran before it, so resuming is exact."""
        return (self.config.seed * 1_000_003 + step) % 2**64  # the generator's range; smaller seeds are unchanged

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        """Step ``step``'s batch, on the device: ``batch_size`` examples drawn by a generator
        seeded from (seed, step); under torchrun, this process's rows of that global batch
        (every process draws the same one, masking included), and dropout seeded per process."""
        here = self.placement.here
        if here.launched:
            torch.manual_seed(self.step_seed(step))
        generator = torch.Generator().manual_seed(self.step_seed(step))
        index = torch.randint(len(self.train_data), (self.config.batch_size,), generator=generator).tolist()
        rows = self.train_data[index]
        batch = self.placement.shard(self.task.collate([dict(zip(rows, values)) for values in zip(*rows.values())]))
        if here.launched:
            torch.manual_seed((self.step_seed(step) * 1009 + 1 + here.rank) % 2**64)
        return batch

    def eager_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The loss of a one-phase model on ``batch``, as the task computes it (through DDP's replica)."""
        # a task written before phases existed takes (model, batch)
        return self.task.loss(self._replica, batch)

    def loss(self, phase: str, batch: dict[str, torch.Tensor], *, eager: bool = False) -> torch.Tensor:
        """``phase``'s loss on ``batch``; a one-phase model's through the compiled graph with
        ``compile: true``, unless ``eager``."""
        if len(self.phases) > 1:
            return self.task.loss(self.model, batch, phase)
        return self.eager_loss(batch) if eager else self._trained_loss(batch)

    def step(
        self,
        step: int,
        batch: dict[str, torch.Tensor] | None = None,
        *,
        eager: bool = False,
        flops: list[int] | None = None,
    ) -> dict[str, float]:
        """One optimizer step of every phase in turn, each with the others frozen, on ``batch``
        (None: :meth:`batch` of ``step``); returns each phase's loss. Given a list ``flops``, each
        phase's forward and backward passes run under PyTorch's FLOP counter, which appends
        their FLOPs to it (the optimizer's update, which has no matrix products, runs outside it:
        under the counter's dispatch it took as long as the passes).

        Raises:
            TrainingDiverged: a loss was not finite (in any process); the message says which.
        """
        batch = self.batch(step) if batch is None else batch
        losses = {}
        for phase in self.phases:
            alone = trains_only(phase.parameters, self.model) if len(self.phases) > 1 else contextlib.nullcontext()
            with alone:
                with _counting(flops):
                    with torch.autocast(self.placement.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                        loss = self.loss(phase.name, batch, eager=eager)
                    self.check_finite(loss, phase.name, step)
                    for name in self.stepped[phase.name]:
                        self.optimizers[name].zero_grad(set_to_none=True)
                    loss.backward()
                if self.config.grad_clip is not None:
                    self.grad_norms[phase.name] = torch.nn.utils.clip_grad_norm_(
                        phase.parameters, self.config.grad_clip
                    ).detach()
                elif self.logged(step):  # unclipped: the norm is computed only where the curve records it
                    self.grad_norms[phase.name] = torch.nn.utils.get_total_norm(
                        [p.grad for p in phase.parameters if p.grad is not None]
                    ).detach()
                for name in self.stepped[phase.name]:
                    self.optimizers[name].step()
                    self.schedulers[name].step()
            losses[phase.name] = loss.item()
        return losses

    def logged(self, step: int) -> bool:
        """Whether the learning curve records step ``step`` (counted from 0)."""
        return (step + 1) % self.config.log_every == 0 or step + 1 == self.config.steps

    def lr(self, phase: str) -> float:
        """``phase``'s learning rate at the next step (its optimizers follow one schedule)."""
        return self.schedulers[self.stepped[phase][0]].get_last_lr()[0]

    def grad_norm(self, phase: str) -> float:
        """``phase``'s gradient norm at the last step (over every process's shards)."""
        norm = self.grad_norms[phase]
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def check_finite(self, loss: torch.Tensor, phase: str, step: int) -> None:
        """Stop every process when ``loss`` is not finite in any of them.

        Raises:
            TrainingDiverged: naming the phase, the value and the step (a trainer adds what its
                run folder keeps and what to try).
        """
        if self.placement.any_true(not torch.isfinite(loss)):
            raise TrainingDiverged(f"{phase} loss became {loss.item()} at step {step + 1}")

    def counted_step(self, step: int, batch: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, float], float]:
        """:meth:`step`, run eagerly with its forward and backward passes under PyTorch's FLOP
        counter: the losses, and the FLOPs of those passes over the global batch (every process's
        share).

        The counter's dispatch changes the last bits of some gradients (llama-tiny's backward):
        a run counts its first step only, and a resumed run takes the count from its checkpoint
        rather than count a step an uninterrupted run took uncounted.

        Eagerly, because a compiled loss first called under the counter would never compile."""
        flops: list[int] = []
        losses = self.step(step, batch, eager=True, flops=flops)
        return losses, sum(flops) * self.placement.here.size


@contextlib.contextmanager
def _counting(flops: list[int] | None) -> Iterator[None]:
    """PyTorch's FLOP counter over the block, whose count is appended to ``flops``; nothing when
    ``flops`` is None."""
    if flops is None:
        yield
        return
    with FlopCounterMode(display=False) as counter:
        yield
    flops.append(counter.get_total_flops())


# ---- what steps cost ----------------------------------------------------------------------------
PEAK_BF16_TFLOPS = {
    "H200": 989.0,
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L40": 181.0,
    "L4": 121.0,
    "A10G": 70.0,
}
"""Dense bfloat16 tensor-core peaks (no sparsity) by device name, from the vendors' data sheets;
the first key found in the device's name wins, so the more specific names come first."""


def datasheet_tflops(device: torch.device) -> float | None:
    """The dense bf16 peak of a known GPU (:data:`PEAK_BF16_TFLOPS`); None elsewhere."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def peak_tflops(config: TrainConfig, device: torch.device) -> float | None:
    """The peak MFU is measured against: ``config.peak_tflops``, else a known GPU's bf16 peak."""
    if config.peak_tflops is not None:
        return config.peak_tflops
    return datasheet_tflops(device) if config.bf16 else None


def flop_rates(
    step_flops: float | None, steps: int, seconds: float, peak: float | None, processes: int
) -> dict[str, float | None]:
    """The summary's FLOP figures: one step's FLOPs (``step_flops``, of the global batch), the
    rate over ``steps`` steps in ``seconds``, and the model FLOPs utilisation of ``processes``
    devices of ``peak`` TFLOP/s each; None where nothing was counted or no peak is known."""
    rate = step_flops * steps / max(seconds, 1e-9) if steps > 0 and step_flops is not None else None
    return {
        "train_flops_per_step": step_flops if steps > 0 else None,
        "train_tflops_per_second": None if rate is None else rate / 1e12,
        "mfu": None if rate is None or peak is None else rate / (peak * 1e12 * processes),
    }
