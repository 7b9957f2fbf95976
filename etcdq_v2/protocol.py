"""The queue protocol: every etcd write etcdq_v2 makes, in the order that keeps it safe.

etcd v2 has no multi-key transaction, so each operation below is a sequence
of single-key conditional writes, ordered so that a crash (or a lost reply)
between any two of them loses no item, loses no completion record, and never
hands out an item that has a completion record.  docs/protocol.md says the
same at more length.

Put and put_many (P1, with the read-back of a lost reply), the delayed
put (D1, D2), requeue (Q0-Q5), cancel (K1-K4), purge, import's I1, I3 and I4, the claim
(C1-C3), the commit (F1-F4), release and fail (R0, R1) and the heartbeat's
refresh are written as generator steps without I/O in steps.py;
the methods of :class:`Protocol` of the same names run them on the transport
(driver.run).  The other operations below send their requests here, each
through driver.send as a step's are.

Values (see codec.py): an item carries its put token ``t``, its claim count
``a`` and the token of its latest claim ``c``; a lock carries the claimer's
node id and claim token (a delayed put's lock: its put token).

put
    P1. POST ``work/`` with a fresh token.  If the reply is lost, quorum
        listings of work/, completed/ and failed/ are searched for the token:
        found -> that is our item; not found -> Unavailable (the request may
        still apply later, so it is never resent: no duplicate, ever; with
        record TTLs under the deadline it may also have run, its record gone).
    A payload nested deeper than MAX_DEPTH is refused before P1 (a result,
    before F1).  Stored payloads are written back unchecked (C2, C3, R0, F1,
    F2, Q1, Q3, K3): one that decoded is ours, however deep.

put_many(in_flight=N), N > 1
    P1 for each item, N POSTs awaiting etcd at once, each on a connection of
    its own, sent in the order given; an item goes only once the one N places
    before it was stored, so none is stored before one given N or more places
    earlier (etcd orders the POSTs in flight).  noValueOnSuccess: the name is
    the reply's X-Etcd-Index.  At the first failure nothing more is sent; the
    POSTs in doubt (no reply) are looked for by token, in one pass (not found
    -> Unavailable); then the rest follows.  Nothing is resent.  One POST per
    connection: a connection cut mid-reply holds one POST, which etcd applied.
    New connections are probed together: each answers within one timeout of
    the probes' send, or carries nothing (none: the next member).

delayed put (delay > 0)
    D1. POST ``locks/`` with ttl=delay (whole seconds, rounded up) and a delay
        lock {node, put token, "d"}; etcd names it ``locks/<m>``.  A lost
        reply: POST another (one that applied is an orphan: no item, expires).
    D2. PUT ``work/<m>`` prevExist=false: the item (put token, a=0, ``q``).  No
        POST can take the name m, the index of our own D1.  "Already exists"
        after a resent PUT is read back (our put token: ours); unanswered until
        the deadline -> Unavailable, and the item is stored at most once.
    The item exists only once its lock does, so it is claimable only after
    etcd expired the lock: never early.  Crash after D1: an orphan lock
    expires, nothing is stored.  ``q``: a copy of D2 held in flight that lands
    after the item finished creates it again; its first claim finds the
    record (C3) and removes it.

claim(id)            (the caller picked ``id`` from its view of work/ and locks/)
    C1. PUT ``locks/<id>`` prevExist=false, ttl=lock_ttl, value {node, token}.
        "Already exists" -> another claim has it (unless our own resent PUT
        made it: then the value is ours).
    C2. CAS ``work/<id>`` prevIndex=<index in our view>: a+1, c=token.  This is
        the check that the item is still there and unchanged, so a stale
        listing never runs a finished item: a deleted item fails with "not
        found" and we drop our lock; a changed one is read again.
    C3. If the item was claimed before (``a`` >= 1) or carries ``q`` (requeued,
        or a delayed put), GET ``completed/<id>`` and ``failed/<id>``: a record
        there was written by 0.1.0 (whose record was its commit) before a
        crash, or the item was re-created by a requeue resumed late or a late
        copy of D2; remove it, hand nothing out.  A record (or tombstone) of
        another put token ("t") is another item's that had the id (etcd
        restored from an older backup gives ids again): it does not count.
        An item carrying an outcome (``o``, its finisher crashed after F1) is
        finished instead (F2-F4), before C2, on a version read (quorum), never
        on the view's: it may have left work/ since, its record purged.
        If ``a`` >= max_attempts, dead-letter the item (F1-F4) instead.
        Past lock_ttl/2 since C1 was sent (a slow C2 reply, a stall; a clock
        that runs while the host is suspended), refresh the lock on our value:
        its createdIndex must be C1's.  A lock that lapsed (re-created by a late
        copy of C1, or expired: created again) -> CAS the item, unchanged, on
        our C2 index (a cancel between its K2 and K3 then fails K3).  Another's
        lock, or that CAS failing -> hand nothing out: Taken while the item is
        in work/ without "o", else Gone.  Within lock_ttl/2 the lock is ours:
        etcd expires it no sooner than lock_ttl after C1.
        Only now is the claim handed out.
    Crash after C1: the lock expires, the item is free again, nothing counted.
    Crash after C2: the lock expires, the next claim counts attempt a+2 (a
    SIGKILLed worker's attempt counts, so max_attempts bounds poison items).

complete / dead-letter (``kind`` = completed or failed)
    F1. The fenced commit: CAS ``work/<id>`` prevIndex=<our C2 index>, writing
        the record plus ``"o": kind`` into the item.  etcd compares the index,
        so this applies only if no claim took the item since ours (any later
        C2 changed the index), however late the request arrives: a held or
        resent request of a stale claim fails, and the caller gets LockLost
        with nothing written.  Only one CAS from that index can apply, so the
        item has exactly one outcome across completed/ and failed/.
        "Compare failed"/"not found" on a resent request is read back: the
        item (or, once finished, its record) carrying our token is ours.
    F2. PUT ``<kind>/<id>`` prevExist=false, ttl=<the TTL of kind>
        (completed_ttl, failed_ttl; none: kept until purged; at least a week,
        TOMBSTONE_TTL, for an item with ``q``, which a late Q3 or D2 copy can
        re-create: its first claim must find the record), with the record
        (the value F1 wrote, less "o").  "Already exists" with our claim
        token is a resent PUT or a claimer that finished our item for us
        (below): fine.  "Already exists", then gone when read back (it
        expired, or was purged): F2 again (bounded) if the item is still in
        work/ at F1's index; an item gone too (purged with its record, or
        finished by another claimer) is not recorded again.  Another claim's
        record of this item (our put token, or none: 0.1.0's) stays.  One of
        another put token (another item that had the id, before a restore
        from an older backup): CAS it on its index while work/<id> is still
        the item F1 wrote ("compare failed"/"not found": F2 again); if it is
        not, our F1 applied in the history etcd lost: the record stays.
        Once a read showed work/<id> is not F1's item, F3 is not sent.
    F3. compareAndDelete ``work/<id>`` prevIndex=<F1's index>.
    F4. Only if lock_ttl > LINGER_MAX (60 s): compareAndDelete ``locks/<id>``
        prevValue=<our lock>, sent together with F3.  Otherwise (the default
        30 s) the lock is left to expire: it holds no item once F3 applied,
        and every reader counts only locks of items in work/.  One write and
        one request less per item; a stale view's C1 on the finished item
        fails ("already exists": Taken) instead of C1, a failed C2 and a delete.
    Crash after F2 found another item's record, or its CAS's reply lost: the
    next claimer's F2 (or the resent CAS, "compare failed", then F2 again)
    finds it, or our record: written once.
    Crash after F1 or F2: the item stays in work/ with its outcome; when the
    lock expires the next claimer's C2 finds "o", does F2 and F3 itself and
    hands nothing out: the item never runs again.  If nobody claimed it until
    its record expired, the item still carries the outcome: that claimer's F2
    writes the record again (its own TTL) before F3.  After F3 (the normal end
    without F4, or a crash before it): a lock without an item, which expires.
    F1 needs no lock check before it (no refresh): the index is the fence, so
    a claim whose lock merely expired, with nobody claiming the item since,
    still completes.

release(delay) / fail with retries left
    R0. release only: CAS ``work/<id>`` prevIndex=<our C2 index>: a-1, the
        claim token unchanged (a release gives its attempt back; a failure
        counts).  "Compare failed"/"not found": read back; our token with
        a-1 is our resent R0, our token with an outcome an earlier commit of
        ours (ClaimClosed), else LockLost.  Crash after R0: the lock expires,
        the next claim reports the same attempt.  The claim keeps one version
        (ClaimState: the value and index of its latest write, set together):
        a fail() after a release whose R1 went unanswered writes ``a`` back
        on R0's index first, so the failure counts.
    R1. delay = 0: compareAndDelete ``locks/<id>`` on our lock value.
        delay > 0: CAS the lock into a "delay" lock with ttl=delay, so the
        item is claimable again when etcd (not a client clock) expires it.
        fail() uses the queue's backoff for the delay (cut to MAX_TTL, 68 years;
        release(delay) beyond it -> InvalidArgument before R0).
        If our lock had expired, the same checks as F1 apply.  A CAS refused
        on our own delay lock (a resent R1, a retried call) is known by our
        claim token, whatever reason it carries.  fail()'s reason and
        traceback are made to encode and cut short first (codec.failure_text).

requeue(id)          (a dead letter back to work/)
    Q0. Create ``locks/<id>`` (prevExist=false): one requeue at a time.  The
        lock its finisher left (F4 skipped: the record's claim token), once the
        item left work/, is taken over by CAS on its value.
    Q1. CAS ``failed/<id>`` adding a requeue token (or reuse one already there),
        with the TTL it has left (a CAS without ttl makes a key permanent) but
        at least a week, TOMBSTONE_TTL (none stays none): a requeue that dies
        after Q3 (no Q4) leaves the key taken against a late F2 as long as a
        tombstone would; m = the index of that write.
    Q2. Remove the dead letter's own item if a crash left it in work/.
    Q3. PUT ``work/<m>`` prevExist=false: the new item, with ``"q"`` (its first
        claim runs C3).  No POST can take the name m; a resent or resumed
        requeue computes the same name and gets "already exists".
    Q4. CAS ``failed/<id>`` (on Q1's index) into a tombstone with a week's
        TTL, so that a late F2 finds the key taken; it keeps the put token
        (``"t"``: import's I2 reads it).  "Not found" (the dead
        letter was purged, or expired: a week after Q1 at least): create the
        tombstone, prevExist=false.
        A late F2 that took the key first (the same claim token) is turned
        into the tombstone; anything else there is left, with a warning.
        Q5. Drop the lock.

cancel(id)           (a pending item to failed/, reason "cancelled")
    K1. PUT ``locks/<id>`` prevExist=false, ttl=lock_ttl: a delay lock ("d") with a
        fresh token, so the item stays "pending" for stats.  "Already exists": a
        delay lock (a release's backoff, a delayed put, a cancel) is taken over
        by CAS on its value with ttl=max(lock_ttl, its ttl left); another lock
        is a claim's -> False.
    K2. Read ``work/<id>`` (quorum).  Committed ("o") or recorded (as C3: any
        key in completed/ or failed/, a tombstone too, but for one of another
        put token; the item, re-created by a late Q3 or D2, is removed) -> drop
        our lock, False; neither in work/
        nor recorded -> NotFound.  On NotFound or
        any error (Unavailable) a delay lock we took over is left to expire,
        never dropped: the item it held back (or a delayed put's item, yet to
        come) is not claimable before its time.
    K2'. Read ``locks/<id>`` (quorum): still the lock K1 wrote (its index and
        value)?  Else it lapsed (we stalled past lock_ttl) and a claim may hold
        the item, handed out before K2 read it: drop ours, start again at K1
        (3 rounds; then Unavailable, not False: the item may be pending).
    K3. F1 on K2's index: the dead letter (attempts unchanged, "o": failed) into
        the item.  A claim after K2' changes that index, so K3 fails.  "Compare
        failed": read it again; an outcome (another cancel's K3) or a new claim
        token (a claim's C2 held in flight past its lock) -> drop our lock,
        False; neither (a release's R0 held past its lock: a-1, the token
        kept) -> K2, K2', K3 again (bounded).
    K4. F2-F4 with our lock; with F4 skipped, our lock expires, but one taken
        over from a delay lock (its TTL may be hours) is deleted.
    Crash after K1: the lock expires (a delay lock taken over no sooner than it
    would have), the item is pending again.  Crash after K3: the item carries
    "o"; the next claimer does F2-F4 and hands nothing out.  The lock keeps
    claims off while we work; K3 and C2 are CASes on the same index, so of a
    cancel and a claim exactly one wins (a claim whose C2 reply came after its
    lock expired confirms the lock at C3: not handed out).  A handler whose
    lock expired (heartbeat starved) may still run when cancel returns True;
    its outcome is refused (LockLost: K3 moved the fence).

wait(id)             (reads only)
    W1. Open a stream watch of ``work/<id>`` (registered now), THEN
    W2. read as get() does: a record, or "o" in the item -> return it;
        neither pending nor recorded (junk counts as nothing) -> NotFound.
    W3. Each event: a value with "o" is the record (F1); a removal -> read the
        records (none: NotFound); a claim's C2 -> keep waiting.  A stream that
        ends (a minute without events, a member gone) -> W1 again.

stats                (reads only)
    S1. One recursive GET of the queue's directory (quorum, or the member's
        own copy for monitoring): all four directories at one etcd index.
        pending: no "o", no claim lock (a delay lock is pending); running: a
        claim lock (an unreadable lock counts as held); completed/failed: the
        records and the items carrying that "o", each id once.
        A reply too deep to decode (a directory ~500 deep in the queue's
        directory, junk) -> four listings instead, not recursive: junk never
        makes stats fail.

overview and queue names    (reads only: Queue.overview, the dashboard)
    GET ``{prefix}`` (not recursive: the children without their contents) for
    the queue directories; then each queue as S1 reads it (one recursive
    GET).  Serializable reads (any member answers from its store, no raft
    round): a display may lag; nothing is decided on it.
export               (reads only)
    List locks/ (keeping the running ids), then work/, completed/, failed/
    (quorum), each decoded as its listing arrives (memory: one entry): a line
    per item or record, with its put token; running -> pending, an item with
    "o" -> its record.  Each listing is a snapshot: stop the workers first.

import(lines)
    I1. PUT ``locks/<0 * 20>`` prevExist=false, ttl=lock_ttl: one import at a time
        (held: wait, bounded).  No item has id 0.  Its index m names the first key.
    I2. List work/, completed/, failed/ (quorum, streamed): the put tokens present
        (a requeued dead letter's in its tombstone).
        The lock counts as fresh from before I1 was sent; refreshed (I4) every
        lock_ttl/3 during I2, and once after it, before the first write.
    I3. Per line: its token present -> skip.  Else PUT ``work/<m>`` (the item,
        with ``q``) or ``completed|failed/<m>`` (the record, its kind's TTL)
        prevExist=false; the index of this write is the next m.  No POST can
        take m, the index of our own write.  "Already exists" after a resend:
        our token there -> its createdIndex is the next m; gone -> I4.
    I4. CAS refresh of the import lock: its index (ours) is a fresh m.  Also
        every lock_ttl/3; lock lost (a stall) -> LockLost, stop.
    I5. Drop the lock.
    Crash anywhere: a re-run skips what is stored (the tokens).  A held copy
    of I3 landing after its item finished: ``q``, its first claim removes it.

Refreshes (heartbeats) are CAS refreshes (refresh=true, prevValue=lock): they
extend the TTL without notifying watchers.  Each claim's refresh is a request
of its own on a thread of its own, within its lock's time left
(confirm_in_time), so none waits for another; a claim is lost once
lock_ttl has passed since the send of its last confirmed refresh (or C1),
on boot_clock(), whether or not a refresh is under way (lock_left).
"""
from __future__ import annotations

