"""The mixture-of-experts feed-forward (ffn kind ``moe``): routing against a reference written out
token by token, capacity and dropped tokens, padding, the load-balancing loss in the model's loss,
determinism, and the one-expert case against the dense FFN."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import transformer_zoo as tz
from transformer_zoo.core.attention import AttentionMask
from transformer_zoo.core.decoding import greedy_decode
from transformer_zoo.core.layers import FeedForward, TransformerLayer
from transformer_zoo.core.moe import MixtureOfExperts
from transformer_zoo.registry import get_registry
from transformer_zoo.training.config import load_train_config, model_config_for
from transformer_zoo.training.step import Stepper

D_MODEL, D_FF = 8, 16


def moe(
    experts: int = 4, top_k: int = 1, capacity_factor: float = 1.25, aux_loss_weight: float = 0.01, seed: int = 0
) -> MixtureOfExperts:
    options = get_registry().component("ffn", "moe")(
        experts=experts, top_k=top_k, capacity_factor=capacity_factor, aux_loss_weight=aux_loss_weight
    )
    torch.manual_seed(seed)
    return options.build(d_model=D_MODEL, d_ff=D_FF, dropout=0.0)


def padded_batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(2, 8, D)`` inputs whose second sequence ends in 3 padding positions: 13 real tokens."""
    generator = torch.Generator().manual_seed(seed)
    real = torch.ones(2, 8, dtype=torch.bool)
    real[1, 5:] = False
    return torch.randn(2, 8, D_MODEL, generator=generator), real


def reference(module: MixtureOfExperts, x: torch.Tensor, real: torch.Tensor, capacity_factor: float):
    """The routing written out: each real token's top-k experts by router probability, slots taken
    first choices first, tokens in batch order, an assignment past capacity dropped. Returns the
    output, the assignments each expert took, the number dropped, the capacity and the aux loss."""
    experts, k = len(module.experts), module.top_k
    tokens, mask = x.reshape(-1, D_MODEL), real.reshape(-1).tolist()
    n_real = sum(mask)
    capacity = min(math.ceil(capacity_factor * n_real * k / experts), n_real)
    probs = torch.softmax(tokens @ module.router.weight.T, dim=-1)
    choices = [sorted(range(experts), key=lambda e: -probs[t, e].item())[:k] for t in range(len(tokens))]
    out, load, dropped = torch.zeros_like(tokens), [0] * experts, 0
    for j in range(k):
        for t, choice in enumerate(choices):
            if not mask[t]:
                continue
            e = choice[j]
            if load[e] == capacity:
                dropped += 1
                continue
            load[e] += 1
            gate = probs[t, e] / sum(probs[t, c] for c in choice) if k == 2 else probs[t, e]
            out[t] += gate * module.experts[e](tokens[t : t + 1])[0]
    first = [sum(1 for t, c in enumerate(choices) if mask[t] and c[0] == e) / n_real for e in range(experts)]
    mean_prob = [sum(probs[t, e].item() for t in range(len(tokens)) if mask[t]) / n_real for e in range(experts)]
    aux = module.aux_loss_weight * experts * sum(f * p for f, p in zip(first, mean_prob))
    return out.view(x.shape), load, dropped, capacity, aux


@pytest.mark.parametrize(
    ("top_k", "capacity_factor", "overflows"),
    [
        (1, 4.0, False),
        (1, 0.5, True),
        (2, 2.0, False),
        (2, 0.5, True),
    ],
)
def test_routing_equals_the_reference_written_out_token_by_token(top_k, capacity_factor, overflows):
    module = moe(top_k=top_k, capacity_factor=capacity_factor)
    x, real = padded_batch()
    with torch.no_grad():
        out = module(x, real=real)
        expected, load, dropped, capacity, aux = reference(module, x, real, capacity_factor)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    routing = module.routing
    assert routing.tokens.tolist() == load and routing.dropped.item() == dropped and routing.capacity.item() == capacity
    assert (dropped > 0) == overflows
    assert sum(load) + dropped == 13 * top_k, "every real token's choices are taken or dropped, padding is neither"
    assert routing.aux_loss.item() == pytest.approx(aux, rel=1e-6)


