"""Paired seeds (``pairing: seeds``): runs of different variants at one seed start from the same
values of every parameter whose name and shape agree, and draw the same random stream."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from transformer_zoo.api import build_model
from transformer_zoo.comparing.cache import KEY_VERSIONS, NOT_IN_KEY, data_files, run_key
from transformer_zoo.comparing.records import CompareResults
from transformer_zoo.comparing.runner import compare
from transformer_zoo.comparing.spec import load_spec, plan
from transformer_zoo.comparing.tuning import Tuned, TuneSpec, tuned_runs
from transformer_zoo.training.config import load_train_config, model_config_for
from transformer_zoo.training.placement import resolve_device
from transformer_zoo.training.trainer import Trainer, train

REVERSE = {"kind": "reverse", "train_size": 40, "test_size": 8, "train_lengths": [1, 5], "test_lengths": [6, 7]}
LISTOPS = {"kind": "listops", "train_size": 40, "test_size": 8, "max_length": 32}
PLAIN = "transformer-tiny"
LEARNED = {"variant": "transformer-tiny", "positional": "learned"}  # two more parameters: positional embeddings
NARROW = {"variant": "transformer-tiny", "positional": "learned", "d_ff": 128}  # and narrower feed-forward layers
ENCODER = {"variant": "transformer-tiny", "decoder": None}  # cannot do reverse (a seq2seq task)
SEED = 3


@pytest.fixture(scope="module")
def task():
    return load_train_config({"model": PLAIN, "task": REVERSE}).task.build()


def built(task, model, shared_init=None):
    """A trainer's model for ``task``, and the first draws of the random stream after it."""
    config = load_train_config({"model": model, "task": REVERSE, "seed": SEED, "shared_init": shared_init})
    trainer = Trainer(config, task=task, progress=False)
    model = trainer.build_model()
    return trainer, dict(model.named_parameters()), torch.rand(3)


def by_hand(task, model):
    """The model as a run built it before pairing existed: the seed, then the build."""
    config = load_train_config({"model": model, "task": REVERSE, "seed": SEED})
    torch.manual_seed(SEED)
    model = build_model(model_config_for(config, task))
    return dict(model.named_parameters()), torch.rand(3)


def test_a_parameter_takes_the_first_earlier_value_whose_name_and_shape_agree(task):
    _, plain, _ = built(task, PLAIN, [])
    _, learned, _ = built(task, LEARNED, [PLAIN])
    trainer, narrow, _ = built(task, NARROW, [PLAIN, LEARNED])
    _, alone, _ = built(task, NARROW)
    ffn = {name for name in narrow if ".ffn.linear1." in name or name.endswith(".ffn.linear2.weight")}
    positions = {"src_embed.positional.embedding.weight", "tgt_embed.positional.embedding.weight"}
    assert ffn and positions <= set(narrow)
    for name, value in narrow.items():
        if name in ffn:  # another shape in every earlier variant: its own
            assert value.shape != plain[name].shape and torch.equal(value, alone[name])
        elif name in positions:  # in the second variant alone
            assert torch.equal(value, learned[name])
        else:  # in both: the first's
            assert torch.equal(value, plain[name]), name
    assert not torch.equal(
        alone["encoder.layers.1.self_attn.in_proj.weight"], plain["encoder.layers.1.self_attn.in_proj.weight"]
    ), "unpaired, the variants start apart"
    later = "tgt_embed.positional.embedding.weight"  # drawn after the feed-forward layers, which differ
    assert not torch.equal(alone[later], learned[later]), "the second variant's value, not the run's own"
    assert set(trainer.shared.own) == ffn and set(trainer.shared.shared) == set(narrow) - ffn
    assert trainer.shared.shared_weights == sum(narrow[name].numel() for name in trainer.shared.shared)


def test_the_first_variant_and_an_unpaired_run_build_as_before(task):
    before, stream = by_hand(task, LEARNED)
    trainer, unpaired, after = built(task, LEARNED)
    first, paired, restarted = built(task, LEARNED, [])
    assert trainer.shared is None and first.shared.shared == [] and first.shared.own == list(paired)
    for name in before:
        assert torch.equal(unpaired[name], before[name]) and torch.equal(paired[name], before[name])
    assert torch.equal(after, stream), "an unpaired run's random stream goes on from its initialisation"
    torch.manual_seed(SEED)
    assert torch.equal(restarted, torch.rand(3)) and not torch.equal(restarted, stream)


