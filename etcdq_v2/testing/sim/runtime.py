"""A deterministic runtime for the real library code: virtual time, one thread
at a time, seeded choices.

:class:`SimRuntime` is an :class:`etcdq_v2.runtime.Runtime` whose threads are
greenlets of the OS thread that calls ``run()``, of which exactly one runs at
a time: it holds the baton.
Every blocking call of the runtime (sleep, a wait on a condition or event, a
lock that is held, an inbox that is empty, starting or joining a thread)
hands the baton back to the scheduler, which picks the next sim-thread that
can go on with a seeded ``random.Random``.  Time is virtual: it stands still
while a thread runs, and when every sim-thread waits it jumps to the earliest
deadline, so ``sleep(3600)`` costs nothing.  Nothing able to run and no
deadline to jump to is a deadlock: :class:`Deadlock` names each thread and
what it waits for.  So is a livelock: time that stands still for
:data:`STILL_HAND_ONS` hand-overs (a loop that waits for no time, as on a
deadline already past, spins a real process's CPU and holds the virtual clock).

The same seed and the same code give the same interleaving, which
:attr:`SimRuntime.trace` records (one line per hand-over: virtual time and
thread), as long as every source of time, concurrency and randomness the code
uses is this runtime's.  A sim-thread that blocks outside it (a real socket,
``time.sleep``) holds the baton while it does: the run stays correct, but its
trace is no longer the seed's alone.

``run(target)`` runs ``target`` as the sim-thread "main"; the run ends when it
returns (as a process ends with its main thread: the other sim-threads are
stopped where they wait, by an exception that unwinds them, one after the
other in the order they were made).  ``run`` itself is the hub: a sim-thread
that ends returns to it, naming the one it handed the baton to.
"""

from __future__ import annotations

import collections
import itertools
import math
import random
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Tuple

from greenlet import getcurrent, greenlet

from ...runtime import InboxLike, Runtime, ThreadLike

#: The wall clock (seconds since the epoch) at virtual time 0.
EPOCH = 1_700_000_000.0


def _always() -> bool:
    return True


def _never() -> bool:
    """A sleep's readiness: only its deadline ends it (the scheduler need not ask)."""
    return False


#: Hand-overs and lock acquisitions at one virtual instant that make a
#: livelock.  A busy run makes a few thousand at one instant; a thread that
#: loops through zero-length waits (which hand nothing over) makes them
#: without end.
STILL_HAND_ONS = 200_000


class Deadlock(RuntimeError):
    """No sim-thread can go on, and none waits with a deadline; or time stands
    still (a livelock)."""


class Stopped(BaseException):
    """Raised in a sim-thread's blocking call once its run ended: it unwinds the
    thread.  A BaseException, so that the library's ``except Exception`` lets it
    through."""


class _SimThread:
    """One sim-thread: a greenlet that runs only while it holds the baton.

    A hand-over is a switch between greenlets of one OS thread, not a
    thread switch through the kernel: about a microsecond instead of tens."""

    def __init__(self, sim: "SimRuntime", target: Callable[..., Any], name: str,
                 args: Tuple[Any, ...]) -> None:
        self.sim = sim
        self.number = next(sim._numbers)
        self.name = name
        #: How the trace names it.
        self.label = f"{name}#{self.number}"
        self.daemon = True
        self._target, self._args = target, args
        #: None: it runs (or may run at once); else what it waits for.
        self.ready: Optional[Callable[[], bool]] = None
        self.deadline = math.inf
        self.waits_for = ""
        self.timed_out = False
        self.started = self.done = False
        self.error: Optional[BaseException] = None
        self.result: Any = None
        #: Made when it starts; its parent is the run's hub, which it returns to on ending.
        self.glet: Optional[greenlet] = None

    # ThreadLike
    def start(self) -> None:
        if self.sim._stopped:
            raise Stopped()
        if self.started:
            raise RuntimeError(f"sim-thread {self.name} started twice")
        self.started = True
        self.sim._spawn(self)
        self.sim._block(_always, "start")  # the new thread may run first

    def join(self, timeout: Optional[float] = None) -> None:
        self.sim._block(lambda: self.done, f"join {self.name}", timeout)

    def is_alive(self) -> bool:
        return self.started and not self.done

    def _main(self) -> None:
        try:
            if not self.sim._stopped:
                self.result = self._target(*self._args)
        except Stopped:
            return  # the run ended: hand nothing on
        except BaseException as exc:  # reported by the run; a thread's death is not silent
            self.error = exc
            self.sim.failures.append((self.name, exc))
        self.sim._exit(self)

    def __repr__(self) -> str:
        return f"<sim-thread {self.name}: {self.waits_for or 'runs'}>"


