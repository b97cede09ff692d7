"""The positional plugin written out in docs/writing-a-plugin.md ("A positional scheme inside
attention") works as printed: registered in-process, FIRE builds into decoder-only and
encoder-decoder models, its parameters train, decoding on the cache equals the whole pass, a saved
model loads with it, and the page's message for a bias of the wrong shape is the one raised."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.decoding import greedy_decode
from transformer_zoo.core.errors import ConfigError
from transformer_zoo.registry import get_registry

DOC = Path(__file__).parents[2] / "docs" / "writing-a-plugin.md"
SIZES = dict(vocab_size=40, d_model=32, n_heads=4, d_ff=64, dropout=0.0)


def block(title: str, language: str = "python") -> str:
    (code,) = re.findall(rf'```{language} title="{re.escape(title)}"\n(.*?)```', DOC.read_text(), re.S)
    return code


@pytest.fixture(scope="module")
def fire():
    """The page's ``fire.py``, run as its own module would run, registered in-process."""
    module = types.ModuleType("fire")
    exec(compile(block("fire.py"), str(DOC), "exec", dont_inherit=True), module.__dict__)
    name = get_registry().register(module, "fire-docs")
    try:
        yield module
    finally:
        get_registry().unregister(name)


def test_the_page_registers_and_uses_it_as_printed(fire):
    code = block("using fire.py").replace("import fire\n", "").replace("tz.register_plugin(fire)\n", "")
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec", dont_inherit=True), namespace)
    assert namespace["logits"].shape == (2, 9, 1000)
    assert isinstance(namespace["lm"].decoder.layers[0].self_attn.positional, fire.FIRE)


def test_one_scheme_per_stack_shared_by_its_layers_and_none_in_cross_attention(fire):
    model = tz.build_model("transformer-tiny", positional={"kind": "fire", "hidden": 8}, **SIZES)
    encoder = {layer.self_attn.positional for layer in model.encoder.layers}
    decoder = {layer.self_attn.positional for layer in model.decoder.layers}
    assert len(encoder) == len(decoder) == 1 and encoder != decoder
    assert all(layer.cross_attn.positional is None for layer in model.decoder.layers)
    src, tgt = torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 5))
    assert torch.isfinite(model(src, tgt).logits).all()


def test_its_parameters_train(fire):
    lm = tz.build_model("transformer-tiny", encoder=None, positional="fire", **SIZES)
    scheme = lm.decoder.layers[0].self_attn.positional
    tokens = torch.randint(3, 40, (2, 9))
    lm.loss(lm(tgt=tokens[:, :-1]), tokens[:, 1:]).backward()
    for name, parameter in scheme.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


@pytest.mark.parametrize("static_cache", [False, True])
def test_decoding_on_the_cache_equals_the_whole_pass(fire, static_cache):
    lm = tz.build_model("transformer-tiny", encoder=None, positional="fire", **SIZES).eval()
    prompt = torch.randint(3, 40, (2, 5))
    cached = greedy_decode(lm, prompt=prompt, max_new_tokens=8, static_cache=static_cache)
    assert torch.equal(cached, greedy_decode(lm, prompt=prompt, max_new_tokens=8, use_cache=False))


def test_a_saved_model_loads_with_it(fire, tmp_path):
    lm = tz.build_model("transformer-tiny", encoder=None, positional="fire", **SIZES).eval()
    with torch.no_grad():
        lm.decoder.layers[0].self_attn.positional.log_c.fill_(0.5)  # not its initial value
    tokens = torch.randint(3, 40, (2, 9))
    loaded = tz.from_pretrained(lm.save_pretrained(tmp_path / "fire-lm"))
    torch.testing.assert_close(loaded(tgt=tokens).logits, lm(tgt=tokens).logits)


def test_kinds_that_form_no_scores_refuse_it_at_validation(fire):
    with pytest.raises(ConfigError, match="fire"):
        tz.load_config("transformer-tiny", {"positional": "fire", "decoder": {"attention": "linear"}})


def test_a_bias_of_the_wrong_shape_is_refused_with_the_pages_message(fire, monkeypatch):
    unpermuted = fire.FIRE.bias

    def bias(self, *args, **kwargs):
        return unpermuted(self, *args, **kwargs).permute(1, 2, 0)  # (Tq, Tk, H): the permute undone

    monkeypatch.setattr(fire.FIRE, "bias", bias)
    torch.manual_seed(0)
    lm = tz.build_model("transformer-tiny", encoder=None, positional={"kind": "fire", "hidden": 16})
    with pytest.raises(ValueError) as raised:
        lm(tgt=torch.randint(3, 1000, (2, 9)))
    (printed,) = re.findall(r"without\s+its\s+final\s+`permute`\s+gives\s+```text\s+(.*?)\s+```", DOC.read_text(), re.S)
    assert str(raised.value) == " ".join(printed.split())


def test_random_offset_is_refused_when_the_model_is_built(fire):
    with pytest.raises(ValueError, match="random_offset shifts additive positions, but fire positions act inside"):
        tz.build_model("transformer-tiny", encoder=None, positional={"kind": "fire", "random_offset": 4}, **SIZES)
