"""Damaged checkpoints of an interrupted run, and hostile folders given to ``from_pretrained``."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .configs import TRAIN_BASE
from .harness import NAN, Context, Result, cli, names_one, refusal


# ---- 4. checkpoint manipulations -------------------------------------------------------------------
def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(random.Random(0).randbytes(max(path.stat().st_size, 64)))


def _flipped(path: Path) -> None:
    """64 bytes flipped past the middle of the file (in a safetensors file's tensor data): the file
    still reads, as other bytes."""
    data = bytearray(path.read_bytes())
    start = (len(data) * 3) // 4
    data[start : start + 64] = bytes(b ^ 0xFF for b in data[start : start + 64])
    path.write_bytes(bytes(data))


def _digit(path: Path) -> None:
    """The last digit of a JSON file changed: it still reads, as another value."""
    text = path.read_text()
    at = max(i for i, c in enumerate(text) if c.isdigit())
    path.write_text(text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1 :])


def _state(edit: Callable[[dict], Any]) -> Callable[[Path], None]:
    def damage(checkpoint: Path) -> None:
        state = json.loads((checkpoint / "state.json").read_text())
        (checkpoint / "state.json").write_text(json.dumps(edit(state)))

    return damage


def _tensors(edit: Callable[[dict], dict]) -> Callable[[Path], None]:
    def damage(checkpoint: Path) -> None:
        import safetensors.torch

        path = str(checkpoint / "model.safetensors")
        safetensors.torch.save_file(edit(safetensors.torch.load_file(path)), path)

    return damage


def _wrong_shape(tensors: dict) -> dict:
    import torch

    name = next(k for k, v in tensors.items() if v.dim() == 2)
    return {**tensors, name: torch.zeros(tensors[name].shape[0] + 1, tensors[name].shape[1])}


def _keep_old(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    def both(checkpoint: Path) -> None:
        shutil.copytree(checkpoint, checkpoint.parent / ".checkpoint.old")
        damage(checkpoint)

    return both


CHECKPOINT_CASES: list[tuple[str, Callable[[Path], Any], bool]] = [  # (case, damage, an intact older one is left)
    ("model.safetensors truncated", lambda c: _truncate(c / "model.safetensors"), False),
    ("model.safetensors garbage", lambda c: _garbage(c / "model.safetensors"), False),
    ("model.safetensors empty", lambda c: (c / "model.safetensors").write_bytes(b""), False),
    ("model.safetensors missing", lambda c: (c / "model.safetensors").unlink(), False),
    ("a weight of another shape", _tensors(_wrong_shape), False),
    ("NaN weights", _tensors(lambda t: {k: v.float() * NAN for k, v in t.items()}), False),
    ("optimizer.pt garbage", lambda c: _garbage(c / "optimizer.pt"), False),
    ("optimizer.pt truncated", lambda c: _truncate(c / "optimizer.pt"), False),
    ("optimizer.pt empty", lambda c: (c / "optimizer.pt").write_bytes(b""), False),
    ("optimizer.pt missing", lambda c: (c / "optimizer.pt").unlink(), False),
    ("state.json empty", lambda c: (c / "state.json").write_text(""), False),
    ("state.json garbage", lambda c: (c / "state.json").write_text("{not json"), False),
    ("state.json missing", lambda c: (c / "state.json").unlink(), False),
    ("state.json a list", lambda c: (c / "state.json").write_text("[]"), False),
    ("state without 'rng'", _state(lambda s: {k: v for k, v in s.items() if k != "rng"}), False),
    ("rng of the wrong length", _state(lambda s: {**s, "rng": [1, 2, 3]}), False),
    ("step -5", _state(lambda s: {**s, "step": -5}), False),
    ("step as a string", _state(lambda s: {**s, "step": str(s["step"])}), False),
    ("step past the end", _state(lambda s: {**s, "step": 10**6}), False),
    ("history not a list", _state(lambda s: {**s, "history": 5}), False),
    ("model changed: --set model.d_model=48", lambda c: None, False),
    ("model.safetensors with 64 bytes flipped", lambda c: _flipped(c / "model.safetensors"), False),
    ("optimizer.pt with 64 bytes flipped", lambda c: _flipped(c / "optimizer.pt"), False),
    ("state.json with a digit changed", lambda c: _digit(c / "state.json"), False),
    ("model.safetensors garbage, .checkpoint.old intact", _keep_old(lambda c: _garbage(c / "model.safetensors")), True),
    ("model.safetensors flipped, .checkpoint.old intact", _keep_old(lambda c: _flipped(c / "model.safetensors")), True),
    ("checkpoint/ gone, .checkpoint.old intact", lambda c: os.replace(c, c.parent / ".checkpoint.old"), True),
    ("train.json garbage", lambda c: (c.parent / "train.json").write_text("{"), True),
]
MAKE_RUN = (
    "import sys\nfrom transformer_zoo.training import load_train_config, train\n"
    "train(load_train_config(sys.argv[1], ['checkpoint_every=1']), sys.argv[2], progress=False, stop_after=2)\n"
)


def checkpoints(ctx: Context) -> list[Result]:
    """An interrupted run (4 steps, stopped after 2 with a checkpoint each step), damaged, then resumed."""
    config, base = ctx.root / "checkpoint.json", ctx.root / "interrupted"
    config.write_text(json.dumps({**TRAIN_BASE, "steps": 4}))
    made = subprocess.run(
        [sys.executable, "-c", MAKE_RUN, str(config), str(base)],
        cwd=ctx.root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if made.returncode != 0 or not (base / "checkpoint" / "state.json").is_file():
        ctx.control("checkpoints", "an interrupted run to damage", False, made.stderr[-300:])
        return []

    def resume(name: str, damage: Callable[[Path], Any], fallback: bool) -> tuple[str, str]:
        run = ctx.root / "resumed" / re.sub(r"\W+", "-", name)
        shutil.copytree(base, run)
        damage(run / "checkpoint")
        extra = ["--set", "model.d_model=48"] if "d_model" in name else []
        proc = cli(
            ["train", str(config), "--out", str(run), "--set", "checkpoint_every=1", "--json", *extra], ctx.root, 180
        )
        if proc is None:
            return "hang", "timed out"
        err = proc.stderr.strip()
        if "Traceback" in err:
            return "traceback", err.splitlines()[-1]
        if proc.returncode == 2 and err:
            return "clean", err.splitlines()[-1]
        if proc.returncode == 0:
            return ("clean", "resumed") if fallback else ("accepted", "went on without a word")
        return "other", f"exit {proc.returncode}: {err[-200:]}"

    control = resume("control", lambda c: None, True)
    ctx.control("checkpoints", "an intact checkpoint resumes", control[0] == "clean", control[1])
    return [
        Result("checkpoints", name, *resume(name, damage, fallback))
        for name, damage, fallback in ctx.track(CHECKPOINT_CASES, "checkpoints")
    ]


# ---- 5. hostile from_pretrained folders -------------------------------------------------------------
HF_CONFIG = {
    "model_type": "bert",
    "architectures": ["BertModel"],
    "vocab_size": 50,
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 32,
    "type_vocab_size": 2,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-12,
}


def hf_bert_weights(config: dict[str, Any]) -> dict[str, Any]:
    """Random weights under the names Hugging Face's BertModel saves."""
    import torch

    h, f = config["hidden_size"], config["intermediate_size"]
    shapes = {
        "embeddings.word_embeddings.weight": (config["vocab_size"], h),
        "embeddings.position_embeddings.weight": (config["max_position_embeddings"], h),
        "embeddings.token_type_embeddings.weight": (config["type_vocab_size"], h),
        "embeddings.LayerNorm.weight": (h,),
        "embeddings.LayerNorm.bias": (h,),
    }
    for i in range(config["num_hidden_layers"]):
        layer = {
            "attention.self.query": (h, h),
            "attention.self.key": (h, h),
            "attention.self.value": (h, h),
            "attention.output.dense": (h, h),
            "intermediate.dense": (f, h),
            "output.dense": (h, f),
            "attention.output.LayerNorm": None,
            "output.LayerNorm": None,
        }
        for name, shape in layer.items():
            rows = h if shape is None else shape[0]
            shapes[f"encoder.layer.{i}.{name}.weight"] = (rows,) if shape is None else shape
            shapes[f"encoder.layer.{i}.{name}.bias"] = (rows,)
    generator = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=generator) * 0.02 for name, shape in shapes.items()}


