"""The data of the MAD tasks (:mod:`~transformer_zoo.plugins.tasks.mad`): MAD's difficulty grid,
and one generator per task that draws an example in MAD's tokens, as mad-lab's
``mad/data/instances.py`` draws it (the departures are listed in the tasks' module)."""

from __future__ import annotations

from typing import Any

import numpy as np

IGNORE = -1  # a generator's target where nothing is asked (MAD's -100)

DIFFICULTIES: dict[str, dict[str, tuple[int | float, ...]]] = {
    "mad-in-context-recall": {
        "vocab_size": (32, 64, 128),
        "seq_len": (256, 512, 1024),
        "num_train_examples": (6400, 3200, 1600, 800),
    },
    "mad-fuzzy-recall": {
        "vocab_size": (32, 64, 128),
        "seq_len": (256, 512, 1024),
        "num_train_examples": (6400, 3200, 1600, 800),
    },
    "mad-noisy-recall": {
        "vocab_size": (48, 80, 144),  # 16 of them noise
        "seq_len": (256, 512, 1024),
        "num_train_examples": (6400, 3200, 1600, 800),
        "frac_noise": (0.4, 0.6, 0.8),
    },
    "mad-selective-copying": {
        "vocab_size": (32, 64, 128),
        "seq_len": (512, 1024),
        "num_train_examples": (6400, 3200, 1600, 800),
        "num_tokens_to_copy": (32, 64, 96),
    },
    "mad-compression": {
        "vocab_size": (32, 64, 128),
        "seq_len": (64, 128, 256),
        "num_train_examples": (6400, 3200, 1600, 800),
    },
    "mad-memorization": {"vocab_size": (512, 1024, 2048, 4096, 8192)},
}
"""MAD's difficulty grid (mad-lab ``configs/tasks/*.yml``, ``changes``):
for each task, the values each option takes, one option at a time, the others at the task's
defaults (MAD's baseline). :func:`difficulty_settings` lists the settings."""


def difficulty_settings(kind: str) -> list[dict[str, Any]]:
    """The option changes of every MAD setting of task ``kind``: the baseline (``{}``: the
    defaults) first, then one change at a time, as mad-lab's ``make_benchmark_mad_configs``."""
    if kind not in DIFFICULTIES:
        raise ValueError(f"no MAD difficulty grid for task {kind!r}; the MAD tasks are {', '.join(DIFFICULTIES)}")
    return [{}] + [{name: value} for name, values in DIFFICULTIES[kind].items() for value in values]


# ---- generators: one example in MAD's tokens, (tokens, targets) with IGNORE where nothing is asked


def shifted(tokens: np.ndarray, targets: np.ndarray, training: bool) -> tuple[np.ndarray, np.ndarray]:
    """A recall sequence as MAD feeds it: the last token dropped, each target moved to the
    position before it; in training every next token is a target."""
    return tokens[:-1], tokens[1:] if training else targets[1:]


