"""Every example of the README and the docs runs, as docs_pages.py says how.

Each page runs in a fresh folder of its own. Every fenced block of every page is one of: run by
this runner; run by a named test of its own (the tables below); not an example at all (a
formula, a diagram, a signature: the table below); or marked on the page, visibly, as not run,
with the reason. A new block that is none of these fails :func:`test_every_block_is_run_or_marked`.
"""

from __future__ import annotations

import importlib
import io
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pytest
import torch
from docs_pages import ROOT, Block, blocks, checked, fresh_folder, matches, run_block

from transformer_zoo import hookimpl
from transformer_zoo.core.errors import DuplicateNameError, PluginLoadError
from transformer_zoo.core.options import PositionalOptions, Variant
from transformer_zoo.plugins.transformer import TINY, TransformerConfig
from transformer_zoo.registry import get_registry

QUICKSTART = "tests/examples/test_plugin_quickstart.py"
PACKAGE = "tests/examples/test_plugin_package.py"
PAGES = ["README.md", *sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs").rglob("*.md"))]

DEDICATED: dict[str, dict[str, str]] = {  # page: {block key (its title, or its first line's start): the test}
    "docs/concepts.md": {
        "tzoo show transformer-base --modules": "tests/test_cli.py::test_the_anatomy_page_shows_the_tree_show_prints",
        "tzoo show bert-base --modules": "tests/test_cli.py::test_the_anatomy_page_shows_the_tree_show_prints",
    },
    "docs/reproductions.md": {
        "tzoo reproduce ut-length-generalisation": "tests/comparing/test_reproductions.py::"
        "test_a_study_at_cpu_scale_gives_its_recorded_verdicts",
    },
    "docs/tasks.md": {
        "# my_tasks/plugin.py": "tests/examples/test_docs_task.py::test_the_documented_task_plugin_registers_and_trains",
    },
    "docs/writing-a-plugin.md": {
        "sigmoid_attention.py": QUICKSTART + "::test_sigmoid_attention_equals_its_formula_written_out",
        "parity.py": QUICKSTART + "::test_the_parity_task_labels_its_strings_by_its_seed_and_trains",
        "parity.yaml": QUICKSTART + "::test_the_pages_commands_run_in_the_folder_holding_the_files",
        "in the folder holding the files": QUICKSTART + "::test_the_pages_commands_run_in_the_folder_holding_the_files",
        "in Python": QUICKSTART + "::test_the_pages_python_block_runs",
        "tzoo_example_plugin/linear.py": PACKAGE + "::test_the_linear_kind_in_the_docs_is_the_file_the_package_ships",
        "with the package installed": PACKAGE + "::test_the_pages_examples_run_with_the_package_installed",
        "pip install ./examples/plugin-package": PACKAGE + "::test_the_pages_examples_run_with_the_package_installed",
        "test_my_plugin.py": PACKAGE + "::test_the_pages_examples_run_with_the_package_installed",
        "talking_heads.py": "tests/examples/test_docs_talking_heads.py::test_the_documented_kind_equals_the_formula_written_out",
        "fire.py": "tests/registry/test_positional_plugin_doc.py::test_its_parameters_train",
        "using fire.py": "tests/registry/test_positional_plugin_doc.py::test_the_page_registers_and_uses_it_as_printed",
        "positional scheme FIRE (fire)": "tests/registry/test_positional_plugin_doc.py::"
        "test_a_bias_of_the_wrong_shape_is_refused_with_the_pages_message",
        '"""tzoo_mlflow': "tests/training/test_tracking.py::test_the_documented_mlflow_tracker_tracks_a_run",
    },
}
"""Blocks run by a test of their own, which checks more than that they run."""

NOT_EXAMPLES: dict[str, dict[str, str]] = {
    "README.md": {"core/ ": "the checkout's folders"},
    "docs/concepts.md": {
        "cli ": "the layers of the package, a diagram",
        "src ids ─": "the data flow of a forward pass, a diagram",
        "out, weights = attn(": "a call's signature",
        "result = stack(": "a call's signature",
    },
    "docs/variants/universal-transformer.md": {
        "A^t = ": "the paper's equations",
        "P^t[i, 2j]": "the paper's equations",
        "N_i = ": "the paper's equations",
        "y_i = ": "the paper's equations",
    },
    "docs/writing-a-plugin.md": {
        "out, weights = kernel(": "a call's signature",
        "def kernel_inputs(": "a method's signature",
        "logits[b, g, i, j]": "the paper's equations",
    },
}
"""Blocks that are no example to run: formulas, diagrams, signatures, a folder's layout."""


KNOWN_FAILURES: dict[str, dict[str, str]] = {}  # page: {block key: why the code fails it}
"""Blocks that fail because of the code, each with why: the page's test leaves them out, and
test_a_block_the_code_fails runs each as a strict expected failure, so that the fix is noticed."""


def known_failure(block: Block) -> str | None:
    return next((why for key, why in KNOWN_FAILURES.get(block.page, {}).items() if block.key.startswith(key)), None)


def classified(block: Block) -> list[str]:
    """What takes care of ``block``: one entry, else it is unaccounted for or claimed twice."""
    found = []
    for name, table in (("dedicated", DEDICATED), ("not an example", NOT_EXAMPLES), ("output", OUTPUTS)):
        found += [f"{name}: {key}" for key in table.get(block.page, {}) if block.key.startswith(key)]
    if block.not_run:
        found.append(f"not run: {block.not_run}")
    if not found and block.language in ("python", "bash", "console", "yaml", "toml"):
        found.append("run")
    return found


# ---- outputs the pages show, produced here ------------------------------------------------------
def _image_of_the_wrong_shape(block: Block) -> None:
    import transformer_zoo as tz

    with pytest.raises(ValueError) as error:
        tz.build_model("vit-tiny")(torch.zeros(2, 3, 8, 8))
    assert block.code.strip() == f"ValueError: {error.value}"


def _rows_without_the_keys_collate_reads(block: Block) -> None:
    mqar = types.ModuleType("mqar")  # the page's task, whose rows name their tokens 'tokens'
    exec("from transformer_zoo.core.tasks import LanguageModelTask\nclass MQARTask(LanguageModelTask): ...", vars(mqar))
    task = mqar.MQARTask()
    task.options = types.SimpleNamespace(kind="mqar")
    with pytest.raises(ValueError) as error:
        task.collate([{"tokens": [3, 4, 5]}])
    assert block.code.strip() == str(error.value)


class FIREOptions(PositionalOptions):
    """The page's FIRE, with a build that lacks n_heads."""

    kind: Literal["fire"] = "fire"

    def build(self, *, d_model, max_len): ...


def _a_build_the_zoo_cannot_call(block: Block) -> None:
    class Fire:
        @hookimpl
        def tzoo_components(self):
            return [FIREOptions]

    with pytest.raises(PluginLoadError) as error:
        get_registry().register(Fire(), "fire")
    assert block.code.strip() == str(error.value)


def _a_name_two_plugins_offer(block: Block) -> None:
    sys.path.insert(0, str(Path("examples", "plugin-package").resolve()))  # the page folder's copy
    try:
        plugin = importlib.import_module("tzoo_example_plugin.plugin")
    finally:
        del sys.path[0]
    get_registry().register(plugin, "example")

    class Copycat:
        @hookimpl
        def tzoo_components(self):
            return [plugin.SimpleLinearAttentionOptions]

        @hookimpl
        def tzoo_variants(self):
            return [Variant(name="copycat-tiny", config=TransformerConfig, defaults=TINY, description="a copy")]

    with pytest.raises(DuplicateNameError) as error:
        get_registry().register(Copycat(), "copycat")
    assert block.code.strip() == str(error.value)


def _what_a_lost_node_prints(block: Block) -> None:
    from transformer_zoo.comparing.executors import RunEvent, _lost_runs, _why_retried
    from transformer_zoo.comparing.progress import GridProgress
    from transformer_zoo.comparing.runs import RunJob

    node = "540cb211@gpu-node-2"
    job = RunJob(
        name="j",
        config={},
        run_dir="j",
        invocation="now",
        tags={"variant": "transformer-tiny", "task": "listops", "seed": "1"},
    )
    log = io.StringIO()
    with GridProgress([job], log, live=False) as progress:
        progress.event(RunEvent("lost", None, node, error=f"node {node} lost: {_lost_runs(1)}"))
        progress.event(
            RunEvent("retried", job, "facdf546@gpu-node-1 cpu", 2, error=_why_retried({node}, f"{node} cpu"))
        )
    assert block.code == log.getvalue()


OUTPUTS: dict[str, dict[str, Callable[[Block], None]]] = {
    "docs/scaling.md": {"node 540cb211@gpu-node-2 lost": _what_a_lost_node_prints},
    "docs/tasks.md": {"task 'mqar'": _rows_without_the_keys_collate_reads},
    "docs/variants/image.md": {"ValueError: expected images": _image_of_the_wrong_shape},
    "docs/writing-a-plugin.md": {
        "plugin 'fire' offers": _a_build_the_zoo_cannot_call,
        "attention kind 'simple-linear' is provided": _a_name_two_plugins_offer,
    },
}
"""Text blocks that show what the code prints, each with the check that the code prints it."""


# ---- the tests ------------------------------------------------------------------------------
def test_every_block_is_run_or_marked():
    unaccounted = []
    for page in PAGES:
        for block in blocks(page):
            if len(claims := classified(block)) != 1:
                unaccounted.append(f"{block}: {claims or 'neither run, nor marked not run, nor in a table'}")
    assert not unaccounted, "\n".join(unaccounted)


@pytest.mark.parametrize("page", PAGES)
def test_every_not_run_line_marks_a_block(page):
    """A "Not run by the tests" line is one line, right above its block (a test comment between)."""
    lines = [line for line in (ROOT / page).read_text().splitlines() if "Not run by the tests" in line]
    assert len(lines) == sum(block.not_run is not None for block in blocks(page)), lines


@pytest.mark.parametrize("table", [DEDICATED, NOT_EXAMPLES, OUTPUTS, KNOWN_FAILURES])
def test_every_entry_of_a_table_names_one_block(table):
    for page, entries in table.items():
        keys = [block.key for block in blocks(page)]
        for key in entries:
            assert sum(k.startswith(key) for k in keys) == 1, f"{page}: {key!r} names {keys}"


def test_the_dedicated_tests_exist():
    for page, entries in DEDICATED.items():
        for key, test in entries.items():
            path, _, name = test.partition("::")
            assert f"def {name}(" in (ROOT / path).read_text(), f"{page}: {key!r} names {test}, which is not there"


def _run_page(page: str, folder: Path, slow: bool, until: str | None = None) -> None:
    """Run the page's blocks in order; with ``until``, the blocks before that one, then it."""
    fresh_folder(folder)
    namespace: dict[str, object] = {}
    for block in blocks(page):
        if block.language == "python" and re.fullmatch(r"\w+\.py", block.title or ""):
            (folder / block.title).write_text(block.code)  # a module the page imports further down
        last = until is not None and block.key.startswith(until)
        if (block.slow and not slow and not last) or (known_failure(block) and not last):
            continue
        claims = classified(block)
        assert len(claims) == 1, f"{block}: {claims or 'neither run, nor marked not run, nor in a table'}"
        claim = claims[0]
        if claim.startswith("output: "):
            OUTPUTS[page][claim.removeprefix("output: ")](block)
        elif claim == "run":
            run_block(block, folder, namespace)
        if last:
            return


@pytest.fixture
def page_folder(tmp_path, monkeypatch):
    """A fresh folder, the current one and first on the import path; the plugins a page
    registers and the modules it imports from there are gone after it."""
    from transformer_zoo.registry import get_registry

    folder = tmp_path / "page"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    plugins = {name for name, _ in get_registry().pm.list_name_plugin()}
    modules = set(sys.modules)
    yield folder
    for name, _ in get_registry().pm.list_name_plugin():
        if name not in plugins:
            get_registry().unregister(name)
    for name in set(sys.modules) - modules:
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(folder)):
            del sys.modules[name]


