"""What a model is called with: anything but the documented tensors is a ValueError saying what
was expected, in every family; a NaN pixel propagates to the outputs it reaches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.decoding import beam_search, check_count, greedy_decode
from transformer_zoo.core.embedding import check_token_ids

TOKEN_MODELS = [name for name in tz.list_variants("*tiny") if tz.load_config(name).inputs == "tokens"]
IMAGE_MODELS = [name for name in tz.list_variants("*tiny") if tz.load_config(name).inputs == "image"]


@pytest.fixture(scope="module", params=TOKEN_MODELS)
def token_model(request):
    torch.manual_seed(0)
    return tz.build_model(request.param, dropout=0.0).eval()


@pytest.fixture(scope="module", params=IMAGE_MODELS)
def image_model(request):
    torch.manual_seed(0)
    return tz.build_model(request.param).eval()


@pytest.fixture(scope="module")
def gan():
    torch.manual_seed(0)
    return tz.build_model("sagan-gan").eval()


def ids(model, batch: int = 2, length: int = 5) -> torch.Tensor:
    return torch.randint(1, model.config.vocab_size, (batch, length))


def call(model, src: object, tgt: object | None = None):
    """The model's forward on ``src`` (and ``tgt`` for an encoder-decoder; a good one if not given)."""
    if model.architecture == "encoder-decoder":
        return model(src, ids(model) if tgt is None else tgt)
    return model(src)


def test_the_families_are_all_here():
    assert {
        "transformer-tiny",
        "bert-tiny",
        "universal-transformer-tiny",
        "universal-transformer-encoder-tiny",
        "local-global-encoder-tiny",
        "transformer-dmca-tiny",
    } <= set(TOKEN_MODELS)
    assert {"vit-tiny", "image-transformer-tiny", "sagan-classifier-tiny"} <= set(IMAGE_MODELS)


# ---- token ids ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "convert, message",
    [
        (
            lambda t: t.tolist(),
            (
                r"must be a torch.Tensor of shape \(batch, seq\) and dtype torch.long, got list \(convert it "
                r"with torch.as_tensor\)"
            ),
        ),
        (lambda t: t.numpy(), r"must be a torch.Tensor .*, got numpy.ndarray \(convert it with torch.as_tensor\)"),
        (
            lambda t: t.to(torch.uint8),
            (
                r"must be integers of dtype torch.long \(or torch.int32\), got torch.uint8; "
                r"convert with .long\(\)"
            ),
        ),
        (lambda t: t.to(torch.int16), r"got torch.int16"),
        (lambda t: t.float(), r"got torch.float32"),
        (lambda t: t.bool(), r"got torch.bool"),
        (lambda t: t[:0], r": an empty batch \(shape \(0, 5\)\); give at least one sequence"),
        (lambda t: t[:, :0], r"the sequences of .* are empty \(shape \(2, 0\)\); give at least one token per sequence"),
        (lambda t: t[0], r"must have shape \(batch, seq\), got shape \(5,\)"),
        (lambda t: t[0, 0], r"must have shape \(batch, seq\), got shape \(\)"),
    ],
)
def test_token_ids_other_than_a_long_batch_are_refused(token_model, convert, message):
    with pytest.raises(ValueError, match=message):
        call(token_model, convert(ids(token_model)))


def test_int32_ids_are_accepted_as_nn_embedding_accepts_them(token_model):
    good = ids(token_model)
    with torch.no_grad():
        torch.testing.assert_close(
            call(token_model, good.int(), None).logits.shape, call(token_model, good, None).logits.shape
        )


@pytest.mark.parametrize(
    "head",
    [
        {"kind": "lm"},
        {"kind": "sequence-classification", "num_classes": 3},
        {"kind": "token-classification", "num_classes": 3},
    ],
)
def test_int32_targets_give_the_loss_of_int64_ones(head):
    torch.manual_seed(0)
    model = tz.build_model("bert-tiny", head=head, dropout=0.0)
    output = model(ids(model, length=6))
    targets = torch.randint(0, 3, output.logits.shape[:-1])
    torch.testing.assert_close(model.loss(output, targets.int()), model.loss(output, targets), rtol=0, atol=0)


