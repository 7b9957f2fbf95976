"""Stop signals (SIGTERM, SIGINT) counted for loops that poll: a Worker's and ``etcdq server``'s.

:class:`StopSignals` installs a handler that only adds to an int.  Python
runs a handler in the main thread between any two bytecodes, also while that
thread holds a lock, so it must take none: one that called
``threading.Event.set()`` deadlocked when a signal landed inside
``Event.wait()``'s own critical section, or inside an earlier run of the
handler (Ctrl-C held down, or a burst of signals).  The loops look at
:attr:`StopSignals.received` between their waits and act there.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from types import FrameType
from typing import Iterator, Optional, Sequence

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Counts the stop signals received while installed; loops poll :meth:`requested`."""

    def __init__(self) -> None:
        #: How many signals arrived; Python runs the handler once for signals that
        #: arrive together, so a burst may count as one.
        self.received = 0
        #: The number of the last one (0 before any).
        self.last = 0

    def requested(self) -> bool:
        return self.received > 0

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        self.last = signum
        self.received += 1

    @contextlib.contextmanager
    def installed(self, signums: Sequence[int] = STOP_SIGNALS) -> Iterator[bool]:
        """Within the block the signals are only counted; the old handlers come back after.

        Yields False, and installs nothing, outside the main thread, where
        Python cannot set signal handlers.
        """
        if threading.current_thread() is not threading.main_thread():
            yield False
            return
        previous = {signum: signal.signal(signum, self._on_signal) for signum in signums}
        try:
            yield True
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
