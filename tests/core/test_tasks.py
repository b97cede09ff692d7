"""core.tasks: the task contract (inputs, metrics and their directions, one fitness check and one
set of overrides for every input kind), and BERT's masked-LM corruption (15% selected; of those
80% [MASK], 10% random, 10% unchanged)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from transformer_zoo.core.tasks import ClassificationTask, LanguageModelTask, Task, mask_tokens

SPECIAL = (0, 1, 2, 4)  # pad, bos, eos, unk
MASK = 3


def corrupt(seed: int = 0):
    ids = torch.randint(5, 200, (256, 128), generator=torch.Generator().manual_seed(100))
    ids[:, 0], ids[:, -1], ids[:, -10:-1] = 1, 2, 0  # bos ... eos, padding before it
    inputs, targets = mask_tokens(
        ids, mask_id=MASK, vocab_size=200, special_ids=SPECIAL, generator=torch.Generator().manual_seed(seed)
    )
    return ids, inputs, targets


def test_selection_and_replacement_rates():
    ids, inputs, targets = corrupt()
    ordinary = ~torch.isin(ids, torch.tensor(SPECIAL))
    chosen = targets != 0
    assert not chosen[~ordinary].any(), "special tokens are never selected"
    assert (inputs[~ordinary] == ids[~ordinary]).all()
    assert (targets[chosen] == ids[chosen]).all(), "targets are the original tokens"
    assert abs(chosen.sum() / ordinary.sum() - 0.15) < 0.01
    masked = (inputs[chosen] == MASK).float().mean()
    kept = (inputs[chosen] == ids[chosen]).float().mean()
    replaced = ((inputs[chosen] != MASK) & (inputs[chosen] != ids[chosen])).float().mean()
    assert abs(masked - 0.8) < 0.02 and abs(kept - 0.1) < 0.02 and abs(replaced - 0.1) < 0.02
    assert (inputs[~chosen] == ids[~chosen]).all(), "unselected tokens are untouched"
    assert not torch.isin(inputs[chosen & (inputs != MASK)], torch.tensor(SPECIAL)).any(), "no special replacement"


def test_a_generator_makes_it_repeatable():
    assert all(torch.equal(a, b) for a, b in zip(corrupt(1)[1:], corrupt(1)[1:]))
    assert not torch.equal(corrupt(1)[1], corrupt(2)[1])


def test_a_batch_always_has_something_to_predict():
    ids = torch.tensor([[1, 7, 8, 2, 0]])
    for seed in range(20):
        _, targets = mask_tokens(
            ids,
            mask_id=MASK,
            vocab_size=10,
            special_ids=SPECIAL,
            probability=1e-9,
            generator=torch.Generator().manual_seed(seed),
        )
        chosen = (targets != 0).nonzero()[:, 1].tolist()
        assert len(chosen) == 1 and chosen[0] in (1, 2)


TOKEN_MODEL = SimpleNamespace(variant="t", encoder=object(), decoder=None)  # a config with no inputs: tokens
IMAGE_CLASSIFIER = SimpleNamespace(variant="i", inputs="image", objective="image-classification")


class Sounds(Task):
    """A task of a new input kind: it touches no other file."""

    inputs = frozenset({"audio"})
    objective = "audio-classification"
    metrics = {"word_error_rate": "lower", "accuracy": "higher"}

    def model_overrides(self, config):
        return {"sample_rate": 16_000}


def test_a_task_declares_its_inputs_and_its_metrics_with_their_directions():
    assert ClassificationTask().metric == "accuracy" and LanguageModelTask().metric == "perplexity"
    assert Sounds().metric == "word_error_rate"
    assert LanguageModelTask.metrics["perplexity"] == Sounds.metrics["word_error_rate"] == "lower"
    assert ClassificationTask.metrics["accuracy"] == "higher"


def test_one_fitness_check_refuses_a_model_that_reads_none_of_the_inputs():
    assert ClassificationTask().unfit_reason(TOKEN_MODEL) is None
    assert (
        ClassificationTask().unfit_reason(IMAGE_CLASSIFIER)
        == "the model reads images, and this task has none (it offers tokens)"
    )
    assert (
        ClassificationTask().unfit_reason(SimpleNamespace(encoder=None))
        == "a classification task needs a model with an encoder"
    )
    assert Sounds().unfit_reason(TOKEN_MODEL) == "the model reads tokens, and this task has none (it offers audio)"
    assert Sounds().unfit_reason(SimpleNamespace(inputs="audio")) is None
    assert Sounds().model_overrides(SimpleNamespace(inputs="audio")) == {"sample_rate": 16_000}


def test_a_model_of_a_new_input_kind_gets_the_batch_key_of_that_name():
    class Sounds(Task):
        inputs = frozenset({"tokens", "audio"})

    batch = {"src": torch.ones(2, 3), "audio": torch.zeros(2, 16), "targets": torch.ones(2)}
    listener = SimpleNamespace(config=SimpleNamespace(inputs="audio", variant="listener"))
    reader = SimpleNamespace(config=SimpleNamespace(inputs="tokens", variant="reader"))
    assert list(Sounds().model_inputs(listener, batch)) == ["audio"]
    assert list(Sounds().model_inputs(reader, batch)) == ["src"]
    with pytest.raises(ValueError, match="reads audio, and task .* has none"):
        Sounds().model_inputs(listener, {"src": batch["src"]})


def test_an_answer_task_scores_the_asked_positions_and_leaves_out_examples_that_ask_nothing():
    import datasets

    from transformer_zoo.core.tasks import AnswerTask

    class Echo(torch.nn.Module):
        """Answers each position with its own input id (an encoder's reading: src)."""

        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def forward(self, src, src_mask):
            return SimpleNamespace(logits=torch.nn.functional.one_hot(src, 8).float())

    class Asked(AnswerTask):
        splits = ("train", "test")
        vocab_size = 8

        def dataset(self, split):
            rows = [
                {"ids": [3, 4, 5], "answers": [0, 4, 6]},  # one right of two asked
                {"ids": [3, 4, 5], "answers": [3, 0, 5]},  # both right
                {"ids": [3, 4, 5], "answers": [0, 0, 0]},  # asks nothing: not an example scored
            ]
            return datasets.Dataset.from_list(rows)

    scores = Asked().evaluate(Echo(), "test")
    assert scores == {"accuracy": 3 / 4, "sequence_accuracy": 1 / 2}
