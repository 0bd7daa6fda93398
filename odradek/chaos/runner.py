"""One chaos run, start to end: ``run(ChaosOptions(...))`` -> the checker's result and report paths.

Runs in the caller's process (``odradek chaos``, or tests/cluster/test_chaos.py). It owns
everything it starts, and stops it whatever happens: a ZooKeeper, the fault proxy, a
``LocalCluster`` of brokers whose every address goes through the proxy (``advertised.
listeners`` -> the broker's link, ``zookeeper.connect`` -> its own ZooKeeper link), a tmpfs
for the full-disk broker when it runs as root, the workload and the nemesis.

The run: create the topic (RF = brokers, ``min.insync.replicas=2``) -> load -> faults for
``duration`` seconds -> heal everything (rules cleared, brokers resumed and restarted,
ZooKeeper up, disk emptied) -> wait for every replica back in the ISR -> stop the producers
(every send acknowledged or failed) -> readers catch up -> a fresh reader reads everything
below the high watermarks -> replicas compared below them -> checker -> report.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
import time

from odradek.chaos import checker, fsync_trace, report
from odradek.chaos.nemesis import FAULTS, Nemesis
from odradek.chaos.proxy import FaultProxy
from odradek.chaos.replicas import high_watermarks, replica_batches, replica_problems
from odradek.chaos.workload import History, Workload, read_everything

# Short timeouts, so faults are noticed in seconds (the cluster tests use the same).
CLUSTER_SETTINGS = {
    "zookeeper.session.timeout.ms": 3000,
    "zookeeper.connection.timeout.ms": 10000,
    "controller.socket.timeout.ms": 5000,  # a request a partition swallowed is sent again 5 s on
    "replica.lag.time.max.ms": 2000,
    "replica.fetch.wait.max.ms": 200,
    "replica.fetch.backoff.ms": 200,
    "shutdown.timeout.ms": 10000,
    "group.consumer.heartbeat.interval.ms": 500,
    "group.consumer.session.timeout.ms": 6000,
    "leader.imbalance.check.interval.seconds": 5,
    "log.segment.bytes": 4 << 20,  # several segments per partition, and room on a small tmpfs
}
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"  # Debian's libfaketime


@dataclasses.dataclass
class ChaosOptions:
    duration: float = 120.0  # seconds of faults
    seed: int = 0
    brokers: int = 3
    partitions: int = 3
    producers: int = 2
    consumers: int = 2
    rate: float = 100.0  # records/s per producer
    faults: list = dataclasses.field(default_factory=lambda: [f for f in FAULTS if f != "clock-jump"])
    fault_duration: float = 10.0
    gap: float = 8.0
    combine: float = 0.3
    out_dir: str = "chaos-report"
    work_dir: str | None = None  # brokers' data; a temporary directory (removed) by default
    keep: bool = False  # keep work_dir
    flush_messages: int | None = None  # topic flush.messages (1: fsync before every ack)
    ack_before_fsync: bool = False  # log.flush.before.ack=false: Kafka's acknowledgement from the page cache
    log: object = print

    @property
    def cluster_settings(self) -> dict:
        return {**CLUSTER_SETTINGS, "log.flush.before.ack": False} if self.ack_before_fsync else CLUSTER_SETTINGS


def run(opts: ChaosOptions) -> dict:
    from odradek.local import LocalCluster, LocalZooKeeper
    work = opts.work_dir or tempfile.mkdtemp(prefix="odradek-chaos-")
    os.makedirs(work, mode=0o700, exist_ok=True)
    say = opts.log
    history = History()
    zk = proxy = cluster = load = nemesis = None
    mounts: list[str] = []
    try:
        zk = LocalZooKeeper(os.path.join(work, "zookeeper")).start()
        proxy = FaultProxy()
        ids = list(range(1, opts.brokers + 1))
        cluster_ref: list = []
        broker_settings, env, clock_files = {}, {}, {}
        fsync_traces = {i: os.path.join(work, f"fsyncs-{i}") for i in ids}  # for power-loss's cut
        for i in ids:
            port = proxy.add(f"broker-{i}", lambda i=i: ("127.0.0.1", cluster_ref[0].broker(i).port))
            zk_port = proxy.add(f"zk-{i}", lambda: ("127.0.0.1", zk.port), owner=i)
            broker_settings[i] = {"advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
                                  "zookeeper.connect": f"127.0.0.1:{zk_port}/odradek"}
            env[i] = fsync_trace.env(fsync_traces[i])
            if "clock-jump" in opts.faults:
                clock_files[i] = os.path.join(work, f"clock-{i}")
                with open(clock_files[i], "w") as f:
                    f.write("+0s\n")
                env[i].update({"LD_PRELOAD": FAKETIME_LIB, "FAKETIME_TIMESTAMP_FILE": clock_files[i],
                               "FAKETIME_CACHE_DURATION": "1"})  # re-read each second; cheap
        full_disk = {}
        if "full-disk" in opts.faults:
            victim = ids[-1]
            where = os.path.join(work, f"broker-{victim}")
            why = mount_tmpfs(where, "256m")
            if why:
                say(f"chaos: full-disk left out: {why}")
                opts.faults = [f for f in opts.faults if f != "full-disk"]
            else:
                mounts.append(where)
                full_disk[victim] = where
        # a loaded machine can take a minute to start a broker's actor tree: 180 s before
        # a restart counts as failed
        cluster = LocalCluster(work, opts.brokers, opts.cluster_settings, zk=zk, chroot="/odradek",
                               start_timeout=180, broker_settings=broker_settings, broker_env=env)
        cluster_ref.append(cluster)
        say(f"chaos: starting ZooKeeper and {opts.brokers} brokers in {work}")
        cluster.start()
        cluster.wait_ready(60)
        bootstrap = ",".join(f"127.0.0.1:{proxy.links[f'broker-{i}'].port}" for i in ids)
        topic = "chaos"
        create_topic(bootstrap, topic, opts)
        wait_healed(cluster, topic, opts.partitions, 60)
        load = Workload(bootstrap, topic, opts.partitions, history, opts.producers, opts.consumers, opts.rate).start()
        nemesis = Nemesis(cluster, proxy, history, topic, opts.partitions, opts.seed, opts.faults,
                          opts.fault_duration, opts.gap, opts.combine, full_disk, clock_files, fsync_traces).start()
        say(f"chaos: faults for {opts.duration:.0f}s (seed {opts.seed}): {', '.join(opts.faults)}")
        time.sleep(opts.duration)
        nemesis.stop()
        history.add("healing")
        heal(cluster, proxy)
        healed = True
        try:
            wait_healed(cluster, topic, opts.partitions, 180)
        except TimeoutError as exc:
            healed = False
            states = partition_states(cluster, topic, opts.partitions)
            views = broker_views(cluster, topic)
            history.add("nemesis_error", name="heal", error=str(exc)[:300], states=states, views=views)
            say(f"chaos: NOT HEALED: {exc}; brokers registered {cluster.registered_brokers()}, "
                f"controller {cluster.controller_id()}, partition states {states}, "
                f"each broker's metadata of {topic} {views}")
        load.stop_producers()
        ends = high_watermarks(bootstrap, topic, range(opts.partitions))
        wait_read(history, ends, 60)
        history.add("final_read")
        final = read_everything(bootstrap, topic, opts.partitions, ends)
        problems = compare_replicas(cluster, topic, opts.partitions, ends)
        load.stop()
        events = history.snapshot()
        result = checker.check(events, final, problems)
        result["healed"] = healed
        result["nemesis_errors"] = nemesis.errors
        result["high_watermarks"] = ends
        os.makedirs(opts.out_dir, exist_ok=True)
        history.dump(os.path.join(opts.out_dir, "history.jsonl"))
        meta = {"title": f"odradek chaos: {opts.duration:.0f}s, seed {opts.seed}, {opts.brokers} brokers",
                "options": {k: v for k, v in dataclasses.asdict(opts).items() if k != "log"}}
        result["paths"] = report.write(opts.out_dir, events, result, meta)
        say(checker.summary(result))
        return result
    except BaseException:
        os.makedirs(opts.out_dir, exist_ok=True)  # what happened until the failure, for its report
        history.dump(os.path.join(opts.out_dir, "history.jsonl"))
        say(f"chaos: the run failed; its history is in {opts.out_dir}/history.jsonl (seed {opts.seed})")
        raise
    finally:
        for thing in (nemesis, load):
            if thing is not None:
                try:
                    thing.stop()
                except Exception:  # noqa: BLE001 - teardown
                    pass
        if cluster is not None:
            cluster.stop(graceful=False)
        if proxy is not None:
            proxy.close()
        if zk is not None:
            zk.stop()
        for m in mounts:
            subprocess.run(["umount", "-l", m], check=False)
        if not opts.keep and not opts.work_dir:
            shutil.rmtree(work, ignore_errors=True)


def mount_tmpfs(path: str, size: str) -> str | None:
    """Mount a private tmpfs of ``size`` at ``path``; None, or why it could not."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    os.makedirs(path, mode=0o700, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", path],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else f"mount failed: {done.stderr.strip()}"


