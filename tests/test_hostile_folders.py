"""``from_pretrained`` on folders made to do harm or damaged: each is refused with a message
naming the file, before the model is allocated."""

from __future__ import annotations

import json
import os
import random
import re
import resource
import shutil
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch
import transformers

import transformer_zoo as tz
from transformer_zoo.core import weights
from transformer_zoo.core.errors import ConfigError
from transformer_zoo.core.weights import WeightsError

TINY = dict(vocab_size=50, d_model=16, n_heads=2, d_ff=32, max_len=32, encoder={"layers": 1}, decoder={"layers": 1})
BERT = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A folder save_pretrained wrote, never changed: tests damage copies of it."""
    torch.manual_seed(0)
    return tz.build_model("transformer-tiny", **TINY).save_pretrained(tmp_path_factory.mktemp("good") / "model")


@pytest.fixture(scope="module")
def bert_shards(tmp_path_factory) -> Path:
    """A Hugging Face BERT folder in several safetensors shards, with their index."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("bert") / "sharded"
    transformers.BertModel(transformers.BertConfig(**BERT)).save_pretrained(folder, max_shard_size="40KB")
    assert (folder / "model.safetensors.index.json").is_file()
    return folder


def copy(folder: Path, tmp_path: Path, name: str = "copy") -> Path:
    return Path(shutil.copytree(folder, tmp_path / name, symlinks=True))


def config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(str(folder / "model.safetensors"))


def test_the_good_folder_loads(good):
    assert isinstance(tz.from_pretrained(good), tz.core.model.ZooModel)


# ---- sizes before allocation ----------------------------------------------------------------
def test_a_config_far_larger_than_its_weights_is_refused_from_the_header_before_building(good, tmp_path, monkeypatch):
    """A 4 GB embedding asked for beside a 30 kB file: refused by comparing the header with the
    model built on the meta device, before the model is built."""

    def build_model(*args, **kwargs):
        raise AssertionError("the model was built for real before the weights were checked")

    monkeypatch.setattr(tz.api, "build_model", build_model)
    folder = copy(good, tmp_path)
    (folder / "config.json").write_text(
        json.dumps({**config(folder), "vocab_size": 250_000, "d_model": 4096, "n_heads": 8, "d_ff": 16384})
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with pytest.raises(WeightsError) as error:
        tz.from_pretrained(folder)
    assert time.perf_counter() - start < 10
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 500_000  # kB: nothing near 4 GB was touched
    message = str(error.value)
    assert str(folder / "model.safetensors") in message
    assert "does not fit the model its config.json describes" in message
    assert re.search(r"\n  shape mismatch (\S+)\.weight: file \[50, 16\], model \[250000, 4096\]\n", message), (
        "the embedding, the largest mismatch, comes first"
    )


def test_a_config_asking_for_terabytes_is_refused_at_once(good, tmp_path):
    folder = copy(good, tmp_path)
    (folder / "config.json").write_text(
        json.dumps({**config(folder), "vocab_size": 10**9, "d_model": 1024, "n_heads": 8})
    )
    start = time.perf_counter()
    with pytest.raises(ConfigError):  # by the header check, or by a bound on the config's sizes
        tz.from_pretrained(folder)
    assert time.perf_counter() - start < 10


def test_a_header_claiming_more_data_than_the_file_holds_is_refused(good, tmp_path):
    """A header that lies about a tensor's size, to match a huge config, is caught by its offsets."""
    folder = copy(good, tmp_path)
    path = folder / "model.safetensors"
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    embedding = next(name for name, entry in header.items() if name != "__metadata__" and entry["shape"] == [50, 16])
    header[embedding]["shape"] = [10**9, 16]
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + length :])
    with pytest.raises(WeightsError, match=rf"'{embedding}' is F32 of shape \[1000000000, 16\]"):
        tz.from_pretrained(folder)


# ---- shapes and dtypes ----------------------------------------------------------------------
def save_changed(folder: Path, change) -> None:
    state = tensors(folder)
    change(state)
    safetensors.torch.save_file(state, str(folder / "model.safetensors"))


