"""`python -m tpuctl.watcher --store gs://BUCKET --cluster NAME`: the recovery watcher's VM runs this (its start-up
script's systemd unit, templates/startup.sh role watcher-vm). It has no state of its own: the cluster's state
comes from the armed record in the store (control/armed.py), and the watch is control/watch.py's, the same as
`tpuctl watch` runs on a workstation. Exits 0 when the watch is over (systemd leaves it stopped), non-zero on an
error (systemd starts it again)."""
from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Callable

from .core.errors import TpuctlError


class _Lines:
    """A Reporter for the journal: one line each."""

    def info(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    warn = info

    def resource(self, kind: str, name: str, state: str, final: bool | None = None) -> None:
        self.info(f"{kind} {name}: {state}")

    def transfer(self, total: int, verb: str = "upload") -> Callable[[int], None]:
        return lambda n: None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tpuctl.watcher")
    ap.add_argument("--store", required=True)
    ap.add_argument("--cluster", required=True)
    args = ap.parse_args(argv)
    from .control.watch import Watcher, load_for_watch
    from .providers import registry
    from .providers.stores import open_store
    rep = _Lines()
    try:
        st = load_for_watch(args.cluster, open_store(args.store))
        if st is None:
            rep.info(f"cluster {args.cluster} is not armed for recovery in {args.store}: nothing to watch")
            return 0
        why = Watcher(st, registry.get(st.spec.provider), rep, where=f"VM {os.environ.get('TPUCTL_HOST') or socket.gethostname()}").run()
    except TpuctlError as e:
        rep.info(f"watcher error: {e.message} ({e.hint})")
        return 1
    rep.info(f"watch of {args.cluster} ended: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