import contextlib
import json
import logging
from typing import (Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple,
                    Union)

from .codec import Item, Junk, Lock, Record, check_outcome, tombstone_token
from .errors import EtcdqError, InvalidArgument, KeyMissing, NotFound
from .keys import DIRS, Layout, check_prefix, is_queue_name
from . import driver
from .driver import run
from .runtime import SYSTEM
# Re-exported: the names callers know the protocol's by.
from .steps import CANCELLED as CANCELLED
from .steps import COMPLETED as COMPLETED
from .steps import FAILED as FAILED
from .steps import LINGER_MAX as LINGER_MAX
from .steps import TOMBSTONE_TTL as TOMBSTONE_TTL
from .steps import ClaimState as ClaimState
from .steps import IMPORT_LOCK as IMPORT_LOCK
from .steps import GivenBack as GivenBack
from .steps import ImportState as ImportState
from .steps import Gone as Gone
from .steps import Held, Look, Request, Steps
from .steps import Taken as Taken
from .steps import item_fields as item_fields
from .steps import finished_records as finished_records
from .steps import record_finishes as record_finishes
from .steps import put_token
from .steps import ttl_seconds as ttl_seconds
from .transport import EventStream, Reply, Transport, UndecodableReply
from .versions import Entry as Entry
from .versions import Version as Version

