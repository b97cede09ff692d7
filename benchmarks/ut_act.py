"""What adaptive computation time costs: a Universal Transformer with ACT against the same
model without it, at the same most steps T.

Two settings are timed, each paired with the model without ACT (exactly T steps):
``act-all-steps`` (the halting units never halt early: the pure overhead of ACT's book-keeping)
and ``act-at-init`` (fresh halting units, whose bias of 1.0 halts most positions after a few
steps, so the loop ends early). Reported: the
ratio of median times (ACT / no ACT; below 1.0 means ACT is faster) for a training step
(forward, backward, AdamW) and for inference, and the mean ponder time.

    python -m benchmarks.ut_act [--d-model 256 --heads 4 --steps 6 --batch 16 --length 64 --repeats 20]
"""

from __future__ import annotations

import argparse

import torch

import transformer_zoo as tz

from .common import bench_parser, paired_medians, write_json


def models(args: argparse.Namespace, halting_bias: float) -> tuple[torch.nn.Module, torch.nn.Module]:
    def build(act: bool) -> torch.nn.Module:
        torch.manual_seed(0)
        stack = {"kind": "recurrent", "layers": args.steps, "act": act, "halting_bias": halting_bias}
        return tz.build_model(
            "universal-transformer",
            vocab_size=1000,
            d_model=args.d_model,
            n_heads=args.heads,
            d_ff=4 * args.d_model,
            encoder=stack,
            decoder=stack,
        )

    return build(True), build(False)


def measure(act_model, plain, args, setting: str) -> list[dict]:
    src = torch.randint(3, 1000, (args.batch, args.length))
    tgt = torch.randint(3, 1000, (args.batch, args.length))
    targets = torch.randint(3, 1000, (args.batch, args.length))
    rows = []
    for mode in ("training step", "inference"):

        def run(model, optimizer=None):
            if optimizer is None:
                with torch.no_grad():
                    return model(src, tgt)
            out = model(src, tgt)
            model.loss(out, targets).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return out

        optimizers = {}
        for model in (act_model, plain):
            model.train(mode == "training step")
            optimizers[id(model)] = torch.optim.AdamW(model.parameters(), lr=1e-5) if mode == "training step" else None
        act_optimizer, plain_optimizer = optimizers[id(act_model)], optimizers[id(plain)]
        ours, reference = paired_medians(
            lambda o=act_optimizer: run(act_model, o), lambda o=plain_optimizer: run(plain, o), args.repeats
        )
        with torch.no_grad():
            act_model.eval()
            out = act_model(src, tgt)
        ponder = {k: round(float(v.mean()), 2) for k, v in out.extras.items() if k.endswith("ponder_time")}
        rows.append(
            {
                "setting": setting,
                "mode": mode,
                "act_ms": 1e3 * ours,
                "no_act_ms": 1e3 * reference,
                "ratio": ours / reference,
                **ponder,
            }
        )
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = bench_parser(__name__, __doc__)
    parser.add_argument("--d-model", type=int, default=256, help="model width")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument(
        "--steps",
        type=int,
        default=6,
        help="the Universal Transformer's most steps (the fixed-step model runs all of them)",
    )
    parser.add_argument("--batch", type=int, default=16, help="examples per batch")
    parser.add_argument("--length", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs of each side (the median is reported)")
    parser.add_argument("--json", metavar="PATH", help="also write the results to this JSON file")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    rows = measure(*models(args, halting_bias=-30.0), args, "act-all-steps")
    rows += measure(*models(args, halting_bias=1.0), args, "act-at-init")
    print(
        f"Universal Transformer d={args.d_model} heads={args.heads} T={args.steps} batch={args.batch} "
        f"length={args.length}, {torch.get_num_threads()} threads"
    )
    for r in rows:
        ponder = ", ".join(f"{k} {v}" for k, v in r.items() if k.endswith("ponder_time"))
        print(
            f"{r['setting']:>14} {r['mode']:>14}: ACT {r['act_ms']:8.1f} ms  no ACT {r['no_act_ms']:8.1f} ms  "
            f"ratio {r['ratio']:.2f}  ({ponder})"
        )
    if args.json:
        write_json(args.json, {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
