"""A claim on one item, and the heartbeat that keeps its lock alive.

A :class:`Claim` is what :meth:`Queue.claim` hands out.  While it is open, the
queue's :class:`Heartbeat` thread refreshes its lock every ``lock_ttl / 3``
seconds with a compare-and-swap refresh (which does not wake watchers).  If a
refresh finds the lock taken by another claim, or cannot reach etcd before the
lock would expire, the claim is marked :attr:`Claim.lost` and a warning is
logged: a handler is never silently running without its lock.
"""
from __future__ import annotations

import logging
import threading
import time
from types import TracebackType
from typing import Any, Callable, Dict, Optional, Type, TypeVar
from typing import Protocol as TypingProtocol

from .errors import ClaimClosed, LockLost, public_errors
from .protocol import COMPLETED, ClaimState, GivenBack, Protocol, delay_ttl, item_fields

log = logging.getLogger("etcdq_v2.claim")
T = TypeVar("T")


class ViewHints(TypingProtocol):
    """What a claim tells its queue's view, which would learn it from etcd a little later."""

    def returned(self, item_id: str, seconds: int, index: int) -> None: ...

    def finished(self, item_id: str) -> None: ...


class Claim:
    """An item this node holds the lock of, until complete(), release() or fail()."""

    def __init__(self, state: ClaimState, protocol: Protocol, heartbeat: "Heartbeat",
                 view: Optional["ViewHints"] = None) -> None:
        self._state = state
        self._protocol = protocol
        self._heartbeat = heartbeat
        self._view = view
        self._mutex = threading.Lock()
        self._outcome: Optional[str] = None
        self.lost = False
        heartbeat.add(self)

    @property
    def id(self) -> str:
        return self._state.id

    @property
    def payload(self) -> Any:
        return self._state.item.payload

    @property
    def attempt(self) -> int:
        return self._state.item.attempts

    @property
    def node_id(self) -> str:
        return self._state.lock.node_id

    @property
    def queue(self) -> str:
        """The name of the item's queue (a Worker may take items from several)."""
        return self._protocol.layout.name

    @property
    def log_fields(self) -> Dict[str, Any]:
        """``extra=`` for log lines about this item: queue, item_id and attempt."""
        return item_fields(self.queue, self.id, self.attempt)

    @property
    def outcome(self) -> Optional[str]:
        """None while open, then "completed", "released", "failed", "dead-lettered",
        "lost" or "abandoned"."""
        return self._outcome

    @public_errors()
    def refresh(self) -> None:
        """Refresh the lock now; LockLost (and :attr:`lost`) if it is no longer ours."""
        with self._mutex:
            self._check_open()
            self._confirm()

    @public_errors()
    def complete(self, result: Any = None) -> None:
        """Record the item in completed/ with ``result`` and remove it from work/."""
        self._end("completed", lambda: self._protocol.finish(self._state, COMPLETED,
                                                             result=result))
        if self._view is not None:
            self._view.finished(self.id)

    @public_errors()
    def release(self, delay: float = 0) -> None:
        """Give the item back; claimable again after ``delay`` seconds (rounded up).

        The attempt is given back too: the next claim reports the same
        :attr:`attempt` (a release is not a failure; fail() counts one).
        A ``delay`` that is no number from 0 to MAX_TTL (68 years) raises
        InvalidArgument, and the claim stays open.
        """
        self._returned(self._end("released", lambda: self._protocol.release(self._state, delay)))

    @public_errors()
    def fail(self, reason: str = "", *, traceback: Optional[str] = None,
             delay: Optional[float] = None, retry: bool = True) -> None:
        """This attempt failed: retry after a backoff, or dead-letter at max_attempts.

        ``traceback`` is stored beside ``reason`` (its end: codec.TRACEBACK_LIMIT
        characters), in the dead letter or while the item waits for its retry.
        ``delay``: seconds before the retry instead of the queue's backoff.
        ``retry=False`` dead-letters the item now, whatever attempts it has left.
        """
        if delay is not None:
            delay_ttl(delay)  # InvalidArgument before any write, as release() does
        def fail() -> Optional[GivenBack]:
            back_in = self._protocol.fail(self._state, str(reason), traceback=traceback,
                                          delay=delay, retry=retry)
            if back_in is None:
                self._outcome = "dead-lettered"
            return back_in
        back_in = self._end("failed", fail)
        if back_in is not None:
            self._returned(back_in)
        elif self._view is not None:
            self._view.finished(self.id)

    def _returned(self, back: GivenBack) -> None:
        """Tell the view when the item is claimable again: a quiet view hears
        of no lock's expiry, and would offer it up to a lock TTL late (review rv7)."""
        if self._view is not None:
            self._view.returned(self.id, *back)

    def abandon(self) -> None:
        """Stop refreshing the lock, without writing anything to etcd.

        The item comes back when its lock expires, as a crashed worker's
        does.  For when complete(), release() or fail() could not reach etcd
        and will not be retried: otherwise the heartbeat would keep the lock,
        and so the item, for as long as this process runs.
        """
        with self._mutex:
            if self._outcome is None:
                self._outcome = "abandoned"
            self._heartbeat.discard(self)

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        if self._outcome is not None:
            return
        if exc is None:
            self.complete()
        else:
            self.fail(str(exc) or type(exc).__name__)

    def __repr__(self) -> str:
        return (f"<Claim {self.id} attempt={self.attempt} node={self.node_id!r}"
                f"{' lost' if self.lost else ''}{' ' + self._outcome if self._outcome else ''}>")

    # -- internals ---------------------------------------------------------------
    def _end(self, outcome: str, action: Callable[[], T]) -> T:
        """Run the action that ends the claim with ``outcome``; its result."""
        with self._mutex:
            self._check_open()
            try:
                result = action()
            except LockLost:
                self._mark_lost("it was claimed again")
                self._outcome = "lost"
                self._heartbeat.discard(self)
                raise
            except ClaimClosed as exc:  # an earlier call committed the other outcome
                self._outcome = "dead-lettered" if exc.outcome == "failed" else exc.outcome
                self._heartbeat.discard(self)
                raise
            if self._outcome is None:  # fail() may have set "dead-lettered"
                self._outcome = outcome
            self._heartbeat.discard(self)
            return result

    def _check_open(self) -> None:
        if self._outcome is not None:
            raise ClaimClosed(f"the claim of item {self.id} is already {self._outcome}")

    @property
    def confirmed_at(self) -> float:
        """time.monotonic() when the lock was last proved ours (-inf after a failure)."""
        return self._state.confirmed

    def _confirm(self) -> None:
        try:
            self._protocol.confirm(self._state)
        except LockLost as exc:
            self._mark_lost(str(exc))
            raise

    def _mark_lost(self, why: str) -> None:
        if not self.lost:
            self.lost = True
            log.warning("lost the lock of item %s (attempt %d): %s",
                        self.id, self.attempt, why, extra=self.log_fields)

    def _beat(self, lock_ttl: float, interval: float) -> Optional[float]:
        """One heartbeat: seconds until the next, or None to forget this claim."""
        if not self._mutex.acquire(blocking=False):
            return interval  # complete()/release()/fail() is running: it confirms itself
        try:
            if self._outcome is not None:
                return None
            left = self.confirmed_at + lock_ttl - time.monotonic()
            with self._protocol.etcd.time_limit(max(left, 0.5)):
                self._confirm()
            return interval
        except LockLost:
            return None
        except Exception as exc:  # Unavailable, or anything unforeseen: never fatal
            return self._beat_failed(exc, lock_ttl, interval)
        finally:
            self._mutex.release()

    def _beat_failed(self, exc: Exception, lock_ttl: float, interval: float) -> Optional[float]:
        """A refresh that did not get an answer: lost once the lock would have expired."""
        if time.monotonic() - self.confirmed_at >= lock_ttl:
            self._mark_lost(f"its lock could not be refreshed before it expired ({exc!r})")
            return None
        log.info("refreshing the lock of item %s failed (%r); trying again", self.id, exc,
                 extra=self.log_fields)
        return min(1.0, interval)  # try again soon, not a third of a TTL later


