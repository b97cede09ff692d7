"""The runner of the docs' examples: it reads a page's fenced blocks and runs them as a reader would.

Each page runs in a fresh folder holding a copy of the checkout's ``examples/``, its blocks in
page order, the Python blocks in one namespace (as a reader would paste them into one session).

- **python**: run as printed. ``print(...)  # TEXT`` must print the start of TEXT (the comment
  may go on after the output, not drift from it); ``x = ...  # (2, 5, 1000): ...`` must give ``x``
  that shape (``# (2, <= 21)`` is prose, not checked); a statement followed by a comment
  ``# SomeError: message`` must raise that error, with that message in its text.
- **bash**: each command runs and must exit with 0; a ``"quoted"`` text in a command's comment
  must be in what it prints. ``tzoo`` runs in this process (in a ``tzoo`` process of its own
  where it loads a ``--plugin`` module or sets a variable), ``python`` in a process of its own
  with the checkout on its path (``python -m benchmarks...``), ``cat`` is the shell's.
- **console**: lines starting with ``$ `` are commands, the lines after one what it prints:
  stdout and stderr, compared line by line, where a line ``...`` stands for any lines and
  ``...`` in a line for any text. ``$ cat NAME`` with lines after it, before NAME exists, writes
  them to NAME: the page shows the file it then uses.
- **yaml**, **toml**: saved as the file the page names (``title="NAME"``, or a line
  ``Saved as `NAME`.`` after the block); a YAML block without a name is read by the code that
  reads such files: a model config (``variant``), a training config (``model`` and ``task``), a
  compare spec (``variants``), a study (``claims``) or a task's options (``task`` alone).

A comment right before a block, ``<!-- test: ITEM; ITEM -->``, says what the test changes:

- ``COMMAND --ARGS``: arguments appended to each command of the block that starts with
  COMMAND's words (``tzoo train --set steps=20``: a smaller budget; argparse and ``--set`` keep
  the last value given); with no COMMAND, to every ``tzoo`` and ``python`` command. For ``tzoo
  compare``, which has no ``--set``, its ``--set KEY=VALUE`` items change a copy of its spec (the
  built-in one where it names none, or a ``--suite``'s own). Before a YAML block, ``--set KEY=VALUE`` items change the
  block's data.
- ``in PATH``: a YAML fragment, read merged over the YAML file PATH of the checkout.
- ``excerpt of PATH [PATH ...]``: not run, but every line of the block (comments and blank
  lines left out) is a line of one of those files of the checkout.
- ``slow``: the block runs only under ``pytest -m slow``.

A line right before a block, ``*Not run by the tests: REASON.*``, is the one visible form of a
block that does not run (a GPU, a Ray cluster, the reader's own files).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).parents[2]
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+)(?P<info>.*)$")
DIRECTIVE = re.compile(r"^\s*<!-- test: (?P<items>.*?) -->\s*$")
NOT_RUN = re.compile(r"^\s*\*Not run by the tests: (?P<reason>.+?)\.\*\s*$")
SAVED_AS = re.compile(r"^\s*Saved as `(?P<name>[^`]+)`")
CHECKED = re.compile(r"^(\s*)print\((.*)\)\s+# (.*)$")
SHAPED = re.compile(r"^(\s*)([A-Za-z_]\w*) = .*\s# (\(\d+(?:, \d+)*,?\))(?::.*)?$")  # x = ...  # (2, 5): ...
RAISES = re.compile(r"^\s*# (?P<error>[A-Z]\w*(?:Error|Exception)): (?P<message>.*)$")
TZOO = Path(sys.executable).with_name("tzoo")


@dataclass
class Block:
    """One fenced block of a page, with what the page says around it."""

    page: str
    line: int  # of the opening fence, 1-based
    language: str  # the info string's first word ('' for none)
    title: str | None  # title="..."
    code: str
    saved_as: str | None = None  # title, or "Saved as `NAME`" after the block
    not_run: str | None = None  # the reason of a "Not run by the tests" line
    args: list[tuple[list[str], list[str]]] = field(default_factory=list)  # from the directive: (command, arguments)
    inside: str | None = None  # from the directive: the YAML file a fragment is read in
    excerpt_of: list[str] = field(default_factory=list)
    slow: bool = False

    @property
    def key(self) -> str:
        """How the runner's tables name the block: its title, or else its first line."""
        return self.title or next((line.strip() for line in self.code.splitlines() if line.strip()), "")

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.language or 'no language'}: {self.key[:60]!r})"


def _first_option(words: list[str]) -> int | None:
    return next((i for i, word in enumerate(words) if word.startswith("--")), None)


