"""``seq2seq``: write the target text for each source text of your data (translation, or any
text-to-text job), scored by corpus BLEU (sacrebleu, on detokenized text) of the model's greedy
or beam-search output, and by token and sequence accuracy.

The data is any source of :class:`~.datasets.DatasetOptions`, or parallel files (``files``): a
.tsv line ``source<TAB>target`` with no header, or .jsonl objects. A Hugging Face translation dataset, whose rows
hold a ``translation`` column mapping languages to text (WMT's), is read with ``source`` and
``target`` naming the languages. Source and target share one byte-level BPE tokenizer (trained
here on both sides of the training split, or loaded), as the original Transformer shares its
embeddings.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator

from transformer_zoo.core.errors import ConfigError, optional
from transformer_zoo.core.tasks import Better, Seq2SeqTask
from transformer_zoo.core.validation import MAX_BEAM

from .datasets import DatasetOptions, DatasetTask
from .text import check_patterns, resolve_files

if TYPE_CHECKING:
    import datasets
    from tokenizers import Tokenizer

PARALLEL_SUFFIXES = (".tsv", ".jsonl", ".json", ".txt")  # .txt: tab-separated, as .tsv


def read_pairs(files: list[str], columns: tuple[str, str]) -> datasets.Dataset:
    """Parallel files: .tsv (or .txt) lines ``source<TAB>target`` with no header, named ``columns``
    (quotes are text), or .jsonl (.json) objects with their own keys."""
    import datasets

    kinds = {Path(f).suffix.lower() for f in files}
    try:
        if kinds <= {".tsv", ".txt"}:
            return datasets.load_dataset(
                "csv",
                data_files=files,
                delimiter="\t",
                column_names=list(columns),
                quoting=3,
                keep_default_na=False,
                split="train",
            )
        if kinds <= {".jsonl", ".json"}:
            return datasets.load_dataset("json", data_files=files, split="train")
    except Exception as error:  # the parser's own message, with which files and what they must hold
        raise ConfigError(
            f"could not read the parallel files {', '.join(files)}: {error}. A .tsv line holds a "
            "source and a target separated by one tab; a .jsonl line holds one JSON object"
        ) from error
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


class Seq2SeqOptions(DatasetOptions):
    """Write the target text for each source text of your data (translation, ...); BLEU, and token accuracy."""

    kind: Literal["seq2seq"] = "seq2seq"
    columns: ClassVar[tuple[str, ...]] = ("source", "target")
    text_columns: ClassVar[tuple[str, ...]] = ("source", "target")
    file_suffixes: ClassVar[tuple[str, ...]] = PARALLEL_SUFFIXES

    source: str = Field("source", description="the source column, or the source language inside a 'translation' column")
    target: str = Field("target", description="the target column, or the target language inside a 'translation' column")
    files: str | list[str] | None = Field(
        None,
        description="parallel files instead of path: .tsv (source<TAB>target per line, no header) or .jsonl "
        "(one object per line); a file, a folder, a glob or a list",
    )
    test_files: str | list[str] | None = Field(
        None, description="held-out parallel files (with files); null: hold out test_fraction of the pairs"
    )
    too_long: Literal["drop", "truncate"] = Field(
        "drop", description="pairs with a side longer than max_len tokens: dropped, or cut to max_len"
    )
    beam_size: int = Field(1, ge=1, le=MAX_BEAM, description="1: greedy decoding; more: beam search when scoring")

    _file_patterns = field_validator("files", "test_files")(check_patterns)

    def read_files(self) -> dict[str, datasets.Dataset]:
        """``files`` (and ``test_files``) as pairs; a .tsv file's columns are named by ``source`` and ``target``."""
        splits = {"train": "files", **({"test": "test_files"} if self.test_files is not None else {})}
        return {
            split: read_pairs(resolve_files(getattr(self, field), field, PARALLEL_SUFFIXES), (self.source, self.target))
            for split, field in splits.items()
        }

    def _rows(self, data: datasets.Dataset, split: str) -> datasets.Dataset:
        names = data.column_names
        if "translation" in names and not {self.source, self.target} <= set(names):
            data = self._languages(data)
        return super()._rows(data, split)

    def _languages(self, data: datasets.Dataset) -> datasets.Dataset:
        """A ``translation`` column of ``{language: text}`` rows as ``source`` and ``target`` columns."""
        languages = list(data[0]["translation"]) if len(data) else []
        missing = [f for f in (self.source, self.target) if f not in languages]
        if missing:
            raise ConfigError(
                f"the parallel data has no field {missing[0]!r}; its languages in its 'translation' "
                f"column are {', '.join(languages)} (set source and target)"
            )
        source, target = self.source, self.target
        return data.map(
            lambda row: {source: str(row["translation"][source]), target: str(row["translation"][target])},
            remove_columns=data.column_names,
        )

    def build(self) -> Seq2SeqDataTask:
        optional("sacrebleu", "text", "the seq2seq task (its BLEU)")  # refused now, not after training
        return Seq2SeqDataTask(self)


class Seq2SeqDataTask(BleuScored, DatasetTask, Seq2SeqTask):
    """Source and target as token ids (one tokenizer for both), with the reference text kept for BLEU."""

    metrics: ClassVar[dict[str, Better]] = {"bleu": "higher", **Seq2SeqTask.metrics}
    bounds: ClassVar[dict[str, tuple[float, float]]] = {"bleu": (0.0, 100.0), **Seq2SeqTask.bounds}

    def __init__(self, options: Seq2SeqOptions) -> None:
        super().__init__(options)
        self.beam_size = options.beam_size

    def _encode(self, batch: dict[str, list]) -> dict[str, list]:
        targets = self._texts_of(batch, "target")
        src, tgt = self.encode_texts(self._texts_of(batch, "source")), self.encode_texts(targets)
        if self.options.too_long == "truncate":  # the reference text is then what is left of the target
            limit = self.options.max_len
            src, tgt = [row[:limit] for row in src], [row[:limit] for row in tgt]
            targets = self.tokenizer.decode_batch(tgt)
        return {"src": src, "tgt": tgt, "target_text": targets}

    def _kept(self, data: datasets.Dataset, split: str) -> datasets.Dataset:
        limit = self.options.max_len
        kept = data.filter(lambda row: 0 < len(row["src"]) <= limit and 0 < len(row["tgt"]) <= limit)
        if not len(kept):
            raise ConfigError(
                f"every pair of split {split!r} has a side longer than max_len={limit} tokens; raise "
                "max_len, or set too_long: truncate to cut them"
            )
        return kept
