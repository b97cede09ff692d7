"""Text from local files: the tokenizer (trained here or loaded), shared by every text task, and
the ``text-mlm`` task.

Files are read by ``datasets``' ``text`` builder (one example per line, paragraph or file)
and split into train and test with a fixed seed, or taken from ``test_files``. The tokenizer
is a byte-level BPE trained on the training split with Hugging Face ``tokenizers``, cached by
the files' paths, sizes and modification times, or a ``tokenizer.json`` loaded from a folder.
Nothing downloads.
"""

from __future__ import annotations

import codecs
import functools
import glob
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator

from transformer_zoo.core.errors import ConfigError, optional
from transformer_zoo.core.tasks import MaskedLMTask, Task, TaskOptions
from transformer_zoo.core.validation import MAX_EXAMPLES, MAX_LENGTH

if TYPE_CHECKING:
    import datasets
    from tokenizers import Tokenizer

SPECIAL_TOKENS = ("[PAD]", "[BOS]", "[EOS]", "[MASK]", "[UNK]")  # ids 0-4 of a tokenizer trained here
ROLE_NAMES = {  # what a loaded tokenizer may call each special token, in order of preference
    "pad": ("[PAD]", "<pad>"),
    "bos": ("[BOS]", "[CLS]", "<s>", "<|endoftext|>"),
    "eos": ("[EOS]", "[SEP]", "</s>", "<|endoftext|>"),
    "mask": ("[MASK]", "<mask>"),
    "unk": ("[UNK]", "<unk>"),
}


def cache_root() -> Path:
    """Where derived data (trained tokenizers) is kept: ``$TZOO_CACHE``, else ``~/.cache/transformer_zoo``."""
    return Path(os.environ.get("TZOO_CACHE") or Path.home() / ".cache" / "transformer_zoo")