def test_int32_labels_give_the_loss_of_int64_ones(image_model):
    output = image_model(torch.rand(2, image_model.config.channels, *image_model.config.image_size))
    labels = torch.tensor([1, 2])
    torch.testing.assert_close(image_model.loss(output, labels.int()), image_model.loss(output, labels), rtol=0, atol=0)


@pytest.mark.parametrize(
    "convert, message",
    [
        (lambda t: t.tolist(), "tgt must be a torch.Tensor"),
        (lambda t: t.to(torch.uint8), "tgt must be integers of dtype torch.long"),
        (lambda t: t[:0], r"tgt: an empty batch"),
    ],
)
def test_target_ids_of_an_encoder_decoder_are_checked_too(convert, message):
    model = tz.build_model("transformer-tiny").eval()
    with pytest.raises(ValueError, match=message):
        model(ids(model), convert(ids(model)))
    with pytest.raises(ValueError, match=message):
        model.decode(convert(ids(model)), model.encode(ids(model)).hidden)


def test_a_source_mask_given_as_a_list_to_decode_is_refused():
    model = tz.build_model("transformer-tiny").eval()
    memory = model.encode(ids(model)).hidden
    with pytest.raises(ValueError, match="src_mask must be a torch.Tensor"):
        model.decode(ids(model), memory, src_mask=[[1] * 5] * 2)
    with pytest.raises(TypeError, match="src_mask must be a torch.Tensor"):  # a wrong type is a TypeError too
        model(ids(model), ids(model), src_mask=[[1] * 5] * 2)
    with pytest.raises(TypeError, match="tgt must be a torch.Tensor"):
        model(ids(model), ids(model).tolist())


def test_bert_names_its_own_arguments():
    model = tz.build_model("bert-tiny").eval()
    good = ids(model)
    with pytest.raises(ValueError, match="input_ids must be integers of dtype torch.long"):
        model(input_ids=good.to(torch.uint8), attention_mask=torch.ones_like(good))
    with pytest.raises(ValueError, match="input_ids must be a torch.Tensor"):
        model.encode(good.numpy())
    with pytest.raises(ValueError, match="token_type_ids must be a torch.Tensor"):
        model(good, token_type_ids=good.tolist())


# ---- images ---------------------------------------------------------------------------------
def images(model, batch: int = 2) -> torch.Tensor:
    return torch.rand(batch, model.config.channels, *model.config.image_size)


@pytest.mark.parametrize(
    "convert, message",
    [
        (lambda x: x.tolist(), r"images must be a torch.Tensor of shape \(batch, 1, 8, 8\), got list"),
        (lambda x: x.numpy(), r"got numpy.ndarray \(convert it with torch.as_tensor\)"),
        (
            lambda x: x.double(),
            (
                r"images must have the model's dtype torch.float32, got torch.float64; convert with "
                r".to\(torch.float32\)"
            ),
        ),
        (
            lambda x: x.half(),
            (
                r"images must have the model's dtype torch.float32, got torch.float16; convert with "
                r".to\(torch.float32\), or run under torch.autocast"
            ),
        ),
        (lambda x: (x * 255).to(torch.uint8), "expected float images"),
        (lambda x: x[:0], r"images: an empty batch \(shape \(0, 1, 8, 8\)\); give at least one image"),
        (lambda x: x[0], r"expected images of shape \(batch, 1, 8, 8\), got \(1, 8, 8\)"),
    ],
)
def test_images_other_than_a_float_batch_of_the_models_dtype_are_refused(image_model, convert, message):
    with pytest.raises(ValueError, match=message):
        image_model(convert(images(image_model)))


def test_float64_images_are_what_a_float64_model_takes():
    model = tz.build_model("vit-tiny").eval().double()
    assert model(images(model).double()).logits.dtype == torch.float64


