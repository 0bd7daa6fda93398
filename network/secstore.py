"""Durable security state: SCRAM credentials and ACLs. Single broker: each a private JSON file
under ``<log.dirs>/security/``. Cluster mode: ZooKeeper's ``/config/users`` and ``/kafka-acl``
under the cluster's chroot (written with a version check, read through a watch).

Used by the processors (credentials), the handlers (ACLs; both written by CreateAcls,
DeleteAcls, AlterUserScramCredentials) and ``odradek users`` / ``odradek acls`` (also on a
stopped broker's data directory).
Invariants: writers take an exclusive ``flock`` on the file's ``.lock`` and replace the file
atomically (temp file, fsync, rename), so readers never see half a file; a reader re-reads when
the file's (mtime, size, inode, mode, owner) changed, so a change reaches every process within
``CHECK_INTERVAL``. Whoever can write these files is the broker's super user: directories are
0700 and files 0600 whatever the umask (``private_dir``), and a file or directory another user
owns or others may write is refused (``check`` at start: the broker does not start; at each
re-read: the old content is kept, logged; by writers). So is a file that is not JSON (edited by
hand): the old content is kept, logged; with nothing read before, ``data`` raises
``StoreUnreadable``, as it does while ZooKeeper cannot be reached for a first read: a store
never stands in for its content with an empty default (no ACLs would allow everyone).
"""
from __future__ import annotations

import base64
import collections
import fcntl
import json
import logging
import os
import threading
import time
from typing import Any, Callable

from odradek.actors.runtime import private_dir
from odradek.core import sasl
from odradek.core.protocol import ErrorCode, OdradekError

log = logging.getLogger("odradek.security")
CHECK_INTERVAL = 0.2  # seconds between stat() calls of a reader
FILES = ("users.json", "acls.json", "quotas.json", "secret.json")


class StoreUnreadable(OdradekError):
    """A store's first read failed (a file that is not JSON, ZooKeeper out of reach): there is
    no content to go on. Callers that can go on without it (quotas: no throttling) do."""


def security_dir(data_dir: str) -> str:
    return os.path.join(data_dir, "security")


def untrusted(path: str, st: os.stat_result | None = None) -> str | None:
    """Why the security file or directory ``path`` cannot be trusted, or None."""
    st = st or os.stat(path)
    if st.st_uid != os.geteuid():
        return (f"{path} belongs to uid {st.st_uid}, not to the broker's user (uid {os.geteuid()}): "
                f"whoever owns it chooses the users and ACLs")
    if st.st_mode & 0o022:
        return f"{path} has mode {st.st_mode & 0o777:04o}: group or others may write it and choose the users and ACLs"
    return None


def check(data_dir: str) -> None:
    """At the start of a broker (single-broker mode): the security directory and its files must
    be this user's and writable by nobody else (OdradekError, naming the first that is not and
    what to do); files merely readable by others (the salts and keys) are narrowed to 0600."""
    directory = security_dir(data_dir)
    paths = [directory] + [os.path.join(directory, f) for f in FILES]
    for path in paths:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        problem = untrusted(path, st)
        if problem:
            raise OdradekError(f"refusing to start: {problem}; check its content, then chown it to this user and "
                               f"chmod it {'700' if path == directory else '600'}, or remove it",
                               ErrorCode.INVALID_CONFIG)
        private = 0o700 if path == directory else 0o600
        if st.st_mode & 0o777 != private:
            log.warning("%s had mode %04o; narrowing it to %04o", path, st.st_mode & 0o777, private)
            os.chmod(path, private)


