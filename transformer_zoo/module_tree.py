"""A built model as a tree of what computes it and where (``tzoo show NAME --modules``): each
module's place, its kind of component, its class and the file that defines the class."""

from __future__ import annotations

import functools
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import torch.nn as nn

from .core.attention import MultiHeadAttention


def module_tree(model: Any, name: str = "model") -> dict[str, Any]:
    """A built model as a tree a reader follows through the source: each node is a submodule's
    ``name`` (its attribute), ``kind`` (model, embedding, positional, stack, layer, attention,
    kernel, norm, ffn, head, and torch's building blocks: linear, dropout, activation, ...), ``class``
    and ``file``, the file defining the class (relative to the package, ``core/attention.py``; a
    class of another package from that package's folder: ``torch/nn/modules/linear.py``), then its
    ``children``. Alike layers of a list are one node with ``count``; a module met again (a shared
    token table) has ``same_as``, the path of its first place; a parameter of another module has
    ``tied``: ``{"weight": "src_embed.token.weight"}``. An attention module's kernel is a child of
    kind ``kernel``, a function (``sdpa_kernel()``) or a module."""
    seen: dict[int, str] = {}
    params: dict[int, str] = {}

    def node(module: Any, slot: str, path: str) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": slot,
            "kind": _component_kind(module),
            "class": type(module).__name__,
            "file": _defined_in(type(module)),
        }
        if id(module) in seen:
            return {**entry, "same_as": seen[id(module)]}
        seen[id(module)] = path
        tied = {}
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in params:
                tied[param_name] = params[id(param)]
            else:
                params[id(param)] = f"{path}.{param_name}" if path else param_name
        if tied:
            entry["tied"] = tied
        entry["children"] = children(module, path)
        return entry

    def children(module: Any, path: str) -> list[dict[str, Any]]:
        found = []
        for slot, child in module.named_children():
            where = f"{path}.{slot}" if path else slot
            if type(child) in (nn.ModuleList, nn.ModuleDict):  # a container: its items, alike ones folded into one
                items = [node(item, f"{slot}.{key}", f"{where}.{key}") for key, item in child.named_children()]
                found += _fold(items, slot)
            else:
                found.append(node(child, slot, where))
        kernel = getattr(module, "kernel", None)
        if isinstance(module, MultiHeadAttention) and kernel is not None and not isinstance(kernel, nn.Module):
            names = [entry["name"] for entry in found]  # in the order of the forward pass: before out_proj
            found.insert(names.index("out_proj") if "out_proj" in names else len(found), _kernel_node(kernel))
        return found

    return node(model, name, "")


def _kernel_node(kernel: Any) -> dict[str, Any]:
    """An attention module's kernel that is no module: a function, or a callable object holding settings."""
    target = kernel.func if isinstance(kernel, functools.partial) else kernel
    if inspect.isfunction(target) or inspect.ismethod(target):
        what = f"{target.__qualname__}()"
    else:
        target = type(target)
        what = target.__name__
    return {"name": "kernel", "kind": "kernel", "class": what, "file": _defined_in(target), "children": []}


def _fold(items: list[dict[str, Any]], slot: str) -> list[dict[str, Any]]:
    """Runs of alike items of a list (``layers.0`` to ``layers.5``, built the same) as one node
    ``layers.0-5`` with ``count``; what differs (a shared module, a tied weight) is not alike."""

    def shape(entry: dict[str, Any]) -> Any:
        return json.dumps({k: v for k, v in entry.items() if k != "name"}, sort_keys=True)

    folded: list[dict[str, Any]] = []
    start = 0
    while start < len(items):
        end = start + 1
        while end < len(items) and shape(items[end]) == shape(items[start]):
            end += 1
        if end - start == 1:
            folded.append(items[start])
        else:
            first, last = items[start]["name"].rsplit(".", 1)[1], items[end - 1]["name"].rsplit(".", 1)[1]
            folded.append({**items[start], "name": f"{slot}.{first}-{last}", "count": end - start})
        start = end
    return folded


def _component_kind(module: Any) -> str:
    """What a module is in the model: the ``category`` it carries (every module a component's
    options build is labelled with its category, and the zoo's own module classes declare
    theirs), else torch's building block it is, else ``module``."""
    category = getattr(module, "category", None)
    if isinstance(category, str) and category:
        return category
    torch_blocks: tuple[tuple[str, tuple[type, ...]], ...] = (
        ("embedding", (nn.Embedding,)),
        ("norm", (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.RMSNorm)),
        ("linear", (nn.Linear,)),
        ("conv", (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d)),
        ("dropout", (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)),
        ("activation", (nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Softmax, nn.LeakyReLU)),
        ("sequence", (nn.Sequential,)),
        ("identity", (nn.Identity,)),
    )
    for kind, classes in torch_blocks:
        if isinstance(module, classes):
            return kind
    return "module"


def _defined_in(obj: Any) -> str:
    """The file defining a class or function, relative to its package's folder: ``core/attention.py``
    for this package (whose core/, registry/ and plugins/ are these folders of a checkout),
    ``torch/nn/modules/linear.py`` for another; the module's name when it has no file."""
    module_name = getattr(obj, "__module__", None) or ""
    file = getattr(sys.modules.get(module_name), "__file__", None)
    if not file:
        return f"<{module_name or 'unknown'}>"
    if module_name == "__main__":
        return Path(file).name
    parts = module_name.split(".")
    if parts[0] == __package__:
        parts = parts[1:]
    if Path(file).stem == "__init__":
        parts.append("__init__")
    return "/".join(parts) + ".py"