def test_dropped_tokens_pass_through_the_residual_unchanged():
    module = moe(top_k=1, capacity_factor=0.5)  # capacity 2 of 13 real tokens on 4 experts: at least 5 dropped

    class NoAttention(nn.Module):
        def forward(self, x, mask=None, cache=None, need_weights=False):
            return torch.zeros_like(x), None

    norms = [nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)]
    layer = TransformerLayer(NoAttention(), module, norms, placement="pre").eval()
    x, real = padded_batch()
    with torch.no_grad():
        layer_out, _ = layer(x, self_mask=AttentionMask(padding=real))
        kept = module(layer.norms[1](x), real=real).abs().sum(-1) > 0  # what the layer's ffn gave each token
    dropped = real & ~kept
    assert dropped.sum() == module.routing.dropped > 0
    assert torch.equal(layer_out[dropped], x[dropped]) and torch.equal(layer_out[~real], x[~real])
    assert not torch.equal(layer_out[kept], x[kept])


def test_padding_is_neither_routed_nor_counted():
    module = moe(top_k=2, capacity_factor=0.5)
    x, real = padded_batch()
    other = torch.where(real.unsqueeze(-1), x, 100 * torch.randn_like(x))  # different padding
    with torch.no_grad():
        out = module(x, real=real)
        first = module.routing
        out_other = module(other, real=real)
    assert torch.equal(out[~real], torch.zeros_like(out[~real])), "padding gets no expert's output"
    torch.testing.assert_close(out_other[real], out[real], atol=0, rtol=0)
    for name in ("tokens", "dropped", "capacity", "aux_loss"):
        assert torch.equal(getattr(module.routing, name), getattr(first, name)), name
    assert first.capacity.item() == math.ceil(0.5 * 13 * 2 / 4), "the capacity counts the 13 real tokens only"


def tiny(seed: int = 0, **ffn) -> nn.Module:
    torch.manual_seed(seed)
    return tz.build_model("transformer-tiny", ffn={"kind": "moe", **ffn}, dropout=0.0, vocab_size=50)


def inputs(vocab_size: int = 50) -> dict[str, torch.Tensor]:
    """A source of 12 real tokens (the first sequence padded after 5) and a target of 12."""
    generator = torch.Generator().manual_seed(3)
    src = torch.randint(1, vocab_size, (2, 7), generator=generator)
    src_mask = torch.ones(2, 7, dtype=torch.long)
    src_mask[0, 5:] = 0
    return {"src": src, "tgt": torch.randint(1, vocab_size, (2, 6), generator=generator), "src_mask": src_mask}


def test_the_load_balancing_loss_is_the_formula_and_joins_the_model_loss():
    model = tiny(experts=4, top_k=2, aux_loss_weight=0.1)
    seen = []
    for module in model.modules():
        if isinstance(module, MixtureOfExperts):
            module.register_forward_hook(
                lambda m, args, kwargs, out: seen.append((m, args[0], kwargs.get("real"))), with_kwargs=True
            )
    out = model(**inputs())
    assert len(seen) == len(model.encoder.layers) + len(model.decoder.layers)
    by_hand = 0.0
    for module, x, real in seen:
        real = torch.ones(x.shape[:2], dtype=torch.bool) if real is None else real
        probs = torch.softmax(x.reshape(-1, x.size(-1)) @ module.router.weight.T, -1)[real.reshape(-1)]  # (N_real, E)
        f = torch.bincount(probs.argmax(-1), minlength=4).float() / len(probs)
        by_hand += 0.1 * 4 * (f * probs.mean(0)).sum()
    torch.testing.assert_close(out.aux_loss, by_hand, atol=1e-6, rtol=0)
    targets = torch.randint(1, 50, (2, 6))
    torch.testing.assert_close(model.loss(out, targets), model.head.loss(out.logits, targets) + by_hand)
    assert out.extras["encoder_moe_tokens"].shape == (len(model.encoder.layers), 4)
    assert (out.extras["encoder_moe_tokens"].sum(-1) + out.extras["encoder_moe_dropped"] == 2 * 12).all(), (
        "12 real source tokens, two choices each; padding not counted"
    )
    assert out.extras["decoder_moe_capacity"].tolist() == [math.ceil(1.25 * 12 * 2 / 4)] * len(model.decoder.layers)
    model.loss(out, targets).backward()
    assert all(p.grad is not None for p in model.parameters()), "every expert and router gets a gradient"


