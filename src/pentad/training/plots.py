"""``loss.png``: a run's ``metrics.jsonl`` drawn against step, one panel per family of values.

The families, each on its own axis and drawn only when the run logged it: the training losses (``loss``
and each head's ``<head>_loss``), the auxiliary losses (every other ``*_loss``: MoE balancing and
z-loss, adversarial training, distillation's soft and hard parts), the learning rate, and the task's
selection metric on dev (``dev_<metric>``, fine-tuning). A line equal to one already on its panel (the
total of a one-head model is that head's loss) is named in that line's label rather than drawn twice;
short runs draw their points as markers.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from torch import nn

from pentad.model import Model
from pentad.training.trainer import MetricsLog

MARKERS_UP_TO = 30  # lines of at most this many points mark each point


def head_names(model: nn.Module) -> list[str]:
    """The names of a pentad model's heads (their losses are the training losses of the plot)."""
    return list(model.targets) if isinstance(model, Model) else []


def families(records: list[dict[str, Any]], heads: Iterable[str], selection: str | None = None
             ) -> list[tuple[str, list[str]]]:
    """The panels of the plot for these records: (axis label, keys drawn on it), in order, each with at least
    one key the records hold. ``heads``: the model's head names; ``selection``: the task's dev metric."""
    present = {k for r in records for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    losses = sorted(k for k in present if k.endswith("_loss"))
    own = {f"{h}_loss" for h in heads}
    panels = [("loss", [k for k in ["loss", *losses] if k == "loss" or k in own]),
              ("auxiliary losses", [k for k in losses if k not in own]),
              ("learning rate", ["lr"]),
              (f"dev {selection}", [f"dev_{selection}"] if selection else [])]
    return [(label, [k for k in keys if k in present]) for label, keys in panels if any(k in present for k in keys)]


def _same(a: tuple[list[float], list[float]], b: tuple[list[float], list[float]]) -> bool:
    """Whether two lines have the same steps and (to rounding) the same values."""
    return a[0] == b[0] and all(abs(x - y) <= 1e-9 * max(1.0, abs(x)) for x, y in zip(a[1], b[1]))


def loss_figure(records: list[dict[str, Any]], heads: Iterable[str], selection: str | None = None) -> Any:
    """The figure of :func:`plot_losses` (a matplotlib Figure, Agg backend), or None when no record has a
    value to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = families(records, heads, selection)
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False, figsize=(7, 1.0 + 2.2 * len(panels)))
    for ax, (label, keys) in zip(axes[:, 0], panels):
        drawn: list[tuple[tuple[list[float], list[float]], Any]] = []
        for key in keys:
            points = sorted((r["step"], float(r[key])) for r in records if key in r and "step" in r)
            line = ([p[0] for p in points], [p[1] for p in points])
            twin = next((artist for seen, artist in drawn if _same(seen, line)), None)
            if twin is not None:  # the same values under another name: one line, both names
                twin.set_label(f"{twin.get_label()} = {key}")
                continue
            marker = "o" if len(points) <= MARKERS_UP_TO else None
            dashed = "--" if key.startswith("dev_") else "-"
            (artist,) = ax.plot(line[0], line[1], dashed, label=key, marker=marker,
                                markersize=5 if len(points) <= 3 else 3, linewidth=1.5 if key == "loss" else 1)
            drawn.append((line, artist))
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        if keys == ["lr"]:
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    bottom = axes[-1, 0]
    bottom.set_xlabel("step")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    drawn_keys = {k for _, keys in panels for k in keys}
    steps = [r["step"] for r in records if "step" in r and drawn_keys & r.keys()]
    if steps and max(steps) - min(steps) < 2:  # a point or two: whole steps around them, not a sliver
        bottom.set_xlim(min(steps) - 1, max(steps) + 1)
    fig.tight_layout()
    return fig


def plot_losses(metrics_path: Path, out: Path, heads: Iterable[str], selection: str | None = None) -> Path | None:
    """Draw ``metrics.jsonl`` into a PNG at ``out`` (written atomically): the panels of :func:`families`.
    Returns ``out``, or None when there was nothing to draw."""
    fig = loss_figure(MetricsLog(metrics_path).read(), heads, selection)
    if fig is None:
        return None
    import matplotlib.pyplot as plt

    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(out)
    return out
