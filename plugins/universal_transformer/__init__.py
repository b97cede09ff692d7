"""The Universal Transformer: Dehghani, Gouws, Vinyals, Uszkoreit, Kaiser 2018, "Universal
Transformers" (arXiv 1807.03819).

Instead of N distinct layers, one layer (self-attention, cross-attention in the decoder, and a
transition function) is applied recurrently over depth, with the same parameters at every
step. Before each step the position and the step index are added as sinusoids (the
coordinate embedding ``P^t``). With adaptive computation time (Graves 2016) each position
has a halting unit and stops when it is done; its ponder time ``N + R`` is exposed after
every forward pass and its mean, weighted, is added to the loss. The stack is the core's
:class:`~transformer_zoo.core.recurrent.RecurrentStack`; this file holds its options (the
``recurrent`` stack kind, which any family can use), the paper's defaults and the presets.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator
from torch import nn

from transformer_zoo.core.config import EncoderDecoderConfig
from transformer_zoo.core.options import HeadField, StackField, StackOptions, Variant
from transformer_zoo.core.recurrent import recurrent_stack
from transformer_zoo.core.validation import MAX_VOCAB
from transformer_zoo.registry import hookimpl


class RecurrentOptions(StackOptions):
    """One shared layer applied up to ``layers`` times, with optional adaptive computation time
    (Dehghani et al. 2018; Graves 2016)."""

    kind: Literal["recurrent"] = "recurrent"
    recurrent: ClassVar[bool] = True
    act: bool = Field(True, description="adaptive computation time: each position decides how many steps it takes")
    threshold: float = Field(
        0.99,
        gt=0.0,
        lt=1.0,
        description="ACT halts a position when its summed halting probability would pass this (1 - epsilon)",
    )
    ponder_weight: float = Field(0.01, ge=0.0, description="weight of the ponder cost (steps taken) in the loss")
    halting_bias: float = Field(1.0, description="initial bias of the halting unit (higher: halt sooner at first)")

    @field_validator("attention")
    @classmethod
    def _one_kind(cls, attention):
        if isinstance(attention, list) and len(attention) > 1:
            raise ValueError("a recurrent stack shares one layer: give one attention kind, not a list")
        return attention

    def build(
        self, *, layers: list[nn.Module], final_norm: nn.Module | None, d_model: int, signal: nn.Module | None = None
    ) -> nn.Module:
        (layer,) = layers
        return recurrent_stack(
            layer,
            steps=self.layers,
            d_model=d_model,
            signal=signal,
            act=self.act,
            threshold=self.threshold,
            ponder_weight=self.ponder_weight,
            halting_bias=self.halting_bias,
            final_norm=final_norm,
        )


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
def tzoo_components():
    return [RecurrentOptions]


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
