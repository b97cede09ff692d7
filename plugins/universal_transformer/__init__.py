"""The Universal Transformer: Dehghani, Gouws, Vinyals, Uszkoreit, Kaiser 2018, "Universal
Transformers" (arXiv 1807.03819).

Instead of N distinct layers, one layer (self-attention, cross-attention in the decoder, and a
transition function) is applied recurrently over depth, with the same parameters at every
step. Before each step the position and the step index are added as sinusoids (the
coordinate embedding ``P^t``). With adaptive computation time (Graves 2016) each position
has a halting unit and stops when it is done; its ponder time ``N + R`` is exposed after
every forward pass and its mean, weighted, is added to the loss. Everything is the core's
``recurrent`` stack; this file holds the paper's defaults and the presets.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from transformer_zoo.core.config import EncoderDecoderConfig
from transformer_zoo.core.options import MAX_VOCAB, HeadField, StackField, Variant
from transformer_zoo.registry import hookimpl

RECURRENT = {"kind": "recurrent", "layers": 6, "act": True}


class UniversalTransformerConfig(EncoderDecoderConfig):
    """The Universal Transformer; defaults are the base model's width with 6 steps and ACT."""

    family: ClassVar[str] = "universal-transformer"
    positions_per_step: ClassVar[bool] = True  # P^t: positions and the step index, added before every step

    variant: str = Field("universal-transformer", description="the registered variant this config started from")
    vocab_size: int = Field(
        37000, ge=1, le=MAX_VOCAB, description="shared source/target vocabulary, as the Transformer's"
    )
    encoder: StackField | None = Field(
        RECURRENT, validate_default=True, description="encoder: a recurrent stack (layers = the most steps T)"
    )
    decoder: StackField | None = Field(
        RECURRENT, validate_default=True, description="decoder: a recurrent stack; null for an encoder-only model"
    )
    head: HeadField = Field(
        {"kind": "lm", "label_smoothing": 0.1}, validate_default=True, description="tied generator, label smoothing 0.1"
    )


TINY = dict(
    vocab_size=1000,
    d_model=64,
    n_heads=4,
    d_ff=256,
    max_len=512,
    encoder={**RECURRENT, "layers": 4},
    decoder={**RECURRENT, "layers": 4},
)
ENCODER_ONLY = dict(decoder=None, head={"kind": "sequence-classification", "num_classes": 2})


@hookimpl
def tzoo_variants():
    return [
        Variant(
            name="universal-transformer",
            config=UniversalTransformerConfig,
            description="Dehghani et al. 2018: d 512, 8 heads, up to 6 steps with ACT",
        ),
        Variant(
            name="universal-transformer-base",
            config=UniversalTransformerConfig,
            description="base: d 512, 8 heads, d_ff 2048, encoder and decoder of up to 6 steps with ACT",
        ),
        Variant(
            name="universal-transformer-tiny",
            config=UniversalTransformerConfig,
            defaults=TINY,
            description="tiny: d 64, 4 heads, up to 4 steps with ACT, for CPUs and tests",
        ),
        Variant(
            name="universal-transformer-encoder-base",
            config=UniversalTransformerConfig,
            defaults=ENCODER_ONLY,
            description="encoder-only base, with a classification head",
        ),
        Variant(
            name="universal-transformer-encoder-tiny",
            config=UniversalTransformerConfig,
            defaults={**TINY, **ENCODER_ONLY},
            description="encoder-only tiny, with a classification head",
        ),
    ]
