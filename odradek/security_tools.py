"""``odradek users`` and ``odradek acls``: SCRAM users and ACLs, like Kafka's kafka-configs
(``--alter --add-config 'SCRAM-SHA-256=[...]'``) and kafka-acls.

Runs in the command's process. ``users`` writes the broker's credential file under its
``log.dirs`` (``--config``/``--set log.dirs=...``, as ``serve`` takes them); a running broker
reads the change at its next authentication. ``acls`` talks to a broker with
``--bootstrap-server`` (CreateAcls, DescribeAcls, DeleteAcls; with ``--security-protocol``,
``--sasl-mechanism``, ``--user``, ``--password``, ``--ssl-cafile`` ... to sign in as an admin),
or, without it, edits the ACL file of the data directory directly (a stopped broker, or the
first set-up). Passwords are read from ``--password`` or, safer, ``--password-stdin``;
they are never printed.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import sys

from odradek import client_properties
from odradek import config as cfg
from odradek.actors.runtime import private_dir
from odradek.network import authorizer as az
from odradek.core import sasl
from odradek.network import secstore
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError


def add_parsers(sub, config_args, bootstrap) -> None:
    p = sub.add_parser("users", help="SCRAM users of a broker's data directory (--add/--delete/--list)")
    config_args(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--add", metavar="USER", help="add a user, or change its password")
    g.add_argument("--delete", metavar="USER")
    g.add_argument("--list", action="store_true")
    p.add_argument("--password", help="the password (visible in the process list: prefer --password-stdin)")
    p.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    p.add_argument("--mechanism", action="append", choices=list(sasl.SCRAM),
                   help="SCRAM mechanism(s) to store (default both); PLAIN checks against them")
    p.add_argument("--iterations", type=int, default=sasl.DEFAULT_ITERATIONS)
    p.set_defaults(func=cmd_users)

    p = sub.add_parser("acls", help="ACLs (like kafka-acls): --add, --list, --remove")
    config_args(p)
    p.add_argument("--bootstrap-server", metavar="HOST:PORT",
                   help="ask this broker (else edit the data directory's ACL file directly)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--add", action="store_true")
    g.add_argument("--list", action="store_true")
    g.add_argument("--remove", action="store_true")
    p.add_argument("--allow-principal", action="append", default=[], metavar="User:NAME")
    p.add_argument("--deny-principal", action="append", default=[], metavar="User:NAME")
    p.add_argument("--principal", help="--list/--remove: only this principal's ACLs")
    p.add_argument("--allow-host", default="*")
    p.add_argument("--operation", action="append", default=[], help="Read, Write, Create, Delete, Alter, Describe, "
                   "ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, All")
    p.add_argument("--topic")
    p.add_argument("--group")
    p.add_argument("--transactional-id")
    p.add_argument("--cluster", action="store_true")
    p.add_argument("--resource-pattern-type", default=None, help="literal (default for --add), prefixed, "
                   "any or match (for --list/--remove)")
    for opt in ("--security-protocol", "--sasl-mechanism", "--user", "--password", "--ssl-cafile", "--ssl-certfile",
                "--ssl-keyfile"):
        p.add_argument(opt, help="with --bootstrap-server: how to sign in (kafka-python's option names)")
    client_properties.add_arguments(p)  # or Kafka's client properties file: no password on the command line
    p.set_defaults(func=cmd_acls)


# ---- users --------------------------------------------------------------------------------
def _password(args) -> str:
    if args.password_stdin:
        return sys.stdin.readline().rstrip("\n")
    if args.password is None:
        raise OdradekError("--add needs --password or --password-stdin", ErrorCode.INVALID_CONFIG)
    return args.password


def _private_data_dir(config: dict) -> str:
    """The data directory these commands read or write, made private (0700) whatever the umask:
    whoever could replace its ``security/`` would choose the broker's users and ACLs."""
    data_dir = cfg.data_dir(config)
    if not config["zookeeper.connect"]:
        private_dir(data_dir)
    return data_dir


