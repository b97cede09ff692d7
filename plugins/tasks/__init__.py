"""Built-in tasks: generated, seeded or read from local files; none downloads. One task per job."""

from __future__ import annotations

from transformer_zoo.registry import hookimpl

from .algorithmic import AdditionOptions, CopyOptions, ReverseOptions, SortOptions
from .chomsky import (
    BinaryAdditionOptions,
    CycleNavigationOptions,
    DuplicateStringOptions,
    EvenPairsOptions,
    ParityCheckOptions,
    ReverseStringOptions,
    StackManipulationOptions,
)
from .datasets import TextClassificationOptions
from .digits import DigitsOptions
from .digits_generation import DigitsGenerationOptions
from .language_modeling import LanguageModelingOptions
from .listops import ListOpsOptions
from .mad import (
    CompressionOptions,
    FuzzyRecallOptions,
    InContextRecallOptions,
    MADCompressionDecoderOptions,
    MemorizationOptions,
    NoisyRecallOptions,
    SelectiveCopyingOptions,
)
from .mqar import MQAROptions
from .pairs import FarPairOptions, NearPairOptions, OrderedPairOptions
from .pathfinder import PathfinderOptions
from .python_source import PythonSourceOptions
from .seq2seq import Seq2SeqOptions
from .text import TextMLMOptions


@hookimpl
def tzoo_tasks():
    return [
        CopyOptions,
        ReverseOptions,
        SortOptions,
        AdditionOptions,
        ListOpsOptions,
        PathfinderOptions,
        NearPairOptions,
        FarPairOptions,
        OrderedPairOptions,
        MQAROptions,
        InContextRecallOptions,
        FuzzyRecallOptions,
        NoisyRecallOptions,
        SelectiveCopyingOptions,
        CompressionOptions,
        MemorizationOptions,
        ParityCheckOptions,
        EvenPairsOptions,
        CycleNavigationOptions,
        ReverseStringOptions,
        StackManipulationOptions,
        DuplicateStringOptions,
        BinaryAdditionOptions,
        DigitsOptions,
        DigitsGenerationOptions,
        LanguageModelingOptions,
        PythonSourceOptions,
        TextMLMOptions,
        Seq2SeqOptions,
        TextClassificationOptions,
    ]


@hookimpl
def tzoo_components():
    return [MADCompressionDecoderOptions]
