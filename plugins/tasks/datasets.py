"""Generic tasks over Hugging Face ``datasets``, on a user's own data with no plugin to write:
the base they share, and ``text-classification`` (``language-modeling`` and ``seq2seq`` build
on the same base in their own modules).

The data is a local file or folder in a format ``datasets.load_dataset`` reads (the builder is
picked from the suffix), a folder written by ``save_to_disk``, or a hub dataset by name (when
online); a kind may also read plain files of its own (``files``). Options map the data's columns
to what each task reads. The test split is named, found (``test``, else ``validation``) or held
out of the training split with a seed. Text goes through the tokenizer of the text tasks: a
byte-level BPE trained here, or a loaded ``tokenizer.json``.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from transformer_zoo.core.errors import ConfigError, optional
from transformer_zoo.core.tasks import ClassificationTask, Task
from transformer_zoo.core.validation import MAX_EXAMPLES, MAX_LENGTH

from .text import (
    Tokenized,
    TokenizerOptions,
    check_patterns,
    check_text,
    fingerprint,
    resolve_files,
    special_ids,
)

if TYPE_CHECKING:
    import datasets

FORMATS: dict[str, tuple[str, dict[str, Any]]] = {  # suffix: the datasets builder and its options
    ".csv": ("csv", {"keep_default_na": False}),  # an empty cell is "", and the text "NA" stays text
    ".tsv": ("csv", {"delimiter": "\t", "keep_default_na": False}),
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    ".parquet": ("parquet", {}),
    ".txt": ("text", {}),
}
SAVED_MARKERS = ("dataset_dict.json", "state.json")  # what save_to_disk writes at the top of its folder


def _saved(path: Path) -> bool:
    return path.is_dir() and any((path / name).is_file() for name in SAVED_MARKERS)


def _builder(files: list[str], where: str) -> tuple[str, dict[str, Any]]:
    """The ``datasets`` builder and its options for ``files``, from their suffixes."""
    suffixes = sorted({Path(f).suffix.lower() for f in files})
    unknown = [s for s in suffixes if s not in FORMATS]
    if unknown:
        raise ConfigError(
            f"{where}: unknown format {unknown[0] or '(no suffix)'!r}; give {', '.join(FORMATS)} "
            "files, a folder of them, or a folder written by save_to_disk"
        )
    if len({repr(FORMATS[s]) for s in suffixes}) > 1:
        raise ConfigError(f"{where} mixes formats ({', '.join(suffixes)}); give files of one format")
    return FORMATS[suffixes[0]]


class DatasetOptions(TokenizerOptions):
    """Options shared by the tasks over ``datasets``: where the data is, its splits and limits.

    A kind lists the fields that name columns (``columns``) and those whose text trains the
    tokenizer (``text_columns``). A kind with its own plain files adds ``files`` and
    ``test_files`` fields and reads them in :meth:`read_files`.
    """

    columns: ClassVar[tuple[str, ...]] = ()
    text_columns: ClassVar[tuple[str, ...]] = ()
    file_suffixes: ClassVar[tuple[str, ...]] = (".txt",)  # what a folder given as files is searched for

    path: str | dict[str, str | list[str]] | None = Field(
        None,
        description="local data: a file (.csv, .tsv, .json, .jsonl, .parquet, .txt), a folder of them (files "
        "named train*, test*, ... are those splits), a glob, a folder written by save_to_disk, or a "
        "mapping of split names to files",
    )
    dataset_name: str | None = Field(None, description="a Hugging Face dataset name instead of path (needs network)")
    dataset_config: str | None = Field(None, description="the Hugging Face dataset's config")
    train_split: str = Field("train", description="the split trained on")
    test_split: str | None = Field(
        None,
        description="the split scored; null: 'test', else 'validation', if the data has one, else "
        "test_fraction of train_split held out",
    )
    test_fraction: float = Field(
        0.1, gt=0, lt=1, description="share of train_split held out (seeded) when there is no test split"
    )
    max_len: int = Field(
        128, ge=1, le=MAX_LENGTH, description="tokens per example; what happens to longer ones depends on the kind"
    )
    max_test_examples: int = Field(
        500, ge=1, le=MAX_EXAMPLES, description="test examples scored at most (the first ones)"
    )

    _patterns = field_validator("path")(check_patterns)

    @model_validator(mode="after")
    def _one_source(self) -> DatasetOptions:
        sources = {"path": "a local file or folder", "files": "local files", "dataset_name": "a Hugging Face dataset"}
        sources = {name: what for name, what in sources.items() if name in type(self).model_fields}
        if sum(getattr(self, name) is not None for name in sources) != 1:
            listed = [f"{name} ({what})" for name, what in sources.items()]
            raise ValueError(f"give exactly one of {', '.join(listed[:-1])} and {listed[-1]}")
        if getattr(self, "test_files", None) is not None and getattr(self, "files", None) is None:
            raise ValueError(
                "test_files goes with files: give files too (or, with path, a mapping such as {train: ..., test: ...})"
            )
        return self

    def where(self) -> str:
        """The data, as a user named it (for messages)."""
        if self.path is not None:
            return f"path={self.path!r}"
        if getattr(self, "files", None) is not None:
            return f"files={self.files!r}"
        return f"dataset_name={self.dataset_name!r}"

    def reading(self) -> dict[str, Any]:
        """Options of the ``text`` builder for .txt data (a kind may set ``sample_by``)."""
        return {}

    def read_files(self) -> dict[str, datasets.Dataset]:
        """The splits of a kind's own ``files`` (and ``test_files``): a kind with those fields reads them here."""
        raise NotImplementedError(f"{type(self).__name__} has no files of its own")

    def cache_key(self) -> str:
        """Identifies the data read and how it is split: the files' paths, sizes and times, or the
        hub name, with the column and split options."""
        if getattr(self, "files", None) is not None:
            files = [*self._own_files("files"), *self._own_files("test_files")]
        elif self.path is None:
            files = None
        elif isinstance(self.path, str) and _saved(Path(self.path).expanduser()):
            files = sorted(str(p) for name in SAVED_MARKERS for p in Path(self.path).expanduser().rglob(name))
        else:
            files = [f for files in self._files().values() for f in files]
        columns = {field: getattr(self, field) for field in self.columns}
        return fingerprint(
            files,
            self.dataset_name,
            self.dataset_config,
            columns,
            self.train_split,
            self.test_split,
            self.test_fraction,
            self.seed,
            *([self.reading()] if self.reading() else []),
        )

    def _own_files(self, field: str) -> list[str]:
        """The files of ``files`` or ``test_files`` (none when null), for the cache key."""
        patterns = getattr(self, field)
        return [] if patterns is None else resolve_files(patterns, field, self.file_suffixes)

    def _files(self) -> dict[str | None, list[str]]:
        """The local data files, by split (None: split by datasets from the file names)."""
        suffixes = tuple(FORMATS)
        if isinstance(self.path, dict):
            return {split: resolve_files(files, f"path.{split}", suffixes) for split, files in self.path.items()}
        return {None: resolve_files(self.path, "path", suffixes)}

    def read(self) -> dict[str, datasets.Dataset]:
        """Every split of the data, as read."""
        import datasets

        path = self.path
        try:
            if self.dataset_name is not None:
                data = datasets.load_dataset(self.dataset_name, self.dataset_config)
            elif getattr(self, "files", None) is not None:
                return self.read_files()
            elif isinstance(path, str) and _saved(Path(path).expanduser()):
                data = datasets.load_from_disk(str(Path(path).expanduser()))
            else:
                files = self._files()
                builder, options = _builder([f for group in files.values() for f in group], self.where())
                if builder == "text":  # a binary file among them is named now, not deep inside datasets
                    for group in files.values():
                        check_text(group, "path")
                    options = {**options, **self.reading()}
                if isinstance(path, dict):
                    data = datasets.load_dataset(builder, data_files=files, **options)
                elif Path(path).expanduser().is_dir():  # datasets names the splits from the file names
                    data = datasets.load_dataset(builder, data_dir=str(Path(path).expanduser()), **options)
                else:
                    data = datasets.load_dataset(builder, data_files=files[None], **options)
        except ConfigError:
            raise
        except Exception as error:  # offline, unknown name, a file the parser cannot read: say which and what to do
            if self.dataset_name is not None:
                raise ConfigError(
                    f"could not load the Hugging Face dataset {self.dataset_name!r} ({self.dataset_config}):"
                    f" {error}. Offline, give a local file or folder as path instead"
                ) from error
            empty = re.search(r'Instruction "(.+)" corresponds to no data', str(error))  # datasets' word for it
            if empty:
                raise ConfigError(self._empty(empty.group(1))) from error
            cause = error.__cause__ if isinstance(error, datasets.exceptions.DatasetGenerationError) else None
            raise ConfigError(f"could not read {self.where()}: {cause or error}") from error
        return {"train": data} if isinstance(data, datasets.Dataset) else dict(data)

    def splits(self) -> tuple[datasets.Dataset, datasets.Dataset]:
        """The training and test splits, with the columns checked and rows with an empty field dropped."""
        data = self.read()

        def named(name: str, field: str) -> datasets.Dataset:
            if name not in data:
                raise ConfigError(
                    f"{field}={name!r}: {self.where()} has no split {name!r}; its splits are {', '.join(data)}"
                )
            return self._rows(data[name], name)

        train = named(self.train_split, "train_split")
        test = self.test_split or next((s for s in ("test", "validation") if s in data and s != self.train_split), None)
        if test is not None:
            return train, named(test, "test_split")
        if math.ceil(self.test_fraction * len(train)) >= len(train):
            raise ConfigError(
                f"split {self.train_split!r} of {self.where()} holds {len(train)} example(s): too few to "
                f"hold out test_fraction={self.test_fraction} and train on the rest; give more data, a "
                "smaller test_fraction, or a test split (test_split)"
            )
        parts = train.train_test_split(test_size=self.test_fraction, seed=self.seed)
        return parts["train"], parts["test"]

    def _rows(self, data: datasets.Dataset, split: str) -> datasets.Dataset:
        for field in self.columns:
            if getattr(self, field) not in data.column_names:
                raise ConfigError(
                    f"{field}={getattr(self, field)!r}: split {split!r} of {self.where()} has no such "
                    f"column; its columns are {', '.join(data.column_names)} (set {field} to one of them)"
                )
        names = [getattr(self, field) for field in self.columns]
        data = data.filter(lambda row: all(row[name] not in (None, "") for name in names))
        if not len(data):
            raise ConfigError(self._empty(split, f" (rows with an empty {' or '.join(names)} are not counted)"))
        return data

    def _empty(self, split: str, note: str = "") -> str:
        return (
            f"split {split!r} of {self.where()} has no examples{note}; give a split with examples (where the "
            "data has no test split, test_fraction of the training split is held out)"
        )