def blocks(page: str) -> list[Block]:
    """Every fenced block of ``page`` (relative to the checkout), in order."""
    lines = (ROOT / page).read_text().splitlines()
    found = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, info = match["indent"], match["fence"], match["info"].strip()
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        code = "".join(line.removeprefix(indent) + "\n" for line in lines[i + 1 : end])
        title = re.search(r'title="([^"]*)"', info)
        block = Block(page, i + 1, info.split(" ")[0] if info else "", title and title[1], code)
        _read_around(block, lines, i, end)
        found.append(block)
        i = end + 1
    return found


def _read_around(block: Block, lines: list[str], start: int, end: int) -> None:
    """The directive and the not-run line above the block, the file name it is saved as."""
    j = start - 1
    while j >= 0 and (not lines[j].strip() or DIRECTIVE.match(lines[j])):
        if directive := DIRECTIVE.match(lines[j]):
            for item in (item.strip() for item in directive["items"].split(";")):
                if item == "slow":
                    block.slow = True
                elif item.startswith("in "):
                    block.inside = item.removeprefix("in ").strip()
                elif item.startswith("excerpt of "):
                    block.excerpt_of += item.removeprefix("excerpt of ").split()
                elif (words := shlex.split(item)) and (start := _first_option(words)) is not None:
                    block.args.append((words[:start], words[start:]))
                else:
                    raise ValueError(f"{block}: unknown test directive {item!r}")
        j -= 1
    if j >= 0 and (not_run := NOT_RUN.match(lines[j])):
        block.not_run = not_run["reason"]
    if block.language in ("yaml", "toml"):
        block.saved_as = block.title
        k = end + 1
        while k < len(lines) and not lines[k].strip():
            k += 1
        if k < len(lines) and (saved := SAVED_AS.match(lines[k])):
            block.saved_as = saved["name"]


# ---- python ---------------------------------------------------------------------------------
def checked(code: str) -> str:
    """The block with each commented ``print`` turned into a check of what it prints, a check of
    the shape after each assignment commented with one, and each statement followed by a comment
    ``# SomeError: message`` into a check that it raises that."""
    lines = code.splitlines()
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        expected = RAISES.match(lines[i + 1]) if i + 1 < len(lines) and line.strip() else None
        if expected and not line.lstrip().startswith("#"):
            message = [expected["message"]]
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("# "):
                message.append(lines[i].lstrip()[2:])
                i += 1
            indent = line[: len(line) - len(line.lstrip())]
            out += [
                f"{indent}try:",
                f"{indent}    {line.strip()}",
                f"{indent}except Exception as _error:",
                f"{indent}    _check_error({expected['error']!r}, {' '.join(message)!r}, _error)",
                f"{indent}else:",
                f"{indent}    raise AssertionError({line.strip() + ' raised nothing'!r})",
            ]
            continue
        out.append(CHECKED.sub(lambda m: f"{m[1]}_check({m[3]!r}, {m[2]})", line))
        if shaped := SHAPED.match(line):
            indent, name, shape = shaped.groups()
            out.append(f"{indent}_check_shape({line.strip()!r}, {shape}, {name})")
        i += 1
    return "\n".join(out)


def _check(comment: str, *values: object) -> None:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        print(*values)
    printed = out.getvalue().strip()
    assert comment.startswith(printed), f"prints {printed!r}, but the page says {comment!r}"


def _check_shape(line: str, shape: tuple[int, ...], value: object) -> None:
    got = tuple(getattr(value, "shape", ()))
    assert got == shape, f"gives shape {got}, but the page says {line!r}"


def _check_error(name: str, message: str, error: BaseException) -> None:
    assert name in [cls.__name__ for cls in type(error).__mro__], f"raises {error!r}, but the page says {name}"
    said = " ".join(str(error).split())
    assert " ".join(message.split()) in said, f"raises {said!r}, but the page says {message!r}"


def run_python(block: Block, namespace: dict[str, Any]) -> None:
    namespace.setdefault("__name__", "__docs__")
    namespace.update(_check=_check, _check_shape=_check_shape, _check_error=_check_error)
    exec(compile(checked(block.code), str(block), "exec", dont_inherit=True), namespace)


# ---- commands -------------------------------------------------------------------------------
@dataclass
class Command:
    words: list[str]
    env: dict[str, str]
    output_file: str | None  # `> NAME`
    error_file: str | None  # `2> NAME`
    comment: str


