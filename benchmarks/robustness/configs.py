"""Bad model configs, config files and ``--set`` overrides, and bad training configs."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from typing import Any

from .harness import INF, NAN, Context, Result, cli, cli_refusal, refusal

# ---- the cases, as data ----------------------------------------------------------------------
# Bad values by what a field holds. Each mapping is label -> value; every value is wrong for every
# field of that type (a size of 0 is wrong, a pad id of 0 is not, hence "count" has no "zero").
INT_BAD = {
    "string": "abc",
    "fraction": 2.5,
    "bool": True,
    "negative": -4,
    "above int64": 2**64 + 1,
    "null": None,
    "list": [],
    "mapping": {},
    "nan": NAN,
    "inf": INF,
}
FLOAT_BAD = {
    "string": "abc",
    "bool": True,
    "nan": NAN,
    "inf": INF,
    "-inf": -INF,
    "null": None,
    "list": [],
    "mapping": {},
}
BAD = {
    "size": {**INT_BAD, "zero": 0, "huge": 10**12},
    "positive": {**INT_BAD, "zero": 0},
    "count": INT_BAD,
    "count-size": {**INT_BAD, "huge": 10**12},
    "fraction": {**FLOAT_BAD, "negative": -0.5, "above one": 1.5},
    "positive float": {**FLOAT_BAD, "negative": -1.0},
    "float": FLOAT_BAD,
    "bool": {"string": "maybe", "int": 2, "null": None, "list": [], "mapping": {}},
    "optional bool": {"string": "maybe", "int": 2, "list": [], "mapping": {}},
    "literal": {"unknown": "nope", "int": 5, "null": None, "list": [], "mapping": {}},
    "kind": {
        "unknown name": "nope",
        "unknown kind": {"kind": "nope"},
        "kind as list": {"kind": []},
        "kind as mapping": {"kind": {}},
        "kind as int": {"kind": 5},
        "kind null": {"kind": None},
        "int": 5,
        "list": [],
        "empty string": "",
        "bool": True,
        "unknown key": {"bogus": 1},
    },
    "betas": {
        "above one": [1.5, 0.9],
        "negative": [-0.1, 0.9],
        "one": [0.0, 1.0],
        "nan": [NAN, 0.9],
        "inf": [INF, 0.9],
        "one item": [0.5],
        "three items": [0.5, 0.9, 0.99],
        "string": "0.5",
        "null": None,
    },
}
BAD["kinds"] = {**BAD["kind"], "list of unknown": ["nope"], "list with an int": [5]}
BAD["optional positive float"] = {k: v for k, v in BAD["positive float"].items() if k != "null"}
BAD["optional size"] = {k: v for k, v in BAD["size"].items() if k != "null"}


def list_bad(base: list[int], zero_ok: bool = False) -> dict[str, Any]:
    """Bad values for a list of positive ints shaped like ``base`` (an image size, widths)."""
    head, rest = base[0], base[1:]
    bad = {
        "empty": [],
        "negative": [-head, *rest],
        "string": ",".join(map(str, base)),
        "scalar": head,
        "nested": [[x] for x in base],
        "fraction": [head + 0.5, *rest],
        "bool": [True, *rest],
        "huge": [*base[:-1], 10**12],
        "above int64": [*base[:-1], 2**64 + 1],
        "null": None,
        "nan": [NAN, *rest],
    }
    if len(base) == 2:
        bad |= {"one item": [head], "three items": [*base, head]}
    return bad if zero_ok else {**bad, "zero": [0, *rest]}


def index_bad(out_of_range: int, negative_ok: bool = False) -> dict[str, Any]:
    """Bad values for a list of indices (the stages that get attention, global positions)."""
    bad = {
        "out of range": [out_of_range],
        "string": "0",
        "nested": [[0]],
        "fraction": [0.5],
        "bool": [True],
        "above int64": [2**64 + 1],
        "null": None,
        "scalar": 0,
        "mapping": {},
    }
    return bad if negative_ok else {**bad, "negative": [-1]}


BAD |= {
    "image size": list_bad([8, 8]),
    "block": list_bad([2, 2]),
    "memory": list_bad([2, 2], zero_ok=True),
    "widths 2": list_bad([32, 64]),
    "widths 3": list_bad([64, 64, 32]),
    "stages 2": index_bad(9),
    "blocks 3": index_bad(9),
    "positions": index_bad(10**6, negative_ok=True),
}

DMCA_ATTENTION = [{"kind": "block-local", "block": 256}, {"kind": "memory-compressed", "compression": 3}]
FIELDS: dict[str, list[tuple[str, str]]] = {  # variant -> (field path, type); "[i]" indexes a list of kinds
    "transformer-tiny": [
        ("vocab_size", "size"),
        ("tgt_vocab_size", "optional size"),
        ("d_model", "size"),
        ("n_heads", "size"),
        ("d_ff", "size"),
        ("max_len", "size"),
        ("pad_id", "count-size"),
        ("encoder.layers", "size"),
        ("decoder.layers", "size"),
        ("warmup_steps", "count"),
        ("positional.random_offset", "count-size"),
        ("dropout", "fraction"),
        ("positional.base", "positive float"),
        ("norm.eps", "positive float"),
        ("head.label_smoothing", "fraction"),
        ("encoder.attention.scale", "optional positive float"),
        ("share_embeddings", "bool"),
        ("scale_embeddings", "bool"),
        ("head.tie_weights", "bool"),
        ("final_norm", "optional bool"),
        ("norm_placement", "literal"),
        ("ffn.activation", "literal"),
        ("positional", "kind"),
        ("norm", "kind"),
        ("ffn", "kind"),
        ("head", "kind"),
        ("encoder", "kind"),
        ("decoder", "kind"),
        ("encoder.attention", "kinds"),
        ("decoder.cross_attention", "kind"),
    ],
    "bert-tiny": [
        ("vocab_size", "size"),
        ("d_model", "size"),
        ("n_heads", "size"),
        ("d_ff", "size"),
        ("max_len", "size"),
        ("type_vocab_size", "count-size"),
        ("encoder.layers", "size"),
        ("dropout", "fraction"),
        ("init_std", "positive float"),
        ("norm.eps", "positive float"),
        ("pooler", "optional bool"),
        ("positional", "kind"),
        ("head", "kind"),
        ("encoder.attention", "kinds"),
    ],
    "universal-transformer-tiny": [
        ("d_model", "size"),
        ("encoder.layers", "size"),
        ("decoder.layers", "size"),
        ("encoder.threshold", "fraction"),
        ("decoder.threshold", "fraction"),
        ("encoder.ponder_weight", "positive float"),
        ("encoder.halting_bias", "float"),
        ("decoder.halting_bias", "float"),
        ("encoder.act", "bool"),
        ("encoder", "kind"),
        ("positional.base", "positive float"),
    ],
    "universal-transformer-encoder-tiny": [
        ("encoder.layers", "size"),
        ("head.num_classes", "size"),
        ("head.pooling", "literal"),
        ("head", "kind"),
        ("encoder.threshold", "fraction"),
        ("encoder.halting_bias", "float"),
    ],
    "local-global-encoder-tiny": [
        ("max_len", "size"),
        ("encoder.attention.window", "positive"),
        ("encoder.attention.dilation", "positive"),
        ("encoder.attention.global_every", "count"),
        ("encoder.attention.global_positions", "positions"),
        ("encoder.attention.backend", "literal"),
        ("encoder.attention", "kinds"),
        ("head.num_classes", "size"),
        ("positional.random_offset", "count-size"),
    ],
    "transformer-dmca-tiny": [
        ("decoder.layers", "size"),
        ("decoder.attention", "kinds"),
        ("decoder.attention[0].block", "positive"),
        ("decoder.attention[1].compression", "positive"),
        ("max_len", "size"),
    ],
    "vit-tiny": [
        ("image_size", "image size"),
        ("channels", "size"),
        ("num_classes", "size"),
        ("patch", "size"),
        ("d_model", "size"),
        ("n_heads", "size"),
        ("d_ff", "size"),
        ("encoder.layers", "size"),
        ("dropout", "fraction"),
        ("norm.eps", "positive float"),
        ("positional", "literal"),
        ("pooling", "literal"),
        ("norm_placement", "literal"),
        ("encoder", "kind"),
        ("encoder.attention", "kinds"),
        ("norm", "kind"),
        ("ffn", "kind"),
    ],
    "image-transformer-tiny": [
        ("image_size", "image size"),
        ("channels", "size"),
        ("encoder.attention.query_block", "block"),
        ("encoder.attention.memory", "memory"),
        ("encoder.attention.backend", "literal"),
        ("encoder.layers", "size"),
    ],
    "sagan-classifier-tiny": [
        ("image_size", "image size"),
        ("channels", "size"),
        ("num_classes", "size"),
        ("widths", "widths 2"),
        ("attention_at", "stages 2"),
        ("reduction", "size"),
    ],
    "sagan-gan": [
        ("image_size", "image size"),
        ("channels", "size"),
        ("num_classes", "size"),
        ("noise_dim", "size"),
        ("generator_widths", "widths 3"),
        ("discriminator_widths", "widths 3"),
        ("generator_attention", "blocks 3"),
        ("discriminator_attention", "blocks 3"),
        ("reduction", "size"),
        ("generator_lr_scale", "positive float"),
        ("betas", "betas"),
    ],
}
LIST_TEMPLATES = {("transformer-dmca-tiny", "decoder.attention"): DMCA_ATTENTION}
ALWAYS = [  # the reproductions of known defects, in every sample
    ("transformer-tiny", "decoder.layers", "huge"),
    ("transformer-tiny", "norm", "kind as list"),
    ("transformer-tiny", "encoder.attention", "list"),
    ("vit-tiny", "image_size", "negative"),
    ("sagan-classifier-tiny", "widths", "negative"),
    ("transformer-tiny", "d_model", "above int64"),
    ("transformer-tiny", "norm.eps", "inf"),
    ("transformer-tiny", "positional.base", "nan"),
    ("universal-transformer-tiny", "encoder.halting_bias", "inf"),
    ("bert-tiny", "init_std", "nan"),
    ("transformer-tiny", "n_heads", "bool"),
    ("vit-tiny", "image_size", "zero"),
    ("sagan-classifier-tiny", "widths", "zero"),
    ("transformer-tiny", "vocab_size", "huge"),
]
STRUCTURE = [  # (case, config, names a clear message mentions)
    ("typo at the top level", {"variant": "transformer-tiny", "d_modle": 64}, ["d_modle"]),
    ("typo in a stack", {"variant": "transformer-tiny", "encoder": {"layerz": 2}}, ["layerz"]),
    ("stack option at the top level", {"variant": "transformer-tiny", "layers": 2}, ["layers"]),
    (
        "attention inside attention",
        {"variant": "transformer-tiny", "encoder": {"attention": {"attention": "sdpa"}}},
        ["attention"],
    ),
    ("option of another stack kind", {"variant": "transformer-tiny", "encoder": {"threshold": 0.5}}, ["threshold"]),
    ("option of another norm kind", {"variant": "transformer-tiny", "norm": {"momentum": 0.1}}, ["momentum"]),
    ("image field on a token model", {"variant": "transformer-tiny", "image_size": [8, 8]}, ["image_size"]),
    ("token field on an image model", {"variant": "vit-tiny", "vocab_size": 100}, ["vocab_size"]),
    ("variant as an int", {"variant": 5}, ["variant"]),
    ("variant as a list", {"variant": ["transformer-tiny"]}, ["variant"]),
    ("variant null", {"variant": None}, ["variant"]),
    ("variant misspelt", {"variant": "transformer-tinyy"}, ["variant"]),
    ("variant with a trailing space", {"variant": "transformer-tiny "}, ["variant"]),
    ("variant missing", {"d_model": 64}, ["variant"]),
    ("variant as a mapping", {"variant": {"name": "transformer-tiny"}}, ["variant"]),
    ("n_heads does not divide d_model", {"variant": "transformer-tiny", "n_heads": 3}, ["n_heads"]),
    ("pad_id = vocab_size", {"variant": "transformer-tiny", "pad_id": 1000}, ["pad_id"]),
    (
        "shared embeddings, two vocabularies",
        {"variant": "transformer-tiny", "tgt_vocab_size": 500},
        ["tgt_vocab_size", "share_embeddings"],
    ),
    (
        "no encoder and no decoder",
        {"variant": "transformer-tiny", "encoder": None, "decoder": None},
        ["encoder", "decoder"],
    ),
    (
        "ALiBi with local-global attention",
        {"variant": "local-global-encoder-tiny", "positional": "alibi"},
        ["positional", "alibi", "attention"],
    ),
    (
        "random offset with rotary positions",
        {"variant": "transformer-tiny", "positional": {"kind": "rotary", "random_offset": 8}},
        ["random_offset"],
    ),
    ("patch does not divide the image", {"variant": "vit-tiny", "patch": 3}, ["patch"]),
    ("reduction does not divide a width", {"variant": "sagan-classifier-tiny", "reduction": 7}, ["reduction"]),
    ("2-D sinusoids with d_model 62", {"variant": "image-transformer-tiny", "d_model": 62, "n_heads": 2}, ["d_model"]),
    (
        "local-2d attention on a token model",
        {"variant": "transformer-tiny", "encoder": {"attention": "local-2d"}},
        ["local-2d", "attention"],
    ),
    (
        "GAN generator widths of the wrong count",
        {"variant": "sagan-gan", "generator_widths": [64, 32]},
        ["generator_widths", "generator_attention", "image_size"],
    ),
]


def nested(variant: str, path: str, value: Any) -> dict[str, Any]:
    """``{"variant": v, "a": {"b": value}}`` for ``a.b``; ``a[i].b`` edits item i of the variant's list."""
    if match := re.fullmatch(r"(.+)\[(\d+)\]\.(\w+)", path):
        items = json.loads(json.dumps(LIST_TEMPLATES[(variant, match[1])]))
        items[int(match[2])][match[3]] = value
        path, value = match[1], items
    data: dict[str, Any] = {"variant": variant}
    node = data
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return data


