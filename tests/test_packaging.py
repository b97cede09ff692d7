"""The package as users install and start it: a fast start that imports only what a command
needs, and a wheel that carries its data, declares what it imports and runs without the dev
extra."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from benchmarks.startup import HEAVY
from transformer_zoo.cli import KINDS
from transformer_zoo.core.options import CATEGORIES

ROOT = Path(__file__).parents[1]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "transformer_zoo", "core", "plugins", "registry")


def _imported_after(code: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> list[str]:
    """Which of the heavy packages a fresh interpreter has imported once ``code`` ran."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["compare", "--help"], ["train", "--help"]])
def test_help_and_version_start_without_torch(argv):
    code = f"from transformer_zoo.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit as e:\n    assert e.code == 0"
    assert _imported_after(code) == []


def test_the_registry_loads_without_the_optional_packages():
    """Listing every variant and kind (``tzoo list``, ``tzoo schema``) needs torch and nothing heavier."""
    code = (
        "from transformer_zoo.cli import main\n"
        "assert main(['list', '--json']) == 0\nassert main(['list', '--kind', 'task', '--json']) == 0\n"
        "assert main(['schema']) == 0"
    )
    assert _imported_after(code) == ["torch"]


def test_a_comparisons_worker_starts_without_statistics_plots_or_sharding():
    """A worker (a local worker process, a Ray task, a torchrun process) imports what trains a run:
    not scipy (the statistics are the comparison's), not matplotlib (imported where a run draws),
    and not torch's sharded checkpoints and tensors (imported by sharded training)."""
    from benchmarks.startup import WORKER

    sharded = ("torch.distributed.checkpoint", "torch.distributed.tensor")
    code = f"{WORKER}\nimport sys\nfound = [m for m in {sharded!r} if m in sys.modules]\nassert not found, found"
    assert _imported_after(code) == ["torch"]


def test_the_parsers_kinds_are_the_registrys_categories():
    assert KINDS == ("variant", *CATEGORIES)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package built as a wheel (from a copy of the sources, so that no build/ lands in the checkout)."""
    work = tmp_path_factory.mktemp("wheel")
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, work / "src" / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            (work / "src").mkdir(exist_ok=True)
            shutil.copy(source, work / "src" / name)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--wheel-dir",
            str(work / "dist"),
            str(work / "src"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout}\n{done.stderr}"
    (path,) = (work / "dist").glob("transformer_zoo-*.whl")
    return path


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(name).decode()


def test_the_wheel_carries_its_data_and_licence(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in (
        "transformer_zoo/py.typed",
        "transformer_zoo/specs/default.yaml",
        "transformer_zoo/plugins/tasks/digits.safetensors",
        "transformer_zoo/plugins/tasks/digits_classifier.safetensors",
        "transformer_zoo/registry/manager.py",
        "transformer_zoo/training/trainer.py",
        "transformer_zoo/comparing/records.py",
    ):
        assert path in names, f"{path} is missing from the wheel"
    assert any(n.startswith("transformer_zoo/studies/") and n.endswith(".yaml") for n in names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    folders = {"transformer_zoo": "transformer_zoo", "core": "transformer_zoo/core"}
    folders |= {"registry": "transformer_zoo/registry", "plugins": "transformer_zoo/plugins"}
    for folder, installed in folders.items():  # every module of every package, sub-packages too
        for module in (ROOT / folder).rglob("*.py"):
            path = f"{installed}/{module.relative_to(ROOT / folder).as_posix()}"
            assert path in names, f"{path} is missing from the wheel (is its package in pyproject.toml?)"
    metadata = _metadata(wheel)
    assert "License-Expression: Apache-2.0" in metadata


def test_the_wheel_carries_no_benchmark_or_audit_code(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = [n for n in names if "bench" in n or "robustness" in n]
    assert not shipped, f"benchmark or audit code in the wheel: {shipped}"
    assert not any(n.startswith("benchmarks/") for n in names)


def _requirement_names(metadata: str) -> tuple[set[str], set[str]]:
    """The runtime requirements' names and the extras' names, normalised."""
    runtime, extras = set(), set()
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:"):
            name = re.split(r"[ ;<>=!~\[]", line.split(":", 1)[1].strip())[0]
            (extras if "extra ==" in line else runtime).add(re.sub(r"[-_.]+", "-", name).lower())
    return runtime, extras


def test_the_wheel_declares_every_package_it_imports_and_not_scikit_learn(wheel):
    runtime, extras = _requirement_names(_metadata(wheel))
    assert "scikit-learn" not in runtime  # only the tests read sklearn's digits, to check the package's copy
    assert {"tokenizers", "sacrebleu"} <= extras - runtime  # the text extra
    assert {"ray", "tensorboard"} <= extras - runtime  # the executor ray; TensorBoard files where installed
    assert "optuna" in extras - runtime  # tune: in a compare spec
    runtime |= {"tokenizers", "sacrebleu"}  # imported where a text task is built, through core.errors.optional
    stdlib = set(sys.stdlib_module_names)
    distributions = importlib.metadata.packages_distributions()
    provided = {"pydantic_core": "pydantic"}  # pydantic pins its core exactly; pydantic's docs import it directly
    undeclared = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if not name.endswith(".py"):
                continue
            for node in ast.walk(ast.parse(archive.read(name))):
                modules = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module]
                    if isinstance(node, ast.ImportFrom) and node.level == 0
                    else []
                )
                for module in modules:
                    top = module.split(".")[0]
                    if top in stdlib or top == "transformer_zoo":
                        continue
                    dists = {
                        re.sub(r"[-_.]+", "-", d).lower()
                        for d in ([provided[top]] if top in provided else distributions.get(top, [top]))
                    }
                    if not dists & runtime:
                        undeclared.setdefault(top, name)
    assert undeclared == {}, f"imported but not declared (module: a file importing it): {undeclared}"


def test_the_installed_wheel_runs_without_scikit_learn(wheel, tmp_path):
    """Installed on its own (its dependencies are this environment's), with scikit-learn hidden: the
    command line starts, and the digits load from the package data."""
    target = tmp_path / "site"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    env = {**os.environ, "PYTHONPATH": str(target)}  # found before the editable install of the checkout
    code = (
        "import sys\nsys.modules['sklearn'] = None  # any import of scikit-learn fails\n"
        "import transformer_zoo\n"
        f"assert transformer_zoo.__file__.startswith({str(target)!r}), transformer_zoo.__file__\n"
        "from transformer_zoo.cli import main\n"
        "try:\n    main(['compare', '--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "from transformer_zoo.plugins.tasks.digits import load_digits\n"
        "images, labels = load_digits()\nassert tuple(images.shape) == (1797, 8, 8) and len(labels) == 1797\n"
    )
    _imported_after(code, env=env, cwd=tmp_path)


def test_a_text_task_without_the_text_extra_says_how_to_install_it(monkeypatch, tmp_path):
    from transformer_zoo.core.errors import ConfigError
    from transformer_zoo.registry import get_registry

    (tmp_path / "a.txt").write_text("some words to read\n" * 20)
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "sacrebleu", None)
    with pytest.raises(
        ConfigError,
        match=r"the language-modeling task \(its tokenizer\) needs tokenizers, which is not "
        r"installed; install it with pip install 'transformer-zoo\[text\]'",
    ):
        get_registry().component("task", "language-modeling")(files=str(tmp_path / "a.txt")).build()
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a b\tc d\n" * 20)
    with pytest.raises(ConfigError, match=r"the seq2seq task \(its BLEU\) needs sacrebleu"):
        get_registry().component("task", "seq2seq")(files=str(pairs)).build()
