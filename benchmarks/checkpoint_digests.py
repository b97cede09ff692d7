"""What verifying a checkpoint costs: the SHA-256 digests a resume checks before it reads a
checkpoint (``model.safetensors``, ``config.json`` and ``optimizer.pt`` hashed, and
``state.json``'s own), against reading the same checkpoint (the weights into the model and the
optimizer states), timed alternately on one checkpoint of a model with its AdamW states.

Writing is measured the same way: the digests a checkpoint records (hashing the files just
written) against writing the whole checkpoint (which includes them). Both sides read a file the machine has just written, so they read
it from memory, as a resume right after a save does; from a cold disk reading costs more and
hashing the same.

    python -m benchmarks.checkpoint_digests [--variant bert-base --repeats 5]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

import transformer_zoo as tz
from transformer_zoo.training.run_folder import (
    SEALED,
    load_weights,
    read_state,
    seal,
    verify_digests,
    write_checkpoint,
)

from .common import bench_parser, paired_medians, write_json


def build_parser() -> argparse.ArgumentParser:
    parser = bench_parser(__name__, __doc__)
    parser.add_argument("--variant", default="bert-base", help="the model whose checkpoint is measured")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each side (the median is reported)")
    parser.add_argument("--json", type=str, default=None, metavar="PATH", help="also write the results as JSON")
    return parser


def training_state(variant: str) -> tuple[torch.nn.Module, dict, dict, dict]:
    """A model of ``variant`` and what a checkpoint of it holds: AdamW's states (both moments of
    every parameter), the schedule's, and ``state.json``'s."""
    torch.manual_seed(0)
    model = tz.build_model(variant)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, 1e-3)
    optimizer.step()
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    state = {"step": 0, "rng": torch.get_rng_state().tolist(), "history": []}
    return model, {"model": optimizer.state_dict()}, {"model": schedule.state_dict()}, state


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    model, optimizers, schedulers, plain = training_state(args.variant)
    with tempfile.TemporaryDirectory() as root:
        write_checkpoint(Path(root), model, optimizers, schedulers, plain)
        folder = Path(root) / "checkpoint"
        nbytes = sum((folder / name).stat().st_size for name in SEALED)

        def verify() -> None:
            assert verify_digests(folder, read_state(folder))

        def read() -> None:
            load_weights(folder, model, torch.device("cpu"))
            torch.load(folder / "optimizer.pt", weights_only=True)

        verify_s, read_s = paired_medians(verify, read, args.repeats, warmup=1)
        seal_s, write_s = paired_medians(
            lambda: seal(plain, folder),
            lambda: write_checkpoint(Path(root), model, optimizers, schedulers, plain),
            max(1, args.repeats // 2),
            warmup=0,
        )
    print(f"checkpoint of {args.variant}: {nbytes / 1e6:.0f} MB in {', '.join(SEALED)}")
    print(f"{'':>28} {'seconds':>8} {'GB/s':>6} {'/ reference':>12}")
    print(f"{'verify the digests':>28} {verify_s:8.3f} {nbytes / verify_s / 1e9:6.2f} {verify_s / read_s:11.2f}x")
    print(f"{'read the checkpoint (ref.)':>28} {read_s:8.3f} {nbytes / read_s / 1e9:6.2f} {1:11.2f}x")
    print(f"{'record the digests':>28} {seal_s:8.3f} {nbytes / seal_s / 1e9:6.2f} {seal_s / write_s:11.2f}x")
    print(f"{'write it, digests too (ref.)':>28} {write_s:8.3f} {nbytes / write_s / 1e9:6.2f} {1:11.2f}x")
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "checkpoint-digests",
                "args": vars(args),
                "bytes": nbytes,
                "verify_seconds": verify_s,
                "read_seconds": read_s,
                "verify_over_read": verify_s / read_s,
                "seal_seconds": seal_s,
                "write_seconds": write_s,
                "seal_over_write": seal_s / write_s,
            },
        )


if __name__ == "__main__":
    main()
