"""Plots of a command's results, written to PNG or SVG (``perf --plot FILE``, chaos runs).

matplotlib is an optional extra (``pip install odradek[plot]``; also in ``test``), imported
only when a plot is asked for, with the non-interactive Agg backend (no display needed).
The format follows the file's suffix: ``.png`` or ``.svg``.

Three calls cover the tools' needs:
  * ``series(path, title, panels)``: one or more panels stacked, each a set of named
    (x, y) lines sharing the x axis (throughput over time, latency over time, lag ...);
  * ``bars(path, title, labels, values, unit)``: one value per label (latency percentiles);
  * ``figure(path, title, panels, bar_panel)``: both in one file (a whole benchmark run).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Sequence

FORMATS = (".png", ".svg")


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed: the caller says so and carries on without a plot."""


@dataclasses.dataclass
class Line:
    label: str
    x: Sequence[float]
    y: Sequence[float]


@dataclasses.dataclass
class Panel:
    ylabel: str
    lines: list[Line]
    xlabel: str = "seconds"


def check_path(path: str) -> str:
    """The path, if its suffix is a format we write; ValueError naming the choice otherwise."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise ValueError(f"cannot plot to {path!r}: the file name must end in {' or '.join(FORMATS)}")
    return path


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("plotting needs matplotlib: pip install 'odradek[plot]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def series(path: str, title: str, panels: Sequence[Panel]) -> str:
    """Stacked line panels; returns the path written."""
    return figure(path, title, panels)


def bars(path: str, title: str, labels: Sequence[str], values: Sequence[float], unit: str) -> str:
    """One bar per label, its value written above it; returns the path written."""
    return figure(path, title, [], (unit, labels, values))


def figure(path: str, title: str, panels: Sequence[Panel], bar_panel: tuple | None = None) -> str:
    """Line panels and, below them, one bar panel ``(ylabel, labels, values)``: a whole
    benchmark run (throughput over time, latency percentiles) in one file. Returns the path."""
    check_path(path)
    plt = _pyplot()
    rows = len(panels) + (1 if bar_panel else 0)
    fig, axes = plt.subplots(rows, 1, figsize=(9, 3 * rows), squeeze=False)
    for ax, panel in zip(axes[:, 0], panels):
        for line in panel.lines:
            ax.plot(list(line.x), list(line.y), label=line.label, linewidth=1.4)
        ax.set_ylabel(panel.ylabel)
        ax.set_xlabel(panel.xlabel)
        ax.grid(True, alpha=0.3)
        if len(panel.lines) > 1:
            ax.legend(loc="best", fontsize="small")
    if bar_panel:
        ylabel, labels, values = bar_panel
        ax = axes[-1, 0]
        drawn = ax.bar(list(labels), list(values), color="#4c72b0")
        ax.bar_label(drawn, fmt="%.3g")
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
