"""The public face of a queue: put, claim, stats, and the operator's verbs.

A :class:`Queue` binds a name to an etcd connection and delegates every etcd
write to :class:`~etcdq_v2.protocol.Protocol`.  Consumers claim from a
:class:`~etcdq_v2.view.QueueView` started on the first claim, so a claim
costs two etcd round trips however long the queue is.
"""
from __future__ import annotations

import logging
import math
import os
import socket
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set,
                    Tuple, Type, Union)

from .backoff import BackoffOption, make_backoff
from .claim import Claim, Heartbeat
from .codec import DEFAULT_MAX_PAYLOAD, Item, Junk, Lock, Record, requeued_as
from .errors import (ConfigError, InvalidArgument, NotFound, QueueClosed, Unavailable,
                     public_errors)
from .keys import Layout, check_item_id
from .overview import DEAD_LETTERS, QueueOverview, overview
from .runtime import SYSTEM, EventLike, Runtime
from .protocol import (COMPLETED, FAILED, MAX_TTL, Entry, Gone, Protocol, Taken, Version,
                       delay_ttl, finished_records, in_flight_count, item_fields, lock_states,
                       ttl_seconds)
from .transfer import export_lines, guarded, import_lines
from .transport import EventStream, Transport, connect
from .view import QueueView, wait_all_ready

log = logging.getLogger("etcdq_v2.queue")

STATES = ("pending", "running", "completed", "failed")

#: The most free items at the head of the view a claim picks among.  A lone
#: consumer takes the head (strict FIFO); each lost race widens its window
#: WINDOW_GROWTH-fold and each clean claim narrows it (by one, or an eighth
#: once calm: Queue._narrow), so concurrent consumers spread over the backlog
#: (QueueView.pick) instead of all racing for the first item.  No real cap: a
#: view with a backlog does not watch others' claims, which land at the head,
#: and only a wide spread keeps its misses rare (docs/protocol.md, "The
#: consumer's view").
CLAIM_WINDOW = 1 << 20
#: How much a lost race widens the window, and (as a fraction) a calm clean
#: claim narrows it.  64 consumers starting together on a backlog all race for the
#: head: doubling, each lost about 8 races before the windows were wide
#: enough apart (a third of a drain's failed lock creates); eightfold, about
#: 3 (docs/decisions.md, "Windows that widen eightfold, and the walk rules").
WINDOW_GROWTH = 8
#: Clean claims in a row after which the window narrows by an eighth per
#: claim, not by one (Queue._narrow): a consumer left alone is back to a
#: window of 1 (strict put order) within about 115 claims of its last miss.
CALM = 16
#: Items found gone in a row, within one claim, that show the view is behind.
STALE_VIEW = 3
#: Races lost within one claim after which the item is read (is it finished?).
#: Twice STALE_VIEW: with 32 consumers a claim lost 0.7 races on average, and
#: reading at the third cost 0.11 reads per item; a view behind by items whose
#: finishers' locks linger (F4 skipped) still lists again after 6 refused C1s,
#: fewer requests than the 3 items found gone (C1, C2, a delete each) before.
STALE_RACES = 2 * STALE_VIEW
#: Claims of one item before it is dead-lettered (docs/protocol.md, "Retention
#: and retries", says why 10).
DEFAULT_MAX_ATTEMPTS = 10
#: Seconds a completion record is kept: a day.  Dead letters are kept until purged.
DEFAULT_COMPLETED_TTL = 24 * 3600
#: Items put_many(in_flight > 1) hands to Protocol.post_items at a time: it
#: offers them to the view and reports their progress between chunks.
PUT_CHUNK = 1000
#: Seconds a wait() keeps a quiet stream before it watches again: a member that
#: vanished without closing the connection is noticed within this.
WAIT_IDLE = 60.0
#: A wait's stream that ends sooner than this is followed by a pause (growing to 1 s).
QUICK_END = 1.0


def default_node_id(runtime: Runtime = SYSTEM) -> str:
    """host name, pid and a random part (the runtime's): unique per Queue instance."""
    return f"{socket.gethostname()}-{os.getpid()}-{runtime.token()[:8]}"


