"""The Transformer: Vaswani et al. 2017, "Attention Is All You Need" (arXiv 1706.03762).

An encoder-decoder of post-norm layers: sinusoidal positions added to embeddings scaled by
sqrt(d_model), one embedding table shared by source, target and output projection,
and label-smoothed cross-entropy (epsilon 0.1). The warm-up then inverse-square-root
learning-rate schedule (eq. 3) is training's ``schedule: inverse-sqrt`` with
``lr = (d_model * warmup_steps) ** -0.5``. Everything is composed from the core; this file
holds only the paper's defaults and presets, and the importer of Hugging Face ``MarianMTModel``
folders, which ``save_pretrained(format="hf")`` also writes (:mod:`.hf`, a name map on the bridge).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from transformer_zoo.core.config import EncoderDecoderConfig
from transformer_zoo.core.options import HeadField, Variant
from transformer_zoo.core.validation import MAX_VOCAB
from transformer_zoo.registry import hookimpl

from .hf import MARIAN_IMPORTER


class TransformerConfig(EncoderDecoderConfig):
    """The original Transformer; defaults are the paper's base model (Table 3)."""

    family: ClassVar[str] = "transformer"

    variant: str = Field("transformer", description="the registered variant this config started from")
    vocab_size: int = Field(
        37000, ge=1, le=MAX_VOCAB, description="shared source/target vocabulary (about 37000 BPE tokens in the paper)"
    )
    head: HeadField = Field(
        {"kind": "lm", "label_smoothing": 0.1},
        validate_default=True,
        description="generator tied to the shared embeddings, label smoothing 0.1",
    )


BIG = dict(d_model=1024, n_heads=16, d_ff=4096, dropout=0.3)
TINY = dict(vocab_size=1000, d_model=64, n_heads=4, d_ff=256, max_len=512, encoder={"layers": 2}, decoder={"layers": 2})


@hookimpl
def tzoo_variants():
    return [
        Variant(name="transformer", config=TransformerConfig, description="Vaswani et al. 2017, base defaults"),
        Variant(
            name="transformer-base", config=TransformerConfig, description="base: d 512, 8 heads, 6+6 layers, d_ff 2048"
        ),
        Variant(
            name="transformer-big",
            config=TransformerConfig,
            defaults=BIG,
            description="big: d 1024, 16 heads, 6+6 layers, d_ff 4096",
        ),
        Variant(
            name="transformer-tiny",
            config=TransformerConfig,
            defaults=TINY,
            description="tiny: d 64, 4 heads, 2+2 layers, for CPUs and tests",
        ),
    ]


@hookimpl
def tzoo_importers():
    return [MARIAN_IMPORTER]
