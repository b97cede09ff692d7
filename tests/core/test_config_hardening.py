"""Bad configs a careless or hostile user gives: each is refused at once, naming the field.

One test per defect found by trying the zoo as such a user would: sizes that hang or exhaust
memory, kinds of the wrong type, numbers that are not numbers (booleans, inf, NaN, integers past
64 bits), malformed overrides, repeated keys in config files, and empty file patterns.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import transformer_zoo as tz
from transformer_zoo import api, cli
from transformer_zoo.core.options import CATEGORIES, VariantConfig
from transformer_zoo.core.validation import MAX_LAYERS, Options
from transformer_zoo.registry import get_registry
from transformer_zoo.training.config import TrainConfig, load_train_config


def refused(capsys, *argv: str) -> str:
    """Run ``tzoo argv`` and return its error line, asserting exit status 2 and no traceback."""
    start = time.perf_counter()
    assert cli.main(list(argv)) == 2
    assert time.perf_counter() - start < 10, "refused at once, not after a long build"
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err, err
    return " ".join(err.split())


# ---- sizes that hung ----------------------------------------------------------------------------
def test_a_trillion_layers_is_refused_at_once_naming_the_field(capsys):
    err = refused(capsys, "show", "transformer-tiny", "--set", "decoder.layers=1000000000000")
    assert "decoder.layers: Input should be less than or equal to 1024" in err


@pytest.mark.parametrize(
    ("variant", "override", "field"),
    [
        ("transformer-tiny", "d_model=1000000", "d_model"),
        ("transformer-tiny", "vocab_size=100000000000", "vocab_size"),
        ("transformer-tiny", "max_len=100000000000", "max_len"),
        ("universal-transformer-tiny", "encoder.layers=5000", "encoder.layers"),
        ("vit-tiny", "image_size=[100000, 8]", "image_size.0"),
        ("sagan-classifier-tiny", "widths=[8, 10000000]", "widths.1"),
        ("local-global-encoder-tiny", "encoder.attention.window=100000000000", "encoder.attention.window"),
    ],
)
def test_every_size_has_an_upper_bound(capsys, variant, override, field):
    assert f"{field}: Input should be less than or equal to" in refused(capsys, "show", variant, "--set", override)


def test_the_largest_allowed_depth_still_validates_and_counts_quickly():
    config = tz.load_config("transformer-tiny", [f"decoder.layers={MAX_LAYERS}"])
    assert config.decoder.layers == MAX_LAYERS


def test_from_pretrained_refuses_a_config_asking_for_a_trillion_layers(tmp_path):
    tz.build_model("transformer-tiny").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["encoder"]["layers"] = 10**12
    (tmp_path / "config.json").write_text(json.dumps(config))
    start = time.perf_counter()
    with pytest.raises(tz.ConfigError, match="encoder.layers: Input should be less than or equal to 1024"):
        tz.from_pretrained(tmp_path)
    assert time.perf_counter() - start < 10


# ---- tracebacks ---------------------------------------------------------------------------------
@pytest.mark.parametrize("override", ["norm.kind=[]", "norm={kind: {a: 1}}", "norm={kind: 3}"])
def test_a_kind_that_is_not_a_name_is_refused(capsys, override):
    err = refused(capsys, "show", "transformer-tiny", "--set", override)
    assert "norm: kind must be the name of one norm kind" in err and "registered: batchnorm, layernorm, rmsnorm" in err


@pytest.mark.parametrize("variant", ["transformer-tiny", "vit-tiny", "universal-transformer-tiny"])
def test_an_empty_list_of_attention_kinds_is_refused(capsys, variant):
    err = refused(capsys, "show", variant, "--set", "encoder.attention=[]")
    assert "encoder.attention: give one attention kind or a non-empty list of them, got an empty list" in err


@pytest.mark.parametrize(
    ("variant", "override", "field"),
    [
        ("vit-tiny", "image_size=[-8, 8]", "image_size.0"),
        ("vit-tiny", "image_size=[0, 8]", "image_size.0"),
        ("sagan-classifier-tiny", "widths=[-8, 8]", "widths.0"),
        ("sagan-classifier-tiny", "widths=[8, 0]", "widths.1"),
        ("sagan-gan", "generator_widths=[-32, 32, 32]", "generator_widths.0"),
        ("sagan-gan", "discriminator_widths=[32, 0, 32]", "discriminator_widths.1"),
    ],
)
def test_negative_or_zero_image_sizes_and_widths_are_refused(capsys, variant, override, field):
    assert f"{field}: Input should be greater than or equal to 1" in refused(capsys, "show", variant, "--set", override)


@pytest.mark.parametrize(
    ("variant", "override", "field"),
    [
        ("transformer-tiny", "d_model=1000000000000000000000000000000", "d_model"),
        (
            "local-global-encoder-tiny",
            "encoder.attention=[{kind: local-global, global_positions: [100000000000000000000]}]",
            "encoder.attention.0.global_positions",
        ),
        (
            "local-global-encoder-tiny",
            "encoder.attention={kind: block-sparse, block: 8, seed: 100000000000000000000}",
            "encoder.attention.seed",
        ),
    ],
)
def test_integers_past_64_bits_are_refused_naming_the_field(capsys, variant, override, field):
    err = refused(capsys, "show", variant, "--set", override)
    assert f"{field}: " in err and ("fit in 64 bits" in err or "less than or equal to" in err)


def test_a_seed_past_64_bits_is_refused_naming_the_field(capsys, tmp_path):
    with pytest.raises(tz.ConfigError, match="seed: "):
        load_train_config({"model": "transformer-tiny", "task": "reverse", "seed": 10**19})
    with pytest.raises(tz.ConfigError, match="task.seed: an integer here must fit in 64 bits"):
        load_train_config({"model": "transformer-tiny", "task": {"kind": "reverse", "seed": 10**19}})
    path = tmp_path / "train.yaml"
    path.write_text(f"model: transformer-tiny\ntask: reverse\nsteps: 1\nseed: {10**19}\n")
    assert "seed: " in refused(capsys, "train", str(path), "--out", str(tmp_path / "run"))
    assert not (tmp_path / "run").exists(), "refused before anything is written"


@pytest.mark.parametrize("betas", ["[1.5, 0.9]", "[0.5, 1.0]", "[-0.1, 0.9]"])
def test_adam_betas_outside_0_1_are_refused_naming_the_field(capsys, betas):
    assert "betas." in refused(capsys, "show", "sagan-gan", "--set", f"betas={betas}")


@pytest.mark.parametrize("text", ["[0.1", "{a: 1", "'", "a: b: c"])
def test_a_malformed_override_names_itself_and_how_to_write_it(capsys, text):
    err = refused(capsys, "show", "transformer-tiny", "--set", f"dropout={text}")
    assert f"override {'dropout=' + text!r}" in err and "is not valid YAML" in err
    assert f"quote text: dropout={json.dumps(text)}" in err


def test_a_builder_refusal_is_a_config_error():
    with pytest.raises(tz.ConfigError, match="rotary positions need an even head width"):
        tz.build_model("transformer-tiny", positional="rotary", d_model=12, n_heads=4)


# ---- silently accepted --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("variant", "override", "field"),
    [
        ("transformer-tiny", "norm.eps=.inf", "norm.eps"),
        ("transformer-tiny", "positional.base=.inf", "positional.base"),
        ("transformer-tiny", "dropout=.nan", "dropout"),
        ("universal-transformer-tiny", "encoder.halting_bias=.nan", "encoder.halting_bias"),
        ("universal-transformer-tiny", "encoder.ponder_weight=.inf", "encoder.ponder_weight"),
        ("bert-tiny", "init_std=.inf", "init_std"),
        ("transformer-tiny", "encoder.attention.scale=.inf", "encoder.attention.scale"),
        ("sagan-gan", "generator_lr_scale=.inf", "generator_lr_scale"),
    ],
)
def test_inf_and_nan_are_refused_naming_the_field(capsys, variant, override, field):
    assert f"{field}: Input should be a finite number" in refused(capsys, "show", variant, "--set", override)


def test_inf_and_nan_are_refused_in_training_configs_too():
    for field in ("lr", "weight_decay", "max_seconds", "grad_clip"):
        with pytest.raises(tz.ConfigError, match=f"{field}: Input should be a finite number"):
            load_train_config({"model": "transformer-tiny", "task": "reverse", field: float("inf")})


def test_every_options_model_refuses_inf_and_nan():
    models = {TrainConfig, *(get_registry().variant(name).config for name in tz.list_variants())}
    models |= {options for category in CATEGORIES for options in get_registry().components(category).values()}
    for model in models:
        assert issubclass(model, Options) and model.model_config.get("allow_inf_nan") is False, model


@pytest.mark.parametrize(
    ("variant", "override", "field"),
    [
        ("transformer-tiny", "n_heads=true", "n_heads"),
        ("transformer-tiny", "decoder.layers=true", "decoder.layers"),
        ("transformer-tiny", "norm.eps=true", "norm.eps"),
        ("vit-tiny", "image_size=[true, 8]", "image_size"),
        ("sagan-gan", "betas=[false, 0.9]", "betas"),
    ],
)
def test_booleans_are_not_taken_as_numbers(capsys, variant, override, field):
    assert f"{field}: expected a number, not a boolean" in refused(capsys, "show", variant, "--set", override)


def test_boolean_fields_still_take_booleans():
    config = tz.load_config("transformer-tiny", ["share_embeddings=false", "final_norm=true", "head.bias=true"])
    assert (config.share_embeddings, config.final_norm, config.head.bias) == (False, True, True)


@pytest.mark.parametrize(
    ("name", "text", "key", "line"),
    [
        ("config.yaml", "variant: transformer-tiny\nd_model: 32\nn_heads: 2\nd_model: 64\n", "d_model", 4),
        (
            "config.yaml",
            "variant: transformer-tiny\nnorm:\n  kind: rmsnorm\n  eps: 0.1\n  kind: layernorm\n",
            "kind",
            5,
        ),
        ("config.json", '{"variant": "transformer-tiny", "d_model": 32, "d_model": 64}', "d_model", None),
        ("config.json", '{"variant": "transformer-tiny", "norm": {"eps": 0.1, "eps": 0.2}}', "eps", None),
    ],
)
def test_a_key_set_twice_in_a_config_file_is_refused(tmp_path, name, text, key, line):
    (tmp_path / name).write_text(text)
    with pytest.raises(tz.ConfigError) as info:
        tz.load_config(tmp_path / name)
    assert f"key {key!r} is set twice" in str(info.value) and name in str(info.value)
    if line is not None:
        assert f"line {line}" in str(info.value)


def test_a_key_set_twice_is_refused_in_training_configs_and_overrides(tmp_path, capsys):
    (tmp_path / "train.yaml").write_text("model: transformer-tiny\ntask: reverse\nsteps: 5\nsteps: 10\n")
    with pytest.raises(tz.ConfigError, match="key 'steps' is set twice"):
        load_train_config(tmp_path / "train.yaml")
    err = refused(capsys, "show", "transformer-tiny", "--set", "norm={kind: rmsnorm, kind: layernorm}")
    assert "key 'kind' is set twice" in err


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    text = "variant: transformer-tiny\nnorm:\n  <<: {kind: layernorm, eps: 0.1}\n  eps: 0.2\n"
    (tmp_path / "config.yaml").write_text(text)
    assert tz.load_config(tmp_path / "config.yaml").norm.eps == 0.2


@pytest.mark.parametrize(
    ("task", "field"),
    [
        ({"kind": "language-modeling", "files": ""}, "task.files"),
        ({"kind": "text-mlm", "files": ["corpus.txt", "  "]}, "task.files"),
        ({"kind": "language-modeling", "files": "corpus.txt", "test_files": ""}, "task.test_files"),
        ({"kind": "seq2seq", "files": ""}, "task.files"),
        ({"kind": "text-classification", "path": ""}, "task.path"),
        ({"kind": "seq2seq", "path": {"train": ""}}, "task.path"),
    ],
)
def test_an_empty_file_pattern_is_refused(task, field):
    with pytest.raises(tz.ConfigError, match=f"{field}: .*is empty, which would read every file under the working"):
        load_train_config({"model": "transformer-tiny", "task": task})


# ---- huge sizes ---------------------------------------------------------------------------------
def test_a_model_larger_than_memory_is_refused_before_allocating_with_the_estimate():
    start = time.perf_counter()
    with pytest.raises(tz.ConfigError) as info:
        tz.build_model("transformer-tiny", vocab_size=2**24, d_model=2**17)
    assert time.perf_counter() - start < 10
    message = str(info.value)
    assert "needs about 9.5 TiB for its parameters and buffers" in message
    assert f"more than the {api._size(api.memory_limit())} of memory this machine has" in message
    assert "src_embed.token.weight 16777216 x 131072 (8.0 TiB)" in message and "Shrink" in message


def test_the_limit_is_the_memory_this_machine_has(monkeypatch):
    model = tz.build_model("transformer-tiny")
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    size += sum(b.numel() * b.element_size() for b in model.buffers())
    monkeypatch.setattr(api, "memory_limit", lambda: size)
    tz.build_model("transformer-tiny")  # exactly fits
    monkeypatch.setattr(api, "memory_limit", lambda: size - 1)
    with pytest.raises(tz.ConfigError, match="more than the .* of memory this machine has"):
        tz.build_model("transformer-tiny")
    assert isinstance(tz.load_config("transformer-tiny"), VariantConfig), "validation alone does not check memory"


def test_memory_limit_reads_the_machine():
    limit = api.memory_limit()
    assert limit is None or limit > 2**20


def test_from_pretrained_refuses_a_config_larger_than_memory(tmp_path, monkeypatch):
    tz.build_model("transformer-tiny").save_pretrained(tmp_path)
    monkeypatch.setattr(api, "memory_limit", lambda: 2**20)
    with pytest.raises(tz.ConfigError, match="more than the 1.0 MiB of memory this machine has"):
        tz.from_pretrained(Path(tmp_path))