@dataclass
class ItemInfo:
    """One item as ``ls``/``show``/``get``/``wait`` report it."""

    id: str
    state: str
    payload: Any
    attempts: int
    node_id: Optional[str] = None
    result: Any = None
    #: Why the last attempt failed: a dead letter's reason, or that of the
    #: failed attempt a pending item waits to retry (until its retry is due);
    #: its start (codec.REASON_LIMIT characters; LOCK_REASON_LIMIT while pending).
    reason: Optional[str] = None
    created: Optional[float] = None
    finished: Optional[float] = None
    #: The end of the failed handler's traceback (codec.TRACEBACK_LIMIT
    #: characters at most; LOCK_TRACEBACK_LIMIT while pending), beside
    #: ``reason``; None when no Python handler raised.
    traceback: Optional[str] = None
    #: A pending item held back (a delayed put, a retry's backoff): when it can
    #: next be claimed, epoch seconds on etcd's clock.  None: now.
    due: Optional[float] = None
    #: The ids followed to reach this item, the one asked for first: each was a
    #: dead letter that ``requeue`` put back as the next.  Empty: the id asked for.
    requeued_from: List[str] = field(default_factory=list)


class Counts(Dict[str, int]):
    """``stats()``: each item counted in one of pending, running, completed and
    failed (so the counts add up to the queue, as the metrics' gauge does).

    ``delayed`` is a part of pending kept out of the keys: the pending items
    held back by a delay (a delayed put, a failed attempt's backoff, a
    release's delay), not yet claimable.
    """

    delayed: int = 0


Client = Union[str, Transport, Any]


