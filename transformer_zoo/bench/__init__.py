"""Benchmarks: each measures ours against a named reference in one process (timed alternately,
so that both see the same machine load), prints a table, and with ``--json PATH`` writes its
results with the machine they were measured on.

``tzoo bench NAME [ARGS]`` runs one; ``python benchmarks/MODULE.py [ARGS]`` is the same code.
docs/benchmarks.md holds the latest figures and the commands that produced them.
"""

from __future__ import annotations

import importlib

BENCHMARKS: dict[str, tuple[str, str]] = {
    "transformer": ("transformer_step", "training step and inference of transformer against torch.nn.Transformer"),
    "bert": ("bert_hf", "bert against transformers' BertModel (sdpa), same weights (needs transformers)"),
    "decoding": ("decoding", "greedy decoding with the key/value cache against without"),
    "attention-kernels": ("local_attention", "math, SDPA, FlexAttention and the sparse kernels, time and memory by length"),
    "throughput": ("throughput", "training and inference throughput of every registered variant at one size"),
    "ut-act": ("ut_act", "Universal Transformer with ACT against a fixed number of steps"),
    "sagan-gan": ("sagan_gan", "sagan-gan against the same GAN without attention, on digits-generation"),
    "mfu": ("mfu", "model FLOPs utilisation of a compiled bf16 training step, against the device's peak"),
    "contention": ("contention", "a training run alone and beside a CPU-bound process, by thread count"),
    "dense-threshold": ("dense_threshold", "a sparse pattern's own kernel against dense SDPA under its mask, by length"),
    "robustness": ("robustness", "bad configs, inputs, checkpoints, folders and plugins, and how each attempt ended"),
    "startup": ("startup", "tzoo --version, --help, list and schema, each in a fresh process, against import torch"),
}


def run(name: str, argv: list[str]) -> None:
    """Run benchmark ``name`` with command-line arguments ``argv``."""
    if name not in BENCHMARKS:
        raise ValueError(f"no benchmark {name!r}; benchmarks: {', '.join(BENCHMARKS)}")
    try:
        module = importlib.import_module(f"{__name__}.{BENCHMARKS[name][0]}")
    except ImportError as exc:
        raise ValueError(f"benchmark {name!r} needs {exc.name}, which is not installed: pip install {exc.name}") from None
    module.main(argv)
