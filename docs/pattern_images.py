"""Draw each local/global attention pattern as a mask image for docs/variants/local-global.md.

python docs/pattern_images.py        # writes docs/images/pattern-*.png
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from transformer_zoo.plugins.local_global.kernels import Pattern

LENGTH = 64
PATTERNS = {
    "sliding-window": (Pattern(window=6), "sliding-window, window 6"),
    "sliding-window-causal": (Pattern(window=6, causal=True), "sliding-window, causal"),
    "dilated": (Pattern(window=3, dilation=3), "sliding-window, window 3, dilation 3"),
    "dilated-causal": (Pattern(window=3, dilation=3, causal=True), "dilated, causal"),
    "block-local": (Pattern(block=16), "block-local, block 16"),
    "block-local-causal": (Pattern(block=16, causal=True), "block-local, causal"),
    "local-global": (Pattern(window=4, global_positions=(0,), global_every=24), "local-global, globals 0, 24, 48"),
    "block-sparse": (
        Pattern(block=8, window=1, global_positions=tuple(range(8)), random_blocks=1, seed=0),
        "block-sparse, block 8",
    ),
}


def main() -> None:
    out = Path(__file__).parent / "images"
    out.mkdir(exist_ok=True)
    for name, (pattern, title) in PATTERNS.items():
        fig, ax = plt.subplots(figsize=(3.2, 3.4))
        ax.imshow(pattern.dense(LENGTH, LENGTH).numpy(), cmap="Blues", interpolation="nearest")
        ax.set(title=title, xlabel="key", ylabel="query")
        ax.title.set_fontsize(8)
        fig.tight_layout()
        fig.savefig(out / f"pattern-{name}.png", dpi=100)
        plt.close(fig)


if __name__ == "__main__":
    main()