def cmd_users(args) -> int:
    config = cfg.load(args.config, args.set)
    store = secstore.Users(_private_data_dir(config), config)  # ZooKeeper's /config/users with zookeeper.connect
    if args.add:
        try:
            store.add(args.add, _password(args), tuple(args.mechanism or sasl.SCRAM), args.iterations)
        except ValueError as exc:
            raise OdradekError(str(exc), ErrorCode.INVALID_CONFIG) from None
        print(f"User '{args.add}' stored ({', '.join(args.mechanism or sasl.SCRAM)}, {args.iterations} iterations) "
              f"in {store.path}.")
    elif args.delete:
        if not store.delete(args.delete):
            raise OdradekError(f"no user '{args.delete}' in {store.path}", ErrorCode.INVALID_CONFIG)
        print(f"User '{args.delete}' deleted.")
    else:
        for user, mechs in store.describe().items():
            print(f"{user}: " + ", ".join(f"{m} (iterations={n})" for m, n in mechs))
    return 0


# ---- quotas (odradek configs --entity-type users|clients|ips) --------------------------------
def cmd_quotas(args) -> int:
    """Quotas are stored like users: the data directory's file, or ZooKeeper in cluster mode;
    every processor (and, for ips, the acceptor) re-reads them when they change."""
    from odradek.network.quotas import DEFAULT, ENTITY_KEYS
    config = cfg.load(args.config, args.set)
    store = secstore.Quotas(_private_data_dir(config), config)
    name = DEFAULT if getattr(args, "entity_default", False) else args.entity_name
    keys = ENTITY_KEYS[args.entity_type]
    if args.alter:
        if not name:
            raise OdradekError(f"--alter needs --entity-name (a {args.entity_type[:-1]}) or --entity-default",
                               ErrorCode.INVALID_CONFIG)
        if args.entity_type == "ips" and name != DEFAULT:
            try:
                ipaddress.ip_address(name)
            except ValueError:
                raise OdradekError(f"--entity-name {name!r} is not an IP address (or use --entity-default)",
                                   ErrorCode.INVALID_CONFIG) from None
        changes = []
        for item in ",".join(list(args.add_config or []) + list(args.pairs or [])).split(","):
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or key not in keys or not value.strip().isdigit():
                raise OdradekError(f"expected {' or '.join(k + '=N' for k in keys)} for --entity-type "
                                   f"{args.entity_type} (0 removes it), got {item!r}", ErrorCode.INVALID_CONFIG)
            changes.append((key, int(value) or None))
        for key, value in changes:
            store.set(args.entity_type, name, key, value)
        print(f"Completed updating quotas for {args.entity_type} '{name}'.")
        return 0
    for entity, entry in sorted((store.data().get(args.entity_type) or {}).items()):
        if name in (None, entity):
            print(f"Quotas for {args.entity_type} '{entity}': "
                  + ", ".join(f"{k}={v}" for k, v in sorted(entry.items())))
    return 0


# ---- acls ---------------------------------------------------------------------------------
def _resource(args) -> tuple[str, str] | None:
    chosen = [(kind, name) for kind, name in (("Topic", args.topic), ("Group", args.group),
                                              ("TransactionalId", args.transactional_id),
                                              ("Cluster", az.CLUSTER if args.cluster else None)) if name]
    if len(chosen) > 1:
        raise OdradekError("name one resource: --topic, --group, --transactional-id or --cluster", ErrorCode.INVALID_CONFIG)
    return chosen[0] if chosen else None


def _security(args) -> dict:
    return client_properties.options_of(args) | {k: v for k, v in (("security_protocol", args.security_protocol), ("sasl_mechanism", args.sasl_mechanism),
                              ("sasl_plain_username", args.user), ("sasl_plain_password", args.password),
                              ("ssl_cafile", args.ssl_cafile), ("ssl_certfile", args.ssl_certfile),
                              ("ssl_keyfile", args.ssl_keyfile)) if v is not None}


