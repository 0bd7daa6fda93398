"""Imports point down only: the layers of docs/CONTRIBUTING.md, checked by walking every module's
imports (``ast``), function-level imports included.

1. pure: ``core/``, the wire and record formats, the standard library and their own layer;
2. runtime: ``actors/``;
3. roles: ``network/``, ``log/``, ``coordinator/``;
4. top: ``odradek/``, ``pipeline/``, ``observe/``.

Besides the order: actors talk by message, not by import, so no module below the top imports an
actor's module (the ``ChildSpec`` class paths of ``odradek/broker.py``) except to extend its
class; a role imports another role's pure modules only (its message types, never its code),
but for the libraries listed in ``SHARED_LIBRARIES``; and every import of the project is
spelled ``odradek.<layer>...`` (neither bare nor relative: an application's own ``log.py``
must never be the one imported).
"""
from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = {"core": 1, "actors": 2, "network": 3, "log": 3, "coordinator": 3, "odradek": 4, "pipeline": 4,
           "observe": 4}
NAMES = {1: "pure", 2: "runtime", 3: "roles", 4: "top"}
ROLES = ("network", "log", "coordinator")
# A role's library that another role uses as a library (not an actor, no state shared): each
# (importer, imported) pair with why. A new pair fails the test; so does a pair that is gone.
SHARED_LIBRARIES = {
    ("coordinator/channel.py", "odradek.network.client"): "the controller's connection to other brokers",
    ("log/replica_fetcher.py", "odradek.network.client"): "a follower's connection to its leader",
    ("coordinator/internal_replay.py", "odradek.log.reader"): "replays an internal topic from its files, read-only",
    ("coordinator/group_api_offsets.py", "odradek.log.reader"): "LATEST_TIMESTAMP, ListOffsets' -1",
    ("coordinator/txn_producer_ids.py", "odradek.log.producer_ids"): "the producer-id tag the log actors check",
    ("coordinator/throttles.py", "odradek.log.throttle"): "UNLIMITED, the throttle rate's default",
    ("coordinator/topics.py", "odradek.log.files"): "the file layer the topic registry saves through",
    ("coordinator/controller_kit.py", "odradek.log.files"): "the file layer the broker config store saves through",
    ("coordinator/cluster_controller.py", "odradek.network.listeners"): "the broker's listeners, registered in ZooKeeper",
    ("coordinator/cluster_controller.py", "odradek.network.clientauth"): "TLS/SASL of the inter-broker listener",
    ("log/replica_fetcher.py", "odradek.network.clientauth"): "TLS/SASL of the inter-broker listener",
    ("coordinator/txn_markers.py", "odradek.network.client"): "WRITE_TXN_MARKERS to other brokers",
    ("coordinator/txn_coordinator.py", "odradek.network.clientauth"): "TLS/SASL of the inter-broker listener, for markers",
    ("coordinator/registry_http.py", "odradek.network.basic_auth"): "HTTP Basic against the SCRAM users",
    ("coordinator/registry_http.py", "odradek.network.guard"): "the registry's writes are authorized by the ACLs",
    ("coordinator/registry_http.py", "odradek.network.authorizer"): "CLUSTER, the cluster resource's name",
    ("coordinator/registry_actor.py", "odradek.network.secstore"): "ZkStore: each broker's registry address, in ZooKeeper",
}


def _modules() -> dict[str, pathlib.Path]:
    """Every module of the installed namespace, ``odradek.core.records`` -> core/records.py."""
    found = {}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            prefix = ["odradek"] if folder == "odradek" else ["odradek", folder]
            found[".".join(prefix + parts)] = path
    return found


MODULES = _modules()
# C extensions (setup.py): importable, their source imports nothing of the project
EXTENSIONS = {"odradek.core._recordscan": ROOT / "core" / "_recordscan.c",
              "odradek._recordbuild": ROOT / "odradek" / "_recordbuild.c"}


def _layer(path: pathlib.Path) -> int:
    return FOLDERS[path.relative_to(ROOT).parts[0]]


def _imports(tree: ast.AST):
    """(line, imported module, names) for every import of the project in ``tree``;
    ``from odradek.log import records`` names the module odradek.core.records."""
    for node in sorted((n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))),
                       key=lambda n: n.lineno):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                known = sub in MODULES or sub in EXTENSIONS
                yield (node.lineno, sub, ()) if known else (node.lineno, base, (alias.name,))