def test_routing_is_deterministic_for_a_seed():
    first, second = tiny(seed=5, experts=4, capacity_factor=0.5), tiny(seed=5, experts=4, capacity_factor=0.5)
    with torch.no_grad():
        a, b, again = first(**inputs()), second(**inputs()), first(**inputs())
    for out in (b, again):
        assert torch.equal(out.logits, a.logits) and out.extras.keys() == a.extras.keys()
        assert all(torch.equal(out.extras[key], a.extras[key]) for key in a.extras)
    assert a.extras["encoder_moe_dropped"].sum() > 0, "the capacity binds, and drops the same tokens each time"


def test_one_expert_with_room_for_every_token_is_the_dense_ffn():
    module = moe(experts=1, top_k=1, capacity_factor=1.0)
    dense = FeedForward(D_MODEL, D_FF)
    dense.load_state_dict(module.experts[0].state_dict())
    x, real = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(module(x), dense(x), atol=1e-6, rtol=0)
        torch.testing.assert_close(module(x, real=real)[real], dense(x)[real], atol=1e-6, rtol=0)
    assert module.routing.dropped == 0 and module.routing.aux_loss.item() == pytest.approx(0.01)  # f = P = 1

    model = tiny(experts=1, capacity_factor=1.0)
    torch.manual_seed(0)
    mlp = tz.build_model("transformer-tiny", dropout=0.0, vocab_size=50).eval()
    state = {
        key.replace("ffn.experts.0.", "ffn."): value
        for key, value in model.state_dict().items()
        if ".router." not in key
    }
    mlp.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(**inputs()).logits, mlp(**inputs()).logits, atol=1e-5, rtol=0)


def test_top_k_needs_enough_experts_and_is_one_or_two():
    with pytest.raises(tz.ConfigError, match="top_k=2 needs at least 2 experts"):
        tz.load_config("transformer-tiny", {"ffn": {"kind": "moe", "experts": 1, "top_k": 2}})
    with pytest.raises(tz.ConfigError, match="top_k"):
        tz.load_config("transformer-tiny", {"ffn": {"kind": "moe", "top_k": 3}})