def resolve_files(patterns: str | list[str], field: str = "files", suffixes: tuple[str, ...] = (".txt",)) -> list[str]:
    """Sorted file paths from folders (every file with one of ``suffixes`` inside, recursively),
    globs and files."""
    found: set[str] = set()
    for pattern in [patterns] if isinstance(patterns, str) else patterns:
        path = Path(pattern).expanduser()
        if path.is_dir():
            found.update(str(p) for p in path.rglob("*") if p.is_file() and p.suffix.lower() in suffixes)
        else:
            found.update(p for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
    if not found:
        raise ConfigError(
            f"{field}={patterns!r} matched no file; give a file, a folder of {' or '.join(suffixes)} files, "
            f"or a glob such as 'corpus/*{suffixes[0]}'"
        )
    return sorted(found)


def check_text(files: list[str], field: str = "files", sample: int = 1 << 16) -> list[str]:
    """``files``, refused if the start of one is not UTF-8 text (a binary file given by mistake):
    the first ``sample`` bytes of each are read, so that the mistake is reported with the file's
    name before any reading or training."""
    for name in files:
        with open(name, "rb") as file:
            head = file.read(sample)
        try:
            if b"\0" in head:
                raise UnicodeDecodeError("utf-8", head, head.index(b"\0"), head.index(b"\0") + 1, "a NUL byte")
            codecs.getincrementaldecoder("utf-8")().decode(head, final=False)  # a character cut at the end is fine
        except UnicodeDecodeError as error:
            raise ConfigError(
                f"{field}: {name!r} is not UTF-8 text (byte {error.start}: {error.reason}); give text "
                "files, or a data format the task reads"
            ) from None
    return files


def check_patterns(value: Any) -> Any:
    """``value`` (a file, folder or glob, a list of them, or a mapping of them), refused if any is
    empty: an empty pattern names the working directory, and so every file under it."""
    items = value.values() if isinstance(value, dict) else [value] if isinstance(value, str) else value or []
    for item in items:
        if isinstance(item, (list, dict)):
            check_patterns(item)
        elif isinstance(item, str) and not item.strip():
            raise ValueError(
                f"{item!r} is empty, which would read every file under the working directory; give a "
                "file, a folder or a glob, such as 'corpus/*.txt'"
            )
    return value


def fingerprint(files: list[str] | None, *parts: Any) -> str:
    """A short hash of the files' paths, sizes and modification times, and of ``parts``
    (which may hold another fingerprint, such as that of held-out files)."""
    digest = hashlib.sha1(json.dumps([str(p) for p in parts]).encode())
    for name in files or ():
        stat = os.stat(name)
        digest.update(f"{os.path.abspath(name)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


class TokenizerOptions(TaskOptions):
    """Options shared by tasks that read text through a tokenizer."""

    tokenizer: str | None = Field(
        None, description="a folder holding tokenizer.json (or the file itself); null: train a byte-level BPE here"
    )
    vocab_size: int = Field(
        2000, ge=len(SPECIAL_TOKENS) + 256, le=1_000_000, description="vocabulary of a tokenizer trained here"
    )

    def with_assets(self, directory: Path) -> TokenizerOptions:
        saved = Path(directory) / "tokenizer"
        return self.model_copy(update={"tokenizer": str(saved)}) if (saved / "tokenizer.json").is_file() else self

    def load_tokenizer(self, texts: Any, key: str) -> Tokenizer:
        """The tokenizer named by ``tokenizer``, or one trained on ``texts`` (an iterator of
        batches of strings) and cached under ``key``."""
        optional("tokenizers", "text", f"the {self.kind} task (its tokenizer)")  # missing: how to install it
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        if self.tokenizer is not None:
            path = Path(self.tokenizer).expanduser()
            path = path / "tokenizer.json" if path.is_dir() else path
            if not path.is_file():
                raise ConfigError(
                    f"tokenizer={self.tokenizer!r}: no tokenizer.json there; give the folder a "
                    "Hugging Face tokenizer was saved to, or null to train one on the data"
                )
            return Tokenizer.from_file(str(path))
        cached = cache_root() / "tokenizers" / f"{key}-{self.vocab_size}" / "tokenizer.json"
        if cached.is_file():
            return Tokenizer.from_file(str(cached))
        tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=self.vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tokenizer.train_from_iterator(texts, trainer=trainer)
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.tmp")
        tokenizer.save(str(partial))
        os.replace(partial, cached)  # atomic: a reader sees the whole file or none
        return tokenizer


def special_ids(tokenizer: Tokenizer, roles: tuple[str, ...], source: str) -> dict[str, int]:
    """The id of each special-token role (``pad``, ``bos``, ...) in ``tokenizer``."""
    found = {}
    for role in roles:
        ids = [tokenizer.token_to_id(name) for name in ROLE_NAMES[role]]
        ids = [i for i in ids if i is not None]
        if not ids:
            raise ConfigError(
                f"tokenizer {source!r} has no {role} token; it needs one of {', '.join(ROLE_NAMES[role])}"
            )
        found[role] = ids[0]
    return found


class TextOptions(TokenizerOptions):
    """Options shared by the text tasks."""

    files: str | list[str] = Field(description="text files: a file, a folder of .txt files, a glob, or a list of them")
    test_files: str | list[str] | None = Field(
        None, description="held-out files; null: hold out test_fraction of the examples"
    )
    sample_by: Literal["line", "paragraph", "document"] = Field("line", description="what one example is")
    test_fraction: float = Field(0.1, gt=0, lt=1, description="share of examples held out when test_files is null")
    seq_len: int = Field(128, ge=4, le=MAX_LENGTH, description="tokens per training sequence")
    max_test_sequences: int = Field(
        500, ge=1, le=MAX_EXAMPLES, description="test sequences scored at most (the first ones)"
    )

    _patterns = field_validator("files", "test_files")(check_patterns)


class Tokenized:
    """Text to ids and back through the task's ``tokenizer``."""

    tokenizer: Tokenizer
    key: str  # identifies the text read (files and how they are split)

    @functools.cached_property
    def tokens_key(self) -> str:
        """Identifies the text read and the tokenizer: the cache key of tokenized data."""
        return hashlib.sha1((self.key + self.tokenizer.to_str()).encode()).hexdigest()[:16]

    def save_assets(self, directory: Path) -> None:
        (Path(directory) / "tokenizer").mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(Path(directory) / "tokenizer" / "tokenizer.json"))

    def encode_texts(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def token_strings(self, ids: list[int]) -> list[str]:
        """Each token's text, a leading space shown as ``▁`` (as SentencePiece writes it)."""
        texts = (self.tokenizer.decode([i], skip_special_tokens=False) or self.tokenizer.id_to_token(i) for i in ids)
        return [text.replace(" ", "▁") for text in texts]


class TextTask(Tokenized, Task):
    """Tokenized text from local files, in sequences of at most ``seq_len`` tokens."""

    splits: ClassVar[tuple[str, ...]] = ("train", "test")
    roles: ClassVar[tuple[str, ...]] = ("pad", "bos", "eos")

    def __init__(self, options: TextOptions) -> None:
        self.options = options
        self.files = check_text(resolve_files(options.files))
        self.test_files = (
            None
            if options.test_files is None
            else check_text(resolve_files(options.test_files, "test_files"), "test_files")
        )
        held_out = self.test_files and fingerprint(self.test_files)
        self.key = fingerprint(self.files, held_out, options.sample_by, options.test_fraction, options.seed)
        self.tokenizer = options.load_tokenizer(self._texts(), self.key)
        ids = special_ids(self.tokenizer, self.roles, options.tokenizer or "trained here")
        for role, value in ids.items():
            setattr(self, f"{role}_id", value)
        self.vocab_size = self.tokenizer.get_vocab_size()

    @functools.cache
    def _raw(self, split: str) -> datasets.Dataset:
        import datasets

        o = self.options
        files = self.test_files if self.test_files is not None and split != "train" else self.files
        try:
            data = datasets.load_dataset("text", data_files=files, sample_by=o.sample_by, split="train")
        except datasets.exceptions.DatasetGenerationError as error:  # past the start check: say which files
            field = "test_files" if files is self.test_files else "files"
            raise ConfigError(
                f"could not read {field}={getattr(o, field)!r} as text: {error.__cause__ or error}; "
                "give UTF-8 text files"
            ) from error
        data = data.filter(lambda row: bool(row["text"].strip()))
        if self.test_files is not None:
            return data
        if len(data) < 2:
            raise ConfigError(
                f"files={o.files!r} hold {len(data)} non-empty {o.sample_by}(s); a train/test split "
                "needs at least 2 (or give test_files)"
            )
        return data.train_test_split(test_size=o.test_fraction, seed=o.seed)[split]

    def _texts(self):
        data = self._raw("train")
        for start in range(0, len(data), 1000):
            yield data[start : start + 1000]["text"]

    def dataset(self, split: str) -> datasets.Dataset:
        self._check_split(split)
        data = self._sequences(split)
        return data.select(range(min(len(data), self.options.max_test_sequences))) if split != "train" else data

    @functools.cache
    def _sequences(self, split: str) -> datasets.Dataset:
        return self._raw(split).map(
            self._chunk,
            batched=True,
            batch_size=10_000,
            remove_columns=["text"],
            new_fingerprint=f"{self.tokens_key}-{self.options.kind}-{split}-{self.options.seq_len}",
        )

    def _chunk(self, batch: dict[str, list]) -> dict[str, list]:
        raise NotImplementedError

    def parse_input(self, text: str) -> dict[str, Any]:
        return {"ids": [self.bos_id, *self.encode_texts([text])[0], self.eos_id]}


def lm_windows(sequences: list[list[int]], eos_id: int, size: int) -> list[list[int]]:
    """The token stream of ``sequences`` (each ended by ``eos_id``) cut into windows of
    ``size + 1`` tokens that overlap by one, so that every token is predicted exactly once."""
    stream = [i for ids in sequences for i in (*ids, eos_id)]
    return [stream[s : s + size + 1] for s in range(0, max(len(stream) - 1, 0), size)]


class TextMLMOptions(TextOptions):
    """Masked-token prediction on local text files (BERT's objective, an encoder)."""

    kind: Literal["text-mlm"] = "text-mlm"
    mask_probability: float = Field(0.15, gt=0, lt=1, description="share of tokens selected for prediction")

    def build(self) -> TextMLMTask:
        return TextMLMTask(self)


class TextMLMTask(TextTask, MaskedLMTask):
    """Each example, as ``BOS ids EOS`` of at most ``seq_len`` tokens (longer ones are cut into pieces)."""

    roles: ClassVar[tuple[str, ...]] = ("pad", "bos", "eos", "mask", "unk")

    def __init__(self, options: TextMLMOptions) -> None:
        super().__init__(options)
        self.mask_probability = options.mask_probability
        self.special_ids = (self.pad_id, self.bos_id, self.eos_id, self.unk_id)

    def _chunk(self, batch: dict[str, list]) -> dict[str, list]:
        body = self.options.seq_len - 2
        return {
            "ids": [
                [self.bos_id, *ids[s : s + body], self.eos_id]
                for ids in self.encode_texts(batch["text"])
                for s in range(0, max(len(ids), 1), body)
            ]
        }