def config_cases(seed: int, count: int) -> list[tuple[str, Any, list[str]]]:
    """``count`` cases of one bad field each, sampled from every (field, bad value) with ``seed``,
    the known reproductions always in; then the structural cases."""
    every = {
        (variant, path, label): value
        for variant, fields in FIELDS.items()
        for path, kind in fields
        for label, value in BAD[kind].items()
    }
    rest = [key for key in every if key not in ALWAYS]
    chosen = set(ALWAYS) | set(random.Random(seed).sample(rest, max(0, count - len(ALWAYS))))
    cases = []
    for variant, path, label in (key for key in every if key in chosen):  # in table order
        leaf = re.sub(r"\[\d+\]", "", path).split(".")[-1]
        names = [leaf, path] + (["kind"] if BAD.get(label) is None and "kind" in label else [])
        cases.append((f"{variant} {path}: {label}", nested(variant, path, every[(variant, path, label)]), names))
    return cases + [(name, data, names) for name, data, names in STRUCTURE]


# ---- 1. model configs, 1b. config files --------------------------------------------------------
def configs(ctx: Context) -> list[Result]:
    results = []
    for name, data, names in ctx.track(config_cases(ctx.seed, ctx.config_cases), "configs"):
        outcome, detail = refusal(ctx.sandbox.run("build", ("mapping", data), 2.0), names)
        results.append(Result("configs", name, outcome, detail))
    return results


