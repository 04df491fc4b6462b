"""The pictures the commands draw beside their tables (the plot extra: matplotlib)."""
from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence

_GIB = 2 ** 30


def bars_png(path: Any, title: str, labels: Sequence[str], *, memory: Sequence[Mapping[str, int]],
             reserved: Sequence[Optional[int]], usable: Sequence[Optional[int]],
             seconds: Optional[Sequence[Mapping[str, float]]] = None, memory_label: str = "GiB a device") -> None:
    """A PNG at *path*: a bar a label of its bytes by category (stacked; its reserved bytes and the usable memory
    marked) and, with *seconds*, beside it a bar a label of its seconds by part (stacked). A label without bytes
    or seconds is named and left empty."""
    plt = pyplot()
    y = list(range(len(labels)))[::-1]
    if seconds is None:
        fig, axes = plt.subplots(1, 1, figsize=(10, 2.8 + 0.55 * len(labels)))
        panels = [axes]
    else:
        fig, axes = plt.subplots(1, 2, figsize=(12, 2.8 + 0.55 * len(labels)), sharey=True)
        panels = list(axes)
    bytes_panel = panels[0]
    _stacked(bytes_panel, y, [{k: v / _GIB for k, v in m.items()} for m in memory])
    marks = [(r / _GIB, at) for r, at in zip(reserved, y, strict=True) if r]
    if marks:  # what the caching allocator reserves, beside the allocated bytes' bars
        bytes_panel.plot([x for x, _ in marks], [at for _, at in marks], "k|", markersize=16, label="reserved")
    limits = sorted({u for u in usable if u})
    for value in limits:
        bytes_panel.axvline(value / _GIB, color="black", linestyle="--", linewidth=1)
    bytes_panel.set_xlabel(memory_label + (" (dashed: usable)" if limits else ""))
    bytes_panel.set_yticks(y, labels)
    bytes_panel.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    if seconds is not None:
        _stacked(panels[1], y, seconds)
        panels[1].set_xlabel("seconds a step")
        panels[1].legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    fig.suptitle(title)
    fig.tight_layout()
    save(fig, path)


def pyplot() -> Any:
    """matplotlib's pyplot on its file-only backend, or MissingExtra naming the plot extra."""
    from ndcost.errors import MissingExtra
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtra("--plot needs matplotlib: pip install 'ndcost[plot]'") from None
    return plt


def save(fig: Any, path: Any, dpi: int = 120) -> None:
    """*fig* as a PNG at *path*, then closed; a path that cannot be written refused by name."""
    from ndcost.errors import InvalidValue

    plt = pyplot()
    try:
        fig.savefig(path, format="png", dpi=dpi)
    except OSError as exc:
        raise InvalidValue(f"--plot {path}: cannot write it ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)


def _stacked(axis: Any, y: Sequence[int], values: Sequence[Mapping[str, float]]) -> None:
    """Horizontal bars at *y*, each the stack of its mapping's values in first-seen key order (keys all zero
    left out of the legend)."""
    keys: List[str] = []
    for row in values:
        keys += [k for k in row if k not in keys]
    left = [0.0] * len(y)
    for key in keys:
        widths = [row.get(key, 0.0) or 0.0 for row in values]
        if any(widths):
            axis.barh(y, widths, left=left, label=key)
            left = [a + b for a, b in zip(left, widths, strict=True)]