class DatasetTask(Tokenized, Task):
    """Examples of a :class:`DatasetOptions` source, tokenized; a kind provides ``_encode``.

    Attributes:
        raw: the training and test splits as read (columns checked, rows with an empty field dropped).
    """

    splits: ClassVar[tuple[str, ...]] = ("train", "test")

    def __init__(self, options: DatasetOptions) -> None:
        optional("tokenizers", "text", f"the {options.kind} task (its tokenizer)")  # before reading: how to install it
        self.options = options
        # read and checked now, so that a mistake in the data is reported before any training
        self.raw: dict[str, datasets.Dataset] = dict(zip(self.splits, options.splits()))
        self.key = options.cache_key()
        self.tokenizer = options.load_tokenizer(self._texts(), self.key)
        ids = special_ids(self.tokenizer, ("pad", "bos", "eos"), options.tokenizer or "trained here")
        self.pad_id, self.bos_id, self.eos_id = ids["pad"], ids["bos"], ids["eos"]
        self.vocab_size = self.tokenizer.get_vocab_size()

    def _texts(self) -> Iterator[list[str]]:
        data = self.raw["train"]
        for start in range(0, len(data), 1000):
            rows = data[start : start + 1000]
            yield [text for field in self.options.text_columns for text in self._texts_of(rows, field)]

    def _encoding_key(self, split: str) -> str:
        """Identifies a split's encoded examples: the cache key of ``dataset(split)``."""
        options = self.options.model_dump(mode="json", exclude={"id"})  # a comparison's name for it: not the data
        return fingerprint(None, self.tokens_key, self.options.kind, split, options)

    @functools.cache
    def dataset(self, split: str) -> datasets.Dataset:
        self._check_split(split)
        raw = self.raw[split]
        data = raw.map(
            self._encode,
            batched=True,
            batch_size=10_000,
            remove_columns=raw.column_names,
            new_fingerprint=self._encoding_key(split),
        )
        data = self._kept(data, split)
        return data.select(range(min(len(data), self.options.max_test_examples))) if split != "train" else data

    def _encode(self, batch: dict[str, list]) -> dict[str, list]:
        raise NotImplementedError

    def _kept(self, data: datasets.Dataset, split: str) -> datasets.Dataset:
        """The encoded examples a kind keeps (all, unless it drops some)."""
        return data

    def _texts_of(self, batch: dict[str, list], field: str) -> list[str]:
        return [str(text) for text in batch[getattr(self.options, field)]]

    def parse_input(self, text: str) -> dict[str, Any]:
        return {"src": self.encode_texts([text])[0][: self.options.max_len]}