def test_under_autocast_the_images_dtype_is_left_to_autocast_but_float64_is_not_cast():
    model = tz.build_model("vit-tiny").eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(images(model).half()).logits.shape == (2, 10)
        with pytest.raises(ValueError, match=r"got torch.float64; convert with .to\(torch.float32\)$"):
            model(images(model).double())


def test_a_nan_pixel_propagates_to_its_images_logits_only(image_model):
    """Documented: pixel values are not checked (a device sync per call); the NaN reaches the
    logits of its own image, so no finite answer is given for it and a loss over it is NaN."""
    x = images(image_model, batch=3)
    x[1, 0, 3, 4] = float("nan")
    with torch.no_grad():
        logits = image_model(x).logits
    assert logits[1].isnan().all()
    assert torch.isfinite(logits[[0, 2]]).all()
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2]))
    assert not torch.isfinite(loss)


def test_an_infinite_pixel_gives_no_finite_answer(image_model):
    x = images(image_model)
    x[0, 0, 0, 0] = float("inf")
    with torch.no_grad():
        logits = image_model(x).logits
    assert not torch.isfinite(logits[0]).all()


# ---- the GAN --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "labels, message",
    [
        ([1, 2], r"labels must be a torch.Tensor of class ids, of shape \(batch,\) and dtype long, got list"),
        (np.array([1, 2]), "got numpy.ndarray"),
        (torch.tensor([], dtype=torch.long), r"labels: an empty batch \(shape \(0,\)\)"),
        (torch.tensor([1, 2], dtype=torch.uint8), "labels must be class ids of shape"),
    ],
)
def test_gan_labels_other_than_a_long_batch_are_refused(gan, labels, message):
    with pytest.raises(ValueError, match=message):
        gan(labels)
    with pytest.raises(ValueError, match=message):
        gan.discriminate(images(gan), labels)


@pytest.mark.parametrize(
    "noise, message",
    [
        (lambda: torch.randn(2, 32).double(), "noise must have the model's dtype torch.float32, got torch.float64"),
        (lambda: torch.randn(2, 32).tolist(), r"noise must be a torch.Tensor of shape \(batch, 32\), got list"),
        (lambda: torch.randn(3, 32), r"noise must be \(batch, 32\) for 2 labels"),
    ],
)
def test_gan_noise_is_checked(gan, noise, message):
    with pytest.raises(ValueError, match=message):
        gan(torch.tensor([1, 2]), noise=noise())


def test_gan_images_are_checked_like_a_classifiers(gan):
    labels = torch.tensor([1, 2])
    with pytest.raises(ValueError, match="images must have the model's dtype torch.float32, got torch.float64"):
        gan.discriminate(images(gan).double(), labels)
    with pytest.raises(ValueError, match="images must be a torch.Tensor"):
        gan.discriminate(images(gan).numpy(), labels)
    with pytest.raises(ValueError, match="images: an empty batch"):
        gan.discriminate(images(gan)[:0], labels[:0])
    with pytest.raises(ValueError, match="expected one label per image, got 3 labels for 2 images"):
        gan.discriminate(images(gan), torch.tensor([1, 2, 3]))


def test_gan_noise_follows_the_models_dtype(gan):
    model = tz.build_model("sagan-gan").eval().double()
    assert model.noise(2).dtype == torch.float64
    assert model(torch.tensor([1, 2])).logits.dtype == torch.float64


def test_a_nan_pixel_makes_its_images_score_nan(gan):
    x = images(gan, batch=3)
    x[2, 0, 5, 5] = float("nan")
    with torch.no_grad():
        scores, _ = gan.discriminate(x, torch.tensor([0, 1, 2]))
    assert scores[2].isnan() and torch.isfinite(scores[:2]).all()


