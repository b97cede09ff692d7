"""A third-party plugin package, installed for real, is found through its entry point alone.

The packages are installed with pip into a folder of their own, put on PYTHONPATH of a
subprocess: the environment running the tests is left as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PACKAGES = [ROOT / "examples" / "plugin-package", Path(__file__).parent / "data" / "broken-plugin"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A folder where pip installed the example plugin and the broken one."""
    work = tmp_path_factory.mktemp("plugins")
    target = work / "site"
    for package in PACKAGES:
        copy = shutil.copytree(package, work / package.name)  # keep build files out of the checkout
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
             "--no-index", "--target", str(target), str(copy)],
            check=True, capture_output=True, text=True,
        )
    return target


def run(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, check=False)


def tzoo(site: Path, *args: str) -> subprocess.CompletedProcess:
    return run(site, "-m", "transformer_zoo", *args)


def test_cli_sees_the_new_variant_and_kind(site):
    variants = tzoo(site, "list", "--json")
    assert variants.returncode == 0, variants.stderr
    rows = {row["name"]: row for row in json.loads(variants.stdout)}
    assert rows["cosine-transformer-tiny"]["plugin"] == "example"
    assert "transformer-tiny" in rows, "built-in variants still load beside the plugin"
    kinds = json.loads(tzoo(site, "list", "--kind", "attention", "--json").stdout)
    assert {"cosine", "sdpa"} <= {row["name"] for row in kinds}


def test_schema_includes_the_new_kind(site):
    result = tzoo(site, "schema")
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    (branch,) = [b for b in schema["oneOf"] if "cosine-transformer-tiny" in b["properties"]["variant"]["enum"]]
    (stack,) = [option for option in branch["properties"]["encoder"]["anyOf"] if "anyOf" in option]  # or null
    encoder = next(option for option in stack["anyOf"] if "properties" in option)
    kinds = {o["properties"]["kind"]["const"] for o in encoder["properties"]["attention"]["anyOf"] if "properties" in o}
    assert "cosine" in kinds
    assert "cosine" in encoder["properties"]["attention"]["anyOf"][0]["enum"]


def test_a_broken_plugin_is_reported_and_the_rest_load(site):
    result = tzoo(site, "list")
    assert result.returncode == 0
    assert "cosine-transformer-tiny" in result.stdout and "transformer-tiny" in result.stdout
    assert "plugin 'broken' failed to load" in result.stderr
    assert "a_dependency_that_is_not_installed" in result.stderr
    failed = tzoo(site, "show", "broken-variant")
    assert failed.returncode == 2
    assert "plugin 'broken' failed to load" in failed.stderr, "a failed plugin may be why a name is unknown"


def test_build_train_and_reload_without_importing_the_plugin(site, tmp_path):
    script = f"""
import torch, transformer_zoo as tz
model = tz.build_model("cosine-transformer-tiny", dropout=0.0)
assert type(model.encoder.layers[0].self_attn).__name__ == "CosineAttention"
src, tgt = torch.randint(3, 1000, (2, 7)), torch.randint(3, 1000, (2, 5))
out = model(src, tgt)
assert out.logits.shape == (2, 5, 1000) and torch.isfinite(out.logits).all()
model.loss(out, tgt).backward()
assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
model.eval()
model.save_pretrained(r"{tmp_path}")
again = tz.from_pretrained(r"{tmp_path}")
with torch.no_grad():
    assert torch.equal(again(src, tgt).logits, model(src, tgt).logits)
other = tz.build_model("transformer-tiny", encoder={{"attention": {{"kind": "cosine", "init_scale": 5.0}}}})
print("ok", type(other.encoder.layers[0].self_attn).__name__)
"""
    result = run(site, "-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok CosineAttention"