TRAIN_BASE = {
    "model": {
        "variant": "transformer-tiny",
        "d_model": 32,
        "n_heads": 2,
        "d_ff": 64,
        "encoder": {"layers": 1},
        "decoder": {"layers": 1},
    },
    "task": {"kind": "reverse", "train_size": 64, "test_size": 8, "train_lengths": [1, 4], "test_lengths": [5, 6]},
    "steps": 2,
    "batch_size": 4,
    "warmup_steps": 1,
}


def files(ctx: Context) -> list[Result]:
    root = ctx.root / "files"
    root.mkdir()
    train_json = json.dumps(TRAIN_BASE)[1:-1]
    texts = {  # file name -> (text, names a clear message mentions)
        "dup-key.yaml": ("variant: transformer-tiny\nd_model: 64\nd_model: 32\n", ["d_model"]),
        "dup-key.json": ('{"variant": "transformer-tiny", "d_model": 64, "d_model": 32}', ["d_model"]),
        "dup-nested.yaml": ("variant: transformer-tiny\nencoder:\n  layers: 2\n  layers: 1\n", ["layers"]),
        "dup-train.yaml": (f"{{{train_json}}}\n".replace('"steps": 2', '"steps": 2, "steps": 3'), ["steps"]),
        "dup-train.json": (f'{{{train_json}, "seed": 1, "seed": 2}}', ["seed"]),
        "list.yaml": ("- variant: transformer-tiny\n", ["list.yaml"]),
        "null.yaml": ("null\n", ["null.yaml"]),
        "empty.yaml": ("", ["empty.yaml"]),
        "string.json": ('"transformer-tiny"', ["string.json"]),
        "bad-indent.yaml": ("variant: transformer-tiny\n  d_model: 64\n d_ff: 3\n", ["bad-indent.yaml"]),
        "truncated.json": ('{"variant": "transformer-tiny", "d_model": ', ["truncated.json"]),
    }
    cases: list[tuple[str, Callable[[], tuple[str, str]]]] = []
    for name, (text, names) in texts.items():
        (root / name).write_text(text)
        how = "train-file" if "train" in name else "file"
        cases.append(
            (
                f"file {name}",
                lambda p=root / name, h=how, n=names: refusal(ctx.sandbox.run("build", (h, str(p)), 5.0), n),
            )
        )
    (root / "binary.yaml").write_bytes(bytes(range(256)) * 4)
    cases.append(
        (
            "file binary.yaml",
            lambda: refusal(ctx.sandbox.run("build", ("file", str(root / "binary.yaml")), 5.0), ["binary.yaml"]),
        )
    )
    overrides = {  # --set items -> names
        "dropout=[0.1": ["dropout"],
        "norm={kind: [}": ["norm"],
        "=3": ["=3"],
        "encoder.layers": ["encoder.layers"],
        "encoder.attention=[]": ["attention"],
        "norm.eps=.nan": ["eps"],
        "n_heads=true": ["n_heads"],
        "d_model=99999999999999999999999": ["d_model"],
        "encoder=3": ["encoder"],
        "dropout.rate=0.1": ["dropout"],
    }
    for item, names in overrides.items():
        cases.append(
            (
                f"--set {item}",
                lambda i=item, n=names: refusal(
                    ctx.sandbox.run("build", ("overrides", "transformer-tiny", [i]), 2.0), n
                ),
            )
        )
    for item, names in {
        "decoder.layers=1000000000000": ["layers"],
        "dropout=[0.1": ["dropout"],
        "norm.eps=.inf": ["eps"],
    }.items():
        cases.append(
            (
                f"tzoo show --set {item}",
                lambda i=item, n=names: cli_refusal(cli(["show", "transformer-tiny", "--set", i], ctx.root, 30), n),
            )
        )
    for files_value in ("", []):
        config = {
            **TRAIN_BASE,
            "model": {**TRAIN_BASE["model"], "decoder": None},
            "task": {"kind": "language-modeling", "files": files_value, "vocab_size": 300, "max_len": 16},
        }
        run = str(ctx.root / f"files-{len(cases)}")
        cases.append(
            (
                f"text task files: {files_value!r}",
                lambda c=config, r=run: refusal(ctx.sandbox.run("train", (c, r), 30.0), ["files"]),
            )
        )
    return [Result("files", name, *check()) for name, check in ctx.track(cases, "files")]


