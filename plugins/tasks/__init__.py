"""Built-in tasks: generated, seeded or read from local files; none downloads."""

from __future__ import annotations

from transformer_zoo.registry import hookimpl

from .algorithmic import Addition, Copy, Reverse, Sort
from .datasets import LanguageModeling, Seq2Seq, TextClassification
from .digits import Digits
from .digits_generation import DigitsGeneration
from .listops import ListOps
from .pairs import FarPair, NearPair, OrderedPair
from .text import TextLM, TextMLM
from .translation import Translation


@hookimpl
def tzoo_tasks():
    return [Copy, Reverse, Sort, Addition, ListOps, NearPair, FarPair, OrderedPair, Digits, DigitsGeneration, TextLM,
            TextMLM, Translation, TextClassification, Seq2Seq, LanguageModeling]
