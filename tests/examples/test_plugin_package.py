"""A third-party plugin package, installed for real, is found through its entry point alone.

pip installs the example plugin (``examples/plugin-package``) and a broken one
(``data/broken-plugin``, whose module fails to import) into a folder of their own; each check
runs in a subprocess with that folder on ``PYTHONPATH``. The environment running the tests is
left as it was, and no check imports the plugin itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from transformer_zoo.core.options import AttentionOptions

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "plugin-package"
BROKEN = Path(__file__).parent / "data" / "broken-plugin"
TZOO_SCRIPT = Path(sys.executable).with_name("tzoo")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder where one pip run installed the example plugin and the broken one."""
    assert importlib.util.find_spec("setuptools") is not None, "pip --no-build-isolation needs setuptools installed"
    for module in ("tzoo_example_plugin", "tzoo_broken_plugin"):
        assert importlib.util.find_spec(module) is None, f"{module} is installed in the test environment; uninstall it"
    work = tmp_path_factory.mktemp("plugins")
    # Build from copies so that no build/ or *.egg-info folder lands in the checkout.
    artefacts = shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    copies = [shutil.copytree(package, work / package.name, ignore=artefacts) for package in (EXAMPLE, BROKEN)]
    target = work / "site"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-cache-dir",
            "--no-index",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            *map(str, copies),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, f"pip install failed:\n{result.stdout}\n{result.stderr}"
    return target


