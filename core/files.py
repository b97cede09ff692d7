"""Files written so that a crash never leaves one half-written, readable as the umask says, and
their SHA-256 digests, so that a file changed after it was written is found out."""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from pathlib import Path
from typing import Any

CHUNK = 1 << 20  # bytes read at a time when hashing a file


def atomic_write(path: Path, write: Any) -> None:
    """Call ``write(tmp_path)`` then move the file into place, so ``path`` is never half-written.

    The temporary file (``.NAME.XXXXXXXX.tmp`` beside ``path``) is created with mode 0o666 less
    the umask, as ``open`` would create ``path`` itself, so that a folder shared with a group
    stays readable by it; a writer that replaces the file (safetensors makes its own with mode
    0o600) has that mode restored."""
    tmp = _new_file(path)
    try:
        mode = stat.S_IMODE(tmp.stat().st_mode)
        write(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _new_file(path: Path) -> Path:
    """An empty file of a fresh name beside ``path`` (``O_EXCL``: never one that exists)."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the kernel applies the umask
        except FileExistsError:
            continue
        return tmp


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 digest of the file's bytes, in hexadecimal (``sha256sum``'s)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