def recall_instance(
    rng: np.random.Generator,
    *,
    vocab_size: int,
    seq_len: int,
    multi_query: bool,
    noise_vocab_size: int,
    frac_noise: float,
    training: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """In-context recall, noisy or not (mad-lab's ``generate_in_context_recall_instance``).

    ``seq_len / 2 - 1`` pairs (a key, then its value; keys repeat, each keeps its value within
    the sequence), each replaced by two noise tokens with chance ``frac_noise``, then a last
    pair whose key appeared. Tokens: keys, values, noise, and (single query) the copy prefix
    ``vocab_size - 1`` before the last pair."""
    content = vocab_size - noise_vocab_size - (0 if multi_query else 1)
    keys_n = content // 2
    pairs = seq_len // 2 - 1
    keys = rng.integers(0, keys_n, pairs)
    value_of = rng.integers(keys_n, content, keys_n)  # each key's value: drawn uniformly, may repeat
    noise = rng.random(pairs) < frac_noise
    noise[rng.integers(pairs)] = False  # at least one pair to recall
    tokens = np.stack([keys, value_of[keys]], axis=1)  # (pairs, 2)
    if noise.any():
        tokens[noise] = rng.integers(content, content + noise_vocab_size, (int(noise.sum()), 2))
    shown = np.flatnonzero(~noise)
    _, first = np.unique(keys[shown], return_index=True)
    repeated = np.ones(len(shown), dtype=bool)
    repeated[first] = False
    targets = np.full((pairs, 2), IGNORE)
    if multi_query:
        targets[shown[repeated], 1] = value_of[keys[shown[repeated]]]
    probe = rng.choice(np.unique(keys[shown]))
    prefix = np.array([] if multi_query else [vocab_size - 1], dtype=np.int64)
    tokens = np.concatenate([tokens.ravel(), prefix, [probe, value_of[probe]]])
    targets = np.concatenate([targets.ravel(), [IGNORE] * len(prefix), [IGNORE, value_of[probe]]])
    return shifted(tokens, targets, training)


def fuzzy_recall_instance(
    rng: np.random.Generator,
    *,
    vocab_size: int,
    seq_len: int,
    k_motif_size: int,
    v_motif_size: int,
    multi_query: bool,
    noise_vocab_size: int,
    frac_noise: float,
    training: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Fuzzy in-context recall (mad-lab's ``generate_fuzzy_in_context_recall_instance``).

    A key is 1 to ``k_motif_size`` distinct key tokens in order (always ``k_motif_size`` in the
    test split), a value 1 to ``v_motif_size`` value tokens; pairs follow one another, a probe
    pair placed at a random point and repeated at the end, and the sequence is left-padded with
    MAD's pad token (``<left-pad>``: ``vocab_size - 1``, or ``vocab_size - 2`` when the copy prefix
    of the single-query form is ``vocab_size - 1``)."""
    pad = vocab_size - 1 if multi_query else vocab_size - 2
    content = pad - noise_vocab_size
    keys_n = content // 2
    key_sizes = np.arange(1, k_motif_size + 1) if training else np.array([k_motif_size])
    steps = seq_len // 2 + 1  # more than the loop below takes: each step adds two tokens or more

    def motifs(tokens: int, size: int, first: int = 0) -> list[list[int]]:
        """``steps`` motifs of ``size`` distinct tokens ``first .. first + tokens - 1``, each
        uniform over the ordered choices (the start of a random permutation); a motif of
        fewer tokens is the start of one."""
        return (first + rng.random((steps, tokens)).argsort(axis=1)[:, :size]).tolist()

    keys = motifs(keys_n, k_motif_size)
    values = motifs(content - keys_n, v_motif_size, keys_n)
    k_sizes = key_sizes[rng.integers(len(key_sizes), size=steps + 1)].tolist()
    v_sizes = rng.integers(1, v_motif_size + 1, steps + 1).tolist()
    noisy = (rng.random(steps) < frac_noise).tolist()
    noise = rng.integers(content, content + max(noise_vocab_size, 1), (steps, k_motif_size + v_motif_size)).tolist()
    # the last draw of each is the probe's: the loop ends before it

    probe_key, probe_value = tuple(keys[-1][: k_sizes[-1]]), tuple(values[-1][: v_sizes[-1]])
    probe_size = len(probe_key) + len(probe_value)
    probe_at = rng.integers(seq_len - 2 * probe_size)
    end = seq_len - probe_size - (k_motif_size + v_motif_size)
    value_of = {probe_key: probe_value}  # each key's value; the probe's is fixed from the start
    shown: set[tuple[int, ...]] = set()  # the keys already in the sequence
    tokens: list[int] = []
    targets: list[int] = []
    for step in range(steps):
        if len(tokens) >= end:
            break
        k_size, v_size = k_sizes[step], v_sizes[step]
        # MAD places the probe pair once probe_at tokens are out, and may stop first, leaving the
        # last query unanswerable; here the probe also takes the last step before the end
        if probe_key not in shown and (len(tokens) >= probe_at or len(tokens) + k_size + v_size >= end):
            tokens += [*probe_key, *probe_value]
            targets += [IGNORE] * probe_size
            shown.add(probe_key)
        elif noisy[step]:
            tokens += noise[step][: k_size + v_size]
            targets += [IGNORE] * (k_size + v_size)
        else:
            k = tuple(keys[step][:k_size])
            v = value_of.setdefault(k, tuple(values[step][:v_size]))
            tokens += [*k, *v]
            targets += [IGNORE] * k_size + (list(v) if multi_query and k in shown else [IGNORE] * len(v))
            shown.add(k)
    prefix = [] if multi_query else [vocab_size - 1]
    tokens += [*prefix, *probe_key, *probe_value]
    targets += [IGNORE] * (len(prefix) + len(probe_key)) + list(probe_value)
    padding = seq_len + 1 - len(tokens)
    return shifted(np.array([pad] * padding + tokens), np.array([IGNORE] * padding + targets), training)


def selective_copying_instance(
    rng: np.random.Generator, *, vocab_size: int, seq_len: int, num_tokens_to_copy: int
) -> tuple[np.ndarray, np.ndarray]:
    """Selective copying (mad-lab's ``generate_copying_instance`` with ``selective=True``).

    ``num_tokens_to_copy`` tokens with blanks (``vocab_size - 2``) among them, the copy token
    (``vocab_size - 1``), then that many blanks, at which the tokens are asked in order. As in
    mad-lab, each blank goes before one of the tokens, drawn uniformly, so the last token is
    always the one before the copy token."""
    blank, copy = vocab_size - 2, vocab_size - 1
    blanks = seq_len - 2 * num_tokens_to_copy - 1
    to_copy = rng.integers(0, vocab_size - 2, num_tokens_to_copy)
    spread = np.insert(to_copy, rng.integers(0, num_tokens_to_copy, blanks), blank)
    tokens = np.concatenate([spread, [copy], np.full(num_tokens_to_copy, blank)])
    targets = np.concatenate([np.full(seq_len - num_tokens_to_copy, IGNORE), to_copy])
    return tokens, targets


def compression_instance(rng: np.random.Generator, *, vocab_size: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Compression (mad-lab's ``generate_compression_instance``): ``seq_len - 1`` tokens, then the
    compression token ``vocab_size - 1``; every token, that one included, is asked back."""
    tokens = np.concatenate([rng.integers(0, vocab_size - 1, seq_len - 1), [vocab_size - 1]])
    return tokens, tokens.copy()


def memorization_table(rng: np.random.Generator, vocab_size: int) -> np.ndarray:
    """The value of each key (mad-lab's ``generate_kv_map`` over ``vocab_size - 1`` tokens): keys
    ``0 .. K - 1`` for ``K = (vocab_size - 1) // 2``, each given a different value token."""
    keys_n = (vocab_size - 1) // 2
    return rng.permutation(np.arange(keys_n, vocab_size - 1))[:keys_n]


def memorization_instance(
    rng: np.random.Generator, *, table: np.ndarray, insert_token: int, seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """Memorization (mad-lab's ``generate_memorization_instance``): ``seq_len / 2`` keys, each
    followed by ``insert_token``, at which its value in ``table`` is asked."""
    keys = rng.integers(0, len(table), seq_len // 2)
    tokens = np.stack([keys, np.full_like(keys, insert_token)], axis=1).ravel()
    targets = np.stack([np.full_like(keys, IGNORE), table[keys]], axis=1).ravel()
    return tokens, targets
