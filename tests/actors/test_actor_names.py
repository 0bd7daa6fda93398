"""No actor shadows the runtime's own private methods.

``TxnCoordinator`` once defined ``_expire`` (abort transactions past their timeout), which
replaced ``Actor._expire`` (answer a request nobody answered with REQUEST_TIMED_OUT): every
request of the transaction coordinator that timed out raised a TypeError in the timer
instead of reaching its callback (seen in ``odradek chaos`` logs). The runtime's private names
are the runtime's; an actor's helpers take other names."""
from __future__ import annotations

import importlib
import pathlib

from odradek.actors.runtime import Actor

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = ("actors", "network", "log", "coordinator", "observe", "odradek")


def _import_all() -> None:
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join(["odradek"] + ([] if folder == "odradek" else [folder]) + parts)
            if "bench" in parts or "chaos" in parts:
                continue
            try:
                importlib.import_module(name)
            except ImportError:  # optional dependencies (redis, nats, pyspark) of tools
                continue


def _subclasses(cls) -> set:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


def test_no_actor_redefines_a_private_method_of_the_runtime():
    _import_all()
    runtime_private = {name for klass in Actor.__mro__ for name in vars(klass)
                       if name.startswith("_") and not name.startswith("__")}
    actors = _subclasses(Actor)
    assert len(actors) > 10, sorted(a.__name__ for a in actors)  # the walk found the actors
    clashes = sorted(f"{a.__module__}.{a.__qualname__}.{name}" for a in actors for name in vars(a)
                     if name in runtime_private and not name.startswith("__"))
    assert not clashes, f"these replace the runtime's own methods: {clashes}"