@pytest.mark.parametrize("page", PAGES)
def test_a_pages_examples_run(page, page_folder):
    _run_page(page, page_folder, slow=False)


@pytest.mark.slow
@pytest.mark.parametrize("page", [page for page in PAGES if any(block.slow for block in blocks(page))])
def test_a_pages_slow_examples_run(page, page_folder):
    _run_page(page, page_folder, slow=True)


@pytest.mark.parametrize(
    ("page", "key"),
    [
        pytest.param(page, key, marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=why))
        for page, entries in KNOWN_FAILURES.items()
        for key, why in entries.items()
    ],
)
def test_a_block_the_code_fails(page, key, page_folder):
    _run_page(page, page_folder, slow=False, until=key)


# ---- the runner's own checks ------------------------------------------------------------------
def test_shape_comments_are_checked():
    from docs_pages import _check_shape

    code = checked("x = torch.zeros(2, 3)  # (2, 3): two rows\ny = 1  # (2, <= 3) is prose\n")
    assert code.splitlines()[1] == "_check_shape('x = torch.zeros(2, 3)  # (2, 3): two rows', (2, 3), x)"
    assert len(code.splitlines()) == 3
    _check_shape("", (2, 3), torch.zeros(2, 3))
    with pytest.raises(AssertionError, match="gives shape \\(3, 2\\), but the page says"):
        _check_shape("", (2, 3), torch.zeros(3, 2))


