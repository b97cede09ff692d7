"""A sliding-window layer's cache, which keeps its window only, against the full cache, which
keeps every key: the decoder cache's bytes and greedy decoding's time of a Gemma-2-like model
(gemma2-tiny's design, its sliding-window and global layers in turn) decoding to ``--times``
times the window.

Both sides decode the same prompts with the same weights, step by step on
:class:`~transformer_zoo.core.decoding.DecodeStep`: ours on :func:`~transformer_zoo.core.decoding.make_cache`
(each sliding-window layer's cache a ``WindowKVCache``), the reference on a plain
``DecoderCache`` (every layer keeps every key, as before); the tokens are checked equal. The
bytes (``DecoderCache.nbytes``: keys and values of every layer) are read at each multiple of the
window, so they do not depend on the machine; the times are paired, in one process.

    tzoo bench window-cache [--window 256 --times 4 --layers 2 --batch 4 --prompt 16 --repeats 3
                             --device cuda --bf16]
"""

from __future__ import annotations

import argparse

import torch

import transformer_zoo as tz
from transformer_zoo.core.cache import DecoderCache
from transformer_zoo.core.decoding import DecodeStep, make_cache
from transformer_zoo.plugins.decoder_lm import GEMMA2_TINY_ATTENTION

from .common import add_device_options, autocast, bench_parser, device_name, device_of, paired_medians, write_json


def build_parser() -> argparse.ArgumentParser:
    parser = bench_parser(__name__, __doc__)
    parser.add_argument("--window", type=int, default=256, help="keys a sliding-window query sees before its own")
    parser.add_argument("--times", type=int, default=4, help="decode to this many times the window, in tokens")
    parser.add_argument("--layers", type=int, default=2, help="layers: sliding-window and global in turn")
    parser.add_argument("--batch", type=int, default=4, help="prompts decoded together")
    parser.add_argument("--prompt", type=int, default=16, help="tokens per prompt")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each side (the median is reported)")
    parser.add_argument("--json", help="also write the results to this file")
    add_device_options(parser)
    return parser


def gemma2_like(window: int, layers: int, max_len: int) -> torch.nn.Module:
    """gemma2-tiny with ``layers`` layers and a sliding window of ``window`` keys before each query."""
    torch.manual_seed(0)
    attention = [{**GEMMA2_TINY_ATTENTION, "kind": "sliding-window", "window": window}, GEMMA2_TINY_ATTENTION]
    return tz.build_model("gemma2-tiny", max_len=max_len, decoder={"layers": layers, "attention": attention})


def decode(model: torch.nn.Module, prompt: torch.Tensor, length: int, cache: DecoderCache, marks: set[int]):
    """Greedy tokens until the cache has seen ``length``, and its bytes when it has seen each of ``marks``."""
    step = DecodeStep(model, None, None, cache)
    tokens, step_input, nbytes = prompt, prompt, {}
    while cache.offset < length:
        step_input = step(step_input)[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, step_input], dim=1)
        if cache.offset in marks:
            nbytes[cache.offset] = cache.nbytes
    return tokens, nbytes


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    device = device_of(args)
    length = args.times * args.window
    if not 0 < args.prompt < args.window:
        raise SystemExit(f"--prompt {args.prompt} must be between 1 and the window ({args.window})")
    model = gemma2_like(args.window, args.layers, max_len=length + 1).to(device).eval()
    prompt = torch.randint(3, 1000, (args.batch, args.prompt), generator=torch.Generator().manual_seed(0)).to(device)
    marks = {args.window * t for t in range(1, args.times + 1)}

    def side(windowed: bool):
        def run():
            with torch.no_grad():
                cache = make_cache(model) if windowed else DecoderCache()
                return decode(model, prompt, length, cache, marks)

        return autocast(args, run)

    (ours_tokens, ours_bytes), (ref_tokens, ref_bytes) = side(True)(), side(False)()
    if not torch.equal(ours_tokens, ref_tokens):
        raise SystemExit("the window cache decoded other tokens than the full cache")
    ours_s, ref_s = paired_medians(side(True), side(False), args.repeats, warmup=1, device=device)
    rows = [{"tokens": n, "window_cache_bytes": ours_bytes[n], "full_cache_bytes": ref_bytes[n]} for n in sorted(marks)]
    print(
        f"gemma2-tiny's design, window {args.window} keys before each query, {args.layers} layers (sliding-window "
        f"and global in turn), batch {args.batch}, a {args.prompt}-token prompt decoded to {length} tokens, "
        f"{device_name(device)}{' bf16' if args.bf16 else ''}, {torch.get_num_threads()} threads; "
        "reference: the full cache"
    )
    print(f"  {'tokens':>7} {'window cache MB':>16} {'full cache MB':>14} {'x ref':>6}")
    for row in rows:
        ours, ref = row["window_cache_bytes"], row["full_cache_bytes"]
        print(f"  {row['tokens']:>7} {ours / 2**20:>16.3f} {ref / 2**20:>14.3f} {ours / ref:>6.3f}")
    print(f"  decoding: {ours_s:.3f} s against {ref_s:.3f} s, x ref {ours_s / ref_s:.2f} (same run)")
    if args.json:
        write_json(
            args.json, {"args": vars(args), "rows": rows, "decode_s": ours_s, "reference_decode_s": ref_s}, device
        )


if __name__ == "__main__":
    main()
