"""The run directory and the actors' sockets are private to the broker's user, whatever the
umask and whoever got to a shared temporary directory first (issue 16, defects 16 and 17).
"Another user" is a real one: the directory is handed to ``nobody`` with ``os.chown``."""
import contextlib
import os
import stat

import pytest

from odradek.actors.supervisor import prepare_run_dir
from odradek.core.protocol import OdradekError

from tests.actors.test_runtime import ECHO

NOBODY = 65534


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_run_directory_is_created_0700_whatever_the_umask(tmp_path):
    run_dir = str(tmp_path / "run")
    with umask(0):
        prepare_run_dir(run_dir)
    assert mode(run_dir) == 0o700
    assert mode(os.path.join(run_dir, "supervisor.pid")) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a directory to another user needs root")
def test_a_run_directory_another_user_created_first_is_refused(tmp_path):
    run_dir = str(tmp_path / "odradek-run-taken")
    os.mkdir(run_dir, 0o700)
    os.chown(run_dir, NOBODY, NOBODY)
    with pytest.raises(OdradekError, match="belongs to uid 65534"):
        prepare_run_dir(run_dir)
    assert os.listdir(run_dir) == []  # nothing of ours went into it


def test_a_run_directory_others_may_write_to_is_refused(tmp_path):
    run_dir = str(tmp_path / "run")
    os.mkdir(run_dir)
    os.chmod(run_dir, 0o777)
    with pytest.raises(OdradekError, match="mode 0777"):
        prepare_run_dir(run_dir)


def test_a_symlink_in_place_of_the_run_directory_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    run_dir = str(tmp_path / "run")
    os.symlink(target, run_dir)
    with pytest.raises(OdradekError, match="not a directory"):
        prepare_run_dir(run_dir)


def test_a_run_directory_others_may_only_read_is_narrowed_to_0700(tmp_path):
    run_dir = str(tmp_path / "run")
    os.mkdir(run_dir)
    os.chmod(run_dir, 0o755)
    prepare_run_dir(run_dir)
    assert mode(run_dir) == 0o700


def test_ipc_sockets_are_private_under_umask_000(tree):
    with umask(0):
        t = tree([ECHO])
    sockets = [name for name in os.listdir(t.run_dir) if name.endswith(".mbox")]
    assert {"supervisor.mbox", "echo-0.mbox", "echo-1.mbox"} <= set(sockets)
    assert mode(t.run_dir) == 0o700
    assert {name: oct(mode(os.path.join(t.run_dir, name))) for name in sockets} == \
        {name: oct(0o600) for name in sockets}
