"""Autoregressive decoding on the key/value cache.

Two caches: the dynamic one (:class:`~transformer_zoo.core.cache.DecoderCache`, made by
:func:`make_cache`), which grows by the new tokens' keys at every step but for a sliding-window
layer's, which keeps its window only, for the CPU and for export; and the static one
(:class:`~transformer_zoo.core.cache.StaticDecoderCache`), preallocated to the longest sequence,
whose one-token step :class:`DecodeStep` captures as a CUDA graph: a step of a small model is a
few hundred kernels whose launches, not their arithmetic, take the time on a GPU, and a graph
launches them all at once.

A decoder-only model continues a batch of prompts of different lengths padded on the left
(``attention_mask``, Hugging Face's habit): each row's positions start at its first real token
(the cache's ``left_padding``), so a row decodes as it would alone.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import MultiHeadAttention, SoftcapKernel, as_padding_mask, math_kernel, sdpa_kernel
from .cache import DecoderCache, StaticDecoderCache
from .embedding import BOS, LearnedPositional, SinusoidalPositional, check_token_ids
from .local_attention import PatternKernel
from .relative import RotaryPositional

Model = nn.Module
"""What decodes: an :class:`~transformer_zoo.core.model.EncoderDecoder` (``encode``, ``decode``,
``head``), whose ``generate`` method calls :func:`generate`."""


def static_cache_problem(model: nn.Module, capacity: int) -> str | None:
    """Why ``model`` cannot decode ``capacity`` positions on a static cache, or None if it can.

    The static cache needs attention that takes its mask over the whole buffer: the full
    attention kinds (SDPA or the written-out formula, soft-capped or not, no ``kernel_inputs``
    of their own; a sliding window's layer keeps its keys in a dynamic :class:`~.cache.WindowKVCache`),
    and no learned positions short of ``capacity`` (sinusoids and rotary angles are computed for
    it when the cache is made).
    """
    for name, module in model.decoder.named_modules():
        if isinstance(module, MultiHeadAttention) and (
            (module.kernel not in (sdpa_kernel, math_kernel) and not isinstance(module.kernel, SoftcapKernel))
            or type(module).kernel_inputs is not MultiHeadAttention.kernel_inputs
        ):
            return (
                f"its attention {name or 'decoder'} ({type(module).__name__}) computes over the keys seen so far only"
            )
    for module in model.modules():
        if isinstance(module, LearnedPositional) and capacity > module.max_len:
            return (
                f"it would decode {capacity} positions, past its learned positions' max_len={module.max_len}; "
                "decode fewer tokens"
            )
    return None


def _uses_static_cache(
    model: Model, static_cache: bool | None, capacity: int, device: torch.device, padded: bool = False
) -> bool:
    if static_cache is False:
        return False
    if padded:
        if static_cache:
            raise ValueError(
                "a static cache takes no padding mask: left-padded prompts decode on the dynamic cache "
                "(cache_implementation='dynamic', or static_cache=False)"
            )
        return False
    problem = static_cache_problem(model, capacity)
    if static_cache and problem:
        raise ValueError(f"this model cannot decode on a static cache: {problem} (static_cache=False: the dynamic one)")
    static = problem is None and (static_cache or device.type == "cuda")
    if static:  # a static cache looks its positions up on the device: the tables must hold them first
        for module in model.modules():
            if isinstance(module, (SinusoidalPositional, RotaryPositional)):
                module.cover(capacity)
    return static


def window_of(attention: nn.Module | None) -> int | None:
    """How many keys before each query ``attention``'s causal self-attention sees, where that is
    one number at every position (a sliding window: its ``window``, times its ``dilation``): the
    keys a decoding cache of its layer keeps between steps. None: every key so far (full
    attention; a rule over absolute positions, such as global tokens or blocks; a kind that
    changes the keys)."""
    if (
        not isinstance(attention, MultiHeadAttention)
        or not isinstance(attention.kernel, PatternKernel)
        or type(attention).forward is not MultiHeadAttention.forward
        or type(attention).kernel_inputs is not MultiHeadAttention.kernel_inputs
    ):
        return None
    return attention.kernel.pattern.lookback()


def make_cache(model: Model, *, left_padding: Tensor | None = None) -> DecoderCache:
    """The dynamic cache ``model`` decodes on: a sliding-window layer of a stack of distinct layers
    (one with a ``layers`` list, as the standard stack has; a recurrent stack applies one layer
    again and again) keeps the keys of its window only (:func:`window_of`), every other layer
    every key. ``left_padding``: see :class:`~.cache.DecoderCache`."""
    layers = getattr(model.decoder, "layers", None)
    layers = layers if isinstance(layers, nn.ModuleList) else ()
    windows = {
        i: window
        for i, layer in enumerate(layers)
        if (window := window_of(getattr(layer, "self_attn", None))) is not None
    }
    return DecoderCache(windows=windows, left_padding=left_padding)


def prompt_padding(mask: Tensor | None, prompt: Tensor) -> Tensor | None:
    """A decoder-only ``prompt``'s ``mask`` ``(B, P)`` (1: a real token, 0: padding) as bools, or
    None when it marks no padding. Raises a ValueError unless each row's padding comes before its
    first real token, of which it has at least one."""
    real = as_padding_mask(mask, prompt, "attention_mask")
    if real is None or bool(real.all()):
        return None
    left = (~real).long().cumprod(1).sum(1)  # the padding before each row's first real token
    stray = (real != (torch.arange(real.size(1), device=real.device) >= left[:, None])).any(1)
    if bool(stray.any()):
        row = int(stray.nonzero()[0])
        raise ValueError(
            f"attention_mask marks padding in a decoder-only model's prompt after a real token (row {row}); "
            "generation continues each row from its last token, so pad on the left (a tokenizer's "
            "padding_side='left'), or generate each prompt alone"
        )
    if bool((left == real.size(1)).any()):
        row = int((left == real.size(1)).nonzero()[0])
        raise ValueError(f"row {row} of attention_mask is all padding; give each prompt at least one real token")
    return real


def padding_counts(mask: Tensor) -> Tensor:
    """The padding tokens of each row of a ``(B, P)`` bool mask (True: a real token): ``(B,)``
    long, on the CPU, where positions computed from it never read a value back from the device."""
    return (~mask).sum(1).cpu()


class DecodeStep:
    """Next-token logits ``(B, 1, V)`` from ``model.decode`` on ``cache``, then the head.

    The first call (the prompt, or the start token) runs as written. With a static cache on
    CUDA (``graph=True``), the first one-token call captures the step as a CUDA graph, on the
    cache's fixed buffers, and every later call copies its token into the graph's input and
    replays it. The logits returned then are the graph's output buffer, overwritten by the next
    call: read them before calling again.

    ``prompt_mask``: a decoder-only prompt's ``(B, P)`` bools, False for its left padding
    (:func:`prompt_padding`); each call's padding mask is it, then True for every token since.
    The cache must then carry the same rows' ``left_padding``; without a cache (each call runs
    the whole prefix), each call makes one of its own, which carries the rows' positions.
    """

    def __init__(
        self,
        model: Model,
        memory: Tensor | None,
        src_mask: Tensor | None,
        cache: DecoderCache | None,
        *,
        graph: bool = False,
        prompt_mask: Tensor | None = None,
    ) -> None:
        self.model, self.memory, self.src_mask, self.cache = model, memory, src_mask, cache
        self.graph = graph and isinstance(cache, StaticDecoderCache)
        self.prompt_mask = prompt_mask
        self.left_padding = None if prompt_mask is None else padding_counts(prompt_mask)
        self._captured: torch.cuda.CUDAGraph | None = None
        self._input: Tensor | None = None
        self._output: Tensor | None = None

    def run(self, tokens: Tensor) -> Tensor:
        cache, tgt_mask = self.cache, None
        if self.prompt_mask is not None:
            if cache is None:
                cache = DecoderCache(left_padding=self.left_padding)
            seen = cache.offset + tokens.size(1)
            tgt_mask = F.pad(self.prompt_mask, (0, seen - self.prompt_mask.size(1)), value=True)
        out = self.model.decode(tokens, self.memory, src_mask=self.src_mask, tgt_mask=tgt_mask, cache=cache)
        return self.model.head(out.hidden[:, -1:])

    def __call__(self, tokens: Tensor) -> Tensor:
        if not self.graph or tokens.size(1) != 1 or len(self.cache.layers) == 0:
            return self.run(tokens)
        if self._captured is None:
            self._capture(tokens)
        self._input.copy_(tokens)
        self._captured.replay()
        return self._output

    def _capture(self, tokens: Tensor) -> None:
        """Warm up on a side stream, then capture one step (capturing runs nothing). The warm-up
        wrote the keys of the step at the position the first replay writes them again."""
        position = self.cache.position.clone()
        self._input = tokens.clone()
        # autocast's cache of cast weights would be freed after capture: capture without it
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
        casting = torch.autocast("cuda", dtype=dtype, cache_enabled=False) if dtype else contextlib.nullcontext()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), casting:
            self.run(self._input)
        torch.cuda.current_stream().wait_stream(side)
        self.cache.position.copy_(position)
        self._captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._captured), casting:
            self._output = self.run(self._input)
        self.cache.position.copy_(position)


def _check_ids(*, max_new_tokens: object, **ids: object) -> None:
    """A ValueError unless ``max_new_tokens`` is a count and each of ``ids`` a token id or None."""
    check_count(max_new_tokens, "max_new_tokens", 0)
    for name, value in ids.items():
        if value is not None:
            check_count(value, name, 0)


@torch.no_grad()
def greedy_decode(
    model: Model,
    src: Tensor | None = None,
    src_mask: Tensor | None = None,
    *,
    bos_id: int | None = None,
    eos_id: int | None = None,
    prompt: Tensor | None = None,
    prompt_mask: Tensor | None = None,
    max_new_tokens: int = 64,
    pad_id: int | None = None,
    use_cache: bool = True,
    static_cache: bool | None = None,
) -> Tensor:
    """Pick the most likely next token until ``eos_id`` or ``max_new_tokens``.

    Args:
        model: an encoder-decoder or decoder-only model with a token head.
        src: source ids ``(B, S)``, for an encoder-decoder.
        src_mask: ``(B, S)``, 1 for real source tokens, 0 for padding.
        bos_id: the first decoder token, when no ``prompt`` is given.
        eos_id: a token that ends a sequence; finished rows are then filled with ``pad_id``.
        prompt: ``(B, P)`` ids to continue instead of a lone ``bos_id``.
        prompt_mask: a decoder-only ``prompt``'s ``(B, P)`` mask, 1 for real tokens, 0 for the
            padding before each row's first (left padding): each row's positions start at its
            first real token, and it decodes as it would alone.
        max_new_tokens: how many tokens to add at most (0: none).
        pad_id: filler after ``eos_id`` (defaults to ``eos_id``).
        use_cache: read earlier keys/values from a cache (fast) instead of re-running the prefix.
        static_cache: with ``use_cache``, preallocate the cache to ``P + max_new_tokens``
            positions and, on CUDA, replay each step as a captured CUDA graph
            (:class:`DecodeStep`). None: on CUDA, when the model allows it
            (:func:`static_cache_problem`) and the prompt has no padding; True: always (a
            ValueError if the model cannot); False: the dynamic cache. The tokens are the same
            either way.

    Returns:
        ``(B, P + n)`` ids: the prompt (or ``bos_id``) followed by the generated tokens.

    Raises:
        ValueError: ``max_new_tokens`` or a token id is negative or not an integer, the ids
            are not ``(batch, seq)`` tensors of ``torch.long``, or ``prompt_mask`` pads a row
            after a real token.
    """
    return _autoregress(
        model,
        src,
        src_mask,
        lambda logits: logits.argmax(-1),
        bos_id=bos_id,
        eos_id=eos_id,
        prompt=prompt,
        prompt_mask=prompt_mask,
        max_new_tokens=max_new_tokens,
        pad_id=pad_id,
        use_cache=use_cache,
        static_cache=static_cache,
    )


def _autoregress(
    model: Model,
    src: Tensor | None,
    src_mask: Tensor | None,
    choose: Callable[[Tensor], Tensor],
    *,
    bos_id: int | None,
    eos_id: int | Sequence[int] | None,
    prompt: Tensor | None,
    max_new_tokens: int,
    pad_id: int | None,
    use_cache: bool,
    static_cache: bool | None,
    stop: Callable[[Tensor], Tensor] | None = None,
    prompt_mask: Tensor | None = None,
) -> Tensor:
    """The decoding loop of :func:`greedy_decode` and :func:`generate`: ``choose`` turns the
    next-token logits ``(B, V)`` into ids ``(B,)``; a row ends at one of ``eos_id`` or where
    ``stop`` says so, and is filled with ``pad_id`` after."""
    if model.decoder is None:
        raise ValueError("decoding needs a model with a decoder; this one is encoder-only")
    ends = () if eos_id is None else tuple(eos_id) if isinstance(eos_id, (list, tuple)) else (eos_id,)
    _check_ids(
        max_new_tokens=max_new_tokens,
        bos_id=bos_id,
        pad_id=pad_id,
        **{f"eos_id[{i}]" if len(ends) > 1 else "eos_id": end for i, end in enumerate(ends)},
    )
    if prompt is not None:
        check_token_ids(prompt, name="prompt")
    memory = None
    if model.encoder is not None:
        if src is None:
            raise ValueError("an encoder-decoder model needs src ids (batch, seq) to decode from")
        memory = model.encode(src, src_mask).hidden
        batch, device = src.size(0), src.device
    elif prompt is not None:
        batch, device = prompt.size(0), prompt.device
    else:
        raise ValueError("a decoder-only model needs a prompt (batch, seq) to continue")
    if prompt_mask is not None:
        if model.encoder is not None:
            raise ValueError("prompt_mask pads a decoder-only model's prompt; an encoder-decoder's padding is src_mask")
        prompt_mask = prompt_padding(prompt_mask, prompt)
    if prompt is None:
        if bos_id is None:
            raise ValueError("give bos_id (the start token) or a prompt")
        prompt = torch.full((batch, 1), bos_id, dtype=torch.long, device=device)
    if pad_id is None and (ends or stop is not None):
        if not ends:
            raise ValueError("a stop condition needs pad_id (the filler after a row stops), or an eos_id to use as one")
        pad_id = ends[0]
    end_ids = torch.tensor(ends, dtype=torch.long, device=device)

    tokens = prompt
    cache, capacity = None, prompt.size(1) + max_new_tokens
    if use_cache:
        static = _uses_static_cache(model, static_cache, capacity, device, padded=prompt_mask is not None)
        left = None if prompt_mask is None else padding_counts(prompt_mask)
        cache = StaticDecoderCache(capacity, device) if static else make_cache(model, left_padding=left)
    step = DecodeStep(model, memory, src_mask, cache, graph=device.type == "cuda", prompt_mask=prompt_mask)
    step_input = prompt
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    for _ in range(max_new_tokens):
        next_token = choose(step(step_input if use_cache else tokens)[:, -1])[:, None]  # (B, 1)
        ending = ends or stop is not None
        if ending:
            next_token = next_token.masked_fill(finished[:, None], pad_id)
        tokens = torch.cat([tokens, next_token], dim=1)
        if ends:
            finished |= torch.isin(next_token.squeeze(1), end_ids)
        if stop is not None:
            finished |= stop(tokens).to(device=device, dtype=torch.bool)
        step_input = next_token
        if ending and bool(finished.all()):
            break
    return tokens


def sample_logits(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Draw one id per row from next-token logits ``(B, V)``: ``(B,)``.

    The logits are divided by ``temperature`` (0: the most likely id, greedy), then the
    candidates are cut, in this order, to the ``top_k`` most likely; to the nucleus, the fewest
    most likely ids whose probabilities sum to at least ``top_p`` (Holtzman et al. 2020); and to
    the ids with at least ``min_p`` times the probability of the most likely one (min-p
    sampling). The most likely id always survives. The draw is from the renormalised rest, with
    ``generator`` (seeded: the same draws every time).
    """
    _check_sampling(temperature, top_k, top_p, min_p)
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if top_p is not None and top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # the mass of the more likely ids
        cut = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before >= top_p)
        probs = probs.masked_fill(cut, 0.0)
    if min_p is not None and min_p > 0:
        probs = probs.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), 0.0)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def _check_sampling(temperature: float, top_k: int | None, top_p: float | None, min_p: float | None) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature < math.inf:
        raise ValueError(
            f"temperature must be a number >= 0 (0: greedy, 1: the model's distribution), got {temperature!r}"
        )
    if top_k is not None:
        check_count(top_k, "top_k", 1)
    for name, value, low_open in (("top_p", top_p, True), ("min_p", min_p, False)):
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not (0 < value <= 1 if low_open else 0 <= value <= 1)
        ):
            interval = "(0, 1]" if low_open else "[0, 1]"
            raise ValueError(f"{name} must be a probability in {interval}, got {value!r}")


