"""The broker's actor tree, assembled from the configuration.

This is the top layer: it is the only place that knows which roles a broker has and in
which order they start. ``actors.supervisor`` runs whatever spec it is given.

Start order (stop order is the reverse): controller (topic metadata; in cluster mode the
ZooKeeper session, ``coordinator.cluster_controller``), log actors (open and recover their
partitions), the fetch actor, the replica fetcher (cluster mode), the group coordinator (replays ``__consumer_offsets``,
which it creates on first use), the transaction coordinator (hands out producer ids), request handlers, processors, the acceptor — so
a client can connect only once everything behind the listener is ready, and on shutdown the
listener closes first while the actors behind it still answer in-flight requests. The schema
registry (``coordinator.registry_actor``: replays ``_schemas``, then serves HTTP) follows the
acceptor, then the HTTP proxy (``observe.proxy_actor``: a client of the broker's listeners). The
metrics actor (``observe.metrics_actor``: Prometheus metrics, health, the web console) comes
after the acceptor: it asks every other actor at scrape time, so they all exist first.
"""
from __future__ import annotations

import logging
import resource
import sys

from odradek.actors.names import (ACCEPTOR, CONTROLLER, FETCH_ACTOR, GROUP_COORDINATOR, HANDLER, HTTP_PROXY, LOG, METRICS,
                                   PROCESSOR, REPLICA_FETCHER, SCHEMA_REGISTRY, TXN_COORDINATOR)
from odradek.actors.supervisor import ChildSpec, RestartPolicy, Supervisor, run_supervisor
from odradek import config as cfg

log = logging.getLogger("odradek.broker")


def cluster_mode(config: dict) -> bool:
    return bool(config["zookeeper.connect"])


def actor_specs(config: dict) -> list[ChildSpec]:
    args = {"config": config, "broker_id": config["broker.id"], "data_dir": cfg.data_dir(config),
            "topic_defaults": cfg.topic_defaults(config), "log_hosts": config["num.log.threads"],
            "kafka_run_time_configs": cfg.kafka_run_time_configs()}
    cluster = cluster_mode(config)
    controller = "odradek.coordinator.cluster_controller:ClusterController" if cluster else "odradek.coordinator.controller:Controller"
    replication = [ChildSpec(REPLICA_FETCHER, "odradek.log.replica_fetcher:ReplicaFetcher", count=1, args=args,
                             watchers=(CONTROLLER,))] if cluster else []
    return [
        ChildSpec(CONTROLLER, controller, count=1, args=args, drain=cluster),
        ChildSpec(LOG, "odradek.log.log_actor:LogActor", count=config["num.log.threads"], args=args,
                  watchers=(FETCH_ACTOR,), pool=True),
        # the broker agent re-tells it its throttles; processors fail the fetches it held when it dies
        ChildSpec(FETCH_ACTOR, "odradek.log.fetch_actor:FetchActor", count=1, args=args,
                  watchers=(PROCESSOR, CONTROLLER) if cluster else (PROCESSOR,)),
        *replication,
        # processors fail what a coordinator held when it dies, as for the fetch actor
        ChildSpec(GROUP_COORDINATOR, "odradek.coordinator.group_coordinator:GroupCoordinator", count=1, args=args,
                  watchers=(PROCESSOR,)),
        ChildSpec(TXN_COORDINATOR, "odradek.coordinator.txn_coordinator:TxnCoordinator", count=1, args=args,
                  watchers=(PROCESSOR,)),
        ChildSpec(HANDLER, "odradek.network.handler:RequestHandler", count=config["num.io.threads"], args=args,
                  watchers=(PROCESSOR, CONTROLLER), scalable=True, min_count=1, max_count=64),
        ChildSpec(PROCESSOR, "odradek.network.processor:Processor", count=config["num.network.threads"], args=args,
                  watchers=(ACCEPTOR,), pool=True),
        ChildSpec(ACCEPTOR, "odradek.network.acceptor:Acceptor", count=1, args=dict(args)),
        # Confluent's Schema Registry API on its own listener; state in _schemas through the log actors
        ChildSpec(SCHEMA_REGISTRY, "odradek.coordinator.registry_actor:SchemaRegistryActor", count=1, args=args),
        # Confluent REST Proxy's produce and consumers, as a client of this broker (observe.proxy_actor)
        ChildSpec(HTTP_PROXY, "odradek.observe.proxy_actor:HttpProxyActor", count=1, args=args),
        # Last: everything it asks exists; first to stop, so no scrape sees a half-stopped tree.
        ChildSpec(METRICS, "odradek.observe.metrics_actor:MetricsActor", count=1, args=args),
    ]


