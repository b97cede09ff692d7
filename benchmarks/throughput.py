"""Throughput of every registered variant at one common size, against ``transformer`` at that size.

Token models are built with ``d_model`` 256, 4 heads, ``d_ff`` 1024, 2 layers in each stack they
have and a vocabulary of 1000 (where the config has those fields), and read random batches of
``--batch`` x ``--length`` tokens; presets that differ only in size become the same model and
are measured once. Image models read 8x8 images (their tokens are pixels); the image encoders
take the common width, the convolutional ones keep their own. Reported: tokens per second of a
training step (forward, backward, AdamW; for a GAN, each phase with the other frozen, as training runs it)
and of inference, and the time of each against the ``transformer`` row (timed alternately).

    python -m benchmarks.throughput [--batch 8 --length 128 --repeats 5 --json PATH --device cuda --bf16]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

import transformer_zoo as tz
from transformer_zoo.training.step import trains_only

from .common import (
    add_device_options,
    autocast,
    bench_parser,
    device_name,
    device_of,
    paired_medians,
    precision,
    write_json,
)

COMMON = {"d_model": 256, "n_heads": 4, "d_ff": 1024, "vocab_size": 1000}


def common_config(name: str, length: int):
    """The variant at the common size, or as it is for a model without those fields."""
    config = tz.load_config(name)
    fields = type(config).model_fields
    overrides = {k: v for k, v in COMMON.items() if k in fields}
    if "head_dim" in fields:
        overrides["head_dim"] = None  # d_model / n_heads
    for stack in ("encoder", "decoder"):
        if getattr(config, stack, None) is not None and hasattr(getattr(config, stack), "layers"):
            overrides[stack] = {"layers": 2, "attention": whole_heads(getattr(config, stack).attention)}
    if "max_len" in fields:
        overrides["max_len"] = max(length, config.max_len)
    if "tgt_vocab_size" in fields and config.tgt_vocab_size is not None:
        overrides["tgt_vocab_size"] = COMMON["vocab_size"]
    return tz.load_config(config, overrides)


def whole_heads(attention):
    """A stack's attention kinds with grouped key/value heads made whole (n_kv_heads: null), so that
    the common size's heads divide them."""
    kinds = attention if isinstance(attention, list) else [attention]
    dumped = [{**kind.model_dump(mode="json"), "n_kv_heads": None} for kind in kinds]
    return dumped if isinstance(attention, list) else dumped[0]


def random_batch(model: torch.nn.Module, batch: int, length: int) -> tuple[dict[str, torch.Tensor], torch.Tensor, int]:
    """Seeded random inputs and targets for a model that reads tokens or images (not a GAN), on
    the model's device, and the tokens they hold: ``batch`` x ``length`` token ids (source and
    target of an encoder-decoder), or ``batch`` images (a token is a pixel)."""
    config = model.config
    generator = torch.Generator().manual_seed(0)
    if getattr(config, "inputs", "tokens") == "image":
        inputs = {"image": torch.rand(batch, config.channels, *config.image_size, generator=generator)}
        targets = torch.randint(config.num_classes, (batch,), generator=generator)
        tokens = inputs["image"][:, 0].numel()
    else:
        ids = torch.randint(4, COMMON["vocab_size"], (batch, length), generator=generator)
        inputs = {"src": ids, "tgt": ids} if model.architecture == "encoder-decoder" else {"src": ids}
        head = config.head
        if head.kind == "sequence-classification":
            targets = torch.randint(head.num_classes, (batch,), generator=generator)
        else:
            targets = torch.randint(4, config.output_vocab_size, (batch, length), generator=generator)
        tokens = sum(v.numel() for v in inputs.values())
    device = next(model.parameters()).device
    return {k: v.to(device) for k, v in inputs.items()}, targets.to(device), tokens


def workload(model: torch.nn.Module, batch: int, length: int, amp: Callable) -> tuple[Callable, Callable, int]:
    """A training step, an inference pass, and the tokens each reads (on the model's device); the
    training step's forward and loss run under ``amp()``."""
    config = model.config
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    if getattr(config, "objective", "") == "image-generation":
        images = torch.rand(batch, config.channels, *config.image_size, generator=generator).to(device)
        labels = torch.randint(config.num_classes, (batch,), generator=generator).to(device)
        phases = [(phase, torch.optim.AdamW(phase.parameters, lr=1e-6)) for phase in model.phases()]

        def train() -> None:
            for phase, phase_optimizer in phases:
                with trains_only(phase.parameters, model):
                    with amp():
                        loss = model.adversarial_loss(images, labels, phase.name)
                    loss.backward()
                phase_optimizer.step()
                phase_optimizer.zero_grad(set_to_none=True)

        return train, lambda: model(labels), images[:, 0].numel()
    inputs, targets, tokens = random_batch(model, batch, length)

    def train() -> None:
        with amp():
            loss = model.loss(model(**inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return train, lambda: model(**inputs), tokens


def build_parser() -> argparse.ArgumentParser:
    parser = bench_parser(__name__, __doc__)
    parser.add_argument("--batch", type=int, default=8, help="examples per batch")
    parser.add_argument("--length", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each side (the median is reported)")
    parser.add_argument("--variants", nargs="+", help="names to measure (default: every registered variant)")
    parser.add_argument("--json", metavar="PATH", help="also write the results to this JSON file")
    add_device_options(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    device = device_of(args)
    print(
        f"throughput on {device_name(device)}{' bf16' if args.bf16 else ''}, batch {args.batch}, "
        f"length {args.length}, {torch.get_num_threads()} threads"
    )

    torch.manual_seed(0)
    reference = tz.build_model(common_config("transformer-base", args.length)).to(device)
    amp = lambda: precision(args)  # noqa: E731
    ref_train, ref_infer, _ = workload(reference, args.batch, args.length, amp)
    ref_infer = autocast(args, ref_infer)
    rows, seen = [], {}
    for name in args.variants or tz.list_variants():
        config = common_config(name, args.length)
        key = config.model_dump_json(exclude={"variant", "max_len"})  # the longest position does not change the work
        if key in seen:
            print(f"{name:>30}: the same model as {seen[key]} at this size")
            continue
        seen[key] = name
        model = tz.build_model(config).to(device)
        train, infer, tokens = workload(model, args.batch, args.length, amp)
        infer = autocast(args, infer)
        row = {"variant": name, "parameters": sum(p.numel() for p in model.parameters()), "tokens": tokens}
        model.train(), reference.train()
        ours, ref = paired_medians(train, ref_train, args.repeats, warmup=1, device=device)
        row.update(train_tokens_per_s=tokens / ours, train_vs_transformer=ours / ref)
        model.eval(), reference.eval()
        with torch.no_grad():
            ours, ref = paired_medians(infer, ref_infer, args.repeats, warmup=1, device=device)
        row.update(inference_tokens_per_s=tokens / ours, inference_vs_transformer=ours / ref)
        rows.append(row)
        print(
            f"{name:>30}: {row['parameters']:>11,} params  train {row['train_tokens_per_s']:>9,.0f} tok/s "
            f"({row['train_vs_transformer']:.2f}x transformer's time)  inference {row['inference_tokens_per_s']:>9,.0f} "
            f"tok/s ({row['inference_vs_transformer']:.2f}x)",
            flush=True,
        )
    if args.json:
        write_json(args.json, {"args": vars(args), "common": COMMON, "rows": rows}, device)


if __name__ == "__main__":
    main()
