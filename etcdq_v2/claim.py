"""A claim on one item, and the heartbeat that keeps its lock alive.

A :class:`Claim` is what :meth:`Queue.claim` hands out.  While it is open, the
queue's :class:`Heartbeat` thread refreshes its lock every ``lock_ttl / 3``
seconds with a compare-and-swap refresh (which does not wake watchers); the
refreshes due together are sent at once, so none waits for another.

:attr:`Claim.lost` is a rule, not a timer's verdict: it turns True once
``lock_ttl`` has passed since the send of the last request that proved the
lock ours (C1, or a refresh that applied), whatever the heartbeat is doing;
when a refresh finds the lock taken by another claim; or when the queue is
closed.  A warning is logged when it turns True: a handler is never silently
running without its lock.
"""
from __future__ import annotations

import logging
from types import TracebackType
from typing import Any, Callable, Dict, List, Optional, Sequence, Type, TypeVar
from typing import Protocol as TypingProtocol

from .errors import ClaimClosed, LockLost, public_errors
from .runtime import ThreadLike
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
        self._mutex = protocol.runtime.Lock()
        self._outcome: Optional[str] = None
        self._lost = False
        self._losing = protocol.runtime.Lock()  # the warning is logged once
        #: Why the heartbeat's last refresh got no answer (None: it applied).
        self._refresh_error: Optional[Exception] = None
        heartbeat.add(self)

    @property
    def lost(self) -> bool:
        """True once the lock may no longer be ours, and from then on.

        That is: another claim holds it (a refresh or a commit found so); or
        ``lock_ttl`` has passed since the send of the last request that proved
        it ours (C1, or a refresh that applied), so etcd may have expired it,
        however late the heartbeat, slow or unreachable etcd; or the queue was
        closed.  A rule read at each access, not a timer's verdict: no thread
        needs to be on time for it to be right.  Only an open claim turns lost.
        """
        if not self._lost and self._outcome is None \
                and self._protocol.lock_left(self._state.confirmed) <= 0:
            self._mark_lost(self._expired_why())
        return self._lost

    def _expired_why(self) -> str:
        why = f"its lock was not refreshed within lock_ttl ({self._protocol.lock_ttl} s)"
        error = self._refresh_error
        return why if error is None else f"{why}; the last refresh got no answer ({error!r})"

    @property
    def id(self) -> str:
        return self._state.id

    @property
    def payload(self) -> Any:
        return self._state.item.payload

    @property
    def attempt(self) -> int:
        return self._state.attempt

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

        ``traceback`` is stored beside ``reason``, in the dead letter or while
        the item waits for its retry: both made to encode, and cut (the
        reason's start, the traceback's end: codec.IN_RECORD, codec.IN_LOCK).
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
        """boot_clock() when the request that last proved the lock ours was
        sent (-inf once it was found another's)."""
        return self._state.confirmed

    def _confirm(self) -> None:
        before = self._state.confirmed
        try:
            self._protocol.confirm(self._state)
        except LockLost as exc:
            self._mark_lost(str(exc))
            raise
        self._answered_in_time(before)

    def _answered_in_time(self, before: float) -> None:
        """A refresh applied, but if its answer came only after the lock
        confirmed at ``before`` may have expired, :attr:`lost` was already
        True meanwhile: it stays so."""
        if self._protocol.lock_left(before) <= 0:
            self._mark_lost(f"its lock was refreshed only after lock_ttl "
                            f"({self._protocol.lock_ttl} s) had passed")

    def _mark_lost(self, why: str) -> None:
        with self._losing:
            if self._lost:
                return
            self._lost = True
        log.warning("lost the lock of item %s (attempt %d): %s",
                    self.id, self.attempt, why, extra=self.log_fields)

    def _beaten(self, outcome: Optional[Exception], before: float,
                interval: float) -> Optional[float]:
        """After the heartbeat's refresh (``outcome`` None: it applied) of the
        lock confirmed at ``before``: seconds until the next, or None to
        forget this claim."""
        if isinstance(outcome, LockLost):
            self._mark_lost(str(outcome))
            return None
        self._refresh_error = outcome
        if outcome is None:
            self._answered_in_time(before)
            return None if self.lost else interval
        if self.lost:  # lock_ttl since the last confirmation: no refresh can mend it
            return None
        log.info("refreshing the lock of item %s failed (%r); trying again", self.id, outcome,
                 extra=self.log_fields)
        return min(1.0, interval)  # try again soon, not a third of a TTL later


