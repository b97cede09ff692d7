"""The key/value cache's bytes per token and layer of multi-head, grouped-query and multi-head
latent attention (MLA: DeepSeek-AI 2024, "DeepSeek-V2", arXiv 2405.04434, section 2.1), measured
on decoding models, and counted for a DeepSeek-V2-like width by the paper's Table 1.

Every measured model is llama-tiny (d_model 64, 4 heads of 16, float32) with ``--layers`` layers,
its self-attention the only difference: multi-head (the reference), grouped-query with 2 and 1
key/value heads (llama-tiny's own is 2), MLA in the paper's proportions of the head width
``d_h`` (latent ``d_c = 4 d_h``, rotary part ``d_h^R = d_h / 2``: rotary ``fraction`` 0.5), and
MLA at llama-tiny's parameter count (``MLA_EQUAL_PARAMETERS``). Each decodes ``--new-tokens``
tokens greedily after a prompt of ``--prompt``, step by step on a ``DecoderCache``, whose
``nbytes`` (keys, values and state of every layer) is then divided by the batch, the tokens and
the layers; the figure is checked against the formula of its row. The bytes do not depend on
the machine, and nothing is timed.

The analytic table counts, per token and layer, the numbers each kind caches at DeepSeek-V2's
width (d_model 5120, 128 heads of 128, ``d_c = 512``, ``d_h^R = 64``; the paper's Table 1:
multi-head ``2 n_h d_h``, grouped-query ``2 n_g d_h``, MLA ``d_c + d_h^R``), and their bytes over
the model's 60 layers in bfloat16.

    tzoo bench cache-bytes [--new-tokens 64 --prompt 8 --batch 4 --layers 2 --json cache-bytes.json]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

import transformer_zoo as tz
from transformer_zoo.core.cache import DecoderCache
from transformer_zoo.core.decoding import DecodeStep

from .common import bench_parser, write_json

D_MODEL, HEADS, D_HEAD = 64, 4, 16  # llama-tiny's
MLA_PAPER = {"kind": "mla", "bias": False}
"""MLA's defaults: nope and value heads d_h, latent 4 d_h; with rotary fraction 0.5, d_h^R = d_h / 2."""
MLA_EQUAL_PARAMETERS = {"kind": "mla", "bias": False, "kv_rank": 24, "nope_head_dim": 8, "v_head_dim": 16}
"""With ``head_dim: 8`` (the rotary turns 8 channels): 202,608 parameters against llama-tiny's 202,048."""
V2 = dict(d_model=5120, n_heads=128, d_head=128, kv_rank=512, rope=64, layers=60)
"""DeepSeek-V2's attention widths (arXiv 2405.04434, section 3.1.2) and its 60 layers."""


def build_parser() -> argparse.ArgumentParser:
    parser = bench_parser(__name__, __doc__)
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens each prompt decodes to")
    parser.add_argument("--prompt", type=int, default=8, help="tokens per prompt")
    parser.add_argument("--batch", type=int, default=4, help="prompts decoded together")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers")
    parser.add_argument("--json", help="also write the results to this file")
    return parser


def measured_models(layers: int) -> list[tuple[str, dict[str, Any], int]]:
    """(name, llama-tiny overrides, numbers cached per token and layer by the kind's formula)."""

    def attention(options: dict[str, Any], **overrides: Any) -> dict[str, Any]:
        # an sdpa mapping merges into llama-tiny's (n_kv_heads 2), so each gives n_kv_heads; mla replaces it
        return {"decoder": {"layers": layers, "attention": options}, **overrides}

    halves = {"kind": "rotary", "layout": "halves"}
    return [
        ("multi-head", attention({"kind": "sdpa", "bias": False, "n_kv_heads": None}), 2 * HEADS * D_HEAD),
        ("grouped-query, 2 kv heads", attention({"kind": "sdpa", "bias": False, "n_kv_heads": 2}), 2 * 2 * D_HEAD),
        ("multi-query, 1 kv head", attention({"kind": "sdpa", "bias": False, "n_kv_heads": 1}), 2 * 1 * D_HEAD),
        (
            "MLA, d_c 64, d_h^R 8",
            attention(MLA_PAPER, positional={**halves, "fraction": 0.5}),
            4 * D_HEAD + D_HEAD // 2,
        ),
        ("MLA, d_c 24, d_h^R 8 (equal parameters)", attention(MLA_EQUAL_PARAMETERS, head_dim=8), 24 + 8),
    ]