# ---- 2. training configs ------------------------------------------------------------------------
GAN_BASE = {
    "model": {"variant": "sagan-gan"},
    "task": {"kind": "digits-generation"},
    "steps": 2,
    "batch_size": 4,
    "warmup_steps": 0,
}
TRAIN_CASES: list[tuple[str, dict[str, Any]]] = [  # (field, value) over TRAIN_BASE; "model.x"/"task.x" nest
    ("seed", 10**19),
    ("seed", 2**64 + 1),
    ("seed", "abc"),
    ("seed", 1.5),
    ("seed", True),
    ("seed", NAN),
    ("lr", INF),
    ("lr", NAN),
    ("lr", -1e-3),
    ("lr", 0),
    ("lr", "fast"),
    ("lr", True),
    ("lr", None),
    ("steps", -5),
    ("steps", 0),
    ("steps", 2.5),
    ("steps", 10**30),
    ("steps", True),
    ("steps", None),
    ("batch_size", 0),
    ("batch_size", -1),
    ("batch_size", 10**12),
    ("batch_size", 2.5),
    ("batch_size", True),
    ("warmup_steps", -1),
    ("warmup_steps", 2**64 + 1),
    ("warmup_steps", NAN),
    ("weight_decay", NAN),
    ("weight_decay", INF),
    ("weight_decay", -0.1),
    ("weight_decay", "x"),
    ("grad_clip", 0),
    ("grad_clip", NAN),
    ("grad_clip", -1.0),
    ("max_seconds", NAN),
    ("max_seconds", 0),
    ("max_seconds", -1),
    ("schedule", "linear"),
    ("schedule", 5),
    ("device", "tpu"),
    ("device", None),
    ("eval_every", -1),
    ("eval_every", 2**64 + 1),
    ("checkpoint_every", -1),
    ("checkpoint_every", 1.5),
    ("log_every", 0),
    ("log_every", -1),
    ("peak_tflops", NAN),
    ("peak_tflops", 0),
    ("bf16", "maybe"),
    ("compile", "maybe"),
    ("stepz", 3),
    ("model", 5),
    ("model", []),
    ("model", {}),
    ("model", "nope"),
    ("model", None),
    ("model.d_model", "x"),
    ("model.variant", "vit-tiny"),
    ("task", 5),
    ("task", []),
    ("task", "nope"),
    ("task", {"kind": "nope"}),
    ("task", {"kind": []}),
    ("task.train_size", 0),
    ("task.train_size", -1),
    ("task.train_lengths", [5, 1]),
    ("task.train_lengths", [0, 0]),
    ("task.train_lengths", "1-4"),
    ("task.symbols", 0),
    ("task.symbols", 1),
    ("task.test_size", 0),
    ("task.seed", 10**19),
]
GAN_CASES = [
    ("model.betas", [1.5, 0.9]),
    ("model.betas", [-0.1, 0.9]),
    ("model.betas", [0.0, 1.0]),
    ("model.betas", [NAN, 0.9]),
    ("model.betas", [INF, 0.9]),
    ("model.generator_lr_scale", INF),
]


