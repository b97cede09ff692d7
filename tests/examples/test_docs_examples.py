"""The Python examples of the README and the docs run as printed, and print what their comments say.

Each page's ```python blocks run in order in one namespace (as a reader would paste them into one
session), in a scratch folder. A line ``print(...)  # TEXT`` must print the start of TEXT: the
comment may go on after the output (``# torch.Size([2, 3]): one per row``), but it may not drift
from it. A YAML block followed by "Saved as `NAME`" is written to NAME first. The examples of
docs/tasks.md and docs/writing-a-plugin.md are plugin files, run by test_docs_task.py and
test_plugin_package.py.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PAGES = ["README.md", "docs/index.md", "docs/getting-started.md", "docs/configs.md", "docs/export.md",
         "docs/variants/transformer.md", "docs/variants/bert.md", "docs/reference/transformer_zoo.md"]
READERS_OWN = "path/to/"  # a block that reads the reader's own folder cannot run here
CHECKED = re.compile(r"^(\s*)print\((.*)\)\s+# (.*)$")


def _blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block, with each YAML block's file name when one is given."""
    blocks = []
    for match in re.finditer(r"```(\w+)\n(.*?)```(?:\s*\n\n?Saved as `([^`]+)`)?", text, re.S):
        language, code, saved_as = match.groups()
        blocks.append((f"file:{saved_as}" if language == "yaml" and saved_as else language, code))
    return blocks


def _checked(code: str) -> str:
    """The block with each commented ``print`` turned into a check of what it prints."""
    return "\n".join(CHECKED.sub(lambda m: f"{m[1]}_check({m[3]!r}, {m[2]})", line) for line in code.splitlines())


def _check(comment: str, *values: object) -> None:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        print(*values)
    printed = out.getvalue().strip()
    assert comment.startswith(printed), f"prints {printed!r}, but the page says {comment!r}"


@pytest.mark.parametrize("page", PAGES)
def test_a_pages_examples_run_and_print_what_they_say(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"_check": _check, "__name__": "__docs__"}
    blocks = _blocks((ROOT / page).read_text())
    ran = 0
    for language, code in blocks:
        if language.startswith("file:"):
            (tmp_path / language.removeprefix("file:")).write_text(code)
        elif language == "python" and READERS_OWN not in code:
            exec(compile(_checked(code), f"{page} (block {ran})", "exec"), namespace)
            ran += 1
    assert ran, f"{page} has no example that runs here"
