"""BERT: Devlin et al. 2018, "BERT: Pre-training of Deep Bidirectional Transformers for
Language Understanding" (arXiv 1810.04805).

The Transformer's encoder, trained by masked language modelling. Each input vector is the sum
of a token, a learned absolute position and a token-type (segment) embedding, normalised by a
layer norm; the layers are post-norm with GELU feed-forward networks (no dropout inside them)
and layer norms of epsilon 1e-12; a pooler (dense + tanh) reads the first token. The heads are
BERT's: masked LM (dense + GELU + layer norm, then the decoder tied to the token embeddings,
with a bias), sequence classification on the pooled first token, and token classification.
Checkpoints saved by Hugging Face ``transformers`` load exactly (:mod:`.hf`).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor, nn

from transformer_zoo.core.attention import AttentionMask, as_padding_mask
from transformer_zoo.core.config import EncoderDecoderConfig, build_stack, positional_modules
from transformer_zoo.core.embedding import add_positions, check_tensor, check_token_ids, position_starts
from transformer_zoo.core.layers import ACTIVATIONS, StackOutput
from transformer_zoo.core.model import EncoderDecoder, LMHead
from transformer_zoo.core.options import FFNField, HeadField, NormField, PositionalField, StackField, Variant
from transformer_zoo.core.output import ModelOutput
from transformer_zoo.core.validation import MAX_LENGTH, MAX_VOCAB, MAX_WIDTH
from transformer_zoo.registry import hookimpl

from .hf import BERT_IMPORTER


# ---- modules --------------------------------------------------------------------------------
class BertEmbeddings(nn.Module):
    """``dropout(norm(E_token[ids] + E_type[types] + positions))`` (Devlin et al. 2018, figure 2).

    Args:
        token: the token lookup table (the MLM decoder shares it).
        token_type: the segment lookup table, or None for a model without segments.
        positional: an additive positional module taking ``(x, offset)`` (BERT: learned), or None
            when positions act inside attention.
        norm: the embedding layer norm.
        random_offset: in training, each sequence's positions start at a random offset in
            ``[0, random_offset)`` (:func:`~transformer_zoo.core.embedding.position_starts`); 0: off.
    """

    category: ClassVar[str] = "embedding"

    def __init__(
        self,
        token: nn.Embedding,
        token_type: nn.Embedding | None,
        positional: nn.Module | None,
        norm: nn.Module,
        *,
        dropout: float = 0.0,
        random_offset: int = 0,
    ) -> None:
        super().__init__()
        self.token = token
        self.token_type = token_type
        self.positional = positional
        self.norm = norm
        self.dropout = nn.Dropout(dropout)
        self.random_offset = random_offset

    def forward(self, ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        check_token_ids(ids, self.token.num_embeddings, "input_ids")
        x = self.token(ids)  # (B, T, D)
        if self.token_type is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(ids)
            check_tensor(token_type_ids, "token_type_ids", "of shape (batch, seq)")
            if token_type_ids.shape != ids.shape:
                raise ValueError(
                    f"token_type_ids has shape {tuple(token_type_ids.shape)}; expected {tuple(ids.shape)}, "
                    "one segment id per token"
                )
            check_token_ids(token_type_ids, self.token_type.num_embeddings, "token_type_ids")
            x = x + self.token_type(token_type_ids)
        elif token_type_ids is not None:
            raise ValueError("this model has no token types (type_vocab_size: 0); do not pass token_type_ids")
        if self.positional is not None:
            x = add_positions(self.positional, x, position_starts(x, 0, self.random_offset, self.training))
        return self.dropout(self.norm(x))


class BertPooler(nn.Module):
    """``tanh(W h_0 + b)``: the first token's final state, as BERT's sentence representation."""

    category: ClassVar[str] = "pooler"

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, hidden: Tensor) -> Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))  # (B, D)


class MaskedLMHead(nn.Module):
    """BERT's masked-LM head: ``decoder(norm(act(W h)))``, the decoder tied to the token embeddings."""

    category: ClassVar[str] = "head"

    def __init__(self, d_model: int, activation: str, norm: nn.Module, decoder: LMHead) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.activation = ACTIVATIONS[activation]()
        self.norm = norm
        self.decoder = decoder

    def forward(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        return self.decoder(self.norm(self.activation(self.dense(hidden))))  # (B, T, V)

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Cross-entropy over the selected tokens; targets equal to the padding id or to -100
        (the convention of ``transformers``' MLM labels) are ignored."""
        return self.decoder.loss(logits, targets.masked_fill(targets == -100, self.decoder.ignore_index))


class PooledClassificationHead(nn.Module):
    """One label per sequence from the pooler's output: ``W dropout(pooled) + b`` (section 4.1)."""

    category: ClassVar[str] = "head"

    reads_pooled: ClassVar[bool] = True

    def __init__(self, d_model: int, num_classes: int, *, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Linear(d_model, num_classes)

    def forward(self, pooled: Tensor, mask: Tensor | None = None) -> Tensor:
        return self.proj(self.dropout(pooled))  # (B, C)

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(logits, targets.long())


class Bert(EncoderDecoder):
    """An encoder-only model with BERT's embeddings and pooler.

    ``model(input_ids, attention_mask, token_type_ids)`` returns a
    :class:`~transformer_zoo.core.model.ModelOutput` whose ``extras["pooled"]`` is the pooler's
    output; :meth:`encode` returns the final hidden states and :meth:`pool` the pooled vector.
    """

    def __init__(
        self, *, embed: BertEmbeddings, encoder: nn.Module, pooler: BertPooler | None, head: nn.Module
    ) -> None:
        super().__init__(head=head, encoder=encoder, src_embed=embed)
        self.pooler = pooler
        if getattr(head, "reads_pooled", False) and pooler is None:
            raise ValueError("a head on the pooled output needs the pooler; set pooler: true")

    def encode_stack(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        need_weights: bool = False,
    ) -> StackOutput:
        """The encoder's output (hidden states and, if asked, attention weights)."""
        check_token_ids(input_ids, name="input_ids")
        padding = as_padding_mask(attention_mask, input_ids, "attention_mask")
        x = self.src_embed(input_ids, token_type_ids)
        return self.encoder(x, self_mask=AttentionMask(padding=padding), need_weights=need_weights)

    def encode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,  # type: ignore[override]
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """Final hidden states ``(B, T, D)`` of ``input_ids`` ``(B, T)``; ``attention_mask`` is 1
        for real tokens and 0 for padding; ``token_type_ids`` are segment ids (default 0)."""
        return self.encode_stack(input_ids, attention_mask, token_type_ids).hidden

    def pool(self, hidden: Tensor) -> Tensor:
        """The pooled sentence vector ``(B, D)`` of final hidden states ``(B, T, D)``."""
        if self.pooler is None:
            raise ValueError(
                "this model has no pooler; build it with pooler: true (a masked-LM model has none by default)"
            )
        return self.pooler(hidden)

    def forward(
        self,
        src: Tensor | None = None,
        src_mask: Tensor | None = None,  # type: ignore[override]
        token_type_ids: Tensor | None = None,
        *,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        need_weights: bool = False,
        labels: Tensor | None = None,
        output_attentions: bool | None = None,
    ) -> ModelOutput:
        """Logits for a batch; ids as ``src`` or ``input_ids``, the mask as ``src_mask`` or ``attention_mask``.
        With ``labels`` (token ids, -100 where unscored, for the masked-LM head; one class per
        sequence for a classifier), ``out.loss`` is set; ``output_attentions`` is ``need_weights``."""
        need_weights = need_weights or bool(output_attentions)
        ids = input_ids if input_ids is not None else src
        mask = attention_mask if attention_mask is not None else src_mask
        if ids is None:
            raise ValueError("BERT needs input_ids (batch, seq)")
        out = self.encode_stack(ids, mask, token_type_ids, need_weights=need_weights)
        pooled = self.pooler(out.hidden) if self.pooler is not None else None
        if getattr(self.head, "reads_pooled", False):
            logits = self.head(pooled)
        else:
            logits = self.head(out.hidden, None if mask is None else mask.bool())
        return self.labelled(
            ModelOutput.of(
                logits,
                {"encoder": out},
                need_weights=need_weights,
                extras=None if pooled is None else {"pooled": pooled},
            ),
            labels,
        )


# ---- options ----------------------------------------------------------------------------------
def _init_weights(module: nn.Module, std: float) -> None:
    """BERT's initialisation: N(0, 0.02) weights, zero biases, unit layer norms (and, in
    ``build``, a zero padding embedding)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=std)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class BertConfig(EncoderDecoderConfig):
    """BERT; defaults are BERT-base (L 12, H 768, A 12)."""

    family: ClassVar[str] = "bert"

    variant: str = Field("bert", description="the registered variant this config started from")
    vocab_size: int = Field(
        30522, ge=1, le=MAX_VOCAB, description="WordPiece vocabulary (30522 in the released English models)"
    )
    d_model: int = Field(768, ge=1, le=MAX_WIDTH, description="hidden size H")
    n_heads: int = Field(12, ge=1, le=MAX_WIDTH, description="attention heads A")
    d_ff: int = Field(3072, ge=1, le=MAX_WIDTH, description="feed-forward width (4H)")
    max_len: int = Field(512, ge=1, le=MAX_LENGTH, description="learned positions")
    type_vocab_size: int = Field(2, ge=0, le=MAX_VOCAB, description="token types (segments A and B); 0: none")
    pooler: bool | None = Field(
        None, description="the dense + tanh pooler over the first token; null: only when the head reads it"
    )
    init_std: float = Field(0.02, gt=0, description="standard deviation of the normal initialisation")
    scale_embeddings: bool = Field(False, description="BERT does not scale its embeddings")
    positional: PositionalField = Field("learned", validate_default=True, description="learned absolute positions")
    norm: NormField = Field(
        {"kind": "layernorm", "eps": 1e-12}, validate_default=True, description="layer norm, eps 1e-12"
    )
    ffn: FFNField = Field(
        {"kind": "mlp", "activation": "gelu", "inner_dropout": False},
        validate_default=True,
        description="GELU feed-forward network, no dropout inside",
    )
    encoder: StackField | None = Field({"layers": 12}, validate_default=True, description="the encoder stack")
    decoder: StackField | None = Field(None, description="BERT has no decoder; leave null")
    head: HeadField = Field(
        {"kind": "lm", "bias": True},
        validate_default=True,
        description="lm: the masked-LM head; sequence-classification (cls pooling): on the pooler",
    )

    @model_validator(mode="after")
    def _bert(self) -> BertConfig:
        if self.decoder is not None or self.encoder is None:
            raise ValueError("BERT is encoder-only: keep encoder and set decoder: null")
        return self

    def build(self) -> Bert:
        token = nn.Embedding(self.vocab_size, self.d_model, padding_idx=self.pad_id)
        additive, in_attention = positional_modules(
            self.positional, d_model=self.d_model, n_heads=self.n_heads, max_len=self.max_len, head_dim=self.head_dim
        )
        embed = BertEmbeddings(
            token,
            nn.Embedding(self.type_vocab_size, self.d_model) if self.type_vocab_size else None,
            additive,
            self.norm.build(d_model=self.d_model),
            dropout=self.dropout,
            random_offset=self.positional.random_offset,
        )
        encoder = build_stack(self.encoder, self.layer_spec(in_attention=in_attention, final_norm=False))
        model = Bert(
            embed=embed,
            encoder=encoder,
            pooler=BertPooler(self.d_model) if self._pooled else None,
            head=self._head(token),
        )
        model.apply(lambda module: _init_weights(module, self.init_std))
        nn.init.zeros_(token.weight[self.pad_id])  # after the tied decoder's init, which shares this matrix
        return model

    @property
    def _pooled_head(self) -> bool:
        """BERT classifies sequences from the pooler's output (section 4.1)."""
        head = self.head
        return head.kind == "sequence-classification" and head.pooling == "cls" and self.pooler is not False

    @property
    def _pooled(self) -> bool:
        return self.pooler if self.pooler is not None else self._pooled_head

    def _head(self, token: nn.Embedding) -> nn.Module:
        kind = self.head.kind
        if kind == "lm":
            decoder = self.head.build(
                d_model=self.d_model,
                vocab_size=self.vocab_size,
                embedding=token,
                pad_id=self.pad_id,
                dropout=self.dropout,
            )
            activation = getattr(self.ffn, "activation", "gelu")
            return MaskedLMHead(self.d_model, activation, self.norm.build(d_model=self.d_model), decoder)
        if self._pooled_head:
            return PooledClassificationHead(self.d_model, self.head.num_classes, dropout=self.dropout)
        return self.head.build(
            d_model=self.d_model, vocab_size=self.vocab_size, embedding=token, pad_id=self.pad_id, dropout=self.dropout
        )


# ---- presets --------------------------------------------------------------------------------
def _preset(layers: int, width: int, heads: int) -> dict:
    """The sizes of Turc et al. 2019's compact BERTs: L layers, H wide, H/64 heads, 4H feed-forward."""
    return {"encoder": {"layers": layers}, "d_model": width, "n_heads": heads, "d_ff": 4 * width}


@hookimpl
def tzoo_variants():
    return [
        Variant(name="bert", config=BertConfig, description="Devlin et al. 2018, BERT-base defaults"),
        Variant(
            name="bert-base",
            config=BertConfig,
            defaults=_preset(12, 768, 12),
            description="base: 12 layers, d 768, 12 heads, 110M parameters",
        ),
        Variant(
            name="bert-small",
            config=BertConfig,
            defaults=_preset(4, 512, 8),
            description="small: 4 layers, d 512, 8 heads",
        ),
        Variant(
            name="bert-mini",
            config=BertConfig,
            defaults=_preset(4, 256, 4),
            description="mini: 4 layers, d 256, 4 heads",
        ),
        Variant(
            name="bert-tiny",
            config=BertConfig,
            defaults=_preset(2, 128, 2),
            description="tiny: 2 layers, d 128, 2 heads",
        ),
    ]


@hookimpl
def tzoo_importers():
    return [BERT_IMPORTER]
