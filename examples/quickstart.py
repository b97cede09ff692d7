"""Quickstart: build variants by name and from a config file, decode, save and reload.

    python examples/quickstart.py [OUT_DIR]

OUT_DIR receives the saved model (``OUT_DIR/transformer-tiny``); by default a temporary
folder, removed at the end. Runs in a few seconds on a CPU.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

import transformer_zoo as tz
from transformer_zoo.core.decoding import greedy_decode

CONFIGS = Path(__file__).parent / "configs"
BOS_ID, EOS_ID = 1, 2  # start and end token ids: a convention of this example, not of the library


def n_parameters(model: torch.nn.Module) -> int:
    """The number of parameters of ``model``."""
    return sum(p.numel() for p in model.parameters())


def main(out_dir: Path) -> None:
    """Walk through the public API, printing each step; save the model under ``out_dir``."""
    torch.manual_seed(0)
    print("registered variants:", ", ".join(tz.list_variants()))

    # 1. A variant by name, with an override: the original encoder-decoder, tiny preset.
    model = tz.build_model("transformer-tiny", dropout=0.0).eval()
    vocab = model.config.vocab_size
    src = torch.randint(3, vocab, (2, 10))  # (batch, source length) token ids
    tgt = torch.randint(3, vocab, (2, 6))  # (batch, target length)
    with torch.no_grad():
        logits = model(src, tgt).logits
    print(f"transformer-tiny: {n_parameters(model):,} parameters; logits {tuple(logits.shape)} (batch, tgt, vocab)")

    # 2. Greedy decoding, reading earlier keys and values from the cache.
    tokens = greedy_decode(model, src, bos_id=BOS_ID, eos_id=EOS_ID, max_new_tokens=8)
    print(f"greedy decode: {tuple(tokens.shape)} ids (untrained, so the tokens mean nothing yet): {tokens[0].tolist()}")

    # 3. From a config file: an encoder-only classifier built on the same family.
    config = tz.load_config(CONFIGS / "encoder-classifier.yaml")
    classifier = tz.build_model(config).eval()
    with torch.no_grad():
        class_logits = classifier(src).logits
    print(f"encoder-classifier.yaml: {classifier.architecture}, logits {tuple(class_logits.shape)} (batch, classes)")

    # 4. Save (config.json + model.safetensors) and reload.
    saved = model.save_pretrained(out_dir / "transformer-tiny")
    reloaded = tz.from_pretrained(saved)
    with torch.no_grad():
        same = torch.equal(reloaded(src, tgt).logits, logits)
    print(f"saved to {saved}; reloaded outputs identical: {same}")
    if not same:
        raise SystemExit("the reloaded model's outputs differ from the saved model's")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", type=Path, help="where to save the model (default: a temporary folder)")
    args = parser.parse_args()
    if args.out_dir is not None:
        main(args.out_dir)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