def test_a_weight_of_the_wrong_shape_is_named(good, tmp_path):
    folder = copy(good, tmp_path)
    save_changed(folder, lambda s: s.update({"encoder.layers.0.ffn.linear1.weight": torch.zeros(33, 16)}))
    with pytest.raises(
        WeightsError,
        match=r"shape mismatch encoder.layers.0.ffn.linear1.weight: file \[33, 16\], "
        r"model \[32, 16\]",
    ):
        tz.from_pretrained(folder)


def test_missing_and_unexpected_weights_are_named(good, tmp_path):
    folder = copy(good, tmp_path)
    save_changed(folder, lambda s: s.update({"extra.weight": s.pop("encoder.layers.0.ffn.linear1.weight")}))
    with pytest.raises(WeightsError) as error:
        tz.from_pretrained(folder)
    assert "missing from the file: encoder.layers.0.ffn.linear1.weight" in str(error.value)
    assert "not in the model the config describes: extra.weight [32, 16]" in str(error.value)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_weights_of_a_non_float_dtype_are_refused(good, tmp_path, dtype):
    folder = copy(good, tmp_path)
    save_changed(folder, lambda s: s.update({k: v.to(dtype) for k, v in s.items()}))
    with pytest.raises(
        WeightsError,
        match=rf"dtype mismatch .*: the file holds {dtype}, the model torch.float32; "
        "this tensor must be floating point",
    ):
        tz.from_pretrained(folder)


def test_half_precision_weights_load_cast_to_the_models_dtype(good, tmp_path):
    folder = copy(good, tmp_path)
    save_changed(folder, lambda s: s.update({k: v.half() for k, v in s.items()}))
    model = tz.from_pretrained(folder)
    expected = tensors(folder)["encoder.layers.0.ffn.linear1.weight"].float()
    assert torch.equal(model.state_dict()["encoder.layers.0.ffn.linear1.weight"], expected)


# ---- corrupt files --------------------------------------------------------------------------
def damage(folder: Path, how: str) -> None:
    path = folder / "model.safetensors"
    raw = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif how == "garbage":
        path.write_bytes(os.urandom(len(raw)))
    elif how == "header-length-beyond-the-file":
        path.write_bytes((len(raw) * 4).to_bytes(8, "little") + raw[8:])
    elif how == "header-not-json":
        length = int.from_bytes(raw[:8], "little")
        path.write_bytes(raw[:8] + b"{" * length + raw[8 + length :])
    elif how == "extra-bytes":
        path.write_bytes(raw + b"\0" * 16)


@pytest.mark.parametrize(
    "how, message",
    [
        ("empty", "it holds 0 bytes; a safetensors file starts with an 8-byte header length"),
        ("truncated", r"within the \d+ bytes of tensor data the file holds \(truncated\?\)"),
        ("garbage", "its header length field says"),
        (
            "header-length-beyond-the-file",
            r"its header length field says \d+ bytes, but the file holds only \d+ after it",
        ),
        ("header-not-json", "its header is not JSON"),
        ("extra-bytes", r"the header describes \d+ bytes of tensor data but the file holds \d+"),
    ],
)
def test_a_corrupt_weights_file_is_named(good, tmp_path, how, message):
    folder = copy(good, tmp_path)
    damage(folder, how)
    with pytest.raises(WeightsError, match=message) as error:
        tz.from_pretrained(folder)
    assert str(folder / "model.safetensors") in str(error.value)


def flip_tensor_bytes(path: Path, count: int = 64) -> None:
    """Flip ``count`` bytes in the middle of a safetensors file's tensor data (its header intact)."""
    raw = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(raw[:8], "little")
    middle = (start + len(raw)) // 2
    for i in range(middle, middle + count):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_a_saved_folder_records_the_digest_of_its_tensors(good):
    with safetensors.safe_open(str(good / "model.safetensors"), framework="pt") as file:
        metadata = file.metadata()
    assert metadata["format"] == "pt"
    assert metadata[weights.DIGEST] == weights.tensors_digest(tensors(good))


def test_flipped_tensor_bytes_are_refused_by_the_digest(good, tmp_path):
    """Without the digest such a folder loads, as a silently different model."""
    folder = copy(good, tmp_path)
    flip_tensor_bytes(folder / "model.safetensors")
    with pytest.raises(WeightsError, match="does not match the SHA-256 digest in its metadata") as error:
        tz.from_pretrained(folder)
    assert str(folder / "model.safetensors") in str(error.value)
    assert "its bytes changed after it was saved" in str(error.value)


