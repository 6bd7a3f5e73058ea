"""Draw attention patterns and their block layouts (matplotlib, Agg: no display needed)."""
from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless machines and CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402

from models import masks  # noqa: E402

# Layout colours: empty, partial, full.
_LAYOUT_CMAP = ListedColormap(["white", "#9ecae1", "#08519c"])


def draw_pattern(pattern: masks.Pattern, length: int, *, kv_len: int | None = None,
                 block: int | None = None, path: str | None = None,
                 title: str | None = None, max_heads: int = 4) -> Any:
    """Draws pattern.dense (one panel per head, up to max_heads) and, with `block`, its
    block layout beside it. Saves a PNG when `path` is given; returns the figure."""
    kv_len = length if kv_len is None else kv_len
    dense = pattern.dense_np(length, kv_len)
    per_head = dense[:max_heads] if dense.ndim == 3 else dense[None]
    layouts = []
    if block is not None:
        layout = pattern.blocks(length, kv_len, block, block).layout
        layouts = list(layout[:max_heads] if layout.ndim == 3 else layout[None])
    panels = len(per_head) + len(layouts)
    fig, axes = plt.subplots(1, panels, figsize=(3 * panels, 3.2), squeeze=False)
    for h, (ax, m) in enumerate(zip(axes[0], per_head)):
        ax.imshow(m, cmap="Greys", interpolation="nearest", vmin=0, vmax=1)
        head = f"head {h}, " if dense.ndim == 3 else ""
        ax.set_title(f"{head}{m.mean():.0%} of pairs", fontsize=9)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
    for h, (ax, lay) in enumerate(zip(axes[0][len(per_head):], layouts)):
        draw_layout(lay, ax=ax)
        head = f"head {h}, " if len(layouts) > 1 else ""
        ax.set_title(f"{head}{block}x{block} blocks: {np.mean(lay > 0):.0%} non-empty",
                     fontsize=9)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return fig


def draw_layout(layout: np.ndarray, *, ax: Any = None, path: str | None = None) -> Any:
    """Draws an int8 [nq, nk] block layout (white empty, light partial, dark full)."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(3, 3))
    ax.imshow(np.asarray(layout), cmap=_LAYOUT_CMAP, vmin=0, vmax=2,
              interpolation="nearest")
    ax.set_xlabel("key block")
    ax.set_ylabel("query block")
    if fig is not None and path is not None:
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return fig
