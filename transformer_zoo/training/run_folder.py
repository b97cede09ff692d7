"""Run folders and their checkpoints: the lock, writing, recovery and checked reading.

A checkpoint is a folder of four files: ``model.safetensors`` and ``config.json`` (the model, as
``save_pretrained`` writes them), ``optimizer.pt`` (each phase's optimizer and schedule state)
and ``state.json`` (the step, the random state and the learning curve). ``state.json`` is
written last, so a folder whose four files are there and whose ``state.json`` reads is complete.

``state.json`` also records the SHA-256 digest of each file (:data:`DIGESTS`: the other three
files', as ``sha256sum`` gives them, and its own, over its other contents), and a resume
verifies them all before it reads anything else (:func:`verify_digests`): a file whose bytes
changed after it was written is named, and the run falls back to an older intact checkpoint
if one is kept, instead of resuming silently from damaged weights.

Writing goes through three names, so that a crash at any moment leaves a complete checkpoint:
the new one is written into ``.checkpoint.tmp``, the current ``checkpoint`` is moved to
``.checkpoint.old``, ``.checkpoint.tmp`` is moved to ``checkpoint``, and ``.checkpoint.old`` is
removed. Recovery (:func:`candidates`) takes the complete one of the highest step among the
three; one that does not read falls back to the next, with a warning. Once a run has resumed,
:func:`promote` makes what it resumed from ``checkpoint`` again and removes the others.

Nothing non-finite is ever written: :func:`write_checkpoint` refuses weights or optimizer
state holding NaN or infinity, so the checkpoint on disk is always one a run can go on from.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import filelock
import safetensors
import safetensors.torch
import torch

from ..core.errors import ZooError
from ..core.files import atomic_write, file_sha256

CHECKPOINT = "checkpoint"
PARTIAL = f".{CHECKPOINT}.tmp"
PREVIOUS = f".{CHECKPOINT}.old"
FILES = ("model.safetensors", "config.json", "optimizer.pt", "state.json")
SEALED = FILES[:3]
DIGESTS = "sha256"
"""The key of ``state.json`` that records the checkpoint's digests: ``{file: SHA-256}`` for each
of :data:`SEALED`, and ``state.json``'s own (over its contents but that entry, see
:func:`seal`)."""
PLUGINS = "plugins.json"
"""In a run folder: the plugin module that provided each kind and variant of the run's config
(``{"attention:sliding-window": "transformer_zoo.plugins.local_global", ...}``), so that loading
the run where a plugin is missing names it."""
LOCK, LOCK_PID = ".lock", ".lock.pid"
RUN_MARKERS = ("train.json", CHECKPOINT, PARTIAL, PREVIOUS, LOCK, "attempts.json", "record.json")
"""What only a run folder holds (the last two: a comparison's records of its run, kept there
from before it trains): a folder with files but none of these is not one."""


class RunFolderError(ZooError, ValueError):
    """A run folder that cannot be used as asked; the message says why and the way out."""


class RunFolderBusy(RunFolderError):
    """Another process is training in the run folder (it holds the folder's lock)."""


class CheckpointError(RunFolderError):
    """A checkpoint that cannot be resumed; the message names the file."""


class CheckpointMismatch(CheckpointError):
    """An intact checkpoint that does not fit the model or optimizers it would be loaded into:
    it was written by another model (its files are as they were written, so nothing suggests
    removing it)."""


class CheckpointWarning(UserWarning):
    """A checkpoint was passed over for an older intact one, or could not be verified."""


# ---- the folder --------------------------------------------------------------------------------
def check_folder(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a folder that exists or can be created.

    Raises:
        RunFolderError: ``path``, or a folder above it, is a file.
    """
    path = Path(path)
    for part in (path, *path.parents):
        if part.exists():
            if not part.is_dir():
                where = "is a file" if part == path else f"is under {str(part)!r}, which is a file"
                raise RunFolderError(f"{what} {str(path)!r} {where}; give a folder (a new one, or one to resume)")
            break
    return path


def check_run_folder(path: Path) -> None:
    """Refuse a folder that holds files but no training run (a report, a dataset): a run would
    write its checkpoints among them, and ``--restart`` would remove what is not its own. A new
    or empty folder, and one with a run's ``train.json``, checkpoint or lock, are taken.

    Raises:
        RunFolderError: in one line, naming a few of its files.
    """
    names = sorted(entry.name for entry in path.iterdir()) if path.is_dir() else []
    if names and not any(name in names for name in RUN_MARKERS):
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise RunFolderError(
            f"run folder {str(path)!r} holds files that are not a training run ({shown}); give a new or empty "
            "folder, or the folder of a run to resume, as --out"
        )


class RunLock:
    """An exclusive lock on a run folder, taken at once or refused (never waited for).

    The lock is an ``flock`` on ``.lock`` (the operating system drops it when its process
    ends, however it ends); the holder's pid is kept beside it in ``.lock.pid`` for the
    message of a refused run. A run that wrote nothing (it was refused while setting up) leaves
    nothing: on release, the lock file and the folders the lock made are removed again when
    they hold nothing else."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self._lock = filelock.FileLock(self.run_dir / LOCK, timeout=0)
        self._made: list[Path] = []  # what acquire created: folders, outermost first, then the lock file

    def acquire(self) -> None:
        """Take the lock (creating the folder).

        Raises:
            RunFolderBusy: another process holds it; the message names its pid.
        """
        self._made = [p for p in (*reversed(self.run_dir.parents), self.run_dir) if not p.exists()]
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not (self.run_dir / LOCK).exists():
            self._made.append(self.run_dir / LOCK)
        try:
            self._lock.acquire()
        except filelock.Timeout:
            self._made = []
            raise RunFolderBusy(
                f"run folder {str(self.run_dir)!r} is in use by another training run ({self.holder()}); "
                "wait for it to finish, stop it, or train into another --out"
            ) from None
        text = str(os.getpid())
        atomic_write(self.run_dir / LOCK_PID, lambda tmp: tmp.write_text(text))

    def holder(self) -> str:
        """The holder's pid, as the holder wrote it (waiting a moment for a lock taken just now)."""
        for _ in range(20):
            try:
                return f"pid {int((self.run_dir / LOCK_PID).read_text())}"
            except (OSError, ValueError):
                time.sleep(0.05)
        return "its pid not written"

    def release(self) -> None:
        if self._lock.is_locked:
            (self.run_dir / LOCK_PID).unlink(missing_ok=True)
            if {entry.name for entry in self.run_dir.iterdir()} <= {LOCK}:  # the run wrote nothing
                for made in reversed(self._made):
                    with contextlib.suppress(OSError):  # a folder another process has written into stays
                        made.unlink() if made.name == LOCK else made.rmdir()
            self._lock.release()
        self._made = []

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def remove_partial_files(run_dir: Path) -> list[Path]:
    """Remove what an interrupted atomic write left (``.NAME.*.tmp`` files) in the run folder,
    ``model/`` and the checkpoint folders; returns them. Call it holding the lock."""
    folders = [run_dir, run_dir / "model", *(run_dir / name for name in (CHECKPOINT, PARTIAL, PREVIOUS))]
    removed = [path for folder in folders if folder.is_dir() for path in folder.glob(".*.tmp") if path.is_file()]
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


class _Absent:
    def __repr__(self) -> str:
        return "absent"


def differences(before: Any, after: Any, ignore: Iterable[str] = (), path: str = "") -> list[str]:
    """Where two JSON values differ, as ``dotted.path: old -> new`` (mappings compared key by
    key), leaving out the top-level keys in ``ignore``: what a run folder's ``train.json``
    and the config of a run resumed there may not disagree on."""
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return [] if before == after else [f"{path}: {before!r} -> {after!r}"]
    found = []
    for key in [*before, *(k for k in after if k not in before)]:
        if path or key not in ignore:
            found += differences(
                before.get(key, _Absent()), after.get(key, _Absent()), (), f"{path}.{key}" if path else str(key)
            )
    return found


# ---- writing -----------------------------------------------------------------------------------
def first_non_finite(tensors: Iterable[tuple[str, Any]]) -> str | None:
    """The name of the first floating-point tensor holding NaN or infinity; None if all are finite."""
    for name, value in tensors:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return name
    return None


def optimizer_tensors(optimizers: dict[str, dict]) -> Iterator[tuple[str, Any]]:
    """Every tensor of each phase's optimizer state dict, named ``phase/index/key``."""
    for phase, state in optimizers.items():
        for index, values in state.get("state", {}).items():
            for key, value in values.items():
                yield f"{phase}/{index}/{key}", value


def write_checkpoint(
    run_dir: Path,
    model: torch.nn.Module,
    optimizers: dict[str, dict],
    schedulers: dict[str, dict],
    state: dict[str, Any],
) -> None:
    """Write a checkpoint into ``.checkpoint.tmp``, then swap it in for ``checkpoint``; a
    crash at any moment leaves a complete checkpoint (see :func:`candidates`).

    Args:
        optimizers, schedulers: each phase's state dicts, in one process's layout.
        state: ``state.json``'s contents (step, random state, learning curve).

    Raises:
        ValueError: a weight or an optimizer state is not finite; nothing is written.
    """
    bad = first_non_finite(model.state_dict().items()) or first_non_finite(optimizer_tensors(optimizers))
    if bad is not None:
        raise ValueError(f"{bad} is not finite")
    final, tmp, old = run_dir / CHECKPOINT, run_dir / PARTIAL, run_dir / PREVIOUS
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    torch.save({"optimizers": optimizers, "schedulers": schedulers}, tmp / "optimizer.pt")
    text = json.dumps(seal(state, tmp))
    atomic_write(tmp / "state.json", lambda path: path.write_text(text))  # last: its presence marks tmp complete
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def seal(state: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``state.json``'s contents with the checkpoint's digests (:data:`DIGESTS`): those of the
    files of ``folder`` already written, and its own, over the rest of it."""
    files = {name: file_sha256(folder / name) for name in SEALED}
    return {**state, DIGESTS: {**files, "state.json": _state_digest({**state, DIGESTS: files})}}


def _state_digest(state: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


# ---- recovery ----------------------------------------------------------------------------------
def candidates(run_dir: Path) -> list[Path]:
    """The checkpoints a run can resume from, the newest first: the complete ones among
    ``checkpoint``, ``.checkpoint.tmp`` and ``.checkpoint.old``, by step (on a tie in that
    order). A ``checkpoint`` folder that is not complete is listed first all the same: only a
    finished write is moved to it, so it is damaged, and reading it says how."""
    found = []
    for rank, folder in enumerate(run_dir / name for name in (CHECKPOINT, PARTIAL, PREVIOUS)):
        step = _written_step(folder)
        if step is not None or (rank == 0 and folder.is_dir()):
            found.append((-1 if step is None else step, -rank, folder))
    damaged = [entry for entry in found if entry[0] < 0]
    return [folder for *_, folder in damaged + sorted((e for e in found if e[0] >= 0), reverse=True)]


def _written_step(folder: Path) -> int | None:
    """The step of a complete checkpoint folder; None if it is not complete."""
    if not all((folder / name).is_file() for name in FILES):
        return None
    try:
        step = read_json(folder / "state.json").get("step")
    except (RunFolderError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None


def promote(run_dir: Path, chosen: Path | None) -> None:
    """Make ``chosen`` the run folder's ``checkpoint`` and remove the other checkpoint folders
    (None: remove them all, as a run started over does). ``chosen`` survives a crash at any
    moment, under its own name or as ``checkpoint``."""
    final = run_dir / CHECKPOINT
    if chosen is not None and chosen != final:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(chosen, final)
    for name in (PARTIAL, PREVIOUS) + ((CHECKPOINT,) if chosen is None else ()):
        shutil.rmtree(run_dir / name, ignore_errors=True)


def warn_passed_over(problems: list[str], used: Path, step: int) -> None:
    for problem in problems:
        warnings.warn(
            f"{problem}; resuming from the intact {used} (step {step}) instead", CheckpointWarning, stacklevel=3
        )


# ---- checked reading ---------------------------------------------------------------------------
def read_state(folder: Path) -> dict[str, Any]:
    """``state.json`` of a checkpoint, checked: its own digest (when it records digests, see
    :func:`verify_digests`), a step of at least 0, the CPU random state, the learning curve (and
    the CUDA random state, if any).

    Raises:
        CheckpointError: it is missing, unreadable, changed since it was written, or a value is
            missing or of the wrong kind.
    """
    path = folder / "state.json"
    state = read_json(path, CheckpointError)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds {type(state).__name__}, not a mapping of step, rng and history")
    recorded = state.get(DIGESTS)
    if recorded is not None:
        if not isinstance(recorded, dict) or not all(isinstance(recorded.get(n), str) for n in (*SEALED, path.name)):
            raise CheckpointError(
                f"{path} has a {DIGESTS!r} record that is not a SHA-256 digest of each of {', '.join(FILES)}"
            )
        own = _state_digest({**state, DIGESTS: {k: v for k, v in recorded.items() if k != path.name}})
        if own != recorded[path.name]:
            raise _changed(path, recorded[path.name], own, "it records for itself")
    missing = [key for key in ("step", "rng", "history") if key not in state]
    if missing:
        raise CheckpointError(f"{path} lacks {', '.join(map(repr, missing))}")
    step = state["step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{path} has step {step!r}; a step is a whole number of at least 0")
    for key, size in (("rng", torch.get_rng_state().numel()), ("cuda_rng", None)):
        if key in state and not _is_bytes(state[key], size):
            raise CheckpointError(
                f"{path} has a {key} that is not a random state (a list of {size or 'some'} whole numbers in [0, 255])"
            )
    if not isinstance(state["history"], list) or not all(isinstance(row, dict) for row in state["history"]):
        raise CheckpointError(f"{path} has a history that is not a list of mappings")
    return state


def verify_digests(folder: Path, state: dict[str, Any]) -> bool:
    """Check each file of :data:`SEALED` against the digest ``state.json`` records for it (read
    and checked by :func:`read_state`); False for a checkpoint that records none (written
    before checkpoints carried digests), True once every file matches.

    Raises:
        CheckpointError: a file is missing, or its bytes are not those it was written with.
    """
    recorded = state.get(DIGESTS)
    if recorded is None:
        return False
    for name in SEALED:
        path = folder / name
        try:
            found = file_sha256(path)
        except FileNotFoundError:
            raise CheckpointError(f"{path} is missing") from None
        except OSError as exc:
            raise CheckpointError(f"{path} cannot be read ({_reason(exc)})") from None
        if found != recorded[name]:
            raise _changed(path, recorded[name], found, f"{folder / 'state.json'} records for it")
    return True


def _changed(path: Path, recorded: str, found: str, where: str) -> CheckpointError:
    return CheckpointError(
        f"{path} does not match the SHA-256 digest {where} (recorded {recorded[:16]}..., "
        f"found {found[:16]}...): its bytes changed after the checkpoint was written (damaged on disk or in a copy)"
    )


def _is_bytes(value: Any, size: int | None) -> bool:
    return (
        isinstance(value, list)
        and (size is None or len(value) == size)
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255 for v in value)
    )


def read_json(path: str | os.PathLike, error: type[RunFolderError] = RunFolderError) -> Any:
    """The JSON value in ``path``: the one reader of the JSON files the run side writes (a
    checkpoint's ``state.json``, ``plugins.json``, a run's record and attempts, a comparison's
    measurements, a study's verdict), all read alike, as :func:`json.dumps` writes them.

    Raises:
        error: naming the file: it is missing, cannot be read, or is not JSON (a truncated
            write, bytes that are not UTF-8, a syntax error); its ``__cause__`` is the
            ``OSError`` or ``ValueError`` underneath.
    """
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise error(f"{path} is missing") from exc
    except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise error(f"{path} is not readable JSON ({_reason(exc)})") from exc


def _reason(exc: BaseException) -> str:
    """The exception's name and the first sentence of its message (torch's run to a paragraph)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0].split('. ')[0].rstrip('.')}" if text else type(exc).__name__


def check_weights(folder: Path, model: torch.nn.Module) -> None:
    """Check ``model.safetensors`` against ``model`` from its header, before reading any
    weight: readable, and every tensor one of the model's, of its shape. ``config.json`` must
    read too (the model itself is built from the run's config, not from it).

    Raises:
        CheckpointError: naming the file, and the tensor that does not fit.
    """
    read_json(folder / "config.json", CheckpointError)
    path = folder / "model.safetensors"
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    except Exception as exc:  # safetensors raises its own SafetensorError, and OSError
        raise CheckpointError(f"{path} is not a readable safetensors file ({_reason(exc)})") from None
    expected = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    unknown = sorted(set(shapes) - set(expected))
    if unknown:
        raise CheckpointMismatch(
            f"{path} holds tensors the model does not have: {', '.join(unknown[:5])}; it was written for another model"
        )
    for name, shape in shapes.items():
        if shape != expected[name]:
            raise CheckpointMismatch(
                f"{path} holds {name} of shape {list(shape)}, and the model's is "
                f"{list(expected[name])}; it was written for another model"
            )


def load_weights(folder: Path, model: torch.nn.Module, device: torch.device) -> None:
    """Read ``model.safetensors`` (checked by :func:`check_weights`) into ``model``.

    Raises:
        CheckpointError: it does not read, lacks weights, or holds non-finite ones.
    """
    path = folder / "model.safetensors"
    try:
        safetensors.torch.load_model(model, str(path), device=str(device))
    except Exception as exc:
        raise CheckpointError(f"{path} does not load into the model ({_reason(exc)})") from None
    bad = first_non_finite(model.state_dict().items())
    if bad is not None:
        raise CheckpointError(f"{path} holds non-finite values in {bad}")


def read_optimizers(
    folder: Path, phases: dict[str, list[torch.nn.Parameter]], step: int, device: torch.device | str
) -> dict[str, dict[str, dict]]:
    """``optimizer.pt``, checked against the model's phases (name: parameters, in order):
    ``{"optimizers": {phase: state}, "schedulers": {phase: state}}``. A file of the layout
    written before models had phases (one ``optimizer`` and ``scheduler``) is read as one phase.

    Raises:
        CheckpointError: unreadable; of other phases; a state that does not fit a parameter,
            is not finite, or a schedule at another step than ``state.json``.
    """
    path = folder / "optimizer.pt"
    try:
        states = torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    except Exception as exc:  # a zip reader's RuntimeError, EOFError, an unpickling error...
        raise CheckpointError(f"{path} is not a readable optimizer state ({_reason(exc)})") from None
    if isinstance(states, dict) and "optimizer" in states and len(phases) == 1:
        name = next(iter(phases))
        states = {"optimizers": {name: states["optimizer"]}, "schedulers": {name: states.get("scheduler")}}
    if not isinstance(states, dict) or not all(isinstance(states.get(k), dict) for k in ("optimizers", "schedulers")):
        raise CheckpointError(f"{path} is not a mapping of optimizers and schedulers by phase")
    saved = sorted(states["optimizers"])
    if saved != sorted(phases) or sorted(states["schedulers"]) != saved:
        raise CheckpointMismatch(
            f"the checkpoint in {folder} has optimizers for the phases {saved}, and the model trains "
            f"in {sorted(phases)}; it was written for another model"
        )
    for name, parameters in phases.items():
        _check_optimizer(path, name, states["optimizers"][name], parameters)
        _check_schedule(path, name, states["schedulers"][name], step)
    return states


def _check_optimizer(path: Path, phase: str, state: Any, parameters: list[torch.nn.Parameter]) -> None:
    groups = state.get("param_groups") if isinstance(state, dict) else None
    if (
        not isinstance(groups, list)
        or not isinstance(state.get("state"), dict)
        or not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)
    ):
        raise CheckpointError(f"{path}: phase {phase!r} is not an optimizer state (state and param_groups)")
    indices = [index for group in groups for index in group["params"]]
    if len(indices) != len(parameters):
        raise CheckpointMismatch(
            f"{path}: phase {phase!r} has state for {len(indices)} parameters, and the model's phase "
            f"has {len(parameters)}; it was written for another model"
        )
    position = {index: i for i, index in enumerate(indices)}
    for index, values in state["state"].items():
        if index not in position or not isinstance(values, dict):
            raise CheckpointError(f"{path}: phase {phase!r} has state for a parameter {index!r} it does not list")
        shape = tuple(parameters[position[index]].shape)
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and tuple(value.shape) != shape:
                raise CheckpointMismatch(
                    f"{path}: phase {phase!r} has {key} of shape {list(value.shape)} for a parameter "
                    f"of shape {list(shape)}; it was written for another model"
                )
    bad = first_non_finite(optimizer_tensors({phase: state}))
    if bad is not None:
        raise CheckpointError(f"{path} holds non-finite values in {bad}")


def _check_schedule(path: Path, phase: str, state: Any, step: int) -> None:
    if not isinstance(state, dict) or "lr_lambdas" not in state or not isinstance(state.get("last_epoch"), int):
        raise CheckpointError(f"{path}: phase {phase!r} has no learning-rate schedule state")
    if state["last_epoch"] != step:
        raise CheckpointError(
            f"{path}: phase {phase!r}'s schedule is at step {state['last_epoch']}, and state.json at "
            f"step {step}; the files are of different checkpoints"
        )


def read_plugins(run_dir: Path) -> dict[str, str] | None:
    """The run folder's :data:`PLUGINS` record; None when there is none (a run saved before it
    was kept) or it is unreadable (it only ever adds a hint to an error)."""
    try:
        record = read_json(run_dir / PLUGINS)
    except RunFolderError:
        return None
    return record if isinstance(record, dict) else None