log = logging.getLogger("etcdq_v2.protocol")



#: The longest TTL etcdq writes from a number it was given (68 years): put and
#: release delays, backoffs, record TTLs.  etcd v2 refuses a TTL past int64
#: (HTTP 400) and mishandles those from about 9.2e9 s, which overflow its
#: nanosecond clock: such a key never expires, or expires at a wrong time.
MAX_TTL = 2**31 - 1

#: The most POSTs a put_many may have in flight at once (``in_flight``): one
#: connection each (Steps.post_many_step).
MAX_IN_FLIGHT = 64



def boot_clock() -> float:
    """The real runtime's boot clock (:meth:`Runtime.boot_clock`); a protocol
    reads its own runtime's."""
    return SYSTEM.boot_clock()


def delay_ttl(delay: Optional[float]) -> int:
    """A put's or a release's ``delay`` as a lock TTL: whole seconds, rounded up;
    0 for none (None or 0).  InvalidArgument unless from 0 to MAX_TTL."""
    if delay is None:
        return 0
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) \
            or not 0 <= delay <= MAX_TTL:
        raise InvalidArgument(f"delay must be a number of seconds from 0 to {MAX_TTL} "
                              f"(or None), not {delay!r}")
    return ttl_seconds(delay) if delay > 0 else 0