# ---- decoding -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def translator():
    torch.manual_seed(0)
    return tz.build_model("transformer-tiny", dropout=0.0).eval()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_new_tokens": -1}, "max_new_tokens must be an integer of at least 0, got -1"),
        ({"max_new_tokens": 2.5}, "max_new_tokens must be an integer of at least 0, got 2.5"),
        ({"max_new_tokens": True}, "max_new_tokens must be an integer of at least 0, got True"),
        ({"bos_id": -1}, "bos_id must be an integer of at least 0, got -1"),
        ({"eos_id": 1.0}, "eos_id must be an integer of at least 0, got 1.0"),
        ({"pad_id": -3}, "pad_id must be an integer of at least 0, got -3"),
    ],
)
def test_greedy_decoding_refuses_negative_or_fractional_counts_and_ids(translator, kwargs, message):
    with pytest.raises(ValueError, match=message):
        greedy_decode(translator, ids(translator), **{"bos_id": 1, "eos_id": 2, **kwargs})


def test_greedy_decoding_of_zero_tokens_gives_the_start(translator):
    out = greedy_decode(translator, ids(translator), bos_id=1, max_new_tokens=0)
    assert out.tolist() == [[1], [1]]


def test_greedy_decoding_checks_its_prompt_and_source(translator):
    with pytest.raises(ValueError, match="src must be a torch.Tensor"):
        greedy_decode(translator, ids(translator).tolist(), bos_id=1)
    lm = tz.build_model("transformer-dmca-tiny").eval()
    with pytest.raises(ValueError, match="prompt must be a torch.Tensor"):
        greedy_decode(lm, prompt=ids(lm).tolist())
    with pytest.raises(ValueError, match="prompt: an empty batch"):
        greedy_decode(lm, prompt=ids(lm)[:0])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"beam_size": 0}, "beam_size must be an integer of at least 1, got 0"),
        ({"beam_size": -2}, "beam_size must be an integer of at least 1, got -2"),
        ({"beam_size": 2.0}, "beam_size must be an integer of at least 1, got 2.0"),
        ({"max_new_tokens": -1}, "max_new_tokens must be an integer of at least 0, got -1"),
        ({"bos_id": -1}, "bos_id must be an integer of at least 0"),
        (
            {"eos_id": 10**6},
            r"eos_id=1000000 and pad_id=1000000 must be token ids of the model's vocabulary, below 1000",
        ),
        ({"pad_id": 5000}, r"pad_id=5000 must be token ids of the model's vocabulary"),
    ],
)
def test_beam_search_refuses_bad_sizes_and_ids(translator, kwargs, message):
    with pytest.raises(ValueError, match=message):
        beam_search(translator, ids(translator), **{"bos_id": 1, "eos_id": 2, **kwargs})


def test_beam_search_checks_its_source(translator):
    with pytest.raises(ValueError, match="src must be a torch.Tensor"):
        beam_search(translator, ids(translator).numpy(), bos_id=1, eos_id=2)
    with pytest.raises(ValueError, match="src must be integers of dtype torch.long"):
        beam_search(translator, ids(translator).to(torch.uint8), bos_id=1, eos_id=2)


def test_beam_search_of_zero_tokens_gives_the_start(translator):
    tokens, scores = beam_search(translator, ids(translator), bos_id=1, eos_id=2, max_new_tokens=0)
    assert tokens.tolist() == [[1], [1]] and scores.tolist() == [0.0, 0.0]


# ---- the shared checks ----------------------------------------------------------------------
def test_the_checks_read_no_values_unless_given_a_vocabulary():
    meta = torch.empty(2, 5, dtype=torch.long, device="meta")  # no values to read
    check_token_ids(meta, name="ids")
    with pytest.raises(ValueError, match=r"ids contain 7, outside the vocabulary; ids must lie in \[0, 4\]"):
        check_token_ids(torch.tensor([[1, 7]]), 5, "ids")


@pytest.mark.parametrize("value", [-1, 1.5, True, None, "3"])
def test_check_count_takes_only_integers(value):
    with pytest.raises(ValueError, match=f"n must be an integer of at least 0, got {value!r}"):
        check_count(value, "n", 0)