ZOO_NAMES = {
    "src": "input_ids",
    "src_mask": "attention_mask",
    "prompt": "input_ids or decoder_input_ids",
    "bos_id": "bos_token_id or decoder_start_token_id",
    "eos_id": "eos_token_id",
    "pad_id": "pad_token_id",
    "static_cache": "cache_implementation",
}
"""The zoo's own names of :func:`generate`'s arguments, accepted beside Hugging Face's, and the
Hugging Face name each stands for."""
CACHES = {"dynamic": False, "static": True}
"""``cache_implementation``: the cache each name chooses (None: static on CUDA where the model allows)."""


@torch.no_grad()
def generate(
    model: Model,
    input_ids: Tensor | None = None,
    attention_mask: Tensor | None = None,
    *,
    decoder_input_ids: Tensor | None = None,
    max_new_tokens: int | None = None,
    max_length: int | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    num_beams: int = 1,
    bos_token_id: int | None = None,
    decoder_start_token_id: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    use_cache: bool = True,
    cache_implementation: str | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    stop: Callable[[Tensor], Tensor] | None = None,
    **zoo_names: Any,
) -> Tensor:
    """Generate token ids as Hugging Face's ``model.generate`` does (also ``model.generate(...)``
    and ``transformer_zoo.generate(model, ...)``): greedy, beam search or sampling, on the cache.

    An encoder-decoder model reads ``input_ids`` (with its padding ``attention_mask``) and
    continues ``decoder_input_ids``, or the start token; a decoder-only model continues
    ``input_ids``, whose ``attention_mask`` may pad prompts of different lengths on the left:
    each row's positions then start at its first real token (as Hugging Face's
    ``attention_mask.cumsum(-1) - 1``), and it decodes as it would alone. ``num_beams > 1`` is
    :func:`beam_search` (encoder-decoder models); ``do_sample`` draws each token with
    :func:`sample_logits` (``temperature``, ``top_k``, ``top_p``, ``min_p``) from ``generator``,
    or from a generator seeded with ``seed`` on the model's device (the same seed gives the same
    tokens); otherwise the most likely token
    (:func:`greedy_decode`). The zoo's own names (:data:`ZOO_NAMES`: ``src``, ``prompt``,
    ``bos_id``, ``eos_id``, ...) are accepted too.

    Args:
        max_new_tokens: tokens to add at most (default 64); or ``max_length``, the length of
            the output, prompt or start token included, as Hugging Face counts it.
        bos_token_id, decoder_start_token_id: the start token where there is no prompt
            (default 1, the zoo's BOS).
        eos_token_id: a token id, or several, that ends a row; the row is then filled with
            ``pad_token_id`` (default: the first ``eos_token_id``). None (the default): every
            row runs ``max_new_tokens``.
        use_cache: decode on the key/value cache (the default) or run the whole prefix at each step.
        cache_implementation: ``"static"`` (preallocated; a CUDA graph on a GPU), ``"dynamic"``,
            or None: static on CUDA where the model allows it.
        stop: a stop condition: called with the ids so far ``(B, T)`` after each step, returns
            ``(B,)`` bools, True for rows to end there (a stop sequence, a length per row).

    Returns:
        ``(B, P + n)`` ids: the prompt (or the start token) followed by at most ``max_new_tokens``.

    Raises:
        ValueError: a model that cannot decode (encoder-only, or an image model), an option out
            of its range, sampling asked of beam search, a decoder-only prompt padded after a
            real token (right padding) or a static cache asked for a padded one.
        TypeError: an argument under neither name, or under both.
    """
    named = _hf_named(
        model,
        zoo_names,
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        cache_implementation=cache_implementation,
    )
    decoder_only = model.encoder is None
    src, src_mask = (None, None) if decoder_only else (named["input_ids"], named["attention_mask"])
    prompt, prompt_mask = (
        (named["input_ids"], named["attention_mask"]) if decoder_only else (named["decoder_input_ids"], None)
    )
    if decoder_only and named["decoder_input_ids"] is not None:
        raise ValueError("decoder_input_ids is an encoder-decoder's prompt; a decoder-only model continues input_ids")
    bos_id = named["bos_token_id"] if decoder_start_token_id is None else decoder_start_token_id
    if bos_id is None and prompt is None:
        bos_id = BOS
    static_cache = None if named["cache_implementation"] is None else _cache(named["cache_implementation"])
    if max_length is not None:
        if max_new_tokens is not None:
            raise ValueError("give max_new_tokens or max_length (the output's length), not both")
        check_count(max_length, "max_length", 1)
        max_new_tokens = max(0, max_length - (1 if prompt is None else prompt.size(1)))
    max_new_tokens = 64 if max_new_tokens is None else max_new_tokens
    eos_id, pad_id = named["eos_token_id"], named["pad_token_id"]
    check_count(num_beams, "num_beams", 1)
    if num_beams > 1:
        if do_sample or stop is not None or prompt is not None:
            raise ValueError(
                "num_beams > 1 is beam search over an encoder-decoder's input_ids: it takes no do_sample, stop or "
                "decoder_input_ids; use num_beams=1 for those"
            )
        if eos_id is None or not isinstance(eos_id, int):
            raise ValueError("beam search needs one eos_token_id (the token that ends a hypothesis)")
        return beam_search(
            model,
            src,
            src_mask,
            bos_id=bos_id,
            eos_id=eos_id,
            beam_size=num_beams,
            max_new_tokens=max_new_tokens,
            pad_id=pad_id,
            static_cache=static_cache,
        )[0]
    if do_sample:
        _check_sampling(temperature, top_k, top_p, min_p)
        if generator is None and seed is not None:
            device = next(model.parameters()).device
            generator = torch.Generator(device=device).manual_seed(seed)

        def choose(logits: Tensor) -> Tensor:
            return sample_logits(
                logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, generator=generator
            )
    else:

        def choose(logits: Tensor) -> Tensor:
            return logits.argmax(-1)

    return _autoregress(
        model,
        src,
        src_mask,
        choose,
        bos_id=bos_id,
        eos_id=eos_id,
        prompt=prompt,
        max_new_tokens=max_new_tokens,
        pad_id=pad_id,
        use_cache=use_cache,
        static_cache=static_cache,
        stop=stop,
        prompt_mask=prompt_mask,
    )


