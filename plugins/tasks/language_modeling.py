"""``language-modeling``: next-token prediction on your text (a causal decoder), scored by
perplexity. The data is any source of :class:`~.datasets.DatasetOptions` (a file or folder in a
``datasets`` format, a saved dataset, a hub name), or plain text files (``files``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator

from transformer_zoo.core.errors import ConfigError
from transformer_zoo.core.tasks import LanguageModelTask

from .datasets import DatasetOptions, DatasetTask
from .text import check_patterns, check_text, lm_windows, resolve_files

if TYPE_CHECKING:
    import datasets


class LanguageModelingOptions(DatasetOptions):
    """Predict each next token of your text (a causal decoder); scored by perplexity."""

    kind: Literal["language-modeling"] = "language-modeling"
    columns: ClassVar[tuple[str, ...]] = ("text",)
    text_columns: ClassVar[tuple[str, ...]] = ("text",)

    text: str = Field(
        "text", description="the column holding the text (.txt files and files: 'text', one example a row)"
    )
    files: str | list[str] | None = Field(
        None, description="text files instead of path: a file, a folder of .txt files, a glob, or a list of them"
    )
    test_files: str | list[str] | None = Field(
        None, description="held-out text files (with files); null: hold out test_fraction of the examples"
    )
    sample_by: Literal["line", "paragraph", "document"] = Field(
        "line", description="what one example of a text file (.txt, or files) is"
    )

    _file_patterns = field_validator("files", "test_files")(check_patterns)

    def reading(self) -> dict[str, Any]:
        return {"sample_by": self.sample_by}

    def read_files(self) -> dict[str, datasets.Dataset]:
        """``files`` (and ``test_files``) as text, one example per ``sample_by``; blank ones dropped."""
        import datasets

        splits = {"train": "files", **({"test": "test_files"} if self.test_files is not None else {})}
        found = {
            split: check_text(resolve_files(getattr(self, field), field), field) for split, field in splits.items()
        }
        read = {}
        for split, field in splits.items():
            try:
                data = datasets.load_dataset("text", data_files=found[split], sample_by=self.sample_by, split="train")
            except datasets.exceptions.DatasetGenerationError as error:  # past the start check: say which files
                raise ConfigError(
                    f"could not read {field}={getattr(self, field)!r} as text: {error.__cause__ or error}; "
                    "give UTF-8 text files"
                ) from error
            read[split] = data.filter(lambda row: bool(row["text"].strip()))
        return read

    def build(self) -> LanguageModelingDataTask:
        return LanguageModelingDataTask(self)


class LanguageModelingDataTask(DatasetTask, LanguageModelTask):
    """The token stream of all texts (each ended by EOS), cut into windows of ``max_len + 1``
    tokens that overlap by one, so that every token is predicted exactly once."""

    def _encode(self, batch: dict[str, list]) -> dict[str, list]:
        return {"ids": lm_windows(self.encode_texts(self._texts_of(batch, "text")), self.eos_id, self.options.max_len)}

    def parse_input(self, text: str) -> dict[str, Any]:
        return {"ids": [*self.encode_texts([text])[0], self.eos_id]}
