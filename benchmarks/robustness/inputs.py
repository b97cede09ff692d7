"""Bad inputs to built models: ids, masks, images, labels and noise of the wrong type, dtype,
shape or value, and bad decoding arguments."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .harness import INF, NAN, Context, Result

# ---- 3. runtime inputs ---------------------------------------------------------------------------
TOKEN_DEFECTS = [
    "uint8 ids",
    "int16 ids",
    "float32 ids",
    "float64 ids",
    "bool ids",
    "python list",
    "numpy array",
    "empty batch",
    "empty sequence",
    "rank-1 ids",
    "rank-3 ids",
    "0-d ids",
    "id = vocab_size",
    "negative id",
    "longer than max_len",
]
TGT_DEFECTS = [
    "uint8 ids",
    "float32 ids",
    "python list",
    "empty sequence",
    "rank-1 ids",
    "id = vocab_size",
    "negative id",
    "longer than max_len",
]
MASK_DEFECTS = ["mask of the wrong length", "3-D mask", "mask as a list"]
DECODE_DEFECTS = [
    "max_new_tokens=-1",
    "max_new_tokens=2.5",
    "start token = vocab_size",
    "negative start token",
    "uint8 source or prompt",
    "empty source or prompt",
]
IMAGE_DEFECTS = [
    "float64 image",
    "float16 image",
    "uint8 image",
    "int64 image",
    "bool image",
    "NaN pixel",
    "inf pixel",
    "3 channels",
    "16x16 image",
    "7x7 image",
    "rank-3 image",
    "rank-5 image",
    "empty batch",
    "python list",
    "numpy array",
]
TOKEN_MODELS = {
    "transformer-tiny": "encoder-decoder",
    "universal-transformer-tiny": "encoder-decoder",
    "bert-tiny": "encoder",
    "universal-transformer-encoder-tiny": "encoder",
    "local-global-encoder-tiny": "encoder",
    "transformer-dmca-tiny": "decoder",
}
GAN_DEFECTS = {
    "labels": [
        "float labels",
        "2-D labels",
        "label = num_classes",
        "negative label",
        "empty labels",
        "python list",
        "numpy array",
        "int32 labels",
    ],
    "noise": ["noise of the wrong width", "NaN noise", "float64 noise", "noise as a list"],
    "discriminate": ["float64 images", "NaN image", "3-channel images", "more labels than images"],
}


def input_cases() -> list[tuple[str, str, str]]:
    cases = []
    for variant, arch in TOKEN_MODELS.items():
        cases += [(variant, "src", d) for d in TOKEN_DEFECTS] + [(variant, "mask", d) for d in MASK_DEFECTS]
        if arch == "encoder-decoder":
            cases += [(variant, "tgt", d) for d in TGT_DEFECTS] + [(variant, "pair", "batch sizes differ")]
            cases += [(variant, "decode", d) for d in [*DECODE_DEFECTS, "beam_size=0", "beam max_new_tokens=-1"]]
        if arch == "decoder":
            cases += [(variant, "decode", d) for d in DECODE_DEFECTS]
    cases += [
        ("bert-tiny", "token types", d) for d in ("token type = type_vocab_size", "token types of the wrong shape")
    ]
    cases += [
        (v, "image", d) for v in ("vit-tiny", "image-transformer-tiny", "sagan-classifier-tiny") for d in IMAGE_DEFECTS
    ]
    return cases + [("sagan-gan", where, d) for where, defects in GAN_DEFECTS.items() for d in defects]


def _ids(model: Any, defect: str = "", batch: int = 2) -> Any:
    import numpy as np  # noqa: F401  (numpy arrays are one of the defects)
    import torch

    vocab, max_len = model.config.vocab_size, model.config.max_len
    good = torch.randint(1, vocab, (batch, 5), generator=torch.Generator().manual_seed(0))
    edited = good.clone()
    edited[0, 1] = vocab if defect == "id = vocab_size" else -1
    return {
        "": good,
        "uint8 ids": good.to(torch.uint8),
        "int16 ids": good.to(torch.int16),
        "float32 ids": good.float(),
        "float64 ids": good.double(),
        "bool ids": good > 0,
        "python list": good.tolist(),
        "numpy array": good.numpy(),
        "empty batch": good[:0],
        "empty sequence": good[:, :0],
        "rank-1 ids": good[0],
        "rank-3 ids": good[..., None],
        "0-d ids": good[0, 0],
        "id = vocab_size": edited,
        "negative id": edited,
        "longer than max_len": torch.ones(batch, max_len + 1, dtype=torch.long),
    }[defect]


def _call(model: Any, ids: Any, *, tgt: Any = None, **masks: Any) -> Any:
    """Forward as the model's architecture takes it: (src, tgt), (src) or (tgt alone)."""
    if model.encoder is not None and model.decoder is not None:
        return model(ids, _ids(model) if tgt is None else tgt, **masks)
    return model(ids, **masks)


def _decode(model: Any, defect: str) -> Any:
    import torch

    from transformer_zoo.core.decoding import beam_search, greedy_decode

    vocab, good = model.config.vocab_size, _ids(model)
    start = {"start token = vocab_size": vocab, "negative start token": -1}.get(defect, 1)
    given = {"uint8 source or prompt": good.to(torch.uint8), "empty source or prompt": good[:, :0]}.get(defect, good)
    steps = {"max_new_tokens=-1": -1, "max_new_tokens=2.5": 2.5, "beam max_new_tokens=-1": -1}.get(defect, 2)
    if defect.startswith("beam"):
        return beam_search(
            model, good, bos_id=1, eos_id=2, beam_size=0 if defect == "beam_size=0" else 2, max_new_tokens=steps
        )
    if model.encoder is not None:
        return greedy_decode(model, given, bos_id=start, max_new_tokens=steps)
    prompt = torch.full((2, 1), start, dtype=torch.long) if "start token" in defect else given
    return greedy_decode(model, prompt=prompt, max_new_tokens=steps)


