"""``python-source``: language modelling on the bytes of the Python standard library's own source
files, a corpus present wherever the zoo runs: nothing to download, and real text with long-range
structure (indentation, names defined far above their use).

Each ``.py`` file of the standard library (its ``test`` packages and ``site-packages`` left out)
goes to the train, validation or test split by a hash of the seed and its path, so a seed is one
split of the files. The tokens are the file's bytes (256 of them, after the PAD, BOS and EOS ids),
each file ended by EOS. Training examples are windows of ``max_len`` tokens (L); the ``test`` split
scores windows of L tokens, and each ``test_Nx`` split (``longer``: ``test_2x``, ``test_4x`` and
``test_8x`` by default) windows of N times L tokens over the same first ``test_tokens`` tokens of
the test files, so every length is scored on the same text (Press et al. 2022, section 4). The corpus depends on the Python version
and nothing else: :meth:`PythonSourceTask.corpus` records the version and a SHA-256 digest of the
files read, written into every run folder (``corpus.json``) so that a result names its data.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from transformer_zoo.core.embedding import EOS
from transformer_zoo.core.tasks import LanguageModelTask, TaskOptions
from transformer_zoo.core.validation import MAX_EXAMPLES, MAX_LENGTH

if TYPE_CHECKING:
    import datasets

FIRST_BYTE = 3  # after PAD, BOS, EOS
SPLITS = {"train": 0.8, "validation": 0.1, "test": 0.1}
"""The share of the files each split takes."""


class PythonSourceOptions(TaskOptions):
    """Predict each next byte of the Python standard library's source; scored by perplexity at the
    training length and at longer ones."""

    kind: Literal["python-source"] = "python-source"
    max_len: int = Field(128, ge=2, le=MAX_LENGTH, description="tokens (bytes) of each training example: L")
    longer: list[int] = Field(
        [2, 4, 8], description="multiples N of max_len also scored, each in a split of its own, test_Nx"
    )
    train_tokens: int = Field(
        2_000_000, ge=1, le=MAX_EXAMPLES * MAX_LENGTH, description="bytes of the training files read at most"
    )
    test_tokens: int = Field(
        16_384, ge=1, le=MAX_EXAMPLES * MAX_LENGTH, description="bytes of the test (and validation) files scored"
    )

    @model_validator(mode="after")
    def _check_lengths(self) -> PythonSourceOptions:
        for n in self.longer:
            if n < 2:
                raise ValueError(f"longer: {n} is not a multiple of max_len above 1; the test split scores max_len")
            if n * self.max_len > min(MAX_LENGTH, self.test_tokens):
                raise ValueError(
                    f"longer: {n} x max_len={self.max_len} is longer than test_tokens={self.test_tokens} (or "
                    f"{MAX_LENGTH}); raise test_tokens or lower the multiple"
                )
        return self

    @property
    def lengths(self) -> dict[str, int]:
        """The tokens of each scored input, by test split."""
        return {"test": self.max_len, **{f"test_{n}x": n * self.max_len for n in self.longer}}

    def build(self) -> PythonSourceTask:
        return PythonSourceTask(self)


@functools.cache
def stdlib_files() -> tuple[Path, ...]:
    """The standard library's ``.py`` files, sorted by path, without its tests and installed
    packages (whose folders are not walked). Read once a process: the library does not change."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [name for name in subfolders if name not in skip]
        found += [Path(folder, name) for name in names if name.endswith(".py")]
    return tuple(sorted(found))


@functools.cache
def split_files(seed: int) -> dict[str, tuple[Path, ...]]:
    """Each split's files for ``seed``: a file's split is decided by a hash of the seed and its path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    split: dict[str, list[Path]] = {name: [] for name in SPLITS}
    for path in stdlib_files():
        key = f"{seed}:{path.relative_to(root).as_posix()}".encode()
        draw = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64
        bound = 0.0
        for name, share in SPLITS.items():
            bound += share
            if draw < bound or name == "test":
                split[name].append(path)
                break
    return {name: tuple(paths) for name, paths in split.items()}


@functools.cache
def stdlib_digest() -> str:
    """A SHA-256 digest of every file :func:`stdlib_files` reads: its path and its bytes."""
    digest = hashlib.sha256()
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in stdlib_files():
        data = path.read_bytes()
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


class PythonSourceTask(LanguageModelTask):
    """Windows of the byte stream of each split's files (see the module)."""

    vocab_size = FIRST_BYTE + 256

    def __init__(self, options: PythonSourceOptions) -> None:
        self.options = options

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train", "validation", *self.options.lengths)

    @property
    def _files(self) -> dict[str, tuple[Path, ...]]:
        return split_files(self.options.seed)

    def _stream(self, split: str, limit: int) -> list[int]:
        """The first ``limit`` tokens of a split's files, each file's bytes then EOS."""
        tokens: list[int] = []
        for path in self._files[split]:
            tokens += [FIRST_BYTE + b for b in path.read_bytes()] + [EOS]
            if len(tokens) >= limit:
                break
        return tokens[:limit]

    @functools.cache
    def dataset(self, split: str) -> datasets.Dataset:
        import datasets

        self._check_split(split)
        o = self.options
        if split == "train":
            stream, length = self._stream("train", o.train_tokens), o.max_len
        else:
            stream = self._stream("validation" if split == "validation" else "test", o.test_tokens + 1)
            length = o.lengths.get(split, o.max_len)
        # windows of length + 1 tokens that overlap by one: every token is predicted exactly once
        ids = [stream[i : i + length + 1] for i in range(0, len(stream) - 1, length)]
        return datasets.Dataset.from_dict({"ids": [w for w in ids if len(w) > 1]})

    @functools.cached_property
    def corpus(self) -> dict[str, Any]:
        """What the data is: the Python version, the files of each split and their bytes, and a
        SHA-256 digest of every file read (its path and its bytes)."""
        return {
            "source": "the Python standard library's .py files (without tests)",
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "files": {name: len(paths) for name, paths in self._files.items()},
            "sha256": stdlib_digest(),
        }

    def unfit_reason(self, config: Any) -> str | None:
        if reason := super().unfit_reason(config):
            return reason
        positional = getattr(getattr(config, "positional", None), "kind", None)
        longest = max(self.options.lengths.values())
        if positional == "learned" and getattr(config, "max_len", longest) < longest:
            return (
                f"learned positions cannot read the test lengths up to {longest} tokens with max_len="
                f"{config.max_len} (they have no vector past it): build the model with max_len >= {longest}, "
                "or leave the longer multiples out of longer"
            )
        return None

    def save_assets(self, directory: Path) -> None:
        (directory / "corpus.json").write_text(json.dumps(self.corpus, indent=2))

    def token_strings(self, ids: list[int]) -> list[str]:
        return [repr(chr(i - FIRST_BYTE))[1:-1] if i >= FIRST_BYTE else ("PAD", "BOS", "EOS")[i] for i in ids]

    def parse_input(self, text: str) -> dict[str, Any]:
        return {"ids": [FIRST_BYTE + b for b in text.encode()] + [EOS]}
