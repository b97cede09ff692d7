"""The quick start of docs/writing-a-plugin.md works as printed.

Its two plugin files are examples/plugins/ (the page shows each whole, each under 60 lines): the
sigmoid attention kind equals its formula written out and decodes on the cache as without it,
the parity task labels its strings and trains, the page's Python block runs, and its commands
run in a folder holding the files (the tzoo command looks for a --plugin module there).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask
from transformer_zoo.core.decoding import greedy_decode
from transformer_zoo.registry import get_registry
from transformer_zoo.training.config import load_train_config
from transformer_zoo.training.trainer import train

ROOT = Path(__file__).parents[2]
FOLDER = ROOT / "examples" / "plugins"
PAGE = (ROOT / "docs" / "writing-a-plugin.md").read_text()
FILES = ("sigmoid_attention.py", "parity.py")
SIZES = dict(vocab_size=50, d_model=32, n_heads=4, d_ff=64, dropout=0.0)


def block(title: str, language: str = "python") -> str:
    (code,) = re.findall(rf'```{language} title="{re.escape(title)}"\n(.*?)```', PAGE, re.S)
    return code


@pytest.fixture
def plugins(monkeypatch):
    """The quick start's modules, importable and registered in-process; removed afterwards."""
    monkeypatch.syspath_prepend(str(FOLDER))
    import parity  # type: ignore[import-not-found]
    import sigmoid_attention  # type: ignore[import-not-found]

    names = [tz.register_plugin(sigmoid_attention), tz.register_plugin(parity)]
    yield sigmoid_attention, parity
    for name in names:
        if get_registry().pm.has_plugin(name):
            get_registry().unregister(name)
    for module in ("sigmoid_attention", "parity"):
        sys.modules.pop(module, None)


@pytest.mark.parametrize("name", FILES)
def test_the_page_shows_each_file_whole_and_each_is_under_60_lines(name):
    shipped = (FOLDER / name).read_text()
    assert block(name) == shipped, f"docs/writing-a-plugin.md shows another {name} than examples/plugins/ ships"
    assert len(shipped.splitlines()) < 60


def reference(q, k, v, allowed):
    """Sigmoid attention written out, query by query: each weight sigmoid(q.k / sqrt(d) - log n), n the
    keys the query sees."""
    b, h, tq, d = q.shape
    out = torch.zeros_like(q)
    for i in range(tq):
        for bi in range(b):
            seen = allowed[bi, i].nonzero().squeeze(1)
            if len(seen):
                scores = torch.einsum("hd,hnd->hn", q[bi, :, i], k[bi, :, seen]) / math.sqrt(d)
                out[bi, :, i] = torch.einsum("hn,hnd->hd", torch.sigmoid(scores - math.log(len(seen))), v[bi, :, seen])
    return out


def test_sigmoid_attention_equals_its_formula_written_out(plugins):
    kernel = plugins[0].sigmoid_attention
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    padding = torch.ones(2, 6, dtype=torch.bool)
    padding[1, 4:] = False
    for mask in (AttentionMask(), AttentionMask(causal=True), AttentionMask(padding=padding, causal=True)):
        allowed = mask.dense(6, 6)
        allowed = torch.ones(2, 6, 6, dtype=torch.bool) if allowed is None else allowed.expand(2, 1, 6, 6)[:, 0]
        out, weights = kernel(q, k, v, mask, None, 0.0, True)
        torch.testing.assert_close(out, reference(q, k, v, allowed), atol=1e-5, rtol=1e-5)
        assert weights.shape == (2, 4, 6, 6) and not weights[~allowed[:, None].expand_as(weights)].any()
    everything_padded = AttentionMask(padding=torch.zeros(2, 6, dtype=torch.bool))
    assert not kernel(q, k, v, everything_padded, None, 0.0, False)[0].any(), "no key to see: zeros, not NaN"


