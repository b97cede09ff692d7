"""Benchmarks: each measures ours against a named reference in one process (timed alternately,
so that both see the same machine load), prints a table, and with ``--json PATH`` writes its
results with the machine they were measured on.

``tzoo bench NAME [ARGS]`` runs one from a checkout (an editable install, or the checkout as the
working folder); ``python -m benchmarks NAME [ARGS]`` in the checkout's root is the same. The
benchmarks and the robustness audit are not part of the wheel: they measure the package, and a
user of it never imports them.
docs/benchmarks.md holds the latest figures and the commands that produced them.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple


class Benchmark(NamedTuple):
    module: str  # in this package
    measures: str  # what against what
    takes: str  # how long it runs with its defaults on a 2-core CPU (no GPU)


BENCHMARKS: dict[str, Benchmark] = {
    "transformer": Benchmark(
        "transformer_step", "training step and inference of transformer against torch.nn.Transformer", "about 40 s"
    ),
    "bert": Benchmark(
        "bert_hf", "bert against transformers' BertModel (sdpa), same weights (needs transformers)", "about 3 min"
    ),
    "decoding": Benchmark("decoding", "greedy decoding with the key/value cache against without", "about 1.5 min"),
    "kv-heads": Benchmark(
        "kv_heads",
        "grouped-query and multi-query attention against multi-head: cache bytes and decoding time",
        "about 1 min",
    ),
    "cache-bytes": Benchmark(
        "cache_bytes",
        "the key/value cache's bytes per token and layer: multi-head, grouped-query and latent attention (MLA)",
        "about 10 s",
    ),
    "window-cache": Benchmark(
        "window_cache",
        "a sliding-window layer's cache, its window only, against the full cache: bytes and decoding time",
        "about 1 min",
    ),
    "attention-kernels": Benchmark(
        "local_attention",
        "math, SDPA, FlexAttention and the sparse kernels, time and memory by length",
        "about 3.5 min",
    ),
    "throughput": Benchmark(
        "throughput", "training and inference throughput of every registered variant at one size", "about 1 min"
    ),
    "ut-act": Benchmark("ut_act", "Universal Transformer with ACT against a fixed number of steps", "about 1.5 min"),
    "sagan-gan": Benchmark(
        "sagan_gan", "sagan-gan against the same GAN without attention, on digits-generation", "about 11 min"
    ),
    "mfu": Benchmark(  # base-sized models at batch 64: a GPU's benchmark
        "mfu", "model FLOPs utilisation of a compiled bf16 training step, against the device's peak", "over 15 min"
    ),
    "contention": Benchmark(
        "contention", "a training run alone and beside a CPU-bound process, by thread count", "about 1 min"
    ),
    "dense-threshold": Benchmark(
        "dense_threshold", "a sparse pattern's own kernel against dense SDPA under its mask, by length", "about 10 s"
    ),
    "checkpoint-digests": Benchmark(
        "checkpoint_digests",
        "verifying a checkpoint's SHA-256 digests against reading it, and recording them against writing it",
        "about 1 min",
    ),
    "robustness": Benchmark(
        "robustness", "bad configs, inputs, checkpoints, folders and plugins, and how each attempt ended", "about 7 min"
    ),
    "executors": Benchmark(
        "executors",
        "the default comparison under Ray against the local executor: wall time, overhead per run",
        "about 20 min",
    ),
    "node-loss": Benchmark(
        "node_loss",
        "a Ray node lost mid-comparison against the same comparison undisturbed: restart time, wall time",
        "about 3 min",
    ),
    "startup": Benchmark(
        "startup",
        "tzoo --version, --help, list and schema, each in a fresh process, against import torch",
        "about 1.5 min",
    ),
}


def run(name: str, argv: list[str]) -> None:
    """Run benchmark ``name`` with command-line arguments ``argv``."""
    if name not in BENCHMARKS:
        raise ValueError(f"no benchmark {name!r}; benchmarks: {', '.join(BENCHMARKS)}")
    try:
        module = importlib.import_module(f"{__name__}.{BENCHMARKS[name].module}")
    except ImportError as exc:
        raise ValueError(
            f"benchmark {name!r} needs {exc.name}, which is not installed: pip install {exc.name}"
        ) from None
    module.main(argv)
