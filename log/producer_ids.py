"""Producer ids: how they are made unique, and how a broker knows it handed one out.

A library, used by the transaction coordinator (which hands ids out) and the log actors (which
refuse a batch whose producer id no broker of the cluster handed out). An id is
``counter << TAG_BITS | tag``: ``counter`` unique in the cluster (allocated in blocks,
durably), ``tag`` the first ``TAG_BITS`` bits of a keyed BLAKE2b of the counter under the
cluster's producer-id key. Where the key and the next block live: single broker,
``<data dir>/meta/producer-id.key`` (0600) and ``producer-id.block``; cluster mode, ZooKeeper
``/odradek/producer_id_key`` and Kafka's ``/latest_producer_id_block`` (claimed with a
conditional write).
Invariants: a log actor checks the tag the first time a partition sees an id, so a made-up id
is refused (INVALID_PRODUCER_ID_MAPPING) with a chance of 2**-24 per guess, and the coordinator
and the log actors share no state; a block is written durably before any of its ids is handed
out, and two brokers never share one; ids are positive 63-bit integers, opaque to clients.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading

from odradek.log.files import FileLayer

TAG_BITS = 24
TAG_MASK = (1 << TAG_BITS) - 1
MAX_COUNTER = (1 << (63 - TAG_BITS)) - 1
BLOCK_SIZE = 1000  # Kafka's ProducerIdManager block size
KEY_FILE = "producer-id.key"
BLOCK_FILE = "producer-id.block"
ZK_KEY = "/odradek/producer_id_key"
ZK_BLOCK = "/latest_producer_id_block"  # Kafka's node

_keys: dict[str, bytes] = {}
_keys_lock = threading.Lock()


def _tag(counter: int, key: bytes) -> int:
    digest = hashlib.blake2b(counter.to_bytes(8, "big"), key=key, digest_size=8).digest()
    return int.from_bytes(digest, "big") & TAG_MASK


def make_producer_id(counter: int, key: bytes) -> int:
    if not 0 <= counter <= MAX_COUNTER:
        raise ValueError(f"producer id counter {counter} out of range")
    return (counter << TAG_BITS) | _tag(counter, key)


def is_handed_out(pid: int, key: bytes) -> bool:
    """Did a coordinator holding ``key`` make ``pid``? (Checks the tag; pure.)"""
    if pid < 0:
        return False
    return _tag(pid >> TAG_BITS, key) == pid & TAG_MASK


# ---------------------------------------------------------------------------- the key

def load_key(config: dict, data_dir: str) -> bytes:
    """The cluster's producer-id key (cached per process): from ZooKeeper in cluster mode,
    else from the data directory; created on first use by whoever comes first."""
    where = config.get("zookeeper.connect") or data_dir
    with _keys_lock:
        key = _keys.get(where)
        if key is None:
            key = _keys[where] = (_zk_key(config) if config.get("zookeeper.connect") else _file_key(data_dir))
        return key


def _file_key(data_dir: str) -> bytes:
    meta = os.path.join(data_dir, "meta")
    os.makedirs(meta, mode=0o700, exist_ok=True)
    path = os.path.join(meta, KEY_FILE)
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        FileLayer().write_file_durably(tmp, secrets.token_bytes(32))
        try:
            os.link(tmp, path)  # atomic and exclusive: two processes racing keep one key
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    with open(path, "rb") as f:
        key = f.read()
    if len(key) != 32:
        raise OSError(f"{path} holds {len(key)} bytes, not a 32-byte key")
    return key


def zk_client(config: dict):
    """A started kazoo client under the configured chroot (the caller stops it)."""
    from kazoo.client import KazooClient
    hosts, _, chroot = config["zookeeper.connect"].partition("/")
    zk = KazooClient(hosts=hosts, timeout=config.get("zookeeper.session.timeout.ms", 18000) / 1000)
    zk.start(timeout=config.get("zookeeper.connection.timeout.ms", 18000) / 1000)
    if chroot:
        zk.ensure_path("/" + chroot)
        zk.chroot = "/" + chroot
    return zk


def _zk_key(config: dict) -> bytes:
    from kazoo.exceptions import NodeExistsError
    zk = zk_client(config)
    try:
        zk.ensure_path(os.path.dirname(ZK_KEY))
        try:
            zk.create(ZK_KEY, secrets.token_bytes(32))
        except NodeExistsError:
            pass
        key, _ = zk.get(ZK_KEY)
        return key
    finally:
        zk.stop()
        zk.close()


# ---------------------------------------------------------------------------- block allocators

class FileBlockAllocator:
    """Single broker: counters in blocks of ``BLOCK_SIZE``, the next free one kept durably in
    ``<data dir>/meta/producer-id.block`` before a block is used."""

    def __init__(self, data_dir: str, files: FileLayer | None = None):
        self.path = os.path.join(data_dir, "meta", BLOCK_FILE)
        self.files = files or FileLayer()

    def next_block(self) -> tuple[int, int]:
        try:
            with open(self.path) as f:
                start = int(f.read().strip() or 0)
        except FileNotFoundError:
            start = 0
        end = start + BLOCK_SIZE - 1
        if end > MAX_COUNTER:
            raise OverflowError("producer id counters are exhausted")
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        self.files.write_file_atomically(self.path, str(end + 1).encode())
        return start, end


class ZkBlockAllocator:
    """Cluster mode: Kafka's ``/latest_producer_id_block``, claimed by a conditional write."""

    def __init__(self, zk, broker_id: int):
        self.zk, self.broker_id = zk, broker_id

    def next_block(self) -> tuple[int, int]:
        from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
        while True:
            try:
                raw, stat = self.zk.get(ZK_BLOCK)
                start, version = json.loads(raw)["block_end"] + 1, stat.version
            except NoNodeError:
                start, version = 0, None
            except (ValueError, KeyError, TypeError):
                raise OSError(f"{ZK_BLOCK} in ZooKeeper is not a producer id block") from None
            end = start + BLOCK_SIZE - 1
            data = json.dumps({"version": 1, "broker": self.broker_id, "block_start": start,
                               "block_end": end}).encode()
            try:
                if version is None:
                    self.zk.create(ZK_BLOCK, data, makepath=True)
                else:
                    self.zk.set(ZK_BLOCK, data, version=version)
                return start, end
            except (BadVersionError, NodeExistsError):
                continue  # another broker took that block: try the next one