class Queue:
    """A reliable work queue in etcd v2 under ``{prefix}/{name}/``.

    ``client`` is an ``etcd.Client``, a :class:`Transport` from :func:`connect`,
    or a string of endpoint URLs.  ``lock_ttl`` is rounded up to whole seconds
    (etcd's unit); a lock expires 0 to 0.5 s after its TTL.

    ``completed_ttl`` and ``failed_ttl``: seconds a completion record and a dead
    letter are kept (rounded up; None: until purged).  ``max_attempts``: claims
    of an item before it is dead-lettered (None: never).  ``backoff``: the wait
    after a failed attempt, a sequence of seconds or ``f(attempt) -> seconds``
    (None: exponential with jitter, see :mod:`etcdq_v2.backoff`).  ``runtime``:
    where the queue's clocks, threads and randomness come from
    (:mod:`etcdq_v2.runtime`; None: its transport's, by default the real one).
    """

    def __init__(self, client: Client, name: str, *, prefix: str = "/etcdq",
                 lock_ttl: float = 30.0, node_id: Optional[str] = None,
                 max_attempts: Optional[int] = DEFAULT_MAX_ATTEMPTS,
                 max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
                 completed_ttl: Optional[float] = DEFAULT_COMPLETED_TTL,
                 failed_ttl: Optional[float] = None, backoff: BackoffOption = None,
                 runtime: Optional[Runtime] = None) -> None:
        self.layout = Layout(prefix, name)
        if lock_ttl <= 0 or (max_attempts is not None and max_attempts < 1):
            raise ConfigError("lock_ttl must be > 0 and max_attempts >= 1 (or None)")
        self.name = name
        self.lock_ttl = ttl_seconds(lock_ttl)
        self.max_attempts = max_attempts
        self.completed_ttl = _record_ttl("completed_ttl", completed_ttl)
        self.failed_ttl = _record_ttl("failed_ttl", failed_ttl)
        self.etcd = _transport(client, runtime)
        #: The clocks, threads and randomness of this queue: its transport's.
        self.runtime = self.etcd.runtime
        self.node_id = node_id or default_node_id(self.runtime)
        backoff_of = make_backoff(backoff, self.layout.root, self.runtime.random)
        self._owns_transport = not isinstance(client, Transport)
        self._protocol = Protocol(self.etcd, self.layout, node_id=self.node_id,
                                  lock_ttl=self.lock_ttl, max_attempts=max_attempts,
                                  max_payload=max_payload_bytes, backoff=backoff_of,
                                  completed_ttl=self.completed_ttl, failed_ttl=self.failed_ttl)
        self._heartbeat = Heartbeat(self._protocol)
        self._view: Optional[QueueView] = None
        self._window = 1
        self._calm = 0  # clean claims since the last miss (see _narrow)
        #: The streams of the wait() calls under way, which close() ends.
        self._waiting: Set[EventStream] = set()
        self._waiting_lock = self.runtime.Lock()
        self._view_lock = self.runtime.Lock()
        self._closed = False

    # -- producing -----------------------------------------------------------------
    def put(self, payload: Any, *, delay: Optional[float] = None) -> str:
        """Add an item; returns its id.  ``payload``: JSON-serialisable, or bytes.

        ``delay``: seconds before it can be claimed (see :meth:`put_many`).
        """
        return self.put_many([payload], delay=delay)[0]

    @public_errors()
    def put_many(self, payloads: Iterable[Any], *, delay: Optional[float] = None,
                 progress: Optional[Callable[[], Any]] = None,
                 in_flight: int = 1) -> List[str]:
        """Add items; their ids, in the order given.  Every payload is checked
        before the first is written.

        ``in_flight``: how many puts may await etcd at once.  1 (the default)
        stores the items strictly in the order given, one round trip each.
        More go faster, since etcd commits the writes in flight together
        (on loopback, 3.6x with 16 and 5x with 64 when the CPU is not busy:
        bench/README.md), and keep the order
        to within that many places: no item is stored (nor claimed by a lone
        consumer) before one given ``in_flight`` or more places earlier.
        Items are claimed in the order etcd stored them, which is their ids'
        order.  A reply lost on the way is settled by reading the queue, as
        for :meth:`put`: no item is ever stored twice.  If put_many raises,
        every item given before the first one that failed is stored, that one
        may be, and so may up to ``in_flight`` - 1 after it.

        With ``delay`` (seconds, > 0) no item can be claimed before that time
        has passed on etcd's clock, counted from its own put; it is rounded up
        to whole seconds and etcd expires its lock up to 0.5 s late.  None or
        0: claimable at once.  Items put later without a delay are not held up.
        Delayed items are put one at a time, whatever ``in_flight`` says.
        ``progress`` is called after each item is written (a progress display;
        with ``in_flight`` > 1, in bursts).
        """
        ttl = delay_ttl(delay)
        lanes = in_flight_count(in_flight)
        encoded = [(item.encode(self._protocol.max_payload), item.token)
                   for item in (self._protocol.new_item(p, delayed=bool(ttl)) for p in payloads)]
        if ttl or lanes == 1 or len(encoded) == 1:
            return [self._put_one(raw, token, ttl, progress) for raw, token in encoded]
        ids = []
        for start in range(0, len(encoded), PUT_CHUNK):
            chunk = encoded[start:start + PUT_CHUNK]
            for item_id, seen in self._protocol.post_items(chunk, lanes):
                self._offer(item_id, seen)
                ids.append(item_id)
                if progress is not None:
                    progress()
        return ids

    def _put_one(self, raw: str, token: str, ttl: int,
                 progress: Optional[Callable[[], Any]]) -> str:
        """P1, or D1-D2 with a delay lock of ``ttl`` seconds: one item, its id."""
        if ttl:
            item_id, seen, locked = self._protocol.put_delayed(raw, token, ttl)
            if self._view is not None and seen is not None:
                self._view.delayed(item_id, seen, locked, ttl)
        else:
            item_id, seen = self._protocol.post_item(raw, token)
            self._offer(item_id, seen)
        if progress is not None:
            progress()
        return item_id

    # -- consuming -----------------------------------------------------------------
    @public_errors()
    def claim(self, timeout: Optional[float] = 0) -> Optional[Claim]:
        """The next free item, or None.  ``timeout``: 0 don't wait, None forever.

        The first claim waits for the queue's first listing as long as it
        waits for an item, a deadline at least (see :meth:`_ensure_view`).
        QueueClosed after :meth:`close`, also for a claim waiting then.
        """
        deadline = _deadline(self.runtime, timeout)
        self._check_open()
        view = self._ensure_view(timeout)
        # A listing the view went on without spent the call's deadline
        # (Transport.spending): in a frozen etcd, raise after one.
        with self.etcd.spending():
            return self._claim_rounds(view, deadline)

    def _claim_rounds(self, view: QueueView, deadline: Optional[float]) -> Optional[Claim]:
        """claim()'s rounds until an item, or None at ``deadline`` (monotonic)."""
        looked_again = False
        while True:
            self._check_open()  # a close() ends the wait
            view.check_locks()  # each round: a waiting claim wakes for its checks too
            version = view.version
            claim = self._claim_from(view)
            if claim is not None:
                return claim
            if view.catch_up(self.etcd.deadline):
                # The next items are ones this process put: first learn of
                # every item put before them, by any producer (FIFO).
                continue
            # Nothing free: follow locks/ from now on.  Its first listing may
            # show items freed meanwhile: wait for it (one request's timeout).
            view.starved(self.etcd.timeout)
            remaining = None if deadline is None else deadline - self.runtime.monotonic()
            over = remaining is not None and remaining <= 0
            if view.version != version and not (over and looked_again):
                looked_again = over  # past the deadline, one more look, not a loop
                continue
            if over:
                return None
            view.wait_for_change(version, remaining)

    def _claim_from(self, view: QueueView) -> Optional[Claim]:
        """Try free items the view picks (the head, or a walk of the backlog:
        QueueView.pick, which marks each taken) until one is ours."""
        gone = taken = 0
        while True:
            candidate = view.pick(self._window)
            if candidate is None:
                return None
            item_id, seen = candidate
            try:
                state = self._protocol.claim(item_id, seen)
            except Gone as exc:
                if exc.by_us:  # its own dead letter: not another's claim, no miss
                    view.finished(item_id)
                    continue
                gone += 1
                self._found_gone(view, item_id, gone)
                continue
            except Taken as exc:
                taken += 1
                self._lost_race(view, item_id, exc, taken)
                continue
            except Junk as exc:
                log.warning("skipping item %s of %s: %s", item_id, self.layout.root, exc,
                            extra=item_fields(self.name, item_id))
                view.skip(item_id, seen)
                view.untaken(item_id)
                continue
            except BaseException:
                view.untaken(item_id)
                raise
            if state is not None:
                try:
                    view.locked_at(item_id, state.index, won=True)  # free again if our lock expires
                    self._narrow(view)
                    return Claim(state, self._protocol, self._heartbeat, view)
                except BaseException:  # no heartbeat keeps the lock: the view trusts it no more
                    view.disowned(item_id)
                    raise
            view.locked_at(item_id, 0)  # it kept changing under us: after a listing

    def _narrow(self, view: QueueView) -> None:
        """A clean claim narrows the window by one; after CALM of them in a
        row (no miss: the consumer looks alone), by a WINDOW_GROWTH-th,
        and the view walks from its head once: in put order again, not
        after a walk to the end from wherever the cursor was.
        By one only, a consumer left alone kept a window of up to 2**20 for
        as many claims, out of put order; by an eighth at
        every claim, 64 consumers' windows shrank between their lost races
        and they lost more of them."""
        self._calm += 1
        step = self._window // WINDOW_GROWTH if self._calm >= CALM else 1
        self._window = max(1, self._window - max(1, step))
        if self._calm == CALM and self._window > 1:
            view.walk_from_head()

    def _found_gone(self, view: QueueView, item_id: str, gone: int) -> None:
        """A claim found the item gone (or finished): the view drops it.  A miss
        of a quiet view, which does not hear of others' claims; or the
        STALE_VIEW-th within one claim: etcd drops a watcher that cannot keep
        up, and a busy process may be slow to notice.  Either way the view may
        list again rather than try each item it still holds."""
        view.finished(item_id)
        self._calm = 0  # another consumer took it: not alone
        if view.missed(item_id) or gone == STALE_VIEW:
            view.behind(self.etcd.deadline)

    def _lost_race(self, view: QueueView, item_id: str, lost: Taken, taken: int) -> None:
        """Another lock held the item at etcd index ``lost.index`` (see
        QueueView.locked_at): free again once a listing lacks it; the window
        widens.  A quiet view counts a miss (and may list work/ again).  A
        watching view reads the STALE_RACES-th within one claim
        (one GET): a finished item's lock is left to expire (F4 skipped), so a
        view that missed completions loses races for them instead of finding
        them gone; then it lists again as above.  Not a quiet view below its
        miss limit: each claim that widens its window at the start of a drain
        loses several races, and the read made every second one of 64
        consumers list its whole backlog again."""
        view.locked_at(item_id, lost.index, refused=lost.refused)
        self._window = min(CLAIM_WINDOW, self._window * WINDOW_GROWTH)
        self._calm = 0
        if view.missed(item_id):  # a quiet view: others' claims are news to it
            view.behind(self.etcd.deadline)
        elif (view.watching_locks and taken == STALE_RACES
              and self._protocol.left_work(item_id)):
            self._found_gone(view, item_id, STALE_VIEW)

    def _check_open(self) -> None:
        """QueueClosed after close(): its heartbeat is gone, so a claim could not
        be kept alive (nor would the view it needs be followed)."""
        if self._closed:
            raise QueueClosed(f"{self.layout.root} was closed: no claims (open a new Queue)")

    def _ensure_view(self, timeout: Optional[float] = 0) -> QueueView:
        """The view, once its first listing is in (see :func:`_ensure_views`)."""
        view = self._view
        if view is not None and view.state.ready:
            # Every claim's case, which _ensure_views would find after two locks
            # and a wait that returns at once: a dozen calls per claim saved.
            return view
        return _ensure_views([self], timeout)[0]

    def _start_view(self) -> QueueView:
        """The view, made (its follower's first listing sent) if it was not."""
        with self._view_lock:  # threads' first claims at once make one view, not orphans
            if self._view is None:
                self._view = QueueView(self._protocol)
                if self._closed:  # close() came meanwhile and saw no view: its waits end
                    self._view.close()
            return self._view

    # -- inspecting ----------------------------------------------------------------
    @public_errors()
    def stats(self, *, quorum: bool = True) -> Counts:
        """Counts of pending, running, completed and failed items (junk not counted),
        and ``.delayed``: how many of the pending are held back by a delay.

        One GET of the whole queue (see Protocol.snapshot), so the counts are
        of one moment.  ``quorum=False``: read from the member's own copy,
        without a round of consensus, as monitoring does (etcdq_v2.metrics).
        """
        found = self._protocol.snapshot(quorum=quorum)
        decode = self._protocol.decode_entries
        work = list(decode("work", found["work"]))
        locks = lock_states(found["locks"])
        waiting = [entry for entry, item in work if not item.outcome]
        running = sum(1 for entry in waiting if _is_running(locks, entry.id))
        finished = finished_records(work, {kind: decode(kind, found[kind])
                                           for kind in (COMPLETED, FAILED)})
        counts = Counts({"pending": len(waiting) - running, "running": running,
                         COMPLETED: len(finished[COMPLETED]), FAILED: len(finished[FAILED])})
        counts.delayed = sum(1 for entry in waiting if _is_delayed(locks, entry.id))
        return counts

    @public_errors()
    def items(self, state: str = "pending", limit: Optional[int] = None) -> List[ItemInfo]:
        """Items in ``state`` (pending, running, completed, failed), oldest first."""
        if state not in STATES:
            raise InvalidArgument(f"unknown state {state!r}: use one of {', '.join(STATES)}")
        if state in (COMPLETED, FAILED):
            # work/ listed first: a record is judged against the item there then
            # (record_finishes), never against one that took its id later.
            work = list(self._protocol.decoded("work"))
            records = finished_records(work, {state: self._protocol.decoded(state)})[state]
            found = [_record_info(item_id, state, records[item_id])
                     for item_id in sorted(records)]
        else:
            work, lock_entries = self._work_and_lock_entries()
            found = [_item_info(entry, item, lock_entries) for entry, item in work
                     if not item.outcome]
            found = [info for info in found if info.state == state]
        return found[:limit] if limit is not None else found

    @public_errors()
    def get(self, item_id: str) -> ItemInfo:
        """One item, wherever it is; NotFound if it is in none of the directories.

        A dead letter that was requeued is followed to the item its requeue
        made (and on, if that one was requeued too): its ``requeued_from``
        names the ids followed.
        """
        check_item_id(item_id)
        followed: List[str] = []
        while True:
            try:
                info = self._get_one(item_id)
            except NotFound:
                new_id = self._requeued_as(item_id)
                if new_id is None:
                    raise
                followed.append(item_id)
                item_id = new_id
                continue
            info.requeued_from = followed
            return info

    def _requeued_as(self, item_id: str) -> Optional[str]:
        """The id of the item a requeue made of dead letter ``item_id`` (its
        tombstone says, docs/protocol.md "requeue"); None if it was not requeued.
        A requeue names the new item by an etcd index of its own, later than
        the dead letter's: an id that is not greater is not followed (no loop)."""
        entry = self._protocol.read(FAILED, item_id)
        new_id = requeued_as(entry.value) if entry is not None else None
        if new_id is None or len(new_id) != len(item_id) or not new_id.isdigit() \
                or new_id <= item_id:
            return None
        return new_id

    def _get_one(self, item_id: str) -> ItemInfo:
        """get() of this one id; NotFound if it is in none of the directories.

        The item first, then the record that finishes it (Steps.look_step):
        after a crash inside complete() an item can be in work/ and have its
        record at once, and the record is the truth; a record of another item
        that had the id is not."""
        in_work, outcome = self._protocol.look(item_id)
        if outcome is not None:
            return _record_info(item_id, outcome[0], outcome[1])
        assert in_work is not None  # look() raised NotFound otherwise
        entry, item = in_work
        lock = self._protocol.read("locks", item_id)
        return _item_info(entry, item, {item_id: lock} if lock else {})

    @public_errors()
    def overview(self, dead_letters: int = DEAD_LETTERS) -> QueueOverview:
        """Counts, running items, the ``dead_letters`` newest dead letters and the
        finish times of the records kept: one GET of the queue, as ``stats()``
        makes, read from any member (see :mod:`etcdq_v2.overview`)."""
        return overview(self._protocol, dead_letters)

    @public_errors()
    def wait(self, item_id: str, timeout: Optional[float] = None) -> Optional[ItemInfo]:
        """Block until the item is completed or dead-lettered: its record's ItemInfo.

        None if ``timeout`` seconds (None: no limit) pass first; NotFound for an
        item that is neither pending, running nor recorded.  A watch of the
        item wakes it: etcd gets no request while it waits (one stream, opened
        again after a minute without events or when it breaks), and close()
        ends it with Unavailable.  A cancelled item is a failed one.  A dead
        letter requeued before or while it waits is followed, as by
        :meth:`get`: the outcome is that of the item its requeue made.
        """
        check_item_id(item_id)
        deadline = _deadline(self.runtime, timeout)
        pause = 0.0
        followed: List[str] = []
        while True:
            started = self.runtime.monotonic()
            try:
                found = self._wait_round(item_id, deadline)
            except NotFound:
                new_id = self._requeued_as(item_id)
                if new_id is None:
                    raise
                followed.append(item_id)  # wait for the item the requeue made
                item_id = new_id
                continue
            if found is not None:
                info = _record_info(item_id, found[0], found[1])
                info.requeued_from = followed
                return info
            if self._closed:
                raise Unavailable(f"the queue was closed while waiting for item {item_id}")
            remaining = _remaining(self.runtime, deadline)
            if remaining is not None and remaining <= 0:
                return None
            # A stream that ends at once (it broke, etcd closed it), again and
            # again, must not turn into a busy loop of requests.
            quick = self.runtime.monotonic() - started < QUICK_END
            pause = min(max(pause * 2, 0.05), 1.0) if quick else 0.0
            if pause:
                self.runtime.sleep(pause if remaining is None else min(pause, remaining))

    def _wait_round(self, item_id: str, deadline: Optional[float]
                    ) -> Optional[Tuple[str, Record]]:
        """W1-W3 once: the outcome, or None when the stream ended or time is up."""
        remaining = _remaining(self.runtime, deadline)
        if remaining is not None and remaining <= 0:
            return self._protocol.outcome(item_id)  # timeout 0: a look, no watch
        idle = WAIT_IDLE if remaining is None else min(WAIT_IDLE, remaining)
        stream = self._protocol.watch_item(item_id, idle)  # W1: before the read
        with self._waiting_lock:
            self._waiting.add(stream)
        try:
            if self._closed:
                return None
            found = self._protocol.outcome(item_id)  # W2
            return found if found is not None else self._follow(item_id, stream, deadline)
        finally:
            with self._waiting_lock:
                self._waiting.discard(stream)
            stream.release()

    def _follow(self, item_id: str, stream: EventStream, deadline: Optional[float]
                ) -> Optional[Tuple[str, Record]]:
        """W3: read events until one tells the outcome, the stream ends or time is up."""
        try:
            for block in stream.blocks():
                found = self._protocol.outcome_in(item_id, block)
                remaining = _remaining(self.runtime, deadline)
                if found is not None or (remaining is not None and remaining <= 0):
                    return found
                stream.set_idle_timeout(WAIT_IDLE if remaining is None
                                        else min(WAIT_IDLE, remaining))
        except Unavailable as exc:  # the stream broke (a member went away): watch again
            log.info("watch of item %s of %s broke (%s); watching again", item_id,
                     self.layout.root, exc)
        return None

    @public_errors()
    def cancel(self, item_id: str) -> bool:
        """Dead-letter a pending item with the reason "cancelled": True once it will
        never be handed out; False if it is running or already finished (nothing
        changes).  NotFound for an unknown id; Unavailable (nothing changed) if
        each try lost its lock, taking longer than lock_ttl (a slow link to
        etcd).  ``requeue`` brings it back.

        Racing a claim of the same item, exactly one of them wins (see
        docs/protocol.md, "cancel").
        """
        return self._protocol.cancel(item_id)

    # -- operating -----------------------------------------------------------------
    @public_errors()
    def requeue(self, item_id: str) -> str:
        """Move dead letter ``item_id`` back to work/ (attempts reset); the new id."""
        new_id, seen = self._protocol.requeue(item_id)
        self._offer(new_id, seen)  # None: it was requeued before
        return new_id

    @public_errors()
    def purge(self, *, completed: bool = False, failed: bool = False,
              progress: Optional[Callable[[], Any]] = None) -> int:
        """Remove completion records and/or dead letters; how many were removed.

        ``progress`` is called after each record is dealt with (a progress display).
        """
        kinds = [kind for kind, chosen in ((COMPLETED, completed), (FAILED, failed)) if chosen]
        return sum(self._protocol.purge(kind, progress) for kind in kinds)

    def export_items(self, state: Optional[str] = None) -> Iterator[str]:
        """The queue as JSON lines, one per item or record ("\\n"-ended), for
        :meth:`import_items`; only those in ``state`` if given (running items
        are written as pending).  Read as etcd's listings arrive: memory does not
        grow with the queue.  etcdq_v2/transfer.py describes the lines.
        """
        if state is not None and state not in STATES:
            raise InvalidArgument(f"unknown state {state!r}: use one of {', '.join(STATES)}")
        return guarded(export_lines(self._protocol, state))

    @public_errors()
    def import_items(self, lines: Iterable[Union[str, bytes]], *,
                     progress: Optional[Callable[[], Any]] = None) -> Dict[str, int]:
        """Store the items and records of :meth:`export_items`'s lines; the counts.

        A line whose put token the queue already holds is skipped, so importing
        a file twice, or again after an import that stopped half-way, stores
        each item once.  Returns how many were stored per state (pending,
        completed, failed) and how many were ``skipped``.  A bad line raises
        InvalidArgument naming it (the lines before it are stored).  One import
        at a time per queue: another waits for it (docs/protocol.md, "import").
        ``progress`` is called after each line.
        """
        return import_lines(self._protocol, lines, progress)

    def close(self) -> None:
        """Stop the background threads and end waits.

        Nothing refreshes the open claims' locks from now on, so each is
        marked :attr:`~Claim.lost` at once (a warning each): its handler
        should stop.  It may still complete(), fail() or release(): the fence
        decides, as for any lost claim; else its lock expires and the item
        runs again.  claim() and claim_first() raise QueueClosed from now on,
        also those waiting now; a claim() under way returns a claim already
        lost, or raises it.
        """
        self._closed = True
        with self._waiting_lock:
            waiting = list(self._waiting)
        for stream in waiting:
            stream.close()
        self._heartbeat.close()
        if self._view is not None:
            self._view.close()
        if self._owns_transport:
            self.etcd.close()

    def __enter__(self) -> "Queue":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Queue {self.layout.root} node={self.node_id!r}>"

    # -- helpers -------------------------------------------------------------------
    def _offer(self, item_id: str, seen: Optional[Version]) -> None:
        """An item this process wrote to work/ (or read back after a lost reply),
        at version ``seen``: claimable here before etcd's event comes.  None:
        finished, or not known: not offered."""
        if self._view is not None and seen is not None:
            self._view.added(item_id, seen)

    def _work_and_lock_entries(self) -> "tuple[List[tuple[Entry, Item]], Dict[str, Entry]]":
        locks = {entry.id: entry for entry in self._protocol.list("locks")[1]}
        return list(self._protocol.decoded("work")), locks


