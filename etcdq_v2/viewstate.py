"""The consumer's view as a state machine: its state and every decision, no I/O.

docs/protocol.md, "The consumer's view", is the spec: its state table is
:class:`ViewState`'s fields, its events table the methods below, and its
Deadlines section :data:`DEADLINES`.  Nothing here reads a clock, sleeps,
locks, makes a thread, draws a random number or talks to etcd (a test,
tests/test_runtime.py, checks the imports): the driver (view.py, a follower
thread and the claimers) makes the requests, feeds their replies in with the
time (``now``: monotonic seconds; ``wall``: the host's clock for etcd's
``expiration``), and carries out what a method returns:

- a :class:`Round` (:meth:`ViewState.new_round`): replace the follower by one
  that makes this round (watching the whole directory, or nothing); each has
  a generation number, and an event of an older generation (a listing, a block
  of events, an error of a replaced follower) is ignored;
- a :class:`RoundPlan` (:meth:`ViewState.plan_round`): what a round lists
  after work/ (locks/, or the locks to read);
- a :class:`Relist` (:meth:`ViewState.start_relist`): a claimer's listing of
  work/ (and locks/), one at a time;
- a :data:`Check` (:meth:`ViewState.tick`): the listing a claim round makes
  first, when a deadline of :data:`DEADLINES` is due;
- a :class:`Switch` (:meth:`ViewState.pick`, :meth:`ViewState.candidates`):
  go quiet;
- ``version`` bumped: wake the claimers.

The driver holds its lock around every call; the state is not thread-safe.

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
finds nothing free, and a watching one goes quiet when a claim's pick (from
the head or a walk) sees a backlog of BACKLOG free items (not counting those
locked since its listing).  A quiet view learns what others did by missing (a
claim finds its item locked or gone: :meth:`ViewState.missed`) and lists
work/ again once its misses cost about what a listing does, or half its tries missed
(:attr:`ViewState.miss_limit`, :meth:`ViewState.start_relist`); a
listing of work/ shows which items were claimed since the last one (their new
version carries a claim token).  locks/, which holds about a lock TTL's
worth of finished items' locks, is listed only at the first listing, when a
view goes quiet knowing of locked items, once per lock TTL while a quiet view
knows of taken items, when a delay lock is due, and with a listing of work/
that shows new items that may be delayed.  A round that starts watching
checks at once the claim signs from before its previous listing (those locks
may have gone while it was quiet): it reads up to FEW_LOCKS of those locks,
or lists locks/; newer signs it checks CONFIRM s later if they are still
there.  Not the signs of this process's own live claims (:attr:`ViewState.own`),
whose locks its heartbeat keeps, until :meth:`ViewState.disowned`.

Where a claim looks (:meth:`ViewState.pick`).  A lone consumer takes the
head; concurrent ones walk the backlog from random places, jumping after each
miss, so that they rarely try the same item.

Order.  A lone consumer claims items in put order, whoever put them.  The view
knows work/ completely up to an etcd index; items others put after it are
unknown to it, so an item this process put later (:meth:`ViewState.added`) is
not offered yet: when only such items are left, the view catches up first
(:meth:`ViewState.catch_up_how`): it lists again while it is quiet, or waits for
their events.

Taken items.  A claim attempt marks its item taken (:meth:`ViewState.taken`)
until it ends with the etcd index at which the item's lock existed
(:meth:`ViewState.locked_at`: ours after C2, or the index etcd gave with C1's
"already exists").  A sign that the lock is gone (a listing without it, its
delete or expire event) that comes while the attempt is under way is kept
and compared with that index then; any later one frees the item at once.  So
no item stays taken after its lock went, whatever the order of the news.

History.  etcd restored from an older snapshot, or restarted without its
data, goes on from a lower index.  A listing of work/ (a quorum read) read
below the highest index the view was told of before it was sent shows it
(:meth:`ViewState._fresh`): every sign of the old history is dropped, since
none compares with the new one's indexes (:meth:`ViewState._history_changed`),
and a reply to a request sent before the change is dropped whatever its index.

A claim never trusts the view: the lock create (C1) and the compare-and-swap
on the item (C2) decide, so a stale view costs a retry, never a wrong answer.
A claim that finds items gone tells the view (:meth:`ViewState.finished`); a few
in a row and the view lists again (:meth:`ViewState.relist_how`).

Waiting.  A claimer waits on the view's condition for :attr:`ViewState.version`
to change; a claimer over several queues (a Worker given several) registers
one Event with every view instead (the driver's ``QueueView.add_waker``), which each
view sets on every change, so it waits on all of them at once without polling.

Free items (in work/, not locked) are kept in a sorted list: new items always
sort last (their ids are etcd indexes), so appending is cheap and the head of
the queue is at the front.
"""
from __future__ import annotations

import bisect
import calendar
import hashlib
import json
import math
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from .codec import Item, Junk, Lock
from .keys import Layout
from .versions import Entry, Version

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
#: The fewest misses that measure a listing's miss rate: a quiet view also
#: lists work/ again once its misses since the listing are at least this many
#: and at least as many as its claims' hits (a miss rate of one half): the
#: listing's items are mostly gone, and misses after that find no more of
#: them, however long the listing.  Eight: 64 consumers starting together on
#: a backlog lose about 3 races each before their windows spread.
MISS_RATE_MIN = 8
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
#: Also the first step of every backoff of the view's listings.
CONFIRM = 1.0
#: A follower's pause after a round that raised, doubling per failed round up to ROUND_PAUSE_MAX.
ROUND_PAUSE, ROUND_PAUSE_MAX = 0.1, 2.0
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
#: see :class:`~etcdq_v2.versions.Version`).
Candidate = Tuple[str, Version]
#: What a claim round lists first (ViewState.tick): "full" (work/ and locks/,
#: in the claimer's thread), "confirm" (locks/, a watching view's check),
#: "delays" (locks/, for due delay locks), or None.
Check = Optional[str]
#: A lock read of a round: (id, the read's etcd index, the lock or None: gone).
LockRead = Tuple[str, int, Optional[Entry]]
#: A listing: its etcd index and its nodes.
Listing = Tuple[int, List[Entry]]


@dataclass(frozen=True)
class Round:
    """A follower's round, as the state made it: carry it out (subscribe, list).

    ``generation`` names it: what it reports is applied only while it is the
    state's current one (its successor lists for itself)."""

    generation: int
    #: The whole queue directory is watched (else nothing is: a quiet round).
    watching: bool
    #: Its listings read locks/ (see ViewState.plan_round).
    list_locks: bool
    #: The number this listing of work/ took as it was sent (ViewState.started;
    #: ViewState.round_listing numbers each of the round's listings).
    started: int = 0
    #: ViewState.history as this listing of work/ was sent: its replies
    #: (work/, locks/, lock reads) are dropped if the history changed since.
    history: int = 0
    #: ViewState.highest as it was sent: read at a lower index, etcd's history changed.
    highest: int = 0


@dataclass(frozen=True)
class RoundPlan:
    """What a round lists after its listing of work/."""

    #: Items of the listing new to the view that may be delayed (new_delayed).
    delayed: Set[str]
    #: List locks/ too.
    list_locks: bool
    #: Else read these locks one by one (old signs, FEW_LOCKS at most).
    read: List[str]
    #: A failed listing of locks/ does not fail the round (a quiet round's,
    #: made for new delayed items only).
    may_fail: bool
    #: The number its listing of work/ took as its reply was handed in
    #: (ViewState.started): read at etcd between ``Round.started`` and this.
    answered: int


@dataclass(frozen=True)
class Relist:
    """A claimer's listing of work/ under way (start_relist), for generation ``generation``."""

    generation: int
    #: work/ and locks/ (the once-per-lock-TTL listing).
    full: bool
    #: The number it took as it was sent (ViewState.started).
    started: int = 0
    #: ViewState.history as it was sent: dropped whole if the history changed since.
    history: int = 0
    #: ViewState.highest as it was sent: read at a lower index, etcd's history changed.
    highest: int = 0


@dataclass(frozen=True)
class RelistPlan:
    """What a claimer's relist lists after work/."""

    #: Items of the listing new to the view that may be delayed (new_delayed).
    delayed: Set[str]
    #: Of those, the ones not noted unplanned before this listing.
    new: Set[str]
    #: List locks/ too, and apply both listings together.
    list_locks: bool
    #: The number its listing of work/ took as its reply was handed in
    #: (ViewState.started): read at etcd between ``Relist.started`` and this.
    answered: int


