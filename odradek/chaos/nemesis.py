"""The nemesis: faults injected into a running local cluster, one at a time and combined.

Runs in a thread of the chaos runner's process. Owns nothing but what it breaks: it acts on
the ``LocalCluster`` (kill, restart, pause), the ``FaultProxy`` (network rules), the brokers'
files (power loss) and a tmpfs it mounts for one broker (full disk).
Each fault of ``FAULTS`` (docs/RELIABILITY.md has the table: what each does, what heals it) is
a ``Fault`` with ``start()`` and ``heal()``, both written to the ``History`` (``fault`` /
``heal`` events) so the report can draw them; it picks its broker from the live cluster state
when it starts. ``power-loss`` cuts segments back to their size at their last fsync
(``chaos.fsync_trace``, when the runner started the brokers with it; else to the recovery
point in ``partition.checkpoint``, a harsher model); ``clock-jump`` needs libfaketime and
``full-disk`` the runner's tmpfs.
The schedule draws every fault once per round, in an order drawn from ``seed``. With
``combine`` > 0 a fault of ``COMBINABLE`` may start together with a second one on the same
broker or ZooKeeper, so a majority of replicas survives every fault but ``power-cut``.
"""
from __future__ import annotations

import os
import random
import threading
import time

import psutil

from odradek.chaos.replicas import partition_dir, segment_bases

FAULTS = ["kill-leader", "kill-follower", "kill-controller", "kill-repeat", "pause-leader", "partition-brokers",
          "partition-oneway", "partition-zk", "partition-clients", "delay", "drop", "power-loss", "power-cut",
          "slow-disk", "full-disk", "zk-restart", "clock-jump"]
# faults that can run at the same time as another on the same broker
COMBINABLE = {"partition-zk", "partition-clients", "delay", "slow-disk", "zk-restart", "pause-leader", "kill-leader"}


class Fault:
    def __init__(self, name: str, broker: int | None, start, heal, detail: str = ""):
        self.name, self.broker, self._start, self._heal, self.detail = name, broker, start, heal, detail

    def start(self) -> None:
        self._start()

    def heal(self) -> None:
        self._heal()


