"""Durable security state of one broker: SCRAM credentials and ACLs, each a private JSON file
under ``<log.dirs>/security/`` (directory 0700, files 0600).

Used in the processes that need them: the processors read credentials (authentication),
the handlers read ACLs (authorization) and write both (CreateAcls, DeleteAcls,
AlterUserScramCredentials), and ``odradek users`` / ``odradek acls`` write them on a
stopped (or running) broker's data directory. Writers take an exclusive ``flock`` on the
file's ``.lock`` and replace the file atomically (temp file, fsync, rename), so readers
never see half a file. A reader re-reads when the file's (mtime, size, inode) changed: a
change made by any writer reaches every process of the broker at its next check (at most
``CHECK_INTERVAL`` later), which is how a running broker learns of it.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from typing import Any, Callable

from odradek.network import sasl

CHECK_INTERVAL = 0.2  # seconds between stat() calls of a reader


def security_dir(data_dir: str) -> str:
    return os.path.join(data_dir, "security")


class JsonStore:
    def __init__(self, path: str, default: Callable[[], Any] = dict):
        self.path = path
        self.default = default
        self._stamp: tuple | None = None
        self._data: Any = default()
        self._checked = 0.0
        self.version = 0  # bumped whenever the content was (re)loaded

    def data(self, now: float | None = None) -> Any:
        """The file's content, re-read if it changed (checked at most every CHECK_INTERVAL)."""
        now = time.monotonic() if now is None else now
        if now - self._checked >= CHECK_INTERVAL or self._stamp is None:
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
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._stamp:
            with open(self.path) as f:
                self._data = json.load(f)
            self._stamp = stamp
            self.version += 1

    def update(self, change: Callable[[Any], Any]) -> Any:
        """Apply ``change(data) -> result`` under the file's lock and write the result durably."""
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
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


# ---- users (SCRAM credentials) ----------------------------------------------------------------

class Users(JsonStore):
    """``{user: {"SCRAM-SHA-256": credential, "SCRAM-SHA-512": credential}}``."""

    def __init__(self, data_dir: str):
        super().__init__(os.path.join(security_dir(data_dir), "users.json"))

    def lookup(self, user: str, mechanism: str) -> dict | None:
        return (self.data().get(user) or {}).get(mechanism)

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

    def describe(self) -> dict[str, list]:
        """user -> [(mechanism, iterations)] (never a key or salt)."""
        return {u: sorted((m, int(c["iterations"])) for m, c in creds.items())
                for u, creds in sorted(self.data().items())}


def check_user(user: str) -> None:
    if not isinstance(user, str) or not user or len(user) > 256 or any(ord(c) < 32 for c in user):
        raise ValueError(f"user name {user!r} must be 1 to 256 printable characters")


# ---- ACLs -------------------------------------------------------------------------------------

class Acls(JsonStore):
    """``[[principal, host, resource, pattern, name, operation, permission], ...]`` (sorted, unique)."""

    def __init__(self, data_dir: str):
        super().__init__(os.path.join(security_dir(data_dir), "acls.json"), list)

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
