"""The actor tests' fixture: ``tree(children, policy=None)`` starts a supervisor with those
children in a run directory of its own (``tests.actors.test_runtime.Tree``); every tree is
stopped in teardown."""
from __future__ import annotations

import pytest

from tests.actors.test_runtime import Tree


@pytest.fixture
def tree(tmp_path):
    trees = []

    def make(children, policy=None):
        t = Tree(str(tmp_path / f"run{len(trees)}"), children, policy)
        trees.append(t)
        return t

    yield make
    for t in trees:
        t.stop()
