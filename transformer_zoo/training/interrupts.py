"""Ctrl-C during training: asking the loop to stop after the step under way, and the error that
says where a run stopped.

A run stops between steps, never inside one, so a step is either applied whole or not at all;
the trainer saves the step it reached and raises :class:`TrainingInterrupted`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped at Ctrl-C (SIGINT), after saving the step it had reached; the message
    says at which step, what is saved and how to resume. A ``KeyboardInterrupt``, so code that
    lets Ctrl-C through lets this through too.

    Attributes:
        step: the last step taken (None: interrupted before training began).
        saved: the step of the checkpoint in the run folder (None: there is none).
    """

    def __init__(self, message: str, step: int | None = None, saved: int | None = None) -> None:
        super().__init__(message)
        self.step, self.saved = step, saved

    def __reduce__(self) -> tuple:
        return type(self), (self.args[0], self.step, self.saved)


@contextlib.contextmanager
def stop_requests() -> Iterator[threading.Event]:
    """While inside, Ctrl-C (SIGINT) asks to stop: the event yielded is set, for the training
    loop to stop after the step under way (a step is never half applied); a second Ctrl-C
    raises ``KeyboardInterrupt`` at once. Only in the main thread, and only over Python's own
    handler: a handler set by the caller (or SIGINT ignored, as in compare's workers) stays."""
    requested = threading.Event()
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield requested
        return

    def ask_to_stop(signum: int, frame: Any) -> None:
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()

    previous = signal.signal(signal.SIGINT, ask_to_stop)
    try:
        yield requested
    finally:
        signal.signal(signal.SIGINT, previous)