@pytest.fixture(scope="module")
def listing(site: Path, tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """What a plain ``tzoo list`` printed, with both plugins installed."""
    return tzoo(site, tmp_path_factory.mktemp("list"), "list")


def run(site: Path, cwd: Path, *command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in ``cwd`` (an empty folder: nothing of the checkout importable by accident)
    with the installed plugins on the path (and ``env``, default this process's environment)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, check=False, timeout=120)


def tzoo(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``tzoo`` command (its console script, or ``python -m transformer_zoo`` where there is none)."""
    command = [str(TZOO_SCRIPT)] if TZOO_SCRIPT.is_file() else [sys.executable, "-m", "transformer_zoo"]
    return run(site, cwd, *command, *args)


def python(site: Path, cwd: Path, script: str) -> subprocess.CompletedProcess[str]:
    """Run a Python ``script`` with the same interpreter as the tests."""
    return run(site, cwd, sys.executable, "-c", script)


def plugin_warnings(stderr: str) -> list[str]:
    """The warning lines ``tzoo`` printed on standard error."""
    return [line for line in stderr.splitlines() if "warning" in line.lower()]


def find_kind_schemas(node: Any, kind: str) -> list[dict[str, Any]]:
    """Every sub-schema of ``node`` describing options whose ``kind`` is the constant ``kind``."""
    found = []
    if isinstance(node, dict):
        properties = node.get("properties")
        if isinstance(properties, dict) and isinstance(properties.get("kind"), dict):
            if properties["kind"].get("const") == kind:
                found.append(node)
        for value in node.values():
            found += find_kind_schemas(value, kind)
    elif isinstance(node, list):
        for value in node:
            found += find_kind_schemas(value, kind)
    return found


# ---- the command line ---------------------------------------------------------------------
def test_tzoo_list_shows_the_new_variant(site: Path, tmp_path: Path, listing: subprocess.CompletedProcess[str]) -> None:
    assert listing.returncode == 0, listing.stderr
    assert "cosine-transformer-tiny" in listing.stdout
    result = tzoo(site, tmp_path, "list", "cosine-*", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        {
            "name": "cosine-transformer-tiny",
            "family": "transformer",
            "plugin": "example",
            "description": "transformer-tiny with cosine attention in every attention block",
        }
    ]


def test_tzoo_list_kind_attention_shows_the_new_kind(site: Path, tmp_path: Path) -> None:
    table = tzoo(site, tmp_path, "list", "--kind", "attention")
    assert table.returncode == 0, table.stderr
    assert "cosine" in table.stdout
    result = tzoo(site, tmp_path, "list", "--kind", "attention", "--json")
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["cosine"]["plugin"] == "example"
    assert rows["cosine"]["description"].startswith("Multi-head attention on cosine similarities")
    assert "sdpa" in rows, "the built-in kinds still load beside the plugin's"


def test_tzoo_schema_holds_the_new_kind(site: Path, tmp_path: Path) -> None:
    result = tzoo(site, tmp_path, "schema")
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    variants = {name for branch in schema["oneOf"] for name in branch["properties"]["variant"].get("enum", [])}
    assert "cosine-transformer-tiny" in variants
    cosine = find_kind_schemas(schema, "cosine")
    assert cosine, "no schema for the attention kind 'cosine'"
    for options in cosine:
        assert set(options["properties"]) == {*AttentionOptions.model_fields, "init_scale"}, "the inherited fields stay"
        assert options["properties"]["init_scale"]["description"]
        assert options["properties"]["init_scale"]["exclusiveMinimum"] == 0

    validator = jsonschema.Draft202012Validator(schema)
    for variant in ("cosine-transformer-tiny", "transformer-tiny"):
        config = {"variant": variant, "decoder": {"cross_attention": {"kind": "cosine", "init_scale": 4.0}}}
        assert list(validator.iter_errors(config)) == []
        config["decoder"]["cross_attention"]["init_scale"] = -1.0
        assert list(validator.iter_errors(config)) != []


def test_a_broken_plugin_is_reported_by_name_and_the_rest_load(
    site: Path, tmp_path: Path, listing: subprocess.CompletedProcess[str]
) -> None:
    assert listing.returncode == 0, listing.stderr
    names = {line.split()[0] for line in listing.stdout.splitlines()[1:]}  # piped: plain rows, a header first
    assert {"cosine-transformer-tiny", "transformer", "transformer-base", "transformer-tiny"} <= names, names
    warnings = plugin_warnings(listing.stderr)
    assert len(warnings) == 1, listing.stderr
    assert re.search(r"\bbroken\b", warnings[0]) and "a_dependency_that_is_not_installed" in warnings[0]
    assert "Traceback" not in listing.stderr

    unknown = tzoo(site, tmp_path, "show", "broken-variant")
    assert unknown.returncode == 2
    assert "Traceback" not in unknown.stderr
    assert "broken-variant" in unknown.stderr
    # A plugin that failed to load may be why a name is unknown: the warning comes with the error.
    assert any(re.search(r"\bbroken\b", line) for line in plugin_warnings(unknown.stderr)), unknown.stderr


def test_entry_point_autoload_can_be_disabled(site: Path, tmp_path: Path) -> None:
    env = {**os.environ, "TZOO_DISABLE_PLUGIN_AUTOLOAD": "1"}
    result = run(site, tmp_path, sys.executable, "-m", "transformer_zoo", "list", "--json", env=env)
    assert result.returncode == 0, result.stderr
    names = {row["name"] for row in json.loads(result.stdout)}
    assert "transformer-tiny" in names and "cosine-transformer-tiny" not in names
    assert plugin_warnings(result.stderr) == [], "the broken plugin is not even tried"
    env["TZOO_PLUGINS"] = "tzoo_example_plugin.plugin"  # named modules still load
    result = run(site, tmp_path, sys.executable, "-m", "transformer_zoo", "list", "cosine-*", "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert [row["name"] for row in json.loads(result.stdout)] == ["cosine-transformer-tiny"]


# ---- the Python API -----------------------------------------------------------------------
def test_plugin_errors_name_the_broken_plugin(site: Path, tmp_path: Path) -> None:
    script = (
        "import warnings, transformer_zoo as tz\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    errors = tz.plugin_errors()\n"
        "print(sorted(errors), [type(w.message).__name__ for w in caught])\n"
    )
    result = python(site, tmp_path, script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['broken'] ['PluginWarning']"


TRAIN_AND_RELOAD = """
import torch, transformer_zoo as tz

torch.manual_seed(0)
model = tz.build_model("cosine-transformer-tiny", dropout=0.0)
encoder, decoder = model.encoder.layers[0], model.decoder.layers[0]
blocks = {type(m).__name__ for m in (encoder.self_attn, decoder.self_attn, decoder.cross_attn)}
assert blocks == {"CosineAttention"}, blocks
src, tgt = torch.randint(3, 1000, (2, 7)), torch.randint(3, 1000, (2, 5))
out = model(src, tgt)
assert out.logits.shape == (2, 5, 1000), out.logits.shape
assert torch.isfinite(out.logits).all()
loss = model.loss(out, tgt)
loss.backward()
assert torch.isfinite(loss)
for name, p in model.named_parameters():
    assert p.grad is not None and torch.isfinite(p.grad).all(), name
temperature = dict(model.named_parameters())["encoder.layers.0.self_attn.log_scale"]
assert temperature.grad is not None and temperature.grad != 0, "the temperature is not learned"
torch.optim.SGD(model.parameters(), lr=0.5).step()  # move every weight, the temperature too, off its initial value
model.eval()
model.save_pretrained(OUT)
again = tz.from_pretrained(OUT)
assert torch.equal(again.encoder.layers[0].self_attn.log_scale, encoder.self_attn.log_scale)
with torch.no_grad():
    assert torch.equal(again(src, tgt).logits, model(src, tgt).logits)
print("ok")
"""


def test_build_train_save_and_reload_without_importing_the_plugin(site: Path, tmp_path: Path) -> None:
    result = python(site, tmp_path, f"OUT = {str(tmp_path / 'saved')!r}\n" + TRAIN_AND_RELOAD)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["encoder"]["attention"]["kind"] == "cosine"


MASKS_AND_CACHE = """
import torch, transformer_zoo as tz
from transformer_zoo.core.decoding import greedy_decode
from transformer_zoo.core.cache import DecoderCache

torch.manual_seed(0)
model = tz.build_model("cosine-transformer-tiny", dropout=0.0).eval()
src, tgt = torch.randint(3, 1000, (2, 7)), torch.randint(3, 1000, (2, 5))
src_mask = torch.ones(2, 7, dtype=torch.long)
src_mask[0, 4:] = 0
with torch.no_grad():
    # Causal: a later target token never changes an earlier output.
    later = tgt.clone()
    later[:, -1] = 3 + (tgt[:, -1] - 2) % 997
    a, b = model(src, tgt).logits, model(src, later).logits
    assert torch.allclose(a[:, :-1], b[:, :-1], atol=1e-5) and not torch.allclose(a[:, -1], b[:, -1])

    # Padding: what padded source positions hold never matters, to the encoder or to cross-attention.
    other = src.clone()
    other[0, 4:] = 5
    a = model(src, tgt, src_mask=src_mask).logits
    assert torch.allclose(a, model(other, tgt, src_mask=src_mask).logits, atol=1e-5)
    assert not torch.allclose(model(src, tgt).logits, model(other, tgt).logits)

    # Weights, when asked for: rows sum to one and padded keys get none.
    out = model(src, tgt, src_mask=src_mask, need_weights=True)
    assert torch.equal(out.logits, a)
    for stack, block, length in (("encoder", "self", 7), ("decoder", "self", 5), ("decoder", "cross", 7)):
        weights = out.attentions[stack][0][block]
        assert weights.shape == (2, 4, weights.size(2), length), (stack, block, weights.shape)
        assert torch.allclose(weights.sum(-1), torch.ones(()), atol=1e-5), (stack, block)
    assert (out.attentions["encoder"][0]["self"][0, ..., 4:] == 0).all()
    assert (out.attentions["decoder"][0]["cross"][0, ..., 4:] == 0).all()
    assert (out.attentions["decoder"][0]["self"].triu(1) == 0).all()

    # Cache: decoding one token at a time on the cache equals decoding the whole target at once.
    memory = model.encode(src, src_mask).hidden
    full = model.decode(tgt, memory, src_mask=src_mask).hidden
    cache = DecoderCache()
    steps = [model.decode(tgt[:, i : i + 1], memory, src_mask=src_mask, cache=cache).hidden for i in range(5)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)

# A query with no key to attend to (left padding under the causal mask) gets zero weights, not NaN.
lm = tz.build_model("cosine-transformer-tiny", encoder=None, dropout=0.0)
ids, ids_mask = torch.randint(3, 1000, (2, 6)), torch.ones(2, 6, dtype=torch.long)
ids_mask[0, :2] = 0
out = lm(ids, tgt_mask=ids_mask, need_weights=True)
assert (out.attentions["decoder"][0]["self"][0, :, :2] == 0).all()
lm.loss(out, ids).backward()
assert torch.isfinite(out.logits).all() and all(torch.isfinite(p.grad).all() for p in lm.parameters())

for positional in ("rotary", "alibi"):
    # In-attention positions are applied: without them an encoder would be permutation-equivariant.
    encoder = tz.build_model("cosine-transformer-tiny", decoder=None, positional=positional, dropout=0.0).eval()
    ids, order = torch.randint(3, 1000, (2, 9)), torch.randperm(9)
    with torch.no_grad():
        moved = encoder(ids[:, order]).logits
        assert not torch.allclose(moved, encoder(ids).logits[:, order], atol=1e-3), f"{positional} had no effect"

    # The same positions in a decoder-only model: a prompt, then single tokens, on the cache.
    lm = tz.build_model("cosine-transformer-tiny", encoder=None, positional=positional, dropout=0.0).eval()
    ids = torch.randint(3, 1000, (2, 9))
    with torch.no_grad():
        full = lm(ids).logits
        cache = DecoderCache()
        steps = [lm.decode(ids[:, :4], cache=cache).hidden]
        steps += [lm.decode(ids[:, i : i + 1], cache=cache).hidden for i in range(4, 9)]
        assert torch.allclose(lm.head(torch.cat(steps, dim=1)), full, atol=1e-4), positional
    fast = greedy_decode(lm, prompt=ids, max_new_tokens=6)
    slow = greedy_decode(lm, prompt=ids, max_new_tokens=6, use_cache=False)
    assert fast.shape == (2, 15) and torch.equal(fast, slow), positional
print("ok")
"""


def test_the_new_kind_honours_masks_cache_and_positions(site: Path, tmp_path: Path) -> None:
    result = python(site, tmp_path, MASKS_AND_CACHE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


OPTIONS = """
import math, torch, transformer_zoo as tz

registry = tz.get_registry()
assert registry.provider("attention", "cosine") == "example"
assert registry.provider("variant", "cosine-transformer-tiny") == "example"
assert set(registry.load_errors) == {"broken"}, registry.load_errors

model = tz.build_model("transformer-tiny", encoder={"attention": {"kind": "cosine", "init_scale": 5.0}})
attention = model.encoder.layers[0].self_attn
assert type(attention).__name__ == "CosineAttention"
assert math.isclose(attention.log_scale.exp().item(), 5.0, rel_tol=1e-6)
assert type(model.decoder.layers[0].self_attn).__name__ == "MultiHeadAttention"

unbiased = tz.build_model("transformer-tiny", encoder={"attention": {"kind": "cosine", "bias": False}})
assert unbiased.encoder.layers[0].self_attn.in_proj.bias is None, "the inherited bias is passed on"

for bad, field in (({"init_scale": -1.0}, "init_scale"), ({"init_scal": 2.0}, "init_scal"),
                   ({"scale": 2.0}, "cosine attention does not apply scale")):
    try:
        tz.build_model("transformer-tiny", encoder={"attention": {"kind": "cosine", **bad}})
    except tz.ConfigError as error:
        assert field in str(error) and "encoder.attention" in str(error), error
    else:
        raise AssertionError(f"{bad} was accepted")
print("ok")
"""


def test_the_new_kind_is_validated_like_a_built_in_one(site: Path, tmp_path: Path) -> None:
    result = python(site, tmp_path, OPTIONS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


LINEAR = """
import torch, torch.nn.functional as F, transformer_zoo as tz
from transformer_zoo.core.decoding import greedy_decode
from transformer_zoo.core.attention import AttentionMask
from transformer_zoo.core.cache import DecoderCache

registry = tz.get_registry()
assert registry.provider("attention", "simple-linear") == "example"
assert registry.component("attention", "simple-linear").full is False, "not softmax attention: measured against full twins"


def reference(attn, x, padding, causal):
    # (phi(q) phi(k)^T, masked) v / its row sums, written out with the layer's own projections
    b, t, d = x.shape
    q, k, v = (part.view(b, t, attn.n_heads, -1).transpose(1, 2) for part in attn.in_proj(x).chunk(3, dim=-1))
    scores = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-2, -1)  # (B, H, T, T)
    allowed = padding[:, None, None, :] & (torch.ones(t, t).tril().bool() if causal else True)
    weights = scores * allowed / (scores * allowed).sum(-1, keepdim=True)
    return attn.out_proj((weights @ v).transpose(1, 2).reshape(b, t, d)), weights


torch.manual_seed(0)
x = torch.randn(2, 9, 32)
padding = torch.ones(2, 9, dtype=torch.bool)
padding[1, 6:] = False
sizes = dict(vocab_size=50, d_model=32, n_heads=4, d_ff=64, dropout=0.0)
for causal in (False, True):
    stack = {"layers": 1, "attention": "simple-linear"}
    model = tz.build_model("transformer-tiny", encoder=None if causal else stack, decoder=stack if causal else None,
                           **sizes).eval()
    attn = (model.decoder if causal else model.encoder).layers[0].self_attn
    with torch.no_grad():
        expected, expected_weights = reference(attn, x, padding, causal)
        out, _ = attn(x, mask=AttentionMask(padding=padding, causal=causal))
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        out, weights = attn(x, mask=AttentionMask(padding=padding, causal=causal), need_weights=True)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-5)
        ids = torch.randint(3, 50, (2, 9))
        logits = model(ids, tgt_mask=padding).logits if causal else model(ids, src_mask=padding).logits
        assert torch.isfinite(logits).all()

# Cached decoding, a prompt then one token at a time, equals the uncached pass.
lm = tz.build_model("transformer-tiny", encoder=None, decoder={"layers": 2, "attention": "simple-linear"}, **sizes).eval()
ids = torch.randint(3, 50, (2, 11))
with torch.no_grad():
    full = lm(ids).logits
    cache = DecoderCache()
    steps = [lm.decode(ids[:, :4], cache=cache).hidden] + [lm.decode(ids[:, i : i + 1], cache=cache).hidden
                                                           for i in range(4, 11)]
    torch.testing.assert_close(lm.head(torch.cat(steps, dim=1)), full, atol=1e-5, rtol=1e-5)
assert torch.equal(greedy_decode(lm, prompt=ids, max_new_tokens=6),
                   greedy_decode(lm, prompt=ids, max_new_tokens=6, use_cache=False))

# It trains, with attention dropout; and ALiBi, a bias on scores it never forms, is refused at validation.
lm = tz.build_model("transformer-tiny", encoder=None, decoder={"layers": 1, "attention": "simple-linear"},
                    **{**sizes, "dropout": 0.1})
lm.loss(lm(ids), ids).backward()
assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in lm.parameters())
try:
    tz.load_config("transformer-tiny", {"positional": "alibi", "encoder": {"attention": "simple-linear"}})
except tz.ConfigError as error:
    assert "encoder.attention" in str(error) and "rotary" in str(error), error
else:
    raise AssertionError("linear attention with ALiBi was accepted")
print("ok")
"""


def test_the_linear_kind_equals_the_written_out_formula_and_decodes_on_the_cache(site: Path, tmp_path: Path) -> None:
    result = python(site, tmp_path, LINEAR)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_linear_kind_in_the_docs_is_the_file_the_package_ships() -> None:
    page = (ROOT / "docs" / "writing-a-plugin.md").read_text()
    shown = re.search(r'```python title="tzoo_example_plugin/linear.py"\n(.*?)```', page, flags=re.DOTALL)
    shipped = EXAMPLE / "tzoo_example_plugin" / "linear.py"
    assert shown is not None and shown.group(1) == shipped.read_text()
    assert len(shipped.read_text().splitlines()) <= 40, "the worked example stays a kind of at most 40 lines"


# ---- the page's examples of the installed package ------------------------------------------
DOCS_RUNNER = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from docs_pages import blocks, run_python

page = {{block.key: block for block in blocks("docs/writing-a-plugin.md")}}
run_python(page["with the package installed"], {{}})
tests = {{}}
run_python(page["test_my_plugin.py"], tests)
for name, test in tests.items():
    if name.startswith("test_"):
        test()
print("ok")
"""


def test_the_pages_examples_run_with_the_package_installed(site: Path, tmp_path: Path) -> None:
    """docs/writing-a-plugin.md's commands and Python after `pip install ./examples/plugin-package`
    (the fixture's pip run): the commands print what their comments say, the Python block raises
    the error its comment shows, and the page's tests of the plugin pass."""
    from docs_pages import blocks, commands

    (block,) = [block for block in blocks("docs/writing-a-plugin.md") if block.key.startswith("pip install ")]
    pip, *rest = commands(block.code)
    assert pip.words == ["pip", "install", "./examples/plugin-package"]
    for command in rest:
        assert command.words[0] == "tzoo"
        result = tzoo(site, tmp_path, *command.words[1:])
        assert result.returncode == 0, result.stderr
        if command.words[1:3] == ["list", "--kind"]:  # cosine and simple-linear next to sdpa, from plugin example
            rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:]}
            assert {"cosine", "simple-linear", "sdpa"} <= set(rows) and "example" in rows["cosine"]
    result = python(site, tmp_path, DOCS_RUNNER)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
