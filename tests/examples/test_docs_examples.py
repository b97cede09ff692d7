"""The Python examples of the README and the docs run as printed, and print what their comments say.

Each page's ```python blocks run in order in one namespace (as a reader would paste them into one
session), in a scratch folder. A line ``print(...)  # TEXT`` must print the start of TEXT: the
comment may go on after the output (``# torch.Size([2, 3]): one per row``), but it may not drift
from it. An assignment whose comment starts with a shape, ``x = ...  # (2, 5, 1000): ...``, must
give ``x`` that ``.shape`` (a comment such as ``# (2, <= 21)`` is prose, not checked). A YAML
block followed by "Saved as `NAME`" is written to NAME first. The examples of docs/tasks.md and
docs/writing-a-plugin.md are plugin files, run by test_docs_task.py, test_plugin_package.py,
test_docs_talking_heads.py and test_plugin_quickstart.py (the quick start's).
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[2]
PAGES = [
    "README.md",
    "docs/index.md",
    "docs/getting-started.md",
    "docs/configs.md",
    "docs/export.md",
    "docs/variants/transformer.md",
    "docs/variants/bert.md",
    "docs/reference/transformer_zoo.md",
    "docs/hugging-face.md",
]
READERS_OWN = "path/to/"  # a block that reads the reader's own folder cannot run here
CHECKED = re.compile(r"^(\s*)print\((.*)\)\s+# (.*)$")
SHAPED = re.compile(r"^(\s*)([A-Za-z_]\w*) = .*\s# (\(\d+(?:, \d+)*,?\))(?::.*)?$")  # x = ...  # (2, 5): ...


def _blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block, with each YAML block's file name when one is given."""
    blocks = []
    for match in re.finditer(r"```(\w+)\n(.*?)```(?:\s*\n\n?Saved as `([^`]+)`)?", text, re.S):
        language, code, saved_as = match.groups()
        blocks.append((f"file:{saved_as}" if language == "yaml" and saved_as else language, code))
    return blocks


def _checked(code: str) -> str:
    """The block with each commented ``print`` turned into a check of what it prints, and a check
    of the shape after each assignment commented with one."""
    lines = []
    for line in code.splitlines():
        lines.append(CHECKED.sub(lambda m: f"{m[1]}_check({m[3]!r}, {m[2]})", line))
        if shaped := SHAPED.match(line):
            indent, name, shape = shaped.groups()
            lines.append(f"{indent}_check_shape({line.strip()!r}, {shape}, {name})")
    return "\n".join(lines)


def _check(comment: str, *values: object) -> None:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        print(*values)
    printed = out.getvalue().strip()
    assert comment.startswith(printed), f"prints {printed!r}, but the page says {comment!r}"


def _check_shape(line: str, shape: tuple[int, ...], value: object) -> None:
    got = tuple(getattr(value, "shape", ()))
    assert got == shape, f"gives shape {got}, but the page says {line!r}"


def test_shape_comments_are_checked():
    code = _checked("x = torch.zeros(2, 3)  # (2, 3): two rows\ny = 1  # (2, <= 3) is prose\n")
    assert code.splitlines()[1] == "_check_shape('x = torch.zeros(2, 3)  # (2, 3): two rows', (2, 3), x)"
    assert len(code.splitlines()) == 3
    _check_shape("", (2, 3), torch.zeros(2, 3))
    with pytest.raises(AssertionError, match="gives shape \\(3, 2\\), but the page says"):
        _check_shape("", (2, 3), torch.zeros(3, 2))


@pytest.mark.parametrize("page", PAGES)
def test_a_pages_examples_run_and_print_what_they_say(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"_check": _check, "_check_shape": _check_shape, "__name__": "__docs__"}
    blocks = _blocks((ROOT / page).read_text())
    ran = 0
    for language, code in blocks:
        if language.startswith("file:"):
            (tmp_path / language.removeprefix("file:")).write_text(code)
        elif language == "python" and READERS_OWN not in code:
            exec(compile(_checked(code), f"{page} (block {ran})", "exec"), namespace)
            ran += 1
    assert ran, f"{page} has no example that runs here"
    if page == "README.md":  # the first example's claims are checked, not only run
        assert "_check_shape" in _checked(_blocks((ROOT / page).read_text())[0][1])
