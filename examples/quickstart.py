"""Build a variant by name and from a config file, decode, save and reload.

    python examples/quickstart.py [OUT_DIR]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

import transformer_zoo as tz
from transformer_zoo.core.decoding import greedy_decode

HERE = Path(__file__).parent


def main(out_dir: Path) -> None:
    torch.manual_seed(0)
    print("registered variants:", ", ".join(tz.list_variants()))

    # 1. By name, with an override.
    model = tz.build_model("transformer-tiny", dropout=0.0).eval()
    src = torch.randint(3, model.config.vocab_size, (2, 10))
    tgt = torch.randint(3, model.config.vocab_size, (2, 6))
    logits = model(src, tgt).logits
    print(f"transformer-tiny: {sum(p.numel() for p in model.parameters()):,} parameters, logits {tuple(logits.shape)}")

    # 2. Greedy decoding on the key/value cache.
    tokens = greedy_decode(model, src, bos_id=1, eos_id=2, max_new_tokens=8)
    print("greedy decode:", tokens.tolist())

    # 3. From a config file: an encoder-only classifier.
    classifier = tz.build_model(HERE / "configs" / "encoder-classifier.yaml").eval()
    print(f"encoder-classifier ({classifier.architecture}): logits {tuple(classifier(src).logits.shape)}")

    # 4. Save and reload: config.json + model.safetensors.
    model.save_pretrained(out_dir / "transformer-tiny")
    reloaded = tz.from_pretrained(out_dir / "transformer-tiny")
    with torch.no_grad():
        same = torch.equal(reloaded(src, tgt).logits, model(src, tgt).logits)
    print(f"saved to {out_dir / 'transformer-tiny'}; reloaded outputs identical: {same}")
    if not same:
        raise SystemExit("reloaded model differs from the saved one")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