def restart_policy(config: dict) -> RestartPolicy:
    return RestartPolicy(
        max_restarts=config["supervisor.max.restarts"],
        restart_window=config["supervisor.restart.window.ms"] / 1000,
        backoff_initial=config["supervisor.restart.backoff.ms"] / 1000,
        start_timeout=config["actor.start.timeout.ms"] / 1000,
        shutdown_timeout=config["shutdown.timeout.ms"] / 1000,
        liveness_timeout=config["supervisor.liveness.timeout.ms"] / 1000,
        memory_limit_bytes=config["actor.memory.limit.bytes"],
    )


def build(config: dict, out=sys.stdout) -> Supervisor:
    specs = actor_specs(config)
    acceptor_spec = next(s for s in specs if s.role == ACCEPTOR)

    def on_ready(sup: Supervisor) -> None:
        info = sup.children[ACCEPTOR].ready_info
        host, port = info.get("host"), info.get("port")
        # A restarted acceptor must come back on the ports clients know, even if they were 0.
        listeners = info.get("listeners") or {}
        acceptor_spec.args["bound_ports"] = {name: p for name, (_h, p, _proto) in listeners.items()}
        sup.info["address"] = f"{host}:{port}"
        sup.info["listeners"] = {name: f"{h}:{p}" for name, (h, p, _proto) in listeners.items()}
        registry = sup.children[SCHEMA_REGISTRY].ready_info
        if registry.get("registry_port"):
            sup.info["schema_registry"] = f"http://{registry['registry_host']}:{registry['registry_port']}"
            print(f"odradek schema registry on {sup.info['schema_registry']}", file=out, flush=True)
        proxy = sup.children[HTTP_PROXY].ready_info
        if proxy.get("proxy_port"):
            sup.info["http_proxy"] = f"http://{proxy['proxy_host']}:{proxy['proxy_port']}"
            print(f"odradek http proxy on {sup.info['http_proxy']}", file=out, flush=True)
        admin = sup.children[METRICS].ready_info
        if admin.get("admin_port"):
            sup.info["console"] = f"http://{admin['admin_host']}:{admin['admin_port']}/"
            print(f"odradek console on {sup.info['console']} (metrics at /metrics)", file=out, flush=True)
        for name, (h, p, proto) in listeners.items():
            print(f"odradek listener {name} on {h}:{p} ({proto})", file=out, flush=True)
        print(f"odradek ready on {host}:{port} (broker {config['broker.id']}); every listener speaks both the "
              f"native protocol and Kafka's (bootstrap.servers={host}:{port})", file=out, flush=True)

    info = {"broker_id": config["broker.id"], "cluster_id": config["cluster.id"],
            "data_dir": cfg.data_dir(config), "open_files_limit": list(resource.getrlimit(resource.RLIMIT_NOFILE))}
    return Supervisor(cfg.run_dir(config), specs, restart_policy(config), on_ready=on_ready, info=info,
                      log_level=config["log.level"])


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (children inherit it), as
    a log actor holds three descriptors per partition it hosts (the active segment) plus its
    bounded cache (``log.files.OPEN_FILES_PER_PROCESS``). Returns ``(soft, hard)``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 1 << 20 if hard == resource.RLIM_INFINITY else hard  # the kernel's usual nr_open
    if soft != target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open files limit from %d to %d: %s", soft, hard, exc)
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def check_security(config: dict) -> None:
    """Before anything starts: the data directory is made private (0700, this user's), the
    security files must be this user's and writable by nobody else (else OdradekError: the
    broker does not start), and PLAIN on a listener without TLS is warned about."""
    from odradek.actors.runtime import private_dir
    from odradek.network import listeners as listeners_mod, secstore
    private_dir(cfg.data_dir(config))
    if not cluster_mode(config):
        secstore.check(cfg.data_dir(config))
    if "PLAIN" in [m.strip() for m in config["sasl.enabled.mechanisms"].split(",")]:
        for l in listeners_mod.of_config(config):
            if l.sasl and not l.tls:
                log.warning("SASL PLAIN is enabled on listener %s (%s): passwords cross the network in clear; "
                            "use SASL_SSL, or SCRAM only (sasl.enabled.mechanisms)", l.name, l.protocol)


def serve(config: dict) -> int:
    """Run a broker in this process until SIGTERM/SIGINT; returns the exit code."""
    import os
    from odradek.actors.runtime import PRIVATE_UMASK
    os.umask(PRIVATE_UMASK)  # data, run directory and sockets are this user's alone (children inherit it)
    raise_open_files_limit()
    check_security(config)
    sup = build(config)
    code = run_supervisor(sup)
    if sup.fatal:
        print(f"odradek: {sup.fatal}", file=sys.stderr, flush=True)
    return code
