"""The worker runtime: run a handler over a queue's items, and shut down safely.

One item's life in a :class:`Worker`::

    main thread   claim (from the first of its queues that has a free item)
                  ──► hand it to an idle slot ──► claim again once a slot is free
    supervisor    give it to the slot's handler thread, then watch it: finished?
                  lock lost? timed out? shutdown forced? ──► settle the claim
                  exactly once (complete / fail / release / nothing when the lock
                  is lost)

A slot is a supervisor thread and its handler thread, kept from item to item
while the handler returns in time (one handler thread per slot, never two
items at once in it); a handler thread that overran is left to its handler
and the slot starts a new one.  There are at most ``concurrency`` slots.
Starting two threads per item cost the main thread, which claims every item,
a quarter of its time in 8-process drains (``Thread.start`` waits until the
new thread runs): bench/README.md, "Across a network and resources".

Why a supervisor beside every handler thread: Python threads cannot be killed.
When a handler overruns ``item_timeout``, loses its lock, or is still running
when a shutdown is forced, the supervisor settles the item without waiting for
it (a late result is discarded) and sets the task's ``cancelled`` event, which a
cooperative handler watches through :func:`current_task` to stop early.  A
handler that ignores it keeps running in its (daemon) thread until it returns
or the process exits.  This is why ``etcdq work`` runs every item in a
subprocess: a process *can* be killed, and its handler kills it on
``cancelled``.

Shutdown, from :meth:`Worker.stop`, SIGTERM or SIGINT:

* graceful (``stop()``, the first signal): no new claims; running items get
  ``grace_period`` seconds to finish (``None``: as long as they take), then
  they are released;
* forced (``stop(grace=False)``, a second signal): running items are released
  at once (after at most ``CANCEL_WAIT`` seconds for their handlers to notice
  ``cancelled``, so a killed command is gone before another worker starts it).
  Python runs a handler once for signals that arrive together, so a second
  signal counts only once the first was acted on (it is logged).

:meth:`Worker.run` returns only when every claimed item has been settled, so
no item stays locked after the worker exits -- except when etcd cannot be
reached to settle it, and then its lock expires after the queue's TTL.  The
queue's own heartbeat keeps the locks of running items alive meanwhile.

Several queues (``Worker([high, low], handler)``): each claim takes an item of
the first queue that has a free one.  While there is none the main thread
waits on one Event that every queue's view sets when it changes, bounded by
``claim_timeout`` (to look at signals and ``stop()``): the views' streaming
watches wake it for a put into any queue, and it makes no request meanwhile.
"""
from __future__ import annotations

import collections.abc
import contextlib
import contextvars
import enum
import logging
import math
import signal
import traceback as tracebacks
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import (TYPE_CHECKING, Any, Callable, Iterator, List, Optional, Sequence, Set,
                    Tuple, Union)

from .codec import IN_LOCK, failure_text
from .errors import (AuthError, ConfigError, EtcdqError, InvalidPayload, LockLost,
                     PayloadTooLarge, QueueClosed)
from .metrics import MetricsServer, WorkerMetrics, check_port
from .queue import Queue, claim_first, shared_runtime
from .runtime import SYSTEM, EventLike, InboxLike, Runtime
from .signals import StopSignals
from . import tasks as tasks_module
from .tasks import Reject, Retry, Tasks, describe

if TYPE_CHECKING:  # pragma: no cover - only for the annotations
    from .claim import Claim

__all__ = ["CANCEL_WAIT", "Handler", "ReasonOnly", "Task", "Worker", "WorkerStats",
           "current_task"]

log = logging.getLogger("etcdq_v2.worker")

#: A handler takes an item's payload and returns its result (stored with the completion).
Handler = Callable[[Any], Any]

#: Seconds a cancelled handler gets to return before its item is settled anyway.
CANCEL_WAIT = 2.0

# How often supervisors look at their handler, and the main thread at signals
# and the grace deadline: the precision of item_timeout and grace_period.
_POLL = 0.1

# Pause before claiming again after etcd could not be reached, so an outage
# is not met with a busy loop (and a flood of log lines).
_RETRY_DELAY = 1.0