def test_paired_variants_draw_the_same_random_stream_after_building(task):
    _, _, first = built(task, PLAIN, [])
    _, _, second = built(task, NARROW, [PLAIN])
    assert torch.equal(first, second)
    _, _, plain = built(task, PLAIN)
    _, _, narrow = built(task, NARROW)
    assert not torch.equal(plain, narrow), "unpaired, each stream goes on from what its initialisation drew"


def spec(**overrides):
    return load_spec(
        {
            "name": "paired",
            "variants": [PLAIN, ENCODER, {**LEARNED, "label": "learned"}],
            "tasks": [REVERSE, LISTOPS],
            "steps": 2,
            "seeds": [0, 1],
            "model": {"dropout": 0.0},
            "train": {"batch_size": 4},
            **overrides,
        }
    )


def test_the_plan_gives_each_run_the_variants_before_it_on_its_task():
    runs, skipped = plan(spec(pairing="seeds"))
    assert [(s.variant, s.task) for s in skipped] == [('transformer-tiny {"decoder"=null}', "reverse")]
    plain, encoder, learned = (
        {"variant": PLAIN, "dropout": 0.0},
        {**ENCODER, "dropout": 0.0},
        {**LEARNED, "dropout": 0.0},
    )  # the spec's model options applied, the label left out
    expected = {
        (PLAIN, "reverse"): [],
        ("learned", "reverse"): [plain],  # the encoder does not run reverse
        (PLAIN, "listops"): [],
        ('transformer-tiny {"decoder"=null}', "listops"): [plain],
        ("learned", "listops"): [plain, encoder],
    }
    assert {(label, config.task.name): config.shared_init for label, config in runs} == expected
    assert [config.model for label, config in runs if label == "learned"] == [learned] * 4, "as the runs use them"
    assert len(runs) == 10
    assert all(config.shared_init is None for _, config in plan(spec())[0])
    tuned = Tuned(
        variant="learned",
        task="listops",
        metric="accuracy",
        direction="maximize",
        best={"train.lr": 0.01},
        best_value=0.5,
        trials=[],
        steps=2,
        seconds=1.0,
        trained_steps=2,
        saved_steps=0,
    )
    twins = tuned_runs(TuneSpec(compare="both"), runs, [tuned])[len(runs) :]
    assert [config.shared_init for _, config in twins] == [config.shared_init for _, config in runs]
    assert [config.lr for label, config in twins if config.task.name == "listops" and "learned" in label] == [0.01] * 2


def test_a_resumed_run_still_lists_what_it_took(tmp_path):
    config = load_train_config({"model": LEARNED, "task": REVERSE, "steps": 2, "batch_size": 4, "shared_init": [PLAIN]})
    assert train(config, tmp_path / "run", progress=False, stop_after=1)["stopped"]
    summary = train(config, tmp_path / "run", progress=False)
    assert summary["resumed_from"] == 1
    assert summary["own"] == ["src_embed.positional.embedding.weight", "tgt_embed.positional.embedding.weight"]
    assert len(summary["shared"]) > 50 and summary["shared_weights"] < summary["parameters"]


@pytest.fixture(scope="module")
def paired(tmp_path_factory):
    out = tmp_path_factory.mktemp("paired")
    given = spec(pairing="seeds", variants=[PLAIN, {**LEARNED, "label": "learned"}], tasks=[LISTOPS], threads=1)
    return out, compare(given, out)


def test_a_paired_comparison_records_and_reports_what_each_run_took(paired):
    out, _ = paired
    results = CompareResults.model_validate_json((out / "results.json").read_text())
    assert results.spec["pairing"] == "seeds"
    runs = {(r.variant, r.seed): r for r in results.runs}
    assert sorted(runs) == [("learned", 0), ("learned", 1), (PLAIN, 0), (PLAIN, 1)]
    for seed in (0, 1):
        first, second = runs[PLAIN, seed], runs["learned", seed]
        assert first.shared == [] and first.shared_weights == 0
        assert first.own == second.shared, "the second takes every parameter of the first"
        assert second.own == ["src_embed.positional.embedding.weight"], "listops reads no target side"
        assert len(second.shared) > 10 and second.own[0] not in second.shared
        assert second.shared_weights == first.parameters < second.parameters
    text = (out / "report.md").read_text()
    section = text[text.index("## Paired seeds") : text.index("## How to read it")]
    share = runs["learned", 0].shared_weights / runs["learned", 0].parameters
    count = len(runs["learned", 0].shared)
    assert f"| listops | {PLAIN} | 0 of {count} | 0.0% | all |" in section
    assert (
        f"| listops | learned | {count} of {count + 1} | {share:.1%} | `src_embed.positional.embedding.weight` |"
        in section
    )


