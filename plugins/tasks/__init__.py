"""Built-in tasks: generated, seeded and local; none downloads."""

from __future__ import annotations

from transformer_zoo.registry import hookimpl

from .algorithmic import Addition, Copy, Reverse, Sort
from .digits import Digits
from .listops import ListOps


@hookimpl
def tzoo_tasks():
    return [Copy, Reverse, Sort, Addition, ListOps, Digits]
