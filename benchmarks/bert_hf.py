"""The ``bert`` encoder against Hugging Face ``transformers``' BertModel with
``attn_implementation="sdpa"``, on the same config and the same weights.

A randomly initialised BertModel is saved and read back by ``transformer_zoo.from_pretrained``,
so both hold the same weights (the hidden states are checked equal to 1e-4). Timed alternately,
in one process: inference (the encoder and the pooler, under ``no_grad``) and a training step
(forward, backward of the mean square of the hidden states, AdamW). Inputs: ``--batch`` rows
of ``--length`` tokens, a quarter of the rows padded to half length, two segments.

Configs: ``minilm`` (6 layers, 384 wide, 12 heads, FFN 1536) and ``base`` (12, 768, 12, 3072).

    python -m benchmarks.bert_hf [--configs minilm base --batch 8 --length 128 --repeats 10 --json PATH --device cuda --bf16]
"""

from __future__ import annotations

import argparse
import tempfile
import warnings

import torch
import transformers

import transformer_zoo as tz

from .common import add_device_options, autocast, bench_parser, device_name, device_of, paired_medians, write_json

CONFIGS = {
    "minilm": {"num_hidden_layers": 6, "hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536},
    "base": {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072},
}


def pair(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Hugging Face's BertModel (sdpa) and ours, with the same weights."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        **CONFIGS[name], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="sdpa"
    )
    reference = transformers.BertModel(config)
    if reference.config._attn_implementation != "sdpa":
        raise SystemExit(f"transformers chose {reference.config._attn_implementation!r} attention, not sdpa")
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ours says that it has no head weights: the encoder is what is timed
        reference.save_pretrained(folder)
        ours = tz.from_pretrained(folder)
    return reference, ours


def inputs(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (args.batch, args.length), generator=generator)
    mask = torch.ones_like(ids)
    mask[: max(1, args.batch // 4), args.length // 2 :] = 0
    types = torch.zeros_like(ids)
    types[:, args.length // 2 :] = 1
    return ids, mask, types


def measure(name: str, args: argparse.Namespace) -> list[dict]:
    device = device_of(args)
    reference, ours = (model.to(device) for model in pair(name))
    ids, mask, types = (tensor.to(device) for tensor in inputs(args))

    def run_reference() -> torch.Tensor:
        return reference(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state

    def run_ours() -> torch.Tensor:
        hidden = ours.encode(ids, mask, types)
        ours.pool(hidden)  # BertModel computes its pooler output too
        return hidden

    for model in (reference, ours):
        model.eval()
    with torch.no_grad():  # in float32: the same model before it is timed
        real = mask.bool()
        gap = (run_ours()[real] - run_reference()[real]).abs().max().item()
    if gap > 1e-4:
        raise SystemExit(f"{name}: the two encoders disagree by {gap:.2e}; the timing would compare different models")
    rows = []
    run_ours, run_reference = autocast(args, run_ours), autocast(args, run_reference)
    with torch.no_grad():
        ours_s, ref_s = paired_medians(run_ours, run_reference, args.repeats, device=device)
    rows.append(
        {
            "config": name,
            "mode": "inference",
            "ours_ms": 1e3 * ours_s,
            "reference_ms": 1e3 * ref_s,
            "ratio": ours_s / ref_s,
        }
    )
    optimizers = {id(m): torch.optim.AdamW(m.parameters(), lr=1e-6) for m in (reference, ours)}

    def step(model, forward) -> None:
        loss = forward().pow(2).mean()
        loss.backward()
        optimizers[id(model)].step()
        optimizers[id(model)].zero_grad(set_to_none=True)

    for model in (reference, ours):
        model.train()  # dropout is 0 in both: the same arithmetic as inference, with gradients
    ours_s, ref_s = paired_medians(
        lambda: step(ours, run_ours), lambda: step(reference, run_reference), args.repeats, device=device
    )
    rows.append(
        {
            "config": name,
            "mode": "training step",
            "ours_ms": 1e3 * ours_s,
            "reference_ms": 1e3 * ref_s,
            "ratio": ours_s / ref_s,
        }
    )
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = bench_parser(__name__, __doc__)
    parser.add_argument(
        "--configs", nargs="+", choices=sorted(CONFIGS), default=["minilm", "base"], help="BERT sizes to measure"
    )
    parser.add_argument("--batch", type=int, default=8, help="examples per batch")
    parser.add_argument("--length", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs of each side (the median is reported)")
    parser.add_argument("--json", help="also write the results to this file")
    add_device_options(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    rows = [row for name in args.configs for row in measure(name, args)]
    print(
        f"bert against transformers {transformers.__version__} BertModel (sdpa), batch {args.batch}, "
        f"length {args.length}, {device_name(device_of(args))}{' bf16' if args.bf16 else ''}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    print(f"{'config':>8} {'mode':>14} {'ours ms':>9} {'HF ms':>9} {'ratio':>6}")
    for r in rows:
        print(f"{r['config']:>8} {r['mode']:>14} {r['ours_ms']:9.1f} {r['reference_ms']:9.1f} {r['ratio']:6.2f}")
    if args.json:
        write_json(
            args.json, {"args": vars(args), "transformers": transformers.__version__, "rows": rows}, device_of(args)
        )


if __name__ == "__main__":
    main()
