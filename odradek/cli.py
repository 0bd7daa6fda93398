"""The ``odradek`` command line, shaped after Kafka's tools.

    odradek serve [--config FILE] [--set key=value]...   run a broker (supervisor + actors)
    odradek status [--bootstrap-server H:P | --config FILE --set ...] [--json]  a local broker's actor tree
    odradek configs --describe | --alter key=value ...   broker configs (Kafka's kafka-configs)
    odradek perf ping | hop | produce | consume | e2e | replicated | failover ...   benchmarks
    odradek chaos [--time S] [--seed N] [--faults ...]   a local cluster under faults (RELIABILITY.md)
    odradek users --add U --password-stdin | --delete U | --list   SCRAM users (docs/SECURITY.md)
    odradek acls --add | --list | --remove [--bootstrap-server H:P] ...   ACLs, like kafka-acls
    odradek transactions list | describe | describe-producers | find-hanging | abort ...   like kafka-transactions.sh
    odradek schemas list | get | register | check | compatibility | delete ...   the schema registry, like rpk registry

Commands that talk to a broker take ``--bootstrap-server host:port`` (default: the
``listeners`` address of the config, so a plain ``odradek status`` next to a plain
``odradek serve`` just works). Errors print one line naming the problem and exit 1.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys

from odradek.core.protocol import ErrorCode, OdradekError
from odradek import config as cfg


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML config file (Kafka property names)")
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                   help="override one setting (repeatable), e.g. --set num.io.threads=4")


def _load(args) -> dict:
    return cfg.load(args.config, args.set)


def _bootstrap(args) -> str:
    if getattr(args, "bootstrap_server", None):
        return args.bootstrap_server
    host, port = cfg.advertised(_load(args))
    return f"{host}:{port}"


# ---- serve / status --------------------------------------------------------------------
def cmd_serve(args) -> int:
    config = _load(args)
    _check_listeners_free(config)
    logging.basicConfig(level=config["log.level"], stream=sys.stderr,
                        format="%(asctime)s %(levelname)s [supervisor] %(message)s")
    from odradek.broker import serve
    return serve(config)


def _check_listeners_free(config: dict) -> None:
    """A listener's address already taken (another broker, any program) stops ``serve`` at
    once with one line, before any actor starts (the acceptor would fail to bind, restart and
    fail again until the supervisor gave up)."""
    import errno
    import socket
    from odradek.network import listeners
    for listener in listeners.of_config(config):
        if listener.port == 0:
            continue
        sock = socket.socket(socket.AF_INET6 if ":" in listener.host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the acceptor binds
            sock.bind((listener.host, listener.port))
        except OSError as exc:
            why = "is already in use (another broker or program listens there)" if exc.errno == errno.EADDRINUSE \
                else f"cannot be bound: {exc.strerror}"
            raise OdradekError(f"listener {listener.name} {listener.host}:{listener.port} {why}; choose another "
                               f"with --set listeners=...", ErrorCode.INVALID_CONFIG) from None
        finally:
            sock.close()


def fmt_bytes(n, sep: str = "") -> str:
    """``n`` bytes as B, KiB, MiB or GiB (``sep`` between number and unit); "-" for None."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{sep}{unit}" if unit == "B" else f"{n:.1f}{sep}{unit}"
        n /= 1024
    return str(n)


def cmd_status(args) -> int:
    from odradek.actors.client import MailboxClient
    from odradek.actors.messages import Status
    from odradek import tools
    run_dir = tools.run_dir_of(args.bootstrap_server) if args.bootstrap_server else cfg.run_dir(_load(args))
    import os
    if not os.path.exists(os.path.join(run_dir, "supervisor.mbox")):
        raise OdradekError(f"no broker is running with run directory {run_dir} (start one with `odradek serve`, "
                           f"or pass --bootstrap-server, or the same --config/--set it uses)")
    with MailboxClient(run_dir) as client:
        status = client.request("supervisor", Status(), timeout=args.timeout).fields._asdict()
    if args.bootstrap_server:
        tools.check_status_address(status, args.bootstrap_server)
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    sup = status["supervisor"]
    limit = sup.get("open_files_limit") or ["?", "?"]
    print(f"broker {sup.get('broker_id')} ({sup.get('address', '?')}), supervisor pid {sup['pid']}, "
          f"{sup['state']}, data {sup.get('data_dir')}, open files limit {limit[0]} (hard {limit[1]})")
    cols = ["ACTOR", "ROLE", "PID", "STATE", "RESTARTS", "MEMORY", "CPU%", "FDS", "PROCESSED", "OPEN", "BACKLOG",
            "UPTIME"]
    rows = [[a["name"], a["role"], str(a["pid"] or "-"), a["state"], str(a["restarts"]), fmt_bytes(a["rss"]),
             "-" if a["cpu"] is None else f"{a['cpu']:.1f}", str(a["fds"] if a["fds"] is not None else "-"),
             str(a["processed"] if a["processed"] is not None else "-"), str(a["open"] if a["open"] is not None else "-"),
             str(a.get("backlog") or 0), f"{a['uptime']:.0f}s" if a["uptime"] is not None else "-"]
            for a in status["actors"]]
    widths = [max(len(r[i]) for r in [cols] + rows) for i in range(len(cols))]
    for r in [cols] + rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    for a in status["actors"]:
        if a.get("progress"):
            print(f"{a['name']}: {a['progress']}")
    return 0