@dataclass(frozen=True)
class Switch:
    """A claim's find asks for another round: go quiet (``watching`` False)."""

    watching: bool
    list_locks: bool


@dataclass(frozen=True)
class Deadline:
    """One deadline of the view: when it falls due, given the state; what is
    done then (``check``: what a claim round lists, see ViewState.tick); and
    whether a waiting claim wakes for it (``wakes``).  A deadline with no
    check is a gate: nothing is done before it."""

    when: Callable[["ViewState"], float]
    check: Check = None
    wakes: bool = False


class ViewState:
    """work/ and the locked items of one queue as one consumer knows them.

    Fed events (listings, stream events, claims' outcomes, own puts, time),
    it returns what to do.  Each field's comment names the invariant it serves
    (docs/protocol.md, "The view's state")."""

    def __init__(self, layout: Layout, *, lock_ttl: float, orphan_delay: float) -> None:
        self.layout = layout
        #: Seconds a claim's lock lives: the once-per-lock-TTL listing's period, every backoff's cap.
        self.lock_ttl = float(lock_ttl)
        #: Seconds after which an orphan's F3 is overdue (the transport's deadline).
        self.orphan_delay = float(orphan_delay)
        # -- what is in work/ (One version; Order) --------------------------------
        #: Items in work/: id -> the newest version the view knows, (index, value
        #: or None), of one write or one node read (never mixed: One version).
        #: Tuples, not Versions: a listing makes one per item, and a tuple costs
        #: a fraction of a Version to make.
        self.items: Dict[str, Tuple[int, Optional[str]]] = {}
        #: The ids of free items, sorted (ids are etcd indexes: the head is the
        #: oldest): a lone consumer takes the head (Order).  It may hold ids no
        #: longer free (a walk, and a watching view's count of its backlog,
        #: drop them as they pass); every free item is in it.
        self.free: List[str] = []
        #: The ids in ``free``, to test membership at no cost.
        self.in_free: Set[str] = set()
        #: work/ is known completely up to this etcd index: its listing's, or the
        #: newest event's while the whole directory is watched: no item is
        #: offered ahead of an older one the view has not seen (Order).
        self.known = 0
        #: Set by candidates(): the index of the oldest free item it held back
        #: because it is newer than ``known`` (0: none): catch_up's target.
        self.behind = 0
        #: Items this process put up to this index are offered though newer than
        #: ``known``: a catch-up could not list work/; a process's own items stay
        #: claimable while listings fail (0 again at the next listing).
        self.own_upto = 0
        #: Versions found junk: id -> (index, :func:`digest` of the value); that
        #: version is offered no more.  The index alone does not name a write:
        #: after a restore the id and index may be another write's, which no
        #: listing read above every index the view knew can tell.
        self.skip: Dict[str, Tuple[int, bytes]] = {}
        # -- locks (no locked item offered; Taken items) ---------------------------
        #: Locked items: id -> the etcd index of the newest sign that its lock
        #: exists: a locked item is not offered.
        self.locks: Dict[str, int] = {}
        #: Items whose lock was seen gone: id -> the newest etcd index at which
        #: it was; a sign at or before it is older news (a listing applied late
        #: never locks an item given back since).  Only for items in work/: bounded.
        self.gone: Dict[str, int] = {}
        #: Items forgotten (finished here, found gone, a record or delete event)
        #: while a listing of work/ is outstanding (round_sent, relist_sent):
        #: id -> (``started`` then, the highest index of the item the view
        #: knows: the version it held, or this process's own claim's (C2,
        #: :attr:`wrote`); inf: none; and the held version's index alone,
        #: which is what the mark keeps when etcd's history changes:
        #: _history_changed).  A listing of work/ sent by then may have
        #: been taken before the item left, and does not bring that version or
        #: an older one back (a lone consumer would try its own finished item,
        #: lose to its lingering lock, and widen its window: Order); a newer one
        #: (the id written again before the listing was served) it shows.  Kept
        #: while a listing sent by then is outstanding, whatever the indexes of
        #: the listings applied meanwhile (an index says nothing across a
        #: restart); none made when no listing is outstanding: bounded by what
        #: left work/ while one was.
        self.left: Dict[str, Tuple[int, float, float]] = {}
        #: The indexes at which this process's claims found the item's lock
        #: (locked_at: its C2's, for a claim that won): a listing read after
        #: C2 shows that version.  Only for items in work/.
        self.wrote: Dict[str, int] = {}
        #: Claim attempts of this process under way: id -> the newest etcd index
        #: at which the item's lock was seen gone meanwhile (-1: not seen; inf:
        #: the history changed meanwhile, so the index the attempt ends with
        #: may be the old history's and makes no sign): no item stays taken
        #: after its lock went, whatever order the news comes in.
        self.trying: Dict[str, float] = {}
        #: (Watching.) Items with an outcome record whose removal from work/ (F3)
        #: the view has not seen yet, while their finisher's lock is there: a
        #: finished item is offered to no one.
        self.recorded: Set[str] = set()
        #: Recorded items whose lock was deleted (F4) before F3 was seen, or whose
        #: lock was not known: id -> when F3 is overdue; then offered (at a
        #: tick), so that a claim finishes an item whose finisher stopped.
        self.orphans: Dict[str, float] = {}
        # -- delay locks (a quiet view frees a delayed item when etcd expires its lock)
        #: Known items held by a delay lock (a delayed put, a release delay): id ->
        #: the time at which etcd expires the lock.
        self.delays: Dict[str, float] = {}
        #: The earliest of ``delays`` (-inf: the next claim lists locks/ first).
        self.next_delay = math.inf
        #: Items of ``delays`` given back by this process's claims: id -> R1's
        #: etcd index (a listing of locks/ older than it shows our claim's lock
        #: and leaves the plan alone).
        self.given_back: Dict[str, int] = {}
        #: Items that may be delayed (``"q"``), new in a listing of work/ taken at
        #: the index noted, whose delay lock no listing of locks/ from then on has
        #: covered, because it failed: a delayed item is never handed out early,
        #: and its delay gets planned (listings of work/ that show one list locks/
        #: too, and so does the next claim, until one is applied).
        self.unplanned: Dict[str, int] = {}
        # -- a watching view's check of old signs (A view that starts watching)
        #: When the signs up to ``confirm_upto`` are checked (a listing of
        #: locks/): a lock that went while the view was quiet frees its item
        #: within CONFIRM.
        self.confirm_at = math.inf
        #: The index of the watching round's listing: signs up to it may be stale.
        self.confirm_upto = 0
        #: Locks that the round read: id -> the read's index.  A sign from such a
        #: read needs no check, even at the listing's own index: the lock was
        #: there after the stream began.
        self.read_signs: Dict[str, int] = {}
        #: Items of this process's live claims (locked_at after a won C2, until
        #: the claim ends or its heartbeat stops keeping the lock: disowned):
        #: their lock is there while the process runs, so their sign needs no
        #: check (a consumer running its own item would list locks/ at every
        #: start of watching).  Bounded by the process's open claims.
        self.own: Set[str] = set()
        # -- the once-per-lock-TTL listing and the backoffs (a claim does not pay a
        # request's deadline at every miss while listings fail)
        #: When locks/ was last listed in full (-inf: never).
        self.locks_listed = -math.inf
        #: After a failed once-per-lock-TTL listing of locks/: seconds until it
        #: is tried again (CONFIRM, doubling up to a lock TTL); 0 after one that worked.
        self.locks_retry = 0.0
        #: After a failed listing of work/: no miss lists it again before this;
        #: and the backoff's seconds (both reset by any listing of work/ applied).
        self.relist_after, self.work_retry = -math.inf, 0.0
        #: When the last listing of work/ failed (the catch-up's gate).
        self.work_failed_at = -math.inf
        #: The watching follower's last listing of work/ failed: a catch-up offers
        #: own items without waiting for a new follower's listing.
        self.unlisted = False
        #: A claimer's relist of work/ is under way: one at a time; a starved
        #: claim waits for it before it starts watching.
        self.listing = False
        # -- mode and rounds (events cost nothing while the process has work) -------
        #: The whole queue directory is watched (locks/ too); False: quiet.
        self.watching = False
        #: The current round's number: what an older round reports is ignored.
        self.generation = 0
        #: When the current watching round's listing was applied (its ROUND ends then).
        self.round_listed_at = math.inf
        # -- a quiet view's misses (it lists again once misses cost a listing)
        #: Misses (an item found taken or gone) since the last listing of work/.
        self.misses = 0
        #: The free items that listing offered: the miss limit is one per MISS_COST.
        self.listed_free = 0
        #: Items claims tried (picked) since that listing: with ``misses``, its miss rate.
        self.tries = 0
        #: The ids of those tries, and the misses of claims picked before the
        #: listing (threads sharing the view, under way when it was applied):
        #: misses of that listing's contents, not of its own tries.
        self.picked: Set[str] = set()
        self.old_misses = 0
        #: Where a claim walking the backlog goes on from (see pick); None: jump.
        #: Concurrent consumers spread over the backlog.
        self.cursor: Optional[str] = None
        # -- for claimers (a claim waits for the first listing, and fails with its cause)
        #: A listing is in.
        self.ready = False
        #: The current follower's last error (None after a listing).
        self.error: Optional[BaseException] = None
        #: close() was called: no more rounds, claims, waits.
        self.closed = False
        #: Bumped by every change a claim may act on: a waiting claim wakes for
        #: every change, and only then (the driver wakes it).
        self.version = 0
        #: The first deadline a waiting claim wakes for, after the last change
        #: (note_deadlines): one that moves earlier bumps the version.
        self.wake_due_seen = math.inf
        #: Listings of work/ applied.
        self.relists = 0
        # -- listings that race (a round's and a claimer's relist, in one quiet round)
        #: A clock of the listings of work/ (rounds' and relists'): each takes a
        #: number as it is sent (new_round, round_listing, start_relist) and
        #: another as its reply is handed in (plan_round, plan_relist), so its
        #: read at etcd falls between the two, and two listings are ordered in
        #: real time unless their intervals overlap (fresher_than_applied).
        self.started = 0
        #: The last applied listing of work/: the numbers it took as it was sent
        #: and as it was answered, and its etcd index.  A listing answered
        #: before it was sent is older (dropped); one sent after it was answered
        #: is newer (applied, at any index: one that went back, etcd restored
        #: or restarted without its data, never freezes the view); one that
        #: overlapped it is applied only at an index as high.
        self.applied_sent = 0
        self.applied_answered = 0
        self.applied_index = 0
        #: The highest etcd index the view was told of (listings, lock reads,
        #: events, this process's writes and claims' outcomes).  A listing of
        #: work/ sent after it (a quorum read) is read at an index as high in
        #: the same history: one applied at a lower index shows that etcd's
        #: history changed (restored from an older snapshot, or restarted
        #: without its data: _history_changed).
        self.highest = 0
        #: etcd's histories seen: bumped at each change (_history_changed).  A
        #: listing or lock read notes it as it is sent (Round, Relist,
        #: apply_locks) and is dropped if it changed meanwhile: its indexes
        #: may be the old history's, which compare with nothing of the new.
        self.history = 0
        #: Listings of work/ sent and not yet settled (applied, failed, or
        #: their round replaced): the current round's and the claimer's
        #: relist's ``started`` numbers as sent (None: none under way).
        self.round_sent: Optional[int] = None
        self.relist_sent: Optional[int] = None

    # -- queries -------------------------------------------------------------------
    def is_free(self, item_id: str) -> bool:
        """The item may be offered: in work/, no lock sign, no attempt of this
        process, no record pending, not an orphan, not a version found junk."""
        entry = self.items.get(item_id)
        return (entry is not None and item_id not in self.locks
                and item_id not in self.trying and item_id not in self.recorded
                and item_id not in self.orphans and not self.skips(item_id, *entry))

    def skips(self, item_id: str, index: int, raw: Optional[str]) -> bool:
        """That version of the item was found junk: its index and value match
        (the value is hashed only for an id that has a skip entry: is_free runs
        for every item a pick passes)."""
        skipped = self.skip.get(item_id)
        return skipped is not None and skipped[0] == index and skipped[1] == digest(raw)

    def version_of(self, item_id: str) -> Optional[Version]:
        """The version of the item a claim would be offered (None: not held)."""
        held = self.items.get(item_id)
        return None if held is None else Version(*held)

    @property
    def offer_upto(self) -> int:
        """Items up to this etcd index may be offered: what the view knows of
        work/, or this process's own puts after a failed catch-up."""
        return max(self.known, self.own_upto)

    @property
    def miss_limit(self) -> int:
        """Misses after which a quiet view lists work/ again: once they cost
        about what the listing did (MISS_COST), or once the misses of its own
        tries are at least MISS_RATE_MIN and at least as many as the hits
        (tries that did not miss, under way ones too): the listing is mostly
        stale.  A miss of a claim picked before the listing counts for the
        cost only."""
        by_cost = max(1, (self.listed_free + MISS_COST // 2) // MISS_COST)
        own = self.misses - self.old_misses  # the misses of its own tries
        return min(by_cost, self.old_misses + max(MISS_RATE_MIN, self.tries - own))

    def next_deadline(self) -> float:
        """The earliest deadline of DEADLINES that makes a tick do something (inf:
        none): when to call tick().  Not the gates, nor the follower's round end."""
        return _earliest(when(self) for when in _TICKING)

    def wake_due(self) -> float:
        """The first deadline a waiting claim wakes for (inf: none)."""
        due = math.inf
        for when in _WAKING:  # note_deadlines runs it after every change: no generator
            at = when(self)
            if at < due:
                due = at
        return due

    def note_deadlines(self) -> None:
        """After every change: a waiting claim cut its wait to the first deadline
        it wakes for as it was when it began (until_due), so one that moved
        earlier is a change it must act on, and bumps the version like any other."""
        due = math.inf
        for when in _WAKING:  # wake_due(), inlined: this runs after every change
            at = when(self)
            if at < due:
                due = at
        if due < self.wake_due_seen:
            self.version += 1
        self.wake_due_seen = due

    def until_due(self, now: float, timeout: Optional[float]) -> Optional[float]:
        """``timeout``, cut short to the first deadline a waiting claim wakes for."""
        due = self.wake_due()
        if due < math.inf:  # a little after: the tick then finds it due
            wait = max(due - now + 0.01, 0.0)
            timeout = wait if timeout is None else min(timeout, wait)
        return timeout

    # -- claims ----------------------------------------------------------------------
    def candidates(self, limit: int) -> Tuple[List[Candidate], Optional[Switch]]:
        """Up to ``limit`` free items from the head, and whether to go quiet
        (:meth:`switch_due`)."""
        found: List[Candidate] = []
        stale, self.behind = 0, 0
        for position, item_id in enumerate(self.free):
            if self.is_free(item_id):
                index, raw = self.items[item_id]
                if index > self.offer_upto:
                    # Put by this process after what the view knows of work/:
                    # an item of another producer may come before it.
                    self.behind = index
                    break
                found.append((item_id, Version(index, raw)))
                if len(found) == limit:
                    break
            elif position == stale:
                stale += 1
        self._drop_taken(0, stale)
        return found, self.switch_due()

    def switch_due(self) -> Optional[Switch]:
        """Whether to go quiet, decided at every pick, whatever found the item
        (the head, a walk): a watching view that sees a backlog
        (_sees_backlog) does, listing locks/ if it knows of locks (a quiet
        view, which hears no expire event, must list them)."""
        if self.watching and self._sees_backlog():
            return Switch(watching=False, list_locks=bool(self.locks))
        return None

    def _sees_backlog(self) -> bool:
        """Whether BACKLOG items of the view are free (:meth:`is_free`): a
        watching view then goes quiet.  Not ``len(in_free)``: ``free`` still
        holds the items locked since they were listed, and one free item
        among many running elsewhere is no backlog.

        Cheap per claim: ``free`` holds every free item, so with fewer than
        BACKLOG ids in it there is nothing to count.  Else it counts from the
        head and drops the ids not free that it passes (as a walk does,
        :meth:`_drop_taken`; make_free lists them anew), until BACKLOG free
        ones: a count that falls short went through all of ``free``, which
        then holds only free items, fewer than BACKLOG, and the next claim
        counts again only once make_free has listed enough anew.  So each id
        is passed over once per time it is listed, and a count costs at most
        BACKLOG calls of is_free beside those."""
        if len(self.in_free) < BACKLOG:
            return False
        kept: List[str] = []
        gone: List[str] = []
        for item_id in self.free:
            if self.is_free(item_id):
                kept.append(item_id)
                if len(kept) == BACKLOG:
                    break
            else:
                gone.append(item_id)
        self._unlist(0, len(kept) + len(gone), kept, gone)
        return len(kept) == BACKLOG

    def pick(self, window: int, rng: Any) -> Tuple[Optional[Candidate], Optional[Switch]]:
        """A free item among the first ``window`` the view holds, marked
        :meth:`taken`; or None.  ``rng``: randrange() and choice() (the driver's
        random source).

        With a window of more than one (other consumers race for the head),
        the view walks forward from a random place in it, and jumps to
        another after each miss (:meth:`missed`): consumers spread over the
        backlog in runs, so they rarely try the same item, and a quiet view's
        stale items (taken by others since its listing) cost one miss per
        run that reaches them rather than one per item.  A walk that reaches
        the end of the window goes on from the head (:meth:`_walk`), so the
        oldest items do not wait for a random place to land on them.  After
        JUMPS walks, or with a window of one, a random one of the head's
        first items.  Never an item put after what the view knows of work/.
        """
        for _ in range(JUMPS if window > 1 else 0):
            found = self._walk(min(window, bisect.bisect_right(
                self.free, _id_at(self.offer_upto))), rng)
            if found is not None:
                self.tried(found[0])
                return found, self.switch_due()
        head, switch = self.candidates(min(window, PROBES))
        if not head:
            return None, switch
        found = rng.choice(head)
        self.tried(found[0])
        return found, switch

    def tried(self, item_id: str) -> None:
        """A claim picked the item: :meth:`taken`, and one more try since the listing."""
        self.tries += 1
        self.picked.add(item_id)
        self.taken(item_id)

    def _walk(self, end: int, rng: Any) -> Optional[Candidate]:
        """The first free item from the cursor on (among the first ``end``).

        A walk that reaches the end of the window goes on from the head, not
        from a random place: the window narrowed past the cursor, or the
        walk went through the newest items, and what is left behind it is
        the oldest (a consumer left alone would otherwise claim out of put
        order whenever its narrowing window left the cursor outside)."""
        if end <= 0 or not self.free:
            return None
        if self.cursor is None:
            self.cursor = self.free[rng.randrange(min(end, len(self.free)))]
        start = bisect.bisect_left(self.free, self.cursor)
        if start >= end:
            start = 0
        stop = min(end, start + PROBES)
        for position in range(start, min(stop, len(self.free))):
            item_id = self.free[position]
            if self.is_free(item_id) and self.items[item_id][0] <= self.offer_upto:
                self._drop_taken(start, position)
                self.cursor = item_id
                return item_id, Version(*self.items[item_id])
        dropped = self._drop_taken(start, stop)
        if stop >= end:  # the window's end: from the head next time
            self.cursor = self.free[0] if self.free and start > 0 else None
        elif not dropped:  # free items changed since the view's listing: jump
            self.cursor = None
        return None  # else the next walk goes on where this one stopped

    def _drop_taken(self, start: int, stop: int) -> bool:
        """Forget the listed places in ``free[start:stop]`` of items not free
        (this process's claims, known locks): a walk goes on past them rather
        than jumping away (so a consumer left alone does not jump over its
        own claims, out of put order).  Free again, an item is listed anew
        (make_free, which every way back to free goes through)."""
        kept: List[str] = []
        gone: List[str] = []
        for item_id in self.free[start:stop]:
            (kept if self.is_free(item_id) else gone).append(item_id)
        return self._unlist(start, stop, kept, gone)

    def _unlist(self, start: int, stop: int, kept: List[str], gone: List[str]) -> bool:
        """``free[start:stop]`` becomes ``kept``, and ``gone`` leaves ``in_free``;
        whether any went."""
        if gone:
            self.free[start:stop] = kept
            self.in_free.difference_update(gone)
        return bool(gone)

    def walk_from_head(self) -> None:
        """The next walk starts at the head: the consumer looks alone."""
        self.cursor = self.free[0] if self.free else None

    def missed(self, item_id: Optional[str] = None) -> bool:
        """A claim found its item taken or gone.  True when a quiet view should
        list work/ again: its misses reached :attr:`miss_limit`.  ``item_id``
        picked before the listing: not one of its tries (the miss rate)."""
        self.misses += 1
        if item_id is not None and item_id not in self.picked:
            self.old_misses += 1
        self.cursor = None  # another consumer's run, or a stale one: jump
        return not self.watching and self.misses >= self.miss_limit

    def taken(self, item_id: str) -> None:
        """A claim attempt of this process on the item is under way: offer it to no other."""
        self.trying.setdefault(item_id, -1)

    def locked_at(self, item_id: str, index: int, *, refused: bool = False,
                  won: bool = False, since: Optional[int] = None,
                  now: float = 0.0) -> None:
        """The attempt ended (:meth:`taken`): the item's lock (ours, or the claim
        that beat us) existed at etcd index ``index`` (0: at some time before).
        ``since``: the index at which the watching round's stream began.

        A later sign that the lock is gone frees the item: a listing of locks/
        or an event, also one that came while the attempt was under way.

        ``refused``: C1 was refused at ``index``, etcd's index then: the key
        was there at that index, even if the view took the lock for gone at
        that very index.  Then the refusal wins, until a newer sign: the key
        holds something no listing or read of locks/ shows (a directory: its
        removal is an event), or the view's sign was its own making (a
        release that reported a delay lock past its expiry, not yet removed
        by etcd, as given back at once).  Not a C2 that found the item
        claimed since: its index is the item's, which a listing at that index
        may rightly show without a lock (a late C2 whose lock expired).

        ``won``: the claim is ours (C2 at ``index``): the item is :attr:`own`
        until :meth:`disowned`, unless its lock was seen gone since.

        An attempt under way when etcd's history changed makes no sign: its
        ``index`` may be the old history's (``trying``).
        """
        gone = self.trying.pop(item_id, None)
        if gone is None:
            return  # forgotten meanwhile, or another thread's attempt ended it
        if gone == math.inf:  # the history changed meanwhile: ``index`` may be the old one's
            self.make_free(item_id)
            return
        self._told(index)
        if index > self.wrote.get(item_id, 0) and item_id in self.items:
            self.wrote[item_id] = index
        if refused and 0 < index == max(gone, self.gone.get(item_id, -1)):
            self.gone.pop(item_id, None)
            gone = -1
        if index > gone:
            self.locked(item_id, index)
            if won and item_id in self.locks:
                self.own.add(item_id)
            elif self.watching and index <= self.confirm_upto and not (
                    refused and index >= (since or math.inf)):
                # A sign from before the watching listing, which did not see
                # it: that lock may have gone unheard.  Not a refusal at or
                # after the stream began: the lock was there then, so its end
                # comes as an event (checking it would retry a junk lock
                # every CONFIRM).
                self.plan_confirm(now)
        elif self.locks.get(item_id, -1) <= gone:
            self.locks.pop(item_id, None)  # gone since: free
        self.make_free(item_id)

    def untaken(self, item_id: str) -> None:
        """Undo :meth:`taken` after a claim attempt failed before reaching etcd."""
        self.own.discard(item_id)
        if self.trying.pop(item_id, None) is not None:
            self.make_free(item_id)

    def finished(self, item_id: str, index: int = 0) -> None:
        """The item is gone (completed, dead-lettered, found gone): never offered again.

        F3 and F4 are committed together and their events may come in either
        order; without this, the lock's removal (or its expiry, when F4 is
        skipped) could offer the item again.  ``index``: where this process's
        last write of the item applied (F1, the commit): a listing read after
        it shows that version, which the left mark must cover."""
        self._told(index)
        if index > self.wrote.get(item_id, 0):
            self.wrote[item_id] = index
        self.forget(item_id)

    def skip_version(self, item_id: str, index: int, raw: Optional[str]) -> None:
        """Never offer this version of the item again (it is junk): the one
        written at ``index`` with the value ``raw`` (as the view offered it)."""
        self._told(index)
        self.skip[item_id] = (index, digest(raw))

    # -- own puts ---------------------------------------------------------------------
    def added(self, item_id: str, seen: Version) -> None:
        """This process wrote the item (a put, a requeue) or read it back after
        a lost reply, at version ``seen``: offer it before etcd's event arrives."""
        self._told(seen.index)
        if self.ready and seen.index > self.items.get(item_id, (0, None))[0]:
            self.apply_item(item_id, seen.index, seen.raw)

    def delayed(self, item_id: str, seen: Version, lock_index: int, ttl: float,
                now: float) -> None:
        """This process put a delayed item (D2 wrote it, or read it back, at
        version ``seen``): offer it once its delay lock, created at
        ``lock_index``, expires in about ``ttl`` seconds.

        A watching view that knows of etcd's writes past that index saw the
        lock come (and maybe go) itself.  A quiet view may have listed the item
        (a relist of work/ between D2 and now) but never the lock: it always
        notes the lock and when it is due.
        """
        self._told(seen.index, lock_index)
        known = seen.index <= self.items.get(item_id, (0, None))[0]
        if not self.ready or (known and self.watching):
            return  # the next listing has it; or it is known (or finished) already
        if lock_index > self.known or not self.watching:
            self.locked(item_id, lock_index)
        self.plan_delay(item_id, ttl, now)
        if not known:
            self.apply_item(item_id, seen.index, seen.raw)

    def returned(self, item_id: str, seconds: float, index: int, now: float) -> None:
        """A claim of this process gave the item back (release, or fail with a
        retry) at etcd ``index``, claimable again in ``seconds``.  Now: free,
        before etcd's event arrives (unless locked again since).  Later: note
        when etcd expires its delay lock, so that a quiet view, which hears no
        expiry, lists locks/ then rather than up to a lock TTL later; a listing
        older than ``index``, which shows our claim's lock, does not undo that."""
        self._told(index)
        if not seconds:
            self.unlocked(item_id, index)
        elif item_id in self.locks:
            self.given_back[item_id] = index
            self.plan_delay(item_id, seconds, now)
        self.disowned(item_id, now)

    def disowned(self, item_id: str, now: float) -> None:
        """The claim of this process on the item ended, or its heartbeat stopped
        keeping its lock (lost: the lock may have expired while the process
        was paused, or unheard while the view was quiet): the item's sign is
        no longer :attr:`own`, and a watching view whose listing may predate
        the lock's end checks it CONFIRM s from now (the round's own check
        may have passed it by as own)."""
        if item_id not in self.own:
            return
        self.own.discard(item_id)
        if self.watching and self.locks.get(item_id, math.inf) <= self.confirm_upto:
            self.plan_confirm(now)

    def catch_up_how(self) -> str:
        """How a catch-up whose items' events did not come (or a quiet view's)
        learns of work/: "list work" (a quiet view lists work/ in the claimer's
        thread and stays ready), "offer own" (the watching round's last listing
        of work/ failed: a new round, unready, would fail claims), or "relist"
        (a new round)."""
        if not self.watching:
            return "list work"
        return "offer own" if self.unlisted else "relist"

    def relist_how(self) -> str:
        """How a view that claims found stale lists again: "relist" (a watching
        view: a new round, subscribe and list) or "list work" (a quiet view:
        work/ only, in the claimer's thread, staying ready)."""
        return "relist" if self.watching else "list work"

    def offer_own(self, upto: int) -> None:
        """A catch-up could not learn of work/ up to ``upto``: this process's own
        items up to there are offered without it (put order with other
        producers' items waits for a listing that works)."""
        self.own_upto = max(self.own_upto, upto)

    def plan_delay(self, item_id: str, seconds: float, now: float) -> None:
        """The item's delay lock expires in about ``seconds`` (see tick)."""
        self.delays[item_id] = now + seconds
        self.next_delay = min(self.next_delay, self.delays[item_id])

    # -- time ---------------------------------------------------------------------------
    def tick(self, now: float) -> Check:
        """The time: offer the orphans due, and say what the claim round lists
        first (the first due deadline of DEADLINES with a check).

        A confirm check due lists locks/ only if an item is still taken on a
        sign up to the watching listing (:meth:`unconfirmed`); a full listing
        (work/ too), because a taken item whose lock went may have been
        finished meanwhile (the view no longer sees records): only work/ tells.
        """
        self.offer_due(now)
        for rule in DEADLINES.values():
            if rule.check is None or rule.when(self) > now:
                continue
            if rule.check == "confirm":
                self.confirm_at = math.inf
                if not self.unconfirmed():
                    continue
            return rule.check
        return None

    def offer_due(self, now: float) -> None:
        """Offer the orphans whose F3 event is overdue: a claim finishes them."""
        for item_id, due in list(self.orphans.items()):
            if due <= now:
                del self.orphans[item_id]
                self.make_free(item_id)

    def plan_confirm(self, now: float) -> None:
        """Check the signs up to confirm_upto CONFIRM s from now, or sooner if planned."""
        self.confirm_at = min(self.confirm_at, now + CONFIRM)

    def unconfirmed(self) -> bool:
        """Whether an item still in work/ is taken on a sign no newer than the
        listing of the view's watching follower: its lock may have gone before
        the watch began, and no event would say so.  At the listing's own index
        too: a sign read off work/ is the index of the item's last write (a C2,
        R0 or F1, fenced on the item, not the lock), which may have landed after
        its lock expired.  Not an item of this process's live claims (own):
        its heartbeat keeps that lock, and disowned() plans a check if it stops."""
        upto, own = self.confirm_upto, self.own
        return any(at <= upto and item_id in self.items and self.read_signs.get(item_id) != at
                   and item_id not in own for item_id, at in self.locks.items())

    def confirm_unlisted(self, now: float) -> None:
        """The confirm check's listing of locks/ failed: not given up, the check
        is due again CONFIRM later."""
        self.plan_confirm(now)

    def delays_unlisted(self, now: float) -> None:
        """The listing of locks/ for due delays failed: tried again CONFIRM later
        (failing the claim would hand out nothing while such listings fail)."""
        self.next_delay = now + CONFIRM

    def close(self) -> None:
        """No more rounds; claims and waits end."""
        self.closed = True

    # -- rounds (the follower) --------------------------------------------------------------
    def new_round(self, *, watching: bool, list_locks: bool = False) -> Optional[Round]:
        """A new follower's round in place of the current one (None: closed).
        Everything an older round reports from now on is ignored."""
        if self.closed:
            return None
        self.generation += 1
        self.watching = watching
        self.round_listed_at = math.inf
        self.started += 1
        self.round_sent = self.started  # the replaced round's listing is never applied
        self._keep_needed_marks()
        return Round(self.generation, watching, list_locks, self.started, self.history,
                     self.highest)

    def switch(self, *, watching: bool, list_locks: bool = False) -> Optional[Round]:
        """A new round in the other mode, or None if the view is in that mode already."""
        if self.watching == watching:
            return None
        return self.new_round(watching=watching, list_locks=list_locks)

    def round_listing(self, round_: Round) -> Round:
        """The round for its next listing of work/, numbered as it is sent: a
        round lists again after each failure and each stream, and each
        listing is older or newer than a relist by when it was sent and
        answered, never by when its round began (fresher_than_applied)."""
        self.started += 1
        if round_.generation == self.generation:
            self.round_sent = self.started
            self._keep_needed_marks()
        return replace(round_, started=self.started, history=self.history,
                       highest=self.highest)

    def start_relisting(self) -> bool:
        """A claim asks for a new round (subscribe, list); True: start it (False:
        another one's, or the first listing, is under way)."""
        under_way = not self.ready
        self.ready, self.error = False, None
        return not under_way

    def round_failed(self, round_: Round, exc: BaseException) -> bool:
        """The round raised: its error, for waiting claims (a replaced round's is moot)."""
        if round_.generation != self.generation:
            return False
        self.error = exc
        self._round_settled()
        return True

    def work_unlisted_by_round(self, round_: Round) -> None:
        """The round's listing of work/ failed: a catch-up offers own items."""
        self.unlisted = self.unlisted or round_.generation == self.generation
        if round_.generation == self.generation:
            self._round_settled()

    def plan_round(self, round_: Round, work: List[Entry]) -> RoundPlan:
        """What the round lists after its listing of work/.

        Every view lists locks/ for new delayed items, which it would
        otherwise try each, in this round, so that no claim finds them taken
        before it is applied; and a watching view for old signs, unless they
        are few: it reads their locks instead.  A quiet view's listing of
        locks/ made for them only may fail without failing the round.  Not one
        the round was asked for: a first listing has nothing to go on, and a
        view going quiet must learn its delay locks.  Called as the listing of
        work/ is handed in: its number as answered (fresher_than_applied)."""
        self.started += 1
        delayed = self.new_delayed(work)  # once: it decodes each new item
        noted = self._noted_before(work) if round_.watching else []
        list_locks = round_.list_locks or bool(delayed) or len(noted) > FEW_LOCKS
        return RoundPlan(delayed, list_locks, [] if list_locks else noted,
                         may_fail=not round_.watching and not round_.list_locks,
                         answered=self.started)

    def apply_round(self, round_: Round, work: Listing, plan: RoundPlan,
                    locks: Optional[Listing], reads: Sequence[LockRead],
                    now: float, wall: float) -> bool:
        """Apply the round's listings (``locks`` None: not listed, or failed as
        ``plan`` allowed) and lock reads; False if the round was replaced: an
        older listing applied after the successor's events could mark a
        released item locked for good.  None of them if etcd's history changed
        since its listing of work/ was sent (``history``): its indexes may be
        the old history's.  The listing that tells the change keeps its own
        listing and reads of locks/, sent after its reply came."""
        if round_.generation != self.generation:
            return False
        work_index, entries = work
        current = round_.history == self.history
        if current and self._fresh(round_, plan.answered, work_index):
            self.take_listing(work_index, self.not_left(round_.started, entries),
                              plan.delayed)
        self._round_settled()
        if current:
            self._apply_round_locks(round_, work_index, plan, locks, reads, now, wall)
        if round_.watching:
            self.round_listed_at = now
        self.ready, self.error = True, None
        return True

    def _apply_round_locks(self, round_: Round, work_index: int, plan: RoundPlan,
                           locks: Optional[Listing], reads: Sequence[LockRead],
                           now: float, wall: float) -> None:
        """apply_round's listing and reads of locks/, and the confirm check up to
        its listing of work/ (at ``work_index``)."""
        if locks is not None:
            self.reconcile_locks(locks[0], locks[1], now=now, wall=wall)
        elif plan.delayed:  # the next claim lists locks/ first
            self.next_delay = -math.inf
        self._apply_lock_reads(reads)
        self.confirm_upto, self.confirm_at = work_index, math.inf
        if round_.watching and locks is None and self.unconfirmed():
            self.plan_confirm(now)

    def round_over(self, round_: Round, now: float) -> bool:
        """The round has trusted its stream long enough (ROUND after its listing)."""
        return round_.generation != self.generation or now >= DEADLINES["round end"].when(self)

    def stream_idle(self, round_: Round, now: float, idle_timeout: float) -> float:
        """How long the stream may stay silent: idle_timeout, cut short at the round's end."""
        if round_.generation != self.generation:
            return idle_timeout  # replaced: stopped, its stream closed
        return min(idle_timeout, DEADLINES["round end"].when(self) - now)

    def apply_block(self, round_: Round, block: bytes, floors: Dict[str, int],
                    now: float) -> bool:
        """Apply a block of events, each only if newer than its directory's
        listing (``floors``: directory -> index).  True when a claim waiting to
        catch up may go on (work/ is known up to what it waits for)."""
        if round_.generation != self.generation:
            return False  # replaced: its successor's listing covers these events
        for action, key, value, is_dir, index in _EVENT.findall(block):
            number = int(index)
            if number > self.highest:
                self.highest = number
            self._apply_event(action, key.decode("utf-8", "replace"), value, is_dir,
                              number, floors, now)
            if round_.watching:  # events come in etcd's order: work/ is known up to here
                self.known = max(self.known, number)
        return bool(self.behind) and self.known >= self.behind

    def _apply_event(self, action: bytes, key: str, value: bytes, is_dir: bytes, index: int,
                     floors: Dict[str, int], now: float) -> None:
        parsed = self.layout.split(key)
        if parsed is None or (is_dir and parsed[0] != "locks"):
            return  # not an item
        if is_dir:  # junk at a lock's key: C1 is refused until it goes
            if action in _REMOVED:
                self.unlocked(parsed[1], index)
            return
        if parsed[0] in _RECORDS:
            self._record(parsed[1], now)
        elif index <= floors[parsed[0]]:
            return  # already in the listing
        elif parsed[0] == "work":
            self._apply_work(action, parsed[1], value, index)
        elif action in _REMOVED:
            self._lock_removed(action, parsed[1], index, now)
        elif action != _CLAIMED:  # a lock's CAS keeps it locked (a release delay)
            self.locked(parsed[1], index)

    def _lock_removed(self, action: bytes, item_id: str, index: int, now: float) -> None:
        self.unlocked(item_id, index)
        if item_id in self.recorded:
            # Expired: its finisher died before F3.  Deleted (F4): F3 was sent
            # with it, but may never apply (lost, the finisher gave up or died).
            self.recorded.discard(item_id)
            if action == _EXPIRED:
                self.make_free(item_id)  # a claim finishes it (F3, F4)
            else:
                self.orphans[item_id] = now + self.orphan_delay

    def _record(self, item_id: str, now: float) -> None:
        """An outcome record (F2) of the item: it is finished, offer it no more.

        While the whole directory is watched and its finisher's lock is
        there, the item stays known until F3 removes it from work/: if the
        lock expires first, its finisher died between F2 and F3, and a claim
        must finish the item.  Otherwise (a quiet view has no events: a stale
        one) it is forgotten; a finisher's crash is then found by the next listing.
        """
        if not self.watching or item_id not in self.items:
            self.forget(item_id)
        elif item_id in self.locks:
            self.recorded.add(item_id)
        else:  # its finisher's lock expired before F1: offered if F3 is overdue
            self.orphans[item_id] = now + self.orphan_delay

    def _apply_work(self, action: bytes, item_id: str, value: bytes, index: int) -> None:
        if action in _REMOVED:
            self.forget(item_id)
        elif action == _CLAIMED:
            if item_id in self.items:
                # A claim reads it afresh.  Not a sign of a lock: the lock's own
                # events tell, and a commit (F1) may apply after the lock expired.
                self.items[item_id] = (index, None)
        elif action in _WRITTEN:
            self.apply_item(item_id, index, _unescape(value))  # the event's own node

    # -- a claimer's relist (a quiet view) ------------------------------------------------
    def start_relist(self, now: float, *, full: bool = False,
                     catching_up: bool = False) -> Optional[Relist]:
        """A quiet view lists work/ again in the claimer's thread (None: not now:
        one is under way, the view watches, or a gate of DEADLINES is closed).
        ``full``: locks/ too, once per lock TTL.  A catch-up waits CONFIRM after
        the last failure, not the misses' backoff: put order waits for it."""
        gate = DEADLINES["catch-up relist" if catching_up else "misses' relist"]
        if self.listing or self.watching or self.closed or (
                not full and now < gate.when(self)):
            return None
        self.listing = True
        self.started += 1
        self.relist_sent = self.started
        return Relist(self.generation, full, self.started, self.history, self.highest)

    def plan_relist(self, relist: Relist, work: List[Entry]) -> RelistPlan:
        """What a relist lists after work/: locks/ for the listing's new
        delayed items new since the last try (those noted before are the next
        claim's to list for: listing for them here too would cost each claim
        that misses a timeout while listings of locks/ fail), or for a full
        listing.  Called as the listing of work/ is handed in: its number as
        answered (fresher_than_applied)."""
        self.started += 1
        delayed = self.new_delayed(work)
        new = delayed - set(self.unplanned)
        return RelistPlan(delayed, new, list_locks=bool(new) or relist.full,
                          answered=self.started)

    def end_relist(self) -> None:
        """The claimer's relist is over: a starved claim may wait for it."""
        self.listing = False
        self.relist_sent = None
        self._keep_needed_marks()

    def apply_relist(self, relist: Relist, work: Listing, plan: RelistPlan,
                     locks: Optional[Listing], now: float, wall: float) -> None:
        """Apply a claimer's relist (``locks`` None: not listed, or failed).
        Nothing of it if etcd's history changed since it was sent (``history``)."""
        current = relist.generation == self.generation and relist.history == self.history
        if current and self._fresh(relist, plan.answered, work[0]):
            self.take_listing(work[0], self.not_left(relist.started, work[1]), plan.delayed)
        self.end_relist()
        if not current:
            return  # the new follower lists for itself; or old-history indexes
        if locks is not None:  # work/ and locks/ listed in turn: a full listing
            self.reconcile_locks(locks[0], locks[1], now=now, wall=wall)
        else:
            self._locks_unlisted_due(plan.new, relist.full, now)

    def _locks_unlisted_due(self, new: Set[str], full: bool, now: float) -> None:
        """A relist listed no locks/, or that failed.  New delayed items are
        offered (a claim finds a delay lock at C1), but the next claim lists
        locks/ first, not a relist after some miss or a lock TTL later; not for
        those noted before, whose retry stays CONFIRM after its last failure.
        A failed listing once per lock TTL is due again CONFIRM later, then
        twice as long after each failure, up to a lock TTL: each costs its
        claim a request's deadline."""
        if new:
            self.next_delay = -math.inf
        if full:
            self.locks_retry = min(self.lock_ttl, max(CONFIRM, 2 * self.locks_retry))
            self.locks_listed = now - self.lock_ttl + self.locks_retry

    def work_unlisted(self, relist: Relist, now: float) -> float:
        """A relist could not list work/: the claim goes on with what the view
        holds, and no miss lists again for CONFIRM, then twice as long after
        each failure, up to a lock TTL; a full listing is due again after the
        same time.  Returns the backoff's seconds."""
        self.end_relist()
        self.work_retry = min(self.lock_ttl, max(CONFIRM, 2 * self.work_retry))
        self.work_failed_at = now
        self.relist_after = now + self.work_retry
        if relist.full:  # not on locks_retry, which a due delay's listing of locks/ resets
            self.locks_listed = now - self.lock_ttl + self.work_retry
        return self.work_retry

    def apply_locks(self, generation: int, relists: Optional[int], locks: Listing, *,
                    full: bool, history: int, now: float, wall: float) -> None:
        """Apply a listing of locks/ decided at ``generation`` (and, for a
        confirm check, at listing ``relists``) and sent at ``history``: in a
        quiet view, to delayed items only unless ``full``.  A round that took
        over since lists locks/ itself, and may have applied newer events
        already; and if the view listed again since, that listing and its own
        check stand (applied after it, this older one would mark locked an
        item whose lock had expired unheard).  Nor if etcd's history changed
        since it was sent: its signs may be the old history's, at indexes no
        new sign outweighs."""
        if generation == self.generation and relists in (None, self.relists) and (
                history == self.history):
            self.reconcile_locks(locks[0], locks[1], delays=not self.watching and not full,
                                 now=now, wall=wall)

    # -- listings -------------------------------------------------------------------------
    def new_delayed(self, work: List[Entry]) -> Set[str]:
        """The items of a listing of work/ that are new to the view and carry
        ``"q"`` (a delayed put, among others), or that an earlier listing showed
        so and whose delay lock is not planned yet (:attr:`unplanned`): their
        delay locks must be planned, so locks/ is listed too."""
        return {entry.id for entry in work if entry.id in self.unplanned or (
            entry.id not in self.items and _maybe_delayed(entry.value))}

    def _noted_before(self, work: List[Entry]) -> List[str]:
        """The items of a listing of work/ taken on a sign the view had at its
        previous listing: that lock may have gone while the view was quiet,
        so a view that starts watching checks them at once (their locks read,
        or locks/ listed if there are more than FEW_LOCKS).  Newer signs
        (misses, claims seen in this listing) wait for the confirm check.  Not
        the items of this process's live claims (own): their locks are there."""
        known, own = self.known, self.own
        return [entry.id for entry in work
                if self.locks.get(entry.id, known + 1) <= known and entry.id not in own]

    def fresher_than_applied(self, sent: int, answered: int, index: int) -> bool:
        """Whether a listing of work/ sent and answered as numbered (``started``
        then), taken at ``index``, may replace the view's: compared with the
        last applied one, by real time first.  Answered before that one was
        sent, it is older: it would drop the items put in between, unoffered
        until the next listing (a round's and a claimer's relist race in one
        quiet round).  Sent after that one was answered, it is newer, at any
        index: an index that went back (a restore, a restart without its
        data) does not freeze the view.  Their reads overlapped in time: by
        index, which orders two reads of one etcd's history (the only case
        left that an index can tell).  True also records it as the applied one."""
        if answered < self.applied_sent:
            return False
        if sent < self.applied_answered and index < self.applied_index:
            return False
        self.applied_sent, self.applied_answered, self.applied_index = sent, answered, index
        return True

    def _fresh(self, sent: Union[Round, Relist], answered: int, index: int) -> bool:
        """Whether the listing of work/ ``sent`` (a Round or Relist, as numbered
        when it was sent) is applied (fresher_than_applied); if so, and read
        at an index lower than the highest the view had been told of when it
        was sent, or lower than the last applied one's though sent after that
        one was answered, etcd's history changed (_history_changed)."""
        later_and_lower = sent.started > self.applied_answered and index < self.applied_index
        if not self.fresher_than_applied(sent.started, answered, index):
            return False
        if later_and_lower or index < sent.highest:
            self._history_changed(index, sent.started)
        return True

    def _history_changed(self, index: int, started: int) -> None:
        """A listing of work/ read at ``index``, lower than etcd's history
        allows (_fresh), is about to be applied: etcd was restored from an
        older snapshot or restarted without its data, and every index the
        view holds is of the old history.  An old sign at an index above ``index`` would outweigh
        every sign of the new one below it (a lock sign keeps its item taken,
        a gone mark drops new locks, a left mark hides an item written
        again), so each index-keyed field is dropped or re-based to ``index``.
        Requests sent before this and answered after it are dropped
        (``history``); claim attempts under way make no sign (``trying``)."""
        self.history += 1
        self.items.clear()  # every item of the listing is new: its claim token is a sign
        self.locks.clear()
        self.gone.clear()
        # The marks made while this listing (the ``started``-th) was under way
        # hide what the view held of their items, or older, as before: the
        # listing may have been read before they left (a finished item is not
        # offered again).  Our own writes' indexes may be the old history's,
        # and outweigh a new write of the id: they count no more.  Older marks
        # served only listings sent earlier, which are dropped now.
        self.left = {i: (at, version, version) for i, (at, _, version) in self.left.items()
                     if at >= started}
        self.wrote.clear()
        self.skip.clear()  # an id's index may hold another write now: checked again
        self.read_signs.clear()
        self.own.clear()  # our locks may be gone with the old history: checked as any sign
        self.trying = dict.fromkeys(self.trying, math.inf)
        self.delays.clear()  # delay locks and given back items: learned anew ...
        self.given_back.clear()
        self.next_delay = -math.inf  # ... the next claim of a quiet view lists locks/
        self.unplanned = dict.fromkeys(self.unplanned, index)  # shown by this listing
        self.confirm_upto, self.behind, self.highest = index, 0, index

    def not_left(self, started: int, work: List[Entry]) -> List[Entry]:
        """The entries of a listing of work/, the ``started``-th, about to be
        applied, without the items forgotten after it was sent (:attr:`left`):
        it may have been taken before they left.  Marks are dropped only as
        the listings sent before them settle (_keep_needed_marks)."""
        if not self.left:
            return work
        left = self.left
        return [entry for entry in work
                if entry.id not in left or not _hidden(left[entry.id], started, entry.index)]

    def _round_settled(self) -> None:
        self.round_sent = None
        self._keep_needed_marks()

    def _oldest_outstanding(self) -> float:
        sent = [n for n in (self.round_sent, self.relist_sent) if n is not None]
        return min(sent, default=math.inf)

    def _keep_needed_marks(self) -> None:
        """Drop the marks no outstanding listing of work/ was sent by: every
        listing that could bring their items back has settled."""
        if self.left:
            oldest = self._oldest_outstanding()
            self.left = {i: mark for i, mark in self.left.items() if mark[0] >= oldest}

    def take_listing(self, index: int, work: List[Entry], delayed: Set[str]) -> None:
        """Apply a listing of work/ taken at ``index``; ``delayed``: its items
        whose delay lock is to be planned (new_delayed).

        An item claimed since the view last saw it (a new version that carries
        a claim token: C2 wrote it under the claim's lock) is taken at that
        version's index, as if a claim of ours had lost the race for it:
        running elsewhere, most likely.  Without that, every item others were
        running would look free after a relist and cost a miss each.  It is
        freed as any taken item is: by a listing of locks/ without its lock,
        or an event.

        Listings of work/ answer again: a miss may list at once.
        """
        self.relist_after, self.work_retry, self.unlisted = -math.inf, 0.0, False
        self._told(index)
        for entry in work:
            if entry.index != self.items.get(entry.id, (0, None))[0] and _claimed(entry.value):
                self.locked(entry.id, entry.index)
        self.items = {e.id: (e.index, _cacheable(e.value)) for e in work}
        self.gone = {i: at for i, at in self.gone.items() if i in self.items}
        self.wrote = {i: at for i, at in self.wrote.items() if i in self.items}
        for item_id in delayed:  # the oldest listing that showed it
            self.unplanned[item_id] = min(self.unplanned.get(item_id, index), index)
        self.unplanned = {i: at for i, at in self.unplanned.items() if i in self.items}
        self.free = [e.id for e in work]
        self.in_free = set(self.free)
        self.recorded.clear()  # one still in work/ now is one a claim must finish
        self.orphans.clear()
        self.known, self.own_upto = index, 0
        self.misses, self.tries, self.listed_free, self.cursor = 0, 0, len(work), None
        self.picked.clear()
        self.old_misses = 0
        self.relists += 1
        self.version += 1

    def reconcile_locks(self, index: int, locks: List[Entry], *, delays: bool = False,
                        now: float, wall: float) -> None:
        """Apply a listing of locks/ taken at ``index``; ``delays``: free only
        items whose known delay lock went, or that waited for a listing of
        locks/ to plan theirs (the others may have been finished)."""
        listed = {entry.id: entry.index for entry in locks}
        self._told(index)
        # Their delay locks were there before them (D1 before D2): planned now.
        planned = {i for i, at in self.unplanned.items() if at <= index}
        for item_id in [i for i in {**self.locks, **self.trying} if i not in listed]:
            if not delays or item_id in self.delays or item_id in planned:
                self.unlocked(item_id, index)
        for item_id, lock_index in listed.items():
            if item_id in self.items:  # not the lingering locks of finished items
                self.locked(item_id, lock_index)
        self._plan_delays(locks, now, wall)
        self.unplanned = {i: at for i, at in self.unplanned.items() if i not in planned}
        if self.unplanned:  # an older listing: the next claim lists locks/ again
            self.next_delay = -math.inf
        self.locks_retry = 0.0  # listings of locks/ work again: no backoff
        if not delays:  # a delays-only listing leaves the other taken items as they were
            self.locks_listed = now

    def _plan_delays(self, locks: List[Entry], now: float, wall: float) -> None:
        """Note when etcd expires each listed delay lock of a known item, so that
        a tick lists locks/ then, not a lock TTL later.  One that is due but
        not swept yet (etcd sweeps every 0.5 s) is listed again soon."""
        for entry in locks:
            if entry.id in self.items and entry.expiration and _is_delay(entry.value):
                self.delays[entry.id] = now + max(_expires_in(entry, wall), RELIST_DUE)
            elif entry.index >= self.given_back.get(entry.id, 0):
                self.delays.pop(entry.id, None)  # a claim's lock: refreshed, not waited for
        for item_id in [i for i in self.delays if i not in self.locks]:
            del self.delays[item_id]
        for item_id in [i for i in self.given_back if i not in self.delays]:
            del self.given_back[item_id]
        self.next_delay = min(self.delays.values(), default=math.inf)

    def _apply_lock_reads(self, reads: Sequence[LockRead]) -> None:
        """Apply reads of single locks, each at its etcd index: a lock there is
        a sign at that index (at or after the round's stream began, so its
        later changes come as events, and no confirm check is needed for it:
        read_signs), a lock gone frees the item as a listing of locks/
        without it would."""
        self.read_signs = {}
        for item_id, index, lock in reads:
            self._told(index)
            if lock is None:
                self.unlocked(item_id, index)
            elif item_id in self.items:
                self.locked(item_id, index)
                if self.locks.get(item_id) == index:
                    self.read_signs[item_id] = index

    # -- the items' bookkeeping ----------------------------------------------------------
    def make_free(self, item_id: str) -> None:
        """Every way back to free goes through here: listed anew, claimers woken."""
        if self.is_free(item_id):
            if item_id not in self.in_free:
                bisect.insort(self.free, item_id)
                self.in_free.add(item_id)
            self.version += 1

    def forget(self, item_id: str) -> None:
        """The item left work/: a listing started before now does not bring it back (left)."""
        held = self.items.pop(item_id, None)
        wrote = self.wrote.pop(item_id, 0)
        if self._oldest_outstanding() <= self.started:  # a listing sent by now may show it
            version = math.inf if held is None else held[0]
            self.left[item_id] = (self.started, max(version, wrote), version)
        self.locks.pop(item_id, None)
        self.gone.pop(item_id, None)
        self.trying.pop(item_id, None)
        self.recorded.discard(item_id)
        self.orphans.pop(item_id, None)
        self.unplanned.pop(item_id, None)
        self.own.discard(item_id)

    def apply_item(self, item_id: str, index: int, value: Optional[str]) -> None:
        """The item's version ``index`` with ``value``: the value etcd wrote at
        that index, or None (never another version's: see Version)."""
        self.items[item_id] = (index, _cacheable(value))
        self.left.pop(item_id, None)  # written again (a requeue): in work/ once more
        self.make_free(item_id)

    def _told(self, *indexes: int) -> None:
        """The view was told of etcd indexes (a reply, an event): ``highest``."""
        self.highest = max(self.highest, *indexes)

    def locked(self, item_id: str, index: int) -> None:
        """A sign at ``index`` that the item is locked; ignored if its lock was
        seen gone since (an older listing applied late)."""
        if index > self.highest:
            self.highest = index
        if index > self.locks.get(item_id, 0) and index > self.gone.get(item_id, 0):
            self.locks[item_id] = index

    def unlocked(self, item_id: str, index: int) -> None:
        """The item's lock was gone at ``index``: free, unless locked again since.

        While a claim attempt on it is under way, remember ``index`` for
        :meth:`locked_at`, which learns only then at which index the lock existed.
        """
        if index > self.highest:
            self.highest = index
        if self.trying.get(item_id, index) < index:
            self.trying[item_id] = index
        # Only for items the view holds: a finished item's lock goes after the
        # item did, and noting it would keep one entry per item.
        if item_id in self.items and index > self.gone.get(item_id, 0):
            self.gone[item_id] = index
        if 0 <= self.locks.get(item_id, -1) <= index:
            del self.locks[item_id]
            self.delays.pop(item_id, None)
            self.make_free(item_id)


def digest(raw: Optional[str]) -> bytes:
    """What ``skip`` keeps of a junk value: small, whatever the value's size
    (b"": a version whose value the view did not hold)."""
    if raw is None:
        return b""
    return hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _hidden(mark: Tuple[int, float, float], started: int, index: int) -> bool:
    """Whether a listing started ``started``-th leaves out an entry at ``index``
    of an item forgotten with ``mark`` (ViewState.left): the listing started by
    then, and the entry is the version the view held or an older one."""
    return started <= mark[0] and index <= mark[1]


def _earliest(values: Any) -> float:
    return min(values, default=math.inf)


#: Every deadline of the view, in the order tick() takes them (the first due wins).
#: A time is runtime.monotonic() seconds; inf: not due.  docs/protocol.md, "Deadlines".
DEADLINES: Dict[str, Deadline] = {
    # Recorded items whose lock was deleted (F4) before F3 was seen: offered
    # once F3's event is overdue (the transport's deadline), at any tick.
    "orphan due": Deadline(lambda s: min(s.orphans.values()) if s.orphans else math.inf,
                           wakes=True),
    # A quiet view that knows of taken items lists work/ and locks/ a lock TTL
    # after its last full listing (a taken item's lock may have gone unheard).
    "full listing": Deadline(
        lambda s: s.locks_listed + s.lock_ttl if not s.watching and s.locks else math.inf,
        check="full"),
    # A watching view checks the signs up to its listing CONFIRM s after it.
    "confirm check": Deadline(lambda s: s.confirm_at if s.watching else math.inf,
                              check="confirm", wakes=True),
    # A quiet view lists locks/ when a delay lock of a known item is due.
    "delay due": Deadline(lambda s: s.next_delay if not s.watching else math.inf,
                          check="delays"),
    # Gates.  After a failed listing of work/: no miss lists it again before this.
    "misses' relist": Deadline(lambda s: s.relist_after),
    # A catch-up for own items lists at most once a CONFIRM while listings fail.
    "catch-up relist": Deadline(lambda s: s.work_failed_at + CONFIRM),
    # A watching round ends ROUND after its listing, events or not.
    "round end": Deadline(lambda s: s.round_listed_at + ROUND if s.watching else math.inf),
}


#: The deadlines next_deadline() and wake_due() take, picked once (DEADLINES is fixed).
_TICKING = tuple(rule.when for rule in DEADLINES.values() if rule.check is not None or rule.wakes)
_WAKING = tuple(rule.when for rule in DEADLINES.values() if rule.wakes)


def round_pause(pause: Optional[float]) -> float:
    """A follower's pause after a failed round, ``pause`` the last one (None: the first)."""
    return ROUND_PAUSE if pause is None else min(pause * 2, ROUND_PAUSE_MAX)


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
    """Seconds until etcd expires a listed key (<= 0: due), from ``wall`` (the host's clock).

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


def _unescape(value: bytes) -> str:
    """A JSON string's contents (as matched by _EVENT) as the string it encodes."""
    return json.loads(b'"' + value + b'"') if b"\\" in value else value.decode("utf-8")


def _cacheable(value: Optional[str]) -> Optional[str]:
    return value if value is not None and len(value) <= MAX_CACHED_VALUE else None