def _hf_named(model: Model, zoo_names: dict[str, Any], **named: Any) -> dict[str, Any]:
    """``named`` (Hugging Face's names) with the values given under the zoo's names moved onto
    them; a TypeError for a name that is neither, or one value given under both; a ValueError
    for a model that cannot decode."""
    if getattr(model, "decoder", None) is None:
        config = getattr(model, "config", None)
        what = f"{config.variant!r} ({config.family} family)" if config is not None else type(model).__name__
        raise ValueError(
            f"{what} cannot generate: it has no decoder (an encoder-only or image model); generate needs an "
            "encoder-decoder or decoder-only model, such as transformer-tiny"
        )
    for name, value in zoo_names.items():
        if name not in ZOO_NAMES:
            raise TypeError(
                f"generate() got an unexpected argument {name!r}; it takes Hugging Face's names (input_ids, "
                "attention_mask, decoder_input_ids, max_new_tokens, max_length, do_sample, temperature, top_k, "
                "top_p, min_p, num_beams, bos_token_id, decoder_start_token_id, eos_token_id, pad_token_id, "
                f"use_cache, cache_implementation) and the zoo's ({', '.join(ZOO_NAMES)}, seed, generator, stop)"
            )
        target = {"prompt": "input_ids" if model.encoder is None else "decoder_input_ids"}.get(name)
        target = target or ZOO_NAMES[name].split(" or ")[0]
        if name == "static_cache":
            value = None if value is None else ("static" if value else "dynamic")
        if named[target] is not None and value is not None:
            raise TypeError(f"generate() got {name}= and {target}=, one argument under two names; give one")
        if value is not None:
            named[target] = value
    return named


