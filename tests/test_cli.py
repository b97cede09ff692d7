"""The tzoo command line: data commands, --json, and one-line errors."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.cli import main


def run_json(capsys, *argv: str):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_list_variants_and_kinds(capsys):
    rows = run_json(capsys, "list")
    assert {"transformer", "transformer-tiny", "transformer-base", "transformer-big"} <= {r["name"] for r in rows}
    assert run_json(capsys, "list", "transformer-b*") == [r for r in rows if r["name"].startswith("transformer-b")]
    norms = {r["name"] for r in run_json(capsys, "list", "--kind", "norm")}
    assert norms >= {"layernorm", "rmsnorm", "batchnorm"}
    assert main(["list", "--kind", "positional"]) == 0
    assert "rotary" in capsys.readouterr().out


def test_show_resolves_config_and_counts_parameters(capsys):
    shown = run_json(capsys, "show", "transformer-tiny", "--set", "encoder.layers=3")
    assert shown["config"]["encoder"]["layers"] == 3
    import transformer_zoo as tz

    model = tz.build_model("transformer-tiny", encoder={"layers": 3})
    assert shown["parameters"] == sum(p.numel() for p in model.parameters())
    assert main(["show", "transformer-base"]) == 0
    text = capsys.readouterr().out
    assert "d_model: 512" in text and "# parameters: 6" in text  # 63M: embeddings shared, generator tied


def test_show_reads_config_files(capsys, tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("variant: transformer-tiny\nd_model: 32\n")
    assert run_json(capsys, "show", str(path))["config"]["d_model"] == 32


def test_schema_lists_variants_and_component_kinds(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    (branch,) = [b for b in schema["oneOf"] if "transformer-tiny" in b["properties"]["variant"]["enum"]]
    norm_kinds = {o["properties"]["kind"]["const"] for o in branch["properties"]["norm"]["anyOf"] if "properties" in o}
    assert norm_kinds >= {"layernorm", "rmsnorm", "batchnorm"}
    assert "description" in branch["properties"]["d_model"]


def test_schema_accepts_what_load_config_accepts_and_only_that(capsys):
    import jsonschema

    assert main(["schema"]) == 0
    validator = jsonschema.Draft202012Validator(json.loads(capsys.readouterr().out))
    resolved = run_json(capsys, "show", "transformer-tiny")["config"]
    validator.validate(resolved)
    validator.validate({"variant": "transformer-tiny", "norm": "rmsnorm", "encoder": {"layers": 1}})
    validator.validate({"variant": "transformer-tiny", "norm": {"kind": "rmsnorm", "eps": 1e-5}})
    for bad in (
        {"variant": "transformer-tiny", "norm": {"kind": "rmsnorm", "momentum": 0.1}},
        {"variant": "transformer-tiny", "encoder": {"lyers": 1}},
        {"variant": "transformer-tiny", "norm": "groupnorm"},
        {"variant": "no-such-variant"},
    ):
        assert not validator.is_valid(bad), bad


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["show", "transfomer-tiny"], "did you mean 'transformer-tiny'"),
        (["show", "transformer-tiny", "--set", "encoder.lyers=2"], "unknown key 'lyers'"),
        (["show", "transformer-tiny", "--set", "n_heads=3"], "does not divide d_model=64"),
        (["show", "transformer-tiny", "--set", "d_model=wide"], "d_model: Input should be a valid integer"),
        (["show", "missing.yaml"], "does not exist"),
        (["list", "--kind", "norm", "*"], None),
    ],
)
def test_errors_are_one_clear_message(capsys, argv, message):
    code = main(argv)
    err = capsys.readouterr().err
    if message is None:
        assert code == 0
        return
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_console_script_reports_errors_without_traceback():
    result = subprocess.run(
        [sys.executable, "-m", "transformer_zoo", "show", "transformer-tiny", "--set", "norm=groupnorm"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "unknown norm kind 'groupnorm'" in result.stderr
    assert "Traceback" not in result.stderr


def test_bench_lists_the_benchmarks_and_runs_one_with_a_json_record(tmp_path, capsys):
    from benchmarks import BENCHMARKS

    assert main(["bench", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [row["benchmark"] for row in listed] == list(BENCHMARKS)
    out = tmp_path / "decoding.json"
    assert (
        main(
            [
                "bench",
                "decoding",
                "--new-tokens",
                "8",
                "--d-model",
                "32",
                "--layers",
                "1",
                "--repeats",
                "1",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    assert "speed-up" in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record["machine"]["torch"] and record["speedup"] > 0 and record["args"]["new_tokens"] == 8
    assert main(["bench", "nope"]) == 2
    assert "no benchmark 'nope'; benchmarks: transformer, bert" in capsys.readouterr().err


def test_the_checkpoint_digests_benchmark_measures_both_against_their_references(tmp_path, capsys):
    out = tmp_path / "digests.json"
    assert main(["bench", "checkpoint-digests", "--variant", "bert-tiny", "--repeats", "1", "--json", str(out)]) == 0
    assert "verify the digests" in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record["bytes"] > 3 * 4 * sum(
        p.numel() for p in tz.build_model("bert-tiny").parameters()
    )  # weights, 2 moments
    assert record["verify_over_read"] > 0 and 0 < record["seal_over_write"] < 1


def test_bench_loads_the_checkouts_benchmarks_and_never_a_folder_of_the_working_directory(
    tmp_path, monkeypatch, capsys
):
    from pathlib import Path

    checkout = Path(__file__).resolve().parent.parent
    marker = tmp_path / "imported"
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\nBENCHMARKS = {{}}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path, str(checkout)])  # as python -m puts the folder first
    for name in [name for name in sys.modules if name == "benchmarks" or name.startswith("benchmarks.")]:
        monkeypatch.delitem(sys.modules, name)
    assert main(["bench", "--json"]) == 0
    listed = [row["benchmark"] for row in json.loads(capsys.readouterr().out)]
    assert not marker.exists(), "the working folder's benchmarks/ was imported"
    assert "transformer" in listed
    assert Path(sys.modules["benchmarks"].__file__) == checkout / "benchmarks" / "__init__.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_a_benchmark_asked_for_cuda_without_it_says_so(capsys):
    assert main(["bench", "decoding", "--device", "cuda", "--new-tokens", "2", "--d-model", "8", "--layers", "1"]) == 2
    assert "device 'cuda' was asked for but no CUDA device is available" in capsys.readouterr().err


def test_every_benchmark_module_is_listed():
    from pathlib import Path

    from benchmarks import BENCHMARKS

    modules = {p.stem for p in (Path(__file__).parent.parent / "benchmarks").glob("*.py")} | {"robustness"}
    assert modules - {"__init__", "__main__", "common"} == {bench.module for bench in BENCHMARKS.values()}


def test_the_benchmarks_commands_in_docstrings_run_as_modules():
    """``python benchmarks/X.py`` fails on the package's relative imports; ``python -m benchmarks.X``
    runs X, which then needs a main guard."""
    from pathlib import Path

    root = Path(__file__).parent.parent
    sources = [*(root / "benchmarks").glob("*.py"), root / "core" / "local_attention.py"]
    assert not [p.name for p in sources if "python benchmarks/" in p.read_text()]
    for name in {m for p in sources for m in re.findall(r"python -m benchmarks\.([a-z_]+)", p.read_text())}:
        assert 'if __name__ == "__main__":' in (root / "benchmarks" / f"{name}.py").read_text(), name
    ran = subprocess.run(  # run as __main__, a benchmark still finds its name
        [sys.executable, "-m", "benchmarks.dense_threshold", "--help"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0 and ran.stdout.startswith("usage: tzoo bench dense-threshold"), ran.stderr


@pytest.mark.parametrize(
    "name",
    [
        "transformer",
        "bert",
        "decoding",
        "robustness",
        "startup",
        "attention-kernels",
        "mfu",
        "contention",
        "dense-threshold",
        "throughput",
        "ut-act",
        "sagan-gan",
    ],
)
def test_a_benchmarks_help_names_it_and_explains_every_option(name, capsys):
    import importlib

    from benchmarks import BENCHMARKS

    module = importlib.import_module(f"benchmarks.{BENCHMARKS[name].module}")
    parser = module.build_parser()
    assert parser.prog == f"tzoo bench {name}" and parser.description == module.__doc__
    unexplained = [a.option_strings[0] for a in parser._actions if not a.help]
    assert unexplained == [], f"options without help: {unexplained}"
    with pytest.raises(SystemExit):
        main(["bench", name, "--help"])
    text = capsys.readouterr().out
    assert text.startswith(f"usage: tzoo bench {name}") and module.__doc__.split("\n\n")[0] in text
    assert all(
        f"(default: {a.default})" in " ".join(text.split())
        for a in parser._actions
        if a.default not in (None, False, argparse.SUPPRESS) and "default" not in a.help
    )


def test_ctrl_c_outside_training_is_one_line_and_exit_130(capsys, monkeypatch):
    import transformer_zoo.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_list", interrupted)
    assert main(["list"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"


def test_errors_and_zoo_warnings_print_brackets_as_written(capsys, monkeypatch):
    import warnings

    import transformer_zoo.cli as cli
    from transformer_zoo.training.run_folder import CheckpointWarning

    def warn_then_fail(args):
        warnings.warn("a shape [bold] of [64, 32]", CheckpointWarning, stacklevel=2)
        raise ValueError("phases ['model'] and [red]")

    monkeypatch.setattr(cli, "_list", warn_then_fail)
    assert main(["list"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "warning: a shape [bold] of [64, 32]",
        "error: phases ['model'] and [red]",
    ]


def test_a_folder_given_as_a_config_is_called_a_folder(capsys, tmp_path):
    assert main(["train", str(tmp_path)]) == 2
    assert "is a folder; give a YAML or JSON file" in capsys.readouterr().err
    assert main(["show", str(tmp_path)]) == 2
    assert "is a folder; give a YAML or JSON file, or a variant name" in capsys.readouterr().err


def test_a_yaml_error_names_the_file_and_line(capsys, tmp_path):
    (tmp_path / "bad.yaml").write_text("variant: transformer-tiny\n  d_model: 64\n d_ff: 3\n")
    assert main(["show", str(tmp_path / "bad.yaml")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f'in "{tmp_path / "bad.yaml"}", line 2' in err and "<unicode string>" not in err


def test_an_unknown_name_lists_every_registered_name(capsys):
    import transformer_zoo as tz

    assert main(["show", "transformer-smal"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert len(tz.list_variants()) > 20
    assert all(name in err for name in tz.list_variants()) and "..." not in err


def test_version_is_the_installed_packages(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"tzoo {version('transformer-zoo')}"


@pytest.mark.parametrize("width", [60, 80, 200])
@pytest.mark.parametrize("kind", ["variant", "attention", "task"])
def test_list_on_a_terminal_fits_its_width_and_shows_every_name_whole(capsys, monkeypatch, width, kind):
    import re

    from transformer_zoo.registry import get_registry

    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: stdout is a terminal
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setenv("NO_COLOR", "1")
    assert main(["list", "--kind", kind]) == 0
    text = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # styles (bold, dim) are not text
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= width
    names = get_registry().variants() if kind == "variant" else list(get_registry().components(kind))
    words = set(text.split())
    assert all(name in words for name in names), "a name was cut or folded"
    assert "``" not in text and "…" not in text


def test_list_piped_prints_one_plain_row_per_name(capsys):
    import transformer_zoo as tz

    assert main(["list"]) == 0  # captured: not a terminal
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "family", "plugin", "description"]
    assert [line.split()[0] for line in lines[1:]] == tz.list_variants()


def test_the_benchmark_list_says_how_long_each_takes(capsys):
    assert main(["bench", "--json"]) == 0
    assert all(
        re.fullmatch(r"(about|over) [0-9.]+ (s|min)", row["takes"]) for row in json.loads(capsys.readouterr().out)
    )


def test_list_tasks_shows_one_task_per_job(capsys):
    names = [row["name"] for row in run_json(capsys, "list", "--kind", "task")]
    assert len(names) == len(set(names))
    assert {"language-modeling", "seq2seq", "text-mlm", "text-classification"} <= set(names)


def test_an_unknown_kind_says_how_to_load_a_plugin(capsys):
    assert main(["show", "transformer-tiny", "--set", "norm=scalenorm"]) == 2
    err = capsys.readouterr().err
    assert "unknown norm kind 'scalenorm'" in err
    assert "--plugin MODULE (or TZOO_PLUGINS=MODULE)" in " ".join(err.split())


def _tree(text: str) -> list[str]:
    """The module tree of ``tzoo show --modules``: its lines, without the parameter count."""
    return [line for line in text.splitlines() if line.strip() and not line.startswith("# parameters")]


def test_show_modules_names_the_kind_class_and_file_of_every_module(capsys):
    assert main(["show", "transformer-base", "--modules"]) == 0
    lines = _tree(capsys.readouterr().out)
    assert lines[0].split() == ["transformer-base", "model", "EncoderDecoder", "core/model.py"]
    no_file = [line for line in lines if not re.search(r"\s[\w/]+\.py(\s|$)", line)]
    assert not no_file, f"lines without a file: {no_file}"
    text = "\n".join(lines)
    for shown in (
        r"self_attn\s+attention\s+MultiHeadAttention\s+core/attention\.py",
        r"kernel\s+kernel\s+sdpa_kernel\(\)\s+core/attention\.py",
        r"layers\.0-5\s+layer\s+TransformerLayer\s+core/layers\.py\s+\(x6\)",
        r"ffn\s+ffn\s+FeedForward\s+core/layers\.py",
        r"positional\s+positional\s+SinusoidalPositional\s+core/embedding\.py",
        r"token\s+embedding\s+Embedding\s+torch/nn/modules/sparse\.py\s+\(the same module as src_embed\.token\)",
        r"proj\s+linear\s+Linear\s+torch/nn/modules/linear\.py\s+\(weight tied to src_embed\.token\.weight\)",
        r"head\s+head\s+LMHead\s+core/model\.py",
    ):
        assert re.search(shown, text), f"{shown!r} not in:\n{text}"
    assert len(lines) < 60, "six alike layers are one line each side"


@pytest.mark.parametrize("variant", ["gpt2-tiny", "llama-tiny", "qwen3-tiny", "gemma2-tiny", "olmo2-tiny"])
def test_show_modules_maps_every_module_of_a_decoder_only_lm_to_its_file(variant, capsys):
    assert main(["show", variant, "--modules"]) == 0
    lines = _tree(capsys.readouterr().out)
    no_file = [line for line in lines if not re.search(r"\s[\w/]+\.py(\s|$)", line)]
    assert not no_file, f"lines without a file: {no_file}"
    assert lines[0].split() == [variant, "model", "EncoderDecoder", "core/model.py"]


def test_show_modules_as_json_is_a_tree_with_a_file_at_every_node(capsys):
    shown = run_json(capsys, "show", "bert-tiny", "--modules")
    assert shown["config"]["variant"] == "bert-tiny" and shown["parameters"] > 0

    def nodes(node):
        yield node
        for child in node.get("children", []):
            yield from nodes(child)

    every = list(nodes(shown["modules"]))
    assert all(node["file"].endswith(".py") and node["kind"] and node["class"] for node in every)
    assert (shown["modules"]["class"], shown["modules"]["file"]) == ("Bert", "plugins/bert/__init__.py")
    kinds = {node["kind"] for node in every}
    assert {"model", "embedding", "positional", "stack", "layer", "attention", "kernel", "norm", "ffn", "head"} <= kinds


@pytest.mark.parametrize("variant", ["transformer-base", "bert-base"])
def test_the_anatomy_page_shows_the_tree_show_prints(variant, capsys):
    """docs/concepts.md's trees are the command's output, so that they cannot drift from the code."""
    from pathlib import Path

    page = (Path(__file__).parents[1] / "docs" / "concepts.md").read_text()
    (block,) = re.findall(rf'```text title="tzoo show {variant} --modules"\n(.*?)```', page, re.S)
    assert main(["show", variant, "--modules"]) == 0
    assert block == capsys.readouterr().out, f"regenerate the page's tree with: tzoo show {variant} --modules"


def test_plugin_finds_a_module_file_in_the_current_folder(tmp_path):
    """The console script puts the current folder on the path for --plugin and TZOO_PLUGINS (python -m
    does by itself); a module installed elsewhere still wins over a file of the same name there."""
    import os
    from pathlib import Path

    (tmp_path / "here_plugin.py").write_text(
        "import tabnanny  # the standard library's, not the file beside this one\n"
        "from typing import Literal\n\nfrom torch import nn\n\nfrom transformer_zoo import hookimpl\n"
        "from transformer_zoo.core.options import NormOptions\n\n\n"
        "class HereNorm(NormOptions):\n"
        '    """A norm kind from a file in the current folder."""\n\n'
        '    kind: Literal["herenorm"] = "herenorm"\n\n'
        "    def build(self, *, d_model: int) -> nn.Module:\n"
        "        return nn.LayerNorm(d_model)\n\n\n"
        "@hookimpl\ndef tzoo_components():\n    return [HereNorm]\n"
    )
    (tmp_path / "tabnanny.py").write_text("raise RuntimeError('a file in the folder hid an installed module')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TZOO_PLUGINS")}
    env["OMP_NUM_THREADS"] = "1"
    tzoo = Path(sys.executable).with_name("tzoo")
    result = subprocess.run(
        [str(tzoo), "--plugin", "here_plugin", "list", "--kind", "norm", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row["plugin"] for row in json.loads(result.stdout)}
    assert rows["herenorm"] == "here_plugin" and rows["layernorm"] == "tzoo.components"


def test_the_schema_accepts_a_saved_config_json(capsys, tmp_path):
    import jsonschema

    import transformer_zoo as tz

    assert main(["schema"]) == 0
    validator = jsonschema.Draft202012Validator(json.loads(capsys.readouterr().out))
    folder = tz.build_model("transformer-tiny").save_pretrained(tmp_path / "model")
    saved = json.loads((folder / "config.json").read_text())
    validator.validate(saved)
    assert not validator.is_valid({**saved, "format": saved["format"] + 1})
