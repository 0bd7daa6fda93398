"""A small network-edge tree for tests that need a handler the broker does not have.

``FileHandler`` answers FETCH with the file regions named in its body (as the fetch actor
will: ``_reply {body, files}``), so the processor's sendfile path can be tested end to end.
``python -m tests.network.filetree RUN_DIR`` runs acceptor, processor and a FileHandler
under the generic supervisor and prints ``ready <port>``; SIGTERM stops it.
"""
from __future__ import annotations

import sys

from actors.supervisor import ChildSpec, Supervisor, run_supervisor
from network.handler import SUPPORTED, RequestHandler
from network.protocol import ApiKey


class FileHandler(RequestHandler):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        SUPPORTED[ApiKey.FETCH] = (0, 0)
        self.dispatch[ApiKey.FETCH] = self.fetch

    def fetch(self, msg, body) -> None:
        self.reply(msg, {"body": {"regions": len(body["files"])}, "files": body["files"]},
                   [b"frame-before-files"])


def main(run_dir: str) -> int:
    config = {"listeners": "PLAINTEXT://127.0.0.1:0", "broker.id": 0}
    args = {"config": config, "broker_id": 0, "standalone": True}  # no controller in this tree
    specs = [ChildSpec("handler", "tests.network.filetree:FileHandler", 1, args, watchers=("processor",),
                       scalable=True),
             ChildSpec("processor", "network.processor:Processor", 1, args, watchers=("acceptor",)),
             ChildSpec("acceptor", "network.acceptor:Acceptor", 1, args)]

    def ready(sup: Supervisor) -> None:
        print(f"ready {sup.children['acceptor'].ready_info['port']}", flush=True)

    return run_supervisor(Supervisor(run_dir, specs, on_ready=ready, log_level="WARNING"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