def create_topic(bootstrap: str, topic: str, opts: ChaosOptions) -> None:
    from odradek import Admin
    from odradek.core.protocol import OdradekError
    config = {"min.insync.replicas": 2}
    if opts.flush_messages:
        config["flush.messages"] = opts.flush_messages
    deadline = time.monotonic() + 60
    while True:
        try:
            with Admin(bootstrap) as admin:
                admin.create_topic(topic, partitions=opts.partitions, replication_factor=opts.brokers, config=config)
            return
        except OdradekError as exc:
            if type(exc).__name__ == "TopicAlreadyExistsError":
                return
            if not exc.retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def heal(cluster, proxy) -> None:
    """Clear every network rule, resume paused brokers, start ZooKeeper and dead brokers."""
    proxy.heal()
    if not cluster.zk.running:
        cluster.zk.requested_port = cluster.zk.port
        cluster.close_kazoo()
        cluster.zk.start()
    for i, b in cluster.brokers.items():
        b.resume()
        if not b.running:
            cluster.restart(i)


def wait_healed(cluster, topic: str, partitions: int, timeout: float) -> None:
    """Every broker registered; every partition led, with all its replicas in the ISR."""
    def healed() -> bool:
        if cluster.registered_brokers() != cluster.ids:
            return False
        for p in range(partitions):
            state = cluster.partition_state(topic, p)
            if state is None or state["leader"] < 0 or sorted(state["isr"]) != cluster.ids:
                return False
        return True
    cluster.wait_for(healed, timeout, f"every partition of {topic} led with a full ISR", interval=0.5)