def _label(value: Any) -> str | int:
    """A class label as recorded: strings and integers as they are, anything else as its text."""
    return value if isinstance(value, (str, int)) and not isinstance(value, bool) else str(value)


class TextClassificationOptions(DatasetOptions):
    """Label each text of your data (labels: strings or integers); scored by accuracy."""

    kind: Literal["text-classification"] = "text-classification"
    columns: ClassVar[tuple[str, ...]] = ("text", "label")
    text_columns: ClassVar[tuple[str, ...]] = ("text",)

    text: str = Field("text", description="the column holding the text")
    label: str = Field("label", description="the column holding the label (strings or integers)")
    labels: list[str | int] | None = Field(
        None,
        description="the classes, in class-id order; null: the training split's labels, sorted (a trained run "
        "keeps its own)",
    )

    def with_assets(self, directory: Path) -> TextClassificationOptions:
        options = super().with_assets(directory)
        saved = Path(directory) / "labels.json"
        return options.model_copy(update={"labels": json.loads(saved.read_text())}) if saved.is_file() else options

    def build(self) -> TextClassificationTask:
        return TextClassificationTask(self)


class TextClassificationTask(DatasetTask, ClassificationTask):
    """Each text as ``[BOS] tokens`` (its first ``max_len`` tokens) and its class id: the label's
    place among the sorted training labels (or in the ``labels`` option)."""

    def __init__(self, options: TextClassificationOptions) -> None:
        super().__init__(options)
        self.cls_id = self.bos_id
        found = {split: {_label(v) for v in data[options.label]} for split, data in self.raw.items()}
        self.classes = options.labels or sorted(found["train"], key=lambda v: (isinstance(v, str), v))
        if len(self.classes) < 2:
            raise ConfigError(
                f"label={options.label!r}: the training split has only the label {self.classes}; "
                "classification needs 2 or more"
            )
        self.num_classes = len(self.classes)
        self.class_ids = {label: i for i, label in enumerate(self.classes)}
        for split, labels in found.items():
            unseen = sorted(labels - self.class_ids.keys(), key=str)
            if unseen and options.labels:
                raise ConfigError(
                    f"split {split!r} has the label {unseen[0]!r}, which is not among the classes "
                    f"({', '.join(map(repr, self.classes))}: the labels option, or those a trained run "
                    "saved); add it to labels, or leave labels null to take the training labels"
                )
            if unseen:
                raise ConfigError(
                    f"split {split!r} has the label {unseen[0]!r}, which is not among the classes "
                    f"({', '.join(map(repr, self.classes))}: the training split's labels); every label "
                    "must appear in training: give more data, another seed, or a test split whose "
                    "labels all do"
                )

    def _encoding_key(self, split: str) -> str:
        return fingerprint(None, super()._encoding_key(split), self.classes)

    def _encode(self, batch: dict[str, list]) -> dict[str, list]:
        ids = self.encode_texts(self._texts_of(batch, "text"))
        return {
            "src": [row[: self.options.max_len] for row in ids],
            "label": [self.class_ids[_label(v)] for v in batch[self.options.label]],
        }

    def save_assets(self, directory: Path) -> None:
        super().save_assets(directory)
        (Path(directory) / "labels.json").write_text(json.dumps(self.classes))