@dataclass
class WorkerStats:
    """What a worker did with the items it claimed."""

    #: The handler returned and the completion was recorded.
    completed: int = 0
    #: Attempts that failed (the handler raised or overran ``item_timeout``)
    #: and whose item the queue retries after a backoff.
    attempts_failed: int = 0
    #: Attempts that failed and dead-lettered their item: its attempts were
    #: used up, or it could never succeed (``Reject``, an unknown task).
    dead_lettered: int = 0
    #: Nothing could be recorded: another claim holds the lock, or etcd did not
    #: answer.  The item comes back after its lock's TTL if it is not done.
    lost: int = 0
    #: Handed back unfinished at shutdown; claimable again at once, and the
    #: attempt is not counted (a rolling deploy uses up no attempts).
    released: int = 0

    @property
    def failed(self) -> int:
        """Every failed attempt: retried ones and those that dead-lettered."""
        return self.attempts_failed + self.dead_lettered

    def __str__(self) -> str:
        return (f"completed {self.completed}  attempts failed {self.attempts_failed}  "
                f"dead-lettered {self.dead_lettered}  lost {self.lost}  "
                f"released {self.released}")


@dataclass(eq=False)
class Task:
    """A claimed item in a worker's hands; :func:`current_task` returns it to handlers."""

    claim: "Claim"
    #: Set when the worker gives up on the item (timeout, lost lock, forced
    #: shutdown).  A handler that can stop early should watch it.
    cancelled: EventLike = field(default_factory=SYSTEM.Event)
    started: float = field(default_factory=SYSTEM.monotonic)
    result: Any = None
    error: Optional[BaseException] = None
    done: EventLike = field(default_factory=SYSTEM.Event)


class ReasonOnly(Exception):
    """A handler's failure whose reason tells it all (a command's exit status and
    stderr): the worker stores no traceback for it, which would show only the
    handler's own frames."""


class _Outcome(enum.Enum):
    FINISHED = "finished"
    TIMED_OUT = "timed out"
    LOST = "lock lost"
    ABANDONED = "shutdown"


# A context variable: each OS thread, and each of a simulator's greenlets, starts
# with its own empty context, so no runtime is needed.
_current: "contextvars.ContextVar[Optional[Task]]" = contextvars.ContextVar(
    "etcdq_current_task", default=None)


def current_task() -> Task:
    """The :class:`Task` the calling handler thread is running.

    Gives a handler what its payload does not carry: ``task.claim.id``,
    ``task.claim.attempt``, and ``task.cancelled``.  Raises RuntimeError when
    called outside a handler run by a :class:`Worker`.
    """
    task = _current.get()
    if task is None:
        raise RuntimeError("current_task() called outside a Worker's handler")
    return task


