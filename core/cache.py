"""Key/value caches of incremental decoding: one per attention module (:class:`KVCache`, or
:class:`WindowKVCache` for a sliding window, which keeps only the keys a window sees), one per
decoder (:class:`DecoderCache`), and their static forms, whose tensors keep fixed addresses so
that a decoding step can be captured as a CUDA graph.

A cache also knows where its tokens sit: how many it has seen (:attr:`KVCache.start`), the
position of the first key it hands attention (:attr:`KVCache.key_start`), and, for a batch of
left-padded prompts, each row's padding (``left_padding``), from whose end the row's positions
count, as Hugging Face's ``generate`` counts them (``attention_mask.cumsum(-1) - 1``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from .attention import AttentionMask


class KVCache:
    """Keys and values of the tokens seen so far, for one attention module.

    Self-attention appends the new tokens' keys and values at every step; cross-attention
    stores the projected encoder memory once and reuses it. ``state`` holds whatever else a kind
    keeps between decoding steps (its ``kernel_inputs`` hook reads and writes it, by names of its
    choosing): tensors with the batch first, so that :meth:`reorder` can select their rows too.

    Args:
        in_place: :meth:`reorder` writes the selected rows into the tensors it holds rather than
            replacing them, so that their addresses stay fixed (a decoding step captured as a
            CUDA graph reads them there).
        left_padding: ``(B,)`` long, on the CPU: how many padding tokens each row starts with; a
            row's positions count from its first real token (its padding before it sits at
            position 0, never attended to). None: every row counts from its first token.
    """

    def __init__(self, *, in_place: bool = False, left_padding: Tensor | None = None) -> None:
        self.key: Tensor | None = None  # (B, H, T, Dh)
        self.value: Tensor | None = None
        self.state: dict[str, Tensor] = {}
        self.in_place = in_place
        self.left_padding = left_padding

    def __len__(self) -> int:
        return 0 if self.key is None else self.key.size(-2)

    @property
    def start(self) -> int | Tensor:
        """The position of the next token's key: the number of keys held, every key so far."""
        return len(self)

    @property
    def key_start(self) -> int | Tensor:
        """The position of the first key :meth:`append` returned: 0, every key is kept."""
        return 0

    def append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new tokens' keys and values ``(B, H, T, Dh)``; returns every key and value so far."""
        if self.key is not None:
            key = torch.cat([self.key, key], dim=-2)
            value = torch.cat([self.value, value], dim=-2)
        self.key, self.value = key, value
        return key, value

    def visible(self, mask: AttentionMask, q_len: int) -> AttentionMask:
        """The mask of a self-attention call over what :meth:`append` returned: unchanged here
        (the keys are exactly those seen so far, end-aligned with the queries)."""
        return mask

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search)."""

        def select(tensor: Tensor) -> Tensor:
            return tensor.copy_(tensor.index_select(0, index)) if self.in_place else tensor.index_select(0, index)

        if self.key is not None:
            self.key, self.value = select(self.key), select(self.value)
        self.state = {name: select(tensor) for name, tensor in self.state.items()}
        if self.left_padding is not None:
            self.left_padding = self.left_padding.index_select(0, index.to(self.left_padding.device))


class WindowKVCache(KVCache):
    """The cache of a sliding-window layer: between calls it keeps the keys and values of the
    last ``window`` tokens only, all that the next query can see (``window`` keys before it, and
    its own). A call's queries attend to those kept keys and the call's own (a prompt of many
    tokens attends within itself as it would uncached); the cache then drops the older ones, so
    its memory stays at ``window`` tokens however long the decoding runs.

    :attr:`key_start` is the position of the first key :meth:`append` returned, which rotary
    positions turn it by; :meth:`visible` takes the part of the padding mask (which covers every
    token so far) over those keys.
    """

    def __init__(self, window: int, *, in_place: bool = False, left_padding: Tensor | None = None) -> None:
        super().__init__(in_place=in_place, left_padding=left_padding)
        if window < 1:
            raise ValueError(f"a window cache keeps at least one key, got window={window}")
        self.window = window
        self.seen = 0  # tokens appended so far: more than the keys held, once some are dropped
        self.returned = 0  # keys the last append returned

    @property
    def start(self) -> int:
        return self.seen

    @property
    def key_start(self) -> int:
        return self.seen - self.returned

    def append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        self.seen += key.size(-2)
        key, value = super().append(key, value)
        self.returned = key.size(-2)
        if self.returned > self.window:
            self.key, self.value = self.key[..., -self.window :, :], self.value[..., -self.window :, :]
        return key, value

    def visible(self, mask: AttentionMask, q_len: int) -> AttentionMask:
        """``mask`` over the keys :meth:`append` returned, the last of every token so far."""
        if mask.padding is None and mask.explicit is None:
            return mask
        explicit = mask.explicit
        if explicit is not None and explicit.size(-1) > 1:
            explicit = explicit[..., -self.returned :]
        padding = None if mask.padding is None else mask.padding[:, -self.returned :]
        return AttentionMask(padding=padding, causal=mask.causal, explicit=explicit)


class StaticKVCache(KVCache):
    """Self-attention keys and values in buffers preallocated to ``capacity`` positions.

    A step writes its keys at ``position`` (a 0-d long tensor on the device, shared by the
    layers of one decoder and advanced by the model after each step) and attends over the whole
    buffer, masked to the keys written so far (:meth:`visible`). Every shape and address is the
    same at every step, so a step can be captured as a CUDA graph and replayed
    (:class:`~transformer_zoo.core.decoding.DecodeStep`). Calls take no padding mask.
    """

    def __init__(self, capacity: int, position: Tensor) -> None:
        super().__init__(in_place=True)
        self.capacity = capacity
        self.position = position

    @property
    def start(self) -> Tensor:
        return self.position

    def append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        if self.key is None:  # keys and values may differ in heads and width (a latent cache's do)
            self.key, self.value = (t.new_zeros((*t.shape[:2], self.capacity, t.size(-1))) for t in (key, value))
        index = self.position + torch.arange(key.size(-2), device=key.device)
        self.key.index_copy_(2, index, key)
        self.value.index_copy_(2, index, value)
        return self.key, self.value

    def visible(self, mask: AttentionMask, q_len: int) -> AttentionMask:
        """Query ``i`` (at ``position + i``) sees the keys at or before it: the causal mask over
        the buffer, which also hides the slots not written yet."""
        if mask.padding is not None or mask.explicit is not None:
            raise ValueError(
                "a static key/value cache takes no padding or explicit mask; decode with the "
                "dynamic cache (static_cache=False)"
            )
        q_pos = self.position + torch.arange(q_len, device=self.position.device)
        return AttentionMask(explicit=torch.arange(self.capacity, device=q_pos.device)[None, :] <= q_pos[:, None])


class DecoderCache:
    """Per-layer key/value caches of an incremental decoder, plus how many tokens it has seen.

    A stack asks for the cache of its i-th layer application with :meth:`layer`; a stack that
    applies one layer T times simply asks for T of them. The caches grow with every step (see
    :class:`StaticDecoderCache` for preallocated ones), but for the layers in ``windows``.

    Args:
        windows: by layer index, the keys a sliding-window layer's self-attention sees before
            each query: that layer's cache is a :class:`WindowKVCache` keeping that many
            (:func:`~transformer_zoo.core.decoding.make_cache` reads them off a model).
        left_padding: ``(B,)`` long, on the CPU: how many padding tokens each row's prompt
            starts with; the row's positions count from its first real token (see :class:`KVCache`).
    """

    def __init__(self, *, windows: Mapping[int, int] | None = None, left_padding: Tensor | None = None) -> None:
        self.layers: list[tuple[KVCache, KVCache]] = []
        self.offset = 0
        self.windows = dict(windows or {})
        self.left_padding = left_padding

    def layer(self, index: int) -> tuple[KVCache, KVCache]:
        while len(self.layers) <= index:
            window = self.windows.get(len(self.layers))
            own = (
                KVCache(left_padding=self.left_padding)
                if window is None
                else WindowKVCache(window, left_padding=self.left_padding)
            )
            self.layers.append((own, KVCache()))
        return self.layers[index]

    @property
    def nbytes(self) -> int:
        """Bytes held by every layer's keys, values and state (self- and cross-attention)."""
        return sum(
            t.nbytes
            for caches in self.layers
            for cache in caches
            for t in (cache.key, cache.value, *cache.state.values())
            if t is not None
        )

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` of every cache (beam search)."""
        for self_cache, cross_cache in self.layers:
            self_cache.reorder(index)
            cross_cache.reorder(index)
        if self.left_padding is not None:
            self.left_padding = self.left_padding.index_select(0, index.to(self.left_padding.device))


class StaticDecoderCache(DecoderCache):
    """A decoder cache whose self-attention caches are preallocated to ``capacity`` positions
    (:class:`~transformer_zoo.core.cache.StaticKVCache`) and whose ``offset`` is a 0-d
    tensor on ``device``, advanced in place: a decoding step has the same shapes and addresses
    every time, and reads no value back to the host, so it can be captured as a CUDA graph.
    Reordering (beam search) writes the selected rows in place too.
    """

    def __init__(self, capacity: int, device: torch.device | str) -> None:
        self.capacity = capacity
        self.position = torch.zeros((), dtype=torch.long, device=device)
        super().__init__()

    @property
    def offset(self) -> Tensor:
        return self.position

    @offset.setter
    def offset(self, value: int | Tensor) -> None:
        if value is not self.position:  # ``offset += n`` has already added in place
            self.position.copy_(torch.as_tensor(value))

    def layer(self, index: int) -> tuple[KVCache, KVCache]:
        while len(self.layers) <= index:
            self.layers.append((StaticKVCache(self.capacity, self.position), KVCache(in_place=True)))
        return self.layers[index]