class JsonStore:
    def __init__(self, path: str, default: Callable[[], Any] = dict):
        self.path = path
        self.default = default
        self._stamp: tuple | None = None
        self._data: Any = default()
        self._checked = 0.0
        self._refused: tuple | None = None  # the stamp of the untrusted file last refused
        self.version = 0  # bumped whenever the content was (re)loaded

    def data(self, now: float | None = None, fresh: bool = False) -> Any:
        """The file's content, re-read if it changed (checked at most every CHECK_INTERVAL;
        at once with ``fresh``: a page showing a change just made)."""
        now = time.monotonic() if now is None else now
        if fresh or now - self._checked >= CHECK_INTERVAL or self._stamp is None:
            self._checked = now
            self._reload()
        return self._data

    def _reload(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._stamp != ():
                self._stamp, self._data = (), self.default()
                self.version += 1
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode, st.st_uid)  # a chown/chmod is a change too
        if stamp != self._stamp and stamp != self._refused:
            problem = untrusted(self.path, st) or untrusted(os.path.dirname(self.path))
            if problem:
                self._refused = stamp
                log.error("refusing to read %s: %s; what was read before stays in force", self.path, problem)
                return
            try:
                with open(self.path) as f:
                    data = json.load(f)
            except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
                if self._stamp is None:  # nothing read before: every read raises until it is fixed
                    raise StoreUnreadable(f"cannot read {self.path}: {exc}; it must be the JSON the broker "
                                          f"writes (fix or remove it)", ErrorCode.INVALID_CONFIG) from None
                self._refused = stamp
                log.error("cannot read %s: %s; what was read before stays in force until it is fixed",
                          self.path, exc)
                return
            self._data = data
            self._stamp = stamp
            self.version += 1

    def update(self, change: Callable[[Any], Any]) -> Any:
        """Apply ``change(data) -> result`` under the file's lock and write the result durably."""
        directory = os.path.dirname(self.path)
        private_dir(os.path.dirname(directory))  # the data directory
        private_dir(directory, "security directory")
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                problem = untrusted(self.path)
                if problem:
                    raise OdradekError(f"refusing to write {self.path}: {problem}", ErrorCode.INVALID_CONFIG)
                with open(self.path) as f:
                    data = json.load(f)
            except FileNotFoundError:
                data = self.default()
            result = change(data)
            tmp = f"{self.path}.tmp.{os.getpid()}"
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            dfd = os.open(os.path.dirname(self.path), os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        finally:
            os.close(fd)
        self._stamp = None  # the next read sees it
        return result


class ZkStore:
    """The same interface on one ZooKeeper node; the client connects on first use (in the
    process that uses it: actors are separate processes)."""

    def __init__(self, connect: str, path: str, default: Callable[[], Any] = dict, timeout: float = 10.0):
        self.connect, self.zpath, self.default, self.timeout = connect, path, default, timeout
        self.path = f"zookeeper:{connect}{path}"
        self._zk = None
        self._data: Any = default()
        self.version = 0

    def _client(self):
        with _SESSIONS_LOCK:  # the inter-broker connections' threads may ask at once (ServerSecret)
            return self._client_locked()

    def _client_locked(self):
        if self._zk is None:
            zk = _session_locked(self.connect, self.timeout)
            zk.ensure_path(self.zpath)
            self._zk = zk
            zk.DataWatch(self.zpath, self._changed)
        return self._zk

    def _changed(self, data, _stat) -> None:  # kazoo's thread: one reference swap
        try:
            self._data = json.loads(data) if data else self.default()
        except ValueError:
            self._data = self.default()
        self.version += 1

    def data(self, now: float | None = None, fresh: bool = False) -> Any:  # a watch keeps it fresh
        if self._zk is None:
            try:
                self._client()
            except Exception as exc:  # noqa: BLE001 - kazoo's errors and timeouts: the first read failed
                raise StoreUnreadable(f"cannot read ZooKeeper's {self.zpath} now ({type(exc).__name__}: {exc}); "
                                      f"retry", ErrorCode.NETWORK_EXCEPTION) from None
        return self._data

    def update(self, change: Callable[[Any], Any]) -> Any:
        from kazoo.exceptions import BadVersionError
        zk = self._client()
        while True:
            raw, stat = zk.get(self.zpath)
            data = json.loads(raw) if raw else self.default()
            result = change(data)
            try:
                zk.set(self.zpath, json.dumps(data, sort_keys=True).encode(), version=stat.version)
            except BadVersionError:
                continue  # another writer came first: redo the change on its version
            self._changed(json.dumps(data).encode(), None)
            return result

    def close(self) -> None:
        """End this process's session (a command's, at its end)."""
        if self._zk is not None:
            _SESSIONS.pop(self.connect, None)
            self._zk.stop()
            self._zk.close()
            self._zk = None


_SESSIONS: dict = {}  # zookeeper.connect -> the process's KazooClient
_SESSIONS_LOCK = threading.Lock()


def zk_session(connect: str, timeout: float = 10.0):
    """This process's ZooKeeper session for ``connect`` (``host:port[/chroot]``), started on
    first use and shared by its stores (and by readers such as the console's brokers page)."""
    with _SESSIONS_LOCK:
        return _session_locked(connect, timeout)


def _session_locked(connect: str, timeout: float):
    zk = _SESSIONS.get(connect)
    if zk is None:  # one ZooKeeper session per process, shared by its stores
        from kazoo.client import KazooClient
        hosts, _, chroot = connect.partition("/")
        zk = KazooClient(hosts=hosts, timeout=timeout)
        zk.start(timeout=timeout)
        if chroot:
            zk.ensure_path("/" + chroot)
            zk.chroot = "/" + chroot
        _SESSIONS[connect] = zk
    return zk


def _store(config: dict, data_dir: str, name: str, zpath: str, default):
    if config.get("zookeeper.connect"):
        return ZkStore(config["zookeeper.connect"], zpath, default,
                       config.get("zookeeper.connection.timeout.ms", 10000) / 1000)
    return JsonStore(os.path.join(security_dir(data_dir), name), default)


# ---- the server's secret ----------------------------------------------------------------------

class ServerSecret:
    """32 random bytes made once, by whichever process needs them first: ``secret.json`` under
    ``data_dir`` or, in cluster mode, ZooKeeper's ``/config/odradek-secret``, so every broker of
    a cluster has the same (a write with a version check: two brokers making it at once end
    with one). Derives the fake SCRAM credentials (``Users.fake_credential``) and the key
    brokers prove themselves to each other with (``sasl.broker_key``). It never changes, so
    it is read once per process; thread-safe (the inter-broker connections' threads ask)."""

    def __init__(self, data_dir: str, config: dict | None = None):
        self.store = _store(config or {}, data_dir, "secret.json", "/config/odradek-secret", dict)
        self._lock = threading.Lock()
        self._secret: bytes | None = None

    def get(self) -> bytes:
        with self._lock:
            if self._secret is None:
                secret = self.store.data().get("secret")
                if secret is None:  # under the store's lock (file) or version check (ZooKeeper)
                    secret = self.store.update(
                        lambda d: d.setdefault("secret", base64.b64encode(os.urandom(32)).decode()))
                self._secret = base64.b64decode(secret)
            return self._secret


# ---- users (SCRAM credentials) ----------------------------------------------------------------

class Users:
    """``{user: {"SCRAM-SHA-256": credential, "SCRAM-SHA-512": credential}}``, in a file under
    ``data_dir`` or, with ``config["zookeeper.connect"]``, in ZooKeeper's ``/config/users``."""

    def __init__(self, data_dir: str, config: dict | None = None):
        self.store = _store(config or {}, data_dir, "users.json", "/config/users", dict)
        # the server's secret the credentials of users that do not exist derive from (shared by
        # the brokers of a cluster, as the users are: a prober must see the same from each)
        self.secret = ServerSecret(data_dir, config)
        self.path = self.store.path
        self.data, self.update = self.store.data, self.store.update
        self._iterations: tuple[int, dict] = (-1, {})  # (users' version, mechanism -> iterations)

    def lookup(self, user: str, mechanism: str) -> dict | None:
        return (self.data().get(user) or {}).get(mechanism)

    def fake_credential(self, user: str, mechanism: str) -> dict:
        """For a user that does not exist: a credential stable for the name, with the iteration
        count most users of the mechanism have (the default when there are none), so SCRAM's first
        answer looks like a real user's (``sasl.fake_credential``)."""
        users = self.data()
        if self._iterations[0] != self.store.version:
            counts: dict = {}
            for creds in users.values():
                for m, c in creds.items():
                    counts.setdefault(m, collections.Counter())[int(c["iterations"])] += 1
            self._iterations = (self.store.version, {m: c.most_common(1)[0][0] for m, c in counts.items()})
        return sasl.fake_credential(self.secret.get(), user, mechanism,
                                    self._iterations[1].get(mechanism, sasl.DEFAULT_ITERATIONS))

    def add(self, user: str, password: str, mechanisms=("SCRAM-SHA-256", "SCRAM-SHA-512"),
            iterations: int = sasl.DEFAULT_ITERATIONS) -> None:
        check_user(user)
        creds = {m: sasl.scram_credential(m, password, iterations) for m in mechanisms}
        self.update(lambda data: data.setdefault(user, {}).update(creds))

    def set_credential(self, user: str, mechanism: str, credential: dict | None) -> None:
        """Store (or, with None, delete) one mechanism's credential; the user goes with its last one."""
        check_user(user)

        def change(data: dict) -> None:
            if credential is None:
                data.get(user, {}).pop(mechanism, None)
                if user in data and not data[user]:
                    del data[user]
            else:
                data.setdefault(user, {})[mechanism] = credential
        self.update(change)

    def delete(self, user: str) -> bool:
        return self.update(lambda data: data.pop(user, None) is not None)

    def describe(self, fresh: bool = False) -> dict[str, list]:
        """user -> [(mechanism, iterations)] (never a key or salt)."""
        return {u: sorted((m, int(c["iterations"])) for m, c in creds.items())
                for u, creds in sorted(self.data(fresh=fresh).items())}


def check_user(user: str) -> None:
    if not isinstance(user, str) or not user or len(user) > 256 or any(ord(c) < 32 for c in user):
        raise ValueError(f"user name {user!r} must be 1 to 256 printable characters")


# ---- ACLs -------------------------------------------------------------------------------------

class Acls:
    """``[[principal, host, resource, pattern, name, operation, permission], ...]`` (sorted,
    unique), in a file under ``data_dir`` or in ZooKeeper's ``/kafka-acl`` (cluster mode)."""

    def __init__(self, data_dir: str, config: dict | None = None):
        self.store = _store(config or {}, data_dir, "acls.json", "/kafka-acl", list)
        self.path = self.store.path
        self.data, self.update = self.store.data, self.store.update

    @property
    def version(self) -> int:
        return self.store.version

    def add(self, acls: list) -> None:
        def change(data: list) -> None:
            have = {tuple(a) for a in data}
            data.extend(list(a) for a in acls if tuple(a) not in have)
            data.sort()
        self.update(change)

    def remove(self, matches: Callable[[list], bool]) -> list:
        """Delete the ACLs ``matches`` selects; returns them."""
        def change(data: list) -> list:
            gone = [a for a in data if matches(a)]
            data[:] = [a for a in data if not matches(a)]
            return gone
        return self.update(change)


# ---- quotas ------------------------------------------------------------------------------------

class Quotas:
    """``{"users": {name: {"producer_byte_rate": n, "consumer_byte_rate": n}}, "clients": {...}}``;
    the name ``<default>`` applies to every user (client) without its own. A file under
    ``data_dir`` or ZooKeeper's ``/config/quotas`` (cluster mode)."""

    def __init__(self, data_dir: str, config: dict | None = None):
        self.store = _store(config or {}, data_dir, "quotas.json", "/config/quotas", dict)
        self.path = self.store.path
        self.data, self.update = self.store.data, self.store.update

    def set(self, kind: str, name: str, key: str, value: int | None) -> None:
        def change(data: dict) -> None:
            entry = data.setdefault(kind, {}).setdefault(name, {})
            if value is None:
                entry.pop(key, None)
            else:
                entry[key] = int(value)
            if not entry:
                del data[kind][name]
        self.update(change)