class Worker:
    """Claim items from ``queue`` and run ``handler(payload)`` on each.

    ``queue`` is a :class:`Queue`, or a sequence of Queues in priority order:
    each claim takes an item of the first queue that has a free one (see
    :func:`~etcdq_v2.queue.claim_first`), so an item of an earlier queue is
    always taken before one of a later queue when both have free items, and
    waiting for work covers every queue without polling.  The queues must be
    distinct; ``worker.queue`` is the first, ``worker.queues`` all of them.
    ``concurrency`` handlers run at once, each in its own thread.  The handler's
    return value is the item's result; an exception fails the attempt with
    ``"ExceptionType: message"`` as the reason and its traceback stored
    beside it (``ItemInfo.traceback``); :class:`~etcdq_v2.tasks.Retry` fails
    it with a retry after its delay, :class:`~etcdq_v2.tasks.Reject`
    dead-letters the item at once.  ``tasks`` (a :class:`~etcdq_v2.tasks.Tasks`),
    instead of a handler, runs each item as a call of the task it names.
    ``item_timeout`` (seconds)
    fails an attempt that runs longer, ``grace_period`` bounds a graceful
    shutdown (see the module docstring), ``claim_timeout`` is how long one
    claim waits for an item and so how quickly the main loop notices a stop.
    With ``install_signal_handlers``, :meth:`run` handles SIGTERM and SIGINT
    while it runs (only possible in the main thread; elsewhere it is skipped).

    ``metrics_port``: serve Prometheus metrics (see :mod:`etcdq_v2.metrics`;
    the ``metrics`` extra) on that port of ``metrics_addr`` from now until
    :meth:`close`, from a registry of this worker's own (``worker.metrics``);
    0 takes a free port (``worker.metrics_server.port``).
    """

    def __init__(self, queue: Union[Queue, Sequence[Queue]],
                 handler: Optional[Handler] = None, *, tasks: Optional[Tasks] = None,
                 concurrency: int = 1,
                 item_timeout: Optional[float] = None, grace_period: Optional[float] = None,
                 claim_timeout: float = 1.0, install_signal_handlers: bool = True,
                 metrics_port: Optional[int] = None, metrics_addr: str = "127.0.0.1") -> None:
        _check_positive("concurrency", concurrency, allow_zero=False)
        _check_positive("item_timeout", item_timeout, allow_zero=False)
        _check_positive("grace_period", grace_period, allow_zero=True)
        _check_positive("claim_timeout", claim_timeout, allow_zero=True)
        self.queues = _queues(queue)
        self.queue = self.queues[0]
        #: The clocks and threads of the worker: its queues' runtime.
        self.runtime = _runtime_of(self.queues)
        self.handler = _handler(handler, tasks)
        self.concurrency = concurrency
        self.item_timeout = item_timeout
        self.grace_period = grace_period
        self.claim_timeout = claim_timeout
        self.install_signal_handlers = install_signal_handlers
        self._stats = WorkerStats()
        self._stats_lock = self.runtime.Lock()
        self._tasks: Set[Task] = set()
        self._slots: List[_Slot] = []       # every slot of this run() ...
        self._idle_slots: List[_Slot] = []  # ... and those with no task
        # An RLock: stop() may be called while the main thread holds it.
        self._changed = self.runtime.Condition(self.runtime.RLock())
        self._stopping = self.runtime.Event()
        self._abandon = self.runtime.Event()
        self._grace_deadline: Optional[float] = None
        # Counted by the signal handler, read by the main thread's loops.
        self._signals = StopSignals()
        self._signals_handled = 0
        self.metrics: Optional[WorkerMetrics] = None
        self.metrics_server: Optional[MetricsServer] = None
        if metrics_port is not None:
            self._serve_metrics(metrics_port, metrics_addr)

    def _serve_metrics(self, port: int, addr: str) -> None:
        """Count into a registry of our own, the requests of our queues' transports
        too, and serve it (last: a port taken raises ConfigError, counting nothing)."""
        check_port(port)
        metrics = WorkerMetrics([queue.name for queue in self.queues])
        metrics.etcd.watch(queue.etcd for queue in self.queues)
        try:
            self.metrics_server = metrics.serve(port, addr)
        except BaseException:
            metrics.etcd.unwatch()
            raise
        self.metrics = metrics
        log.info("worker metrics at %s", self.metrics_server.url)

    # -- public --------------------------------------------------------------

    @property
    def stats(self) -> WorkerStats:
        """A snapshot of the counts so far."""
        with self._stats_lock:
            return replace(self._stats)

    @property
    def stopping(self) -> bool:
        """True once a stop was asked for: no new items are claimed."""
        return self._stopping.is_set()

    def close(self) -> None:
        """Stop serving metrics (given ``metrics_port``) and counting requests.

        ``worker.metrics`` keeps the counts; without metrics this does nothing.
        """
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None
        if self.metrics is not None:
            self.metrics.etcd.unwatch()

    def stop(self, grace: bool = True) -> None:
        """Stop claiming; release running items after ``grace_period``, or at once.

        Returns immediately; :meth:`run` carries the shutdown out and returns
        when it is done.  Safe from any thread, but not from a signal handler
        (use ``install_signal_handlers``).
        """
        with self._changed:
            if not self._stopping.is_set() and grace and self.grace_period is not None:
                self._grace_deadline = self.runtime.monotonic() + self.grace_period
            self._stopping.set()
            if not grace:
                self._abandon.set()
            self._changed.notify_all()

    def run(self, until_empty: bool = False, max_items: Optional[int] = None) -> WorkerStats:
        """Process items until stopped; return the counts.

        ``until_empty``: return once a claim finds nothing while no handler is
        running (items waiting out a retry backoff are left for later).
        ``max_items``: claim at most that many items, then finish them and return.
        A failed claim is logged and retried after a pause, whatever the error
        (etcd unreachable, a reply it refused), except AuthError, ConfigError
        and QueueClosed (a queue closed under the worker), which no retry
        mends: those release the running items and propagate.  (A closed
        queue's running items are lost at once: their handlers are cancelled.)
        """
        _check_positive("max_items", max_items, allow_zero=True)
        log.info("worker %s on %s: concurrency %d", self.queue.node_id,
                 self._names, self.concurrency)
        with self._signal_handlers():
            try:
                self._claim_loop(until_empty, max_items)
            except BaseException:
                self._abandon.set()  # hand the items back rather than leave them locked
                raise
            finally:
                self._drain()
                self._close_slots()
        stats = self.stats
        log.info("worker %s done: %s", self.queue.node_id, stats)
        return stats

    @property
    def _names(self) -> str:
        """The queues for log lines, as every message names them: "queue a" or
        "queues a, b"."""
        names = ", ".join(queue.name for queue in self.queues)
        return f"queue{'s' if len(self.queues) > 1 else ''} {names}"

    # -- the main loop ---------------------------------------------------------

    def _claim_loop(self, until_empty: bool, max_items: Optional[int]) -> None:
        claimed = 0
        while max_items is None or claimed < max_items:
            if not self._wait_for_slot():
                return
            try:
                claim = claim_first(self.queues, timeout=self.claim_timeout)
            except (AuthError, ConfigError, QueueClosed) as exc:
                log.error("cannot claim from %s: %s; stopping", self._names, exc)
                raise
            except EtcdqError as exc:  # transient, or not ours to judge: keep running
                log.error("cannot claim from %s: %s; retrying in %g s",
                          self._names, describe(exc), _RETRY_DELAY)
                self._stopping.wait(_RETRY_DELAY)
                continue
            if claim is None:
                if until_empty and self._idle():
                    log.info("%s: nothing to claim; stopping", self._names)
                    return
                continue
            self._start(claim)
            claimed += 1

    def _wait_for_slot(self) -> bool:
        """Block until fewer than ``concurrency`` items run; False once stopping."""
        with self._changed:
            while True:
                self._handle_signals()
                if self._stopping.is_set():
                    return False
                if len(self._tasks) < self.concurrency:
                    return True
                self._changed.wait(_POLL)

    def _idle(self) -> bool:
        with self._changed:
            return not self._tasks

    def _start(self, claim: "Claim") -> None:
        runtime = self.runtime
        task = Task(claim, cancelled=runtime.Event(), started=runtime.monotonic(),
                    done=runtime.Event())
        if self.metrics is not None:
            self.metrics.claimed(claim.queue)
        with self._changed:
            self._tasks.add(task)
        if self._stopping.is_set() or claim.lost:
            # A claim that returned after stop(), or lost already (its queue
            # was closed meanwhile), never reaches the handler.
            self._abandon_unstarted(task)
            return
        self._free_slot().give(task)

    def _free_slot(self) -> "_Slot":
        """An idle slot, or a new one (there is a free one for every free place:
        a slot goes idle as its task leaves ``_tasks``, see :meth:`_finish`)."""
        with self._changed:
            if self._idle_slots:
                return self._idle_slots.pop()
            slot = _Slot(self, len(self._slots) + 1)
            self._slots.append(slot)
            return slot

    def _close_slots(self) -> None:
        """End every slot's supervisor thread (all are idle now: run() drained)."""
        with self._changed:
            slots, self._slots, self._idle_slots = self._slots, [], []
        for slot in slots:
            slot.give(None)
        for slot in slots:
            slot.thread.join()

    def _abandon_unstarted(self, task: Task) -> None:
        task.done.set()
        self._finish(task, lambda: _Outcome.ABANDONED)

    def _drain(self) -> None:
        """Wait until every task is settled, releasing them when the grace period ends."""
        with self._changed:
            while self._tasks:
                self._handle_signals()
                if self._grace_expired():
                    log.warning("grace period of %g s over: releasing %d running item(s)",
                                self.grace_period, len(self._tasks))
                    self._abandon.set()
                self._changed.wait(_POLL)

    def _grace_expired(self) -> bool:
        return (self._grace_deadline is not None and not self._abandon.is_set()
                and self.runtime.monotonic() >= self._grace_deadline)

    # -- one item ----------------------------------------------------------------

    def _supervise(self, task: Task, slot: "_Slot") -> None:
        self._finish(task, lambda: self._watched(task, slot), slot)

    def _watched(self, task: Task, slot: "_Slot") -> _Outcome:
        outcome = self._watch(task, slot)
        if outcome is not _Outcome.FINISHED:
            task.cancelled.set()
            # Let a cooperative handler stop (e.g. kill its command) before the
            # item is released or failed, so it never runs twice at once.
            if not task.done.wait(CANCEL_WAIT):
                slot.retire_handler_thread()  # still in the handler: not for the next item
        return outcome

    def _watch(self, task: Task, slot: "_Slot") -> _Outcome:
        slot.run_handler(task)
        deadline = None if self.item_timeout is None else task.started + self.item_timeout
        while not task.done.wait(_POLL):
            if task.claim.lost:
                return _Outcome.LOST
            if self._abandon.is_set():
                return _Outcome.ABANDONED
            if deadline is not None and self.runtime.monotonic() >= deadline:
                return _Outcome.TIMED_OUT
        return _Outcome.FINISHED

    def _call_handler(self, task: Task) -> None:
        _current.set(task)
        try:
            task.result = self.handler(task.claim.payload)
        except BaseException as exc:  # a handler's SystemExit is a failure too, not silence
            task.error = exc
        finally:
            _current.set(None)
            task.done.set()

    def _finish(self, task: Task, outcome: Callable[[], _Outcome],
                slot: Optional["_Slot"] = None) -> None:
        """Settle the task and forget it, whatever happens on the way; its ``slot``
        goes idle as the task leaves (one step, so a slot is free for each place).

        An error no layer expected (a bug, a result or an exception of the
        handler's that breaks when encoded or printed) is logged with its
        traceback and the claim abandoned, so the item comes back after the
        lock TTL instead of being held by the heartbeat for as long as the
        worker runs; the supervisor thread never dies silently.
        """
        try:
            self._settle(task, outcome())
        except BaseException as exc:
            task.claim.abandon()
            # Only the type here: str(exc) may be what raised.
            self._count(task, "lost", f"could not be settled ({type(exc).__name__}); it "
                                      "comes back after the lock TTL", exc_info=exc)
            if not isinstance(exc, Exception):
                raise  # e.g. KeyboardInterrupt in the main thread keeps its meaning
        finally:
            if self.metrics is not None:
                self.metrics.ended(task.claim.queue)
            with self._changed:
                self._tasks.discard(task)
                if slot is not None:
                    self._idle_slots.append(slot)
                self._changed.notify_all()

    def _settle(self, task: Task, outcome: _Outcome) -> None:
        """Record the item's outcome in etcd, exactly once, and count it."""
        claim = task.claim
        try:
            if outcome is _Outcome.LOST or claim.lost:
                self._count(task, "lost", "its lock was lost; result discarded")
            elif outcome is _Outcome.ABANDONED:
                claim.release()
                self._count(task, "released", "released at shutdown")
            elif outcome is _Outcome.TIMED_OUT:
                self._fail(task, f"timed out after {self.item_timeout:g} s")
            elif task.error is not None:
                self._failed_by(task, task.error)
            else:
                self._complete(task)
        except LockLost:
            self._count(task, "lost", "another claim holds its lock; nothing recorded")
        except EtcdqError as exc:
            claim.abandon()  # else its heartbeat would hold the item as long as we run
            self._count(task, "lost", f"could not record its outcome ({exc}); "
                                      "it comes back after the lock TTL")

    def _complete(self, task: Task) -> None:
        try:
            task.claim.complete(task.result)
        except InvalidPayload as exc:
            self._fail(task, f"result cannot be stored: {exc}")
            return
        seconds = self.runtime.monotonic() - task.started
        self._count(task, "completed", f"completed in {seconds:.2f} s")

    def _failed_by(self, task: Task, error: BaseException) -> None:
        """The handler raised: Retry and Reject steer the retry; any other
        exception fails the attempt with its traceback (that of the exception
        a Retry or Reject was raised from, if any)."""
        cause = error.__cause__ if isinstance(error, (Retry, Reject)) else error
        trace = None
        if cause is not None and not isinstance(cause, ReasonOnly):
            trace = "".join(tracebacks.format_exception(type(cause), cause,
                                                        _handler_frames(cause.__traceback__)))
        if isinstance(error, Retry):
            self._fail(task, error.reason, trace, delay=error.delay)
        elif isinstance(error, Reject):
            self._fail(task, str(error) or "rejected", trace, retry=False)
        else:
            self._fail(task, describe(error), trace)

    def _fail(self, task: Task, reason: str, trace: Optional[str] = None, *,
              delay: Optional[float] = None, retry: bool = True) -> None:
        try:
            task.claim.fail(reason, traceback=trace, delay=delay, retry=retry)
        except PayloadTooLarge as exc:  # the claim is still open: fail it with a short reason
            reason = f"its reason cannot be stored: {exc}"
            task.claim.fail(reason, delay=delay, retry=retry)
        # Logged as a delay lock keeps it: it encodes (a log file or a pipe
        # need not take a lone surrogate), and a line stays a line's length.
        logged, _ = failure_text(reason, None, IN_LOCK)
        if task.claim.outcome == "dead-lettered":
            self._count(task, "dead_lettered", f"failed and dead-lettered: {one_line(logged or '')}")
        else:
            self._count(task, "attempts_failed", f"failed (retried later): {one_line(logged or '')}")

    def _count(self, task: Task, what: str, message: str,
               exc_info: Optional[BaseException] = None) -> None:
        with self._stats_lock:
            setattr(self._stats, what, getattr(self._stats, what) + 1)
        if self.metrics is not None:  # the metric's outcomes: both kinds of failure are "failed"
            outcome = "failed" if what in ("attempts_failed", "dead_lettered") else what
            seconds = self.runtime.monotonic() - task.started
            self.metrics.settled(task.claim.queue, outcome, seconds)
        level = logging.INFO if what in ("completed", "released") else logging.WARNING
        level = logging.ERROR if exc_info is not None else level
        log.log(level, "item %s (attempt %d) %s", task.claim.id, task.claim.attempt, message,
                exc_info=exc_info, extra=task.claim.log_fields)

    # -- signals ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _signal_handlers(self) -> Iterator[None]:
        if not self.install_signal_handlers:
            yield
            return
        with self._signals.installed() as installed:
            if not installed:
                log.debug("not in the main thread: SIGTERM/SIGINT handlers not installed")
            yield

    def _handle_signals(self) -> None:
        """Turn signals received since the last look into stop() calls (main thread)."""
        received = self._signals.received
        if received == self._signals_handled:
            return
        self._signals_handled = received
        name = signal.Signals(self._signals.last).name
        if received == 1:
            grace = "as long as they take" if self.grace_period is None \
                else f"{self.grace_period:g} s"
            log.warning("%s: no new claims; running items get %s to finish "
                        "(signal again to release them now)", name, grace)
            self.stop(grace=True)
        else:
            log.warning("%s again: releasing running items now", name)
            self.stop(grace=False)


