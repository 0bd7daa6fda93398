"""Authorization in the request handlers: the glue between the ACLs (network/secstore.py), the
matcher (network/authorizer.py) and the requests, the ACL APIs (DescribeAcls 29, CreateAcls 30,
DeleteAcls 31) and the audit log of denied operations.

Runs in each handler process (``RequestHandler.guard``). ``check`` runs once per request before
dispatch: with ``authorizer`` off it allows everything; on, every (operation, resource) of
``authorizer.requirements`` must be allowed for the request's ``principal``, else
TOPIC_/GROUP_/CLUSTER_AUTHORIZATION_FAILED. Produce and Fetch are answered per topic; a Produce
of transactional batches without Write on its ``transactional_id`` (or without one) fails whole,
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, authorizer on or off. ``allowed`` is Metadata's: topics
the principal may Describe; a named one it may not is TOPIC_AUTHORIZATION_FAILED, auto-created
only with Create on it.
Invariants: never runs on a log actor; the ACLs are re-read when their file changes, so a
change reaches every handler within ``secstore.CHECK_INTERVAL``.
"""
from __future__ import annotations

import logging
import time

from odradek.network import authorizer as az
from odradek.network import secstore
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError

log = logging.getLogger("odradek.audit")
ANONYMOUS = "User:ANONYMOUS"
ACL_APIS = (ApiKey.DESCRIBE_ACLS, ApiKey.CREATE_ACLS, ApiKey.DELETE_ACLS)
# answered per topic: denied ones fail, the others are served (AddPartitionsToTxn: the others are
# not attempted, as Kafka's handleAddPartitionsToTxnRequest answers)
PER_TOPIC = (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.ADD_PARTITIONS_TO_TXN)