@public_errors()
def claim_first(queues: Sequence[Queue], timeout: Optional[float] = 0) -> Optional[Claim]:
    """The next free item of the first of ``queues`` that has one, or None.

    ``queues`` are in priority order.  One round tries each queue in turn with
    ``claim(timeout=0)`` (which makes no request while its view has nothing
    free) and takes the first item found, so an item of an earlier queue is
    always taken before one of a later queue when both have free items.
    Between rounds it waits, up to ``timeout`` (0: don't wait, None: forever),
    on one Event that every queue's view sets when it changes (its waker).
    The Event is cleared before a round, so a change during the round ends
    the wait at once, and waiting costs no request and no polling.  One queue
    is claimed from as by its own ``claim(timeout)``.

    Every queue's first listing is sent before any is waited for, and all
    are waited for in one wait on that Event, as long as the call waits for
    an item (a deadline at least; None: for ever), longer while a listing's
    bytes keep arriving (see :func:`_ensure_views`).  QueueClosed once any of
    ``queues`` was closed, also while it waits for a first listing.
    """
    if not queues:
        raise InvalidArgument("claim_first needs at least one queue")
    for queue in queues:
        queue._check_open()
    if len(queues) == 1:
        return queues[0].claim(timeout)
    runtime = shared_runtime(queues)
    deadline = _deadline(runtime, timeout)
    wake = runtime.Event()
    views = [queue._start_view() for queue in queues]  # every first listing sent
    for view in views:
        view.add_waker(wake)
    try:
        _ensure_views(queues, timeout, wake)  # one wait for all: any close() ends it
        while True:
            wake.clear()
            for queue in queues:
                claim = queue.claim(timeout=0)
                if claim is not None:
                    return claim
            remaining = None if deadline is None else deadline - runtime.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            _wait_any(views, wake, remaining)
    finally:
        for view in views:
            view.remove_waker(wake)


