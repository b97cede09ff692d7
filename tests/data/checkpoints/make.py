"""Writes tests/data/checkpoints/<variant>/: a small model saved by save_pretrained, with a fixed input
and the outputs it gave, at the commit named in tests/data/checkpoints/README.md."""

from pathlib import Path

import safetensors.torch
import torch

import transformer_zoo as tz

root = Path("tests/data/checkpoints")
small = {
    "transformer-tiny": dict(
        d_model=16, n_heads=2, d_ff=32, vocab_size=50, encoder={"layers": 1}, decoder={"layers": 1}, positional="rotary"
    ),
    "transformer-dmca-tiny": dict(
        d_model=16,
        n_heads=2,
        d_ff=32,
        vocab_size=50,
        decoder={
            "layers": 2,
            "attention": [{"kind": "block-local", "block": 4}, {"kind": "memory-compressed", "compression": 3}],
        },
    ),
    "local-global-encoder-tiny": dict(
        d_model=16,
        n_heads=2,
        d_ff=32,
        vocab_size=50,
        max_len=64,
        encoder={"layers": 1, "attention": {"kind": "local-global", "window": 2}},
    ),
    "universal-transformer-tiny": dict(
        d_model=16, n_heads=2, d_ff=32, vocab_size=50, encoder={"layers": 2}, decoder={"layers": 2}
    ),
    "bert-tiny": dict(d_model=16, n_heads=2, d_ff=32, vocab_size=50, encoder={"layers": 1}, max_len=64),
    "image-transformer-tiny": dict(
        d_model=16,
        n_heads=2,
        d_ff=32,
        encoder={"layers": 1, "attention": {"kind": "local-2d", "query_block": [2, 2], "memory": [1, 1]}},
    ),
}
g = torch.Generator().manual_seed(0)
for name, overrides in small.items():
    torch.manual_seed(0)
    model = tz.build_model(name, dropout=0.0, **overrides).eval()
    out = root / name
    model.save_pretrained(out)
    cfg = model.config
    if getattr(cfg, "inputs", "tokens") == "image":
        inputs = {"image": torch.rand(2, 1, 8, 8, generator=g)}
    else:
        ids = torch.randint(3, 50, (2, 40), generator=g)
        inputs = {"src": ids} if cfg.encoder is not None else {"tgt": ids}
        if cfg.encoder is not None and cfg.decoder is not None:
            inputs["tgt"] = torch.randint(3, 50, (2, 9), generator=g)
    with torch.no_grad():
        logits = model(**inputs).logits
    safetensors.torch.save_file({**inputs, "logits": logits.contiguous()}, str(out / "io.safetensors"))
    print(name, sum(p.numel() for p in model.parameters()), tuple(logits.shape))
