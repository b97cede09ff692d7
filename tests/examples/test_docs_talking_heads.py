"""The talking-heads kind written out in docs/writing-a-plugin.md ("Learned parameters in a kernel")
works as printed: it equals the paper's formula written out, its mixing matrices are parameters
of the model (they train, move and are saved), and a saved model loads with them."""

from __future__ import annotations

import math
import re
import types
from pathlib import Path

import pytest
import torch

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask
from transformer_zoo.registry import get_registry

DOC = Path(__file__).parents[2] / "docs" / "writing-a-plugin.md"
SIZES = dict(vocab_size=50, d_model=32, n_heads=4, d_ff=64, dropout=0.0)


@pytest.fixture(scope="module")
def plugin():
    """The page's ``talking_heads.py``, run as its own module would run, registered in-process."""
    (code,) = re.findall(r'```python title="talking_heads.py"\n(.*?)```', DOC.read_text(), re.S)
    module = types.ModuleType("talking_heads")
    exec(compile(code, str(DOC), "exec", dont_inherit=True), module.__dict__)
    name = get_registry().register(module, "talking-heads-docs")
    try:
        yield module
    finally:
        get_registry().unregister(name)


def reference(attn, x, mask, logits_mix, weights_mix):
    """Talking-heads attention (Shazeer et al. 2020) with the layer's own projections, written out."""
    b, t, d = x.shape
    h, dh = attn.n_heads, attn.d_head
    w_q, w_k, w_v = attn.in_proj.weight.chunk(3, dim=0)
    b_q, b_k, b_v = attn.in_proj.bias.chunk(3, dim=0)
    q, k, v = ((x @ w.T + bias).view(b, t, h, dh) for w, bias in ((w_q, b_q), (w_k, b_k), (w_v, b_v)))  # (B, T, H, Dh)
    logits = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(dh)
    logits = torch.einsum("bhij,hg->bgij", logits, logits_mix)
    allowed = mask.dense(t, t)
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    weights = torch.einsum("bhij,hg->bgij", logits.softmax(-1), weights_mix)
    out = torch.einsum("bhij,bjhd->bihd", weights, v).reshape(b, t, d)
    return attn.out_proj(out), weights


def test_the_documented_kind_equals_the_formula_written_out(plugin):
    torch.manual_seed(0)
    model = tz.build_model(
        "transformer-tiny", encoder=None, decoder={"layers": 1, "attention": "my-talking-heads"}, **SIZES
    ).eval()
    attn = model.decoder.layers[0].self_attn
    assert isinstance(attn.kernel, plugin.TalkingHeadsKernel)
    with torch.no_grad():
        attn.kernel.logits_mix.copy_(torch.randn(4, 4))
        attn.kernel.weights_mix.copy_(torch.randn(4, 4))
    x = torch.randn(2, 7, 32)
    padding = torch.ones(2, 7, dtype=torch.bool)
    padding[1, 5:] = False
    for mask in (AttentionMask(), AttentionMask(causal=True), AttentionMask(padding=padding, causal=True)):
        expected, expected_weights = reference(attn, x, mask, attn.kernel.logits_mix, attn.kernel.weights_mix)
        with torch.no_grad():
            out, weights = attn(x, mask=mask, need_weights=True)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-5)


def test_at_initialisation_it_is_multi_head_attention(plugin):
    torch.manual_seed(0)
    talking = tz.build_model(
        "transformer-tiny", encoder={"layers": 1, "attention": "my-talking-heads"}, decoder={"layers": 1}, **SIZES
    ).eval()
    plain = tz.build_model("transformer-tiny", encoder={"layers": 1}, decoder={"layers": 1}, **SIZES).eval()
    plain.load_state_dict({k: v for k, v in talking.state_dict().items() if ".kernel." not in k})
    src, tgt = torch.randint(3, 50, (2, 6)), torch.randint(3, 50, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(talking(src, tgt).logits, plain(src, tgt).logits, atol=1e-5, rtol=1e-5)


def test_the_mixing_matrices_are_parameters_that_train_and_move(plugin):
    model = tz.build_model(
        "transformer-tiny", encoder={"layers": 2, "attention": "my-talking-heads"}, decoder={"layers": 1}, **SIZES
    )
    names = dict(model.named_parameters())
    mixing = [f"encoder.layers.{i}.self_attn.kernel.{m}" for i in range(2) for m in ("logits_mix", "weights_mix")]
    assert all(names[name].shape == (4, 4) for name in mixing)
    assert names[mixing[0]] is not names[mixing[2]], "each layer has its own kernel module"
    assert not any(".kernel." in name for name in names if name.startswith("decoder."))
    src, tgt = torch.randint(3, 50, (2, 6)), torch.randint(3, 50, (2, 5))
    model.loss(model(src, tgt), tgt).backward()
    assert all(names[name].grad is not None and names[name].grad.abs().sum() > 0 for name in mixing)
    model.to(torch.float64)
    assert model.encoder.layers[0].self_attn.kernel.logits_mix.dtype == torch.float64


def test_a_saved_model_loads_with_its_mixing_matrices(plugin, tmp_path):
    torch.manual_seed(0)
    model = tz.build_model(
        "transformer-tiny",
        encoder={"layers": 1, "attention": {"kind": "my-talking-heads", "scale": 0.5}},
        decoder={"layers": 1},
        **SIZES,
    ).eval()
    with torch.no_grad():
        model.encoder.layers[0].self_attn.kernel.weights_mix.copy_(torch.randn(4, 4))
    again = tz.from_pretrained(model.save_pretrained(tmp_path / "talking"))
    assert again.encoder.layers[0].self_attn.scale == 0.5
    for name, tensor in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name
    src, tgt = torch.randint(3, 50, (2, 6)), torch.randint(3, 50, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(again(src, tgt).logits, model(src, tgt).logits)