class Guard:
    def __init__(self, config: dict, data_dir: str, metrics=None):
        self.metrics = metrics  # the handler's (actors.metrics.Metrics): authorization_denied
        self.enabled = bool(config.get("authorizer"))
        self.super_users = [u.strip() for u in (config.get("super.users") or "").split(";") if u.strip()]
        self.allow_if_no_acl = bool(config.get("allow.everyone.if.no.acl.found"))
        self.store = secstore.Acls(data_dir, config)
        self._version = -1
        self._authorizer = az.Authorizer()
        self._audited: dict[tuple, float] = {}

    def authorizer(self) -> az.Authorizer:
        self.store.data()
        if self.store.version != self._version:
            self._version = self.store.version
            self._authorizer = az.Authorizer((az.Acl(*a) for a in self.store.data()), self.super_users,
                                             self.allow_if_no_acl)
        return self._authorizer

    @staticmethod
    def who(request) -> tuple[str, str]:
        """The principal and host of a ``request`` (an ``actors.messages.Request``)."""
        return request.principal or ANONYMOUS, str(request.peer or "").rpartition(":")[0]

    def check(self, fields, api: int, body: dict, frames=()) -> dict[str, str]:
        """Raises OdradekError (an *_AUTHORIZATION_FAILED code) for a request not allowed.
        Produce, a consumer's Fetch and AddPartitionsToTxn are answered per topic, as Kafka
        does: their denied topics are returned (name -> why) for TOPIC_AUTHORIZATION_FAILED on
        each of their partitions, and the other topics are served (AddPartitionsToTxn: not
        attempted). A Produce whose batches (``frames``) are
        transactional needs a ``transactional_id`` (authorizer on or off, as Kafka's) and Write
        on it, else the whole request fails TRANSACTIONAL_ID_AUTHORIZATION_FAILED."""
        transactional = api == ApiKey.PRODUCE and az.has_transactional_batch(frames)
        if transactional and not isinstance(body.get("transactional_id"), str):
            raise OdradekError("a Produce of transactional batches must name its transactional_id (the one its "
                               "producer id was given for by InitProducerId)",
                               ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        if not self.enabled:
            return {}
        principal, host = self.who(fields)
        auth = self.authorizer()
        denied: dict[str, str] = {}
        for operation, resource, name in az.requirements(api, body, transactional):
            if not auth.authorize(principal, host, operation, resource, name) and not (
                    (operation, resource, name) == az.IDEMPOTENT and auth.authorize_any(principal, host, "Write", "Topic")):
                self._audit(principal, fields.peer, operation, resource, name)
                if self.metrics is not None:
                    self.metrics.inc("authorization_denied", (operation, resource))
                why = f"{principal} is not allowed to {operation} {resource} '{name}'"
                if resource == "Topic" and api in PER_TOPIC:
                    denied[name] = why
                    continue
                raise OdradekError(why, az.DENIED[resource])
        return denied

    def check_inter_broker(self, fields, api: int, body: dict) -> None:
        """An inter-broker request (``authorizer.broker_claim``) is served only over a
        connection that proved it is the broker the request names (``fields.broker``, set
        by the processor), or, with the authorizer on, for a principal granted ClusterAction on
        the cluster (Kafka's rule); else CLUSTER_AUTHORIZATION_FAILED, audited."""
        field = az.broker_claim(api, body)
        if field is None:
            return
        proven, claimed = fields.broker, body.get(field)
        name = ApiKey(api).name
        if proven is not None:
            if claimed != proven or isinstance(claimed, bool):
                raise OdradekError(f"this connection proved it is broker {proven}; it may not send {name} "
                                   f"as {field} {claimed!r}", ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
            return
        principal, host = self.who(fields)
        if self.enabled and self.authorizer().authorize(principal, host, "ClusterAction", "Cluster", az.CLUSTER):
            return
        self._audit(principal, fields.peer, "ClusterAction", "Cluster", az.CLUSTER)
        if self.metrics is not None:
            self.metrics.inc("authorization_denied", ("ClusterAction", "Cluster"))
        raise OdradekError(f"{name}{' as a replica' if field == 'replica_id' else ''} is sent only by the brokers "
                           f"of this cluster, over a connection that proved it (BROKER_PROOF); {principal} did not",
                           ErrorCode.CLUSTER_AUTHORIZATION_FAILED)

    def allowed(self, fields, operation: str, resource: str, name: str) -> bool:
        """Whether the request's principal may (no audit: for what Metadata shows or does)."""
        if not self.enabled:
            return True
        principal, host = self.who(fields)
        return self.authorizer().authorize(principal, host, operation, resource, name)

    def _audit(self, principal: str, peer, operation: str, resource: str, name: str) -> None:
        """Denied operations, at most once a second per (principal, operation, resource)."""
        key, now = (principal, operation, resource, name), time.monotonic()
        if now - self._audited.get(key, -1e9) >= 1.0:
            if len(self._audited) > 10000:
                self._audited.clear()
            self._audited[key] = now
            log.warning("audit: denied %s %s on %s '%s' from %s", principal, operation, resource, name, peer)

    # ---- the ACL APIs (answered by the handler; bodies use Kafka's field names and codes) ----------
    def serve(self, api: int, body: dict) -> dict:
        if api == ApiKey.CREATE_ACLS:
            return self.create(body)
        if api == ApiKey.DESCRIBE_ACLS:
            return self.describe(body)
        return self.delete(body)

    def create(self, body: dict) -> dict:
        results, acls = [], []
        for c in body.get("creations") or []:
            try:
                acls.append(az.Acl.make(c.get("principal"), c.get("resource_type"), c.get("resource_name"),
                                        c.get("operation"), c.get("permission_type"),
                                        c.get("resource_pattern_type", c.get("pattern_type", "Literal")),
                                        c.get("host") or "*"))
                results.append({"error_code": 0, "error_message": None})
            except (ValueError, AttributeError) as exc:
                results.append({"error_code": int(ErrorCode.INVALID_REQUEST), "error_message": str(exc)})
        if acls:
            self.store.add([a.as_list() for a in acls])
        return {"results": results}

    def describe(self, body: dict) -> dict:
        try:
            filt = _filter(body)
        except ValueError as exc:  # a resource type, pattern, operation or permission Kafka does not name
            return {"error_code": int(ErrorCode.INVALID_REQUEST), "error_message": str(exc), "resources": []}
        groups: dict[tuple, list] = {}
        for a in (az.Acl(*x) for x in self.store.data()):
            if filt.matches(a):
                groups.setdefault((a.resource, a.name, a.pattern), []).append(a)
        return {"error_code": 0, "error_message": None, "resources": [
            {"resource_type": az.RESOURCES[r], "resource_name": n, "pattern_type": az.PATTERNS[p],
             "acls": [{"principal": a.principal, "host": a.host, "operation": az.OPERATIONS[a.operation],
                       "permission_type": az.PERMISSIONS[a.permission]} for a in acls]}
            for (r, n, p), acls in sorted(groups.items())]}

    def delete(self, body: dict) -> dict:
        out = []
        for f in body.get("filters") or []:
            try:
                filt = _filter(f)
            except ValueError as exc:
                out.append({"error_code": int(ErrorCode.INVALID_REQUEST), "error_message": str(exc),
                            "matching_acls": []})
                continue
            gone = self.store.remove(lambda a, filt=filt: filt.matches(az.Acl(*a)))
            out.append({"error_code": 0, "error_message": None, "matching_acls": [
                {"error_code": 0, "error_message": None, "resource_type": az.RESOURCES[a[2]],
                 "resource_name": a[4], "pattern_type": az.PATTERNS[a[3]], "principal": a[0], "host": a[1],
                 "operation": az.OPERATIONS[a[5]], "permission_type": az.PERMISSIONS[a[6]]} for a in gone]})
        return {"filter_results": out}


def _filter(f: dict) -> az.Filter:
    def canon(table, value, what):
        return None if value is None else az._canon(table, value, what)
    return az.Filter(principal=f.get("principal_filter", f.get("principal")), host=f.get("host_filter", f.get("host")),
                     resource=canon(az.RESOURCES, f.get("resource_type_filter", f.get("resource_type")), "resource type"),
                     pattern=canon(az.PATTERNS, f.get("pattern_type_filter", f.get("pattern_type")), "pattern type"),
                     name=f.get("resource_name_filter", f.get("resource_name")),
                     operation=canon(az.OPERATIONS, f.get("operation"), "operation"),
                     permission=canon(az.PERMISSIONS, f.get("permission_type"), "permission"))
