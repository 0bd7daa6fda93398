"""docs/PROTOCOL.md lists every API key the handler supports and every error code, as
``core/protocol.py`` defines them. ``python -m tests.network.test_protocol_doc`` rewrites
the error table."""
from __future__ import annotations

import os
import re

from odradek.network.handler import SUPPORTED
from odradek.core.protocol import ErrorCode

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "PROTOCOL.md")
START, END = "<!-- error-codes:start -->", "<!-- error-codes:end -->"


def error_table() -> str:
    rows = ["| code | name | retriable | meaning |", "|---|---|---|---|"]
    rows += [f"| {int(e)} | `{e.name}` | {'yes' if e.retriable else 'no'} | {e.meaning} |" for e in ErrorCode]
    return "\n".join(rows)


def read_doc() -> str:
    with open(DOC) as f:
        return f.read()


def test_the_error_table_matches_protocol_py():
    doc = read_doc()
    section = doc[doc.index(START) + len(START):doc.index(END)].strip()
    assert section == error_table(), "run: python -m tests.network.test_protocol_doc"


def test_every_supported_api_is_documented():
    doc = read_doc()
    for key in SUPPORTED:
        assert re.search(rf"^\| {int(key)} \| `{key.name}` \|", doc, re.M), key.name


if __name__ == "__main__":
    doc = read_doc()
    head, _, rest = doc.partition(START)
    _, _, tail = rest.partition(END)
    with open(DOC, "w") as f:
        f.write(f"{head}{START}\n{error_table()}\n{END}{tail}")
    print(f"rewrote the error table in {os.path.normpath(DOC)}")
