"""The transformer family against torch.nn.Transformer on copied weights, and its mask."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask
from transformer_zoo.training.config import load_train_config, lr_factor

D, H, FF, LAYERS, VOCAB = 32, 4, 64, 2, 50


def copy_attention(ours, ref: nn.MultiheadAttention) -> None:
    ours.in_proj.weight.data.copy_(ref.in_proj_weight)
    ours.in_proj.bias.data.copy_(ref.in_proj_bias)
    ours.out_proj.load_state_dict(ref.out_proj.state_dict())


def copy_layer(ours, ref) -> None:
    """Copy an nn.TransformerEncoderLayer or nn.TransformerDecoderLayer into our layer."""
    copy_attention(ours.self_attn, ref.self_attn)
    ref_norms = [ref.norm1, ref.norm2]
    if isinstance(ref, nn.TransformerDecoderLayer):
        copy_attention(ours.cross_attn, ref.multihead_attn)
        ref_norms.append(ref.norm3)
    ours.ffn.linear1.load_state_dict(ref.linear1.state_dict())
    ours.ffn.linear2.load_state_dict(ref.linear2.state_dict())
    for mine, theirs in zip(ours.norms, ref_norms, strict=True):
        mine.load_state_dict(theirs.state_dict())


def build(**overrides):
    config = dict(
        vocab_size=VOCAB,
        d_model=D,
        n_heads=H,
        d_ff=FF,
        dropout=0.0,
        encoder={"layers": LAYERS},
        decoder={"layers": LAYERS},
    )
    return tz.build_model("transformer", **{**config, **overrides}).eval()


def future_mask(length: int) -> torch.Tensor:
    """nn.Transformer's convention: True where a query may NOT attend."""
    return torch.ones(length, length, dtype=torch.bool).triu(1)


def padded_batch():
    src = torch.randint(1, VOCAB, (3, 9))
    tgt = torch.randint(1, VOCAB, (3, 6))
    src_mask = torch.ones_like(src)
    src_mask[0, 6:] = 0
    src_mask[2, 4:] = 0
    tgt_mask = torch.ones_like(tgt)
    tgt_mask[1, 4:] = 0
    return src, tgt, src_mask, tgt_mask


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_matches_torch(activation):
    model = build(ffn={"activation": activation})
    ref_layer = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, activation=activation, batch_first=True)
    ref = nn.TransformerEncoder(ref_layer, LAYERS, enable_nested_tensor=False).eval()
    for ours, theirs in zip(model.encoder.layers, ref.layers, strict=True):
        copy_layer(ours, theirs)
    x = torch.randn(3, 9, D)
    _, _, src_mask, _ = padded_batch()
    expected = ref(x, src_key_padding_mask=~src_mask.bool())
    got = model.encoder(x, self_mask=AttentionMask(padding=src_mask.bool())).hidden
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_decoder_matches_torch():
    model = build()
    ref_layer = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True)
    ref = nn.TransformerDecoder(ref_layer, LAYERS).eval()
    for ours, theirs in zip(model.decoder.layers, ref.layers, strict=True):
        copy_layer(ours, theirs)
    x, memory = torch.randn(3, 6, D), torch.randn(3, 9, D)
    _, _, src_mask, tgt_mask = padded_batch()
    causal = future_mask(6)
    expected = ref(
        x,
        memory,
        tgt_mask=causal,
        tgt_key_padding_mask=~tgt_mask.bool(),
        memory_key_padding_mask=~src_mask.bool(),
        tgt_is_causal=True,
    )
    got = model.decoder(
        x,
        memory,
        self_mask=AttentionMask(padding=tgt_mask.bool(), causal=True),
        memory_mask=AttentionMask(padding=src_mask.bool()),
    ).hidden
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_full_model_matches_torch(placement):
    """End to end from ids: our embeddings feed nn.Transformer (final norms included) and ours."""
    model = build(norm_placement=placement, final_norm=True)
    ref = nn.Transformer(D, H, LAYERS, LAYERS, FF, dropout=0.0, batch_first=True, norm_first=placement == "pre")
    ref.eval()
    for ours, theirs in zip(model.encoder.layers, ref.encoder.layers, strict=True):
        copy_layer(ours, theirs)
    for ours, theirs in zip(model.decoder.layers, ref.decoder.layers, strict=True):
        copy_layer(ours, theirs)
    model.encoder.final_norm.load_state_dict(ref.encoder.norm.state_dict())
    model.decoder.final_norm.load_state_dict(ref.decoder.norm.state_dict())

    src, tgt, src_mask, tgt_mask = padded_batch()
    hidden = ref(
        model.src_embed(src),
        model.tgt_embed(tgt),
        src_key_padding_mask=~src_mask.bool(),
        tgt_key_padding_mask=~tgt_mask.bool(),
        memory_key_padding_mask=~src_mask.bool(),
        tgt_mask=future_mask(tgt.size(1)),
        tgt_is_causal=True,
    )
    out = model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask)
    torch.testing.assert_close(out.hidden, hidden, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.logits, model.head(hidden), atol=1e-5, rtol=1e-5)


