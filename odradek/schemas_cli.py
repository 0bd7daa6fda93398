"""``odradek schemas``: the schema registry from the command line, like Redpanda's ``rpk registry``.

Runs in the CLI's thread: plain HTTP (urllib) to the registry's REST API (docs/SCHEMAS.md),
at ``--registry URL`` or, by default, the ``schema.registry.listener`` of the config (so a
plain ``odradek schemas list`` next to a plain ``odradek serve`` just works).

    odradek schemas list [--deleted]
    odradek schemas get SUBJECT [--version V|latest]      odradek schemas get --id N
    odradek schemas register SUBJECT --schema FILE [--type AVRO|JSON|PROTOBUF] [--reference NAME=SUBJECT:VERSION]...
    odradek schemas check SUBJECT --schema FILE [--type T] [--version V|latest]
    odradek schemas compatibility [SUBJECT] [--set LEVEL]
    odradek schemas delete SUBJECT [--version V] [--permanent]

Answers print as JSON (``list``: one subject a line). A registry error prints its message
and code on one line and exits 1; an incompatible ``check`` exits 2.
"""
from __future__ import annotations

import json
import sys
import urllib.error
import urllib.parse
import urllib.request

from odradek.coordinator.registry_http import CONTENT_TYPE
from odradek.coordinator.schema_registry import LEVELS
from odradek.core.protocol import ErrorCode, OdradekError, http_address

TIMEOUT = 30.0  # seconds for one answer of the registry


def add_parser(sub, config_args, load_config) -> None:
    p = sub.add_parser("schemas", help="the schema registry: list, get, register, check, compatibility, delete "
                                       "(like rpk registry)")
    config_args(p)
    p.add_argument("--registry", metavar="URL", help="the registry's base URL (default: schema.registry.listener)")
    cmds = p.add_subparsers(dest="schemas_command", required=True)
    d = cmds.add_parser("list", help="the subjects")
    d.add_argument("--deleted", action="store_true", help="soft-deleted subjects too")
    d = cmds.add_parser("get", help="a subject's version (default the latest), or a schema by id")
    d.add_argument("subject", nargs="?")
    d.add_argument("--version", default="latest")
    d.add_argument("--id", type=int, help="the schema of this id")
    for name, text in (("register", "register a schema under a subject; prints its id"),
                       ("check", "is a schema compatible with the subject (exit 2 if not)")):
        d = cmds.add_parser(name, help=text)
        d.add_argument("subject")
        d.add_argument("--schema", required=True, metavar="FILE", help="the schema's file ('-': standard input)")
        d.add_argument("--type", default="AVRO", choices=["AVRO", "JSON", "PROTOBUF"])
        d.add_argument("--reference", action="append", default=[], metavar="NAME=SUBJECT:VERSION")
        if name == "check":
            d.add_argument("--version", help="against this version only (default: as the subject's level says)")
    d = cmds.add_parser("compatibility", help="show or set the compatibility level (global without SUBJECT)")
    d.add_argument("subject", nargs="?")
    d.add_argument("--set", choices=LEVELS, metavar="LEVEL", help=", ".join(LEVELS))
    d = cmds.add_parser("delete", help="soft-delete a subject or one version (--permanent: for good, after a soft delete)")
    d.add_argument("subject")
    d.add_argument("--version")
    d.add_argument("--permanent", action="store_true")
    p.set_defaults(func=lambda args: run(args, load_config))


def registry_url(args, load_config) -> str:
    if args.registry:
        return args.registry.rstrip("/")
    config = load_config(args)
    address = http_address(config["schema.registry.listener"], config["listeners"])
    if address is None or not address[1]:
        raise OdradekError("schema.registry.listener is empty or ephemeral in the config: name the registry "
                           "with --registry URL", ErrorCode.INVALID_CONFIG)
    return f"http://{address[0]}:{address[1]}"


def call(url: str, method: str, path: str, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": CONTENT_TYPE,
                                                                                 "Accept": CONTENT_TYPE})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            err = json.loads(exc.read())
            why = f"{err['message']} (error_code {err['error_code']})"
        except (ValueError, KeyError, TypeError):
            why = f"HTTP {exc.code} {exc.reason}"
        raise OdradekError(why, ErrorCode.INVALID_REQUEST) from None
    except (urllib.error.URLError, OSError) as exc:
        raise OdradekError(f"the registry at {url} cannot be reached: {getattr(exc, 'reason', exc)}",
                           ErrorCode.NETWORK_EXCEPTION) from None


def _quote(subject: str) -> str:
    return urllib.parse.quote(subject, safe="")


def _schema_body(args) -> dict:
    text = sys.stdin.read() if args.schema == "-" else open(args.schema, encoding="utf-8").read()
    body: dict = {"schema": text}
    if args.type != "AVRO":
        body["schemaType"] = args.type
    refs = []
    for r in args.reference:
        name, _, rest = r.partition("=")
        subject, _, version = rest.rpartition(":")
        if not name or not subject or not version:
            raise OdradekError(f"--reference {r!r} is not NAME=SUBJECT:VERSION", ErrorCode.INVALID_REQUEST)
        refs.append({"name": name, "subject": subject, "version": int(version) if version.isdigit() else version})
    if refs:
        body["references"] = refs
    return body


def run(args, load_config) -> int:
    url = registry_url(args, load_config)
    cmd = args.schemas_command
    if cmd == "list":
        for subject in call(url, "GET", "/subjects" + ("?deleted=true" if args.deleted else "")):
            print(subject)
        return 0
    if cmd == "get":
        if args.id is not None:
            out = call(url, "GET", f"/schemas/ids/{args.id}")
        elif args.subject:
            out = call(url, "GET", f"/subjects/{_quote(args.subject)}/versions/{_quote(args.version)}")
        else:
            raise OdradekError("name a SUBJECT or --id", ErrorCode.INVALID_REQUEST)
    elif cmd == "register":
        out = call(url, "POST", f"/subjects/{_quote(args.subject)}/versions", _schema_body(args))
    elif cmd == "check":
        path = f"/compatibility/subjects/{_quote(args.subject)}/versions"
        out = call(url, "POST", path + (f"/{_quote(args.version)}" if args.version else "") + "?verbose=true",
                   _schema_body(args))
        print(json.dumps(out, indent=2))
        return 0 if out.get("is_compatible") else 2
    elif cmd == "compatibility":
        path = "/config" + (f"/{_quote(args.subject)}" if args.subject else "")
        out = (call(url, "PUT", path, {"compatibility": args.set}) if args.set
               else call(url, "GET", path + "?defaultToGlobal=true"))
    else:  # delete
        path = f"/subjects/{_quote(args.subject)}" + (f"/versions/{_quote(args.version)}" if args.version else "")
        out = call(url, "DELETE", path + ("?permanent=true" if args.permanent else ""))
    print(json.dumps(out, indent=2))
    return 0