class Nemesis:
    def __init__(self, cluster, proxy, history, topic: str, partitions: int, seed: int = 0,
                 faults: list[str] | None = None, duration: float = 10.0, gap: float = 8.0, combine: float = 0.3,
                 full_disk: dict | None = None, clock_files: dict | None = None, fsync_traces: dict | None = None):
        self.cluster, self.proxy, self.history = cluster, proxy, history
        self.topic, self.partitions = topic, partitions
        self.rng = random.Random(seed)
        self.faults = list(faults or FAULTS)
        self.duration, self.gap, self.combine = duration, gap, combine
        self.full_disk = full_disk or {}  # broker id -> mount point (a tmpfs of the runner's)
        self.clock_files = clock_files or {}  # broker id -> libfaketime's FAKETIME_TIMESTAMP_FILE
        self.clock_offsets = {b: 0 for b in self.clock_files}
        self.fsync_traces = fsync_traces or {}  # broker id -> its fsync trace directory
        self.active: list[Fault] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="nemesis", daemon=True)
        self.errors: list[str] = []

    # ---- the schedule ------------------------------------------------------------------------
    def start(self) -> "Nemesis":
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop injecting; heal whatever is active (the runner heals the rest)."""
        self._stop.set()
        self.thread.join(self.duration + 120)

    def _run(self) -> None:
        self._stop.wait(self.gap)
        order: list[str] = []
        while not self._stop.is_set():
            if not order:  # every fault once per round, in a seeded random order
                order = self.rng.sample(self.faults, len(self.faults))
            name = order.pop()
            try:
                first = self.make(name)
                batch = [first]
                if self.combine and self.rng.random() < self.combine and name in COMBINABLE:
                    other = self.rng.choice(sorted(COMBINABLE & set(self.faults) - {name}) or [name])
                    if other != name:
                        batch.append(self.make(other, first.broker))
                for f in batch:
                    self._begin(f)
                self._stop.wait(self.duration)
            except Exception as exc:  # noqa: BLE001 - a fault that could not start: noted, healed
                self.errors.append(f"{name}: {exc!r}")
                self.history.add("nemesis_error", name=name, error=repr(exc)[:300])
            self.heal_all()
            self._stop.wait(self.gap)

    def _begin(self, fault: Fault) -> None:
        self.active.append(fault)
        self.history.add("fault", name=fault.name, broker=fault.broker, detail=fault.detail)
        fault.start()

    def heal_all(self) -> None:
        while self.active:
            f = self.active.pop()
            try:
                f.heal()
            except Exception as exc:  # noqa: BLE001
                self.errors.append(f"heal {f.name}: {exc!r}")
                self.history.add("nemesis_error", name=f.name, error=f"heal: {exc!r}"[:300])
            self.history.add("heal", name=f.name, broker=f.broker)

    # ---- choosing a victim -------------------------------------------------------------------
    def _running(self) -> list[int]:
        return [i for i, b in self.cluster.brokers.items() if b.running and not b.paused]

    def leader(self) -> int:
        p = self.rng.randrange(self.partitions)
        leader = self.cluster.leader(self.topic, p)
        return leader if leader in self._running() else self.rng.choice(self._running())

    def follower(self) -> int:
        p = self.rng.randrange(self.partitions)
        leader = self.cluster.leader(self.topic, p)
        replicas = (self.cluster.topic_assignment(self.topic) or {}).get(p, self.cluster.ids)
        others = [b for b in replicas if b != leader and b in self._running()]
        return self.rng.choice(others or self._running())

    def controller(self) -> int:
        c = self.cluster.controller_id()
        return c if c in self._running() else self.rng.choice(self._running())

    # ---- the faults --------------------------------------------------------------------------
    def make(self, name: str, broker: int | None = None) -> Fault:
        if name == "zk-restart":
            return Fault(name, None, self.cluster.zk.kill, self._zk_start)
        if name == "power-cut":
            if not self.fsync_traces:
                raise RuntimeError("power-cut needs brokers started with the fsync trace")
            return Fault(name, None, self._power_cut, lambda: [self._restart(b) for b in self.cluster.ids],
                         "every broker")
        if name == "full-disk" and not self.full_disk:
            raise RuntimeError("full-disk needs a broker on a tmpfs (run as root, or leave the fault out)")
        if name == "clock-jump" and not self.clock_files:
            raise RuntimeError("clock-jump needs brokers started with libfaketime")
        if broker is None:
            if name == "full-disk":
                broker = self.rng.choice(sorted(self.full_disk))
            elif name == "kill-follower":
                broker = self.follower()
            elif name == "kill-controller":
                broker = self.controller()
            else:
                broker = self.leader()
        b = broker
        c = self.cluster
        if name in ("kill-leader", "kill-follower", "kill-controller"):
            return Fault(name, b, lambda: c.kill(b), lambda: self._restart(b))
        if name == "kill-repeat":
            return Fault(name, b, lambda: self._kill_repeat(b), lambda: self._restart(b), "3 times")
        if name == "pause-leader":
            return Fault(name, b, lambda: c.pause(b), lambda: c.resume(b))
        if name == "power-loss":
            return Fault(name, b, lambda: self._power_loss(b), lambda: self._restart(b))
        if name == "slow-disk":
            return self._slow_disk(b)
        if name == "full-disk":
            return Fault(name, b, lambda: self._fill(b), lambda: self._unfill(b))
        if name == "clock-jump":
            jump = self.rng.randint(60, 600)
            return Fault(name, b, lambda: self._jump_clock(b, jump), lambda: None, f"+{jump}s")
        rules = self._network_rules(name, b)
        return Fault(name, b, lambda: [self.proxy.set_rule(*r) for r in rules], self.proxy.heal)

    def _network_rules(self, name: str, b: int) -> list[tuple]:
        others = [o for o in self.cluster.ids if o != b]
        link, zk = f"broker-{b}", f"zk-{b}"
        if name == "partition-brokers":
            return [(link, o, "blackhole") for o in others] + [(f"broker-{o}", b, "blackhole") for o in others]
        if name == "partition-oneway":  # b's packets to the others are lost
            return [(f"broker-{o}", b, "out") for o in others] + [(link, o, "in") for o in others]
        if name == "partition-zk":
            return [(zk, "*", "blackhole")]
        if name == "partition-clients":
            return [(link, "client", "blackhole")]
        if name == "delay":
            return [(link, "*", ("delay", 0.2)), (zk, "*", ("delay", 0.2))]
        if name == "drop":
            return [(link, "*", "drop")]
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")

    def _restart(self, b: int) -> None:
        if not self.cluster.broker(b).running:
            self.cluster.restart(b)
            self.history.add("restarted", broker=b, took=round(self.cluster.broker(b).started_s or 0, 2))

    def _zk_start(self) -> None:
        zk = self.cluster.zk
        zk.requested_port = zk.port  # the proxies and our own readers know this port
        self.cluster.close_kazoo()
        zk.start()

    def _kill_repeat(self, b: int) -> None:
        for _ in range(2):
            self.cluster.kill(b)
            self._stop.wait(2)
            self.cluster.restart(b)
            self._stop.wait(3)
        self.cluster.kill(b)

    def _power_loss(self, b: int) -> None:
        broker = self.cluster.broker(b)
        broker.kill()
        if b in self.fsync_traces:
            from odradek.chaos.fsync_trace import cut_to_fsynced
            cut = cut_to_fsynced(broker.data_dir, self.fsync_traces[b], self.rng)
        else:
            cut = power_loss(broker.data_dir, self.rng)
        self.history.add("power_loss", broker=b, files=len(cut), bytes_lost=sum(n for _, n in cut))

    def _power_cut(self) -> None:
        cut = power_cut_all(self.cluster, self.fsync_traces, self.rng)
        self.history.add("power_loss", broker=None, files=sum(len(c) for c in cut.values()),
                         bytes_lost=sum(n for c in cut.values() for _, n in c))

    def _slow_disk(self, b: int) -> Fault:
        stop = threading.Event()

        def stutter():
            procs = []
            try:
                for a in self.cluster.broker(b).status()["actors"]:
                    if a["role"] == "log" and a["pid"]:
                        procs.append(psutil.Process(a["pid"]))
            except Exception as exc:  # noqa: BLE001
                self.history.add("nemesis_error", name="slow-disk", error=repr(exc)[:300])
            while not stop.is_set():
                _signal_all(procs, "suspend")
                time.sleep(0.08)
                _signal_all(procs, "resume")
                stop.wait(0.02)
            _signal_all(procs, "resume")

        thread = threading.Thread(target=stutter, daemon=True)

        def heal():
            stop.set()
            thread.join(5)
        return Fault("slow-disk", b, thread.start, heal, "log actors stopped 80 of every 100 ms")

    def _fill(self, b: int) -> None:
        """Write zeros until the file system refuses (unbuffered: the last bytes count too)."""
        fd = os.open(os.path.join(self.full_disk[b], "filler"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for size in (1 << 20, 4096, 1):
                try:
                    while True:
                        os.write(fd, b"\0" * size)
                except OSError:
                    pass
        finally:
            os.close(fd)

    def _unfill(self, b: int) -> None:
        try:
            os.remove(os.path.join(self.full_disk[b], "filler"))
        except FileNotFoundError:
            pass
        broker = self.cluster.broker(b)
        broker.stop()
        self.cluster.restart(b)

    def _jump_clock(self, b: int, seconds: int) -> None:
        self.clock_offsets[b] += seconds
        with open(self.clock_files[b] + ".tmp", "w") as f:
            f.write(f"+{self.clock_offsets[b]}s\n")
        os.replace(self.clock_files[b] + ".tmp", self.clock_files[b])


def power_cut_all(cluster, traces: dict, rng: random.Random) -> dict[int, list[tuple[str, int]]]:
    """Every running broker loses power at once: all their processes frozen, then killed, then
    each broker's segments cut to what it had fsynced (``chaos.fsync_trace``, from ``traces``:
    broker id -> its trace directory). ``{broker: [(file, bytes cut)]}``."""
    from odradek.chaos.fsync_trace import cut_to_fsynced
    live = [i for i in cluster.ids if cluster.broker(i).running]
    procs = []
    for i in live:
        try:
            procs += [psutil.Process(cluster.broker(i).pid), *cluster.broker(i).children()]
        except psutil.NoSuchProcess:
            pass
    _signal_all(procs, "suspend")
    for i in live:
        cluster.broker(i).kill()
    return {i: cut_to_fsynced(cluster.broker(i).data_dir, traces[i], rng) for i in live}


def _signal_all(procs, how: str) -> None:
    for p in procs:
        try:
            getattr(p, how)()
        except psutil.NoSuchProcess:
            pass


def power_loss(data_dir: str, rng: random.Random) -> list[tuple[str, int]]:
    """Cut every partition of a (dead) broker back to its recovery point and append garbage.

    The model: the broker's ``partition.checkpoint`` records the recovery point, the offset
    below which the log was fsynced; a write after it may or may not have reached the disk.
    The worst case is kept: each segment holding the recovery point is cut at the first
    batch at or after it and 1-4096 random bytes (a torn write) appended; segments that
    start after it are removed. Index files are left as they are (recovery checks them).
    Returns ``[(file, bytes removed)]``."""
    from odradek.core.records import CorruptRecordError, iter_batches
    cut = []
    for name in sorted(os.listdir(data_dir)):
        directory = os.path.join(data_dir, name)
        point = _recovery_point(directory)
        if point is None:
            continue
        for base in segment_bases(directory):
            path = os.path.join(directory, f"{base:020d}.log")
            size = os.path.getsize(path)
            keep = 0
            if base < point:
                with open(path, "rb") as f:
                    buf = f.read()
                try:
                    for pos, h in iter_batches(buf):
                        if h.base_offset >= point:
                            break
                        keep = pos + h.size
                except CorruptRecordError:
                    pass
            if base >= point and base > 0:
                os.remove(path)
                cut.append((path, size))
                continue
            if keep < size:
                os.truncate(path, keep)
                with open(path, "ab") as f:
                    f.write(rng.randbytes(rng.randint(1, 4096)))
                cut.append((path, size - keep))
    return cut


def _recovery_point(directory: str) -> int | None:
    if not os.path.isdir(directory):
        return None
    try:
        with open(os.path.join(directory, "partition.checkpoint")) as f:
            lines = f.read().split("\n")
        return int(dict(line.split(" ") for line in lines[1:4])["recovery_point"])
    except (FileNotFoundError, ValueError, KeyError):
        return 0 if segment_bases(directory) else None


__all__ = ["FAULTS", "Nemesis", "power_loss", "power_cut_all", "partition_dir"]