def in_flight_count(in_flight: int) -> int:
    """put_many's ``in_flight``: InvalidArgument unless a whole number from 1 to
    MAX_IN_FLIGHT."""
    if isinstance(in_flight, bool) or not isinstance(in_flight, int) \
            or not 1 <= in_flight <= MAX_IN_FLIGHT:
        raise InvalidArgument(f"in_flight must be a whole number from 1 to {MAX_IN_FLIGHT}, "
                              f"not {in_flight!r}")
    return in_flight


def queue_names(transport: Transport, prefix: str) -> List[str]:
    """The queues under ``prefix``: a plain (not recursive) GET of its directory,
    whose children are listed without their contents.  Only directories whose
    name is a valid queue name count; none when the prefix does not exist yet.
    A serializable read (any member answers from its own store): for display."""
    try:
        reply = driver.send(transport, Request("GET", check_prefix(prefix), sorted=True))
    except KeyMissing:
        return []
    names = []
    for node in reply.node.get("nodes") or []:
        name = str(node.get("key", "")).rsplit("/", 1)[-1]
        if node.get("dir") and is_queue_name(name):
            names.append(name)
    return names


class Protocol(Steps):
    """The queue's writes and reads on etcd, for one queue and one node id.

    The threaded driver of the steps (steps.py): each of their methods runs
    one step with :func:`~etcdq_v2.driver.run` on this queue's transport."""

    def __init__(self, transport: Transport, layout: Layout, *, node_id: str, lock_ttl: int,
                 max_attempts: Optional[int], max_payload: int,
                 backoff: Callable[[int], float], completed_ttl: Optional[int] = None,
                 failed_ttl: Optional[int] = None) -> None:
        super().__init__(layout, node_id=node_id, lock_ttl=lock_ttl, max_attempts=max_attempts,
                         max_payload=max_payload,
                         record_ttls={COMPLETED: completed_ttl, FAILED: failed_ttl})
        self.etcd = transport
        #: The transport's runtime: the clocks, locks and tokens of this queue.
        self.runtime = transport.runtime
        self.backoff = backoff

    # -- P: put ------------------------------------------------------------
    def post_item(self, raw: str, token: str) -> Tuple[str, Optional[Version]]:
        """P1 (:meth:`Steps.post_step`): the new item's id and version; a lost reply
        is resolved by token, or Unavailable."""
        return run(self.post_step(raw, token), self.etcd)

    def find_put(self, token: str) -> Optional[Tuple[str, Optional[Version]]]:
        """The id and version of the item put with ``token``, wherever it is now."""
        return self.find_puts({token}).get(token)

    def find_puts(self, tokens: Set[str], floor: int = 0
                  ) -> Dict[str, Tuple[str, Optional[Version]]]:
        """:meth:`Steps.find_puts_step`: where the items put with ``tokens`` are now."""
        return run(self.find_puts_step(tokens, floor), self.etcd)

    def post_items(self, items: Sequence[Tuple[str, str]], in_flight: int
                   ) -> List[Tuple[str, Optional[Version]]]:
        """P1 for many items, ``in_flight`` at once (:meth:`Steps.post_many_step`):
        the id and version of each (raw, token), in that order."""
        return run(self.post_many_step(items, in_flight), self.etcd)

    def new_item(self, payload: Any, *, delayed: bool = False) -> Item:
        """A new item for P1, or for D2 (``delayed``): marked ``q``, so that its
        first claim checks for records (C3), since a late copy of D2 could
        create it again after it finished."""
        return Item(payload, self.runtime.token(), created=self.runtime.wall(), requeued=delayed)

    # -- D: delayed put ------------------------------------------------------
    def put_delayed(self, raw: str, token: str, ttl: int
                    ) -> Tuple[str, Optional[Version], int]:
        """D1, D2 (:meth:`Steps.put_delayed_step`): (id, version, lock index) of an
        item claimable after ``ttl`` seconds (version None: already finished)."""
        return run(self.put_delayed_step(raw, token, ttl), self.etcd)

    # -- C: claim ----------------------------------------------------------
    def claim(self, item_id: str, seen: Version) -> Optional[ClaimState]:
        """Try to claim one item seen at version ``seen``; None if it kept changing
        under us: C1 (:meth:`_create_lock`), then C2 and C3 (:meth:`Steps.take_step`).

        Raises Taken if another claim holds its lock, Gone if the item is no
        longer in work/ or is finished, and Junk if it is not one of ours (the
        caller skips it).
        """
        lock = Lock(self.node_id, self.runtime.token())
        since = self.runtime.boot_clock()
        locked = self._create_lock(item_id, lock, self.lock_ttl)
        return run(self.take_step(item_id, Held(lock, locked, since), seen), self.etcd)

    def _create_lock(self, item_id: str, lock: Lock, ttl: int) -> int:
        """C1 (:meth:`Steps.lock_step`): the lock's index, or Taken."""
        return run(self.lock_step(item_id, lock, ttl), self.etcd)

    # -- heartbeat ---------------------------------------------------------------
    def lock_left(self, confirmed: float) -> float:
        """Seconds for which a claim's lock confirmed at ``confirmed``
        (ClaimState.confirmed) is certainly still alive (<= 0: it may have
        expired), on boot_clock(): etcd keeps a lock at least lock_ttl after
        the request that created or refreshed it applied, which is after it
        was sent; TTLs are whole seconds, rounded up."""
        return confirmed + self.lock_ttl - self.runtime.boot_clock()

    def confirm(self, state: ClaimState) -> None:
        """Claim.refresh() (:meth:`Steps.confirm_step`): make sure the lock is ours,
        or raise LockLost."""
        run(self.confirm_step(state), self.etcd)

    def confirm_in_time(self, state: ClaimState) -> Optional[EtcdqError]:
        """The heartbeat's confirm(): it gives up once the lock may have expired
        (no use after that), retrying on the next member meanwhile.  None
        (confirmed: ``state.confirmed`` is this call's start), LockLost, or the
        error that left it unconfirmed (the heartbeat tries again, or the
        claim is lost by then)."""
        try:
            with self.etcd.time_limit(max(self.lock_left(state.confirmed), 0.05)):
                self.confirm(state)
        except EtcdqError as exc:
            return exc
        return None

    # -- F: complete, dead-letter --------------------------------------------
    def finish(self, state: ClaimState, kind: str, *, result: Any = None,
               reason: Optional[str] = None, traceback: Optional[str] = None,
               attempts: Optional[int] = None) -> None:
        """F1-F4: commit ``kind`` (completed or failed) on the item, record it, remove it.

        The value is :meth:`Steps.outcome_value`'s (checked before any write);
        F1 is :meth:`_commit`, F2-F4 :meth:`finish_committed`, as
        :meth:`Steps.finish_step` runs them."""
        marked = self.outcome_value(state, kind, self.runtime.wall(), result=result,
                                    reason=reason, traceback=traceback, attempts=attempts)
        committed = self._commit(state, kind, marked)
        if committed is not None:
            self.finish_committed(state.id, committed, state.lock)

    def _commit(self, state: ClaimState, kind: str, marked: str) -> Optional[Entry]:
        """F1 (:meth:`Steps.commit_step`): the item as committed, None if it is
        already finished, or LockLost."""
        return run(self.commit_step(state, kind, marked), self.etcd)

    def finish_committed(self, item_id: str, entry: Entry, lock: Optional[Lock]) -> None:
        """F2-F4 (:meth:`Steps.record_step`) for an item whose F1 applied."""
        run(self.record_step(item_id, entry, lock), self.etcd)

    # -- R: release, fail ----------------------------------------------------
    def release(self, state: ClaimState, delay: Optional[float] = 0) -> GivenBack:
        """R0, then R1 (:meth:`Steps.release_step`): give the attempt back, then the
        item (now, or after ``delay``).  Returns R1's :data:`GivenBack`.

        A ``delay`` that is no number of seconds from 0 to MAX_TTL raises
        InvalidArgument before any write.
        """
        return run(self.release_step(state, delay_ttl(delay)), self.etcd)

    def _give_back(self, state: ClaimState) -> None:
        """R0 alone (:meth:`Steps.give_back_step`)."""
        run(self.give_back_step(state), self.etcd)

    def fail(self, state: ClaimState, reason: str, *, traceback: Optional[str] = None,
             delay: Optional[float] = None, retry: bool = True) -> Optional[GivenBack]:
        """Dead-letter the item if it used its attempts (or ``retry`` is False), else
        retry it after ``delay`` seconds (None: the queue's backoff):
        :meth:`Steps.dead_letters`, then :meth:`finish` or :meth:`Steps.retry_step`.

        Returns None if the item went to failed/, else R1's :data:`GivenBack`.
        PayloadTooLarge for a reason over the limit, whether or not it would be stored.
        """
        check_outcome(None, reason, self.max_payload)
        if self.dead_letters(state, retry):
            self.finish(state, FAILED, reason=reason, traceback=traceback)
            return None
        wait = self.backoff(state.attempt) if delay is None else delay
        return run(self.retry_step(state, wait, reason, traceback), self.etcd)

    # -- Q: requeue ----------------------------------------------------------
    def requeue(self, item_id: str) -> Tuple[str, Optional[Version]]:
        """Q0-Q5 (:meth:`Steps.requeue_step`): move dead letter ``item_id`` back to
        work/ as a new item; its id and Q3's version (None if it was there already)."""
        return run(self.requeue_step(item_id), self.etcd)

    # -- K: cancel -------------------------------------------------------------
    def cancel(self, item_id: str) -> bool:
        """K1-K4 (:meth:`Steps.cancel_step`): dead-letter a pending item as cancelled;
        False if it is running or finished, NotFound if there is no such item."""
        return run(self.cancel_step(item_id), self.etcd)

    # -- W: wait -----------------------------------------------------------------
    def watch_item(self, item_id: str, idle_timeout: float) -> EventStream:
        """W1: a stream of ``work/<id>``'s events from now on (before W2 reads)."""
        return self.watch(self.layout.key("work", item_id), idle_timeout)

    def watch(self, key: str, idle_timeout: float) -> EventStream:
        """A live recursive watch of ``key``: its events from now on, until etcd
        ends the stream or ``idle_timeout`` passes without one (W1, the view's
        follower)."""
        stream: EventStream = driver.send(self.etcd, Request("STREAM", key,
                                                             seconds=idle_timeout))
        return stream

    def look(self, item_id: str) -> Look:
        """The item in work/ and its outcome (:meth:`Steps.look_step`)."""
        return run(self.look_step(item_id), self.etcd)

    def outcome(self, item_id: str) -> Optional[Tuple[str, Record]]:
        """W2: ``(kind, record)`` of a finished item, None while it is pending or running.

        Read as Queue.get reads (:meth:`Steps.look_step`): the item first, then
        the record that finishes it.  NotFound if it is in none of them.
        """
        return self.look(item_id)[1]

    def gone_outcome(self, item_id: str) -> Tuple[str, Record]:
        """W3 after ``work/<id>``'s removal event: the record, read after work/
        was seen gone (so any record at the id is the item's); NotFound if none."""
        found = run(self.record_of_step(item_id, None), self.etcd)
        if found is None:
            raise NotFound(f"no item {item_id} in {self.layout.label}")
        return found

    def outcome_in(self, item_id: str, block: bytes) -> Optional[Tuple[str, Record]]:
        """W3: the outcome a block of ``work/<id>``'s events tells, None: keep waiting.

        A write that carries ``"o"`` is the commit F1: its value is the record.
        A removal (F3, a purge) is read in the records (NotFound if none is
        left).  A claim's C2 and anything that is not ours say nothing.
        """
        for line in block.splitlines():
            try:
                event = json.loads(line)
                action, value = event["action"], event["node"].get("value")
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # not an event of etcd's
            if action in ("delete", "compareAndDelete", "expire"):
                return self.gone_outcome(item_id)
            with contextlib.suppress(Junk):
                item = Item.decode(value)
                if item.outcome:
                    return item.outcome, Record.decode(value)
        return None

    # -- I: import ---------------------------------------------------------------
    def begin_import(self) -> ImportState:
        """I1, I2, I4: the import lock, then the put tokens of every item and record
        already in the queue, then a refresh of the lock (its index names the
        first key).  The lock's age counts from before I1 was sent, and I2
        refreshes it every lock_ttl/3: a slow I2 whose lock expired meanwhile
        (another import may have taken it and stored the lines) ends in
        LockLost at I4, before any write.  I1 and I4 are steps
        (:meth:`Steps.lock_import_step`, :meth:`Steps.refresh_import_lock_step`);
        I2 reads streamed listings, refreshing the lock between their entries."""
        lock = Lock(self.node_id, self.runtime.token())
        state = ImportState(lock, set(), None, run(self.lock_import_step(lock), self.etcd))
        try:
            state.tokens = self.put_tokens(
                lambda: run(self.keep_import_lock_step(state), self.etcd))  # I2
            state.name = run(self.refresh_import_lock_step(state), self.etcd)  # I4
        except BaseException:
            run(self.let_go_step(IMPORT_LOCK, lock), self.etcd)
            raise
        return state

    def put_tokens(self, keep: Optional[Callable[[], Any]] = None) -> Set[str]:
        """I2: the put tokens in work/, completed/ and failed/ (quorum, streamed
        listings); ``keep`` is called after each entry (the lock's refresh)."""
        tokens = set()
        for kind in ("work", COMPLETED, FAILED):
            for entry in self._streamed_entries(kind):
                token = put_token(Item.decode if kind == "work" else Record.decode,
                                  entry.value)
                if token is None and kind == FAILED:  # a requeued dead letter's tombstone
                    token = tombstone_token(entry.value)
                if token:
                    tokens.add(token)
                if keep is not None:
                    keep()
        return tokens

    def import_value(self, state: ImportState, kind: str, raw: str, token: str) -> None:
        """I3 (:meth:`Steps.import_value_step`): store one item or record whose token
        is not in the queue, named by the index of our previous write."""
        run(self.import_value_step(state, kind, raw, token), self.etcd)

    @staticmethod
    def imported_item(payload: Any, token: str, attempts: int, created: float) -> Item:
        """The value I3 writes for a pending item: marked ``q``, as D2's and Q3's are,
        since a copy of I3 held in flight could land after the item finished and
        create it again: its first claim then finds the record (C3)."""
        return Item(payload, token, attempts, created=created, requeued=True)

    def end_import(self, state: ImportState) -> None:
        """I5: drop the import lock (else it expires)."""
        run(self.let_go_step(IMPORT_LOCK, state.lock), self.etcd)

    # -- reads -----------------------------------------------------------------
    def read(self, kind: str, item_id: str) -> Optional[Entry]:
        """A linearizable read of one key of the queue; None if it does not exist."""
        return run(self.read_step(kind, item_id), self.etcd)

    def read_locks(self, item_ids: Sequence[str], since: Optional[int] = None
                   ) -> List[Tuple[str, int, Optional[Entry]]]:
        """These items' locks, read at once (one round trip): ``(id, the etcd
        index of the read, the lock or None)``.  For a view that needs a few
        of them, not the lingering locks of a lock TTL's worth of finished
        items that a listing of locks/ would bring (ViewState.plan_round).

        ``since``: the index at which the caller's stream began.  Reads are
        served by the member from its own copy (no raft proposal, no WAL
        fsync) and kept if at or after it, since every later
        change comes as an event; one from a member behind it, or every one
        without ``since``, is read again through raft (quorum).  Raises the
        first read's error, if any failed."""
        keys = [self.layout.key("locks", item_id) for item_id in item_ids]
        replies = self._get_all(keys, quorum=since is None)
        behind = [n for n, reply in enumerate(replies) if _served_before(reply, since or 0)]
        if behind:
            again = self._get_all([keys[n] for n in behind], quorum=True)
            for n, reply in zip(behind, again):
                replies[n] = reply
        return [self._lock_read(item_id, reply) for item_id, reply in zip(item_ids, replies)]

    def _get_all(self, keys: Sequence[str], *, quorum: bool) -> List[Union[Reply, EtcdqError]]:
        """GETs of ``keys`` sent at once (``ALL``): each one's reply or error."""
        replies: List[Union[Reply, EtcdqError]] = driver.send(self.etcd, Request(
            "ALL", together=tuple(Request("GET", key, quorum=quorum) for key in keys)))
        return replies

    def _lock_read(self, item_id: str, reply: Union[Reply, EtcdqError]
                   ) -> Tuple[str, int, Optional[Entry]]:
        """One of :meth:`read_locks`'s results; raises a failed read's error."""
        if isinstance(reply, KeyMissing):
            return item_id, reply.index or 0, None
        if isinstance(reply, EtcdqError):
            raise reply
        locks = list(self.entries([reply.node]))  # a directory there is junk: no lock
        return item_id, reply.index, locks[0] if locks else None

    def list(self, kind: str, *, quorum: bool = True) -> Tuple[int, List[Entry]]:
        """``(etcd index, entries)`` of one directory (:meth:`Steps.list_step`)."""
        return run(self.list_step(kind, quorum=quorum), self.etcd)

    def snapshot(self, *, quorum: bool = True) -> Dict[str, List[Entry]]:
        """The entries of every directory of the queue (by kind), from ONE GET.

        A recursive, unsorted GET of the queue's directory: one round trip
        instead of a listing per directory, and the directories as they were
        at one etcd index, so an item finishing meanwhile is not seen in
        work/ and in completed/ (or in neither).  ``quorum=False`` is served
        by the member from its own copy, without a round of consensus:
        cheaper, and possibly a moment behind.  It downloads every value of
        the queue: etcd v2 lists keys with their values, and has no count.
        """
        try:
            node = driver.send(self.etcd, Request("TREE", self.layout.root, quorum=quorum)).node
        except KeyMissing:
            node = {}
        except UndecodableReply as exc:
            return self._listed_snapshot(quorum, exc)
        found: Dict[str, List[Entry]] = {kind: [] for kind in DIRS}
        for child in node.get("nodes") or []:
            kind = str(child.get("key", "")).rpartition("/")[2]
            if child.get("dir") and kind in found:
                found[kind] = list(self.entries(child.get("nodes") or []))
        return found

    def _listed_snapshot(self, quorum: bool, exc: UndecodableReply) -> Dict[str, List[Entry]]:
        """The snapshot from a listing per directory, when the recursive GET cannot
        be decoded: a directory nested hundreds of levels deep somewhere in the
        queue's directory (junk), whose JSON nests twice as deep.  A listing is
        not recursive, so it never carries such a subtree; the four are not of
        one etcd index, which is all that is lost."""
        log.warning("%s: %s; reading its directories one by one (remove the deep "
                    "directory to read them in one request again)", self.layout.root, exc)
        return {kind: self.list(kind, quorum=quorum)[1] for kind in DIRS}

    def decoded(self, kind: str) -> Iterator[Tuple[Entry, Any]]:
        """``(entry, Item or Record)`` for the entries of ``kind`` that are ours."""
        return self.decode_entries(kind, self.list(kind)[1])

    def streamed(self, kind: str) -> Iterator[Tuple[Entry, Any]]:
        """Like :meth:`decoded`, but each entry as the listing arrives (quorum, sorted):
        memory holds one entry, never the directory (export, import's I2)."""
        decode = Item.decode if kind == "work" else Record.decode
        for entry in self._streamed_entries(kind):
            try:
                yield entry, decode(entry.value)
            except Junk:
                continue

    def _streamed_entries(self, kind: str) -> Iterator[Entry]:
        try:
            listing = driver.send(self.etcd, Request("LISTING", self.layout.dir(kind),
                                                     sorted=True, quorum=True))
        except KeyMissing:
            return
        yield from self.entries(listing.nodes())

    def claimed_ids(self) -> Set[str]:
        """The ids whose lock is a claim's (running items), from a streamed listing of
        locks/: memory grows with the running items only, not with delay locks.  A
        lock we cannot read counts as a claim's, as in :func:`lock_states`."""
        claimed = set()
        for entry in self._streamed_entries("locks"):
            try:
                if Lock.decode(entry.value).delay:
                    continue
            except Junk:
                pass
            claimed.add(entry.id)
        return claimed

    def purge(self, kind: str, progress: Optional[Callable[[], Any]] = None) -> int:
        """Delete the records of ``kind``, each after its item if one is left
        (:meth:`Steps.purge_step`); how many went."""
        return run(self.purge_step(kind, progress), self.etcd)

    def left_work(self, item_id: str) -> bool:
        """``work/<id>`` is gone or carries an outcome: a hint for the view (a
        serializable read, answered by the member from its own copy)."""
        try:
            node = driver.send(self.etcd, Request("GET", self.layout.key("work", item_id))).node
        except KeyMissing:
            return True
        try:
            return Item.decode(node.get("value")).outcome is not None
        except Junk:
            return False

    def _drop_lock(self, item_id: str, lock: Lock) -> None:
        run(self.drop_lock_step(item_id, lock), self.etcd)



#: What :func:`lock_states` gives for a lock it cannot read (junk): a claim's
#: lock of no known node.  It holds its item (C1 gets "already exists"), so the
#: item counts as running, never pending; an id without a lock is absent.
UNREADABLE_LOCK = Lock(node_id="", token="")


def lock_states(entries: List[Entry]) -> Dict[str, Lock]:
    """Locks by item id; a lock we cannot read is UNREADABLE_LOCK: held, never free."""
    locks: Dict[str, Lock] = {}
    for entry in entries:
        try:
            locks[entry.id] = Lock.decode(entry.value)
        except Junk:
            locks[entry.id] = UNREADABLE_LOCK
    return locks


def _served_before(reply: Union[Reply, EtcdqError], index: int) -> bool:
    """Whether a read was served at an etcd index below ``index`` (a missing
    key's error says at which, too); a failed read was not."""
    if isinstance(reply, Reply):
        return reply.index < index
    return isinstance(reply, KeyMissing) and (reply.index or 0) < index
