"""odradek.plot writes real PNG and SVG files and refuses a name it cannot honour."""
from __future__ import annotations

import pytest

from odradek import plot


def test_a_series_and_bars_figure_is_written_as_png(tmp_path):
    path = str(tmp_path / "run.png")
    panel = plot.Panel("records/s", [plot.Line("produce", [0, 1, 2], [10, 20, 15])])
    plot.figure(path, "perf produce", [panel], ("ms", ["p50", "p99"], [1.5, 7.0]))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_bars_are_written_as_svg(tmp_path):
    path = str(tmp_path / "latency.svg")
    plot.bars(path, "latency", ["p50", "p95", "p99"], [1.0, 2.0, 3.0], "ms")
    assert "<svg" in (tmp_path / "latency.svg").read_text()


def test_a_file_name_without_a_known_suffix_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"\.png or \.svg"):
        plot.check_path("results.pdf")