# ---- configs -----------------------------------------------------------------------------
def cmd_configs(args) -> int:
    if args.entity_type in ("users", "clients", "ips"):  # quotas: docs/SECURITY.md
        from odradek.security_tools import cmd_quotas
        return cmd_quotas(args)
    from odradek.network.client import BrokerConnection, parse_bootstrap
    from odradek.core.protocol import ApiKey
    host, port = parse_bootstrap(_bootstrap(args))[0]
    entity = args.entity_name if args.entity_name is not None else "0"
    from odradek.client_properties import options_of
    conn = BrokerConnection(host, port, client_id="odradek-configs", **options_of(args))
    try:
        if args.alter:
            pairs = list(args.add_config or []) + list(args.pairs or [])
            if not pairs:
                raise OdradekError("--alter needs settings: --add-config key=value[,key=value] or key=value")
            configs = []
            for item in ",".join(pairs).split(","):
                name, sep, value = item.partition("=")
                if not sep:
                    raise OdradekError(f"expected key=value, got {item!r}")
                configs.append({"name": name.strip(), "value": value.strip(), "op": "set"})
            body = {"resources": [{"type": "broker", "name": entity, "configs": configs}]}
            resp = conn.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, body)
            for res in resp.body.get("resources", []):
                if res.get("error_code"):
                    raise OdradekError(res.get("error_message") or "alter failed", res["error_code"])
            print(f"Completed updating config for broker {entity}.")
            return 0
        resp = conn.request(ApiKey.DESCRIBE_CONFIGS, {"resources": [{"type": "broker", "name": entity}]})
        for res in resp.body.get("resources", []):
            if res.get("error_code"):
                raise OdradekError(res.get("error_message") or "describe failed", res["error_code"])
            print(f"Configs for broker {res.get('name', entity)} are:")
            for c in res.get("configs", []):
                if c.get("value") is None:  # a Kafka config Odradek takes at run time, not set
                    continue
                flag = " (dynamic)" if c.get("dynamic") else ""
                print(f"  {c['name']}={c['value']}{flag}")
        return 0
    finally:
        conn.close()


# ---- perf --------------------------------------------------------------------------------
# name -> ("module:function", takes a bootstrap server); each function takes argv.
PERF_TESTS = {
    "ping": ("odradek.bench.ping:main", True),
    "hop": ("odradek.bench.hop:main", False),
    "produce": ("odradek.perf:produce_main", True),
    "consume": ("odradek.perf:consume_main", True),
    "e2e": ("odradek.perf:e2e_main", True),
    # start their own LocalCluster (ZooKeeper + 3 brokers on 127.0.0.1); replicated takes
    # --bootstrap-server to use a running cluster instead
    "replicated": ("odradek.perf:replicated_main", False),
    "failover": ("odradek.perf:failover_main", False),
    # starts its own brokers: produce with and without a scrape a second; a 10,000-partition scrape
    "scrape": ("odradek.perf:scrape_main", False),
    "reassign": ("odradek.bench.reassign:main", False),  # moves 1 GiB to a new broker (issue 17)
    "security": ("odradek.bench.security:main", False),  # PLAINTEXT vs SASL_SSL, 1,000 ACLs vs none (issue 13)
    "txn": ("odradek.bench.txn:main", False),  # transactions of 1,000 records, commit latency (issue 12)
    "console": ("odradek.perf.console:main", False),  # console page loads, 1,000 topics and 100 groups (issue 29)
}