def test_sigmoid_attention_builds_runs_and_decodes_on_the_cache(plugins):
    model = tz.build_model(
        "transformer-tiny", encoder={"attention": "sigmoid"}, decoder={"attention": "sigmoid"}, **SIZES
    ).eval()
    assert model.encoder.layers[0].self_attn.kernel is plugins[0].sigmoid_attention
    src, tgt = torch.randint(3, 50, (2, 7)), torch.randint(3, 50, (2, 5))
    logits = model(src, tgt).logits
    assert logits.shape == (2, 5, 50) and logits.isfinite().all()
    lm = tz.build_model("transformer-tiny", encoder=None, decoder={"attention": "sigmoid"}, **SIZES).eval()
    prompt = torch.randint(3, 50, (2, 6))
    fast = greedy_decode(lm, prompt=prompt, max_new_tokens=6)
    assert torch.equal(fast, greedy_decode(lm, prompt=prompt, max_new_tokens=6, use_cache=False))
    with torch.no_grad():  # a later token changes no earlier output
        changed = prompt.clone()
        changed[:, -1] = (changed[:, -1] + 1 - 3) % 47 + 3
        torch.testing.assert_close(lm(prompt).logits[:, :-1], lm(changed).logits[:, :-1])


def test_the_parity_task_labels_its_strings_by_its_seed_and_trains(plugins, tmp_path):
    options = get_registry().component("task", "parity")
    task = options(length=9, train_size=40, test_size=20, seed=3).build()
    rows = task.dataset("train")
    assert all(label == sum(bit - 3 for bit in src) % 2 for src, label in zip(rows["src"], rows["label"]))
    assert all(len(src) == 9 and set(src) <= {3, 4} for src in rows["src"])
    assert rows["src"] == options(length=9, train_size=40, test_size=20, seed=3).build().dataset("train")["src"]
    assert rows["src"] != options(length=9, train_size=40, test_size=20, seed=4).build().dataset("train")["src"]
    assert task.dataset("test")["src"] != rows["src"][:20], "each split its own strings"
    config = load_train_config(
        {
            "model": {"variant": "transformer-tiny", "d_model": 32, "n_heads": 2, "d_ff": 64},
            "task": {"kind": "parity", "train_size": 40, "test_size": 20},
            "steps": 2,
            "batch_size": 4,
        }
    )
    summary = train(config, tmp_path, progress=False)
    assert set(summary["metrics"]["test"]) == {"accuracy"}


def test_the_pages_python_block_runs(plugins):
    namespace: dict = {}
    exec(compile(block("in Python"), "in Python", "exec"), namespace)  # registering again changes nothing
    assert namespace["logits"].shape == (2, 5, 1000)


def test_the_pages_commands_run_in_the_folder_holding_the_files(plugins, tmp_path, capsys):
    """The train command in a fresh tzoo process, in a folder holding the files (the console script
    looks for --plugin modules there); the show command in this one, where they are registered."""
    from transformer_zoo.cli import main

    for name in FILES:
        shutil.copy(FOLDER / name, tmp_path)
    (tmp_path / "parity.yaml").write_text(block("parity.yaml", "yaml"))
    train_command, show_command = (
        shlex.split(line) for line in block("in the folder holding the files", "bash").splitlines()
    )
    assert train_command[0] == show_command[0] == "tzoo"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TZOO_PLUGINS")}
    env["OMP_NUM_THREADS"] = "1"
    quick = ["--set", "steps=2", "--set", "task.train_size=40", "--set", "task.test_size=20", "--json"]
    trained = subprocess.run(
        [str(Path(sys.executable).with_name("tzoo")), *train_command[1:], *quick],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert trained.returncode == 0, trained.stderr
    assert set(json.loads(trained.stdout)["metrics"]["test"]) == {"accuracy"}
    assert main(show_command[1:]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"kernel\s+kernel\s+sigmoid_attention\(\)\s+sigmoid_attention\.py", shown), shown