def commands(code: str) -> Iterator[Command]:
    """The block's commands: one a line, a line ending in a backslash going on in the next."""
    for line in code.replace("\\\n", " ").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        comment = ""
        for hash_at in (m.start() for m in re.finditer(r"\s#", line)):
            with contextlib.suppress(ValueError):
                shlex.split(line[:hash_at])  # quotes balanced: the comment starts here
                line, comment = line[:hash_at], line[hash_at:].strip().removeprefix("#").strip()
                break
        words = shlex.split(line)
        env = {}
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        files: dict[str, str] = {}
        for redirect in ("2>", ">"):
            if redirect in words:
                at = words.index(redirect)
                files[redirect] = words.pop(at + 1)
                del words[at]
        yield Command(words, env, files.get(">"), files.get("2>"), comment)


def _with_args(words: list[str], args: list[str], folder: Path) -> list[str]:
    """``words`` with the directive's ``args``: appended, or for ``tzoo compare`` its ``--set``
    items applied to a copy of the spec."""
    if words[:2] != ["tzoo", "compare"] or "--set" not in args:
        return words + args
    from transformer_zoo.comparing.spec import default_spec_path
    from transformer_zoo.configs import merge, parse_overrides

    sets = [args[i + 1] for i, arg in enumerate(args) if arg == "--set"]
    rest = [arg for i, arg in enumerate(args) if arg != "--set" and (i == 0 or args[i - 1] != "--set")]
    given = [word.split("=", 1)[1] for word in words if word.startswith("--suite=")]
    at = words.index("--suite") + 1 if "--suite" in words else len(words)
    suite = given[0] if given else words[at] if at < len(words) else None
    spec_at = next(
        (
            i
            for i, word in enumerate(words)
            if i >= 2 and word.endswith((".yaml", ".yml")) and words[i - 1] != "--suite"
        ),
        None,
    )
    source = default_spec_path() if spec_at is None else folder / words[spec_at]
    if spec_at is None and suite is not None:  # a suite alone: its own variants and budget
        from transformer_zoo.comparing.suites import load_suite

        found = load_suite(suite)
        source, given = Path(f"{found.name}.yaml"), {"name": found.name, **found.compare}
    else:
        given = yaml.safe_load(source.read_text())
    data = merge(given, parse_overrides(sets))
    copy = folder / ".smaller" / Path(source).name
    copy.parent.mkdir(exist_ok=True)
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    words = list(words)
    if spec_at is None:
        words.insert(2, str(copy))
    else:
        words[spec_at] = str(copy)
    return words + rest