def test_flipped_bytes_of_a_hugging_face_folder_saved_by_the_zoo_are_refused(tmp_path):
    torch.manual_seed(0)
    folder = tz.build_model("bert-tiny").save_pretrained(tmp_path / "hf", format="hf")
    assert isinstance(tz.from_pretrained(folder), tz.core.model.ZooModel)
    flip_tensor_bytes(folder / "model.safetensors")
    with pytest.raises(WeightsError, match="does not match the SHA-256 digest"):
        tz.from_pretrained(folder)


def test_a_folder_written_without_a_digest_loads_as_it_is(good, tmp_path):
    folder = copy(good, tmp_path)
    safetensors.torch.save_file(tensors(folder), str(folder / "model.safetensors"))  # no metadata at all
    model = tz.from_pretrained(folder)
    assert torch.equal(
        model.state_dict()["encoder.layers.0.ffn.linear1.weight"], tensors(good)["encoder.layers.0.ffn.linear1.weight"]
    )


def test_the_digest_is_of_the_tensors_not_of_their_layout():
    a = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.ones(2, dtype=torch.bfloat16), "c": torch.tensor(3)}
    assert weights.tensors_digest(a) == weights.tensors_digest(dict(reversed(list(a.items()))))
    for changed in (
        {**a, "b": a["b"].reshape(3, 2)},  # same bytes, another shape
        {**a, "c": torch.tensor(4)},
        {**a, "a": a["a"].half()},  # same bytes count, another dtype
        {"B": a["b"], "a": a["a"], "c": a["c"]},  # another name
    ):
        assert weights.tensors_digest(changed) != weights.tensors_digest(a)


# ---- config.json ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, message",
    [
        ("[1, 2]", "holds a JSON array; expected a JSON object of config fields"),
        ('"transformer-tiny"', "holds a JSON string; expected a JSON object"),
        ("null", "holds a JSON null; expected a JSON object"),
        ("3", "holds a JSON number; expected a JSON object"),
        ("{variant: transformer-tiny", "is not valid JSON"),
        ("", "is not valid JSON"),
        ('{"variant": "transformer-tiny", "dropout": NaN}', "NaN is not a JSON number"),
        ('{"variant": "transformer-tiny", "variant": "bert-tiny"}', "the key 'variant' appears more than once"),
        ("\udcff", "is not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "is not valid JSON: it nests too deeply"),
    ],
)
def test_a_config_json_that_is_not_an_object_of_fields_is_named(good, tmp_path, text, message):
    folder = copy(good, tmp_path)
    (folder / "config.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(ConfigError, match=message) as error:
        tz.from_pretrained(folder)
    assert str(folder / "config.json") in str(error.value)


@pytest.mark.parametrize(
    ("edit", "error", "message"),
    [
        ({"variant": "nope"}, tz.UnknownNameError, "unknown variant 'nope'"),
        ({"bogus": 1}, ConfigError, "unknown key 'bogus'"),
        ({"encoder": {"layers": 10**12}}, ConfigError, "encoder.layers: Input should be less than or equal to 1024"),
        (
            {"positional": "rotary", "d_model": 12, "n_heads": 4},
            ConfigError,
            "rotary positions need an even head width",
        ),
    ],
)
def test_a_config_json_of_bad_fields_is_named_with_the_field(good, tmp_path, edit, error, message):
    folder = copy(good, tmp_path)
    (folder / "config.json").write_text(json.dumps({**config(folder), **edit}))
    with pytest.raises(error, match=message) as raised:
        tz.from_pretrained(folder)
    assert str(raised.value).startswith(repr(str(folder / "config.json")) + ": ")


def test_a_bert_config_json_of_bad_fields_is_named(bert_shards, tmp_path):
    folder = copy(bert_shards, tmp_path, "bert")
    (folder / "config.json").write_text(json.dumps({**config(folder), "num_hidden_layers": 10**12}))
    with pytest.raises(ConfigError, match="layers: Input should be less than or equal to 1024") as raised:
        tz.from_pretrained(folder)
    assert str(folder / "config.json") in str(raised.value)


# ---- paths and symlinks ---------------------------------------------------------------------
def test_a_shard_index_naming_a_file_above_the_folder_is_refused(bert_shards, tmp_path):
    folder = copy(bert_shards, tmp_path, "bert")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    shutil.move(folder / shard, tmp_path / "outside.safetensors")  # readable: only containment stops it
    index["weight_map"] = {k: "../outside.safetensors" if v == shard else v for k, v in index["weight_map"].items()}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightsError, match=r"outside.safetensors'?, outside the model folder"):
        tz.from_pretrained(folder)