def _ensure_views(queues: Sequence[Queue], timeout: Optional[float],
                  wake: Optional[EventLike] = None) -> List[QueueView]:
    """The queues' views, once each one's first listing is in: waited for as
    long as the caller waits for an item (``timeout``; None: for ever), and at
    least a deadline.  A listing etcd is slow to serve, as many first listings
    of a deep queue at once are, is not a dead etcd; an error that trying
    again cannot mend is raised at once (QueueView.wait_ready), and
    QueueClosed once any of the queues was closed.  ``wake``: a waker of every
    view (QueueView.add_waker), for one wait that hears each of them
    (wait_all_ready); None: one queue, waited for on its view's condition."""
    views = [queue._start_view() for queue in queues]  # all sent before any is waited for
    wait = None if timeout is None else max(max(q.etcd.deadline for q in queues), timeout)
    while True:
        try:
            if wake is None:
                (view,) = views
                view.wait_ready(wait)
            else:
                wait_all_ready(views, wake, wait)
            return views
        except Unavailable:
            for queue in queues:
                queue._check_open()
            # A listing still arriving is not a dead etcd: wait on for it,
            # while its bytes keep coming.
            if not any(queue.etcd.arriving()
                       for queue, view in zip(queues, views) if not view.state.ready):
                raise