def run_command(command: Command, args: list[tuple[list[str], list[str]]], folder: Path) -> tuple[int, str]:
    """Run one command in ``folder``: its exit status, and what it printed (stdout, then stderr).
    ``args``: (a command's first words, arguments appended to it; no words: to every ``tzoo`` and
    ``python`` command)."""
    words = command.words
    for start, given in args:
        if words[: len(start)] == start and (start or words[0] in ("tzoo", "python")):
            words = _with_args(words, given, folder)
    program = words[0]
    if program == "cat":
        return 0, "".join((folder / name).read_text() for name in words[1:])
    if program == "tzoo" and not command.env and "--plugin" not in words:
        from transformer_zoo.cli import main

        with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                status = main(words[1:])
            except SystemExit as exit:  # argparse: --help, or a usage error
                status = exit.code if isinstance(exit.code, int) else 2
        printed, errors = out.getvalue(), err.getvalue()
    elif program in ("tzoo", "python"):
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TZOO_PLUGINS")}
        env.update(command.env, OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
        if program == "python":
            env["PYTHONPATH"] = str(ROOT)  # python -m benchmarks: run from a checkout
        executable = [str(TZOO)] if program == "tzoo" else [sys.executable]
        result = subprocess.run(
            executable + words[1:], capture_output=True, text=True, env=env, cwd=folder, timeout=600, check=False
        )
        status, printed, errors = result.returncode, result.stdout, result.stderr
    else:
        raise AssertionError(f"the runner does not run {program!r}: mark the block not run, with the reason")
    if command.output_file:
        (folder / command.output_file).write_text(printed)
    if command.error_file:
        (folder / command.error_file).write_text(errors)
    return status, printed + errors


def run_bash(block: Block, folder: Path) -> None:
    for command in commands(block.code):
        status, printed = run_command(command, block.args, folder)
        assert status == 0, f"{block}: {shlex.join(command.words)} exited with {status}:\n{printed}"
        for quoted in re.findall(r'"([^"]+)"', command.comment):
            assert quoted in printed, f"{block}: {shlex.join(command.words)} did not print {quoted!r}:\n{printed}"


def run_console(block: Block, folder: Path) -> None:
    """Each ``$ `` command's output against the lines after it."""
    parts = re.split(r"^\$ ", block.code, flags=re.M)
    assert not parts[0].strip(), f"{block}: a console block starts with a command"
    for part in parts[1:]:
        line, _, shown = part.partition("\n")
        (command,) = commands(line)
        if command.words[0] == "cat" and not (folder / command.words[1]).exists():
            (folder / command.words[1]).write_text(shown)
            continue
        _, printed = run_command(command, block.args, folder)
        assert matches(shown, printed), (
            f"{block}: `{line}` printed\n{printed}\nbut the page shows\n{shown}\n(copy the output above into the page)"
        )


def matches(shown: str, printed: str) -> bool:
    """Whether ``printed`` is what the page ``shown``: line by line, trailing spaces aside; a
    line ``...`` is any lines, ``...`` in a line any text."""
    pattern = []
    for line in shown.rstrip().splitlines():
        if line.strip() == "...":
            pattern.append(r"(?:.*\n)*?")
        else:
            pattern.append(".*?".join(re.escape(part) for part in line.rstrip().split("...")) + r"[ \t]*\n")
    text = "".join(line.rstrip() + "\n" for line in printed.rstrip().splitlines())
    return re.fullmatch("".join(pattern), text) is not None


# ---- yaml, excerpts -------------------------------------------------------------------------
def yaml_data(block: Block) -> Any:
    """The block's YAML, merged over its ``in`` file and changed by its ``--set`` items."""
    from transformer_zoo.configs import merge, parse_overrides

    data = yaml.safe_load(block.code)
    if block.inside:
        data = merge(yaml.safe_load((ROOT / block.inside).read_text()), data)
    args = [arg for _, given in block.args for arg in given]
    sets = [args[i + 1] for i, arg in enumerate(args) if arg == "--set"]
    return merge(data, parse_overrides(sets)) if sets else data


def run_yaml(block: Block, folder: Path) -> None:
    """Save the block as its file, or read it as the code reads such a file."""
    if block.saved_as:
        text = block.code if block.language != "yaml" or not block.args else yaml.safe_dump(yaml_data(block))
        (folder / block.saved_as).parent.mkdir(parents=True, exist_ok=True)
        (folder / block.saved_as).write_text(text)
        return
    assert block.language == "yaml", f"{block}: name the file the block is (title=...)"
    read(yaml_data(block), Path(block.inside or "fragment.yaml").stem)


def read(data: dict[str, Any], name: str) -> object:
    """``data`` validated by the reader of its kind of file."""
    import transformer_zoo as tz
    from transformer_zoo.comparing import load_spec
    from transformer_zoo.comparing.studies.spec import load_study
    from transformer_zoo.registry import get_registry
    from transformer_zoo.training.config import load_train_config

    if "claims" in data:
        return load_study({"name": name, **data})
    if "variants" in data:
        return load_spec(data)
    if "model" in data and "task" in data:
        return load_train_config(data)
    if "variant" in data:
        return tz.load_config(data)
    if set(data) == {"task"}:
        task = data["task"] if isinstance(data["task"], dict) else {"kind": data["task"]}
        return get_registry().component("task", task["kind"]).model_validate(task)
    raise AssertionError(f"no reader takes a YAML file with the keys {sorted(data)}: give it `in PATH`")


def check_excerpt(block: Block) -> None:
    """Every line of the block, its comment and blank lines left out, is a line of its files."""
    shipped = {line.strip() for path in block.excerpt_of for line in (ROOT / path).read_text().splitlines()}
    for line in block.code.splitlines():
        code = re.sub(r"\s+#.*$", "", line).strip()
        if code and not code.startswith("#"):
            assert code in shipped, f"{block}: {code!r} is not a line of {' or '.join(block.excerpt_of)}"


# ---- a page ---------------------------------------------------------------------------------
def fresh_folder(folder: Path) -> None:
    """What a page's reader has: a copy of the checkout's examples/."""
    shutil.copytree(ROOT / "examples", folder / "examples", ignore=shutil.ignore_patterns("*.egg-info", "build"))


def run_block(block: Block, folder: Path, namespace: dict[str, Any]) -> None:
    if block.excerpt_of:
        check_excerpt(block)
    elif block.language == "python":
        run_python(block, namespace)
    elif block.language in ("yaml", "toml"):
        run_yaml(block, folder)
    elif block.language == "bash":
        run_bash(block, folder)
    elif block.language == "console":
        run_console(block, folder)
    else:
        raise AssertionError(f"{block}: the runner does not run a block of this language")