class _HandlerThread:
    """A thread that runs the handler on each task it is given, one at a time."""

    def __init__(self, call: Callable[[Task], None], name: str, runtime: Runtime) -> None:
        self._inbox: "InboxLike[Optional[Task]]" = runtime.Inbox()
        runtime.Thread(self._run, args=(call,), daemon=True, name=name).start()

    def give(self, task: Optional[Task]) -> None:
        """Run ``task`` next; None: end once the handler running now returns."""
        self._inbox.put(task)

    def _run(self, call: Callable[[Task], None]) -> None:
        while True:
            task = self._inbox.get()
            if task is None:
                return
            call(task)  # Worker._call_handler: catches all the handler raises


class _Slot:
    """One of a Worker's places for an item: a supervisor thread, and the handler
    thread it gives each item to, both kept from item to item."""

    def __init__(self, worker: Worker, number: int) -> None:
        self._worker = worker
        self._number = number
        self._inbox: "InboxLike[Optional[Task]]" = worker.runtime.Inbox()
        self._handler: Optional[_HandlerThread] = None
        self.thread = worker.runtime.Thread(self._serve, daemon=True,
                                            name=f"etcdq-slot-{number}")
        self.thread.start()

    def give(self, task: Optional[Task]) -> None:
        """Supervise ``task`` next; None: end the slot (and its handler thread)."""
        self._inbox.put(task)

    def run_handler(self, task: Task) -> None:
        if self._handler is None:
            self._handler = _HandlerThread(self._worker._call_handler,
                                           f"etcdq-handler-{self._number}", self._worker.runtime)
        self._handler.give(task)

    def retire_handler_thread(self) -> None:
        """The handler overran (timeout, lost lock, shutdown) and still runs: its
        thread ends when it returns, and the next item gets a new thread."""
        if self._handler is not None:
            self._handler.give(None)
            self._handler = None

    def _serve(self) -> None:
        while True:
            task = self._inbox.get()
            if task is None:
                self.retire_handler_thread()
                return
            try:
                self._worker._supervise(task, self)
            except BaseException:  # Worker._finish logged it, settled the task and
                continue           # freed this slot: serve the next one