def bytes_per_token_and_layer(model: torch.nn.Module, args: argparse.Namespace) -> float:
    """The decoder cache's bytes once ``--prompt + --new-tokens`` tokens are in it, per token, row and layer."""
    cache = DecoderCache()
    step = DecodeStep(model, None, None, cache)
    prompt = torch.randint(3, 1000, (args.batch, args.prompt), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        tokens = step(prompt)[:, -1].argmax(-1, keepdim=True)
        for _ in range(args.new_tokens - 1):
            tokens = step(tokens)[:, -1].argmax(-1, keepdim=True)
    return cache.nbytes / (args.batch * cache.offset * args.layers)


def analytic_rows() -> list[dict[str, Any]]:
    """The paper's Table 1 at DeepSeek-V2's widths: numbers per token and layer, and KB per token
    over its layers in bfloat16."""
    h, d, groups = V2["n_heads"], V2["d_head"], 8
    rows = [
        ("multi-head", "2 n_h d_h", 2 * h * d),
        (f"grouped-query, n_g = {groups}", "2 n_g d_h", 2 * groups * d),
        ("multi-query", "2 d_h", 2 * d),
        ("MLA", "d_c + d_h^R", V2["kv_rank"] + V2["rope"]),
    ]
    return [
        {"attention": name, "formula": formula, "per_layer": n, "kb_per_token": n * V2["layers"] * 2 / 1024}
        for name, formula, n in rows
    ]


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    rows = []
    for name, overrides, expected in measured_models(args.layers):
        torch.manual_seed(0)
        model = tz.build_model("llama-tiny", **overrides).eval()
        nbytes = bytes_per_token_and_layer(model, args)
        numbers = nbytes / 4  # float32
        if numbers != expected:
            raise SystemExit(f"{name}: the cache holds {numbers} numbers per token and layer, its formula {expected}")
        params = sum(p.numel() for p in model.parameters())
        rows.append({"attention": name, "bytes": nbytes, "numbers": numbers, "parameters": params})
    reference = rows[0]
    print(
        f"llama-tiny (d_model {D_MODEL}, {HEADS} heads of {D_HEAD}, {args.layers} layers, float32): cache after "
        f"{args.prompt} + {args.new_tokens} tokens, batch {args.batch}, per token, row and layer"
    )
    print(f"  {'attention':<40} {'numbers':>8} {'bytes':>6} {'x multi-head':>13} {'parameters':>11}")
    for row in rows:
        print(
            f"  {row['attention']:<40} {row['numbers']:>8.0f} {row['bytes']:>6.0f} "
            f"{row['bytes'] / reference['bytes']:>13.3f} {row['parameters']:>11,}"
        )
    analytic = analytic_rows()
    print(
        f"\nDeepSeek-V2's width (d_model {V2['d_model']}, {V2['n_heads']} heads of {V2['d_head']}, d_c "
        f"{V2['kv_rank']}, d_h^R {V2['rope']}), the paper's Table 1, counted: per token"
    )
    print(f"  {'attention':<28} {'formula':<12} {'per layer':>9} {'x multi-head':>13} {'KB, 60 layers, bf16':>20}")
    for row in analytic:
        print(
            f"  {row['attention']:<28} {row['formula']:<12} {row['per_layer']:>9,} "
            f"{row['per_layer'] / analytic[0]['per_layer']:>13.4f} {row['kb_per_token']:>20.1f}"
        )
    mla = analytic[-1]["per_layer"]
    print(f"  MLA caches as much as grouped-query attention with {mla / (2 * V2['d_head']):g} groups")
    if args.json:
        write_json(args.json, {"args": vars(args), "measured": rows, "deepseek_v2": analytic})


if __name__ == "__main__":
    main()
