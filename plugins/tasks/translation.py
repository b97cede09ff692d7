"""Translation: a local parallel file (TSV or JSONL), or a Hugging Face dataset when online.

Scored by corpus BLEU (sacrebleu, on detokenized text) of the model's greedy or beam-search
output. Source and target share one byte-level BPE tokenizer (trained here on both sides of the
training split, or loaded), as the original Transformer shares its embeddings.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from transformer_zoo.core.errors import ConfigError, optional
from transformer_zoo.core.options import MAX_BEAM, MAX_EXAMPLES, MAX_LENGTH
from transformer_zoo.core.tasks import Better, Seq2SeqTask

from .text import Tokenized, TokenizerSource, check_patterns, fingerprint, resolve_files, special_ids

if TYPE_CHECKING:
    import datasets
    from tokenizers import Tokenizer


class Translation(TokenizerSource):
    """Translate sentences; BLEU (sacrebleu) on the test split."""

    kind: Literal["translation"] = "translation"
    files: str | list[str] | None = Field(
        None, description="parallel files: .tsv (source<TAB>target per line) or .jsonl (one object per line)"
    )
    test_files: str | list[str] | None = Field(None, description="held-out parallel files; null: hold out test_fraction")
    dataset_name: str | None = Field(
        None, description="a Hugging Face dataset name instead of files (needs network the first time), e.g. 'wmt16'"
    )
    dataset_config: str | None = Field(None, description="the Hugging Face dataset's config, e.g. 'de-en'")
    source: str = Field("src", description="source field: a column, or a language inside a 'translation' column")
    target: str = Field("tgt", description="target field: a column, or a language inside a 'translation' column")
    test_fraction: float = Field(0.1, gt=0, lt=1, description="share of pairs held out when there is no test split")
    max_len: int = Field(128, ge=2, le=MAX_LENGTH, description="pairs whose source or target exceed this many tokens are dropped")
    max_test_pairs: int = Field(500, ge=1, le=MAX_EXAMPLES, description="test pairs scored at most (the first ones)")
    beam_size: int = Field(1, ge=1, le=MAX_BEAM, description="1: greedy decoding; more: beam search when scoring")

    _patterns = field_validator("files", "test_files")(check_patterns)

    @model_validator(mode="after")
    def _one_source(self) -> Translation:
        if (self.files is None) == (self.dataset_name is None):
            raise ValueError("give exactly one of files (a local TSV or JSONL file) and dataset_name (a Hugging Face dataset)")
        return self

    def build(self) -> TranslationTask:
        optional("sacrebleu", "text", "the translation task (its BLEU)")  # refused now, not after training
        return TranslationTask(self)


PARALLEL_SUFFIXES = (".tsv", ".jsonl", ".json", ".txt")


def _read_pairs(files: list[str]) -> datasets.Dataset:
    import datasets

    kinds = {Path(f).suffix.lower() for f in files}
    try:
        if kinds <= {".tsv", ".txt"}:
            return datasets.load_dataset("csv", data_files=files, delimiter="\t", column_names=["src", "tgt"],
                                         quoting=3, keep_default_na=False, split="train")
        if kinds <= {".jsonl", ".json"}:
            return datasets.load_dataset("json", data_files=files, split="train")
    except Exception as error:  # the parser's own message, with which files and what they must hold
        raise ConfigError(f"could not read the parallel files {', '.join(files)}: {error}. A .tsv line holds a "
                          "source and a target separated by one tab; a .jsonl line holds one JSON object") from error
    raise ConfigError(f"parallel files must all be .tsv or all be .jsonl; got {', '.join(sorted(kinds))}")


class BleuScored:
    """Scores a seq2seq task's decoded text by BLEU: a mixin for a task with a ``tokenizer``,
    ``options.max_len`` and the reference text of each example in a ``target_text`` column."""

    tokenizer: Tokenizer
    options: Any

    def output_budget(self, rows: dict[str, list]) -> int:
        """Decode up to ``max_len`` tokens: the references must not limit the output they score."""
        return self.options.max_len + 1

    def extra_scores(self, data: datasets.Dataset, outputs: list[list[int]]) -> dict[str, float]:
        """``bleu``: sacrebleu's corpus BLEU (0-100) of the detokenized outputs against the references."""
        import sacrebleu

        hypotheses = self.tokenizer.decode_batch(outputs)
        return {"bleu": sacrebleu.corpus_bleu(hypotheses, [data["target_text"]]).score}


