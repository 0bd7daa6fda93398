"""Client quotas, as Kafka's: per user and client id, produce and fetch byte rates
(``producer_byte_rate``, ``consumer_byte_rate``) and request time (``request_percentage``,
KIP-124); per IP the connection creation rate (``connection_creation_rate``, KIP-612). Set with
``odradek configs``; read from network/secstore.py.

``Quotas`` runs in each processor: a token bucket per (user, client id, kind), filling at the
quota's rate up to ``BURST_SECONDS``' worth; a produce (its size), a fetch answer (its size) or
a request (its time; ``request_percentage`` N is N% of one thread's time) takes from it, and a
negative balance is the delay: the answer carries ``throttle_time_ms`` and the connection is not
read that long; the answer is held back that long unless the client waits itself (KIP-219).
``Ledger`` runs in the acceptor: every ``SYNC_INTERVAL`` a processor that used a quota reports
what it took (``report``) and adopts the acceptor's answer, each bucket's broker-wide balance
(``synced``).
Invariants: nothing is dropped; acks=0 produce is not throttled; between reports the hot path
sends nothing, so a client spread over processors overruns by at most one interval's worth.
"""
from __future__ import annotations

import logging
import time

from odradek.network import secstore

log = logging.getLogger("odradek.quotas")

KINDS = {"produce": "producer_byte_rate", "fetch": "consumer_byte_rate", "request": "request_percentage"}
IP_RATE = "connection_creation_rate"  # per IP (entity type ips), connections a second
ENTITY_KEYS = {"users": tuple(KINDS.values()), "clients": tuple(KINDS.values()), "ips": (IP_RATE,)}
DEFAULT = "<default>"
MAX_BUCKETS = 100000
BURST_SECONDS = 0.2  # a bucket holds this many seconds of the quota
REQUEST_UNIT = 10_000  # request_percentage 1 = 10,000 us of time a second
SYNC_INTERVAL = 0.1  # seconds between a processor's reports of its usage to the acceptor
IP_HOLD_MAX = 10.0  # seconds at most an address's connection is held before it is closed
UNREADABLE_RETRY = 1.0  # seconds without quotas after the store could not be read (then read again)


def take(bucket: list, rate: float, amount: float, now: float) -> float:
    """Fill ``bucket`` ([balance, at]) at ``rate`` up to BURST_SECONDS' worth, take
    ``amount``; the seconds until the balance is back to zero (0 within the quota)."""
    bucket[0] = min(rate * BURST_SECONDS, bucket[0] + (now - bucket[1]) * rate) - amount
    bucket[1] = now
    return -bucket[0] / rate if bucket[0] < 0 else 0.0


def _buckets_room(buckets: dict) -> None:
    if len(buckets) >= MAX_BUCKETS:
        buckets.clear()


class _QuotaReader:
    """The quotas as stored, or none while the store cannot be read at all (a quotas.json
    that was never valid JSON, ZooKeeper out of reach on a first read): throttling is off
    then, logged, and the store is read again UNREADABLE_RETRY later. Never raises: it runs
    on every answer and every connection, and a quota must not cost a client its answer."""

    def __init__(self, config: dict, data_dir: str):
        self.store = secstore.Quotas(data_dir, config)
        self._unreadable_until = 0.0

    def current(self) -> dict:
        if self._unreadable_until:
            if time.monotonic() < self._unreadable_until:
                return {}
            self._unreadable_until = 0.0
        try:
            return self.store.data() or {}
        except secstore.StoreUnreadable as exc:
            self._unreadable_until = time.monotonic() + UNREADABLE_RETRY
            log.warning("quotas are not applied for now: %s", exc)
            return {}


