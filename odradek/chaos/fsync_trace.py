"""What a broker has fsynced, for the power-loss model (docs/RELIABILITY.md, "Power loss").

Runs in every process of a broker started by the fault battery with ``ODRADEK_FSYNC_TRACE``
set to a directory (and ``odradek/chaos/_site`` on ``PYTHONPATH``, whose ``sitecustomize``
calls ``install``): ``os.fsync`` and ``os.fdatasync`` are wrapped so that after each one that
succeeds, the file's path and its size when the fsync began go to ``<dir>/<pid>.trace`` as one line ``<size> <path>``
(one ``write`` of an O_APPEND file: whole lines, in order). No LD_PRELOAD and no change to the
broker: it fsyncs through ``os``. Nothing is traced when the variable is not set.

``fsynced_lengths`` reads the traces back (the last size recorded per path), ``cut_to_fsynced``
applies a power loss to a dead broker's data directory: each segment file cut back to its
size at its last fsync (0 if it never had one), plus a torn write of garbage, and the
partition's later segments removed (recovery would drop them behind the cut anyway).
"""
from __future__ import annotations

import os
import random

ENV = "ODRADEK_FSYNC_TRACE"
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")


def install() -> None:
    """Wrap ``os.fsync`` / ``os.fdatasync`` of this process (when ``ODRADEK_FSYNC_TRACE`` is set)."""
    out_dir = os.environ.get(ENV)
    if not out_dir or getattr(os, "_odradek_fsync_traced", False):
        return
    os.makedirs(out_dir, exist_ok=True)
    state = {"fd": None, "pid": None}

    def record(fd: int, size: int) -> None:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
            if state["pid"] != os.getpid():  # first use in this process (or after a fork)
                state["fd"] = os.open(os.path.join(out_dir, f"{os.getpid()}.trace"),
                                      os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                state["pid"] = os.getpid()
            os.write(state["fd"], f"{size} {path}\n".encode())
        except OSError:
            pass  # a trace line lost makes the model cut more, never less

    def wrap(real):
        def traced(fd):
            try:
                size = os.fstat(fd).st_size  # before: all of it is on the disk once the fsync returns
            except OSError:
                size = None
            real(fd)
            if size is not None:
                record(fd, size)
        return traced

    os.fsync, os.fdatasync = wrap(os.fsync), wrap(os.fdatasync)
    os._odradek_fsync_traced = True


def env(trace_dir: str) -> dict:
    """The environment that makes a broker trace its fsyncs into ``trace_dir``."""
    path = os.environ.get("PYTHONPATH")
    return {ENV: trace_dir, "PYTHONPATH": SITE_DIR + (os.pathsep + path if path else "")}


def fsynced_lengths(trace_dir: str) -> dict[str, int]:
    """``{path: size at its last fsync}`` from every process's trace (files in order of time:
    a partition is written by one log actor at a time, so its lines are in one trace or in
    the traces of successive processes, oldest first by modification time)."""
    out: dict[str, int] = {}
    if not os.path.isdir(trace_dir):
        return out
    traces = sorted((os.path.join(trace_dir, n) for n in os.listdir(trace_dir) if n.endswith(".trace")),
                    key=os.path.getmtime)
    for path in traces:
        with open(path, "rb") as f:
            for line in f.read().decode(errors="replace").splitlines():
                size, _, name = line.partition(" ")
                if size.isdigit() and name:
                    out[name] = int(size)
    return out


def cut_to_fsynced(data_dir: str, trace_dir: str, rng: random.Random) -> list[tuple[str, int]]:
    """Power loss of a dead broker: every partition's segments cut to what was fsynced (see
    the module's opening); ``[(file, bytes removed)]``. Files other than segments (indexes,
    checkpoints, metadata, all written with an fsync or rebuilt by recovery) are left."""
    from odradek.chaos.nemesis import segment_bases
    synced = fsynced_lengths(trace_dir)
    cut = []
    for name in sorted(os.listdir(data_dir)):
        directory = os.path.join(data_dir, name)
        if not os.path.isdir(directory):
            continue
        torn = False
        for base in segment_bases(directory):
            path = os.path.join(directory, f"{base:020d}.log")
            size = os.path.getsize(path)
            if torn and base > 0:
                os.remove(path)
                cut.append((path, size))
                continue
            keep = min(synced.get(os.path.realpath(path), 0), size)
            if keep < size:
                os.truncate(path, keep)
                with open(path, "ab") as f:
                    f.write(rng.randbytes(rng.randint(1, 4096)))
                cut.append((path, size - keep))
                torn = True
    return cut