class Heartbeat:
    """One thread per queue that refreshes the locks of all its open claims.

    The claims due at once are refreshed at once (Protocol.confirm_all, on
    parallel connections): however many there are, one waits for no other,
    and a batch takes at most one request's timeout.
    """

    def __init__(self, protocol: Protocol) -> None:
        self._protocol = protocol
        self.lock_ttl = protocol.lock_ttl
        self.interval = max(self.lock_ttl / 3.0, 0.3)
        self._due: Dict[Claim, float] = {}
        self._runtime = protocol.runtime
        self._cond = self._runtime.Condition()
        self._closed = False
        self._thread: Optional[ThreadLike] = None

    def add(self, claim: Claim) -> None:
        # No notify: the thread already sleeps until a due time no later than
        # this claim's (every claim waits the same interval), and waking it
        # for every claim cost a context switch per item.
        with self._cond:
            closed = self._closed
            if not closed:
                self._due[claim] = self._runtime.monotonic() + self.interval
                if self._thread is None:
                    self._thread = self._runtime.Thread(self._run, name="etcdq-heartbeat",
                                                        daemon=True)
                    self._thread.start()
        if closed:  # a claim() that was under way when the queue closed
            claim._mark_lost(_CLOSED)

    def discard(self, claim: Claim) -> None:
        with self._cond:
            self._due.pop(claim, None)

    def close(self) -> None:
        """Stop; the open claims are marked lost at once (nothing refreshes them now)."""
        with self._cond:
            self._closed = True
            claims, self._due = list(self._due), {}
            self._cond.notify()
        for claim in claims:
            claim._mark_lost(_CLOSED)

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
                now = self._runtime.monotonic()
                due = [claim for claim, at in self._due.items() if at <= now]
                if not due:
                    soonest = min(self._due.values(), default=now + self.interval)
                    self._cond.wait(max(soonest - now, 0.01))
                    continue
            self._beat(due)

    def _beat(self, due: List[Claim]) -> None:
        """Refresh the due claims' locks, all at once; schedule each one's next."""
        started = self._runtime.monotonic()
        # A claim whose complete()/release()/fail() runs confirms itself.
        held = {claim for claim in due if claim._mutex.acquire(blocking=False)}
        try:
            delays = self._refresh([claim for claim in held
                                    if claim._outcome is None and not claim.lost])
        finally:
            for claim in held:
                claim._mutex.release()
        with self._cond:
            for claim in due:
                # Not held: its complete()/release()/fail() runs.  Held and not
                # refreshed: it ended, or is lost.
                delay = delays.get(claim) if claim in held else self.interval
                if delay is None:
                    self._due.pop(claim, None)
                elif claim in self._due:
                    self._due[claim] = started + delay

    def _refresh(self, claims: List[Claim]) -> Dict[Claim, Optional[float]]:
        """Each claim's seconds until its next refresh (None: forget it)."""
        if not claims:
            return {}
        before = [claim._state.confirmed for claim in claims]
        outcomes: Sequence[Optional[Exception]]
        try:
            outcomes = self._protocol.confirm_all([claim._state for claim in claims])
        except Exception as exc:  # confirm_all returns its errors: this would be a bug
            log.exception("the heartbeat's refreshes failed: %r", exc)
            outcomes = [exc] * len(claims)
        return {claim: claim._beaten(outcome, confirmed, self.interval)
                for claim, outcome, confirmed in zip(claims, outcomes, before)}


_CLOSED = "its queue was closed: nothing refreshes its lock"
