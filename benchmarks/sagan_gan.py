"""What SAGAN's attention blocks buy: ``sagan-gan`` against the same GAN with the attention
blocks removed (generator and discriminator), on ``digits-generation``.

Both train with the same seeds, batches and budget: the paper's recipe (hinge loss, spectral
norm, Adam with betas (0, 0.9), discriminator lr 4e-4 and generator lr 1e-4, one step each in
turn) and a constant schedule. Each is scored by the task's fixed digits classifier: the
accuracy on class-conditional samples, and the Frechet distance in its feature space (lower is
better), on one sample per test image. Real training images, scored the same way, give the floor.

    python -m benchmarks.sagan_gan [--steps 3000 --seeds 0 1 --batch 64 --json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from transformer_zoo.plugins.tasks.digits_generation import DigitsGenerationOptions
from transformer_zoo.training.config import TrainConfig
from transformer_zoo.training.trainer import train

from .common import bench_parser, write_json

MODELS = {
    "with attention": {"variant": "sagan-gan"},
    "without attention": {"variant": "sagan-gan", "generator_attention": [], "discriminator_attention": []},
}


def run(model: dict, seed: int, args: argparse.Namespace) -> dict:
    config = TrainConfig(
        model=model,
        task={"kind": "digits-generation"},
        steps=args.steps,
        batch_size=args.batch,
        lr=4e-4,
        warmup_steps=0,
        schedule="constant",
        grad_clip=None,
        seed=seed,
    )
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        summary = train(config, folder, resume=False, progress=False)
    return {
        "seed": seed,
        "seconds": time.perf_counter() - started,
        "parameters": summary["parameters"],
        **summary["metrics"]["test"],
    }


def build_parser() -> argparse.ArgumentParser:
    parser = bench_parser(__name__, __doc__)
    parser.add_argument("--steps", type=int, default=3000, help="training steps of each run")
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1], help="seeds: each trains the GAN with attention and without"
    )
    parser.add_argument("--batch", type=int, default=64, help="examples per batch")
    parser.add_argument("--json", help="also write the results to this file")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    results = {"args": vars(args), "real": DigitsGenerationOptions().build().baselines("test"), "models": {}}
    for name, model in MODELS.items():
        results["models"][name] = [run(model, seed, args) for seed in args.seeds]
    print(f"sagan-gan on digits-generation, {args.steps} steps, batch {args.batch}, seeds {args.seeds}")
    print(f"{'':>18} {'params':>8} {'accuracy':>18} {'Frechet distance':>18} {'seconds':>8}")
    for name, rows in results["models"].items():

        def cell(key: str, rows: list = rows) -> str:
            values = [r[key] for r in rows]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            return f"{statistics.mean(values):.3f} ± {spread:.3f}"

        print(
            f"{name:>18} {rows[0]['parameters']:>8,} {cell('classifier_accuracy'):>18} "
            f"{cell('frechet_distance'):>18} {statistics.mean(r['seconds'] for r in rows):>8.0f}"
        )
    real = results["real"]
    print(f"{'real images':>18} {'':>8} {real['classifier_accuracy']:>18.3f} {real['frechet_distance']:>18.3f}")
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