def test_an_unpaired_report_has_no_paired_section(tmp_path):
    given = spec(variants=[PLAIN], tasks=[LISTOPS], seeds=[0], threads=1)
    compare(given, tmp_path)
    assert "## Paired seeds" not in (tmp_path / "report.md").read_text()
    record = json.loads((tmp_path / "results.json").read_text())["runs"][0]
    assert (record["shared"], record["own"], record["shared_weights"]) == ([], [], 0)


def test_a_paired_run_is_a_cache_entry_of_its_own_and_an_unpaired_key_is_unchanged(task):
    def key(**fields):
        config = load_train_config({"model": LEARNED, "task": REVERSE, "seed": SEED, **fields})
        return config, run_key(config, model_config_for(config, task))

    config, unpaired = key()
    task_data = config.task.model_dump(mode="json", exclude={"id"})
    content = {  # a run's key as it was before runs could take initial values
        "model": model_config_for(config, task).model_dump(mode="json"),
        "task": task_data,
        "data": data_files(task_data),
        "train": {
            **config.model_dump(
                mode="json", exclude={"model", "task", "shared_init", "holdout", "holdout_seed", *NOT_IN_KEY}
            ),
            "device": resolve_device(config.device).type,
        },
        "probes": [],
        "versions": KEY_VERSIONS,
    }
    assert unpaired == hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
    first, second = key(shared_init=[])[1], key(shared_init=[PLAIN])[1]
    assert len({unpaired, first, second}) == 3, "a paired run restarts its stream, and takes values"
    assert key(shared_init=[{"variant": PLAIN}])[1] == second, "a source is keyed by its resolved config"
    assert key(shared_init=[{"variant": PLAIN, "d_ff": 128}])[1] != second


def test_paired_runs_of_one_variant_are_one_cache_folder_apart_from_unpaired_ones(paired, tmp_path):
    out, _ = paired
    given = spec(variants=[PLAIN], tasks=[LISTOPS], threads=1, cache=str(out / "runs"))
    results = compare(given, tmp_path)
    assert [r.reused for r in results.runs] == [False, False], "the paired first variant's runs are not reused"
    again = compare(
        spec(pairing="seeds", variants=[PLAIN], tasks=[LISTOPS], threads=1, cache=str(out / "runs")), tmp_path / "again"
    )
    assert [r.reused for r in again.runs] == [True, True], "but a paired run is, by a spec that pairs it alike"


def test_variants_of_one_model_are_shared_from_once_with_the_same_initial_values(task):
    """Variants of one model that train differently (a sweep's) give one entry of ``shared_init``:
    a repeat builds the same model again, so the run starts from the same values without it."""
    variants = [{"variant": PLAIN, "label": f"plain lr={lr}"} for lr in (1e-3, 1e-2)] + [{**LEARNED, "label": "l"}]
    runs, _ = plan(
        spec(
            variants=variants,
            tasks=[REVERSE],
            pairing="seeds",
            variant_train={"plain lr=0.001": {"lr": 1e-3}, "plain lr=0.01": {"lr": 1e-2}},
        )
    )
    plain = {"variant": PLAIN, "dropout": 0.0}
    assert {label: config.shared_init for label, config in runs} == {
        "plain lr=0.001": [],
        "plain lr=0.01": [plain],
        "l": [plain],
    }
    config = next(config for label, config in runs if label == "l").model_copy(update={"seed": SEED})
    once = Trainer(config, task=task, progress=False)
    twice = Trainer(config.model_copy(update={"shared_init": [plain, plain]}), task=task, progress=False)
    once_model, twice_model = once.build_model(), twice.build_model()
    assert once.shared == twice.shared
    assert set(once.shared.own) == {"src_embed.positional.embedding.weight", "tgt_embed.positional.embedding.weight"}
    twice_values = dict(twice_model.named_parameters())
    for name, value in once_model.named_parameters():
        assert torch.equal(value, twice_values[name]), name
