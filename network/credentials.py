"""The SCRAM credential APIs (KIP-554), served by the request handlers; stored through
network/secstore.py (a file under the data directory, or ZooKeeper's ``/config/users``).

  DESCRIBE_USER_SCRAM_CREDENTIALS {users: [name] | null (all)}
      -> {error_code, error_message, results: [{user, error_code, error_message,
                                                credential_infos: [{mechanism, iterations}]}]}
  ALTER_USER_SCRAM_CREDENTIALS {deletions: [{name, mechanism}],
                                upsertions: [{name, mechanism, iterations, salt, salted_password}]}
      -> {results: [{user, error_code, error_message}]}, one per user named

Kafka's checks, per user, in Kafka's order: an empty name (UNACCEPTABLE_CREDENTIAL), a (user,
mechanism) altered twice (DUPLICATE_RESOURCE), an unknown mechanism
(UNSUPPORTED_SASL_MECHANISM), iterations outside 4096..16384 or an empty salt or salted
password (UNACCEPTABLE_CREDENTIAL), deleting a missing credential (RESOURCE_NOT_FOUND).
Invariants: the client sends SaltedPassword, never the password, and the stored form
(StoredKey, ServerKey) is derived here; a user's changes apply together or not at all; secrets
never appear in an answer or a log line.
"""
from __future__ import annotations

from odradek.core import sasl
from odradek.network import secstore
from odradek.core.protocol import ErrorCode

MAX_USERS_DESCRIBED = 10000  # names in one describe request (Kafka bounds it by the request size)


class Credentials:
    def __init__(self, data_dir: str, config: dict):
        self.users = secstore.Users(data_dir, config)

    def describe(self, body: dict) -> dict:
        names = body.get("users")
        stored = self.users.data()
        if not names:  # null or empty: every user
            return _described([(u, None) for u in sorted(stored)], stored)
        if not isinstance(names, list) or len(names) > MAX_USERS_DESCRIBED or \
                not all(isinstance(n, str) for n in names):
            return {"error_code": int(ErrorCode.INVALID_REQUEST), "results": [],
                    "error_message": f"'users' must be a list of at most {MAX_USERS_DESCRIBED} user names (strings)"}
        seen: set = set()
        twice = {n for n in names if n in seen or seen.add(n)}
        out = []
        for name in dict.fromkeys(names):
            if name in twice:
                out.append((name, (ErrorCode.DUPLICATE_RESOURCE, "cannot describe the same user twice in one request")))
            elif name not in stored:
                out.append((name, (ErrorCode.RESOURCE_NOT_FOUND,
                                   "attempt to describe a user credential that does not exist")))
            else:
                out.append((name, None))
        return _described(out, stored)

    def alter(self, body: dict) -> dict:
        changes = [("delete", c) for c in body.get("deletions") or ()] + \
                  [("upsert", c) for c in body.get("upsertions") or ()]
        order: list = []  # users in the order the request names them
        per_user: dict = {}
        for kind, c in changes:
            name = c.get("name") if isinstance(c, dict) and isinstance(c.get("name"), str) else ""  # "": refused
            if name not in per_user:
                order.append(name)
            per_user.setdefault(name, []).append((kind, c if isinstance(c, dict) else {}))
        errors = {u: _problem(u, per_user[u]) for u in order}
        errors = {u: e for u, e in errors.items() if e is not None}
        todo = {u: per_user[u] for u in order if u not in errors}
        if todo:
            errors.update(self.users.update(lambda data: _apply(data, todo)))
        return {"results": [{"user": u, "error_code": int(errors[u][0]) if u in errors else 0,
                             "error_message": errors[u][1] if u in errors else None} for u in order]}


def _described(entries: list, stored: dict) -> dict:
    results = []
    for name, problem in entries:
        if problem is not None:
            results.append({"user": name, "error_code": int(problem[0]),
                            "error_message": problem[1], "credential_infos": []})
            continue
        infos = [{"mechanism": m, "iterations": int(c.get("iterations", 0))}
                 for m, c in sorted((stored.get(name) or {}).items()) if m in sasl.SCRAM]
        results.append({"user": name, "error_code": 0, "error_message": None, "credential_infos": infos})
    return {"error_code": 0, "error_message": None, "results": results}


def _problem(user, changes: list) -> tuple[ErrorCode, str] | None:
    """Kafka's checks that need no stored state, in Kafka's order."""
    if not user:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "the user name must not be empty"
    try:
        secstore.check_user(user)
    except ValueError as exc:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, str(exc)
    mechanisms = [c.get("mechanism") for _, c in changes]
    if len(set(map(str, mechanisms))) != len(mechanisms):
        return ErrorCode.DUPLICATE_RESOURCE, "a user credential cannot be altered twice in the same request"
    for kind, c in changes:
        if c.get("mechanism") not in sasl.SCRAM:
            return ErrorCode.UNSUPPORTED_SASL_MECHANISM, (f"unknown SCRAM mechanism {c.get('mechanism')!r} "
                                                          f"(SCRAM-SHA-256 or SCRAM-SHA-512)")
    for kind, c in changes:
        if kind != "upsert":
            continue
        iterations = c.get("iterations")
        if not isinstance(iterations, int) or iterations < sasl.MIN_ITERATIONS:
            return ErrorCode.UNACCEPTABLE_CREDENTIAL, (f"too few iterations for {c['mechanism']}: {iterations!r} "
                                                       f"(at least {sasl.MIN_ITERATIONS})")
        if iterations > sasl.MAX_ITERATIONS:
            return ErrorCode.UNACCEPTABLE_CREDENTIAL, (f"too many iterations for {c['mechanism']}: {iterations} "
                                                       f"(at most {sasl.MAX_ITERATIONS})")
        for key in ("salt", "salted_password"):
            if not isinstance(c.get(key), bytes) or not c[key]:
                return ErrorCode.UNACCEPTABLE_CREDENTIAL, f"the {key.replace('_', ' ')} must not be empty"
    return None


def _apply(data: dict, todo: dict) -> dict:
    """Under the store's lock: each user's changes, all or none; returns the users refused."""
    refused = {}
    for user, changes in todo.items():
        have = data.get(user) or {}
        missing = [c["mechanism"] for kind, c in changes if kind == "delete" and c["mechanism"] not in have]
        if missing:
            refused[user] = (ErrorCode.RESOURCE_NOT_FOUND, f"attempt to delete a user credential that does not "
                                                           f"exist ({missing[0]})")
            continue
        creds = dict(have)
        for kind, c in changes:
            if kind == "delete":
                creds.pop(c["mechanism"], None)
            else:
                creds[c["mechanism"]] = sasl.salted_credential(c["mechanism"], c["salted_password"], c["salt"],
                                                               c["iterations"])
        if creds:
            data[user] = creds
        else:
            data.pop(user, None)
    return refused