def _image(model: Any, defect: str) -> Any:
    import torch

    channels, (height, width) = model.config.channels, model.config.image_size
    good = torch.rand(2, channels, height, width, generator=torch.Generator().manual_seed(0))
    poisoned = good.clone()
    poisoned[0, 0, 0, 0] = NAN if defect.startswith("NaN") else INF
    return {
        "": good,
        "float64 image": good.double(),
        "float16 image": good.half(),
        "uint8 image": (good * 255).to(torch.uint8),
        "int64 image": good.long(),
        "bool image": good > 0.5,
        "NaN pixel": poisoned,
        "inf pixel": poisoned,
        "3 channels": torch.rand(2, 3, height, width),
        "16x16 image": torch.rand(2, channels, 16, 16),
        "7x7 image": torch.rand(2, channels, 7, 7),
        "rank-3 image": good[0],
        "rank-5 image": good[None],
        "empty batch": good[:0],
        "python list": good.tolist(),
        "numpy array": good.numpy(),
        "float64 images": good.double(),
        "NaN image": poisoned,
        "3-channel images": torch.rand(2, 3, height, width),
        "more labels than images": good,
    }[defect]


def _gan(model: Any, where: str, defect: str) -> Any:
    import torch

    labels, noise = torch.tensor([1, 2]), torch.randn(2, model.config.noise_dim)
    if where == "labels":
        bad = {
            "": labels,
            "float labels": labels.float(),
            "2-D labels": labels[:, None],
            "label = num_classes": torch.tensor([10, 1]),
            "negative label": torch.tensor([-1, 1]),
            "empty labels": labels[:0],
            "python list": [1, 2],
            "numpy array": labels.numpy(),
            "int32 labels": labels.int(),
        }[defect]
        return model(bad)
    if where == "noise":
        nan_noise = noise.clone()
        nan_noise[0, 0] = NAN
        bad = {
            "noise of the wrong width": torch.randn(2, model.config.noise_dim - 1),
            "NaN noise": nan_noise,
            "float64 noise": noise.double(),
            "noise as a list": noise.tolist(),
        }[defect]
        return model(labels, noise=bad)
    return model.discriminate(_image(model, defect), torch.tensor([1, 2, 3]) if defect.startswith("more") else labels)


def _mask(model: Any, defect: str) -> Any:
    import torch

    mask = {
        "mask of the wrong length": torch.ones(2, 6),
        "3-D mask": torch.ones(2, 5, 1),
        "mask as a list": [[1] * 5] * 2,
    }[defect]
    return _call(model, _ids(model), **{"tgt_mask" if model.encoder is None else "src_mask": mask})


def _tgt(model: Any, defect: str) -> Any:
    tgt = _ids(model, defect)
    batch = tgt.shape[0] if getattr(tgt, "ndim", 0) >= 1 else 2  # the source matches, so only tgt is bad
    return _call(model, _ids(model, batch=batch), tgt=tgt)


def _token_types(model: Any, defect: str) -> Any:
    types = _ids(model) * 0 + 2 if defect == "token type = type_vocab_size" else _ids(model, batch=3) * 0
    return model(_ids(model), token_type_ids=types)


INPUT_CALLS: dict[str, Callable[[Any, str], Any]] = {
    "src": lambda m, d: _call(m, _ids(m, d)),
    "tgt": _tgt,
    "mask": _mask,
    "token types": _token_types,
    "pair": lambda m, d: _call(m, _ids(m), tgt=_ids(m, batch=3)),
    "decode": _decode,
    "image": lambda m, d: m(_image(m, d)),
    "labels": lambda m, d: _gan(m, "labels", d),
    "noise": lambda m, d: _gan(m, "noise", d),
    "discriminate": lambda m, d: _gan(m, "discriminate", d),
}


def inputs(ctx: Context) -> list[Result]:
    results = []
    for variant, where, defect in ctx.track(input_cases(), "inputs"):
        answer = ctx.sandbox.run(run_input, (variant, where, defect), 20.0)
        if answer["status"] == "returned":
            outcome, detail = ("accepted", "") if answer["finite"] else ("silent NaN", "output not finite")
        elif answer["status"] == "raised":
            detail = f"{answer['type']}: {answer['message']}"
            outcome = "ValueError" if answer["value"] else "other exception"
        else:
            outcome, detail = answer["status"], answer.get("message", "")
        results.append(Result("inputs", f"{variant} {where}: {defect}", outcome, detail))
    return results


_MODELS: dict[str, Any] = {}


def run_input(payload: tuple) -> dict[str, Any]:
    import torch

    import transformer_zoo as tz

    variant, where, defect = payload
    if variant not in _MODELS:
        torch.manual_seed(0)
        _MODELS[variant] = tz.build_model(variant).eval()
    with torch.no_grad():
        out = INPUT_CALLS[where](_MODELS[variant], defect)
    return {"finite": _finite(out)}


def _finite(out: Any) -> bool:
    import torch

    if isinstance(out, torch.Tensor):
        return not out.is_floating_point() or bool(torch.isfinite(out).all())
    if isinstance(out, (list, tuple)):
        return all(_finite(x) for x in out)
    if isinstance(out, dict):
        return all(_finite(x) for x in out.values())
    return _finite([getattr(out, "logits", None), getattr(out, "hidden", None)]) if hasattr(out, "logits") else True
