"""The package's layers, read from its sources (``benchmarks/`` included): no import circle, each
layer imports only the layers below it (core -> registry -> plugins -> training -> comparing ->
cli -> benchmarks), and no module imports another's private name or a name that a module other
than the one defining it passes on."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {
    "transformer_zoo": ROOT / "transformer_zoo",
    "transformer_zoo.core": ROOT / "core",
    "transformer_zoo.registry": ROOT / "registry",
    "transformer_zoo.plugins": ROOT / "plugins",
    "benchmarks": ROOT / "benchmarks",  # not installed, but held to the same rules
}


def _modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name, from the checkout's folders."""
    found = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            found[".".join((package, *parts)).removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its source (a function's lazy
    imports and ``TYPE_CHECKING`` blocks included: a circle through them is still a circle)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # ``from package import module`` imports the module; ``from module import name`` the module
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # ``import a.b.c`` where c is a name: its module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _circles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read_from_every_room():
    for expected in (
        "transformer_zoo.training.trainer",
        "transformer_zoo.comparing.records",
        "transformer_zoo.cli",
        "transformer_zoo.core.attention",
        "transformer_zoo.registry.manager",
        "transformer_zoo.plugins.bert.hf",
        "benchmarks.mfu",
        "benchmarks.robustness.harness",
    ):
        assert expected in GRAPH
    assert "transformer_zoo.comparing.records" in GRAPH["transformer_zoo.comparing.report"]
    assert "transformer_zoo.training.distributed" in GRAPH["transformer_zoo.cli"]  # a lazy import counts


def test_no_import_circle_anywhere_in_the_package():
    assert _circles() == []


def test_the_circle_finder_finds_a_circle():
    saved = {k: set(v) for k, v in GRAPH.items()}
    try:
        GRAPH["transformer_zoo.comparing.records"].add("transformer_zoo.comparing.report")
        assert any("transformer_zoo.comparing.records" in c for c in _circles())
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


# what each layer may not import: everything above it
LAYERS = [
    "transformer_zoo.core",
    "transformer_zoo.registry",
    "transformer_zoo.plugins",
    "transformer_zoo.training",
    "transformer_zoo.comparing",
    "transformer_zoo.cli",
    "benchmarks",
]
ABOVE = {layer: LAYERS[i + 1 :] for i, layer in enumerate(LAYERS)}
ABOVE["transformer_zoo.plugins"] = ["transformer_zoo.training", "transformer_zoo.comparing", "transformer_zoo.cli"]


def _in(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


@pytest.mark.parametrize("layer", LAYERS[:-1])
def test_a_layer_imports_nothing_above_it(layer):
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if _in(module, layer)
        for target in targets
        if any(_in(target, above) for above in ABOVE[layer])
    )
    assert not wrong, "\n".join(wrong)


def test_core_imports_no_module_outside_core():
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if _in(module, "transformer_zoo.core")
        for target in targets
        if not _in(target, "transformer_zoo.core")
    )
    assert not wrong, "\n".join(wrong)


def test_records_import_none_of_their_readers():
    readers = {
        "transformer_zoo.comparing.summary",
        "transformer_zoo.comparing.report",
        "transformer_zoo.comparing.plots",
        "transformer_zoo.comparing.runner",
    }
    assert not GRAPH["transformer_zoo.comparing.records"] & readers


def test_no_module_imports_a_private_name_of_another():
    wrong = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or node.level):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private:
                    wrong.append(f"{name} imports {private} from {'.' * node.level}{node.module or ''}")
    assert not wrong, "\n".join(wrong)


def _defined(path: Path) -> set[str]:
    """The names a module binds at its top level itself: functions, classes and assignments (not
    what it imports)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.If, ast.Try)):  # a name bound either way
            names |= {n.name for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            names |= {
                t.id for n in ast.walk(node) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
            }
    return names


def test_a_name_is_imported_from_the_module_that_defines_it():
    """``from module import name`` reaches the module where ``name`` is defined, not one that
    imported it in turn; a package's ``__init__`` (its public face) may be imported from."""
    wrong = []
    for name, path in MODULES.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and (node.module or node.level)):
                continue
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            if base not in MODULES or MODULES[base].name == "__init__.py":
                continue
            defined = _defined(MODULES[base])
            wrong += [
                f"{name} imports {a.name} from {base}, which does not define it"
                for a in node.names
                if a.name not in defined
            ]
    assert not wrong, "\n".join(wrong)
