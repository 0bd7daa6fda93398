"""``odradek cluster up | down | status``: a local ZooKeeper and N brokers on 127.0.0.1, for development.

    odradek cluster up --brokers 3 [--dir D] [--port P] [--set key=value]...
    odradek cluster status [--dir D]
    odradek cluster add [--dir D] [--set key=value]...   # one more broker in the running cluster
    odradek cluster down [--dir D]

``up`` starts a standalone ZooKeeper (Debian's ``zookeeper`` package) and brokers with ids
1..N, ``zookeeper.connect=<zk>/odradek``, data under ``D/broker-<id>`` (default
``D=./odradek-cluster``), each in its own session so they outlive the command. It writes
``D/cluster.json`` (pids, ports, bootstrap), prints the bootstrap string on stdout (details
on stderr) and returns. ``down`` stops every process recorded there (SIGTERM, then SIGKILL)
and removes the file; the data stays, and the next ``up`` on the same directory reuses it.
``add`` starts broker N+1 with the first broker's settings (plus its own ``--set``, e.g.
``broker.rack``), waits until it is registered and records it; it holds no partitions until
``odradek reassign`` moves some to it or a new topic is placed on it.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

import psutil

from odradek.actors.runtime import private_dir
from odradek.core.protocol import ErrorCode, OdradekError
from odradek import config as cfg
from odradek.local import LocalCluster, four_letter, stop_pid

STATE_FILE = "cluster.json"
DEFAULT_DIR = "odradek-cluster"
CHROOT = "/odradek"


def add_parser(sub) -> None:
    p = sub.add_parser("cluster", help="a local development cluster: ZooKeeper and N brokers (up, down, status)")
    csub = p.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")

    up = csub.add_parser("up", help="start ZooKeeper and the brokers in the background; print the bootstrap string")
    up.add_argument("--brokers", type=int, default=3, help="number of brokers, ids 1..N (default 3)")
    up.add_argument("--port", type=int, default=0,
                    help="port of broker 1; broker i gets PORT+i-1 (default: any free ports)")
    add = csub.add_parser("add", help="start one more broker in the running cluster (it gets no partitions "
                                      "until `odradek reassign` moves some to it)")
    for q in (up, add, csub.add_parser("down", help="stop every process of the cluster (data is kept)"),
              csub.add_parser("status", help="processes, ports, registrations and the controller")):
        q.add_argument("--dir", default=DEFAULT_DIR, help=f"the cluster's directory (default ./{DEFAULT_DIR})")
    up.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                    help="broker setting for every broker (repeatable), e.g. --set min.insync.replicas=2")
    add.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                     help="a setting of the new broker only (repeatable), e.g. --set broker.rack=r2")
    p.set_defaults(func=run)


def run(args) -> int:
    return {"up": up, "add": add, "down": down, "status": status}[args.cluster_command](args)


def _state_path(directory: str) -> str:
    return os.path.join(os.path.abspath(directory), STATE_FILE)


def read_state(directory: str) -> dict | None:
    try:
        with open(_state_path(directory)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _alive(entry: dict) -> bool:
    """The recorded process still runs (and the pid was not reused)."""
    try:
        p = psutil.Process(entry["pid"])
        return abs(p.create_time() - entry["create_time"]) < 1.0 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _create_time(pid: int) -> float:
    return psutil.Process(pid).create_time()


def up(args) -> int:
    if args.brokers < 1:
        raise OdradekError("--brokers must be at least 1", ErrorCode.INVALID_REQUEST)
    directory = os.path.abspath(args.dir)
    state = read_state(directory)
    if state is not None:
        if any(_alive(e) for e in [state["zookeeper"], *state["brokers"]]):
            raise OdradekError(f"a cluster is already running in {directory} (odradek cluster down --dir {args.dir})",
                               ErrorCode.INVALID_REQUEST)
        os.unlink(_state_path(directory))
    settings = _settings(args.set)
    cfg.load(None, [f"{k}={v}" for k, v in settings.items()])  # a bad setting fails here, once
    private_dir(directory, "cluster directory")  # its brokers' data and ZooKeeper's: this user's alone
    cluster = LocalCluster(directory, args.brokers, settings, chroot=CHROOT, detached=True, first_port=args.port)
    began = time.monotonic()
    cluster.report = lambda text: print(f"[{time.monotonic() - began:5.1f}s] {text}", file=sys.stderr, flush=True)
    cluster.start()  # on failure it stops whatever it started
    try:
        cluster.wait_ready(timeout=30)
    except TimeoutError as exc:
        print(f"odradek: warning: {exc}", file=sys.stderr)
    finally:
        cluster.close_kazoo()
    zk = cluster.zk
    state = {"dir": directory, "chroot": CHROOT, "zookeeper_connect": cluster.zookeeper_connect,
             "bootstrap": cluster.bootstrap, "started": time.time(),
             "zookeeper": {"pid": zk.pid, "create_time": _create_time(zk.pid), "port": zk.port,
                           "data_dir": zk.data_dir},
             "brokers": [{"id": i, "pid": b.pid, "create_time": _create_time(b.pid), "host": b.host, "port": b.port,
                          "data_dir": b.data_dir, "settings": b.settings}
                         for i, b in sorted(cluster.brokers.items())]}
    tmp = _state_path(directory) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=2)
    os.replace(tmp, _state_path(directory))
    print(f"zookeeper {zk.connect} (pid {zk.pid}), chroot {CHROOT}", file=sys.stderr)
    for e in state["brokers"]:
        print(f"broker {e['id']} {e['host']}:{e['port']} (pid {e['pid']}), data {e['data_dir']}", file=sys.stderr)
    print(f"state in {_state_path(directory)}; stop with: odradek cluster down --dir {args.dir}", file=sys.stderr)
    print(cluster.bootstrap)
    return 0


def add(args) -> int:
    from odradek.local import LocalBroker
    directory, state = _existing_state(args)
    if not _alive(state["zookeeper"]):
        raise OdradekError(f"the cluster in {directory} is not running (odradek cluster up --dir {args.dir})",
                           ErrorCode.INVALID_REQUEST)
    new_id = max(e["id"] for e in state["brokers"]) + 1
    settings = {k: v for k, v in state["brokers"][0]["settings"].items() if k not in ("listeners", "log.dirs")}
    settings.update(_settings(args.set))
    settings["broker.id"] = new_id
    cfg.load(None, [f"{k}={v}" for k, v in settings.items()])  # a bad setting fails here
    broker = LocalBroker(os.path.join(directory, f"broker-{new_id}"), settings, detached=True).start()
    entry = {"id": new_id, "pid": broker.pid, "create_time": _create_time(broker.pid), "host": broker.host,
             "port": broker.port, "data_dir": broker.data_dir, "settings": broker.settings}
    state["brokers"].append(entry)
    state["bootstrap"] = ",".join(f"{e['host']}:{e['port']}" for e in state["brokers"])
    tmp = _state_path(directory) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=2)
    os.replace(tmp, _state_path(directory))
    deadline = time.monotonic() + 30
    while new_id not in (_zk_view(state)[0] or ()) and time.monotonic() < deadline:
        time.sleep(0.2)
    registered, _ = _zk_view(state)
    print(f"broker {new_id} {broker.host}:{broker.port} (pid {broker.pid}), data {broker.data_dir}"
          f"{'' if registered is None or new_id in registered else ' (not registered yet)'}", file=sys.stderr)
    print(state["bootstrap"])
    return 0


def _settings(items: list[str]) -> dict:
    settings = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise cfg.ConfigError(f"--set expects key=value, got {item!r}")
        settings[name.strip()] = value.strip()
    reserved = {"broker.id", "zookeeper.connect", "log.dirs", "listeners"} & set(settings)
    if reserved:
        raise cfg.ConfigError(f"`odradek cluster` sets {', '.join(sorted(reserved))} itself")
    return settings


def _existing_state(args) -> tuple[str, dict]:
    directory = os.path.abspath(args.dir)
    state = read_state(directory)
    if state is None:
        raise OdradekError(f"no cluster in {directory} ({STATE_FILE} is missing)", ErrorCode.INVALID_REQUEST)
    return directory, state


def down(args) -> int:
    directory, state = _existing_state(args)
    brokers = state["brokers"]

    def stop_broker(e: dict) -> None:
        if stop_pid(e["pid"], e["create_time"], timeout=30.0):
            print(f"stopped broker {e['id']} (pid {e['pid']})", file=sys.stderr)

    threads = [threading.Thread(target=stop_broker, args=(e,)) for e in brokers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    zk = state["zookeeper"]
    if stop_pid(zk["pid"], zk["create_time"], timeout=10.0, tree=False):
        print(f"stopped zookeeper (pid {zk['pid']})", file=sys.stderr)
    left = [e for e in [zk, *brokers] if _alive(e)]
    if left:
        raise OdradekError(f"processes still running: {', '.join(str(e['pid']) for e in left)}")
    os.unlink(_state_path(directory))
    print(f"cluster in {directory} is down (data kept)")
    return 0


def status(args) -> int:
    _, state = _existing_state(args)
    zk = state["zookeeper"]
    zk_up = _alive(zk) and four_letter(zk["port"], "ruok") == "imok"
    registered, controller = _zk_view(state) if zk_up else (None, None)
    ok = zk_up
    print(f"zookeeper  127.0.0.1:{zk['port']}  pid {zk['pid']}  {'up' if zk_up else 'DOWN'}")
    for e in state["brokers"]:
        alive = _alive(e)
        ok = ok and alive
        paused = alive and psutil.Process(e["pid"]).status() == psutil.STATUS_STOPPED
        reg = "" if registered is None else ("  registered" if e["id"] in registered else "  not registered")
        mark = "  controller" if controller == e["id"] else ""
        print(f"broker {e['id']}  {e['host']}:{e['port']}  pid {e['pid']}  "
              f"{'paused' if paused else 'up' if alive else 'DOWN'}{reg}{mark}")
    print(f"bootstrap  {state['bootstrap']}")
    return 0 if ok else 1


def _zk_view(state: dict) -> tuple[set | None, int | None]:
    """Registered broker ids and the controller, read from ZooKeeper (None when unreadable)."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoNodeError

    from odradek.local import _KAZOO_LOG
    zk = KazooClient(hosts=state["zookeeper_connect"], timeout=5.0, logger=_KAZOO_LOG)
    try:
        zk.start(timeout=5.0)
    except Exception:  # noqa: BLE001 - status shows what it can
        zk.close()
        return None, None
    try:
        try:
            registered = {int(i) for i in zk.get_children("/brokers/ids")}
        except NoNodeError:
            registered = set()
        try:
            controller = json.loads(zk.get("/controller")[0].decode())["brokerid"]
        except (NoNodeError, ValueError, KeyError):
            controller = None
        return registered, controller
    finally:
        zk.stop()
        zk.close()