def test_a_model_with_experts_takes_training_steps_and_round_trips(tmp_path):
    config = load_train_config(
        {
            "model": {
                "variant": "transformer-tiny",
                "d_model": 16,
                "n_heads": 2,
                "d_ff": 32,
                "dropout": 0.1,
                "ffn": {"kind": "moe", "experts": 4, "top_k": 2, "capacity_factor": 1.0},
            },
            "task": {
                "kind": "reverse",
                "train_size": 64,
                "test_size": 8,
                "train_lengths": [2, 6],
                "test_lengths": [7, 8],
            },
            "steps": 3,
            "batch_size": 8,
        }
    )
    task = config.task.build()
    torch.manual_seed(config.seed)
    stepper = Stepper(config, task, tz.build_model(model_config_for(config, task)).train())
    losses = [stepper.step(step)["model"] for step in range(3)]
    assert all(math.isfinite(loss) for loss in losses)
    model = stepper.model.eval()
    model.save_pretrained(tmp_path)
    batch = inputs(model.config.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(tz.from_pretrained(tmp_path)(**batch).logits, model(**batch).logits, atol=0, rtol=0)


def test_a_recurrent_stack_reports_each_step_and_adds_the_ponder_cost():
    torch.manual_seed(0)
    for act in (False, True):
        model = tz.build_model(
            "universal-transformer-encoder-tiny",
            ffn={"kind": "moe", "experts": 2},
            dropout=0.0,
            encoder={"layers": 3, "act": act},
        )
        terms: list[torch.Tensor] = []

        def record(module, args, out, terms=terms):
            terms.append(module.routing.aux_loss)

        model.encoder.layer.ffn.register_forward_hook(record)
        out = model(torch.randint(1, model.config.vocab_size, (2, 5)))
        steps = len(out.extras["encoder_moe_tokens"])
        assert steps == len(terms) and (act or steps == 3), "one row per application of the shared layer"
        ponder = model.config.encoder.ponder_weight * out.extras["encoder_ponder_time"].mean() if act else 0.0
        torch.testing.assert_close(out.aux_loss, ponder + sum(terms))


def test_a_model_with_experts_exports_with_dynamic_shapes():
    model = tiny(experts=4, top_k=2, capacity_factor=0.5).eval()
    batch = inputs()
    dims = {key: {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC} for key in batch}
    program = torch.export.export(model, (), batch, dynamic_shapes=dims)
    generator = torch.Generator().manual_seed(4)
    other = {
        "src": torch.randint(1, 50, (3, 9), generator=generator),
        "tgt": torch.randint(1, 50, (3, 4), generator=generator),
        "src_mask": torch.ones(3, 9, dtype=torch.long),
    }
    with torch.no_grad():
        out, expected = program.module()(**other), model(**other)
    torch.testing.assert_close(out.logits, expected.logits, atol=1e-5, rtol=0)
    assert out.extras.keys() == expected.extras.keys()
    assert all(torch.equal(out.extras[key], expected.extras[key]) for key in expected.extras)


def test_a_model_copied_after_a_training_forward_keeps_the_routing_values():
    model = tiny(experts=4).train()
    out = model(**inputs())
    twin = copy.deepcopy(model)  # as torch.optim.swa_utils.AveragedModel does
    original, copied = model.encoder.layers[0].ffn.routing, twin.encoder.layers[0].ffn.routing
    assert original.aux_loss.grad_fn is not None and copied.aux_loss.grad_fn is None
    assert torch.equal(copied.tokens, original.tokens) and torch.equal(copied.aux_loss, original.aux_loss.detach())
    out.aux_loss.backward()


def test_cached_greedy_decoding_equals_uncached_when_no_token_is_dropped():
    torch.manual_seed(0)
    model = tz.build_model(
        "transformer-tiny",
        ffn={"kind": "moe", "experts": 4, "top_k": 2, "capacity_factor": 2.0},
        vocab_size=60,
        d_model=32,
        n_heads=4,
        d_ff=64,
        dropout=0.0,
        head={"tie_weights": False},
    ).eval()
    src = torch.randint(3, 60, (4, 9))
    src_mask = torch.ones_like(src)
    src_mask[1, 5:] = 0
    cached = greedy_decode(model, src, src_mask, bos_id=1, max_new_tokens=12)
    assert len(set(cached[:, 1:].flatten().tolist())) > 3, "the decoded tokens vary, so a broken cache would show"
    assert torch.equal(cached, greedy_decode(model, src, src_mask, bos_id=1, max_new_tokens=12, use_cache=False))


def test_a_forward_traces_as_one_graph_without_reading_values_back():
    """No host sync and no shape that depends on routing: ``fullgraph=True`` fails on any graph break."""
    model = tiny(experts=4, top_k=2, capacity_factor=0.5).eval()
    with torch.no_grad():
        expected = model(**inputs())
        traced = torch.compile(model, fullgraph=True, backend="eager")
        try:
            out = traced(**inputs())
        finally:
            torch._dynamo.reset()
    torch.testing.assert_close(out.logits, expected.logits, atol=1e-6, rtol=0)
    assert all(torch.equal(out.extras[key], expected.extras[key]) for key in expected.extras)