def _wait_any(views: List[QueueView], wake: EventLike, timeout: Optional[float]) -> None:
    """Wait for ``wake``, or until a view has a recorded orphan due (see QueueView.offer_due)."""
    for view in views:
        timeout = view.until_due(timeout)
    wake.wait(timeout)
    for view in views:
        view.offer_due()


def _transport(client: Client, runtime: Optional[Runtime]) -> Transport:
    """The queue's transport; ``runtime`` None: the given Transport's, else SYSTEM."""
    if isinstance(client, Transport):
        if runtime is not None and runtime is not client.runtime:
            raise ConfigError("a queue's runtime is its transport's: give it to connect()")
        return client
    if isinstance(client, str):
        return connect(client, runtime=runtime or SYSTEM)
    if hasattr(client, "base_uri") and hasattr(client, "http"):
        return Transport.from_client(client, runtime or SYSTEM)
    raise ConfigError(f"expected an etcd.Client, a Transport or endpoint URLs, not {client!r}")


def shared_runtime(queues: Sequence["Queue"]) -> Runtime:
    """The one runtime of ``queues``: one process's queues share their clocks and threads."""
    runtimes = {id(queue.runtime): queue.runtime for queue in queues}
    if len(runtimes) > 1:
        raise ConfigError("these queues have different runtimes: give them the same one")
    return queues[0].runtime


