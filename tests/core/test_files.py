"""Files written atomically are readable as the umask says, like files opened for writing."""

from __future__ import annotations

import os
import stat

import pytest

from transformer_zoo.core.files import atomic_write, file_sha256
from transformer_zoo.training.config import load_train_config
from transformer_zoo.training.trainer import train

RUN = {
    "model": {"variant": "transformer-tiny", "d_model": 16, "n_heads": 2, "d_ff": 32, "encoder": {"layers": 1}},
    "task": {"kind": "reverse", "train_size": 20, "test_size": 4, "train_lengths": [1, 4], "test_lengths": [5, 6]},
    "steps": 2,
    "batch_size": 4,
}


@pytest.fixture
def umask():
    def set_mask(mask: int) -> None:
        os.umask(mask)

    old = os.umask(0o022)
    yield set_mask
    os.umask(old)


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_an_atomic_write_gives_the_mode_the_umask_allows(tmp_path, umask, mask, mode):
    umask(mask)
    atomic_write(tmp_path / "a.txt", lambda path: path.write_text("a"))
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == mode
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"], "no temporary file left"


def test_every_file_of_a_run_folder_is_readable_by_the_group_a_umask_of_002_shares_it_with(tmp_path, umask):
    umask(0o002)
    train(load_train_config(RUN), tmp_path / "run", progress=False)
    files = [path for path in (tmp_path / "run").rglob("*") if path.is_file() and path.name != ".lock"]
    assert {"train.json", "summary.json", "model.safetensors", "optimizer.pt", "state.json"} <= {p.name for p in files}
    assert {str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {
        str(p.relative_to(tmp_path)): oct(0o664) for p in files
    }


def test_a_files_digest_is_sha256sums(tmp_path):
    (tmp_path / "a").write_bytes(b"abc")
    assert file_sha256(tmp_path / "a") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
