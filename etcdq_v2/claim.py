"""A claim on one item, and the heartbeat that keeps its lock alive.

A :class:`Claim` is what :meth:`Queue.claim` hands out.  While it is open, the
queue's :class:`Heartbeat` refreshes its lock ``lock_ttl / 3`` seconds after
the send of its last confirmation, with a compare-and-swap refresh (which
does not wake watchers), each claim's on a thread of its own, so none waits
for another.

:attr:`Claim.lost` is a rule, not a timer's verdict: it turns True once
``lock_ttl`` has passed since the send of the last request that proved the
lock ours (C1, or a refresh that applied), whatever the heartbeat is doing;
when a refresh finds the lock taken by another claim; or when the queue is
closed.  A warning is logged when it turns True: a handler is never silently
running without its lock.
"""
from __future__ import annotations

import collections
import logging
import math
from types import TracebackType
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Type, TypeVar
from typing import Protocol as TypingProtocol

from .errors import ClaimClosed, LockLost, public_errors
from .runtime import ThreadLike
from .protocol import COMPLETED, ClaimState, GivenBack, Protocol, delay_ttl, item_fields

log = logging.getLogger("etcdq_v2.claim")
T = TypeVar("T")


class ViewHints(TypingProtocol):
    """What a claim tells its queue's view, which would learn it from etcd a little later."""

    def returned(self, item_id: str, seconds: int, index: int) -> None: ...

    def finished(self, item_id: str, index: int = 0) -> None: ...

    def disowned(self, item_id: str) -> None: ...


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
            self._view.finished(self.id, self._state.committed)

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
            self._view.finished(self.id, self._state.committed)

    def _returned(self, back: GivenBack) -> None:
        """Tell the view when the item is claimable again: a quiet view hears
        of no lock's expiry, and would offer it up to a lock TTL late."""
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
        self._disown()

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
                self._disown()
                raise
            except ClaimClosed as exc:  # an earlier call committed the other outcome
                self._outcome = "dead-lettered" if exc.outcome == "failed" else exc.outcome
                self._heartbeat.discard(self)
                self._disown()
                raise
            if self._outcome is None:  # fail() may have set "dead-lettered"
                self._outcome = outcome
            self._heartbeat.discard(self)
            return result

    def _disown(self) -> None:
        """Nothing keeps the lock alive any more, and no view hint says how the
        claim ended: the view no longer takes the item's sign for its own
        live claim's (ViewState.own), and checks it as any other."""
        if self._view is not None:
            self._view.disowned(self.id)

    def _unkept(self, why: str) -> None:
        """The heartbeat dropped the claim (its queue closed, its thread died):
        lost, and disowned."""
        self._mark_lost(why)
        self._disown()

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
        lock confirmed at ``before``: when the next is due (boot_clock()), or
        None to forget this claim."""
        if isinstance(outcome, LockLost):
            self._mark_lost(str(outcome))
            return None
        self._refresh_error = outcome
        if outcome is None:
            self._answered_in_time(before)
            # Due from the refresh's send, as the lock's life counts from it.
            return None if self.lost else self._state.confirmed + interval
        if self.lost:  # lock_ttl since the last confirmation: no refresh can mend it
            return None
        log.info("refreshing the lock of item %s failed (%r); trying again", self.id, outcome,
                 extra=self.log_fields)
        # Soon, not a third of a TTL later.
        return self._protocol.runtime.boot_clock() + min(1.0, interval)


class Heartbeat:
    """Keeps the locks of a queue's open claims alive, each on its own.

    A scheduler thread hands each claim, when its refresh is due
    (``lock_ttl / 3`` after the send of its last confirmation), to a refresher
    thread of its own: an idle one, or a new one.  A refresh (and a re-creation
    of its lock) runs alone on that thread, within its own lock's time left,
    and its claim is judged as soon as it returns: no claim's refresh waits
    for another's.  At most one refresh per claim is in flight, so there are
    never more refresher threads than open claims; one idle for two intervals
    ends.  A claim whose refresh is in flight when it turns lost (``lock_ttl``
    after its last confirmation's send) is disowned then by the scheduler,
    not when that refresh returns: lost stays true, and a refresh held up
    (a paused process, a slow re-creation) must not keep the view trusting
    the item's sign.  A thread that dies of an error no layer expected logs it and marks
    its claims lost; the scheduler is started again by the next claim.
    """

    def __init__(self, protocol: Protocol) -> None:
        self._protocol = protocol
        self.lock_ttl = protocol.lock_ttl
        self.interval = max(self.lock_ttl / 3.0, 0.3)
        #: Every open claim: when its next refresh is due (boot_clock()); while
        #: in flight, when it turns lost (then inf: disowned).
        self._due: Dict[Claim, float] = {}
        #: The claims handed to a refresher whose refresh has not returned.
        self._flying: Set[Claim] = set()
        self._runtime = protocol.runtime
        self._ready: Deque[Claim] = collections.deque()  # due, for the refreshers
        self._lock = self._runtime.Lock()
        self._wake = self._runtime.Condition(self._lock)   # the scheduler
        self._work = self._runtime.Condition(self._lock)   # idle refreshers
        self._wake_at = math.inf  # when the scheduler wakes by itself
        self._idle = 0
        self._closed = False
        self._thread: Optional[ThreadLike] = None

    def add(self, claim: Claim) -> None:
        with self._lock:
            closed = self._closed
            if not closed:
                self._schedule(claim, claim.confirmed_at + self.interval)
        if closed:  # a claim() that was under way when the queue closed
            claim._unkept(_CLOSED)

    def discard(self, claim: Claim) -> None:
        with self._lock:
            self._due.pop(claim, None)
            self._flying.discard(claim)

    def close(self) -> None:
        """Stop; the open claims are marked lost at once (nothing refreshes them now)."""
        with self._lock:
            self._closed = True
            claims = self._forget_all()
            self._wake.notify()
            self._work.notify_all()
        for claim in claims:
            claim._unkept(_CLOSED)

    def _schedule(self, claim: Claim, at: float) -> None:
        """(Under the lock.)  The claim's next refresh is due at ``at``."""
        self._due[claim] = at
        if self._thread is None:
            thread = self._runtime.Thread(target=self._run, name="etcdq-heartbeat", daemon=True)
            try:
                thread.start()
            except BaseException:  # not kept: the claim raises, and the next one starts a thread
                del self._due[claim]
                raise
            self._thread = thread
        elif at < self._wake_at:  # else the scheduler wakes in time: no context switch
            self._wake.notify()

    def _forget_all(self) -> List[Claim]:
        """(Under the lock.)  Drop every claim; those dropped."""
        claims = list(self._due)
        self._due.clear()
        self._flying.clear()
        self._ready.clear()
        return claims

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException:
            # It cannot go on: say so, void the claims it was keeping alive,
            # and let the next claim start another.
            log.exception("the heartbeat's scheduler stopped; its claims are marked lost")
            with self._lock:
                claims = self._forget_all()
                self._thread = None
            for claim in claims:
                claim._unkept("the heartbeat's scheduler stopped")
            raise

    def _loop(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                now = self._runtime.boot_clock()
                due = [claim for claim, at in self._due.items() if at <= now]
                if not due:
                    self._wake_at = min(min(self._due.values(), default=math.inf),
                                        now + self.interval)
                    self._wake.wait(max(self._wake_at - now, 0.01))
                    self._wake_at = -math.inf  # awake: whoever schedules need not notify
                    continue
                overdue = self._hand_over(due)
                missing = len(self._ready) - self._idle
            for claim in overdue:  # lost while its refresh is in flight: nothing keeps the lock
                if claim.lost:
                    claim._disown()
            for _ in range(missing):
                self._runtime.Thread(target=self._refresher, name="etcdq-refresh",
                                 daemon=True).start()

    def _hand_over(self, due: List[Claim]) -> List[Claim]:
        """(Under the lock.)  Hand the due claims to the refreshers, due again
        when each turns lost; those whose refresh was in flight already: they
        turned lost meanwhile (due no more)."""
        overdue = [claim for claim in due if claim in self._flying]
        for claim in overdue:
            self._due[claim] = math.inf
        handed = [claim for claim in due if claim not in self._flying]
        for claim in handed:
            self._due[claim] = claim.confirmed_at + self.lock_ttl
            self._flying.add(claim)
        self._ready.extend(handed)
        self._work.notify(len(handed))
        return overdue

    def _refresher(self) -> None:
        """Refresh the due claims handed over, one at a time, until idle too long."""
        while True:
            with self._lock:
                while not self._ready and not self._closed:
                    self._idle += 1
                    woken = self._work.wait(2 * self.interval)
                    self._idle -= 1
                    if not woken and not self._ready:
                        return
                if self._closed:
                    return
                claim = self._ready.popleft()
                if claim not in self._due:  # discarded meanwhile
                    continue
            try:
                delay = self._beat(claim)
            except BaseException:
                log.exception("the heartbeat's refresh of item %s failed unexpectedly; its "
                              "claim is marked lost", claim.id, extra=claim.log_fields)
                self.discard(claim)
                claim._unkept("its heartbeat stopped on an unexpected error")
                raise
            with self._lock:
                self._flying.discard(claim)
                if claim not in self._due or self._closed:
                    continue  # ended, discarded or closed meanwhile
                if delay is None:
                    del self._due[claim]
                else:
                    self._schedule(claim, delay)
            if delay is None:  # lost (or ended: then the view was told already)
                claim._disown()

    def _beat(self, claim: Claim) -> Optional[float]:
        """Refresh the claim's lock; when its next refresh is due (None: forget it)."""
        if not claim._mutex.acquire(blocking=False):
            # Its complete()/release()/fail() runs (and confirms the lock itself).
            return self._runtime.boot_clock() + min(1.0, self.interval)
        try:
            if claim._outcome is not None or claim.lost:
                return None
            before = claim.confirmed_at
            outcome = self._protocol.confirm_in_time(claim._state)
            return claim._beaten(outcome, before, self.interval)
        finally:
            claim._mutex.release()


_CLOSED = "its queue was closed: nothing refreshes its lock"
