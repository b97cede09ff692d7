"""Checks on what a model is called with: a ValueError that says what was expected, rather than
an error from deep inside PyTorch (``'list' object has no attribute 'dim'``, ``Expected tensor
for argument #1 'indices' to have one of the following scalar types``, ``cannot reshape tensor
of 0 elements``).

Type, dtype and shape are read from the tensor's metadata, which costs nothing on any device.
Only :func:`check_token_ids` with a ``vocab_size`` reads values (the smallest and largest id),
once per call, where the ids enter an embedding.

Values are not checked beyond that: a NaN or infinite pixel is passed on as PyTorch's layers
pass it, so the outputs it reaches are NaN (finding it would cost a device sync on every
forward; training stops on a non-finite loss).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .errors import InputTypeError

PAD, BOS, EOS = 0, 1, 2
"""The token ids every built-in task gives padding, the start of a sequence and its end."""
CLS = BOS  # classification tasks start each sequence with this id; the head pools it

ID_DTYPES = (torch.int64, torch.int32)  # what nn.Embedding indexes with
AUTOCAST_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what autocast casts


def check_tensor(value: object, name: str, expected: str) -> None:
    """Raise an :class:`InputTypeError` (a ValueError too) unless ``value`` is a tensor; ``expected`` describes it
    (``"of shape (batch, seq)"``)."""
    if not isinstance(value, Tensor):
        kind, module = type(value).__qualname__, type(value).__module__
        hint = ""
        if isinstance(value, (list, tuple)) or module.split(".")[0] == "numpy":
            hint = " (convert it with torch.as_tensor)"
        raise InputTypeError(
            f"{name} must be a torch.Tensor {expected}, got "
            f"{kind if module == 'builtins' else f'{module}.{kind}'}{hint}"
        )


def check_not_empty(value: Tensor, name: str, what: str = "example") -> None:
    """Raise a ValueError if ``value``'s first (batch) dimension is 0."""
    if value.dim() and value.size(0) == 0:
        raise ValueError(f"{name}: an empty batch (shape {tuple(value.shape)}); give at least one {what}")


def check_float_dtype(value: Tensor, name: str, dtype: torch.dtype | None) -> None:
    """Raise a ValueError unless ``value`` has the model's floating ``dtype``; under autocast,
    which casts float32, float16 and bfloat16 inputs itself (never float64), any of those."""
    if dtype is None or value.dtype == dtype:
        return
    if value.dtype in AUTOCAST_DTYPES and torch.is_autocast_enabled(value.device.type):
        return
    raise ValueError(
        f"{name} must have the model's dtype {dtype}, got {value.dtype}; convert with .to({dtype})"
        + ("" if value.dtype == torch.float64 else ", or run under torch.autocast")
    )


def check_token_ids(ids: object, vocab_size: int | None = None, name: str = "token ids") -> None:
    """Raise a ValueError unless ``ids`` is a non-empty ``(batch, seq)`` tensor of ``torch.long``
    (or ``int32``) ids, and, given ``vocab_size``, each in ``[0, vocab_size)``."""
    check_tensor(ids, name, "of shape (batch, seq) and dtype torch.long")
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, seq), got shape {tuple(ids.shape)}")
    check_not_empty(ids, name, "sequence")
    if ids.size(1) == 0:
        raise ValueError(
            f"the sequences of {name} are empty (shape {tuple(ids.shape)}); give at least one token per sequence"
        )
    if ids.dtype not in ID_DTYPES:
        raise ValueError(
            f"{name} must be integers of dtype torch.long (or torch.int32), got {ids.dtype}; convert with .long()"
        )
    # a compiled graph cannot read values, nor can a step being captured as a CUDA graph (its ids are
    # the model's own argmax), and a meta tensor (shapes alone) has none
    if (
        vocab_size is not None
        and not torch.compiler.is_compiling()
        and ids.device.type != "meta"
        and not (ids.is_cuda and torch.cuda.is_current_stream_capturing())
    ):
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(
                f"{name} contain {bad}, outside the vocabulary; ids must lie in [0, {vocab_size - 1}] "
                f"(vocab_size={vocab_size})"
            )


def check_image(
    image: object,
    channels: int,
    size: tuple[int, int] | None = None,
    *,
    dtype: torch.dtype | None = None,
    name: str = "images",
) -> None:
    """Raise a ValueError naming what was expected unless ``image`` is a non-empty float tensor
    ``(B, channels, H, W)``, with ``(H, W) == size`` and the model's ``dtype`` when given.

    Pixel values are not read: a NaN pixel propagates to the outputs it reaches.
    """
    expected = f"(batch, {channels}, {size[0]}, {size[1]})" if size else f"(batch, {channels}, height, width)"
    check_tensor(image, name, f"of shape {expected}")
    if image.dim() != 4 or image.size(1) != channels or (size is not None and tuple(image.shape[-2:]) != tuple(size)):
        raise ValueError(f"expected {name} of shape {expected}, got {tuple(image.shape)}")
    check_not_empty(image, name, "image")
    if not image.is_floating_point():
        raise ValueError(f"expected float {name} (pixel values, for example in [0, 1]), got {image.dtype}")
    check_float_dtype(image, name, dtype)


def check_count(value: object, name: str, minimum: int) -> None:
    """Raise a ValueError unless ``value`` is an integer (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer of at least {minimum}, got {value!r}")