def partition_states(cluster, topic: str, partitions: int) -> dict:
    """``{partition: state}`` as ZooKeeper holds it (for a report that the cluster did not heal)."""
    try:
        return {p: cluster.partition_state(topic, p) for p in range(partitions)}
    except Exception as exc:  # noqa: BLE001 - ZooKeeper itself may be the problem
        return {"error": repr(exc)}


def broker_views(cluster, topic: str) -> dict:
    """``{broker: {partition: (leader, isr)}}`` as each running broker's METADATA answers (or
    its error): a broker that was never told a partition shows it, unlike ZooKeeper."""
    views: dict = {}
    for i, b in cluster.brokers.items():
        if not b.running:
            views[i] = "not running"
            continue
        try:
            body = cluster.metadata(i, [topic])
            t = next((t for t in body["topics"] if t.get("name") == topic), {})
            views[i] = {p["index"]: (p["leader"], p.get("isr")) for p in t.get("partitions") or ()} \
                or t.get("error_message") or t.get("error_code")
        except Exception as exc:  # noqa: BLE001 - a report, whatever the broker answers
            views[i] = repr(exc)[:200]
    return views


def wait_read(history: History, ends: dict[int, int], timeout: float) -> None:
    """Until every reader (group members together, and the assign-mode reader) has polled up
    to the high watermarks, or ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        top: dict = {}
        for e in history.snapshot():
            if e["type"] == "poll":
                who = "group" if e["mode"] == "group" else e["reader"]
                for p, o, _ in e["records"]:
                    top[(who, p)] = max(top.get((who, p), -1), o)
        if all(top.get((who, p), -1) >= end - 1 for who in ("group", "reader") for p, end in ends.items() if end):
            return
        time.sleep(0.5)


def compare_replicas(cluster, topic: str, partitions: int, ends: dict[int, int], timeout: float = 30.0) -> list[str]:
    """Divergence below the high watermark, retried for ``timeout`` (followers catch up)."""
    deadline = time.monotonic() + timeout
    while True:
        problems = []
        assignment = cluster.topic_assignment(topic) or {}
        for p in range(partitions):
            replicas = assignment.get(p, cluster.ids)
            views = {b: replica_batches(cluster.broker(b).data_dir, topic, p, ends[p]) for b in replicas}
            leader = cluster.leader(topic, p)
            problems += [f"{topic}-{p}: {m}" for m in replica_problems(views, leader if leader in views
                                                                        else replicas[0], ends[p])]
        if not problems or time.monotonic() > deadline:
            return problems
        time.sleep(1)