class Heartbeat:
    """One thread per queue that refreshes the locks of all its open claims."""

    def __init__(self, lock_ttl: int) -> None:
        self.lock_ttl = lock_ttl
        self.interval = max(lock_ttl / 3.0, 0.3)
        self._due: Dict[Claim, float] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._thread: Optional[threading.Thread] = None

    def add(self, claim: Claim) -> None:
        # No notify: the thread already sleeps until a due time no later than
        # this claim's (every claim waits the same interval), and waking it
        # for every claim cost a context switch per item.
        with self._cond:
            self._due[claim] = time.monotonic() + self.interval
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="etcdq-heartbeat",
                                                daemon=True)
                self._thread.start()

    def discard(self, claim: Claim) -> None:
        with self._cond:
            self._due.pop(claim, None)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException:
            # It cannot go on: say so, and void the claims it was keeping alive.
            log.exception("the heartbeat thread stopped; its claims are marked lost")
            with self._cond:
                claims, self._due = list(self._due), {}
            for claim in claims:
                claim._mark_lost("the heartbeat thread stopped")
            raise

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                due = [claim for claim, at in self._due.items() if at <= now]
                if not due:
                    soonest = min(self._due.values(), default=now + self.interval)
                    self._cond.wait(max(soonest - now, 0.01))
                    continue
            for claim in due:
                self._beat(claim)

    def _beat(self, claim: Claim) -> None:
        try:
            delay = claim._beat(self.lock_ttl, self.interval)
        except Exception as exc:  # Claim._beat catches its own: this would be a bug
            log.exception("the heartbeat of item %s failed: %r", claim.id, exc,
                          extra=claim.log_fields)
            delay = min(1.0, self.interval)
        with self._cond:
            if delay is None:
                self._due.pop(claim, None)
            elif claim in self._due:
                self._due[claim] = time.monotonic() + delay