#: The worker's own modules, whose frames lead into every handler's traceback.
_RUNNER_FILES = {__file__, tasks_module.__file__}


def _handler_frames(tb: Optional[TracebackType]) -> Optional[TracebackType]:
    """``tb`` from the handler's first frame: the worker's and the task runner's
    own frames above it say nothing about the failure."""
    while tb is not None and tb.tb_next is not None \
            and tb.tb_frame.f_code.co_filename in _RUNNER_FILES:
        tb = tb.tb_next
    return tb


def _handler(handler: Optional[Handler], tasks: Optional[Tasks]) -> Handler:
    """The worker's handler: the one given, or ``tasks`` running the call an item
    names (with the attempt, for a task's own retry settings)."""
    if (handler is None) == (tasks is None):
        raise ConfigError("give a Worker either a handler or tasks=, not both or neither")
    if tasks is None:
        assert handler is not None
        return handler
    return lambda payload: tasks.run(payload, current_task().claim.attempt)


def one_line(text: str) -> str:
    """``text`` with its line breaks and other control characters escaped (``\\n``)."""
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
                   for char in text)


def _queues(queue: Union[Queue, Sequence[Queue]]) -> Tuple[Queue, ...]:
    """The worker's queues, in priority order; ConfigError unless distinct Queues.

    Anything but a sequence is taken as one queue, as before there could be
    several (a stand-in with a ``claim`` method included).
    """
    if not isinstance(queue, collections.abc.Sequence):
        return (queue,)
    queues = tuple(queue)
    if not queues or not all(isinstance(q, Queue) for q in queues):
        raise ConfigError(f"expected a Queue or a non-empty sequence of Queues, not {queue!r}")
    roots = [q.layout.root for q in queues]
    if len(set(roots)) != len(roots):
        raise ConfigError(f"a queue is given twice: {', '.join(roots)}")
    return queues


def _runtime_of(queues: Tuple[Queue, ...]) -> Runtime:
    """The queues' one runtime (a stand-in queue without one: the real runtime)."""
    if all(isinstance(queue, Queue) for queue in queues):
        return shared_runtime(queues)
    return getattr(queues[0], "runtime", SYSTEM)


def _check_positive(name: str, value: Optional[float], *, allow_zero: bool) -> None:
    if value is None:
        return
    # nan compares false with everything, and an infinite timeout would spin
    # Event.wait: only finite numbers (whole ones for a count) pass.
    whole = name in ("concurrency", "max_items")
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)) \
            or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        kind = "a whole number" if whole else "a finite number"
        raise ConfigError(f"{name} must be {kind} {bound}, not {value!r}")