def _cache(name: object) -> bool:
    if name not in CACHES:
        raise ValueError(f"cache_implementation={name!r}; it is one of {', '.join(map(repr, CACHES))} or None")
    return CACHES[name]


def sequence_log_prob(
    model: Model, src: Tensor | None, src_mask: Tensor | None, tokens: Tensor, *, eos_id: int | None = None
) -> Tensor:
    """Sum of log-probabilities ``(B,)`` the model gives ``tokens[:, 1:]`` after ``tokens[:, :1]``,
    up to and including the first ``eos_id`` (later tokens are filler and do not count)."""
    memory = model.encode(src, src_mask).hidden if model.encoder is not None else None
    hidden = model.decode(tokens[:, :-1], memory, src_mask=src_mask).hidden
    log_probs = model.head(hidden).log_softmax(-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)  # (B, T-1)
    if eos_id is not None:
        ended = (tokens[:, 1:] == eos_id).long().cumsum(1)
        counts = (ended == 0) | ((ended == 1) & (tokens[:, 1:] == eos_id))  # up to the first eos
        log_probs = log_probs * counts
    return log_probs.sum(-1)


@torch.no_grad()
def beam_search(
    model: Model,
    src: Tensor,
    src_mask: Tensor | None = None,
    *,
    bos_id: int,
    eos_id: int,
    beam_size: int = 4,
    max_new_tokens: int = 64,
    pad_id: int | None = None,
    static_cache: bool | None = None,
) -> tuple[Tensor, Tensor]:
    """The most likely sequences found keeping ``beam_size`` hypotheses per input, on the cache.

    Hypotheses are ranked by the sum of token log-probabilities; a hypothesis ends at
    ``eos_id``. The greedy sequence is always among the candidates, so the result never scores
    lower than greedy decoding; with ``beam_size=1`` it is greedy decoding. ``static_cache`` is
    :func:`greedy_decode`'s: the static cache and, on CUDA, each step replayed as a CUDA graph.

    Returns:
        ``(B, T)`` ids starting with ``bos_id`` (padded with ``pad_id`` after ``eos_id``) and
        their scores ``(B,)``.

    Raises:
        ValueError: ``beam_size`` is below 1, ``max_new_tokens`` or a token id is negative or
            not an integer, or the ids are not ``(batch, seq)`` tensors of ``torch.long``.
    """
    check_count(beam_size, "beam_size", 1)
    if model.encoder is None or model.decoder is None:
        raise ValueError("beam search here decodes encoder-decoder models; use greedy_decode with a prompt otherwise")
    _check_ids(max_new_tokens=max_new_tokens, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    check_token_ids(src, name="src")
    pad_id = eos_id if pad_id is None else pad_id
    batch, k = src.size(0), beam_size
    if max_new_tokens == 0:
        start = torch.full((batch, 1), bos_id, dtype=torch.long, device=src.device)
        return start, torch.zeros(batch, device=src.device)
    memory = model.encode(src, src_mask).hidden.repeat_interleave(k, dim=0)  # (B*K, S, D)
    memory_mask = None if src_mask is None else src_mask.repeat_interleave(k, dim=0)
    tokens = torch.full((batch * k, 1), bos_id, dtype=torch.long, device=src.device)
    scores = torch.full((batch, k), float("-inf"), device=src.device)
    scores[:, 0] = 0.0  # all beams start as one hypothesis
    finished = torch.zeros(batch * k, dtype=torch.bool, device=src.device)
    static = _uses_static_cache(model, static_cache, 1 + max_new_tokens, src.device)
    cache = StaticDecoderCache(1 + max_new_tokens, src.device) if static else make_cache(model)
    step = DecodeStep(model, memory, memory_mask, cache, graph=src.device.type == "cuda")
    step_input = tokens
    for _ in range(max_new_tokens):
        log_probs = step(step_input)[:, -1].float().log_softmax(-1)  # (B*K, V)
        vocab = log_probs.size(-1)
        if max(eos_id, pad_id) >= vocab:
            raise ValueError(
                f"eos_id={eos_id} and pad_id={pad_id} must be token ids of the model's vocabulary, below {vocab}"
            )
        frozen = torch.full_like(log_probs, float("-inf"))
        frozen[:, pad_id] = 0.0  # an ended hypothesis continues with filler at no cost
        log_probs = torch.where(finished[:, None], frozen, log_probs)
        candidates = (scores.view(-1, 1) + log_probs).view(batch, k * vocab)
        scores, flat = candidates.topk(k, dim=-1)  # (B, K)
        origin = (flat // vocab + torch.arange(batch, device=src.device)[:, None] * k).view(-1)
        next_token = (flat % vocab).view(-1, 1)
        cache.reorder(origin)
        finished = finished[origin] | (next_token.squeeze(1) == eos_id)
        tokens = torch.cat([tokens[origin], next_token], dim=1)
        step_input = next_token
        if bool(finished.all()):
            break
    best = scores.argmax(-1)
    rows = best + torch.arange(batch, device=src.device) * k
    beam_tokens, beam_scores = tokens[rows], scores.gather(1, best[:, None]).squeeze(1)

    greedy = greedy_decode(
        model,
        src,
        src_mask,
        bos_id=bos_id,
        eos_id=eos_id,
        pad_id=pad_id,
        max_new_tokens=max_new_tokens,
        static_cache=static_cache,
    )
    greedy_scores = sequence_log_prob(model, src, src_mask, greedy, eos_id=eos_id)
    length = max(beam_tokens.size(1), greedy.size(1))
    beam_tokens = torch.nn.functional.pad(beam_tokens, (0, length - beam_tokens.size(1)), value=pad_id)
    greedy = torch.nn.functional.pad(greedy, (0, length - greedy.size(1)), value=pad_id)
    use_greedy = greedy_scores > beam_scores + 1e-6
    return torch.where(use_greedy[:, None], greedy, beam_tokens), torch.where(use_greedy, greedy_scores, beam_scores)


def check_count(value: object, name: str, minimum: int) -> None:
    """Raise a ValueError unless ``value`` is an integer (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer of at least {minimum}, got {value!r}")