def cmd_perf(args, rest: list[str]) -> int:
    from odradek.actors.runtime import import_object
    if args.what is None:  # `odradek perf --help`, or no test named
        print("usage: odradek perf {" + ",".join(PERF_TESTS) + "} [--help] [options of that test]\n\n"
              "benchmarks (docs/BENCHMARKS.md); `odradek perf TEST --help` lists a test's options:",
              file=sys.stdout if {"-h", "--help"} & set(rest) else sys.stderr)
        asked = bool({"-h", "--help"} & set(rest))
        for name, (target, wants_bootstrap) in PERF_TESTS.items():
            print(f"  {name:<11}{'(a running broker: --bootstrap-server HOST:PORT)' if wants_bootstrap else ''}".rstrip(),
                  file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    target, wants_bootstrap = PERF_TESTS[args.what]
    if wants_bootstrap and not any(a.startswith("--bootstrap-server") for a in rest):
        rest = ["--bootstrap-server", _bootstrap(args)] + rest
    return import_object(target)(rest) or 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="odradek", description="Odradek: a streaming log broker.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("serve", help="run a broker in the foreground (Ctrl-C or SIGTERM stops it)")
    _config_args(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("status", help="show the running broker's actor tree")
    _config_args(p)
    p.add_argument("--json", action="store_true", help="print the raw status as JSON")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the supervisor")
    p.add_argument("--bootstrap-server", metavar="HOST:PORT",
                   help="the broker on this machine listening there (asked for its log.dirs/run.dir)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("configs", help="describe or alter broker configs (like kafka-configs)")
    _config_args(p)
    p.add_argument("--bootstrap-server", metavar="HOST:PORT")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--describe", action="store_true")
    g.add_argument("--alter", action="store_true")
    p.add_argument("--entity-type", default="brokers", choices=["brokers", "users", "clients", "ips"],
                   help="users/clients: quotas (producer_byte_rate, consumer_byte_rate, request_percentage); "
                        "ips: connection_creation_rate")
    p.add_argument("--entity-name", help="broker id (default 0); user, client id or IP address "
                                         "('<default>' for all)")
    p.add_argument("--entity-default", action="store_true", help="the users', clients' or ips' default quota")
    from odradek.client_properties import add_arguments
    add_arguments(p)
    p.add_argument("--add-config", action="append", metavar="K=V[,K=V]")
    p.add_argument("pairs", nargs="*", metavar="KEY=VALUE", help="shorthand for --add-config")
    p.set_defaults(func=cmd_configs)

    # add_help=False: `odradek perf produce --help` reaches the test's own parser.
    p = sub.add_parser("perf", help="benchmarks: " + ", ".join(PERF_TESTS) + " (each takes --help)",
                       add_help=False)
    _config_args(p)
    p.add_argument("what", nargs="?", choices=list(PERF_TESTS))
    p.set_defaults(func=None)

    import importlib.util
    if importlib.util.find_spec("odradek.tools"):  # topics, produce, consume, dump-log
        from odradek import tools
        tools.add_parsers(sub, _config_args, _bootstrap)
    from odradek.pipeline import cli as pipeline_cli  # `odradek pipeline run NAME` (pyspark loads lazily)
    pipeline_cli.add_parser(sub, _config_args, _bootstrap)
    from odradek import devcluster  # `odradek cluster up|down|status`: a local ZooKeeper and brokers
    devcluster.add_parser(sub)
    from odradek.chaos import cli as chaos_cli  # `odradek chaos`: faults, then the anomaly report
    chaos_cli.add_parser(sub)
    from odradek import reassign  # `odradek reassign`: move partitions (like kafka-reassign-partitions)
    reassign.add_parser(sub, _config_args, _bootstrap)
    from odradek import security_tools  # `odradek users`, `odradek acls` (docs/SECURITY.md)
    security_tools.add_parsers(sub, _config_args, _bootstrap)
    from odradek import transactions  # `odradek transactions`: like kafka-transactions.sh (docs/TRANSACTIONS.md)
    transactions.add_parser(sub, _config_args, _bootstrap)
    from odradek import schemas_cli  # `odradek schemas`: the schema registry, like rpk registry (docs/SCHEMAS.md)
    schemas_cli.add_parser(sub, _config_args, _load)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        if args.command == "perf":
            code = cmd_perf(args, rest)
        else:
            if rest:
                parser.error(f"unrecognized arguments: {' '.join(rest)}")
            code = args.func(args)
        sys.stdout.flush()  # here, so a closed pipe is seen below rather than at exit
        return code
    except OdradekError as exc:
        print(f"odradek: {exc.message} ({exc.code.name})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `odradek ... | head`: the reader left; end quietly, as Kafka's tools do
        import os
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit must not fail again
        return 1


if __name__ == "__main__":
    sys.exit(main())
