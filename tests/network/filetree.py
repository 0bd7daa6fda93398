"""A small network-edge tree for tests that need a handler the broker does not have.

``FileHandler`` answers FETCH with the file regions named in its body (as the fetch actor
will: ``_reply {body, files}``), so the processor's sendfile path can be tested end to end.
``python -m tests.network.filetree RUN_DIR`` runs the broker's controller (the handler
fetches topic metadata from it at start), acceptor, processor and a FileHandler under the
generic supervisor and prints ``ready <port>``; SIGTERM stops it.
"""
from __future__ import annotations

import os
import sys

from odradek.actors.messages import Response
from odradek.actors.supervisor import Supervisor, run_supervisor
from odradek.network.handler import SUPPORTED, RequestHandler
from odradek.core.protocol import ApiKey
from odradek import config as cfg
from odradek.broker import actor_specs


class FileHandler(RequestHandler):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        SUPPORTED[ApiKey.FETCH] = (0, 0)
        self.dispatch[ApiKey.FETCH] = self.fetch

    def fetch(self, msg, body) -> None:
        self.reply(msg, Response({"regions": len(body["files"])}, body["files"]), [b"frame-before-files"])


def main(run_dir: str) -> int:
    os.makedirs(run_dir + "-data", exist_ok=True)
    config = cfg.load(None, ["listeners=PLAINTEXT://127.0.0.1:0", f"log.dirs={run_dir}-data",
                             "num.io.threads=1", "num.network.threads=1"])
    specs = []
    for spec in actor_specs(config):  # the broker's own tree, minus the storage roles
        if spec.role == "handler":
            spec.cls = "tests.network.filetree:FileHandler"
        if spec.role in ("controller", "handler", "processor", "acceptor"):
            specs.append(spec)

    def ready(sup: Supervisor) -> None:
        print(f"ready {sup.children['acceptor'].ready_info['port']}", flush=True)

    return run_supervisor(Supervisor(run_dir, specs, on_ready=ready, log_level="WARNING"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
