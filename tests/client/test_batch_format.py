"""The producer's batch encoder against the shared record-batch format (core/records.py)."""
from __future__ import annotations

import msgpack
import pytest

from odradek.core import records as fmt
from odradek.producer import encode_rows, pack_rows


def test_encoded_rows_decode_with_the_storage_decoder_and_pass_validation():
    rows = [(0, 0, None, b"a", ()), (1, 5, b"k", b"b", (("h", b"v"),)), (2, -3, None, None, ())]
    data = encode_rows(rows, 1000, 1005, "lz4")
    header = fmt.validate_batch(data)
    assert header.record_count == 3 and header.last_offset_delta == 2
    assert header.compression == fmt.COMPRESSION_LZ4 and header.max_timestamp == 1005
    records = fmt.decode_batch(data)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in records] == \
        [(0, 1000, None, b"a"), (1, 1005, b"k", b"b"), (2, 997, None, None)]
    assert [list(h) for h in records[1].headers] == [["h", b"v"]]


def test_uncompressed_batches_carry_no_compression_bit():
    data = encode_rows([(0, 0, None, b"x" * 50, ())], 1, 1, None)
    assert fmt.validate_batch(data).compression == fmt.COMPRESSION_NONE
    assert fmt.decode_batch(data)[0].value == b"x" * 50


@pytest.mark.parametrize("size", [0, 1, 31, 32, 255, 256, 65535, 65536])
@pytest.mark.parametrize("count", [1, 15, 16, 128, 256, 300])
def test_plain_values_pack_byte_for_byte_like_msgpack_of_full_rows(size, count):
    if size * count > 5_000_000:
        count = 2
    values = [bytes([i % 251]) * size for i in range(count)]
    assert pack_rows(values) == msgpack.packb([(i, 0, None, v, ()) for i, v in enumerate(values)])


def test_batches_mixing_plain_values_and_full_rows_keep_each_record():
    rows = [b"plain", (1, 7, b"key", b"keyed", (("h", b"1"),)), b"again"]
    data = encode_rows(rows, 100, 107, "lz4")
    got = [(r.offset, r.timestamp, r.key, r.value) for r in fmt.decode_batch(data)]
    assert got == [(0, 100, None, b"plain"), (1, 107, b"key", b"keyed"), (2, 100, None, b"again")]


def test_plain_values_of_mixed_lengths_pack_like_msgpack_too():
    values = [b"a" * (i * 37 % 300) for i in range(500)]
    assert pack_rows(values) == msgpack.packb([(i, 0, None, v, ()) for i, v in enumerate(values)])


@pytest.mark.parametrize("key_sizes", [(10,), (0, 3, 300), (255, 256)])
@pytest.mark.parametrize("value_sizes", [(100,), (0, 7, 70000)])
@pytest.mark.parametrize("count", [1, 16, 300])
def test_keyed_values_pack_byte_for_byte_like_msgpack_of_full_rows(key_sizes, value_sizes, count):
    keys = [bytes([i % 13]) * key_sizes[i % len(key_sizes)] for i in range(count)]
    values = [bytes([i % 251]) * value_sizes[i % len(value_sizes)] for i in range(count)]
    expected = msgpack.packb([(i, 0, k, v, ()) for i, (k, v) in enumerate(zip(keys, values))])
    assert pack_rows(values, keys) == expected
    assert pack_rows(values, keys, plain=True) == expected  # the accumulator's word, no scans
    assert pack_rows(values, keys, plain=True) == expected  # again: the keys' cached blobs


def test_keyed_batches_mixing_keyless_values_and_full_rows_keep_each_record():
    rows = [b"plain", b"keyed", (2, 7, b"row", b"full", (("h", b"1"),)), b"again"]
    keys = [None, b"k", None, b"k2"]
    assert pack_rows(rows, keys) == msgpack.packb([(0, 0, None, b"plain", ()), (1, 0, b"k", b"keyed", ()),
                                                   (2, 7, b"row", b"full", [["h", b"1"]]), (3, 0, b"k2", b"again", ())])
    data = encode_rows(rows, 100, 107, "lz4", keys)
    got = [(r.offset, r.timestamp, r.key, r.value) for r in fmt.decode_batch(data)]
    assert got == [(0, 100, None, b"plain"), (1, 100, b"k", b"keyed"), (2, 107, b"row", b"full"), (3, 100, b"k2", b"again")]


# ---- the batch packer in C (odradek/_recordbuild.c: batch, pack, seal) against its Python twin ----

SIZES = [0, 1, 31, 32, 255, 256, 65535, 65536]  # msgpack's bin8 / bin16 / bin32 edges
COUNTS = [1, 15, 16, 137, 300]                   # fixarray / array16 edge; positions past 127, 255


