"""The base encoder-decoder and its configurations, and the errors bad inputs get."""

from __future__ import annotations

import pytest
import torch

import transformer_zoo as tz

SMALL = dict(vocab_size=40, d_model=32, n_heads=4, d_ff=64, dropout=0.0)


def test_encoder_only_classifier():
    model = tz.build_model(
        "transformer-tiny",
        decoder=None,
        head={"kind": "sequence-classification", "num_classes": 5, "pooling": "mean"},
        **SMALL,
    ).eval()
    assert model.architecture == "encoder-only"
    ids = torch.randint(1, 40, (3, 8))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    out = model(ids, src_mask=mask)
    assert out.logits.shape == (3, 5)
    changed = ids.clone()
    changed[0, 5:] = 7  # padding content must not matter with mean pooling and a padding mask
    torch.testing.assert_close(model(changed, src_mask=mask).logits[0], out.logits[0], atol=1e-6, rtol=1e-5)


def test_decoder_only_language_model():
    model = tz.build_model("transformer-tiny", encoder=None, norm_placement="pre", norm="rmsnorm", ffn="gated", **SMALL)
    assert model.architecture == "decoder-only"
    assert model.decoder.layers[0].cross_attn is None
    ids = torch.randint(1, 40, (2, 6))
    out = model(ids)
    assert out.logits.shape == (2, 6, 40)
    loss = model.loss(out, ids)
    loss.backward()
    assert torch.isfinite(loss)


def test_decoder_only_takes_its_mask_by_either_name():
    model = tz.build_model(
        "transformer-tiny", encoder=None, head={"kind": "sequence-classification", "pooling": "mean"}, **SMALL
    ).eval()
    ids = torch.randint(1, 40, (2, 6))
    mask = torch.ones_like(ids)
    mask[0, 3:] = 0
    by_tgt = model(tgt=ids, tgt_mask=mask).logits
    torch.testing.assert_close(model(ids, tgt_mask=mask).logits, by_tgt)
    torch.testing.assert_close(model(ids, src_mask=mask).logits, by_tgt)
    assert not torch.allclose(model(ids).logits, by_tgt)
    with pytest.raises(ValueError, match="give one mask"):
        model(ids, src_mask=mask, tgt_mask=mask)


def test_attention_weights_on_padded_batches_stay_finite():
    model = tz.build_model("transformer-tiny", **SMALL).eval()
    src, tgt = torch.randint(1, 40, (2, 5)), torch.randint(1, 40, (2, 4))
    src_mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])  # an all-padding source row
    tgt_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])  # left padding: query 0 has no key
    fast = model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask)
    slow = model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask, need_weights=True)
    assert torch.isfinite(slow.logits).all()
    torch.testing.assert_close(slow.logits, fast.logits, atol=1e-5, rtol=1e-5)


def test_batchnorm_variant_runs():
    model = tz.build_model("transformer-tiny", norm="batchnorm", **SMALL)
    out = model(torch.randint(1, 40, (2, 5)), torch.randint(1, 40, (2, 4)))
    assert torch.isfinite(out.logits).all()


def test_attention_weights_are_returned_only_when_asked():
    model = tz.build_model("transformer-tiny", **SMALL).eval()
    src, tgt = torch.randint(1, 40, (2, 5)), torch.randint(1, 40, (2, 4))
    assert model(src, tgt).attentions == {}
    out = model(src, tgt, need_weights=True)
    assert [w["self"].shape for w in out.attentions["encoder"]] == [(2, 4, 5, 5)] * 2
    assert out.attentions["decoder"][1]["cross"].shape == (2, 4, 4, 5)
    torch.testing.assert_close(out.logits, model(src, tgt).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda m: m(torch.tensor([[1, 40]]), torch.tensor([[1]])),
            r"contain 40, outside the vocabulary; ids must lie in \[0, 39\]",
        ),
        (lambda m: m(torch.tensor([[1, -1]]), torch.tensor([[1]])), r"contain -1"),
        (
            lambda m: m(torch.ones(2, 3, 4, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)),
            r"shape \(batch, seq\)",
        ),
        (lambda m: m(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.long)), r"integers"),
        (
            lambda m: m(
                torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long), src_mask=torch.ones(2, 4)
            ),
            r"src_mask has shape \(2, 4\)",
        ),
        (
            lambda m: tz.build_model("transformer-tiny", **SMALL, positional="learned")(
                torch.ones(1, 600, dtype=torch.long), torch.ones(1, 3, dtype=torch.long)
            ),
            r"learned positions have a vector for each of max_len=512 positions only",
        ),
        (lambda m: m(torch.ones(1, 3, dtype=torch.long)), r"needs tgt"),
        (
            lambda m: m(torch.ones(2, 3, dtype=torch.long), torch.ones(3, 3, dtype=torch.long)),
            r"src has batch size 2 but tgt has 3",
        ),
        (lambda m: m(torch.ones(2, 0, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)), r"empty"),
        (
            lambda m: m(
                torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long), src_mask=[[1, 1, 1]] * 2
            ),
            r"src_mask must be a torch.Tensor",
        ),
    ],
)
def test_bad_inputs_say_what_was_expected(call, message):
    model = tz.build_model("transformer-tiny", **SMALL)
    with pytest.raises(ValueError, match=message):
        call(model)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_token_loss_is_the_mean_over_counted_targets_and_zero_when_none_count(smoothing):
    from transformer_zoo.core.model import token_loss

    logits = torch.randn(3, 5, 7, requires_grad=True)
    targets = torch.randint(0, 7, (3, 5))
    targets[0, :3] = -100
    expected = torch.nn.functional.cross_entropy(
        logits.flatten(0, -2), targets.flatten(), ignore_index=-100, label_smoothing=smoothing
    )
    torch.testing.assert_close(token_loss(logits, targets, -100, smoothing), expected)
    # a masked-LM slice with no masked token: a plain mean is NaN, which would stop training
    none = token_loss(logits, torch.full((3, 5), -100), -100, smoothing)
    none.backward()
    assert none.item() == 0.0 and torch.equal(logits.grad, torch.zeros_like(logits))


def test_outputs_are_read_as_transformers_outputs_are():
    torch.manual_seed(0)
    model = tz.build_model("universal-transformer-encoder-tiny").eval()
    ids = torch.randint(1, 50, (2, 5))
    out = model(ids)
    assert out.keys() == ["logits", "hidden", "aux_loss", "extras"]  # no attention weights asked for: left out
    assert out["logits"] is out.logits and out[0] is out.logits and out[1] is out.hidden
    assert out.to_tuple() == tuple(out.values()) and len(out) == 4 and list(out) == out.keys()
    assert out[:2] == (out.logits, out.hidden) and dict(out.items())["aux_loss"] is out.aux_loss
    with pytest.raises(KeyError, match="'attentions' is not set in this output; set: logits, hidden, aux_loss"):
        out["attentions"]
    assert "attentions" in model(ids, need_weights=True).keys()