def with_field(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(base))
    head, _, leaf = path.partition(".")
    if leaf:
        data[head][leaf] = value
    else:
        data[head] = value
    return data


def training(ctx: Context) -> list[Result]:
    cases: list[tuple[str, Callable[[], tuple[str, str]]]] = []
    for base, table, label in ((TRAIN_BASE, TRAIN_CASES, ""), (GAN_BASE, GAN_CASES, "sagan-gan ")):
        for path, value in table:
            run = str(ctx.root / "train" / str(len(cases)))
            names = [path.split(".")[-1]] + (["task"] if path.startswith("task") else [])
            data = with_field(base, path, value)
            cases.append(
                (
                    f"{label}{path}: {value!r}",
                    lambda d=data, r=run, n=names: refusal(ctx.sandbox.run("train", (d, r), 30.0), n),
                )
            )
    binary = ctx.root / "binary.txt"
    binary.write_bytes(bytes(range(256)) * 64)
    text_task = {
        **TRAIN_BASE,
        "model": {**TRAIN_BASE["model"], "decoder": None},
        "task": {"kind": "language-modeling", "files": str(binary), "vocab_size": 300, "max_len": 16},
    }
    cases.append(
        (
            "text task reading a binary file",
            lambda: refusal(
                ctx.sandbox.run("train", (text_task, str(ctx.root / "train" / "binary")), 30.0), ["files", "binary.txt"]
            ),
        )
    )
    config = ctx.root / "small.json"
    (ctx.root / "a-file").write_text("")
    cases.append(
        (
            "tzoo train --out an existing file",
            lambda: cli_refusal(
                cli(["train", str(config), "--out", str(ctx.root / "a-file"), "--json"], ctx.root, 120),
                ["a-file", "--out"],
            ),
        )
    )
    return [Result("training", name, *check()) for name, check in ctx.track(cases, "training")]
