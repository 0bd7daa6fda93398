"""The storage benchmark runs end to end in quick mode and prints its table."""
from __future__ import annotations

from odradek.bench import storage as bench


def test_the_quick_benchmark_runs_and_prints_every_figure(capsys, tmp_path):
    assert bench.main(["--quick", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for figure in ("1 MiB batches", "16 KiB batches", "random-offset Log.read", "LogReader.read",
                   "recovery of", "RSS growth"):
        assert figure in out
    assert list(tmp_path.iterdir()) == []