def test_paper_defining_properties():
    model = build()
    emb = model.src_embed
    assert model.tgt_embed.token is emb.token, "source and target share one embedding table"
    assert model.head.proj.weight is emb.token.weight, "the generator is tied to the embeddings"
    assert emb.scale == pytest.approx(D**0.5)
    assert model.head.label_smoothing == pytest.approx(0.1)
    assert all(layer.placement == "post" for layer in model.encoder.layers), "post-norm, as in the paper"
    ids = torch.tensor([[3, 4, 5]])
    expected = emb.token(ids) * D**0.5 + emb.positional.table[:3]
    torch.testing.assert_close(emb(ids), expected)


def test_presets_have_the_paper_sizes():
    base = tz.load_config({"variant": "transformer-base"})
    big = tz.load_config({"variant": "transformer-big"})
    assert (base.d_model, base.n_heads, base.d_ff, base.encoder.layers, base.decoder.layers) == (512, 8, 2048, 6, 6)
    assert (big.d_model, big.n_heads, big.d_ff, big.encoder.layers, big.decoder.layers) == (1024, 16, 4096, 6, 6)
    assert big.dropout == pytest.approx(0.3)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rotary", "alibi"])
@pytest.mark.parametrize("with_mask", [False, True])
def test_future_tokens_never_change_earlier_outputs(positional, with_mask):
    model = build(positional=positional)
    src, tgt, src_mask, _ = padded_batch()
    tgt_mask = torch.ones_like(tgt) if with_mask else None  # a mask forces the explicit-mask kernel
    base = model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask).logits
    for t in range(tgt.size(1) - 1):
        changed = tgt.clone()
        changed[:, t + 1 :] = torch.randint(1, VOCAB, changed[:, t + 1 :].shape)
        assert not torch.equal(changed, tgt)
        out = model(src, changed, src_mask=src_mask, tgt_mask=tgt_mask).logits
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], atol=1e-6, rtol=1e-6)
        assert not torch.allclose(out[:, t + 1 :], base[:, t + 1 :]), "the perturbation must be visible later"


def test_trainings_inverse_sqrt_schedule_is_equation_3():
    """With lr = (d_model * warmup)^-0.5, training's schedule is d_model^-0.5 * min(n^-0.5, n * warmup^-1.5)
    at training step n (the paper's eq. 3); step n is the optimizer step with index n - 1."""
    d_model, warmup = 512, 4000
    config = load_train_config(
        {
            "model": {"variant": "transformer-base"},
            "task": {"kind": "copy"},
            "steps": 100000,
            "schedule": "inverse-sqrt",
            "warmup_steps": warmup,
            "lr": (d_model * warmup) ** -0.5,
        }
    )
    rates = [config.lr * lr_factor(index, config) for index in range(8000)]
    paper = [d_model**-0.5 * min(n**-0.5, n * warmup**-1.5) for n in range(1, 8001)]
    assert rates == pytest.approx(paper, rel=1e-12)
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == warmup