def _actor_modules() -> set[str]:
    return set(re.findall(r'"(odradek\.[\w.]+):\w+"', (ROOT / "odradek" / "broker.py").read_text()))


def _extends(tree: ast.AST, names) -> bool:
    bases = {b.id for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
             for b in node.bases if isinstance(b, ast.Name)}
    return bool(names) and set(names) <= bases


def _offences_of(module: str, text: str, actors: set[str]):
    """What is wrong with the imports of ``module`` (whose source is ``text``)."""
    path = MODULES[module]
    tree = ast.parse(text, str(path))
    mine = _layer(path)
    where = path.relative_to(ROOT).as_posix()
    for line, imported, names in _imports(tree):
        top = imported.split(".")[0]
        if imported.startswith("."):
            yield f"{where}:{line}: relative `from {imported} import`: spell it odradek.<layer>..."
            continue
        if top in FOLDERS and top != "odradek":
            yield f"{where}:{line}: bare `import {imported}`: spell it odradek.{imported}"
            continue
        if top != "odradek":
            continue  # the standard library or a dependency
        target = MODULES.get(imported) or EXTENSIONS.get(imported)
        assert target is not None, f"{where}:{line}: {imported} is no module of the project"
        theirs = _layer(target)
        if theirs > mine:
            yield (f"{where}:{line}: imports {imported}, layer {theirs} ({NAMES[theirs]}), "
                   f"from layer {mine} ({NAMES[mine]})")
        elif imported in actors and imported != module and mine < 4 and not _extends(tree, names):
            yield f"{where}:{line}: imports the actor module {imported}: actors talk by message"
        elif _cross_role(path, target) and (where, imported) not in SHARED_LIBRARIES:
            yield (f"{where}:{line}: imports {imported}, another role's code: take its message types, "
                   f"addresses and placement from odradek.actors.names, or list a shared library in SHARED_LIBRARIES")


def _cross_role(importer: pathlib.Path, imported: pathlib.Path) -> bool:
    mine, theirs = (p.relative_to(ROOT).parts[0] for p in (importer, imported))
    return mine in ROLES and theirs in ROLES and mine != theirs and _layer(imported) == 3 and _layer(importer) == 3


def test_every_import_points_down_the_layers_and_no_actor_imports_another():
    actors = _actor_modules()
    assert actors, "odradek/broker.py names no actor class path: the actor check would be empty"
    offences = [o for module, path in sorted(MODULES.items()) for o in _offences_of(module, path.read_text(), actors)]
    assert not offences, "\n".join(offences)


def test_every_shared_library_listed_is_still_imported():
    used = {(path.relative_to(ROOT).as_posix(), imported) for module, path in MODULES.items()
            for _, imported, _ in _imports(ast.parse(path.read_text()))}
    stale = [f"{importer} no longer imports {imported}" for importer, imported in SHARED_LIBRARIES
             if (importer, imported) not in used]
    assert not stale, "remove from SHARED_LIBRARIES:\n" + "\n".join(stale)


def test_the_walk_reports_an_upward_import_an_actor_import_and_a_bare_import():
    """The check itself, on a made-up source for a pure module and for an actor."""
    actors = _actor_modules()
    pure = list(_offences_of("odradek.core.records", "def f():\n    from odradek.log import reader\n"
                                                   "import core.protocol\n", actors))
    assert pure == ["core/records.py:2: imports odradek.log.reader, layer 3 (roles), from layer 1 (pure)",
                    "core/records.py:3: bare `import core.protocol`: spell it odradek.core.protocol"]
    actor = list(_offences_of("odradek.log.fetch_actor", "from odradek.log.log_actor import LogActor\n"
                                                         "from odradek.log import log_actor\n"
                                                         "class Mine(LogActor):\n    pass\n", actors))
    assert actor == ["log/fetch_actor.py:2: imports the actor module odradek.log.log_actor: actors talk by message"]
    role = list(_offences_of("odradek.network.handler", "from odradek.coordinator.topics import TopicRegistry\n"
                                                        "from odradek.core.records import encode_batch\n", actors))
    assert len(role) == 1 and role[0].startswith("network/handler.py:1: imports odradek.coordinator.topics, "
                                                 "another role's code"), role