class Quotas(_QuotaReader):
    """A processor's view: its buckets, and what it took since its last report."""

    def __init__(self, config: dict, data_dir: str):
        super().__init__(config, data_dir)
        self._buckets: dict[tuple, list] = {}
        self._usage: dict[tuple, list] = {}  # key -> [rate, amount] taken since the last report

    def rate(self, principal: str | None, client: str, kind: str) -> int:
        """The quota (bytes/s, or us/s of request time), 0 for none: the user's, else the
        client id's, else the users' and then the clients' defaults."""
        data = self.current()
        if not data:
            return 0
        key = KINDS[kind]
        user = (principal or "User:ANONYMOUS").partition(":")[2]
        users, clients = data.get("users") or {}, data.get("clients") or {}
        for entry in (users.get(user), clients.get(client), users.get(DEFAULT), clients.get(DEFAULT)):
            if entry and entry.get(key):
                return int(entry[key]) * (REQUEST_UNIT if kind == "request" else 1)
        return 0

    def delay(self, principal: str | None, client: str, kind: str, amount: float, now: float) -> float:
        """Seconds to hold this answer (and the connection) back; 0 within the quota."""
        rate = self.rate(principal, client, kind)
        if rate <= 0:
            return 0.0
        key = (principal, client, kind)
        bucket = self._buckets.get(key)
        if bucket is None:
            _buckets_room(self._buckets)
            bucket = self._buckets[key] = [rate * BURST_SECONDS, now]
        used = self._usage.get(key)
        if used is not None:
            used[0], used[1] = rate, used[1] + amount
        elif amount > 0:
            _buckets_room(self._usage)
            self._usage[key] = [rate, amount]
        return take(bucket, rate, amount, now)

    def report(self) -> list:
        """``[[principal, client, kind, rate, amount], ...]`` taken since the last report
        (the acceptor's ``Ledger.charge`` takes it); starts counting afresh."""
        out = [[*key, used[0], used[1]] for key, used in self._usage.items()]
        self._usage = {}
        return out

    def synced(self, balances: list, now: float) -> None:
        """The broker-wide balances answered to a report: each bucket becomes its balance
        less what this processor took since the report."""
        for principal, client, kind, balance in balances:
            key = (principal, client, kind)
            bucket = self._buckets.get(key)
            if bucket is not None:
                used = self._usage.get(key)
                bucket[0], bucket[1] = balance - (used[1] if used else 0), now


class Ledger:
    """The broker-wide buckets (in the acceptor): every processor's usage is taken from them."""

    def __init__(self):
        self._buckets: dict[tuple, list] = {}

    def charge(self, entries: list, now: float) -> list:
        """Take a processor's report; ``[[principal, client, kind, balance], ...]`` after it."""
        out = []
        for principal, client, kind, rate, amount in entries:
            if not rate or rate <= 0:
                continue
            key = (principal, client, kind)
            bucket = self._buckets.get(key)
            if bucket is None:
                _buckets_room(self._buckets)
                bucket = self._buckets[key] = [rate * BURST_SECONDS, now]
            take(bucket, rate, amount, now)
            out.append([principal, client, kind, bucket[0]])
        return out


class IpRates(_QuotaReader):
    """Per IP address connection creation rates (KIP-612), in the acceptor: the address's own
    ``connection_creation_rate``, else the ips' ``<default>``. A connection over it is held
    unread for the throttle time and then closed, as Kafka does."""

    def __init__(self, config: dict, data_dir: str):
        super().__init__(config, data_dir)
        self._buckets: dict[str, list] = {}

    def rate(self, ip: str) -> float:
        ips = self.current().get("ips") or {}
        for entry in (ips.get(ip), ips.get(DEFAULT)):
            if entry and entry.get(IP_RATE):
                return float(entry[IP_RATE])
        return 0.0

    def delay(self, ip: str, now: float) -> float:
        """Record a new connection from ``ip``: seconds it is over its rate by, 0 within it.
        The bucket holds one second's worth (Kafka's rate is over a window of seconds)."""
        rate = self.rate(ip)
        if rate <= 0:
            return 0.0
        bucket = self._buckets.get(ip)
        if bucket is None:
            _buckets_room(self._buckets)
            bucket = self._buckets[ip] = [rate, now]
        # a flood keeps the address throttled, but its debt stays bounded
        bucket[0] = max(-rate * IP_HOLD_MAX, min(rate, bucket[0] + (now - bucket[1]) * rate) - 1)
        bucket[1] = now
        return -bucket[0] / rate if bucket[0] < 0 else 0.0
