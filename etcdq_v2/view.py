"""A consumer's view of the queue: the items in work/ and which are locked, kept current.

Listing work/ on every claim costs time and memory in proportion to the
queue's length (etcd v2 sends every value with a listing), so each Queue
keeps one view, made by one follower thread in rounds.  docs/protocol.md,
"The consumer's view", has the full rules; in short:

Rounds.  A *quiet* round lists work/ (and locks/ when asked) with quorum
reads and watches nothing.  A *watching* round opens a streaming watch of the
whole queue directory (``?wait=true&recursive=true&stream=true``, registered
at etcd's current index S), lists at indexes >= S, and applies each event
newer than the listing until the stream ends, errs, goes silent, or ROUND
(60 s) has passed since the listing: a stream on a member that a raft snapshot
caught up misses the writes it covered and stays open, so no stream is trusted
longer.  The first round is quiet and lists both work/ and locks/; a claim
waits up to its deadline for it.  Whatever a round raises is logged, never
fatal (a view whose thread died would stop seeing new items without a word),
and the next round goes to the next member.

Modes.  etcd sends every event to every watcher, so a view watches only while
its process finds nothing to claim: a quiet view starts watching when a claim
finds nothing free, and a watching one goes quiet when a claim sees a backlog
of free items.  A quiet view learns what others did by missing (a claim finds
its item locked or gone: :meth:`QueueView.missed`) and lists work/ again once
its misses cost about what a listing does (:meth:`QueueView.relist_work`); a
listing of work/ shows which items were claimed since the last one (their new
version carries a claim token).  locks/, which holds about a lock TTL's
worth of finished items' locks, is listed only at the first listing, when a
view goes quiet knowing of locked items, once per lock TTL while a quiet view
knows of taken items, when a delay lock is due, and with a listing of work/
that shows new items that may be delayed.  A round that starts watching
checks at once the claim signs from before its previous listing (those locks
may have gone while it was quiet): it reads up to FEW_LOCKS of those locks,
or lists locks/; newer signs it checks CONFIRM s later if they are still
there.

Where a claim looks (:meth:`QueueView.pick`).  A lone consumer takes the
head; concurrent ones walk the backlog from random places, jumping after each
miss, so that they rarely try the same item.

Order.  A lone consumer claims items in put order, whoever put them.  The view
knows work/ completely up to an etcd index; items others put after it are
unknown to it, so an item this process put later (:meth:`QueueView.added`) is
not offered yet: when only such items are left, the view catches up first
(:meth:`QueueView.catch_up`): it lists again while it is quiet, or waits for
their events.

Taken items.  A claim attempt marks its item taken (:meth:`QueueView.taken`)
until it ends with the etcd index at which the item's lock existed
(:meth:`QueueView.locked_at`: ours after C2, or the index etcd gave with C1's
"already exists").  A sign that the lock is gone (a listing without it, its
delete or expire event) that comes while the attempt is under way is kept
and compared with that index then; any later one frees the item at once.  So
no item stays taken after its lock went, whatever the order of the news.

A claim never trusts the view: the lock create (C1) and the compare-and-swap
on the item (C2) decide, so a stale view costs a retry, never a wrong answer.
A claim that finds items gone tells the view (:meth:`QueueView.finished`); a few
in a row and the view lists again (:meth:`QueueView.relist`).

Waiting.  A claimer waits on the view's condition for :attr:`QueueView.version`
to change; a claimer over several queues (a Worker given several) registers
one Event with every view instead (:meth:`QueueView.add_waker`), which each
view sets on every change, so it waits on all of them at once without polling.

Free items (in work/, not locked) are kept in a sorted list: new items always
sort last (their ids are etcd indexes), so appending is cheap and the head of
the queue is at the front.
"""
from __future__ import annotations

import bisect
import calendar
import json
import logging
import math
import re
from typing import Callable, Dict, List, Optional, Set, Tuple

from .codec import Item, Junk, Lock
from .errors import EtcdqError, Unavailable
from .keys import Layout
from .protocol import Entry, Protocol, Version
from .runtime import EventLike
from .transport import EventStream, Refused

log = logging.getLogger("etcdq_v2.view")

#: One event: action, key, value (absent for deletions) or dir flag, and the
#: node's modifiedIndex.  etcd writes a node's fields in this order (Go
#: encodes struct fields in order); a JSON decoder per event cost several
#: times more, and every consumer reads every event of work/.
_EVENT = re.compile(rb'\{"action":"(\w+)","node":\{"key":"([^"]*)"'
                    rb'(?:,"value":"((?:[^"\\]|\\.)*)"|(,"dir":true))?'
                    rb'[^{}]*?"modifiedIndex":(\d+)')
_REMOVED = (b"delete", b"compareAndDelete", b"expire")
_EXPIRED = b"expire"
_CLAIMED = b"compareAndSwap"  # on work/: a claim's C2 (nothing else CASes an item)
_RECORDS = ("completed", "failed")
_WRITTEN = (b"create", b"set", b"update")
#: Values larger than this are not kept in memory; a claim reads them.
MAX_CACHED_VALUE = 64 * 1024
#: Free items that count as a backlog: with that many, nothing is watched.
BACKLOG = 32
#: Items a claim looks at from where it walks (or from the head) before giving up there.
PROBES = 8
#: Random places a claim walks from before it falls back to the head of the view.
JUMPS = 3
#: About what a miss (a failed lock create) costs, in listed items: a failed
#: write cost etcd 61-86 us of CPU and its client about as much, a listed item
#: ~1 us of etcd's CPU and ~2 us of the client's (2026-12-01, a quiet machine:
#: bench/README.md, "What etcd's operations cost"; docs/decisions.md, "Claims
#: are read off `work/`").  A quiet view lists work/ again once its misses
#: cost about what that listing does.
MISS_COST = 100
#: Seconds a follower waits after applying events, so that the next come in one block.
COALESCE = 0.005
#: Seconds a watching view trusts one stream: its round ends this long after
#: its listing, events or not, and the next one subscribes and lists again.  A
#: stream does not always deliver every later event or end: on a member
#: restored from a raft snapshot it misses every write the snapshot covered
#: and stays open (docs/protocol.md, "The consumer's view").  So a watching
#: view's knowledge is at most ROUND plus one listing old, whatever its member
#: does.  A round a minute: a watch, a listing of work/ and up to FEW_LOCKS lock
#: reads; with nothing running, what a silent stream's 60 s idle end cost already.
ROUND = 60.0
#: Seconds before listing locks/ again when a delay lock was listed due but not yet
#: removed (etcd removes expired keys every 0.5 s).
RELIST_DUE = 0.2
#: Seconds a view that started watching takes the items it saw claimed (and any
#: other lock it noted since its previous listing) for running before it lists
#: locks/ to check those still there: most finish sooner, and their events tell.
CONFIRM = 1.0
#: Old lock signs a view that starts watching checks by reading each lock
#: (GETs sent at once, see Protocol.read_locks) rather than listing locks/,
#: which holds a lock TTL's worth of finished items' locks (F4 is not sent):
#: at the end of a drain, 2,000 of them listed for a few items still running.
#: A GET cost etcd 140-200 us with quorum, less from the
#: member's own copy; a listed lock ~1 us and its client ~2 us (2026-12-01):
#: 8 reads cost less than listing locks/ once it holds about a thousand.
FEW_LOCKS = 8
#: etcd's ``expiration``: RFC 3339 in UTC, with up to nanoseconds.
_EXPIRATION = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(\.\d+)?Z")