class Payload:
    """Pickles to a call of ``open(marker, "w")``: the file appears if a loader runs what it reads."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return open, (self.marker, "w")


def _edit_json(name: str, edit: Callable[[Any], Any]) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        (folder / name).write_text(json.dumps(edit(json.loads((folder / name).read_text()))))

    return change


def _weights(edit: Callable[[dict], dict], name: str = "model.safetensors") -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        import safetensors.torch

        safetensors.torch.save_file(edit(safetensors.torch.load_file(str(folder / name))), str(folder / name))

    return change


def _sharded(target: Callable[[Path], str]) -> Callable[[Path], None]:
    """model.safetensors moved to where ``target(folder)`` says, and an index naming it by that path."""

    def change(folder: Path) -> None:
        import safetensors.torch

        weights = safetensors.torch.load_file(str(folder / "model.safetensors"))
        (folder / "model.safetensors").unlink()
        shard = target(folder)
        destination = Path(shard) if Path(shard).is_absolute() else folder / shard
        destination.parent.mkdir(parents=True, exist_ok=True)
        safetensors.torch.save_file(weights, str(destination))
        index = {"metadata": {}, "weight_map": {k: shard for k in weights}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))

    return change


def _payload(folder: Path) -> None:
    import torch

    (folder / "model.safetensors").unlink()
    torch.save(Payload(str(folder.parent / f"{folder.name}.ran")), folder / "pytorch_model.bin")


def _bin_garbage(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(random.Random(1).randbytes(4096))


def _huge_zoo(config: dict) -> dict:
    return {**config, "vocab_size": 10**6, "d_model": 2**15, "n_heads": 2, "d_ff": 2**15}


ints = lambda tensors: {k: (v * 1000).long() for k, v in tensors.items()}  # noqa: E731
ZOO_FOLDERS: list[tuple[str, Callable[[Path], Any]]] = [
    ("config.json asks for ~100 GB, tiny weights", _edit_json("config.json", _huge_zoo)),
    (
        "config.json asks for 10**12 layers",
        _edit_json("config.json", lambda c: {**c, "encoder": {**c["encoder"], "layers": 10**12}}),
    ),
    ("config.json a list", lambda f: (f / "config.json").write_text("[1, 2]")),
    ("config.json a string", lambda f: (f / "config.json").write_text('"transformer-tiny"')),
    ("config.json null", lambda f: (f / "config.json").write_text("null")),
    ("config.json invalid JSON", lambda f: (f / "config.json").write_text("{")),
    ("config.json empty", lambda f: (f / "config.json").write_text("")),
    ("config.json names no variant", lambda f: (f / "config.json").write_text('{"d_model": 32}')),
    ("config.json names an unknown variant", _edit_json("config.json", lambda c: {**c, "variant": "nope"})),
    ("config.json with an unknown key", _edit_json("config.json", lambda c: {**c, "bogus": 1})),
    (
        "config.json with a NaN eps",
        _edit_json("config.json", lambda c: {**c, "norm": {"kind": "layernorm", "eps": NAN}}),
    ),
    ("model.safetensors truncated", lambda f: _truncate(f / "model.safetensors")),
    ("model.safetensors garbage", lambda f: _garbage(f / "model.safetensors")),
    ("model.safetensors empty", lambda f: (f / "model.safetensors").write_bytes(b"")),
    ("model.safetensors missing", lambda f: (f / "model.safetensors").unlink()),
    ("model.safetensors with 64 bytes of its tensors flipped", lambda f: _flipped(f / "model.safetensors")),
    ("integer weights", _weights(ints)),
    ("a weight of another shape", _weights(_wrong_shape)),
    ("a weight missing", _weights(lambda t: dict(list(t.items())[1:]))),
]
HF_FOLDERS: list[tuple[str, Callable[[Path], Any]]] = [
    ("shard index pointing at ../outside.safetensors", _sharded(lambda f: "../outside.safetensors")),
    ("shard index with an absolute path", _sharded(lambda f: str(f.parent / "elsewhere" / "shard.safetensors"))),
    (
        "shard index garbage",
        lambda f: (_sharded(lambda _: "shard.safetensors")(f), (f / "model.safetensors.index.json").write_text("{")),
    ),
    (
        "shard index without weight_map",
        lambda f: (
            _sharded(lambda _: "shard.safetensors")(f),
            (f / "model.safetensors.index.json").write_text('{"metadata": {}}'),
        ),
    ),
    ("shard index naming a missing shard", _sharded(lambda f: "shard.safetensors")),  # then removed below
    (
        "HF config asks for ~100 GB",
        _edit_json(
            "config.json", lambda c: {**c, "vocab_size": 10**6, "hidden_size": 2**15, "intermediate_size": 2**15}
        ),
    ),
    ("HF config asks for 10**12 layers", _edit_json("config.json", lambda c: {**c, "num_hidden_layers": 10**12})),
    ("HF hidden_size as a string", _edit_json("config.json", lambda c: {**c, "hidden_size": "16"})),
    ("HF config a list", lambda f: (f / "config.json").write_text('[{"model_type": "bert"}]')),
    ("HF integer weights", _weights(ints)),
    ("HF weight of another shape", _weights(_wrong_shape)),
    ("pickle payload in pytorch_model.bin", _payload),
    ("pytorch_model.bin garbage", _bin_garbage),
]


def pretrained(ctx: Context) -> list[Result]:
    import safetensors.torch
    import torch

    import transformer_zoo as tz

    root = ctx.root / "folders"
    torch.manual_seed(0)
    tz.build_model({**TRAIN_BASE["model"], "vocab_size": 50}).save_pretrained(root / "zoo")
    (root / "hf").mkdir()
    (root / "hf" / "config.json").write_text(json.dumps(HF_CONFIG))
    safetensors.torch.save_file(hf_bert_weights(HF_CONFIG), str(root / "hf" / "model.safetensors"))

    def prepared(source: str, name: str, change: Callable[[Path], Any]) -> Path:
        folder = root / re.sub(r"\W+", "-", name)
        shutil.copytree(root / source, folder)
        change(folder)
        if "missing shard" in name:
            (folder / "shard.safetensors").unlink()
        return folder

    for source, name, change in (
        ("zoo", "control zoo", lambda f: None),
        ("hf", "control hf", lambda f: None),
        ("hf", "control hf sharded", _sharded(lambda f: "shard.safetensors")),
    ):
        answer = ctx.sandbox.run("pretrained", str(prepared(source, name, change)), 30.0)
        ctx.control("pretrained", f"{name} folder loads", answer["status"] == "returned", answer.get("message", ""))
    results = []
    cases = [("zoo", n, c) for n, c in ZOO_FOLDERS] + [("hf", n, c) for n, c in HF_FOLDERS]
    for source, name, change in ctx.track(cases, "pretrained"):
        folder = prepared(source, name, change)
        answer = ctx.sandbox.run("pretrained", str(folder), 10.0)
        names = [
            folder.name,
            "config.json",
            "model.safetensors",
            "model.safetensors.index.json",
            "pytorch_model.bin",
            "outside.safetensors",
            "shard.safetensors",
        ]
        outcome, detail = refusal(answer, names)
        if answer.get("not_found") and outcome == "traceback":
            outcome = "clear" if names_one(answer["message"], names) else "unclear"
        if name.startswith("pickle"):  # a refusal is what matters here, whatever its type
            ran = (root / f"{folder.name}.ran").exists()
            outcome = "accepted" if ran else ("clear" if answer["status"] == "raised" else outcome)
            detail = ("the payload ran; " if ran else "") + detail
        results.append(Result("pretrained", name, outcome, detail))
    return results