def _record_ttl(option: str, seconds: Optional[float]) -> Optional[int]:
    """A record TTL option in etcd's unit (whole seconds, rounded up); None keeps forever."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not 0 < seconds <= MAX_TTL:
        raise ConfigError(f"{option} must be a number of seconds > 0 (at most {MAX_TTL}), "
                          f"or None to keep records until purged; not {seconds!r}")
    return ttl_seconds(seconds)
def _deadline(runtime: Runtime, timeout: Optional[float]) -> Optional[float]:
    """runtime.monotonic() at which ``timeout`` seconds from now end; None: never."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not timeout >= 0 or math.isinf(timeout):
        raise InvalidArgument(f"timeout must be a number of seconds >= 0 or None, "
                              f"not {timeout!r}")
    return runtime.monotonic() + timeout


def _remaining(runtime: Runtime, deadline: Optional[float]) -> Optional[float]:
    return None if deadline is None else deadline - runtime.monotonic()


def _is_running(locks: Dict[str, Any], item_id: str) -> bool:
    """Under a claim's lock, or one we cannot read (UNREADABLE_LOCK: held)."""
    lock = locks.get(item_id)
    return lock is not None and not lock.delay


def _is_delayed(locks: Dict[str, Any], item_id: str) -> bool:
    """Held back by a delay lock (a delayed put, a backoff, a release's delay)."""
    lock = locks.get(item_id)
    return lock is not None and lock.delay