#: A free item for a claim: its id and the version the view holds (one version:
#: see :class:`~etcdq_v2.protocol.Version`).
Candidate = Tuple[str, Version]


class QueueView:
    """work/ and the locked items of one queue, updated in a background thread."""

    def __init__(self, protocol: Protocol, *, idle_timeout: float = 60.0) -> None:
        self._protocol = protocol
        self._runtime = protocol.runtime
        self._layout: Layout = protocol.layout
        self._cond = self._runtime.Condition()
        #: Events set on every change of the view (see add_waker).
        self._wakers: Set[EventLike] = set()
        #: Items in work/: id -> the newest version the view knows, (index, value
        #: or None), of one write or one node read (never mixed: see Version).
        #: Tuples, not Versions: a listing makes one per item, and a tuple costs
        #: a fraction of a Version to make.
        self._items: Dict[str, Tuple[int, Optional[str]]] = {}
        #: Locked items: id -> the etcd index of the newest sign that its lock exists.
        self._locks: Dict[str, int] = {}
        #: Items whose lock was seen gone: id -> the newest etcd index at which
        #: it was (a lock listed or heard of at or before it is an older one).
        self._gone: Dict[str, int] = {}
        #: Claim attempts of this process under way: id -> the newest etcd index
        #: at which the item's lock was seen gone meanwhile (-1: not seen).
        self._trying: Dict[str, int] = {}
        #: work/ is known completely up to this etcd index: its listing's, or the
        #: newest event's while the whole directory is watched.
        self._known = 0
        #: Set by candidates(): the index of the oldest free item it held back
        #: because it is newer than _known (0: none).
        self._behind = 0
        #: Items this process put up to this index are offered though newer than
        #: _known: catch_up could not list work/ (see _offer_upto).
        self._own_upto = 0
        #: Items with an outcome record whose removal from work/ (F3) the view has
        #: not seen yet, while their finisher's lock is there: offered to no one.
        self._recorded: Set[str] = set()
        #: Recorded items whose lock was deleted (F4) before F3 was seen: offered
        #: once F3's event is overdue (time.monotonic() deadline).
        self._orphans: Dict[str, float] = {}
        self._free: List[str] = []
        self._in_free: Set[str] = set()
        self._skip: Dict[str, int] = {}
        self._locks_listed = -math.inf  # time.monotonic() of the last locks/ listing
        #: After a failed once-per-lock-TTL listing of locks/: seconds until it
        #: is tried again (CONFIRM, doubling up to a lock TTL); 0 after one that worked.
        self._locks_retry = 0.0
        #: After a failed listing of work/ in relist_work: no miss lists it again
        #: before this time.monotonic(); and the backoff's seconds (both reset by
        #: any listing of work/ applied).
        self._relist_after, self._work_retry = -math.inf, 0.0
        #: time.monotonic() of the last failed listing of work/ (catch_up's gate)
        self._work_failed_at = -math.inf
        #: The watching follower's last listing of work/ failed (catch_up)
        self._unlisted = False
        #: Known items held by a delay lock (a delayed put, a release delay): id ->
        #: time.monotonic() at which etcd expires the lock; and the earliest of them.
        self._delays: Dict[str, float] = {}
        #: Items of those given back by this process's claims: id -> the etcd
        #: index of R1 (see returned).
        self._given_back: Dict[str, int] = {}
        #: Items that may be delayed (``"q"``), new in a listing of work/ taken at
        #: the index noted, whose delay lock no listing of locks/ from then on has
        #: covered, because it failed: a listing of work/ that shows one lists
        #: locks/ too, and so does the next claim, until one is applied (otherwise a
        #: lost or dropped listing left its delay unplanned for good).
        self._unplanned: Dict[str, int] = {}
        self._next_delay = math.inf
        #: A view that started watching without listing locks/: when the lock
        #: signs up to its listing's index are checked (see check_locks).
        self._confirm_at, self._confirm_upto = math.inf, 0
        #: Locks that the round read (_apply_lock_reads): id -> the read's index.
        #: A sign from such a read needs no check, even at the listing's own
        #: index: the lock was there after the stream began.
        self._read_signs: Dict[str, int] = {}
        self.version = 0
        self._ready = False
        self._error: Optional[BaseException] = None
        self.relists = 0
        self._idle_timeout = idle_timeout
        self._closed = False
        #: Misses (an item found taken or gone) since the last listing of work/,
        #: and the free items that listing offered: a quiet view lists again
        #: after one miss per MISS_COST of them (miss_limit).
        self._misses = 0
        self._listed_free = 0
        #: Where a claim walking the backlog goes on from (see pick); None: jump.
        self._cursor: Optional[str] = None
        self._listing = False  # a relist_work() is under way
        self._follower = _Follower(self, None, idle_timeout, list_locks=True)
        self._follower.start()

    @property
    def version(self) -> int:
        """A number bumped (under the view's lock) by every change a claim may act on."""
        return self._version

    @version.setter
    def version(self, value: int) -> None:
        # Waking the wakers here, where every change is counted, means no
        # change can forget them.
        self._version = value
        for event in self._wakers:
            event.set()

    @property
    def watching_locks(self) -> bool:
        """True while the whole queue directory (locks/ too) is watched; False: quiet."""
        return self._follower.directory == self._layout.root

    # -- for claimers ----------------------------------------------------------
    def wait_ready(self, timeout: float) -> None:
        """Block until a listing is in, or raise.

        While etcd is unavailable the follower tries the next member, so this
        waits up to ``timeout`` and then raises Unavailable with the last
        error; an error that trying again cannot mend (access refused, a
        bad configuration) is raised at once, and so is Refused (every
        endpoint refused the connection: nobody listens).
        """
        with self._cond:
            self._cond.wait_for(lambda: self._ready or self._closed or _final(self._error),
                                timeout)
            if self._ready:
                return
            error = self._error
        if _final(error) and isinstance(error, EtcdqError):
            raise error
        why = "the queue was closed" if self._closed else f"last error: {error or 'none'}"
        raise Unavailable(f"could not list {self._layout.label} within {timeout:g} s ({why})")

    def candidates(self, limit: int) -> List[Candidate]:
        """Up to ``limit`` free items from the head: ``(id, version)``."""
        found: List[Candidate] = []
        with self._cond:
            stale, self._behind = 0, 0
            for position, item_id in enumerate(self._free):
                if self._is_free(item_id):
                    index, raw = self._items[item_id]
                    if index > self._offer_upto:
                        # Put by this process after what the view knows of work/:
                        # an item of another producer may come before it.
                        self._behind = index
                        break
                    found.append((item_id, Version(index, raw)))
                    if len(found) == limit:
                        break
                elif position == stale:
                    stale += 1
            self._drop_taken(0, stale)
            backlog = self.watching_locks and len(self._in_free) >= BACKLOG
            # Locks seen as events have no planned expiry: a quiet view, which
            # hears no expire event, must list them to learn when they expire.
            known_locks = bool(self._locks)
        if backlog:
            self._watch(locks=False, list_locks=known_locks)
        return found

    def pick(self, window: int) -> Optional[Candidate]:
        """A free item among the first ``window`` the view holds, marked
        :meth:`taken` for this claim attempt; or None.

        With a window of more than one (other consumers race for the head),
        the view walks forward from a random place in it, and jumps to
        another after each miss (:meth:`missed`): consumers spread over the
        backlog in runs, so they rarely try the same item, and a quiet view's
        stale items (taken by others since its listing) cost one miss per
        run that reaches them rather than one per item.  A walk that reaches
        the end of the window goes on from the head (:meth:`_walk`), so the
        oldest items do not wait for a random place to land on them.  Never
        an item put after what the view knows of work/ (see :meth:`candidates`).
        """
        for _ in range(JUMPS if window > 1 else 0):
            with self._cond:
                found = self._walk(min(window, bisect.bisect_right(
                    self._free, _id_at(self._offer_upto))))
                if found is not None:
                    self.taken(found[0])
                    return found
        while True:
            head = self.candidates(min(window, PROBES))
            if not head:
                return None
            found = self._runtime.random.choice(head)
            with self._cond:
                if self._is_free(found[0]):  # another thread may have taken it since
                    self.taken(found[0])
                    return found

    def _walk(self, end: int) -> Optional[Candidate]:
        """The first free item from the cursor on (among the first ``end``).

        A walk that reaches the end of the window goes on from the head, not
        from a random place: the window narrowed past the cursor, or the
        walk went through the newest items, and what is left behind it is
        the oldest (a consumer left alone would otherwise claim out of put
        order whenever its narrowing window left the cursor outside)."""
        if end <= 0 or not self._free:
            return None
        if self._cursor is None:
            self._cursor = self._free[self._runtime.random.randrange(min(end, len(self._free)))]
        start = bisect.bisect_left(self._free, self._cursor)
        if start >= end:
            start = 0
        stop = min(end, start + PROBES)
        for position in range(start, min(stop, len(self._free))):
            item_id = self._free[position]
            if self._is_free(item_id) and self._items[item_id][0] <= self._offer_upto:
                self._drop_taken(start, position)
                self._cursor = item_id
                return item_id, Version(*self._items[item_id])
        dropped = self._drop_taken(start, stop)
        if stop >= end:  # the window's end: from the head next time
            self._cursor = self._free[0] if self._free and start > 0 else None
        elif not dropped:  # free items changed since the view's listing: jump
            self._cursor = None
        return None  # else the next walk goes on where this one stopped

    def _drop_taken(self, start: int, stop: int) -> bool:
        """Forget the listed places in ``self._free[start:stop]`` of items not free
        (this process's claims, known locks): a walk goes on past them rather
        than jumping away (so a consumer left alone does not jump over its
        own claims, out of put order).  Free again, an item is listed anew
        (_make_free, which every way back to free goes through; an orphan's
        time, by offer_due at every claim round)."""
        kept: List[str] = []
        gone: List[str] = []
        for item_id in self._free[start:stop]:
            (kept if self._is_free(item_id) else gone).append(item_id)
        if gone:
            self._free[start:stop] = kept
            self._in_free.difference_update(gone)
        return bool(gone)

    def walk_from_head(self) -> None:
        """The next walk starts at the head of the view: the consumer looks
        alone (no lost race in a while: Queue._narrow), and walks in put order."""
        with self._cond:
            self._cursor = self._free[0] if self._free else None

    def missed(self, item_id: str) -> bool:
        """A claim found the item taken or gone.  True when a quiet view should
        list work/ again: its misses cost what that listing does (MISS_COST)."""
        with self._cond:
            self._misses += 1
            self._cursor = None  # another consumer's run, or a stale one: jump
            return not self.watching_locks and self._misses >= self.miss_limit

    @property
    def miss_limit(self) -> int:
        """Misses after which a quiet view lists work/ again (see MISS_COST)."""
        return max(1, (self._listed_free + MISS_COST // 2) // MISS_COST)

    def catch_up(self, timeout: float) -> bool:
        """After candidates() held back items this process put: learn of every
        item put before them, then True.  False if it held none back.

        While the whole directory is watched their own events will come (up to
        ``timeout``); otherwise, or if they do not, list again.  If that
        listing fails, or the watching follower's last listing of work/ did
        (not its stream: a follower whose stream broke lists again), the items
        this process put up to there are offered without it (_own_upto).
        """
        with self._cond:
            behind = self._behind
            if not behind or self._closed:
                return False
            if self.watching_locks and self._cond.wait_for(
                    lambda: self._known >= behind or self._closed, timeout):
                return True
            quiet, failing = not self.watching_locks, self._unlisted
        if quiet:
            self._catch_up_quietly(behind, timeout)
        elif failing:  # the follower cannot list; a new one, unready, would fail claims
            with self._cond:
                self._own_upto = max(self._own_upto, behind)
        else:
            self.relist(timeout)
        return True

    def _catch_up_quietly(self, behind: int, timeout: float) -> None:
        """A quiet view lists work/ in the claimer's thread and stays ready
        (relist_work; while listings fail, at most once a second).  If no
        listing up to ``behind`` came, the items this process put up to
        ``behind`` are offered without it: put order with other producers'
        items waits for a listing that works.  Not relist(): it makes the view
        unready, so while listings of work/ failed every claim of the process
        would fail, though the view held its own item free."""
        self.relist_work(catching_up=True)
        with self._cond:
            self._cond.wait_for(lambda: not self._listing or self._closed, timeout)
            if self._closed:  # no claim after close()
                raise Unavailable(f"could not list {self._layout.label} (the queue was closed)")
            if self._known < behind:
                self._own_upto = max(self._own_upto, behind)

    @property
    def _offer_upto(self) -> int:
        """Items up to this etcd index may be offered (under the lock): what
        the view knows of work/, or this process's own puts after a failed
        catch_up."""
        return max(self._known, self._own_upto)

    def starved(self, timeout: float) -> None:
        """A claim found nothing: watch the whole queue directory, and wait for its listing.

        Unless another claimer's relist of work/ is under way: that listing may
        bring free items, so wait for it first, and watch only if it changed
        nothing (watching would drop it, and cost a stream)."""
        with self._cond:
            if self._listing:
                version = self.version
                self._cond.wait_for(lambda: not self._listing or self._closed, timeout)
                if self.version != version:
                    return
        self._watch(locks=True).wait_listed(timeout)

    def check_locks(self) -> None:
        """While the view is quiet: list again once per lock TTL while items are
        taken, and list locks/ as soon as a delay lock of a known item is due.
        While it watches: list locks/ CONFIRM s after it started watching if an
        item is still taken on a sign older than that (:meth:`_unconfirmed`).

        A full listing, because a taken item whose lock went may have been
        finished meanwhile (the view no longer sees records): only work/ tells.

        First, orphans whose F3 is overdue are offered (:meth:`offer_due`):
        only a claim that waits did that, and an orphan a walk or the head's
        trim had dropped from the free list would otherwise stay out of it
        for a consumer that never waits.
        """
        self.offer_due()
        with self._cond:
            now, quiet = self._runtime.monotonic(), not self.watching_locks
            stale = quiet and bool(self._locks) and (
                now - self._locks_listed >= self._protocol.lock_ttl)
            due = quiet and self._next_delay <= now
            confirm = not quiet and self._confirm_at <= now
            if confirm:
                self._confirm_at = math.inf
                confirm = self._unconfirmed()
            follower, round_ = self._follower, self.relists
        if stale:
            self.relist_work(full=True)
        elif confirm:
            try:
                self._list_locks(follower, full=True, round_=round_)
            except BaseException:
                with self._cond:  # not given up: the next claim checks again
                    self._plan_confirm()
                raise
        elif due:
            self._list_due_locks(follower)

    def _list_due_locks(self, follower: "_Follower") -> None:
        """List locks/ for delay locks that are due, or items waiting for their
        delay to be planned.  If that fails, the claim goes on with the items
        the view has, and the listing is tried again CONFIRM s later: failing
        the claim would hand out nothing while such listings fail."""
        try:
            self._list_locks(follower)
        except EtcdqError as exc:
            log.warning("could not list %s for delay locks (tried again in %g s): %s",
                        self._layout.dir("locks"), CONFIRM, exc)
            with self._cond:
                self._next_delay = self._runtime.monotonic() + CONFIRM

    def _plan_confirm(self) -> None:
        """Check the signs up to _confirm_upto CONFIRM s from now, or sooner if planned."""
        self._confirm_at = min(self._confirm_at, self._runtime.monotonic() + CONFIRM)

    def _unconfirmed(self) -> bool:
        """Whether an item still in work/ is taken on a sign no newer than the
        listing of the view's watching follower: its lock may have gone before
        the watch began, and no event would say so.  At the listing's own index
        too: a sign read off work/ is the index of the item's last write (a C2,
        R0 or F1, fenced on the item, not the lock), which may have landed after
        its lock expired."""
        upto = self._confirm_upto
        return any(at <= upto and item_id in self._items and self._read_signs.get(item_id) != at
                   for item_id, at in self._locks.items())

    def taken(self, item_id: str) -> None:
        """A claim attempt of this process on the item is under way: offer it to no other."""
        with self._cond:
            self._trying.setdefault(item_id, -1)

    def locked_at(self, item_id: str, index: int, *, refused: bool = False) -> None:
        """The attempt ended (:meth:`taken`): the item's lock (ours, or the claim
        that beat us) existed at etcd index ``index`` (0: at some time before).

        A later sign that the lock is gone frees the item: a listing of locks/
        or an event, also one that came while the attempt was under way.  The
        view may never see that lock's events: it watches nothing while it has
        a backlog.

        ``refused``: C1 was refused at ``index``, etcd's index then: the key
        was there at that index, even if the view took the lock for gone at
        that very index.  Then the refusal wins, until a newer sign: the key
        holds something no listing or read of locks/ shows (a directory: its
        removal is an event, see _apply_event), or the view's sign was its
        own making (a release that reported a delay lock past its expiry,
        not yet removed by etcd, as given back at once).  Freeing the item
        again on such a refusal would have a claim try it again at once,
        thousands of times a second, past its timeout; skipping it would
        strand a delayed item for good.  Not a C2 that found the item claimed since: its index is
        the item's, which a listing at that index may rightly show without a
        lock (a late C2 whose lock expired).
        """
        with self._cond:
            gone = self._trying.pop(item_id, None)
            if gone is None:
                return  # forgotten meanwhile, or another thread's attempt ended it
            if refused and 0 < index == max(gone, self._gone.get(item_id, -1)):
                self._gone.pop(item_id, None)
                gone = -1
            if index > gone:
                self._locked(item_id, index)
                if self.watching_locks and index <= self._confirm_upto and not (
                        refused and index >= (self._follower.since or math.inf)):
                    # A sign from before the watching listing, which did not
                    # see it: that lock may have gone unheard.
                    # Not a refusal at or after the stream began: the lock was
                    # there then, so its end comes as an event (checking it
                    # would retry a junk lock every CONFIRM).
                    self._plan_confirm()
            elif self._locks.get(item_id, -1) <= gone:
                self._locks.pop(item_id, None)  # gone since: free
            self._make_free(item_id)

    def untaken(self, item_id: str) -> None:
        """Undo :meth:`taken` after a claim attempt failed before reaching etcd."""
        with self._cond:
            if self._trying.pop(item_id, None) is not None:
                self._make_free(item_id)

    def version_of(self, item_id: str) -> Optional[Version]:
        """The version of the item a claim would be offered (None: not held)."""
        with self._cond:
            held = self._items.get(item_id)
            return None if held is None else Version(*held)

    def added(self, item_id: str, seen: Version) -> None:
        """This process wrote the item (a put, a requeue) or read it back after
        a lost reply, at version ``seen``: offer it before etcd's event arrives."""
        with self._cond:
            if self._ready and seen.index > self._items.get(item_id, (0, None))[0]:
                self._apply_item(item_id, seen.index, seen.raw)

    def delayed(self, item_id: str, seen: Version, lock_index: int, ttl: int) -> None:
        """This process put a delayed item (D2 wrote it, or read it back, at
        version ``seen``): offer it once its delay lock, created at
        ``lock_index``, expires in about ``ttl`` seconds.

        A watching view that knows of etcd's writes past that index saw the
        lock come (and maybe go) itself.  A quiet view may have listed the item
        (a relist of work/ between D2 and now) but never the lock: it always
        notes the lock and when it is due.
        """
        with self._cond:
            known = seen.index <= self._items.get(item_id, (0, None))[0]
            if not self._ready or (known and self.watching_locks):
                return  # the next listing has it; or it is known (or finished) already
            if lock_index > self._known or not self.watching_locks:
                self._locked(item_id, lock_index)
            self._plan_delay(item_id, ttl)
            if not known:
                self._apply_item(item_id, seen.index, seen.raw)

    def returned(self, item_id: str, seconds: int, index: int) -> None:
        """A claim of this process gave the item back (release, or fail with a
        retry) at etcd ``index``, claimable again in ``seconds``.  Now: free,
        before etcd's event arrives (unless locked again since).  Later: note
        when etcd expires its delay lock, so that a quiet view, which hears no
        expiry, lists locks/ then (check_locks) rather than up to a lock TTL
        later; a listing older than ``index``, which shows our claim's lock,
        does not undo that."""
        with self._cond:
            if not seconds:
                self._unlocked(item_id, index)
            elif item_id in self._locks:
                self._given_back[item_id] = index
                self._plan_delay(item_id, seconds)

    def _plan_delay(self, item_id: str, seconds: float) -> None:
        """The item's delay lock expires in about ``seconds`` (see check_locks)."""
        self._delays[item_id] = self._runtime.monotonic() + seconds
        self._next_delay = min(self._next_delay, self._delays[item_id])

    def finished(self, item_id: str) -> None:
        """The item is gone: this process completed or dead-lettered it, or a
        claim found it gone.  Never offer it again.

        F3 and F4 are committed together and their events may come in either
        order; without this, the lock's removal (or its expiry, when F4 is
        skipped) could offer the item again.
        """
        with self._cond:
            self._forget(item_id)

    def relist(self, timeout: float) -> None:
        """Subscribe and list again now, and wait (up to ``timeout``) for the listing."""
        with self._cond:
            if self._closed:
                return
            under_way = not self._ready  # another thread's relist, or the first listing
            self._ready, self._error = False, None
        if not under_way:
            self._replace_follower(locks=self.watching_locks)
        self.wait_ready(timeout)

    def skip(self, item_id: str, index: int) -> None:
        """Never offer this version of the item again (it is junk)."""
        with self._cond:
            self._skip[item_id] = index

    def wait_for_change(self, version: int, timeout: Optional[float]) -> None:
        with self._cond:
            timeout = self.until_due(timeout)
            self._cond.wait_for(lambda: self.version != version or self._closed, timeout)
            self.offer_due()

    def add_waker(self, event: EventLike) -> None:
        """Set ``event`` on every change of :attr:`version`, and on close.

        For a claimer that waits on several views at once (a Worker over
        several queues): one Event for all of them, cleared before it looks
        at the views, so a change while it looks ends its wait at once.
        """
        with self._cond:
            self._wakers.add(event)
            if self._closed:
                event.set()

    def remove_waker(self, event: EventLike) -> None:
        with self._cond:
            self._wakers.discard(event)

    def until_due(self, timeout: Optional[float]) -> Optional[float]:
        """``timeout``, cut short to when the first orphan is due (see :meth:`offer_due`),
        or the check of a view that started watching (see :meth:`check_locks`)."""
        with self._cond:
            now = self._runtime.monotonic()
            due = min([*self._orphans.values(), self._confirm_at]) - now + 0.01
            if due < math.inf:  # wake when the first is due: offer it, or check_locks
                timeout = due if timeout is None else min(timeout, max(due, 0.0))
            return timeout

    def offer_due(self) -> None:
        """Offer the orphans whose F3 event is overdue: a claim finishes them."""
        with self._cond:
            for item_id, due in list(self._orphans.items()):
                if due <= self._runtime.monotonic():
                    del self._orphans[item_id]
                    self._make_free(item_id)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            for event in self._wakers:
                event.set()
        self._follower.stop()

    def _watch(self, *, locks: bool, list_locks: bool = False) -> "_Follower":
        """Watch the whole queue directory (``locks``), or nothing: its follower."""
        with self._cond:
            if self.watching_locks == locks:
                return self._follower
        return self._replace_follower(locks=locks, list_locks=list_locks)

    def _replace_follower(self, *, locks: bool, list_locks: bool = False) -> "_Follower":
        """A new follower (subscribe, list, apply) in place of the current one."""
        with self._cond:
            old = self._follower
            if self._closed:
                return old
            directory = self._layout.root if locks else None
            new = self._follower = _Follower(self, directory, self._idle_timeout,
                                             list_locks=list_locks)
        old.stop()
        new.start()
        return new

    # -- the state ---------------------------------------------------------------
    def _is_free(self, item_id: str) -> bool:
        entry = self._items.get(item_id)
        return (entry is not None and item_id not in self._locks
                and item_id not in self._trying and item_id not in self._recorded
                and self._orphans.get(item_id, 0.0) <= self._runtime.monotonic()
                and self._skip.get(item_id) != entry[0])

    def _make_free(self, item_id: str) -> None:
        if self._is_free(item_id):
            if item_id not in self._in_free:
                bisect.insort(self._free, item_id)
                self._in_free.add(item_id)
            self.version += 1
            self._cond.notify_all()

    def _forget(self, item_id: str) -> None:
        self._items.pop(item_id, None)
        self._locks.pop(item_id, None)
        self._gone.pop(item_id, None)
        self._trying.pop(item_id, None)
        self._recorded.discard(item_id)
        self._orphans.pop(item_id, None)
        self._unplanned.pop(item_id, None)

    def _apply_item(self, item_id: str, index: int, value: Optional[str]) -> None:
        """The item's version ``index`` with ``value``: the value etcd wrote at
        that index, or None (never another version's: see Version)."""
        self._items[item_id] = (index, _cacheable(value))
        self._make_free(item_id)

    def _locked(self, item_id: str, index: int) -> None:
        """A sign at ``index`` that the item is locked; ignored if its lock was
        seen gone since (an older listing applied late)."""
        if index > self._locks.get(item_id, 0) and index > self._gone.get(item_id, 0):
            self._locks[item_id] = index

    def _unlocked(self, item_id: str, index: int) -> None:
        """The item's lock was gone at ``index``: free, unless locked again since.

        While a claim attempt on it is under way, remember ``index`` for
        :meth:`locked_at`, which learns only then at which index the lock existed.
        """
        if self._trying.get(item_id, index) < index:
            self._trying[item_id] = index
        # Only for items the view holds: a finished item's lock goes after the
        # item did, and noting it would keep one entry per item.
        if item_id in self._items and index > self._gone.get(item_id, 0):
            self._gone[item_id] = index
        if 0 <= self._locks.get(item_id, -1) <= index:
            del self._locks[item_id]
            self._delays.pop(item_id, None)
            self._make_free(item_id)

    def _reconcile_locks(self, index: int, locks: List[Entry], delays: bool = False) -> None:
        """Apply a listing of locks/ taken at ``index``; ``delays``: free only
        items whose known delay lock went, or that waited for a listing of
        locks/ to plan theirs (the others may have been finished)."""
        listed = {entry.id: entry.index for entry in locks}
        # Their delay locks were there before them (D1 before D2): planned now.
        planned = {i for i, at in self._unplanned.items() if at <= index}
        for item_id in [i for i in {**self._locks, **self._trying} if i not in listed]:
            if not delays or item_id in self._delays or item_id in planned:
                self._unlocked(item_id, index)
        for item_id, lock_index in listed.items():
            if item_id in self._items:  # not the lingering locks of finished items
                self._locked(item_id, lock_index)
        self._plan_delays(locks)
        self._unplanned = {i: at for i, at in self._unplanned.items() if i not in planned}
        if self._unplanned:  # an older listing: the next claim lists locks/ again
            self._next_delay = -math.inf
        self._locks_retry = 0.0  # listings of locks/ work again: no backoff
        if not delays:  # a delays-only listing leaves the other taken items as they were
            self._locks_listed = self._runtime.monotonic()

    def _plan_delays(self, locks: List[Entry]) -> None:
        """Note when etcd expires each listed delay lock of a known item, so that
        :meth:`check_locks` lists locks/ then, not a lock TTL later.  One that
        is due but not swept yet (etcd sweeps every 0.5 s) is listed again soon."""
        now, wall = self._runtime.monotonic(), self._runtime.wall()
        for entry in locks:
            if entry.id in self._items and entry.expiration and _is_delay(entry.value):
                self._delays[entry.id] = now + max(_expires_in(entry, wall), RELIST_DUE)
            elif entry.index >= self._given_back.get(entry.id, 0):
                self._delays.pop(entry.id, None)  # a claim's lock: refreshed, not waited for
        for item_id in [i for i in self._delays if i not in self._locks]:
            del self._delays[item_id]
        for item_id in [i for i in self._given_back if i not in self._delays]:
            del self._given_back[item_id]
        self._next_delay = min(self._delays.values(), default=math.inf)

    # -- listings and events (follower threads) --------------------------------------
    def _list(self, follower: "_Follower") -> Dict[str, int]:
        """List work/, and locks/ if the follower says so: the etcd index of
        each listing, by directory (0: not listed, every event applies).

        locks/ holds about a lock TTL's worth of finished items' locks (F4 is
        not sent), which would cost every listing of it; so a quiet view lists
        it only at its first listing and once per lock TTL (:meth:`check_locks`),
        and keeps what it knows of locks otherwise.  A view that starts
        watching the whole directory lists it: its events say only what
        changes from then on.  Only the current follower's listing is
        applied: one that was replaced meanwhile must not overwrite what its
        successor has.
        """
        try:
            work_index, work = self._protocol.list("work")
        except EtcdqError:
            with self._cond:
                self._unlisted = self._unlisted or follower is self._follower
            raise
        with self._cond:
            delayed = self._new_delayed(work)  # once: it decodes each new item
            noted = self._noted_before(work) if follower.directory is not None else []
            # Every view lists locks/ for new delayed items, which it would
            # otherwise try each, in this round, so that no claim finds them
            # taken before it is applied; and a
            # watching view for old signs, unless they are few: it reads
            # their locks instead.
            list_locks = follower.list_locks or bool(delayed) or len(noted) > FEW_LOCKS
            read = [] if list_locks else noted
            # A quiet view's listing of locks/ made for them only may fail
            # without failing the round, as relist_work's.  Not one the round
            # was asked for: a first listing has nothing to go on, and a view
            # going quiet must learn its delay locks.
            may_fail = follower.directory is None and not follower.list_locks
        try:
            locks_index, locks = self._protocol.list("locks") if list_locks else (0, [])
        except EtcdqError as exc:
            if not may_fail:
                raise
            self._locks_unlisted(exc)
            locks_index, locks, list_locks = 0, [], False
        reads = self._protocol.read_locks(read, follower.since) if read else []
        with self._cond:
            if follower is not self._follower:
                return {}
            self._take_listing(work_index, work, delayed)
            if list_locks:
                self._reconcile_locks(locks_index, locks)
            elif delayed:  # the next claim lists locks/ first (check_locks)
                self._next_delay = -math.inf
            self._apply_lock_reads(reads)
            self._confirm_upto, self._confirm_at = work_index, math.inf
            if follower.directory is not None and not list_locks and self._unconfirmed():
                self._plan_confirm()
            self._ready, self._error = True, None
        return {"work": work_index, "locks": locks_index}

    def _noted_before(self, work: List[Entry]) -> List[str]:
        """The items of a listing of work/ taken on a sign the view had at its
        previous listing: that lock may have gone while the view was quiet,
        so a view that starts watching checks them at once (their locks read,
        or locks/ listed if there are more than FEW_LOCKS).  Newer signs
        (misses, claims seen in this listing) wait for check_locks."""
        known = self._known
        return [entry.id for entry in work if self._locks.get(entry.id, known + 1) <= known]

    def _apply_lock_reads(self, reads: List[Tuple[str, int, Optional[Entry]]]) -> None:
        """Apply reads of single locks (under the lock), each at its etcd index:
        a lock there is a sign at that index (at or after the follower's
        listing, so its later changes come as events, and no CONFIRM check is
        needed for it: _read_signs), a lock gone frees the item as a listing
        of locks/ without it would."""
        self._read_signs = {}
        for item_id, index, lock in reads:
            if lock is None:
                self._unlocked(item_id, index)
            elif item_id in self._items:
                self._locked(item_id, index)
                if self._locks.get(item_id) == index:
                    self._read_signs[item_id] = index

    def _new_delayed(self, work: List[Entry]) -> Set[str]:
        """The items of a listing of work/ that are new to the view and carry
        ``"q"`` (a delayed put, among others), or that an earlier listing showed
        so and whose delay lock is not planned yet (:attr:`_unplanned`): their
        delay locks must be planned (see check_locks), so locks/ is listed too."""
        return {entry.id for entry in work if entry.id in self._unplanned or (
            entry.id not in self._items and _maybe_delayed(entry.value))}

    def behind(self, timeout: float) -> None:
        """Claims found the view stale: list again (a quiet view, work/ only)."""
        if self.watching_locks:
            self.relist(timeout)
        else:
            self.relist_work()

    def relist_work(self, *, full: bool = False, catching_up: bool = False) -> None:
        """A quiet view that missed too often lists work/ again, in the claimer's
        thread; other claimers meanwhile go on with what the view has.
        ``full``: locks/ too, once per lock TTL (check_locks); if that listing
        fails, work/ is applied, what the view knew of locks stands, and it is
        due again CONFIRM later.  Not a new follower: the view would be
        unready, every claim failing, while listings of locks/ failed.

        Not locks/: a finished item's lock stays there until it expires (F4 is
        not sent), so locks/ holds about a lock TTL's worth of finished items,
        which would cost every listing.  The view keeps what it knows of locks
        (listed once per lock TTL, see :meth:`check_locks`), and learns of newer
        ones by missing; but it lists locks/ too when a new item may be delayed
        (:meth:`_new_delayed`), and applies both listings at once, so that no
        claim meanwhile finds such an item free before its delay lock is
        known, nor held for want of it.
        """
        with self._cond:
            if self._listing or self.watching_locks or self._closed or (
                    not full and self._runtime.monotonic() < self._relist_gate(catching_up)):
                return
            self._listing, follower = True, self._follower
        try:
            index, work = self._protocol.list("work")
            with self._cond:
                delayed = self._new_delayed(work)
                # Those noted before are the next claim's to list for (check_locks):
                # listing for them here too would cost each claim that misses a
                # timeout while listings of locks/ fail.
                new = delayed - set(self._unplanned)
            locks = self._list_locks_if(bool(new) or full)
        except BaseException as exc:
            with self._cond:
                self._end_listing()
                if not isinstance(exc, EtcdqError):
                    raise
                self._work_unlisted(exc, full)
            return  # the claim goes on with what the view holds
        with self._cond:
            # Ended in the block that applies it: a starved claim that waited
            # for it sees it applied, or it dropped.
            self._end_listing()
            if follower is not self._follower:
                return  # the new follower lists for itself
            self._take_listing(index, work, delayed)
            if locks is not None:  # work/ and locks/ listed in turn: a full listing
                self._reconcile_locks(*locks)
            else:
                self._locks_unlisted_due(new, full)

    def _locks_unlisted_due(self, new: Set[str], full: bool) -> None:
        """relist_work listed no locks/, or that failed (under the lock).  New
        delayed items are offered (a claim finds a delay lock at C1), but the
        next claim lists locks/ first (check_locks), not a relist after some
        miss or a lock TTL later; not for those noted before, whose retry
        stays CONFIRM after its last failure.  A failed listing once per lock
        TTL is due again CONFIRM later (a lock TTL would keep items taken that
        long), then twice as long after each failure, up to a lock TTL: each
        costs its claim a request's deadline."""
        if new:
            self._next_delay = -math.inf
        if full:
            ttl = self._protocol.lock_ttl
            self._locks_retry = min(ttl, max(CONFIRM, 2 * self._locks_retry))
            self._locks_listed = self._runtime.monotonic() - ttl + self._locks_retry

    def _relist_gate(self, catching_up: bool) -> float:
        """No listing of work/ before this runtime.monotonic() (under the lock).
        A catch-up waits a second (CONFIRM) after the last failure, not the
        misses' backoff: put order waits for it (the backoff could leave it
        up to a lock TTL out of order after listings answered again)."""
        return self._work_failed_at + CONFIRM if catching_up else self._relist_after

    def _work_unlisted(self, exc: EtcdqError, full: bool) -> None:
        """relist_work could not list work/ (under the lock).  The claim goes on
        with what the view holds, and no miss lists again for CONFIRM, then
        twice as long after each failure, up to a lock TTL; a full listing is
        due again after the same time.  Before, every claim that
        missed over the limit raised, though the view held free items, and
        paid a request's deadline each time (a half-answering etcd)."""
        ttl = self._protocol.lock_ttl
        self._work_retry = min(ttl, max(CONFIRM, 2 * self._work_retry))
        self._work_failed_at = self._runtime.monotonic()
        self._relist_after = self._work_failed_at + self._work_retry
        if isinstance(exc, Unavailable):  # its deadline is spent: one more, not two
            self._protocol.etcd.spent()
        if full:  # not on _locks_retry, which a due delay's listing of locks/ resets
            self._locks_listed = self._runtime.monotonic() - ttl + self._work_retry
        log.warning("could not list %s (listed again in %g s at the earliest; claims go "
                    "on with what the view holds): %s",
                    self._layout.dir("work"), self._work_retry, exc)

    def _end_listing(self) -> None:
        """relist_work is over (under the lock): a starved claim may wait for it."""
        self._listing = False
        self._cond.notify_all()

    def _list_locks_if(self, wanted: bool) -> Optional[Tuple[int, List[Entry]]]:
        """The listing of locks/ relist_work makes (for new delayed items, or
        once per lock TTL); None if not ``wanted``, or if it failed: logged,
        and the claim goes on with work/ applied (raising would fail every
        claim that missed while listings of locks/ failed)."""
        if not wanted:
            return None
        try:
            return self._protocol.list("locks")
        except EtcdqError as exc:
            self._locks_unlisted(exc)
            return None

    def _locks_unlisted(self, exc: EtcdqError) -> None:
        log.warning("could not list %s (a claim lists it again soon): %s",
                    self._layout.dir("locks"), exc)

    def _take_listing(self, index: int, work: List[Entry], delayed: Set[str]) -> None:
        """Apply a listing of work/ taken at ``index`` (under the lock);
        ``delayed``: its items whose delay lock is to be planned (_new_delayed).

        An item claimed since the view last saw it (a new version that carries
        a claim token: C2 wrote it under the claim's lock) is taken at that
        version's index, as if a claim of ours had lost the race for it:
        running elsewhere, most likely.  Without that, every item others were
        running would look free after a relist and cost a miss each (or a
        listing of locks/ to learn which).  It is freed as any
        taken item is: by a listing of locks/ without its lock, or an event.

        Listings of work/ answer again: a miss may list at once (otherwise,
        after one that failed, a full or a follower's listing that worked would
        leave the backoff on, up to a lock TTL).
        """
        self._relist_after, self._work_retry, self._unlisted = -math.inf, 0.0, False
        for entry in work:
            if entry.index != self._items.get(entry.id, (0, None))[0] and _claimed(entry.value):
                self._locked(entry.id, entry.index)
        self._items = {e.id: (e.index, _cacheable(e.value)) for e in work}
        self._gone = {i: at for i, at in self._gone.items() if i in self._items}
        for item_id in delayed:  # the oldest listing that showed it
            self._unplanned[item_id] = min(self._unplanned.get(item_id, index), index)
        self._unplanned = {i: at for i, at in self._unplanned.items() if i in self._items}
        self._free = [e.id for e in work]
        self._in_free = set(self._free)
        self._recorded.clear()  # one still in work/ now is one a claim must finish
        self._orphans.clear()
        self._known, self._own_upto = index, 0
        self._misses, self._listed_free, self._cursor = 0, len(work), None
        self.relists += 1
        self.version += 1
        self._cond.notify_all()

    def _list_locks(self, follower: "_Follower", full: bool = False,
                    round_: Optional[int] = None) -> None:
        """List locks/ and apply it, if ``follower`` (current when the caller
        decided to list) is still the view's: in a quiet view, to delayed items
        only unless ``full`` (see _reconcile_locks).  A follower that took over
        since lists locks/ itself, and may have applied newer events already
        (an older listing applied after them would mark a released item
        locked for good).
        ``round_``: the view's listing (:attr:`relists`) that a watching view's
        check was decided on; if the follower listed again since (its stream
        ended and it subscribed anew), that listing and its own check stand,
        and this older one is dropped (applied after the new round, it would
        mark locked an item whose lock had expired unheard)."""
        index, locks = self._protocol.list("locks")
        with self._cond:
            # A new follower lists locks/ itself; this older listing, applied
            # after its events, could mark an item locked again for good.
            if follower is self._follower and round_ in (None, self.relists):
                self._reconcile_locks(index, locks,
                                      delays=follower.directory is None and not full)

    def _apply(self, block: bytes, floors: Dict[str, int], follower: "_Follower") -> None:
        """Apply a block of events, each only if newer than its directory's listing."""
        with self._cond:
            if follower is not self._follower:
                return  # replaced: its successor's listing covers these events
            whole = follower.directory == self._layout.root
            for action, key, value, is_dir, index in _EVENT.findall(block):
                number = int(index)
                self._apply_event(action, key.decode("utf-8", "replace"), value, is_dir,
                                  number, floors)
                if whole:  # events come in etcd's order: work/ is known up to here
                    self._known = max(self._known, number)
            if self._behind and self._known >= self._behind:
                self._cond.notify_all()

    def _apply_event(self, action: bytes, key: str, value: bytes, is_dir: bytes, index: int,
                     floors: Dict[str, int]) -> None:
        parsed = self._layout.split(key)
        if parsed is None or (is_dir and parsed[0] != "locks"):
            return  # not an item
        if is_dir:  # junk at a lock's key: C1 is refused until it goes
            if action in _REMOVED:
                self._unlocked(parsed[1], index)
            return
        if parsed[0] in _RECORDS:
            self._record(parsed[1])
        elif index <= floors[parsed[0]]:
            return  # already in the listing
        elif parsed[0] == "work":
            self._apply_work(action, parsed[1], value, index)
        elif action in _REMOVED:
            self._unlocked(parsed[1], index)
            if parsed[1] in self._recorded:
                # Expired: its finisher died before F3.  Deleted (F4): F3 was sent
                # with it, but may never apply (lost, the finisher gave up or died).
                self._recorded.discard(parsed[1])
                if action == _EXPIRED:
                    self._make_free(parsed[1])  # a claim finishes it (F3, F4)
                else:
                    self._orphans[parsed[1]] = (self._runtime.monotonic()
                                                + self._protocol.etcd.deadline)
        elif action != _CLAIMED:  # a lock's CAS keeps it locked (a release delay)
            self._locked(parsed[1], index)

    def _record(self, item_id: str) -> None:
        """An outcome record (F2) of the item: it is finished, offer it no more.

        While the whole directory is watched and its finisher's lock is
        there, the item stays known until F3 removes it from work/: if the
        lock expires first, its finisher died between F2 and F3, and a claim
        must finish the item.  Otherwise (a quiet view has no events: a stale one) it is
        forgotten; a finisher's crash is then found by the next listing.
        """
        if self._follower.directory != self._layout.root or item_id not in self._items:
            self._forget(item_id)
        elif item_id in self._locks:
            self._recorded.add(item_id)
        else:  # its finisher's lock expired before F1: offered if F3 is overdue
            self._orphans[item_id] = self._runtime.monotonic() + self._protocol.etcd.deadline

    def _apply_work(self, action: bytes, item_id: str, value: bytes, index: int) -> None:
        if action in _REMOVED:
            self._forget(item_id)
        elif action == _CLAIMED:
            if item_id in self._items:
                # A claim reads it afresh.  Not a sign of a lock: the lock's own
                # events tell, and a commit (F1) may apply after the lock expired.
                self._items[item_id] = (index, None)
        elif action in _WRITTEN:
            self._apply_item(item_id, index, _unescape(value))  # the event's own node

    def _failed(self, exc: BaseException, follower: "_Follower") -> None:
        """The follower's last error, for :meth:`wait_ready` (a replaced one's is moot)."""
        with self._cond:
            if follower is self._follower:
                self._error = exc
                self._cond.notify_all()


class _Follower:
    """One watch of the view, in a thread of its own: subscribe, list, apply events.

    ``directory`` None: a quiet view, which lists and watches nothing.
    """

    def __init__(self, view: QueueView, directory: Optional[str],
                 idle_timeout: float, *, list_locks: bool = False) -> None:
        self._view = view
        self._runtime = view._runtime
        self.directory = directory
        #: Whether its listings read locks/.  A watching follower's also do when
        #: the view has more than FEW_LOCKS older lock signs (_noted_before;
        #: fewer, it reads their locks): its events say only what changes from
        #: then on.  The view keeps which items are locked (one that forgot
        #: would try each of them whenever it started watching), and checks
        #: newer signs later (check_locks).
        self.list_locks = list_locks
        self._idle_timeout = idle_timeout
        self._listed = self._runtime.Event()
        self._stop = self._runtime.Event()
        self._stream: Optional[EventStream] = None
        self._thread = self._runtime.Thread(self._run, name="etcdq-view", daemon=True)

    def start(self) -> None:
        """Start following; only once the view knows this is its follower."""
        self._thread.start()

    def wait_listed(self, timeout: float) -> None:
        self._listed.wait(timeout)

    @property
    def since(self) -> Optional[int]:
        """The etcd index at which its stream began (None: no stream, or not said)."""
        stream = self._stream
        return stream.index or None if stream is not None else None

    def drop_stream(self) -> None:
        """End the current stream as if the connection dropped (tests use it)."""
        stream = self._stream
        if stream is not None:
            stream.close()

    def stop(self) -> None:
        self._stop.set()
        self.drop_stream()

    def _run(self) -> None:
        """Follow until stopped.  Whatever goes wrong is logged and followed by a
        new round (on the next member, if etcd's was at fault): a view whose
        thread died would stop seeing new items without a word."""
        pause = 0.1
        while not self._stop.is_set():
            try:
                self._follow()
                pause = 0.1
            except BaseException as exc:  # noqa: B036 - even SystemExit: logged, not fatal
                if self._stop.is_set():
                    break
                self._report(exc)
                self._stop.wait(pause)
                pause = min(pause * 2, 2.0)

    def _report(self, exc: BaseException) -> None:
        """Log ``exc`` (with its traceback if it is not etcd's doing); claimers see it."""
        if isinstance(exc, EtcdqError):
            log.warning("watch of %s failed (%s); subscribing and listing again",
                        self.directory, exc)
        else:
            log.error("watch of %s failed (%s); subscribing and listing again",
                      self.directory, type(exc).__name__, exc_info=exc)
        self._view._failed(exc, self)

    def _follow(self) -> None:
        """One round: subscribe, list, then apply events until the stream ends."""
        if self.directory is None:
            self._view._list(self)
            self._listed.set()
            self._stop.wait()
            return
        stream = self._view._protocol.etcd.stream(self.directory,
                                                  idle_timeout=self._idle_timeout)
        self._stream = stream
        try:
            if self._stop.is_set():
                return
            floors = self._view._list(self)
            self._listed.set()
            ends = self._runtime.monotonic() + ROUND
            stream.set_idle_timeout(self._time_left(ends))
            for block in stream.blocks():
                self._view._apply(block, floors, self)
                if self._runtime.monotonic() >= ends:
                    return  # trusted long enough: the next round lists again
                stream.set_idle_timeout(self._time_left(ends))
                # Each wake-up of this thread (a context switch, the GIL taken
                # from the claimer) cost more than parsing the events; a short
                # pause lets the next few arrive together.  An event after a
                # quiet spell is still applied at once.
                self._runtime.sleep(COALESCE)
        finally:
            stream.release()

    def _time_left(self, ends: float) -> float:
        """How long the stream may stay silent: idle_timeout, cut short at the
        round's end (ROUND after its listing)."""
        return min(self._idle_timeout, ends - self._runtime.monotonic())


def _maybe_delayed(value: Optional[str]) -> bool:
    """Whether an item's value may carry ``"q"`` (None: too large to say)."""
    return value is None or _item_says(value, '"q":', lambda item: item.requeued)


def _claimed(value: Optional[str]) -> bool:
    """Whether an item's value carries a claim token (written by a claim's C2)."""
    return value is not None and _item_says(value, '"c":', lambda item: item.claim is not None)


def _item_says(value: str, field: str, test: Callable[[Item], bool]) -> bool:
    """``test`` of the decoded item, if its value has the text ``field`` at all:
    the cheap test first (most have not), then the item's own field, not one of
    its payload's (a payload may hold the same text).  Junk says nothing."""
    if field not in value:
        return False
    try:
        return test(Item.decode(value))
    except Junk:
        return False


def _is_delay(value: Optional[str]) -> bool:
    try:
        return Lock.decode(value).delay
    except Junk:
        return False


def _expires_in(entry: Entry, wall: float) -> float:
    """Seconds until etcd expires a listed key (<= 0: due), from ``wall`` (time.time()).

    etcd gives the seconds left rounded up (``ttl``), and the ``expiration``
    time on its own clock: that time, as this host's clock sees it, kept
    within the second ``ttl`` allows, so a skewed clock errs by under 1 s.
    """
    match = _EXPIRATION.fullmatch(entry.expiration or "")
    if match is None:
        return float(entry.ttl)
    *fields, fraction = match.groups()
    at = calendar.timegm(tuple(int(field) for field in fields)) + float(fraction or 0)
    return min(max(at - wall, entry.ttl - 1.0), float(entry.ttl))


def _id_at(index: int) -> str:
    """The id etcd gives an item POSTed at ``index``: ids sort as their indexes do."""
    return f"{index:020d}"


def _final(error: Optional[BaseException]) -> bool:
    """An error of the view that trying again will not mend, or not soon: nothing
    listens at any endpoint (Refused), so a claim need not wait out its deadline."""
    return error is not None and (not isinstance(error, Unavailable)
                                  or isinstance(error, Refused))


def _unescape(value: bytes) -> str:
    """A JSON string's contents (as matched by _EVENT) as the string it encodes."""
    return json.loads(b'"' + value + b'"') if b"\\" in value else value.decode("utf-8")


def _cacheable(value: Optional[str]) -> Optional[str]:
    return value if value is not None and len(value) <= MAX_CACHED_VALUE else None