def test_an_error_comment_is_checked():
    code = checked("int('x')\n# ValueError: invalid literal for int()\n# with base 10: 'x'\nz = 1\n")
    namespace: dict[str, object] = {}
    from docs_pages import _check_error

    exec(code, {"_check_error": _check_error}, namespace)
    assert namespace["z"] == 1
    with pytest.raises(AssertionError, match="raised nothing"):
        exec(checked("int('1')\n# ValueError: no\n"), {"_check_error": _check_error})


def test_console_outputs_match_line_by_line():
    assert matches("error: x\n  y\n", "error: x\n  y  \n")
    assert matches("a\n...\nz\n", "a\nb\nc\nz\n") and matches("a ... z\n", "a b c z\n")
    assert not matches("error: x\n", "error: x, and more\n")
    assert not matches("a\nz\n", "a\nb\nz\n")


def test_the_readme_runs_the_first_example_with_its_claims_checked():
    first = blocks("README.md")[0]
    assert first.language == "python" and "_check_shape" in checked(first.code)


def test_the_built_in_comparisons_time_is_one_figure():
    """The README and docs/compare.md state the same measured, dated time."""
    figure = re.compile(r"(\d+(?:\.\d+)?) minutes on a 2-core CPU, measured on (\d{4}-\d{2}-\d{2})")
    readme = figure.findall(" ".join((ROOT / "README.md").read_text().split()))
    compare = " ".join((ROOT / "docs" / "compare.md").read_text().split())
    compare = figure.findall(compare[compare.index("## The built-in comparison, as it ran") :])
    assert len(readme) == 1 and compare, "each states the time as 'N minutes on a 2-core CPU, measured on DATE'"
    assert readme == compare[:1], f"README.md says {readme[0]}, docs/compare.md {compare[0]}"
