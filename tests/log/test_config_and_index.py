"""LogConfig parsing and the index lookups, without a log."""
from __future__ import annotations

import pytest

from odradek.log import index as ix
from odradek.core.config import LogConfig
from odradek.core.errors import InvalidConfigError


def test_defaults_are_kafkas():
    p = LogConfig().to_properties()
    assert p["segment.bytes"] == 1 << 30 and p["segment.index.bytes"] == 10 << 20
    assert p["index.interval.bytes"] == 4096 and p["retention.ms"] == 604_800_000
    assert p["max.message.bytes"] == 1_048_588 and p["cleanup.policy"] == "delete"
    assert p["min.cleanable.dirty.ratio"] == 0.5 and p["file.delete.delay.ms"] == 60_000


def test_properties_parse_from_strings_and_numbers():
    cfg = LogConfig.from_properties({"segment.bytes": "4096", "retention.ms": -1,
                                     "cleanup.policy": "compact, delete",
                                     "min.cleanable.dirty.ratio": "0.25"})
    assert (cfg.segment_bytes, cfg.retention_ms, cfg.min_cleanable_dirty_ratio) == (4096, -1, 0.25)
    assert cfg.compact and cfg.delete


@pytest.mark.parametrize("props, key", [
    ({"segment.bytes": "lots"}, "segment.bytes"),
    ({"segment.bytes": 3}, "segment.bytes"),
    ({"cleanup.policy": "shred"}, "cleanup.policy"),
    ({"min.cleanable.dirty.ratio": 2}, "min.cleanable.dirty.ratio"),
    ({"no.such.key": 1}, "no.such.key"),
    ({"flush.messages": 0}, "flush.messages"),
])
def test_invalid_properties_name_the_key(props, key):
    with pytest.raises(InvalidConfigError, match=key) as e:
        LogConfig.from_properties(props)
    assert e.value.code.name == "INVALID_CONFIG"


def offsets(entries, pad=0):
    return ix.BufferSource(b"".join(ix.OFFSET_ENTRY.pack(*e) for e in entries) + bytes(8 * pad))


def test_the_zero_fill_of_a_preallocated_index_ends_its_entries():
    src = offsets([(3, 100), (9, 400), (20, 900)], pad=50)
    assert ix.count_offset_entries(src, 10_000) == 3
    assert ix.count_offset_entries(src, 900) == 2  # bytes at or past the bound are not trusted


def test_floor_lookups_by_offset_and_by_position():
    src = offsets([(3, 100), (9, 400), (20, 900)])
    assert ix.offset_floor(src, 3, 2) is None
    assert ix.offset_floor(src, 3, 9) == (9, 400)
    assert ix.offset_floor(src, 3, 19) == (9, 400)
    assert ix.position_floor(src, 3, 899) == (9, 400)
    assert ix.position_floor(src, 3, 10_000) == (20, 900)


def test_time_lookup_finds_the_last_entry_strictly_below():
    src = ix.BufferSource(b"".join(ix.TIME_ENTRY.pack(*e) for e in [(10, 2), (20, 5), (30, 9)]) + bytes(24))
    assert ix.count_time_entries(src, 100) == 3
    assert ix.count_time_entries(src, 8) == 2
    assert ix.time_floor_below(src, 3, 10) is None
    assert ix.time_floor_below(src, 3, 25) == (20, 5)
    assert ix.time_floor_below(src, 3, 31) == (30, 9)