class SimRuntime(Runtime):
    """The runtime of a simulated run (see the module's docstring).

    ``seed`` seeds three separate streams: the scheduler's picks, the
    library's ``random`` and the tokens, so that a change in how often one is
    drawn from leaves the others as they were.
    """

    def __init__(self, seed: int, *, epoch: float = EPOCH) -> None:
        super().__init__(random.Random(f"library-{seed}"))
        self.seed = seed
        self.now = 0.0
        self.epoch = epoch
        #: One line per hand-over of the baton: "<virtual time> <thread>".
        self.trace: List[str] = []
        #: (thread name, exception) of each sim-thread that died of one.
        self.failures: List[Tuple[str, BaseException]] = []
        self._picks = random.Random(f"schedule-{seed}")
        self._tokens = random.Random(f"tokens-{seed}")
        self._numbers = itertools.count()
        self._threads: List[_SimThread] = []
        #: The sim-threads started and not ended, in the order they started.
        self._live: List[_SimThread] = []
        self._stopped = False
        self._error: Optional[BaseException] = None
        #: Hand-overs since virtual time last moved (a livelock at STILL_HAND_ONS).
        self._still = 0
        self._main: Optional[_SimThread] = None
        #: The sim-thread holding the baton; the greenlet that called run(); the
        #: sim-thread the hub starts next (the one an ending sim-thread handed on to).
        self._running: Optional[_SimThread] = None
        self._hub: Optional[greenlet] = None
        self._next: Optional[_SimThread] = None

    # -- the run -------------------------------------------------------------
    def run(self, target: Callable[..., Any], *args: Any) -> Any:
        """Run ``target(*args)`` as sim-thread "main"; its result, or its exception.
        Deadlock if the sim-threads come to wait for each other."""
        if self._main is not None:
            raise RuntimeError("a SimRuntime runs once")
        self._hub = getcurrent()
        main = self._main = _SimThread(self, target, "main", args)
        main.started = True
        self._threads.append(main)
        self._live.append(main)
        main.glet = greenlet(main._main, parent=self._hub)
        self.trace.append(f"{self.now:.6f} {main.label}")
        # The hub: a sim-thread that ends comes back here, naming the next one.
        self._next = main
        while self._next is not None:
            thread, self._next = self._next, None
            self._switch(thread)
        self._unwind()
        if self._error is not None:
            raise self._error
        if main.error is not None:
            raise main.error
        return main.result

    def _unwind(self) -> None:
        """Resume every sim-thread still waiting, in order: its wait raises Stopped."""
        for thread in self._threads:
            if thread.glet is not None and not thread.glet.dead:
                self._switch(thread)

    # -- time ----------------------------------------------------------------
    def monotonic(self) -> float:
        return self.now

    def boot_clock(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.epoch + self.now

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._block(_never, f"sleep {seconds:g}", seconds)
        else:
            self._block(_always, "sleep 0")

    # -- concurrency -----------------------------------------------------------
    def Lock(self) -> "SimLock":  # noqa: N802
        return SimLock(self)

    def RLock(self) -> "SimLock":  # noqa: N802
        return SimLock(self, reentrant=True)

    def Condition(self, lock: Any = None) -> "SimCondition":  # noqa: N802
        return SimCondition(self, lock if lock is not None else self.RLock())

    def Event(self) -> "SimEvent":  # noqa: N802
        return SimEvent(self)

    def Thread(self, target: Callable[..., Any], *, name: Optional[str] = None,  # noqa: N802
               daemon: bool = True, args: Iterable[Any] = ()) -> ThreadLike:
        number = len(self._threads)
        return _SimThread(self, target, name or f"thread-{number}", tuple(args))

    def Inbox(self) -> "InboxLike[Any]":  # noqa: N802
        return SimInbox(self)

    def local(self) -> "SimLocal":
        return SimLocal()

    def token(self) -> str:
        return f"{self._tokens.getrandbits(96):024x}"

    def wait_until(self, ready: Callable[[], bool], what: str,
                   timeout: Optional[float] = None) -> bool:
        """Block the calling sim-thread until ``ready()`` (True) or ``timeout``
        virtual seconds pass (False): for simulated devices (the network of
        :mod:`.net`), whose state other sim-threads change."""
        return ready() or self._block(ready, what, timeout)

    # -- the scheduler ---------------------------------------------------------
    def current(self) -> _SimThread:
        """The calling sim-thread (RuntimeError from any other thread)."""
        thread = self._running
        if thread is None or thread.glet is not getcurrent():
            raise RuntimeError("a blocking call of a SimRuntime from outside its sim-threads")
        return thread

    def _spawn(self, thread: _SimThread) -> None:
        self._threads.append(thread)
        self._live.append(thread)
        thread.ready, thread.waits_for = _always, "its start"
        thread.glet = greenlet(thread._main, parent=self._hub)

    def _switch(self, thread: _SimThread) -> None:
        """Run ``thread`` until it hands the baton on (back here, or to another)."""
        self._running = thread
        assert thread.glet is not None
        thread.glet.switch()

    def _block(self, ready: Callable[[], bool], what: str,
               timeout: Optional[float] = None) -> bool:
        """Wait until ``ready()`` (True) or ``timeout`` virtual seconds pass (False),
        letting the scheduler run another sim-thread meanwhile."""
        me = self.current()
        if self._stopped:
            raise Stopped()
        me.ready, me.waits_for, me.timed_out = ready, what, False
        me.deadline = math.inf if timeout is None else self.now + max(timeout, 0.0)
        self._hand_on(me)
        if self._stopped:
            raise Stopped()
        return not me.timed_out

    def _exit(self, thread: _SimThread) -> None:
        thread.done, thread.ready, thread.waits_for = True, None, "ended"
        self._live.remove(thread)
        if self._stopped:
            return
        if thread is self._main:
            self._stop()
        else:
            self._hand_on(None)

    def _hand_on(self, waiting: Optional[_SimThread]) -> None:
        """Give the baton to the next sim-thread (perhaps ``waiting`` itself);
        return once ``waiting`` has it again, or the run ended.  A sim-thread
        that ends (``waiting`` None) hands on through the hub, so that its
        greenlet ends."""
        chosen = self._pick()
        if chosen is None:  # the run ended: back to the hub, which unwinds
            if waiting is not None:
                assert self._hub is not None
                self._hub.switch()
            return
        chosen.ready, chosen.waits_for = None, ""
        self.trace.append(f"{self.now:.6f} {chosen.label}")
        if chosen is waiting:
            return
        if waiting is None:
            self._next = chosen
        else:
            self._switch(chosen)

    def _pick(self) -> Optional[_SimThread]:
        """The next sim-thread to run, moving time on to the earliest deadline if
        none can go on now; None once the run has ended (a deadlock ends it)."""
        # One pass, in start order: the threads able to go on now, else those
        # whose deadline is the soonest.  ready() has no side effects: it is not
        # asked of a thread already due, nor of a sleep.
        now = self.now
        able: List[_SimThread] = []
        soonest, due = math.inf, []
        for thread in self._live:
            ready = thread.ready
            if ready is None:
                continue
            deadline = thread.deadline
            if deadline <= now or (ready is not _never and ready()):
                able.append(thread)
            elif deadline < soonest:
                soonest, due = deadline, [thread]
            elif deadline == soonest:
                due.append(thread)
        if not able:
            if soonest == math.inf:
                waiting = [t for t in self._live if t.ready is not None]
                self._error = Deadlock(
                    f"seed {self.seed}: no sim-thread can go on at {now:g} s: "
                    + "; ".join(f"{t.name} waits for {t.waits_for}" for t in waiting))
                self._stop()
                return None
            self.now, able = soonest, due
            self._still = 0
        elif self._livelocked(now, able):
            return None
        chosen = self._picks.choice(able)
        chosen.timed_out = not chosen.ready()  # type: ignore[misc]
        return chosen

    def _livelocked(self, now: float, able: List[_SimThread]) -> bool:
        """Count a hand-over (or a lock taken) at ``now``; at STILL_HAND_ONS, end
        the run with a Deadlock."""
        self._still += 1
        if self._still < STILL_HAND_ONS:
            return False
        self._error = Deadlock(
            f"seed {self.seed}: livelock: time stands at {now:g} s for {self._still} "
            "hand-overs and locks taken; able to go on: "
            + "; ".join(t.name for t in able))
        self._stop()
        return True

    def _stop(self) -> None:
        """End the run: the hub resumes every waiting sim-thread, which unwinds
        with Stopped."""
        self._stopped = True
        self._next = None


class SimLock:
    """threading.Lock, or RLock with ``reentrant``, for sim-threads."""

    def __init__(self, sim: SimRuntime, reentrant: bool = False) -> None:
        self._sim = sim
        self._reentrant = reentrant
        self._owner: Optional[_SimThread] = None
        self._count = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = self._sim.current()
        if self._reentrant and self._owner is me:
            self._count += 1
            return True
        if self._owner is not None:
            if not blocking:
                return False
            if not self._sim._block(lambda: self._owner is None, f"a lock held by "
                                    f"{self._owner.name}", None if timeout < 0 else timeout):
                return False
        self._owner, self._count = me, 1
        if self._sim._livelocked(self._sim.now, [me]):
            raise Stopped()  # a loop that takes locks and never waits: the run ends here
        return True

    def release(self) -> None:
        if self._sim._stopped:
            return  # a thread unwinding after the run: its locks no longer matter
        if self._owner is None or (self._reentrant and self._owner is not self._sim.current()):
            raise RuntimeError("release of a lock this sim-thread does not hold")
        self._count -= 1
        if self._count == 0 or not self._reentrant:
            self._owner, self._count = None, 0

    def _release_all(self) -> int:
        count, self._owner, self._count = self._count, None, 0
        return count

    def _acquire_again(self, count: int) -> None:
        self.acquire()
        self._count = count

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class SimCondition:
    """threading.Condition for sim-threads, on a SimLock."""

    def __init__(self, sim: SimRuntime, lock: SimLock) -> None:
        self._sim = sim
        self._lock = lock
        self._waiters: Deque[List[bool]] = collections.deque()

    def wait(self, timeout: Optional[float] = None) -> bool:
        if self._lock._owner is not self._sim.current():
            raise RuntimeError("wait on a condition whose lock this sim-thread does not hold")
        waiter = [False]
        self._waiters.append(waiter)
        count = self._lock._release_all()
        try:
            return self._sim._block(lambda: waiter[0], "a condition", timeout)
        finally:
            if not waiter[0]:
                self._waiters.remove(waiter)
            if not self._sim._stopped:
                self._lock._acquire_again(count)

    def wait_for(self, predicate: Callable[[], Any], timeout: Optional[float] = None) -> Any:
        end = None if timeout is None else self._sim.now + timeout
        result = predicate()
        while not result:
            left = None if end is None else end - self._sim.now
            if left is not None and left <= 0:
                break
            self.wait(left)
            result = predicate()
        return result

    def notify(self, n: int = 1) -> None:
        for _ in range(min(n, len(self._waiters))):
            self._waiters.popleft()[0] = True

    def notify_all(self) -> None:
        self.notify(len(self._waiters))

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()


class SimEvent:
    """threading.Event for sim-threads."""

    def __init__(self, sim: SimRuntime) -> None:
        self._sim = sim
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True

    def clear(self) -> None:
        self._flag = False

    def wait(self, timeout: Optional[float] = None) -> bool:
        if self._flag:
            return True
        self._sim._block(lambda: self._flag, "an event", timeout)
        return self._flag


class SimLocal:
    """threading.local() for sim-threads: greenlets of one OS thread share its
    threading.local, so each greenlet gets its own attributes here."""

    __slots__ = ("_by_greenlet",)

    def __init__(self) -> None:
        self._by_greenlet: Dict[greenlet, Dict[str, Any]] = {}

    def __getattr__(self, name: str) -> Any:
        mine = self._by_greenlet.get(getcurrent())
        if mine is None or name not in mine:
            raise AttributeError(name)
        return mine[name]

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_by_greenlet":
            object.__setattr__(self, name, value)
        else:
            self._by_greenlet.setdefault(getcurrent(), {})[name] = value

    def __delattr__(self, name: str) -> None:
        mine = self._by_greenlet.get(getcurrent())
        if mine is None or name not in mine:
            raise AttributeError(name)
        del mine[name]


class SimInbox:
    """queue.SimpleQueue for sim-threads."""

    def __init__(self, sim: SimRuntime) -> None:
        self._sim = sim
        self._items: Deque[Any] = collections.deque()

    def put(self, item: Any) -> None:
        self._items.append(item)

    def get(self) -> Any:
        if not self._items:
            self._sim._block(lambda: bool(self._items), "an inbox")
        return self._items.popleft()