class TranslationTask(BleuScored, Tokenized, Seq2SeqTask):
    """Sentence pairs as token ids, with the reference text kept for BLEU."""

    metrics: ClassVar[dict[str, Better]] = {"bleu": "higher", **Seq2SeqTask.metrics}
    splits: ClassVar[tuple[str, ...]] = ("train", "test")

    def __init__(self, options: Translation) -> None:
        self.options = options
        self.beam_size = options.beam_size
        if options.files is not None:
            files = resolve_files(options.files, suffixes=PARALLEL_SUFFIXES)
            tests = None if options.test_files is None else resolve_files(options.test_files, "test_files", PARALLEL_SUFFIXES)
            self.key = fingerprint(files, tests and fingerprint(tests), options.source, options.target,
                                   options.test_fraction, options.seed)
            self._load = functools.partial(self._local, files, tests)
        else:
            self.key = fingerprint(None, options.dataset_name, options.dataset_config, options.source, options.target,
                                   options.test_fraction, options.seed)
            self._load = self._hub
        self.tokenizer = options.load_tokenizer(self._texts(), self.key)
        ids = special_ids(self.tokenizer, ("pad", "bos", "eos"), options.tokenizer or "trained here")
        self.pad_id, self.bos_id, self.eos_id = ids["pad"], ids["bos"], ids["eos"]
        self.vocab_size = self.tokenizer.get_vocab_size()

    def _local(self, files: list[str], tests: list[str] | None, split: str) -> datasets.Dataset:
        if tests is not None:
            return self._pairs(_read_pairs(files if split == "train" else tests))
        data = self._pairs(_read_pairs(files))
        if len(data) < 2:
            raise ConfigError(f"files={self.options.files!r} hold {len(data)} pair(s); a train/test split needs 2 or more")
        return data.train_test_split(test_size=self.options.test_fraction, seed=self.options.seed)[split]

    def _hub(self, split: str) -> datasets.Dataset:
        import datasets

        o = self.options
        try:
            data = datasets.load_dataset(o.dataset_name, o.dataset_config)
        except Exception as error:  # offline, unknown name, missing config: say which and what to do
            raise ConfigError(f"could not load the Hugging Face dataset {o.dataset_name!r} ({o.dataset_config}): "
                              f"{error}. Offline, give a local TSV or JSONL file as files instead") from error
        if split == "train":
            return self._pairs(data["train"])
        name = "test" if "test" in data else "validation" if "validation" in data else None
        if name is None:
            return self._pairs(data["train"]).train_test_split(test_size=o.test_fraction, seed=o.seed)["test"]
        return self._pairs(data[name])

    def _pairs(self, data: datasets.Dataset) -> datasets.Dataset:
        """Rename the configured fields to ``source_text`` and ``target_text``."""
        o = self.options
        nested = "translation" in data.column_names
        fields = list(data[0]["translation"]) if nested and len(data) else data.column_names
        missing = [f for f in (o.source, o.target) if f not in fields]
        if missing:
            where = "languages in its 'translation' column" if nested else "fields"
            raise ConfigError(f"the parallel data has no field {missing[0]!r}; its {where} are "
                              f"{', '.join(fields)} (set source and target)")

        def pick(row):
            pair = row["translation"] if nested else row
            return {"source_text": str(pair[o.source]), "target_text": str(pair[o.target])}

        return data.map(pick, remove_columns=data.column_names)

    @functools.cache
    def _split(self, split: str) -> datasets.Dataset:
        return self._load(split)

    def _texts(self):
        data = self._split("train")
        for start in range(0, len(data), 1000):
            rows = data[start : start + 1000]
            yield rows["source_text"] + rows["target_text"]

    @functools.cache
    def dataset(self, split: str) -> datasets.Dataset:
        self._check_split(split)
        limit = self.options.max_len

        def encode(batch):
            return {"src": self.encode_texts(batch["source_text"]), "tgt": self.encode_texts(batch["target_text"])}

        data = self._split(split).map(encode, batched=True, new_fingerprint=f"{self.tokens_key}-{split}")
        data = data.filter(lambda row: 0 < len(row["src"]) <= limit and 0 < len(row["tgt"]) <= limit)
        return data.select(range(min(len(data), self.options.max_test_pairs))) if split != "train" else data

    def parse_input(self, text: str) -> dict[str, Any]:
        return {"src": self.encode_texts([text])[0]}