def _native():
    from odradek import producer_encoding
    if producer_encoding._native is None:
        pytest.skip("odradek._recordbuild is not built here (setup.py's optional extension)")
    return producer_encoding._native


class _Spy:
    """The extension's functions, counting which ones encode_rows calls."""

    def __init__(self, native):
        self.native, self.called = native, []

    def __getattr__(self, name):
        self.called.append(name)
        return getattr(self.native, name)


def _both(monkeypatch, rows, keys, compression=None, base_ts=1000, max_ts=1005):
    """encode_rows' batch with the extension (checking it was used: the whole batch in C, or
    an lz4 batch's rows and header), then with the Python twin (the fallback)."""
    from odradek import producer_encoding
    spy = _Spy(_native())
    with monkeypatch.context() as m:
        m.setattr(producer_encoding, "_native", spy)
        fast = encode_rows(rows, base_ts, max_ts, compression, keys, True)
    assert spy.called == (["batch"] if compression is None else ["pack", "seal"])
    with monkeypatch.context() as m:
        m.setattr(producer_encoding, "_native", None)
        twin = encode_rows(rows, base_ts, max_ts, compression, keys, True)
    return fast, twin


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("size", SIZES)
def test_plain_batches_packed_in_c_equal_the_python_twin_byte_for_byte(monkeypatch, keyed, count, size):
    if size * count > 3_000_000:
        count = 2
    values = [bytes([i % 251]) * size for i in range(count)]
    keys = [b"key-%d" % (i % 7) for i in range(count)] if keyed else None
    for compression in (None, "lz4"):
        fast, twin = _both(monkeypatch, values, keys, compression)
        assert fast == twin
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in fmt.decode_batch(fast)]
    assert got == [(i, 1000, None if keys is None else keys[i], v, []) for i, v in enumerate(values)]


@pytest.mark.parametrize("key_sizes", [(0,), (0, 31, 32), (255, 256, 65536)])
@pytest.mark.parametrize("value_sizes", [(100,), (0, 31, 32, 255, 256, 65535, 65536)])
@pytest.mark.parametrize("count", [1, 16, 300])
def test_mixed_lengths_and_empty_keys_pack_in_c_like_python(monkeypatch, key_sizes, value_sizes, count):
    keys = [bytes([i % 13]) * key_sizes[i % len(key_sizes)] for i in range(count)]
    values = [bytes([i % 251]) * value_sizes[(i * 3) % len(value_sizes)] for i in range(count)]
    for k in (None, keys):
        for compression in (None, "lz4"):
            fast, twin = _both(monkeypatch, values, k, compression, 7, 7)
            assert fast == twin
        assert fmt.validate_batch(fast).record_count == count
        assert [(r.key, r.value) for r in fmt.decode_batch(fast)] == list(zip(k or [None] * count, values))
    native = _native()
    assert native.pack(values, keys) == pack_rows(values, keys) == \
        msgpack.packb([(i, 0, k, v, ()) for i, (k, v) in enumerate(zip(keys, values))])


@pytest.mark.parametrize("keyed", [False, True])
def test_seventy_thousand_records_take_msgpacks_array32_in_c_too(monkeypatch, keyed):
    values = [bytes([i % 256]) for i in range(70_000)]  # past 65535 rows: array32, positions uint32
    keys = [b"k%d" % (i % 5) for i in range(70_000)] if keyed else None
    fast, twin = _both(monkeypatch, values, keys)
    assert fast == twin
    records = fmt.decode_batch(fast)
    assert len(records) == 70_000 and records[-1].offset == 69_999 and records[-1].value == values[-1]
    assert records[65_536].key == (keys[65_536] if keyed else None)


def test_batches_of_random_shapes_pack_in_c_like_python(monkeypatch):
    """Many batches: random counts, value and key lengths around the edges, keyed or not, the
    two time stamps anywhere in int64."""
    import random
    rng = random.Random(30)
    edges = [0, 1, 31, 32, 33, 127, 128, 255, 256, 257, 1000, 65535, 65536]
    for _ in range(300):
        count = rng.choice([1, 2, 15, 16, 17, 127, 128, 129, 255, 256, 257, 600])
        lengths = [rng.choice(edges) if rng.random() < 0.05 else rng.choice(edges[:9]) for _ in range(count)]
        values = [rng.randbytes(n) for n in lengths]
        keys = [rng.randbytes(rng.choice(edges[:8])) for _ in range(count)] if rng.random() < 0.5 else None
        base_ts, max_ts = rng.randrange(-2**63, 2**63), rng.randrange(-2**63, 2**63)
        fast, twin = _both(monkeypatch, values, keys, rng.choice([None, "lz4"]), base_ts, max_ts)
        assert fast == twin