def _item_info(entry: Entry, item: Item, lock_entries: Dict[str, Entry]) -> ItemInfo:
    """A pending or running item; a delay lock tells when it is due, and the
    failed attempt it waits to retry (fail() wrote that into it: R1)."""
    lock_entry = lock_entries.get(entry.id)
    locks = lock_states([lock_entry] if lock_entry is not None else [])
    running = _is_running(locks, entry.id)
    info = ItemInfo(entry.id, "running" if running else "pending", item.payload, item.attempts,
                    (locks[entry.id].node_id or None) if running else None,
                    created=item.created or None)
    if lock_entry is not None and _is_delayed(locks, entry.id):
        delay: Lock = locks[entry.id]
        info.reason, info.traceback = delay.reason, delay.traceback
        info.due = _epoch(lock_entry.expiration)
    return info


def _epoch(expiration: Optional[str]) -> Optional[float]:
    """etcd's RFC 3339 ``expiration`` (nanoseconds, "Z") as epoch seconds; None if
    it has none or it cannot be read."""
    if not expiration:
        return None
    text = expiration.replace("Z", "+00:00")
    whole, dot, rest = text.partition(".")
    if dot:  # fromisoformat (3.8-3.10) takes 6 fraction digits at most
        digits = "".join(ch for ch in rest if ch.isdigit())
        text = f"{whole}.{digits[:6].ljust(6, '0')}{rest[len(digits):]}"
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _record_info(item_id: str, state: str, record: Record) -> ItemInfo:
    return ItemInfo(item_id, state, record.payload, record.attempts, record.node_id,
                    record.result, record.reason, record.created or None,
                    record.finished or None, record.traceback)