def cmd_acls(args) -> int:
    resource = _resource(args)
    if args.add:
        if resource is None or not (args.allow_principal or args.deny_principal) or not args.operation:
            raise OdradekError("--add needs a resource, --allow-principal/--deny-principal and --operation",
                               ErrorCode.INVALID_CONFIG)
        try:
            acls = [az.Acl.make(p, resource[0], resource[1], op, perm, args.resource_pattern_type or "Literal",
                                args.allow_host)
                    for perm, principals in (("Allow", args.allow_principal), ("Deny", args.deny_principal))
                    for p in principals for op in args.operation]
        except ValueError as exc:
            raise OdradekError(str(exc), ErrorCode.INVALID_CONFIG) from None
        body = {"creations": [{"principal": a.principal, "host": a.host, "resource_type": az.RESOURCES[a.resource],
                               "resource_name": a.name, "resource_pattern_type": az.PATTERNS[a.pattern],
                               "operation": az.OPERATIONS[a.operation], "permission_type": az.PERMISSIONS[a.permission]}
                              for a in acls]}
        reply = _call(args, ApiKey.CREATE_ACLS, body)
        for a, r in zip(acls, reply.get("results") or []):
            if r.get("error_code"):
                raise OdradekError(r.get("error_message") or "refused", ErrorCode.of(r["error_code"]))
        for a in acls:
            print(f"Added ACL: {_show(a)}")
        return 0
    filt = {"resource_type_filter": az.RESOURCES[resource[0]] if resource else 1,
            "resource_name_filter": resource[1] if resource else None,
            "pattern_type_filter": az.PATTERNS[az._canon(az.PATTERNS, args.resource_pattern_type or "Any", "pattern")],
            "principal_filter": args.principal, "host_filter": None,
            "operation": az.OPERATIONS[az._canon(az.OPERATIONS, args.operation[0], "operation")] if args.operation else 1,
            "permission_type": 1}
    if args.list:
        reply = _call(args, ApiKey.DESCRIBE_ACLS, filt)
        for r in reply.get("resources") or []:
            kind = az._canon(az.RESOURCES, r["resource_type"], "resource")
            pattern = az._canon(az.PATTERNS, r["pattern_type"], "pattern")
            print(f"Current ACLs for resource `{kind}:{pattern.upper()}:{r['resource_name']}`:")
            for a in r.get("acls") or []:
                print(f"  (principal={a['principal']}, host={a['host']}, "
                      f"operation={az._canon(az.OPERATIONS, a['operation'], 'op')}, "
                      f"permissionType={az._canon(az.PERMISSIONS, a['permission_type'], 'perm')})")
        return 0
    reply = _call(args, ApiKey.DELETE_ACLS, {"filters": [filt]})
    for fr in reply.get("filter_results") or []:
        if fr.get("error_code"):
            raise OdradekError(fr.get("error_message") or "refused", ErrorCode.of(fr["error_code"]))
        for m in fr.get("matching_acls") or []:
            print(f"Removed ACL: {m['principal']} {az._canon(az.PERMISSIONS, m['permission_type'], 'p')} "
                  f"{az._canon(az.OPERATIONS, m['operation'], 'o')} on "
                  f"{az._canon(az.RESOURCES, m['resource_type'], 'r')}:{m['resource_name']}")
    return 0


def _show(a: az.Acl) -> str:
    return f"{a.principal} {a.permission} {a.operation} on {a.resource}:{a.pattern.upper()}:{a.name} from host {a.host}"


def _call(args, api: int, body: dict) -> dict:
    if args.bootstrap_server:
        from odradek.network.client import BrokerConnection, parse_bootstrap
        host, port = parse_bootstrap(args.bootstrap_server)[0]
        with BrokerConnection(host, port, client_id="odradek-acls", **_security(args)) as conn:
            return conn.request(api, body).body
    from odradek.network.guard import Guard
    config = cfg.load(args.config, args.set)
    data_dir = cfg.data_dir(config)
    if not config["zookeeper.connect"] and not os.path.isdir(data_dir):
        raise OdradekError(f"data directory {data_dir} does not exist (pass --bootstrap-server, or the "
                           f"--config/--set log.dirs the broker uses)", ErrorCode.INVALID_CONFIG)
    _private_data_dir(config)
    guard = Guard({"zookeeper.connect": config["zookeeper.connect"]}, data_dir)
    try:
        return guard.serve(api, body)
    finally:
        close = getattr(guard.store.store, "close", None)
        if close is not None:
            close()


__all__ = ["add_parsers", "argparse"]
