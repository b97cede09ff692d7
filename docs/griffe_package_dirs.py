"""Griffe extension used by the API reference (mkdocs.yml): not part of the library.

1. ``pyproject.toml`` maps the top-level folders ``core/``, ``registry/`` and ``plugins/`` into
   ``transformer_zoo`` with ``[tool.setuptools.package-dir]``. Python follows that mapping when
   importing, but Griffe (which reads source files without importing them) looks only inside
   ``transformer_zoo/``. This extension reads the same mapping and, when Griffe visits a
   package whose sub-packages live elsewhere, visits those folders too, so that
   ``::: transformer_zoo.core.attention`` resolves.
2. Pydantic fields carry their documentation in ``Field(description=...)``; it becomes the
   attribute's docstring, so that options and config fields appear in the reference.
3. The docstrings use Sphinx roles (``:class:`~transformer_zoo.core.model.EncoderDecoder```).
   They are rewritten into mkdocstrings cross-references when the target is documented, and
   into inline code otherwise (names outside the package, such as ``torch`` functions).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import griffe

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    tomllib = None

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|obj|exc):`(~?)([\w.]+)`")


class PackageDirs(griffe.Extension):
    """Visit the folders that ``[tool.setuptools.package-dir]`` maps under a visited package.

    Args:
        pyproject: path to ``pyproject.toml``; by default the one in the folder above this file's.
    """

    def __init__(self, pyproject: str | None = None) -> None:
        super().__init__()
        path = Path(pyproject).resolve() if pyproject else Path(__file__).resolve().parent.parent / "pyproject.toml"
        mapping = _package_dir(path.read_text())
        self.folders: dict[str, Path] = {
            name: (path.parent / folder).resolve() for name, folder in mapping.items() if "." in name
        }

    # ---- 1. sub-packages in other folders ------------------------------------------------------
    def on_module_members(
        self, *, node: ast.AST | griffe.ObjectNode, mod: griffe.Module, agent: Any, **kwargs: Any
    ) -> None:
        for name, folder in self.folders.items():
            parent, _, child = name.rpartition(".")
            if parent == mod.path and child not in mod.members:
                self._visit_package(mod, child, folder, agent)

    def _visit_package(self, parent: griffe.Module, name: str, folder: Path, agent: Any) -> griffe.Module:
        module = self._visit_file(parent, name, folder / "__init__.py", agent)
        for entry in sorted(folder.iterdir()):
            if entry.is_dir() and (entry / "__init__.py").is_file():
                self._visit_package(module, entry.name, entry, agent)
            elif entry.suffix == ".py" and entry.stem != "__init__" and "." not in entry.stem:
                self._visit_file(module, entry.stem, entry, agent)
        return module

    def _visit_file(self, parent: griffe.Module, name: str, path: Path, agent: Any) -> griffe.Module:
        code = path.read_text(encoding="utf-8-sig")
        agent.lines_collection[path] = code.splitlines(keepends=False)
        module = griffe.visit(
            name,
            filepath=path,
            code=code,
            extensions=agent.extensions,
            parent=parent,
            docstring_parser=agent.docstring_parser,
            docstring_options=agent.docstring_options,
            lines_collection=agent.lines_collection,
            modules_collection=agent.modules_collection,
        )
        parent.set_member(name, module)
        return module

    # ---- 2. field descriptions, 3. Sphinx roles -------------------------------------------------
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        self._rewrite(pkg, loader.modules_collection)

    def _rewrite(self, obj: griffe.Object, collection: griffe.ModulesCollection) -> None:
        if obj.is_attribute and obj.docstring is None and obj.parent is not None and obj.parent.is_class:
            description = _field_description(obj.value)
            if description is not None:
                obj.docstring = griffe.Docstring(description, parent=obj)
        if obj.docstring is not None and ":" in obj.docstring.value:
            obj.docstring.value = ROLE.sub(lambda m: self._reference(obj, m, collection), obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias:
                self._rewrite(member, collection)

    def _reference(self, obj: griffe.Object, match: re.Match, collection: griffe.ModulesCollection) -> str:
        short, target = match.group(1), match.group(2)
        text = target.rsplit(".", 1)[-1] if short else target
        scopes = [""]
        scope = obj if obj.is_module or obj.is_class else obj.parent
        while scope is not None:
            scopes.append(scope.path + ".")
            scope = scope.parent
        for prefix in scopes:
            try:
                found = collection.get_member(prefix + target)
            except (KeyError, ValueError, griffe.AliasResolutionError):
                continue
            if found.is_alias:
                try:
                    found = found.final_target
                except griffe.AliasResolutionError:
                    continue
            # Only documented objects get a page anchor; link to those, show the rest as code.
            if found.is_module or found.is_class or found.docstring is not None:
                return f"[`{text}`][{found.path}]"
            break
        return f"`{text}`"


def _field_description(value: Any) -> str | None:
    """The ``description`` of a ``Field(...)`` call, if it is a plain string."""
    if not isinstance(value, griffe.ExprCall) or str(value.function).rsplit(".", 1)[-1] != "Field":
        return None
    for argument in value.arguments:
        if isinstance(argument, griffe.ExprKeyword) and argument.name == "description":
            try:
                text = ast.literal_eval(str(argument.value))
            except (ValueError, SyntaxError):
                return None
            return text if isinstance(text, str) else None
    return None


def _package_dir(text: str) -> dict[str, str]:
    """``[tool.setuptools.package-dir]`` of a ``pyproject.toml``: package name to folder."""
    if tomllib is not None:
        return tomllib.loads(text).get("tool", {}).get("setuptools", {}).get("package-dir", {})
    table = re.search(r"^\[tool\.setuptools\.package-dir\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    return dict(re.findall(r'^\s*"([^"]+)"\s*=\s*"([^"]+)"', table.group(1), re.M)) if table else {}
