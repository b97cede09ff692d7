"""Built-in tasks: generated, seeded or read from local files; none downloads. One task per job."""

from __future__ import annotations

from transformer_zoo.registry import hookimpl

from .algorithmic import Addition, Copy, Reverse, Sort
from .datasets import TextClassification
from .digits import Digits
from .digits_generation import DigitsGeneration
from .language_modeling import LanguageModeling
from .listops import ListOps
from .pairs import FarPair, NearPair, OrderedPair
from .pathfinder import Pathfinder
from .seq2seq import Seq2Seq
from .text import TextMLM


@hookimpl
def tzoo_tasks():
    return [
        Copy,
        Reverse,
        Sort,
        Addition,
        ListOps,
        Pathfinder,
        NearPair,
        FarPair,
        OrderedPair,
        Digits,
        DigitsGeneration,
        LanguageModeling,
        TextMLM,
        Seq2Seq,
        TextClassification,
    ]
