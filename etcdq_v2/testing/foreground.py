"""``etcdq server``: one member in the foreground until SIGINT/SIGTERM."""
from __future__ import annotations

import contextlib
import signal
import sys
import time
from types import FrameType
from typing import IO, Iterator, Optional, Sequence

from ..errors import ConfigError, Unavailable
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
    stop = _StopSignals()
    with stop.installed((signal.SIGINT, signal.SIGTERM)):
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


def _serve(server: EtcdServer, stop: "_StopSignals", out: IO[str]) -> int:
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


class _StopSignals:
    """Counts the stop signals received while installed; loops poll :meth:`requested`.

    The handler only adds to an int.  Python runs it in the main thread
    between any two bytecodes, also while that thread holds a lock, so it
    must take none: one that called ``threading.Event.set()`` deadlocked when
    a signal landed inside ``Event.wait()``'s own critical section, or inside
    an earlier run of the handler (Ctrl-C held down, or a burst of signals).
    """

    def __init__(self) -> None:
        self.received = 0

    def requested(self) -> bool:
        return self.received > 0

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        self.received += 1

    @contextlib.contextmanager
    def installed(self, signums: Sequence[int]) -> Iterator[None]:
        """Within the block, the signals are only counted; the old handlers come back after."""
        previous = {signum: signal.signal(signum, self._on_signal) for signum in signums}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
