"""Run a generic supervisor tree from a JSON spec: ``python -m tests.actors.tree SPEC RUN_DIR``.
Prints ``ready`` once the tree is up; exits with the supervisor's exit code."""
import json
import logging
import sys

from odradek.actors.supervisor import ChildSpec, RestartPolicy, Supervisor, run_supervisor


def main() -> int:
    spec = json.loads(sys.argv[1])
    logging.basicConfig(level="INFO", stream=sys.stderr)
    children = [ChildSpec(**c) for c in spec["children"]]
    sup = Supervisor(sys.argv[2], children, RestartPolicy(**spec.get("policy", {})),
                     on_ready=lambda s: print("ready", flush=True))
    return run_supervisor(sup)


if __name__ == "__main__":
    sys.exit(main())
