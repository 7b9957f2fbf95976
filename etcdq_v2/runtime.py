"""Where the library's time, concurrency and randomness come from.

Every clock read, sleep, lock, condition, event, thread, thread-local, inbox,
random pick and token of etcdq_v2 goes through one :class:`Runtime`, which a
queue is given (``Queue(..., runtime=)``, ``connect(..., runtime=)``) and hands
to everything it owns: its transport, protocol, view, heartbeat, claims and
the workers that serve it.  :data:`SYSTEM`, the default, is the real thing and
behaves as the modules ``time``, ``threading``, ``random`` and ``os.urandom``
do.  A simulator gives its own (``etcdq_v2.testing.sim.runtime``): virtual
time, one thread running at a time, seeded randomness, so that a run of the
real code replays from its seed.

Only this module, wire.py (the real network, which a simulator replaces
whole), signals.py (signal handlers run on the real main thread) and the
metrics HTTP server use those modules directly; tests/test_runtime.py checks.
"""

from __future__ import annotations

import os
import queue
import random
import threading
import time
from typing import Any, Callable, Iterable, Optional, Protocol, Sequence, TypeVar


T = TypeVar("T")

_BOOTTIME: Optional[int] = getattr(time, "CLOCK_BOOTTIME", None)


def _boot_clock() -> float:
    """Linux's CLOCK_BOOTTIME (time.monotonic() stops while the host is suspended,
    etcd's clock does not), else time.monotonic().  For C3's "within half a lock
    TTL of C1" check."""
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()


class LockLike(Protocol):
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...

    def __enter__(self) -> bool: ...

    def __exit__(self, *exc: Any) -> Optional[bool]: ...


class ConditionLike(Protocol):
    def wait(self, timeout: Optional[float] = ...) -> bool: ...

    def wait_for(self, predicate: Callable[[], T], timeout: Optional[float] = ...) -> T: ...

    def notify(self, n: int = ...) -> None: ...

    def notify_all(self) -> None: ...

    def __enter__(self) -> bool: ...

    def __exit__(self, *exc: Any) -> Optional[bool]: ...


class EventLike(Protocol):
    def is_set(self) -> bool: ...

    def set(self) -> None: ...

    def clear(self) -> None: ...

    def wait(self, timeout: Optional[float] = ...) -> bool: ...


class ThreadLike(Protocol):
    name: str

    def start(self) -> None: ...

    def join(self, timeout: Optional[float] = ...) -> None: ...

    def is_alive(self) -> bool: ...


class InboxLike(Protocol[T]):
    """A queue.SimpleQueue: put never blocks, get blocks until an item comes."""

    def put(self, item: T) -> None: ...

    def get(self) -> T: ...


class Randomness(Protocol):
    """The part of random.Random the library uses."""

    def random(self) -> float: ...

    def uniform(self, a: float, b: float) -> float: ...

    def randrange(self, start: int, stop: Optional[int] = ...) -> int: ...

    def choice(self, seq: Sequence[T]) -> T: ...

    def shuffle(self, x: Any) -> None: ...


class Runtime:
    """The real clocks, threads and randomness (see the module's docstring).

    ``rng``: the random.Random-like source of picks and jitter; default the
    ``random`` module's own (random.seed() seeds it, as before).  A simulated
    runtime subclasses this and overrides every method.
    """

    def __init__(self, rng: Optional[Randomness] = None) -> None:
        self.random: Randomness = rng if rng is not None else random

    # -- time --------------------------------------------------------------
    # The real clocks as they are, not wrapped: the view reads one per claim
    # and per event, and a call through a Python frame costs more than the read.

    #: Seconds on a clock that never goes back (time.monotonic()).
    monotonic: Callable[[], float] = staticmethod(time.monotonic)
    #: Seconds since the epoch (time.time()): record timestamps, etcd's expirations.
    wall: Callable[[], float] = staticmethod(time.time)
    #: Block the calling thread for that many seconds (time.sleep()).
    sleep: Callable[[float], None] = staticmethod(time.sleep)
    #: Seconds on a clock that also runs while the host is suspended (see _boot_clock).
    boot_clock: Callable[[], float] = staticmethod(_boot_clock)

    # -- concurrency -------------------------------------------------------
    def Lock(self) -> LockLike:  # noqa: N802 - named as the threading factory it replaces
        return threading.Lock()

    def RLock(self) -> LockLike:  # noqa: N802
        return threading.RLock()

    def Condition(self, lock: Optional[LockLike] = None) -> ConditionLike:  # noqa: N802
        return threading.Condition(lock)  # type: ignore[arg-type]

    def Event(self) -> EventLike:  # noqa: N802
        return threading.Event()

    def Thread(self, target: Callable[..., Any], *, name: Optional[str] = None,  # noqa: N802
               daemon: bool = True, args: Iterable[Any] = ()) -> ThreadLike:
        """A thread, not started (the caller starts it, as threading.Thread's)."""
        return threading.Thread(target=target, name=name, daemon=daemon, args=tuple(args))

    def local(self) -> Any:
        """Per-thread attributes (threading.local())."""
        return threading.local()

    def Inbox(self) -> "InboxLike[Any]":  # noqa: N802
        """A queue of items handed to one thread (queue.SimpleQueue)."""
        return queue.SimpleQueue()

    # -- randomness --------------------------------------------------------
    def token(self) -> str:
        """A random token, unique for practical purposes (96 bits, 24 hex digits)."""
        return os.urandom(12).hex()


#: The real runtime: the default of every object that takes one.
SYSTEM = Runtime()
