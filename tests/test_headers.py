"""Each actor module's header (its first docstring) lists exactly the messages the actor handles.

The actors are the ``ChildSpec`` class paths of ``odradek/broker.py`` and the supervisor. What an actor handles is
every ``on_<type>`` method of its class and of the project's classes between it and
``odradek.actors.runtime.Actor``, but the lifecycle hooks (``on_start``, ``on_stop``,
``on_message``, ``on_members``) and the runtime's own ``on__<type>`` messages (``_stop``,
``_ping``, ...; an actor that overrides one may list it). What the header lists is its
``Accepts`` section, in the format of docs/CONTRIBUTING.md "Module headers":

    Accepts:
      produce {acks, parts}: from a handler; ...
          a continuation line, indented deeper
      truncate / truncate_fully: from the replica fetcher; ...

A line starting ``Accepts`` opens a section (more than one may: ``Accepts from the log
actors:``); its entries are the lines indented by exactly two spaces, each naming its message
types first (separated by `` / `` or ``, ``); the section ends at the first line not indented.
``Accepts: nothing of its own`` (no entries) is an empty list.
"""
from __future__ import annotations

import ast
import importlib
import pathlib
import re

import pytest

from odradek.actors.runtime import Actor

ROOT = pathlib.Path(__file__).resolve().parents[1]
HOOKS = {"on_start", "on_stop", "on_message", "on_members"}
ENTRY = re.compile(r"  (\w+(?:\s*[/,]\s*\w+)*)")


def _actor_classes() -> list[tuple[str, str]]:
    """(module, class) of every actor the broker starts, and the supervisor that starts them."""
    text = (ROOT / "odradek" / "broker.py").read_text()
    return sorted(set(re.findall(r'"(odradek\.[\w.]+):(\w+)"', text)) | {("odradek.actors.supervisor", "Supervisor")})


def handled(cls: type) -> set[str]:
    """The message types ``cls`` handles itself (not the runtime's defaults)."""
    types = set()
    for klass in cls.__mro__:
        if klass in Actor.__mro__ or not klass.__module__.startswith("odradek."):
            continue
        types |= {name[3:] for name in vars(klass) if name.startswith("on_") and name not in HOOKS}
    return types


def accepted(header: str) -> set[str] | None:
    """The message types the ``Accepts`` sections of ``header`` name; None without one."""
    names, inside, found = set(), False, False
    for line in header.splitlines():
        if line.startswith("Accepts"):
            inside = found = True
            continue
        if inside and not line.startswith("  "):
            inside = False
        if inside and not line.startswith("   "):
            entry = ENTRY.match(line)
            if entry:
                names |= {n.strip() for n in re.split(r"[/,]", entry.group(1))}
    return names if found else None


def _header(module: str) -> tuple[str, str]:
    path = ROOT / pathlib.Path(*module.split(".")[1:]).with_suffix(".py")
    return path.relative_to(ROOT).as_posix(), ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""


def mismatch(where: str, header: str, handles: set[str]) -> list[str]:
    names = accepted(header)
    if names is None:
        return [f"{where}: the header has no 'Accepts:' section (docs/CONTRIBUTING.md, Module headers)"]
    problems = []
    missing = sorted(t for t in handles - names if not t.startswith("_"))
    extra = sorted(names - handles)
    if missing:
        problems.append(f"{where}: handles but its header's Accepts does not name: {', '.join(missing)}")
    if extra:
        problems.append(f"{where}: its header's Accepts names what it does not handle: {', '.join(extra)}")
    return problems


@pytest.mark.parametrize("module, name", _actor_classes(), ids=lambda v: v)
def test_an_actor_module_header_lists_exactly_the_messages_it_handles(module, name):
    cls = getattr(importlib.import_module(module), name)
    where, header = _header(module)
    problems = mismatch(where, header, handled(cls))
    assert not problems, "\n".join(problems)


def test_the_check_reports_a_missing_and_an_extra_message_and_a_header_without_accepts():
    """The check itself, on made-up headers."""
    class Base(Actor):
        def on_watch(self, msg): ...

    class Made(Base):
        def on_produce(self, msg): ...
        def on_truncate(self, msg): ...
        def on_truncate_fully(self, msg): ...
        def on__drain(self, msg): ...
        def on_start(self): ...

    Base.__module__ = Made.__module__ = "odradek.made"
    assert handled(Made) == {"watch", "produce", "truncate", "truncate_fully", "_drain"}
    header = ("The made actor.\n\nProcess: ``made``.\nAccepts:\n  produce {acks, parts}: from a handler\n"
              "      with a continuation naming get_bounds / fetch\n  truncate / truncate_fully: from x\n"
              "  fetch: never handled\nSends: get_bounds\n  watch {parts}: not in the section\n")
    assert accepted(header) == {"produce", "truncate", "truncate_fully", "fetch"}
    assert mismatch("made.py", header, handled(Made)) == [
        "made.py: handles but its header's Accepts does not name: watch",
        "made.py: its header's Accepts names what it does not handle: fetch"]
    assert mismatch("made.py", "The made actor.\n", handled(Made)) == [
        "made.py: the header has no 'Accepts:' section (docs/CONTRIBUTING.md, Module headers)"]
    assert accepted("An actor.\nAccepts: nothing of its own.\nSends: metrics\n") == set()
