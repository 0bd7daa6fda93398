"""Every message between actors is declared once, in ``actors/messages.py``, and travels typed.

What is checked: every message an actor of the broker handles (an ``on_<type>`` method) is a
declared body class; the wire refuses a body that does not fit its declared class (a wrong
field count, or a dict) instead of handing a handler something it will misread; an answer is
rebuilt as the class its request declares; and no module outside the runtime names a message
by a string literal any more (the transitional form is gone).
"""
from __future__ import annotations

import ast
import importlib
import pathlib
import re

import msgpack
import pytest

from odradek.actors import messages
from odradek.actors.message import REPLY, MalformedMessage, Message, decode, encode_header, typed_reply
from odradek.actors.messages import BODIES, REPLIES, Members, Name, Scale, Scaled, Status
from tests.test_headers import _actor_classes, handled

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROLE_FOLDERS = ("actors", "network", "log", "coordinator", "observe", "odradek", "pipeline")
SENDS = {"send", "request", "call", "forward"}


@pytest.mark.parametrize("module, name", _actor_classes(), ids=lambda v: v)
def test_every_message_an_actor_handles_is_declared(module, name):
    cls = getattr(importlib.import_module(module), name)
    undeclared = sorted(t for t in handled(cls) if t not in BODIES)
    assert not undeclared, f"{name} handles messages actors/messages.py does not declare: {undeclared}"


def test_every_declared_body_and_answer_is_a_named_tuple_with_its_type():
    for type_, cls in BODIES.items():
        assert cls.TYPE == type_ and issubclass(cls, tuple) and hasattr(cls, "_fields"), type_
    for type_, answer in REPLIES.items():
        assert type_ in BODIES and issubclass(answer, tuple) and hasattr(answer, "_fields"), type_


def test_a_body_travels_as_an_array_and_comes_back_as_its_class():
    frames = [encode_header(Members.TYPE, 7, "a", Members("handler", ["handler-0"], [])), b"payload"]
    assert msgpack.unpackb(frames[0])[3] == ["handler", ["handler-0"], []]  # no field names on the wire
    msg = decode(frames)
    assert type(msg.fields) is Members and msg.fields.role == "handler" and msg.frames == [b"payload"]


@pytest.mark.parametrize("fields", [["handler", ["h-0"]], ["handler", ["h-0"], [], "extra"],
                                    {"role": "handler", "members": [], "retired": []}, "handler"])
def test_a_body_that_does_not_fit_its_declared_class_is_refused(fields):
    with pytest.raises(MalformedMessage, match="needs the 3 fields of Members"):
        decode([msgpack.packb([Members.TYPE, 1, "a", fields])])


def test_an_answer_is_rebuilt_as_the_class_its_request_declares_and_a_misfit_is_refused():
    assert REPLIES[Scale.TYPE] is Scaled and REPLIES[Status.TYPE].__name__ == "BrokerStatus"
    answer = decode([encode_header(REPLY, 3, None, Scaled("handler", 2, ["handler-1"]))])
    typed = typed_reply(answer, Scaled)
    assert type(typed.fields) is Scaled and typed.fields.added == ["handler-1"] and typed.fields.removed == []
    with pytest.raises(MalformedMessage):
        typed_reply(Message(REPLY, 3, None, ["handler"]), Scaled)
    with pytest.raises(MalformedMessage):
        typed_reply(Message(REPLY, 3, None, {"name": "x"}), Name)


def test_a_message_type_cannot_be_declared_twice():
    with pytest.raises(ValueError, match="declared twice"):
        messages.message(Members.TYPE)(type("Other", (tuple,), {"_fields": ()}))


def _string_typed_sends(path: pathlib.Path) -> list[str]:
    """Calls like ``self.send(to, "type", ...)``: a message named by a string literal."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SENDS \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and re.fullmatch(r"_?[a-z_]+", node.args[1].value):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.attr}(..., {node.args[1].value!r})")
    return found


def test_no_module_names_a_message_by_a_string():
    found = []
    for folder in ROLE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += _string_typed_sends(path)
    assert not found, "messages sent by name instead of their class in actors/messages.py:\n" + "\n".join(found)
