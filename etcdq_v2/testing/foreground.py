"""``etcdq server``: one member in the foreground until SIGINT/SIGTERM."""
from __future__ import annotations

import sys
import time
from typing import IO, Optional

from ..errors import ConfigError, Unavailable
from ..signals import StopSignals
from .member import EtcdServer, PathLike
from .probe import POLL_INTERVAL


def run_foreground(data_dir: PathLike, port: Optional[int] = None, *,
                   binary: Optional[str] = None, out: Optional[IO[str]] = None) -> int:
    """Run one member until SIGINT/SIGTERM, then stop it; return an exit code.

    Backs ``etcdq server``: 0 after a clean stop on a signal, 1 if etcd failed
    to start or died on its own, 2 if no etcd binary was found.  ``port`` 0 or
    None picks a free port.  The URL is printed (and flushed) on one line so a
    script can read it.  The signal handlers are in place before etcd starts,
    and every wait, start-up included, keeps looking at what they recorded,
    so a signal at any moment ends in a clean stop, never a traceback.
    """
    stop = StopSignals()
    with stop.installed():
        try:
            server = EtcdServer(data_dir, client_port=port or None, binary=binary)
        except ConfigError as exc:
            print(f"etcdq server: {exc}", file=sys.stderr)
            return 2
        try:
            code = _serve(server, stop, out or sys.stdout)
        finally:
            server.stop()
        if stop.requested():  # before the old handlers are back: a last word, whatever comes
            print("etcdq server: etcd stopped", file=sys.stderr, flush=True)
        return code


def _serve(server: EtcdServer, stop: StopSignals, out: IO[str]) -> int:
    try:
        if not server.start(wait=False)._ready_unless(stop.requested, 30.0):
            return 0  # a signal during start-up
    except Unavailable as exc:
        print(f"etcdq server: {exc}", file=sys.stderr)
        return 1
    print(server.url, file=out, flush=True)
    print(f"etcd {server.pid} logs to {server.log_path}; Ctrl-C stops it",
          file=sys.stderr, flush=True)
    while server.is_running() and not stop.requested():
        time.sleep(POLL_INTERVAL)
    if stop.requested():
        return 0
    print(f"etcdq server: etcd exited on its own{server._log_excerpt_text()}", file=sys.stderr)
    return 1