def test_rows_that_are_not_plain_values_still_pack_and_seal_like_python(monkeypatch):
    """Full rows and values without keys take the Python packer, then the C header (seal)."""
    from odradek import producer_encoding
    rows = [b"plain", b"keyed", (2, 7, b"row", b"full", (("h", b"1"),)), b"again"]
    keys = [None, b"k", None, b"k2"]
    for compression in (None, "lz4"):
        spy = _Spy(_native())
        with monkeypatch.context() as m:
            m.setattr(producer_encoding, "_native", spy)
            fast = encode_rows(rows, 100, 107, compression, keys)
        assert spy.called == ["seal"]
        with monkeypatch.context() as m:
            m.setattr(producer_encoding, "_native", None)
            assert fast == encode_rows(rows, 100, 107, compression, keys)
    assert [(r.offset, r.timestamp, r.key) for r in fmt.decode_batch(fast)] == \
        [(0, 100, None), (1, 100, b"k"), (2, 107, b"row"), (3, 100, b"k2")]


@pytest.mark.parametrize("call, error, message", [
    (lambda n: n.batch([b"a", "b"], None, 1, 1, fmt.MAGIC), TypeError, "value 1 is str, not bytes"),
    (lambda n: n.batch([b"a", None], None, 1, 1, fmt.MAGIC), TypeError, "value 1 is NoneType"),
    (lambda n: n.batch([b"a", bytearray(b"b")], None, 1, 1, fmt.MAGIC), TypeError, "bytearray"),
    (lambda n: n.batch([b"a", b"b"], [b"k"], 1, 1, fmt.MAGIC), ValueError, "1 keys for 2 values"),
    (lambda n: n.batch([b"a"], [b"k", b"k"], 1, 1, fmt.MAGIC), ValueError, "2 keys for 1 values"),
    (lambda n: n.batch([b"a", b"b"], [b"k", None], 1, 1, fmt.MAGIC), TypeError, "key 1 is NoneType"),
    (lambda n: n.batch([b"a"], b"k", 1, 1, fmt.MAGIC), TypeError, "keys must be None or a list"),
    (lambda n: n.batch(b"abc", None, 1, 1, fmt.MAGIC), TypeError, "rows must be a list"),
    (lambda n: n.batch([], None, 1, 1, fmt.MAGIC), ValueError, "at least one record"),
    (lambda n: n.batch([b"a"], None, 2**63, 1, fmt.MAGIC), OverflowError, ""),
    (lambda n: n.batch([b"a"], None, "1", 1, fmt.MAGIC), TypeError, ""),
    (lambda n: n.batch([b"a"], None, 1, 1, 300), ValueError, "magic"),
    (lambda n: n.batch([b"a"], None, 1, 1), TypeError, "takes 5 arguments"),
    (lambda n: n.pack([b"a", 1], None), TypeError, "value 1 is int"),
    (lambda n: n.pack([b"a"], [b"k", b"k"]), ValueError, "2 keys for 1 values"),
    (lambda n: n.seal("text", 0, 1, 1, 1, fmt.MAGIC), TypeError, ""),
    (lambda n: n.seal(b"\x90", 1 << 20, 1, 1, 1, fmt.MAGIC), ValueError, "attributes"),
])
def test_bad_input_to_the_c_packer_raises_instead_of_crashing(call, error, message):
    with pytest.raises(error, match=message):
        call(_native())


def test_encode_rows_uses_the_python_twin_when_the_extension_is_absent():
    """Without odradek._recordbuild (no compiler at install), producer_encoding loads, says so
    (``_native`` None) and encode_rows makes the same batch in Python."""
    import subprocess
    import sys
    script = (
        "import sys; sys.modules['odradek._recordbuild'] = None\n"  # its import now raises ImportError
        "from odradek import producer_encoding as pe\n"
        "from odradek.core import records as fmt\n"
        "assert pe._native is None\n"
        "data = pe.encode_rows([b'v' * 40, b'w'], 5, 6, None, [b'k', b''], True)\n"
        "assert [(r.key, r.value) for r in fmt.decode_batch(data)] == [(b'k', b'v' * 40), (b'', b'w')]\n"
        "sys.stdout.write(data.hex())\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    native = _native()
    assert bytes.fromhex(out.stdout) == native.batch([b"v" * 40, b"w"], [b"k", b""], 5, 6, fmt.MAGIC)


def test_a_batch_over_two_gib_is_refused_before_anything_is_allocated():
    """A batch's length is an int32: 33 references to one 64 MiB value claim 2.1 GB, refused by
    the sizing pass (only the one value is in memory)."""
    native = _native()
    big = bytes(64 << 20)
    for call in (lambda: native.batch([big] * 33, None, 1, 1, fmt.MAGIC), lambda: native.pack([big] * 33, None),
                 lambda: native.batch([b"v"] * 33, [big] * 33, 1, 1, fmt.MAGIC)):
        with pytest.raises(ValueError, match="over 2 GiB"):
            call()