def test_a_shard_index_naming_an_absolute_path_is_refused(bert_shards, tmp_path):
    folder = copy(bert_shards, tmp_path, "bert")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    outside = Path(shutil.move(folder / shard, tmp_path / "elsewhere.safetensors")).resolve()
    index["weight_map"] = {k: str(outside) if v == shard else v for k, v in index["weight_map"].items()}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightsError, match="outside the model folder"):
        tz.from_pretrained(folder)


@pytest.mark.parametrize(
    "weight_map, message",
    [
        (None, "'weight_map' must map each tensor name to the name of its shard file"),
        ({"a": 3}, "'weight_map' must map each tensor name"),
        ({"a": "missing.safetensors"}, "names shards that are not there"),
    ],
)
def test_a_broken_shard_index_is_named(bert_shards, tmp_path, weight_map, message):
    folder = copy(bert_shards, tmp_path, "bert")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(WeightsError, match=message):
        tz.from_pretrained(folder)


@pytest.mark.filterwarnings("ignore:.*no weights for the head")
def test_the_sharded_folder_loads(bert_shards):
    model = tz.from_pretrained(bert_shards)
    reference = transformers.BertModel.from_pretrained(bert_shards).eval()
    ids = torch.randint(1, 99, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(model.encode(ids), reference(input_ids=ids).last_hidden_state, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("source", "name"), [("good", "model.safetensors"), ("good", "config.json"), ("bert_shards", "model-*.safetensors")]
)
def test_a_file_linked_from_outside_the_folder_is_refused(request, tmp_path, source, name):
    folder = copy(request.getfixturevalue(source), tmp_path, "bert" if source == "bert_shards" else "copy")
    linked = sorted(folder.glob(name))[0]
    outside = Path(shutil.move(linked, tmp_path / f"outside{linked.suffix}"))
    linked.symlink_to(outside)
    with pytest.raises(WeightsError, match=f"resolves to .*outside{linked.suffix}', outside the model folder"):
        tz.from_pretrained(folder)


def test_links_inside_the_folder_and_a_linked_folder_are_followed(good, tmp_path):
    folder = copy(good, tmp_path)
    (folder / "model.safetensors").rename(folder / "weights.bin")
    (folder / "model.safetensors").symlink_to("weights.bin")  # relative, inside
    (tmp_path / "link").symlink_to(folder, target_is_directory=True)
    expected = tz.from_pretrained(good).state_dict()
    for path in (folder, tmp_path / "link"):
        state = tz.from_pretrained(path).state_dict()
        assert all(torch.equal(state[k], v) for k, v in expected.items())


@pytest.mark.filterwarnings("ignore:.*no weights for the head")
def test_a_hugging_face_cache_snapshot_linking_into_its_blobs_loads(bert_shards, tmp_path):
    """The hub cache's layout: snapshots/<revision>/<file> -> ../../blobs/<hash>."""
    repo = tmp_path / "models--someone--bert"
    snapshot, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, file in enumerate(sorted(bert_shards.iterdir())):
        shutil.copy(file, blobs / f"blob{i}")
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", f"blob{i}"))
    model = tz.from_pretrained(snapshot)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_inside_refuses_each_way_out(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a").write_text("x")
    assert weights.inside(tmp_path / "folder", "a") == (tmp_path / "folder" / "a").resolve()
    assert weights.inside(tmp_path / "folder", "sub/../a") == (tmp_path / "folder" / "a").resolve()
    for name in ("../a", "/etc/passwd", "sub/../../a"):
        with pytest.raises(WeightsError, match="outside the model folder"):
            weights.inside(tmp_path / "folder", name)
    for name in ("", None, 3):
        with pytest.raises(WeightsError, match="a file name must be a non-empty string"):
            weights.inside(tmp_path / "folder", name)


# ---- the BERT importer's other files --------------------------------------------------------
@pytest.fixture(scope="module")
def bert_bin(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("bert") / "bin"
    transformers.BertModel(transformers.BertConfig(**BERT)).save_pretrained(folder)
    torch.save(safetensors.torch.load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()  # the older format alone
    return folder


@pytest.mark.parametrize("how", ["garbage", "pickle-like garbage", "truncated", "empty"])
def test_a_corrupt_pytorch_bin_is_named(bert_bin, tmp_path, how):
    """Garbage takes torch's path for files older than its zip format, whose unpickler fails in
    many ways (IndexError, KeyError, UnicodeDecodeError, ...): each is the one WeightsError."""
    folder = copy(bert_bin, tmp_path, "bert")
    path = folder / "pytorch_model.bin"
    raw = path.read_bytes()
    for seed in range(40 if "garbage" in how else 1):
        junk = random.Random(seed).randbytes(2000)
        path.write_bytes(
            {
                "garbage": junk,
                "pickle-like garbage": b"\x80\x02" + junk,
                "truncated": raw[: len(raw) // 2],
                "empty": b"",
            }[how]
        )
        with pytest.raises(WeightsError, match="is not a readable PyTorch state dict") as error:
            tz.from_pretrained(folder)
        assert str(path) in str(error.value)


class Payload:
    def __reduce__(self):
        return (print, ("this ran",))


def test_a_pytorch_bin_carrying_code_is_refused_without_running_it(bert_bin, tmp_path, capsys):
    folder = copy(bert_bin, tmp_path, "bert")
    torch.save({"embeddings.word_embeddings.weight": Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(WeightsError, match="only tensors are read, no code"):
        tz.from_pretrained(folder)
    assert "this ran" not in capsys.readouterr().out


def test_integer_bert_weights_are_refused(bert_bin, tmp_path):
    folder = copy(bert_bin, tmp_path, "bert")
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    torch.save({k: v.long() for k, v in state.items()}, folder / "pytorch_model.bin")
    with pytest.raises(WeightsError, match="dtype mismatch .*word_embeddings.weight: the file holds torch.int64"):
        tz.from_pretrained(folder)


def test_a_bert_config_larger_than_its_weights_is_refused_before_building(bert_shards, tmp_path):
    folder = copy(bert_shards, tmp_path, "bert")
    (folder / "config.json").write_text(
        json.dumps(
            {
                **config(folder),
                "vocab_size": 250_000,
                "hidden_size": 4096,
                "num_attention_heads": 8,
                "intermediate_size": 16384,
            }
        )
    )
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="shape mismatch"):
        tz.from_pretrained(folder)
    assert time.perf_counter() - start < 10


def test_a_builder_that_cannot_run_on_meta_is_checked_after_building_instead(good, tmp_path, monkeypatch):
    """A plugin's builder may read tensor values while building, which the meta device cannot
    give: its folder still loads, checked against the real model before the weights are copied."""

    def reads_values():
        torch.zeros(1).item()
        return torch.nn.Linear(1, 1)

    assert weights.build_on_meta(reads_values) is None
    monkeypatch.setattr(weights, "build_on_meta", lambda build: None)
    assert isinstance(tz.from_pretrained(good), tz.core.model.ZooModel)
    folder = copy(good, tmp_path)
    save_changed(folder, lambda s: s.update({"encoder.layers.0.ffn.linear1.weight": torch.zeros(33, 16)}))
    with pytest.raises(WeightsError, match="shape mismatch encoder.layers.0.ffn.linear1.weight"):
        tz.from_pretrained(folder)


# ---- the header reader ----------------------------------------------------------------------
def test_a_header_nested_too_deeply_is_named(tmp_path):
    path = tmp_path / "deep.safetensors"
    text = b"[" * 100_000 + b"]" * 100_000
    path.write_bytes(len(text).to_bytes(8, "little") + text)
    with pytest.raises(WeightsError, match=r"its header is not JSON \(nested too deeply\)"):
        weights.read_header(path)


def test_read_header_gives_every_shape_and_dtype_without_reading_the_data(tmp_path):
    path = tmp_path / "t.safetensors"
    safetensors.torch.save_file(
        {"a": torch.zeros(2, 3), "b": torch.zeros(4, dtype=torch.bfloat16), "c": torch.zeros((), dtype=torch.int64)},
        str(path),
    )
    assert weights.read_header(path) == {
        "a": ((2, 3), torch.float32),
        "b": ((4,), torch.bfloat16),
        "c": ((), torch.int64),
    }
