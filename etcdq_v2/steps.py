"""The protocol's steps as sequences of requests, written without I/O.

A step is a generator: it yields a :class:`Request`, and its driver sends it
and sends back the reply, or throws into the generator the library's own
exception for it (errors.py: ``KeyMissing``, ``CompareFailed``,
``AlreadyExists``, ``Unavailable`` ...).  The next request depends on the
last reply, so the rule of each step is written once, here, whoever drives
it: the threaded driver (``driver.run``, behind :class:`~etcdq_v2.protocol.Protocol`),
the simulator, or a test with scripted replies (tests/test_steps.py).

    step = steps.take_step(item_id, held, seen)
    request = next(step)               # Request("PUT", "/etcdq/q/work/...", ...)
    request = step.send(reply)         # the next one, or StopIteration(value)
    request = step.throw(CompareFailed(...))

Nothing here reads a clock, a thread, a socket or a random source (a test
enforces the imports): the time comes from the driver (a ``NOW`` or ``WALL``
request), tokens and node ids are arguments.  docs/protocol.md names each
rule; this module holds, as generators:

P1          :meth:`Steps.post_step` (a lost reply's read-back:
            :meth:`Steps.find_puts_step`); put_many :meth:`Steps.post_many_step`
D1, D2      :meth:`Steps.put_delayed_step`
Q0-Q5       :meth:`Steps.requeue_step`
K1-K4       :meth:`Steps.cancel_step`
purge       :meth:`Steps.purge_step`
W2, get     :meth:`Steps.look_step`; whose record: :func:`record_finishes`
I1, I3, I4  :meth:`Steps.lock_import_step`, :meth:`Steps.import_value_step`,
            :meth:`Steps.refresh_import_lock_step` (I2, a streamed listing, is
            read by the driver: Protocol.begin_import)
C1          :meth:`Steps.lock_step`
C2, C3      :meth:`Steps.take_step` (the re-fence, a dead letter at max_attempts,
            finishing a crashed finisher's item: all within)
F1          :meth:`Steps.commit_step` (a failed compare read back)
F2-F4       :meth:`Steps.record_step`
F1-F4       :meth:`Steps.finish_step` (the dead letter of C3)
R0, R1      :meth:`Steps.release_step` (:meth:`Steps.give_back_step`,
            :meth:`Steps.unlock_step`); a failure's retry :meth:`Steps.retry_step`
heartbeat   :meth:`Steps.confirm_step` (an expired lock retaken:
            :meth:`Steps.retake_step`)
"""
from __future__ import annotations

import contextlib
import logging
import math
import typing
from dataclasses import dataclass, field, replace
from typing import (Any, Callable, Dict, Generator, Iterable, Iterator, List, Optional, Sequence, Set, Tuple,
                    TypeVar, Union)

from .codec import (IN_LOCK, IN_RECORD, Item, Junk, Lock, Record, check_outcome, failure_text,
                    tombstone, tombstone_token)
from .errors import (AlreadyExists, AmbiguousWrite, ClaimClosed, CompareFailed, EtcdqError,
                     EtcdRejected, KeyMissing, LockLost, NotFound, Unavailable)
from .keys import Layout, check_item_id
from .versions import Entry, Version

log = logging.getLogger("etcdq_v2.protocol")

COMPLETED, FAILED = "completed", "failed"

#: The reason of a dead letter made by cancel().
CANCELLED = "cancelled"

#: Times a requeue starts again when its mark is gone before Q2 or Q3 (each
#: time etcd was restored from a backup older than the mark).
REMARKS = 3

#: What a read of failed/<id> says of Q1's mark: still there, or turned into
#: the tombstone by another requeue that found our token (the requeue is done).
MARKED, DONE = "marked", "done"

#: Seconds a requeued dead letter stays as a tombstone, so that a late copy of
#: its F2 (held by a frozen member) finds the key taken instead of re-creating it.
TOMBSTONE_TTL = 7 * 24 * 3600

#: F4 (deleting the finisher's lock) is skipped when lock_ttl is at most this
#: many seconds: the lock is left to expire.  A finished item's lock holds
#: nothing (the item left work/ at F3, and readers count only locks of items
#: in work/), and an expiry is no write: one write and one request less per
#: item.  With a longer lock_ttl F4 is sent, so that locks/ never holds more
#: than about (rate x 60 s) finished items' locks: every view lists locks/,
#: and a large locks/ costs every consumer.
LINGER_MAX = 60

T = TypeVar("T")

#: A put's read-back reads the keys its POST can have taken one by one when they
#: are at most this many (see Steps.find_puts_step); more, and it lists.
SEARCH_SPAN = 128
#: Reads of one batch of that search, sent together.
SEARCH_BATCH = 16

#: Where a put's item is: its id, and its version in work/ (None: it is finished).
Place = Tuple[str, Optional[Version]]

#: What a look at one id finds (Steps.look_step): the item in work/ (None: gone),
#: and ``(kind, record)`` of its outcome (None: it has none yet).
Look = Tuple[Optional[Tuple[Entry, Item]], Optional[Tuple[str, Record]]]

#: What R1 (release, or a failure's retry) tells of an item given back: the
#: seconds until it is claimable again (its delay lock's TTL; 0: now), and the
#: etcd index at which R1 applied, so that a view does not let an older
#: listing undo what it learnt.
GivenBack = Tuple[int, int]


def ttl_seconds(seconds: float) -> int:
    """etcd TTLs are whole seconds: round up, never below 1."""
    return max(1, math.ceil(seconds))


#: The id of the import lock, ``locks/<IMPORT_LOCK>``: no write has index 0, so no
#: item has this id, and views and stats ignore its lock.
IMPORT_LOCK = "0" * 20


@dataclass
class ImportState:
    """An import under way (I1-I5)."""

    lock: Lock
    #: The put tokens in the queue: of what was there (I2), and of what we stored.
    tokens: Set[str]
    #: The index of our latest write, which names the next key (I3); None: unknown.
    name: Optional[int]
    refreshed: float    # the MONOTONIC clock before the lock was last created or refreshed


class Mark(typing.NamedTuple):
    """Q1's mark of a dead letter, as a requeue checks it before it writes."""

    token: str    # the requeue token
    at: int       # the index of the marking write: the new item's name
    buried: str   # the tombstone Q4 makes of it, naming the new item


# -- the vocabulary ------------------------------------------------------------
class Request(typing.NamedTuple):
    """One request of a step: an etcd v2 keys API call, or a question to the driver.

    ``method``: ``GET``, ``PUT``, ``DELETE``, ``POST`` (etcd; ``prev_*`` are
    the conditions, ``refresh`` a TTL refresh; a POST is never resent once it
    may have applied: AmbiguousWrite); ``ALL``: the requests in ``together``,
    sent at once (the reply is a list of each one's reply or EtcdqError, none
    thrown); ``POSTS``: the POSTs in ``together``, in order, ``lanes`` in
    flight (the reply: each one's reply, EtcdqError, or None for one not sent,
    as Transport.post_many's).  ``TREE``: a recursive GET of directory
    ``key`` (``quorum``), the whole subtree in one reply.  Two GETs whose
    reply is read as it comes, on a connection of its own: ``LISTING``,
    directory ``key`` listed (``sorted``, ``quorum``), its children decoded
    as the body arrives (the reply: Transport.listing's Listing); ``STREAM``,
    a live recursive watch of ``key``, its events from the watch's start
    until etcd ends it or ``seconds`` pass without one (the reply:
    Transport.stream's EventStream).  Questions to the driver: ``NOW``, its
    boot clock (see docs/protocol.md, **Time**); ``WALL``, its wall clock, for
    timestamps; ``MONOTONIC``, its monotonic clock, for a step's own give-up
    time; ``SLEEP``, wait ``seconds``; ``TOKEN``, a fresh random token;
    ``SEEN``, the highest etcd index its transport has seen (a bound below
    any POST sent after); ``DEADLINE``, how long its transport retries a
    request.

    A NamedTuple, not a frozen dataclass: every request of every step is made
    here, and a tuple is built in one call where a frozen dataclass's
    ``__init__`` sets each of its 13 fields through ``object.__setattr__``.
    """

    method: str
    key: str = ""
    value: Optional[str] = None
    ttl: Optional[int] = None
    prev_exist: Optional[bool] = None
    prev_value: Optional[str] = None
    prev_index: Optional[int] = None
    refresh: bool = False
    quorum: bool = False
    sorted: bool = False
    together: Tuple["Request", ...] = ()
    #: ``POSTS``: the connections its POSTs travel on, one awaiting etcd on each.
    lanes: int = 0
    #: ``SLEEP``: how long the driver waits before it answers; ``STREAM``: how
    #: long the stream may stay silent before it ends.
    seconds: float = 0.0


class Answer(typing.Protocol):
    """etcd's reply to one request, as steps read it (transport.Reply is one)."""

    index: int

    @property
    def node(self) -> Dict[str, Any]: ...

    @property
    def written_index(self) -> int: ...


#: A step: yields requests, is sent their replies, returns its result.
Step = Generator[Request, Any, T]


def get(key: str, *, quorum: bool = False) -> Step[Answer]:
    reply: Answer = yield Request("GET", key, quorum=quorum)
    return reply


def put(key: str, value: Optional[str] = None, *, ttl: Optional[int] = None,
        prev_exist: Optional[bool] = None, prev_value: Optional[str] = None,
        prev_index: Optional[int] = None, refresh: bool = False) -> Step[Answer]:
    reply: Answer = yield Request("PUT", key, value, ttl=ttl, prev_exist=prev_exist,
                                  prev_value=prev_value, prev_index=prev_index, refresh=refresh)
    return reply


def delete(key: str, *, prev_value: Optional[str] = None,
           prev_index: Optional[int] = None) -> Step[Answer]:
    reply: Answer = yield Request("DELETE", key, prev_value=prev_value, prev_index=prev_index)
    return reply


def together(*requests: Request) -> Step[List[Union[Answer, EtcdqError]]]:
    replies: List[Union[Answer, EtcdqError]] = yield Request("ALL", together=requests)
    return replies


def post(key: str, value: str, *, ttl: Optional[int] = None) -> Step[Answer]:
    reply: Answer = yield Request("POST", key, value, ttl=ttl)
    return reply


def post_many(key: str, values: Sequence[str], lanes: int
              ) -> Step[List[Union[Answer, EtcdqError, None]]]:
    replies: List[Union[Answer, EtcdqError, None]] = yield Request(
        "POSTS", key, together=tuple(Request("POST", key, value) for value in values),
        lanes=lanes)
    return replies


def ask(method: str) -> Step[Any]:
    """A question to the driver: ``SEEN``, ``DEADLINE``, ``MONOTONIC`` or ``TOKEN``."""
    answer: Any = yield Request(method)
    return answer


def sleep(seconds: float) -> Step[None]:
    yield Request("SLEEP", seconds=seconds)


def now() -> Step[float]:
    """The driver's boot clock: the one the lock TTL rules count on."""
    seconds: float = yield Request("NOW")
    return seconds


def wall() -> Step[float]:
    seconds: float = yield Request("WALL")
    return seconds


# -- what a claim knows --------------------------------------------------------
class Gone(Exception):
    """The item a claim tried is no longer in work/, or is finished. Internal.

    ``by_us``: this claim took it out (dead-lettered it out of attempts, or
    finished it for a finisher that stopped): no sign of another consumer."""

    def __init__(self, item_id: str, by_us: bool = False) -> None:
        super().__init__(item_id)
        self.by_us = by_us


class Taken(Exception):
    """Another claim holds the item's lock; it existed at etcd index ``index``. Internal.

    ``refused``: C1 was refused ("already exists"), and ``index`` is etcd's
    index then; else C2 found the item claimed since, at ``index``."""

    def __init__(self, index: int, refused: bool = False) -> None:
        super().__init__(index)
        self.index = index
        self.refused = refused


@dataclass
class ClaimState:
    """What a claim knows about its item: enough to finish it safely.

    ``item`` and ``index`` are one version of ``work/<id>``: the value our
    latest write to it wrote (C2, the re-fence, R0 or its undoing) and that
    write's index, always set together (a value of one version written on
    the index of another would count an attempt wrong, or undo a write).
    """

    id: str
    lock: Lock
    item: Item
    index: int          # work/<id>'s modifiedIndex after our latest write (C2 first)
    #: boot_clock() when the request that last proved the lock ours was sent
    #: (C1, C3's refresh, a heartbeat): the lock lives at least lock_ttl from
    #: then (see Protocol.lock_left).
    confirmed: float
    #: The claim's attempt number: ``a`` as C2 wrote it.  R0 gives it back in
    #: etcd (``item.attempts`` is then one less), never here.
    attempt: int = field(init=False)
    #: The index F1 (our commit) applied at, once known (0: not committed).
    #: Not ``index``: F1's value is the record, not the claim's version; the
    #: view's mark of the finished item must cover it (ViewState.finished).
    committed: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.attempt = self.item.attempts

    def wrote(self, item: Item, index: int) -> None:
        """Our write of ``item`` applied at ``index``: the claim's version now."""
        self.item, self.index = item, index


@dataclass(frozen=True)
class Held:
    """A claim's lock as C1 left it: the lock, the index C1 created it at, and
    when C1 was sent (boot_clock())."""

    lock: Lock
    index: int
    since: float


def item_fields(queue: str, item_id: str, attempt: Optional[int] = None) -> Dict[str, Any]:
    """The ``extra=`` of a log line about one item, for formatters that index
    fields (JSON): its queue's name, its id, and the attempt (None: unknown)."""
    return {"queue": queue, "item_id": item_id, "attempt": attempt}


def put_token(decode: Any, raw: Optional[str]) -> Optional[str]:
    """The put token of an item or record value (``decode``: Item.decode or
    Record.decode); None for junk."""
    try:
        token: Optional[str] = decode(raw).token
    except Junk:
        return None
    return token


def record_token(raw: Optional[str]) -> Optional[str]:
    """The put token a record or a requeue's tombstone carries; None if none (a
    record of 0.1.0, an older tombstone, junk)."""
    return tombstone_token(raw) or put_token(Record.decode, raw)


def of_another_item(raw: Optional[str], item: Item) -> bool:
    """``raw``, a key of completed/ or failed/, belongs to another item that had
    ``item``'s id: its put token is known and not the item's.  etcd restored
    from an older backup goes on from a lower index and names new items by ids
    it gave before, and an F2 (a create, fenced by nothing) of an item of the
    history it lost can land in the new one."""
    token = record_token(raw)
    return token is not None and token != item.token


def item_of(entry: Optional[Entry]) -> Optional[Item]:
    """The Item a key of ``work/`` holds; None if there is none, or it is junk."""
    if entry is None:
        return None
    try:
        return Item.decode(entry.value)
    except Junk:
        return None


def record_finishes(raw: Optional[str], work: Optional[Item]) -> bool:
    """The one rule of whose outcome a key of completed/ or failed/ is: it
    finishes the item of its id iff ``work`` (the item in ``work/<id>``,
    read before the record; None: gone, or junk) is gone, or the record is
    not another item's (:func:`of_another_item`: another put token).  A
    record read first could be judged against a ``work/<id>`` read after the
    item left and another item took the id: readers read ``work/`` first."""
    return work is None or not of_another_item(raw, work)


def finished_records(work: Iterable[Tuple[Entry, Item]],
                     listed: Dict[str, Iterable[Tuple[Entry, Record]]]
                     ) -> Dict[str, Dict[str, Record]]:
    """By kind (``listed``'s), the records by id of the finished items: the
    records listed that finish their item (:func:`record_finishes`, judged
    against ``work``, listed before them or at their index), and the items
    that carry that outcome (F1 done, F2 not yet: their value is the record)."""
    work = list(work)
    items = {entry.id: item for entry, item in work}
    found = {kind: {entry.id: record for entry, record in records
                    if record_finishes(entry.value, items.get(entry.id))}
             for kind, records in listed.items()}
    for entry, item in work:
        if item.outcome in found and entry.id not in found[item.outcome]:
            with contextlib.suppress(Junk):  # an outcome without a record: junk
                found[item.outcome][entry.id] = Record.decode(entry.value)
    return found


def marked_ttl(entry: Entry) -> Optional[int]:
    """Q1's TTL for the marked dead letter: none if it has none (a CAS without a
    TTL makes the key permanent, and this Queue's failed_ttl need not be the
    one it was written with), else at least TOMBSTONE_TTL.  A requeue that
    dies after Q3 leaves no tombstone (Q4); were the marked dead letter to
    expire then, a late F2 could write it again without the requeue token and
    a second requeue would create a second item.  Kept a week, the key stays
    taken as long as the other late-write bounds (F2, Q4) last."""
    ttl = entry.ttl_left()
    return None if ttl is None else max(ttl, TOMBSTONE_TTL)


def entry_of(item_id: str, node: Dict[str, Any]) -> Entry:
    """The Entry of one key's node, as a quorum GET returned it."""
    return Entry(item_id, node["modifiedIndex"], node.get("value"), node.get("expiration"),
                 node.get("ttl", 0))


# -- the steps -----------------------------------------------------------------
class Steps:
    """The claim's and the commit's rules for one queue and one node id, as steps.

    It holds configuration only; each step's state is its generator's.
    """

    def __init__(self, layout: Layout, *, node_id: str, lock_ttl: int,
                 max_attempts: Optional[int], max_payload: int,
                 record_ttls: Dict[str, Optional[int]]) -> None:
        self.layout = layout
        self.node_id = node_id
        self.lock_ttl = lock_ttl
        self.max_attempts = max_attempts
        self.max_payload = max_payload
        #: The TTL of each kind of record (F2, Q1); None: kept until purged.
        self.record_ttls = record_ttls

    def read_step(self, kind: str, item_id: str) -> Step[Optional[Entry]]:
        """A linearizable read of one key of the queue; None if it does not exist."""
        try:
            reply = yield from get(self.layout.key(kind, item_id), quorum=True)
        except KeyMissing:
            return None
        return entry_of(item_id, reply.node)

    def delete_quietly_step(self, key: str, *, prev_value: Optional[str] = None,
                            prev_index: Optional[int] = None) -> Step[bool]:
        """A conditional delete whose "already gone / changed" outcome is fine."""
        try:
            yield from delete(key, prev_value=prev_value, prev_index=prev_index)
            return True
        except (KeyMissing, CompareFailed):
            return False

    def drop_lock_step(self, item_id: str, lock: Lock) -> Step[bool]:
        return (yield from self.delete_quietly_step(self.layout.key("locks", item_id),
                                                    prev_value=lock.encode()))

    # -- reads ---------------------------------------------------------------
    def list_step(self, kind: str, *, quorum: bool = True) -> Step[Tuple[int, List[Entry]]]:
        """``(etcd index, entries)`` of one directory, sorted, junk names skipped."""
        try:
            reply = yield Request("GET", self.layout.dir(kind), quorum=quorum, sorted=True)
        except KeyMissing as exc:
            return exc.index or 0, []
        return reply.index, list(self.entries(reply.node.get("nodes") or []))

    def entries(self, nodes: Iterable[Dict[str, Any]]) -> Iterator[Entry]:
        """The Entry of each of a listing's nodes that is a key of this queue."""
        for node in nodes:
            parsed = self.layout.split(node.get("key", ""))
            if node.get("dir") or parsed is None:
                continue
            yield Entry(parsed[1], node["modifiedIndex"], node.get("value"),
                        node.get("expiration"), node.get("ttl", 0))

    @staticmethod
    def decode_entries(kind: str, entries: List[Entry]) -> Iterator[Tuple[Entry, Any]]:
        """``(entry, Item or Record)`` for those of ``entries`` (of ``kind``) that are ours.

        work/ holds Items, completed/ and failed/ Records; a value etcdq_v2
        did not write (junk) is skipped.
        """
        decode = Item.decode if kind == "work" else Record.decode
        for entry in entries:
            try:
                yield entry, decode(entry.value)
            except Junk:
                continue

    # -- P: put --------------------------------------------------------------
    def post_step(self, raw: str, token: str) -> Step[Place]:
        """P1: the new item's id and its version (the POST's index and value);
        a lost reply is resolved by token.

        When the POST may or may not have applied, the queue is searched for
        its token (quorum listings: they go through raft, so everything the
        cluster committed before them is in them).  Found: that is the item,
        at the version the search read (a claim or a commit may have changed
        it since the POST: never the POST's value with that index).  Not
        found: it is not stored now, but the request may still be sitting
        in a frozen member and apply later, so sending it again could store
        it twice.  Unavailable says so instead; the version is None for an
        item that was already finished.
        """
        floor = yield from ask("SEEN")  # read before the POST is sent: it lands above
        try:
            node = (yield from post(self.layout.work, raw)).node
            return node["key"].rsplit("/", 1)[-1], Version(node["modifiedIndex"], raw)
        except AmbiguousWrite as exc:
            lost = exc
        found = (yield from self._search_doubts({token}, floor)).get(token)
        if found is None:
            raise Unavailable(
                f"a put to {self.layout.work} may or may not be stored ({lost}): it was not "
                f"found in the queue{(yield from self._may_have_expired())}, but a delayed "
                "request could still add it, once")
        log.info("a put whose reply was lost was stored as %s", found[0])
        return found

    def _may_have_expired(self) -> Step[str]:
        """A record that lives less than a request's deadline may have come and gone
        while the put's reply was awaited: say so, rather than "it never ran"."""
        ttls = [ttl for ttl in self.record_ttls.values() if ttl is not None]
        if ttls and min(ttls) < (yield from ask("DEADLINE")):
            return " (it may also have run, and its record expired)"
        return ""

    def find_puts_step(self, tokens: Set[str], floor: int = 0) -> Step[Dict[str, Place]]:
        """The id of each item put with one of ``tokens`` that is stored now, and
        its version in work/ as read (None: it is finished).

        ``floor``: an etcd index seen before their POSTs were sent, so each
        took an id above it.  When at most SEARCH_SPAN ids lie between it and
        the index now, those keys are read first (:meth:`_find_in_span`); a
        token not found there, or a span too wide, takes one pass over the
        quorum listings, whatever the number of tokens.
        """
        found: Dict[str, Place] = {}
        if floor:
            # Only a find is trusted from the span: a miss is settled by the
            # listings, as if there were no floor.  The floor is a lower bound
            # only while etcd's index never goes back (a member restored from
            # an older backup, or started again without its data, takes ids
            # again at or below it).
            found.update((yield from self._find_in_span(tokens, floor)) or {})
            if len(found) == len(tokens):
                return found
        for kind in ("work", COMPLETED, FAILED):
            entries = (yield from self.list_step(kind))[1]
            for entry, decoded in self.decode_entries(kind, entries):
                if decoded.token in tokens and decoded.token not in found:
                    found[decoded.token] = (entry.id, entry.version if kind == "work" else None)
            if kind == FAILED:  # a requeued dead letter's tombstone keeps its put token
                for entry in entries:
                    token = tombstone_token(entry.value)
                    if token in tokens and token not in found:
                        found[token] = (entry.id, None)
            if len(found) == len(tokens):
                break
        return found

    def _find_in_span(self, tokens: Set[str], floor: int) -> Step[Optional[Dict[str, Place]]]:
        """find_puts by reading ``work/<n>`` for each n above ``floor`` up to
        ``top``, etcd's index at a quorum read made now, then ``completed/<n>``
        and ``failed/<n>`` for each n not in work/; None if they are more
        than SEARCH_SPAN.

        A POST applied before that read took such an n.  An item gone from
        work/ by the time its key was read left its record first (F2 before
        F3; a requeue's tombstone keeps its put token), which a quorum read
        made after shows: so work/ is read before the records, as the
        listings are.  A POST applied after it is not stored now, as for the
        listings.
        """
        top = yield from self._quorum_index()
        if top - floor > SEARCH_SPAN:
            return None
        ids = [f"{n:020d}" for n in range(floor + 1, top + 1)]
        found: Dict[str, Place] = {}
        entries = yield from self._read_each("work", ids)
        for entry, item in self.decode_entries("work", entries):
            if item.token in tokens and item.token not in found:
                found[item.token] = (entry.id, entry.version)
        gone = sorted(set(ids) - {entry.id for entry in entries})
        for kind in (COMPLETED, FAILED):
            if len(found) == len(tokens):
                break
            self._match_records(kind, (yield from self._read_each(kind, gone)), tokens, found)
        return found

    def _match_records(self, kind: str, entries: List[Entry], tokens: Set[str],
                       found: Dict[str, Place]) -> None:
        """Add to ``found`` the records among ``entries`` put with one of ``tokens``
        (a requeued dead letter's tombstone keeps its put token)."""
        for entry, record in self.decode_entries(kind, entries):
            if record.token in tokens:
                found.setdefault(record.token, (entry.id, None))
        if kind == FAILED:
            for entry in entries:
                token = tombstone_token(entry.value)
                if token in tokens:
                    found.setdefault(token, (entry.id, None))

    def _quorum_index(self) -> Step[int]:
        """etcd's index at a quorum read made now (of a key no POST can take)."""
        try:
            return (yield from get(self.layout.key("work", "0" * 20), quorum=True)).index
        except KeyMissing as exc:
            return exc.index or 0

    def _read_each(self, kind: str, ids: Sequence[str]) -> Step[List[Entry]]:
        """The entries of ``kind/<id>`` that exist, by quorum reads, SEARCH_BATCH at once."""
        entries: List[Entry] = []
        for start in range(0, len(ids), SEARCH_BATCH):
            batch = ids[start:start + SEARCH_BATCH]
            replies = yield from together(*(Request("GET", self.layout.key(kind, item_id),
                                                    quorum=True) for item_id in batch))
            for item_id, reply in zip(batch, replies):
                if isinstance(reply, KeyMissing):
                    continue
                if isinstance(reply, EtcdqError):
                    raise reply
                entries.append(entry_of(item_id, reply.node))
        return entries

    def _search_doubts(self, tokens: Set[str], floor: int = 0) -> Step[Dict[str, Place]]:
        """find_puts for puts in doubt: a search that cannot be made (etcd still
        unreachable, even refusing every connection) leaves them in doubt, and
        Unavailable says so, never that nothing was stored."""
        try:
            return (yield from self.find_puts_step(tokens, floor))
        except Unavailable as exc:
            raise Unavailable(
                f"{len(tokens)} put(s) to {self.layout.work} may or may not be stored: "
                f"the search for them failed ({exc}); a delayed request could still add "
                "them, once each") from exc

    def post_many_step(self, items: Sequence[Tuple[str, str]], in_flight: int
                       ) -> Step[List[Place]]:
        """P1 for many items at once: the id and version of each (raw, token), in
        that order (as :meth:`post_step`'s).

        The POSTs go out in the order given, ``in_flight`` at a time, each on
        a connection of its own; each is sent only once the one ``in_flight``
        places before it was stored, so no item is stored before one given
        ``in_flight`` or more places earlier.  At a failure nothing more is
        sent until the POSTs in doubt are settled as P1 settles one: by
        looking for their tokens, all in one pass (found: stored; not found:
        Unavailable).  Then the rest follows.
        """
        placed: List[Place] = []
        while len(placed) < len(items):
            rest = items[len(placed):]
            floor = yield from ask("SEEN")  # read before the round's POSTs are sent
            results = yield from post_many(self.layout.work, [raw for raw, _ in rest],
                                           in_flight)
            settled = yield from self._settled(rest, results, floor)
            if not settled:  # post_many sends at least one POST a round, or raises
                raise Unavailable(f"no put to {self.layout.work} was sent")
            placed += settled
        return placed

    def _settled(self, items: Sequence[Tuple[str, str]],
                 results: List[Union[Answer, EtcdqError, None]], floor: int = 0
                 ) -> Step[List[Place]]:
        """The places of one round's items, up to the first that was not sent."""
        places: List[Optional[Place]] = []
        doubts: Dict[str, int] = {}  # put token -> position in places
        for (raw, token), result in zip(items, results):
            if result is None:
                break
            if isinstance(result, AmbiguousWrite) or (not isinstance(result, EtcdqError)
                                                      and not result.index):
                doubts[token] = len(places)  # a success without X-Etcd-Index: looked for too
                places.append(None)
            elif isinstance(result, EtcdqError):
                raise result
            else:  # etcd names an in-order key by the POST's index, in 20 digits
                places.append((f"{result.index:020d}", Version(result.index, raw)))
        for token, place in (yield from self._find_doubts(doubts, results, floor)).items():
            places[doubts[token]] = place
        return [place for place in places if place is not None]

    def _find_doubts(self, doubts: Dict[str, int], results: Sequence[object], floor: int = 0
                     ) -> Step[Dict[str, Place]]:
        """Where the POSTs in doubt are stored; Unavailable if any is not found."""
        if not doubts:
            return {}
        found = yield from self._search_doubts(set(doubts), floor)
        missing = len(doubts) - len(found)
        if missing:
            first = results[min(p for t, p in doubts.items() if t not in found)]
            why = first if isinstance(first, Exception) else "a reply without its index"
            raise Unavailable(
                f"{missing} of the puts to {self.layout.work} may or may not be stored "
                f"({why}): not found in the queue{(yield from self._may_have_expired())}, "
                "but a delayed request could still add them, once each")
        log.info("%d puts whose replies were lost were stored", len(found))
        return found

    # -- D: delayed put --------------------------------------------------------
    def put_delayed_step(self, raw: str, token: str, ttl: int
                         ) -> Step[Tuple[str, Optional[Version], int]]:
        """D1, D2: (id, version, lock index) of an item claimable after ``ttl``
        seconds; the version is None if a consumer finished it already.

        The lock comes first, so the item is never claimable before etcd
        expires it; the item takes the lock's name, which no POST to work/
        can ever get (it is the index of our own lock write).
        """
        item_id, locked = yield from self._delay_lock(token, ttl)
        return item_id, (yield from self._create_delayed(item_id, raw, token)), locked

    def _delay_lock(self, token: str, ttl: int) -> Step[Tuple[str, int]]:
        """D1: POST a delay lock with ``ttl``; (its name, its index).

        A lost reply is not resolved: another lock is POSTed.  A first one that
        applied (now or later) is an orphan: it holds no item, and expires.
        """
        value = Lock(self.node_id, token, delay=True).encode()
        give_up = (yield from ask("MONOTONIC")) + (yield from ask("DEADLINE"))
        while True:
            try:
                node = (yield from post(self.layout.locks, value, ttl=ttl)).node
                return node["key"].rsplit("/", 1)[-1], node["modifiedIndex"]
            except AmbiguousWrite as exc:
                lost = exc
            if (yield from ask("MONOTONIC")) >= give_up:
                raise Unavailable(f"a delayed put to {self.layout.work} could not create "
                                  f"its lock ({lost}); nothing was stored")
            log.info("the reply to a delay lock in %s was lost; creating another",
                     self.layout.locks)
            yield from sleep(0.1)  # a member that resets every connection is not hammered

    def _create_delayed(self, item_id: str, raw: str, token: str) -> Step[Optional[Version]]:
        """D2: PUT ``work/<id>`` prevExist=false; its version (None: it already finished).

        The transport resends a PUT whose reply was lost; "already exists" is
        then read back.  Unanswered until the deadline: Unavailable, but the
        item is stored at most once, as no other put uses the name.
        """
        key = self.layout.key("work", item_id)
        try:
            try:
                return Version((yield from put(key, raw, prev_exist=False)).written_index, raw)
            except AlreadyExists:
                return (yield from self._our_delayed(item_id, token))
        except Unavailable as exc:
            failed = exc
        raise Unavailable(f"a delayed put to {key} may or may not be stored ({failed}); if "
                          "it is, it is stored once, and claimable after its delay")

    def _our_delayed(self, item_id: str, token: str) -> Step[Optional[Version]]:
        """After D2's "already exists": our item as read now (a claim may have
        changed it since D2), or None if a consumer finished it already;
        EtcdRejected if another writer took the name."""
        entry = yield from self.read_step("work", item_id)
        if entry is not None and put_token(Item.decode, entry.value) == token:
            return entry.version
        for kind in (COMPLETED, FAILED):
            record = yield from self.read_step(kind, item_id)
            if record is not None and put_token(Record.decode, record.value) == token:
                return None
        raise EtcdRejected(f"{self.layout.key('work', item_id)} holds a value this put did "
                           "not write; the item was not stored", code=AlreadyExists.code)

    # -- Q: requeue ----------------------------------------------------------
    def requeue_step(self, item_id: str) -> Step[Place]:
        """Q0-Q5: move dead letter ``item_id`` back to work/ as a new item.

        Returns the new item's id and Q3's version (None if it was there already).
        """
        check_item_id(item_id)
        lock = yield from self._lock_dead_letter(item_id)
        return (yield from self._holding(self._requeued(item_id), item_id, lock))

    def _holding(self, step: Step[T], item_id: str, lock: Lock) -> Step[T]:
        """``step`` under our ``lock`` of ``locks/<id>``, which is dropped after it
        (R1-like), whatever the step did.  If even the drop fails, the lock
        expires: what the step did or raised stands, since a failed drop undoes
        nothing (a requeue done through Q4 returns its new id)."""
        try:
            result = yield from step
        except GeneratorExit:
            raise
        except BaseException:
            yield from self.let_go_step(item_id, lock)
            raise
        yield from self.let_go_step(item_id, lock)
        return result

    def _requeued(self, item_id: str) -> Step[Place]:
        """Q1-Q4 under the dead letter's lock (Q0).  ``work/<id>`` is read first,
        and Q1 marks the dead letter only if it finishes the item there
        (:func:`record_finishes`): another item's record beside a pending
        item is no dead letter of it (NotFound, nothing written).  Q2 and Q3
        write only after a read found Q1's mark still there; else etcd was
        restored from an older backup, and the requeue starts again from
        ``work/`` (a few times)."""
        for _ in range(REMARKS):
            in_work = yield from self.read_step("work", item_id)
            (token, index), record = yield from self._requeue_token(item_id, item_of(in_work))
            new_id = f"{index:020d}"  # Q1's own index: no POST can ever take this name
            mark = Mark(token, index, tombstone(new_id, record.token))
            state = yield from self._removed_while_marked(item_id, in_work, mark)
            if state is DONE:
                return new_id, None
            if state is MARKED:
                break
        else:
            raise Unavailable(f"dead letter {item_id} lost its requeue mark, or work/{item_id} "
                              f"changed under its lock, {REMARKS} times (etcd restored from "
                              "older backups?); nothing was requeued")
        raw = Item(record.payload, token, created=(yield from wall()),
                   requeued=True).encode(stored=True)
        created = yield from self._create_item(new_id, raw)
        yield from self._bury(item_id, new_id, record, index)  # Q4
        return new_id, created

    def _removed_while_marked(self, item_id: str, in_work: Optional[Entry],
                              mark: Mark) -> Step[Optional[str]]:
        """The mark checks around Q2: MARKED once Q2 removed ``in_work`` (the
        dead letter's own item, if a crash after its commit left it in work/)
        with the mark there before and after; DONE if another requeue of it
        finished; None if the mark is lost, or work/ changed under our lock.

        Removed first, or a claimer would finish it later and write the dead
        letter again (or, from 0.1.0, run it as one more attempt).  We hold
        its lock, so only a restore changes ``work/<id>`` meanwhile: it may
        hold the item the backup kept, which nothing else stores."""
        state = yield from self._mark_state(item_id, mark)
        if state is not MARKED or in_work is None:
            return state
        if not (yield from self._remove_item(in_work)):
            return None
        return (yield from self._mark_state(item_id, mark))

    def _mark_state(self, item_id: str, mark: Mark) -> Step[Optional[str]]:
        """Read ``failed/<id>`` (quorum): MARKED if it is still Q1's mark (at its
        index, with its token), DONE if it is the tombstone naming the new id
        (another requeue, which found our token after our lock expired, did
        Q3 and Q4), None otherwise.

        Only a purge, or etcd restored from a backup older than Q1, takes the
        mark away: we hold its lock.  Etcd then holds what the backup kept,
        maybe the item the dead letter came from, in work/ again: a Q2 or Q3
        sent from what Q1 read would delete it, or store its payload twice."""
        entry = yield from self.read_step(FAILED, item_id)
        if entry is None:
            return None
        if entry.value == mark.buried:
            return DONE
        try:
            marked = Record.decode(entry.value).requeue_token == mark.token
        except Junk:
            return None
        return MARKED if marked and entry.index == mark.at else None

    def _remove_item(self, entry: Entry) -> Step[bool]:
        """F3 on a listed item: True once it is gone, False if it changed meanwhile."""
        try:
            yield from delete(self.layout.key("work", entry.id), prev_index=entry.index)
        except KeyMissing:
            pass
        except CompareFailed:
            return False
        return True

    def _create_item(self, new_id: str, raw: str) -> Step[Optional[Version]]:
        """Q3: create the requeued item; its version, or None if an earlier
        requeue did (what is there now is not known: not offered)."""
        try:
            reply = yield from put(self.layout.key("work", new_id), raw, prev_exist=False)
        except AlreadyExists:
            return None
        return Version(reply.written_index, raw)

    def _bury(self, item_id: str, new_id: str, record: Record, index: int) -> Step[None]:
        """Q4: ``failed/<id>`` becomes a tombstone, so that a late F2 finds the key taken.

        A CAS on Q1's index.  "Not found": the dead letter expired (failed_ttl)
        or was purged since Q1: create the tombstone (prevExist=false).  A key
        that is neither our tombstone nor the dead letter we marked is read:
        a late copy of this dead letter's F2 (the same claim token) landed on
        the free key first, and is turned into the tombstone on its index;
        anything else (junk, another claim's dead letter) is left, with a
        warning.  Only late writes change the key: we hold its lock.
        """
        key, buried = self.layout.key(FAILED, item_id), tombstone(new_id, record.token)
        for _ in range(5):
            try:
                if index:
                    yield from put(key, buried, ttl=TOMBSTONE_TTL, prev_index=index)
                else:
                    yield from put(key, buried, ttl=TOMBSTONE_TTL, prev_exist=False)
                return
            except (CompareFailed, KeyMissing, AlreadyExists):
                pass
            entry = yield from self.read_step(FAILED, item_id)
            if entry is None:
                index = 0  # expired or purged since: create it
            elif entry.value == buried:
                return  # a resent request of ours applied
            elif self._late_copy(entry, record):
                index = entry.index
            else:
                break
        log.warning("dead letter %s of %s was requeued as %s, but %s holds something else "
                    "now (junk, or another claim's dead letter); left as it is", item_id,
                    self.layout.root, new_id, key, extra=item_fields(self.layout.name, item_id))

    @staticmethod
    def _late_copy(entry: Entry, record: Record) -> bool:
        """``entry`` is the dead letter ``record`` again (a late F2: the same claim)."""
        try:
            return Record.decode(entry.value).claim == record.claim
        except Junk:
            return False

    def _lock_dead_letter(self, item_id: str) -> Step[Lock]:
        """Q0: the lock of ``locks/<id>``, so that one requeue at a time works on it.

        The item itself left work/ when it was dead-lettered, so its lock key
        is free, or holds the lock its finisher left to expire (F4 skipped:
        its claim token is the dead letter's, and it is taken over), or one
        whose finisher crashed after F3.  Another requeue's lock is waited
        for; then the dead letter may be gone.
        """
        lock = Lock(self.node_id, (yield from ask("TOKEN")))
        give_up = (yield from ask("MONOTONIC")) + self.lock_ttl + (yield from ask("DEADLINE"))
        while True:
            dead = yield from self.read_step(FAILED, item_id)
            if dead is None:
                raise NotFound(f"no dead letter {item_id} in {self.layout.label}")
            try:
                yield from self.lock_step(item_id, lock, self.lock_ttl)
                return lock
            except Taken:
                pass
            if (yield from self._take_finishers_lock(item_id, dead, lock)):
                return lock
            if (yield from ask("MONOTONIC")) >= give_up:
                raise Unavailable(f"dead letter {item_id} stayed locked")
            yield from sleep(0.1)

    def _take_finishers_lock(self, item_id: str, dead: Entry, lock: Lock) -> Step[bool]:
        """Q0 on the lock the dead letter's finisher left to expire: CAS it into ours.

        It is the finisher's if its claim token is the record's (tokens are
        unique to a claim, and that claim ended at F1), and the finisher is
        done if the item left work/ (F3 follows F2's reply, so no resent F2
        can land on Q4's tombstone).  False if the lock is another's, or the
        item is still there (a finisher at F3, or one that crashed before it:
        its lock expires), or the lock changed or went meanwhile.
        """
        held = yield from self.read_step("locks", item_id)
        try:
            finisher = Record.decode(dead.value).claim
            left = held is not None and Lock.decode(held.value).token == finisher
        except Junk:
            left = False
        if not left or (yield from self.read_step("work", item_id)) is not None:
            return False
        assert held is not None
        try:
            yield from put(self.layout.key("locks", item_id), lock.encode(), ttl=self.lock_ttl,
                           prev_value=held.value)
        except KeyMissing:
            return False
        except CompareFailed as exc:  # changed, unless it was our own resent CAS
            return exc.retried and (yield from self._lock_value(item_id)) == lock.encode()
        return True

    def _lock_value(self, item_id: str) -> Step[Optional[str]]:
        entry = yield from self.read_step("locks", item_id)
        return entry.value if entry else None

    def _requeue_token(self, item_id: str, work: Optional[Item]
                       ) -> Step[Tuple[Tuple[str, int], Record]]:
        """Q1: ((token, index), record): the dead letter marked with a requeue
        token, or with the one an earlier requeue left there (it stopped
        before Q4), at the index of that marking write.  NotFound unless
        ``failed/<id>`` holds a record that finishes ``work`` (the item read
        in ``work/<id>`` before).  The CAS goes by index alone: a prevValue
        could not match a value etcd stores in other bytes than we send.
        Only a resent CAS of ours can change the key (we hold its lock), so
        a failed one is read back, a few times."""
        token = None
        for _ in range(5):
            entry = yield from self.read_step(FAILED, item_id)
            if entry is None or not record_finishes(entry.value, work):
                raise NotFound(f"no dead letter {item_id} in {self.layout.label}")
            try:
                record = Record.decode(entry.value)
            except Junk:
                raise NotFound(f"no dead letter {item_id} in {self.layout.label}") from None
            if record.requeue_token:
                return (record.requeue_token, entry.index), record
            token = token or (yield from ask("TOKEN"))
            marked = replace(record, requeue_token=token).encode(stored=True)
            try:
                reply = yield from put(self.layout.key(FAILED, item_id), marked,
                                       ttl=marked_ttl(entry), prev_index=entry.index)
            except (CompareFailed, KeyMissing):
                continue
            return (token, reply.written_index), record
        raise Unavailable(f"dead letter {item_id} kept changing as it was marked for its "
                          "requeue; nothing requeued")

    # -- K: cancel -------------------------------------------------------------
    def cancel_step(self, item_id: str) -> Step[bool]:
        """K1-K4: dead-letter a pending item as cancelled; False if it is running or finished.

        Raises NotFound for an item that is neither in work/ nor recorded.  A
        cancel whose lock lapsed before K3 (it stalled past lock_ttl) starts
        again at K1 (a few times), since a claim may hold the item now; then
        Unavailable, nothing written (the item may be pending: not False).
        """
        check_item_id(item_id)
        for _ in range(3):
            taken = yield from self._cancel_lock(item_id)  # K1
            if taken is None:
                return False
            lock, took_over, locked_at = taken
            try:
                cancelled = yield from self._cancel_pending(item_id, lock, locked_at)  # K2-K4
            except GeneratorExit:
                raise
            except BaseException:
                # A delay lock we took over is left to expire, no sooner than it would
                # have: dropping it would make a delayed (or released, or backed-off)
                # item claimable early, or a delayed put's item not created yet.
                if not took_over:
                    yield from self.let_go_step(item_id, lock)
                raise
            if not cancelled or (took_over and self.locks_linger):
                yield from self.let_go_step(item_id, lock)  # K4 kept a taken-over delay lock
            if cancelled is not None:
                return cancelled
            log.info("the cancel of item %s of %s lost its lock before committing (it "
                     "stalled past lock_ttl); starting again", item_id, self.layout.root,
                     extra=item_fields(self.layout.name, item_id))
        # Not False ("running or finished"): the item may well be pending, unheld.
        raise Unavailable(f"could not hold the lock of item {item_id} long enough to cancel "
                          f"it (each try took longer than lock_ttl={self.lock_ttl:g} s: a "
                          "slow link to etcd, or stalls); it was not cancelled")

    def _cancel_pending(self, item_id: str, lock: Lock, locked_at: int) -> Step[Optional[bool]]:
        """K2-K4 under our lock, made at index ``locked_at`` (K1): True once
        committed; False if the item is finished, or a claim took it after K2
        (a claim's C2 held in flight past its lock); None if our lock lapsed.

        After each K2 the lock must still be the one K1 made (its index and
        value): else it expired meanwhile and a claim may have taken the item
        the ordinary way (C1, C2, handed out) before K2 read it, and K3 on that
        index would apply over a live claim.  A claim after this check changes
        the item's index, so K3 fails.

        K3 also fails when a release's R0, held in flight past its claim's lock,
        lands after K2: it writes a-1 and keeps the claim token.  So a failed K3
        reads the item again: no outcome, the claim token K2 saw -> K2, the lock
        check and K3 again (a few times: each retry needs another held write to
        land).
        """
        for _ in range(5):
            state = yield from self._pending_item(item_id, lock)  # K2
            if state is None:
                return False
            if not (yield from self._still_held(item_id, lock, locked_at)):
                return None
            try:
                yield from self.finish_step(state, FAILED, reason=CANCELLED)  # K3 (F1), K4
                return True
            except LockLost:  # K3 failed: committed, claimed, or changed by a late R0
                if not (yield from self._unclaimed_since(state)):
                    return False
        return False

    def _still_held(self, item_id: str, lock: Lock, locked_at: int) -> Step[bool]:
        """After K2: ``locks/<id>`` is still the lock K1 wrote at ``locked_at``
        (a lock re-created by a late copy of K1 has our value, not that index)."""
        entry = yield from self.read_step("locks", item_id)
        return entry is not None and entry.index == locked_at and entry.value == lock.encode()

    def _unclaimed_since(self, state: ClaimState) -> Step[bool]:
        """After a failed K3: the item has no outcome and the claim token K2 saw,
        so no claim or cancel took it since K2 (the next K2 checks our lock)."""
        item = item_of((yield from self.read_step("work", state.id)))
        return item is not None and item.outcome is None and item.claim == state.item.claim

    def let_go_step(self, item_id: str, lock: Lock) -> Step[None]:
        """Drop our lock of ``locks/<id>``; if even that fails, it expires."""
        with contextlib.suppress(EtcdqError):
            yield from self.drop_lock_step(item_id, lock)

    def _cancel_lock(self, item_id: str) -> Step[Optional[Tuple[Lock, bool, int]]]:
        """K1: (our lock, whether it took over a delay lock, the index it was written
        at), or None: a claim holds it.

        Our lock is a delay lock (``"d"``): it holds the item back without
        running it, so stats and ls keep calling the item pending.  A delay
        lock already there (a release's backoff, a delayed put) is taken over
        by a CAS on its value, its TTL never shortened; any other lock is a
        claim's.  The loop ends when the lock changes under us too often.
        """
        lock = Lock(self.node_id, (yield from ask("TOKEN")), delay=True)
        for _ in range(5):
            try:
                return lock, False, (yield from self.lock_step(item_id, lock, self.lock_ttl))
            except Taken:
                pass
            held = yield from self.read_node_step("locks", item_id)
            if held is None:
                continue  # expired meanwhile: create it
            try:
                if not Lock.decode(held.get("value")).delay:
                    return None
            except Junk:
                return None  # a lock we cannot read counts as held
            locked_at = yield from self._take_over(item_id, held, lock)
            if locked_at:
                return lock, True, locked_at
        return None

    def _take_over(self, item_id: str, held: Dict[str, Any], lock: Lock) -> Step[int]:
        """K1 on a delay lock: CAS it into ours, ttl = max(lock_ttl, its time left);
        the index of that write, 0 if the lock changed or went meanwhile."""
        ttl = max(self.lock_ttl, int(held.get("ttl") or 0))
        try:
            return (yield from put(self.layout.key("locks", item_id), lock.encode(), ttl=ttl,
                                   prev_value=held.get("value"))).written_index
        except KeyMissing:
            return 0
        except CompareFailed as exc:  # changed, unless it was our own resent CAS
            entry = (yield from self.read_step("locks", item_id)) if exc.retried else None
            return entry.index if entry and entry.value == lock.encode() else 0

    def _pending_item(self, item_id: str, lock: Lock) -> Step[Optional[ClaimState]]:
        """K2: the item as read now (quorum), to be committed on that index (K3).

        None if it is finished: committed (``"o"``), or recorded (gone from
        work/; or, for an item claimed before or carrying ``q``, any key in
        completed/ or failed/, a tombstone too, but for one of another item
        that had the id, as C3 checks: 0.1.0's crash left it, or a late Q3 or
        D2 copy re-created it, and it is removed);
        NotFound if it is neither in work/ nor recorded.
        """
        found = yield from self.work_item_step(item_id)
        if found is None:
            return None
        entry, item = found
        state = ClaimState(item_id, lock, item, entry.index, (yield from now()))
        if item.outcome or ((item.attempts or item.requeued)
                            and (yield from self._finished_before(state))):
            return None
        return state

    # -- W: wait, get (their reads) ----------------------------------------------
    def work_item_step(self, item_id: str) -> Step[Optional[Tuple[Entry, Item]]]:
        """``work/<id>`` decoded; None if it left work/ and has a record; NotFound
        if it has neither (junk in its place counts as nothing)."""
        entry = yield from self.read_step("work", item_id)
        if entry is None:
            if (yield from self.record_of_step(item_id, None)) is None:
                raise NotFound(f"no item {item_id} in {self.layout.label}")
            return None
        try:
            return entry, Item.decode(entry.value)
        except Junk:
            raise NotFound(f"no item {item_id} in {self.layout.label}") from None

    def _in_work(self, item_id: str) -> Step[Optional[Tuple[Entry, Item]]]:
        """``work/<id>`` decoded; None if it is not there or is junk."""
        entry = yield from self.read_step("work", item_id)
        item = item_of(entry)
        return (entry, item) if entry is not None and item is not None else None

    def look_step(self, item_id: str) -> Step[Look]:
        """W2 and get(): ``work/<id>``, read first, then the record that finishes it.

        Returns ``(in work, outcome)``: the item in ``work/`` (None: gone, or
        junk) and ``(kind, record)`` of its outcome, None while it has none.
        An item committed by F1 carries its record (no further read); else the
        records are read after ``work/`` and judged against it
        (:func:`record_finishes`): a record of another item that had the id
        is not this one's outcome.  NotFound if there is neither item nor
        record (junk in their place counts as nothing)."""
        found = yield from self._in_work(item_id)
        item = found[1] if found is not None else None
        if found is not None and found[1].outcome:
            try:
                return found, (found[1].outcome, Record.decode(found[0].value))
            except Junk:  # an outcome without a record: not ours
                raise NotFound(f"no item {item_id} in {self.layout.label}") from None
        outcome = yield from self.record_of_step(item_id, item)
        if found is None and outcome is None:
            raise NotFound(f"no item {item_id} in {self.layout.label}")
        return found, outcome

    def record_of_step(self, item_id: str, work: Optional[Item]
                       ) -> Step[Optional[Tuple[str, Record]]]:
        """``(kind, record)`` from completed/ or failed/ that finishes ``work``
        (the item read in ``work/<id>`` before, None: none there); junk (a
        tombstone) is skipped."""
        for kind in (COMPLETED, FAILED):
            entry = yield from self.read_step(kind, item_id)
            if entry is not None and record_finishes(entry.value, work):
                with contextlib.suppress(Junk):
                    return kind, Record.decode(entry.value)
        return None

    def read_node_step(self, kind: str, item_id: str) -> Step[Optional[Dict[str, Any]]]:
        """Like :meth:`read_step`, the whole node: a lock's ``ttl`` (seconds left,
        rounded up)."""
        try:
            return (yield from get(self.layout.key(kind, item_id), quorum=True)).node
        except KeyMissing:
            return None

    # -- purge -------------------------------------------------------------------
    def purge_step(self, kind: str, progress: Optional[Callable[[], Any]] = None) -> Step[int]:
        """Delete the records of ``kind`` one by one (never the directory: junk stays).

        An item still in work/ with such a record, or committed to ``kind``
        (its finisher crashed after F1 or F2; 0.1.0's after its F2), is
        removed first, as its F3: a record must never go while its item could
        still be claimed, or the item would run again.  An item changed since
        the listing keeps its record until the next purge.  ``progress`` is
        the caller's, called after each record (a progress display).

        ``work/`` is listed first, and a record of another item that had the id
        (:func:`record_finishes`) is not the listed item's: it goes, the item
        stays.  An item removed first has the other kind's record at its id
        read, and deleted if it is another item's (:meth:`_purge_item`).
        """
        in_work = {entry.id: (entry, item) for entry, item
                   in self.decode_entries("work", (yield from self.list_step("work"))[1])}
        removed = 0
        for entry, _ in self.decode_entries(kind, (yield from self.list_step(kind))[1]):
            pending = in_work.get(entry.id)
            if pending is not None and not record_finishes(entry.value, pending[1]):
                pending = None  # another item's record: it goes, the item stays
            else:
                in_work.pop(entry.id, None)
            if pending is None or (yield from self._purge_item(kind, *pending)):
                removed += yield from self.delete_quietly_step(self.layout.key(kind, entry.id),
                                                               prev_index=entry.index)
            if progress is not None:
                progress()
        for entry, item in in_work.values():
            if item.outcome == kind:
                removed += yield from self._purge_item(kind, entry, item)
        return removed

    def _purge_item(self, kind: str, entry: Entry, item: Item) -> Step[bool]:
        """Purge's F3 on a listed item finished as ``kind``: a record of another
        item that had the id in the other outcome's directory goes first
        (:meth:`_drop_another_record`, as C3 and K2), while the item is still
        in ``work/``: once it left, a reader would take that record for its
        outcome (a dead letter's finisher that died before its read of
        ``completed/<id>``).  True once the item is gone."""
        other = COMPLETED if kind == FAILED else FAILED
        found = yield from self.read_step(other, entry.id)
        if found is not None and not record_finishes(found.value, item):
            yield from self._drop_another_record(other, found, entry.id, item)
        return (yield from self._remove_item(entry))

    # -- I: import (I1, I3, I4; I2 is a streamed listing, read by the driver) -------
    def lock_import_step(self, lock: Lock) -> Step[float]:
        """I1: create ``locks/<IMPORT_LOCK>``; the driver's monotonic clock before the
        PUT that created it.  Another import's lock is waited for (up to lock_ttl
        and the deadline: a crashed import's expires)."""
        give_up = (yield from ask("MONOTONIC")) + self.lock_ttl + (yield from ask("DEADLINE"))
        waiting = False
        while True:
            sent: float = yield from ask("MONOTONIC")
            try:
                yield from self.lock_step(IMPORT_LOCK, lock, self.lock_ttl)
                return sent
            except Taken:
                pass
            if (yield from ask("MONOTONIC")) >= give_up:
                raise Unavailable(f"another import into {self.layout.label} is under way "
                                  "(its lock stayed); run this one when it ends")
            if not waiting:
                log.warning("waiting for another import into %s to end (or for the lock "
                            "of one that stopped to expire)", self.layout.root)
                waiting = True
            yield from sleep(0.2)

    def import_value_step(self, state: ImportState, kind: str, raw: str, token: str
                          ) -> Step[None]:
        """I3: store one item (``kind`` work) or record whose token is not in the queue.

        Its name is the index of our previous write (I1, I3 or I4): no POST,
        and no other writer, can ever take it.  "Already exists" after a
        resent PUT is read back: our token is our own first copy.  The index
        of this write names the next key; when it is unknown (our copy was
        already consumed and removed), I4 makes a fresh one.
        """
        yield from self.keep_import_lock_step(state)
        if state.name is None:
            state.name = yield from self.refresh_import_lock_step(state)  # I4
        item_id = f"{state.name:020d}"
        ttl = self.record_ttls.get(kind)  # None for work/: an item never expires
        try:
            state.name = (yield from put(self.layout.key(kind, item_id), raw, ttl=ttl,
                                         prev_exist=False)).written_index
        except AlreadyExists as exc:
            state.name = yield from self._imported(kind, item_id, token, exc.retried)
        state.tokens.add(token)

    def _imported(self, kind: str, item_id: str, token: str, retried: bool
                  ) -> Step[Optional[int]]:
        """After I3's "already exists": the index of our own copy (its createdIndex,
        which a claim's CAS keeps), None if it is ours but gone again (a resent PUT
        whose first copy a consumer already finished); EtcdRejected if not ours."""
        node = yield from self.read_node_step(kind, item_id)
        if node is None and retried:
            return None
        decode = Item.decode if kind == "work" else Record.decode
        if node is not None and put_token(decode, node.get("value")) == token:
            return int(node["createdIndex"])
        raise EtcdRejected(f"{self.layout.key(kind, item_id)} holds a value this import did "
                           "not write; the line was not stored", code=AlreadyExists.code)

    def keep_import_lock_step(self, state: ImportState) -> Step[None]:
        """Refresh the import lock every lock_ttl/3, between writes (no thread)."""
        if (yield from ask("MONOTONIC")) - state.refreshed >= self.lock_ttl / 3:
            yield from self.refresh_import_lock_step(state)

    def refresh_import_lock_step(self, state: ImportState) -> Step[int]:
        """I4: a CAS refresh of our import lock; its index, ours, is a fresh name.

        A resent refresh applies again (the value is unchanged): each copy's
        index is ours.  LockLost if the lock expired or changed: this import
        stalled past lock_ttl and another may have begun, so it stops.
        """
        started = yield from ask("MONOTONIC")
        try:
            reply = yield from put(self.layout.key("locks", IMPORT_LOCK), ttl=self.lock_ttl,
                                   refresh=True, prev_exist=True,
                                   prev_value=state.lock.encode())
        except (CompareFailed, KeyMissing):
            raise LockLost(f"the import lock of {self.layout.label} expired (the import "
                           "stalled for longer than lock_ttl): stopped; run the import "
                           "again") from None
        state.refreshed = started
        return reply.written_index

    # -- C: claim ----------------------------------------------------------
    def lock_step(self, item_id: str, lock: Lock, ttl: int) -> Step[int]:
        """C1: create ``locks/<id>``; its index, or Taken with the index etcd saw it at."""
        try:
            reply: Answer = yield Request("PUT", self.layout.key("locks", item_id),
                                          lock.encode(), ttl=ttl, prev_exist=False)
            return reply.written_index
        except AlreadyExists as exc:
            # Our own first PUT may have applied before its reply was lost.
            entry = (yield from self.read_step("locks", item_id)) if exc.retried else None
            if entry is None or entry.value != lock.encode():
                raise Taken(exc.index or 0, refused=True) from None
            return entry.index

    def take_step(self, item_id: str, held: Held, seen: Version) -> Step[Optional[ClaimState]]:
        """C2 and C3 under the lock C1 made (``held``), on the item seen at ``seen``;
        None if it kept changing under us.  Raises Taken, Gone or Junk as
        Protocol.claim says.  Our lock is dropped unless the claim is handed
        out (else it simply expires, if even the drop fails)."""
        try:
            state = yield from self._take_item(item_id, held, seen)
        except GeneratorExit:
            raise
        except BaseException:
            with contextlib.suppress(EtcdqError):
                yield from self.drop_lock_step(item_id, held.lock)
            raise
        if state is None:
            yield from self.drop_lock_step(item_id, held.lock)
        return state

    def _take_item(self, item_id: str, held: Held, seen: Version) -> Step[Optional[ClaimState]]:
        """C2, then C3 on the item as C2 found it (fresh, unlike the view).

        An item changed after the index C1 created our lock at was claimed by
        someone who held the lock after us: ours expired before our C2 could
        apply (it was held in flight), so the item is theirs, however stale
        our view looked.
        """
        lock, locked_at = held.lock, held.index
        index, raw, read = seen.index, seen.raw, False
        for _ in range(5):
            if raw is None:
                entry = yield from self.read_step("work", item_id)
                if entry is None:
                    raise Gone(item_id)
                index, raw, read = entry.index, entry.value, True
            item = Item.decode(raw)
            if item.outcome and not read:  # the view's: it may have left work/ since
                raw = None
                continue
            if item.outcome:  # its finisher committed F1 and stopped: finish for it
                yield from self._finish_for(item_id, Entry(item_id, index, raw))
            if item.claim == lock.token:  # our C2 applied; its reply was lost
                return (yield from self._checked(
                    ClaimState(item_id, lock, item, index, held.since), held))
            if index > locked_at:
                raise Taken(index)
            claimed = replace(item, attempts=item.attempts + 1, claim=lock.token)
            try:
                reply = yield Request("PUT", self.layout.key("work", item_id),
                                      claimed.encode(stored=True), prev_index=index)
            except CompareFailed:
                raw = None
                continue
            except KeyMissing:
                raise Gone(item_id) from None
            state = ClaimState(item_id, lock, claimed, reply.written_index, held.since)
            return (yield from self._checked(state, held))
        return None

    def _finish_for(self, item_id: str, entry: Entry) -> Step[None]:
        """A claimer's F2-F4 for a committed item; raises Gone, or Junk if etcd refuses."""
        try:
            yield from self.record_step(item_id, entry, None)
        except EtcdRejected as exc:
            raise Junk(str(exc)) from None
        raise Gone(item_id, by_us=True)

    def _checked(self, state: ClaimState, held: Held) -> Step[ClaimState]:
        """C3: hand out the claim unless the item is finished or out of attempts,
        or the lock is no longer ours."""
        before = state.item.attempts - 1
        if (before or state.item.requeued) and (yield from self._finished_before(state)):
            raise Gone(state.id, by_us=True)
        if self.max_attempts and before >= self.max_attempts:
            try:
                yield from self._abandon(state, before)
            except LockLost:  # another claim took it meanwhile
                raise Gone(state.id) from None
            raise Gone(state.id, by_us=True)
        if (yield Request("NOW")) - held.since > self.lock_ttl / 2:
            yield from self._still_locked(state, held.index)
        return state

    def _still_locked(self, state: ClaimState, locked_at: int) -> Step[None]:
        """C3's last check, past half a lock TTL since C1 was sent: is the lock
        still the one C1 created at ``locked_at``?

        etcd cannot expire our lock sooner than ``lock_ttl`` after C1 was sent
        (C1 applied after that, and TTLs round up), so within half of it the
        lock is ours.  Later (C2's reply was held, the process stalled) it may
        have lapsed, and a cancel may have taken the item meanwhile (K1-K3).
        A refresh on our value proves little: a late copy of C1 can re-create
        the lock with our value after a cancel removed the item.  The lock's
        ``createdIndex`` does: the same as C1's, it never lapsed, so no cancel
        or claim took the lock since.  Otherwise (re-created, or expired: then
        retaken) the item is fenced again (:meth:`_refence`), since a cancel
        may be between its K2 and K3.  Not ours: Gone if the item left work/ or
        is committed, else Taken (it is live: the view frees it when that lock
        goes).
        """
        started = yield from now()
        try:
            reply = yield from put(self.layout.key("locks", state.id), ttl=self.lock_ttl,
                                   refresh=True, prev_exist=True, prev_value=state.lock.encode())
            lapsed = reply.node.get("createdIndex") != locked_at
        except CompareFailed as exc:
            raise (yield from self._not_ours(state, exc.index or 0)) from None
        except KeyMissing:
            try:
                yield from self.lock_step(state.id, state.lock, self.lock_ttl)
            except Taken as exc:
                raise (yield from self._not_ours(state, exc.index)) from None
            lapsed = True
        if lapsed:
            yield from self._refence(state)
        state.confirmed = started

    def _refence(self, state: ClaimState) -> Step[None]:
        """C3 on a lock that lapsed since C1, now ours again: CAS the item, unchanged,
        on our C2 index.  A cancel that read that index (K2) while our lock was
        gone then fails its K3, and one that committed makes this fail."""
        try:
            reply = yield from put(self.layout.key("work", state.id),
                                   state.item.encode(stored=True), prev_index=state.index)
            state.wrote(state.item, reply.written_index)
            return
        except (CompareFailed, KeyMissing) as exc:
            index = exc.index or 0
        entry = yield from self.read_step("work", state.id)  # only our writes carry our token
        if entry is not None and self._ours_unfinished(entry, state):
            state.wrote(state.item, entry.index)  # our resent CAS applied: the same value
            return
        raise (yield from self._not_ours(state, index))

    @staticmethod
    def _ours_unfinished(entry: Entry, state: ClaimState) -> bool:
        try:
            item = Item.decode(entry.value)
        except Junk:
            return False
        return item.claim == state.lock.token and not item.outcome

    def _not_ours(self, state: ClaimState, index: int) -> Step[Exception]:
        """C3 lost the lock: Gone if the item left work/ or is finished (or junk),
        else Taken at ``index``: it is live, free once the lock we found goes."""
        entry = yield from self.read_step("work", state.id)
        try:
            live = entry is not None and not Item.decode(entry.value).outcome
        except Junk:
            live = False
        return Taken(index) if live else Gone(state.id)

    def _finished_before(self, state: ClaimState) -> Step[bool]:
        """A record without a committed item: written by 0.1.0, whose F2 was the
        commit, before a crash, or the item is a late copy; remove the item (its
        F3).  A record of another item that had the id (:func:`record_finishes`)
        does not count, and goes first (:meth:`_drop_another_record`)."""
        own = None
        for kind in (COMPLETED, FAILED):
            entry = yield from self.read_step(kind, state.id)
            if entry is None:
                continue
            if not record_finishes(entry.value, state.item):
                yield from self._drop_another_record(kind, entry, state.id, state.item)
            elif own is None:
                own = kind
        if own is None:
            return False
        log.warning("item %s of %s already has a %s record; removing it from work/",
                    state.id, self.layout.root, own,
                    extra=item_fields(self.layout.name, state.id, state.item.attempts))
        yield from self.delete_quietly_step(self.layout.key("work", state.id),
                                            prev_index=state.index)
        return True

    def _drop_another_record(self, kind: str, entry: Entry, item_id: str,
                             item: Item) -> Step[None]:
        """C3, K2: delete the record of another item that had the id, on its index,
        while the item is still in ``work/``.  Once the item leaves ``work/``
        (finished into the other kind, or removed beside a record of its own),
        a reader would take any record at the id as its outcome (the rule
        holds only against an item in ``work/``).  A tombstone stays (no
        reader takes it for an outcome); a key changed meanwhile is left."""
        try:
            Record.decode(entry.value)
        except Junk:
            return
        log.warning("%s holds the record of another item that had id %s (etcd, restored "
                    "from an older backup, gave the id again); deleting it",
                    self.layout.key(kind, item_id), item_id,
                    extra=item_fields(self.layout.name, item_id, item.attempts))
        yield from self.delete_quietly_step(self.layout.key(kind, item_id),
                                            prev_index=entry.index)

    def _abandon(self, state: ClaimState, attempts: int) -> Step[None]:
        """Dead-letter an item whose claims keep ending without complete/fail."""
        reason = (f"abandoned: claimed {attempts} times (max_attempts {self.max_attempts}) "
                  "without completing; its workers crashed or hung")
        log.warning("item %s of %s: %s", state.id, self.layout.root, reason,
                    extra=item_fields(self.layout.name, state.id, attempts))
        yield from self.finish_step(state, FAILED, reason=reason, attempts=attempts)

    # -- F: complete, dead-letter --------------------------------------------
    def outcome_value(self, state: ClaimState, kind: str, at: float, *, result: Any = None,
                      reason: Optional[str] = None, traceback: Optional[str] = None,
                      attempts: Optional[int] = None) -> str:
        """F1's value: the item's record finished at wall time ``at``, marked ``kind``.

        The record counts ``attempts`` (None: the claim's attempt, given back
        or not).  ``result`` and ``reason`` are checked (depth, size:
        codec.check_outcome): the payload is the stored one.  ``reason`` and
        ``traceback`` are stored made to encode and bounded (codec.failure_text)."""
        check_outcome(result, reason, self.max_payload)
        reason, traceback = failure_text(reason, traceback, IN_RECORD)
        record = Record(state.item.payload, state.lock.token, self.node_id,
                        state.attempt if attempts is None else attempts, state.item.created,
                        at, result, reason, token=state.item.token,
                        requeued=state.item.requeued, traceback=traceback)
        return record.encode(outcome=kind, stored=True)

    def finish_step(self, state: ClaimState, kind: str, *, reason: Optional[str] = None,
                    attempts: Optional[int] = None) -> Step[None]:
        """F1-F4: commit ``kind`` on the item, record it, remove it (C3's dead
        letter; Protocol.finish runs F1 and F2-F4 each on its own)."""
        marked = self.outcome_value(state, kind, (yield from wall()), reason=reason,
                                    attempts=attempts)
        committed = yield from self.commit_step(state, kind, marked)
        if committed is not None:
            yield from self.record_step(state.id, committed, state.lock)

    def commit_step(self, state: ClaimState, kind: str, marked: str) -> Step[Optional[Entry]]:
        """F1: the item as committed, None if it is already finished, or LockLost."""
        try:
            reply = yield Request("PUT", self.layout.key("work", state.id), marked,
                                  prev_index=state.index)
        except (CompareFailed, KeyMissing):
            # A resent CAS, or an earlier call of ours, may have applied: read it back.
            entry = yield from self._our_commit(state, kind)
        else:
            entry = Entry(state.id, reply.written_index, marked)
        if entry is not None:
            state.committed = entry.index
        return entry

    def _our_commit(self, state: ClaimState, kind: str) -> Step[Optional[Entry]]:
        """After F1 failed: our committed item, None if our record exists, else LockLost
        (another claim's), or ClaimClosed (ours, with the other outcome)."""
        entry = yield from self.read_step("work", state.id)
        if entry is not None:
            item = item_of(entry)
            if item is not None and item.outcome and item.claim == state.lock.token:
                return self._same_outcome(state, kind, item.outcome, entry)
        else:
            for done in (COMPLETED, FAILED):
                if (yield from self._is_our_record(done, state)):  # a claimer finished it
                    return self._same_outcome(state, kind, done, None)
        raise LockLost(f"item {state.id}: another claim took it, or it is finished")

    @staticmethod
    def _same_outcome(state: ClaimState, kind: str, done: str,
                      entry: Optional[Entry]) -> Optional[Entry]:
        """An earlier call of ours committed ``done``: fine if that is ``kind``."""
        if done != kind:
            raise ClaimClosed(f"item {state.id} was already committed as {done} by this "
                              "claim (an earlier call whose reply was lost)", outcome=done)
        return entry

    @property
    def locks_linger(self) -> bool:
        """True if F4 is skipped: a finisher leaves its lock to expire (see LINGER_MAX)."""
        return self.lock_ttl <= LINGER_MAX

    def record_step(self, item_id: str, entry: Entry, lock: Optional[Lock]) -> Step[None]:
        """F2-F4 for an item whose F1 applied: by its finisher, or by a claimer after a crash.

        F4 (``lock``'s delete) is sent only if locks do not linger (LINGER_MAX).
        F3 is not sent once F2 read ``work/<id>`` and found it is not the item
        F1 wrote: a delete on F1's index could then remove an item of another
        history that has the same index (etcd restored from an older backup).
        """
        item = Item.decode(entry.value)
        assert item.outcome is not None
        there = yield from self._record(item_id, item,
                                        Record.decode(entry.value).encode(stored=True), entry)
        if there and item.outcome == FAILED:
            yield from self._clear_completed(item_id, item)
        deletes = [Request("DELETE", self.layout.key("work", item_id), prev_index=entry.index)
                   ] if there else []
        if lock is not None and not self.locks_linger:
            deletes.append(Request("DELETE", self.layout.key("locks", item_id),
                                   prev_value=lock.encode()))
        if not deletes:
            return
        for outcome in (yield Request("ALL", together=tuple(deletes))):
            # Both are conditional: "not found"/"compare failed" means already done.
            if isinstance(outcome, EtcdqError) and not isinstance(
                    outcome, (KeyMissing, CompareFailed)):
                raise outcome

    def _clear_completed(self, item_id: str, item: Item) -> Step[None]:
        """After a dead letter's F2, before F3: ``completed/<id>`` must not hold the
        record of another item that had the id, which readers (completed/
        first) would take as this item's outcome once it left ``work/``; it
        is deleted on its index (:meth:`_drop_another_record`).  A completion
        needs no such read: its own record is the one read first."""
        entry = yield from self.read_step(COMPLETED, item_id)
        if entry is not None and not record_finishes(entry.value, item):
            yield from self._drop_another_record(COMPLETED, entry, item_id, item)

    def _record_ttl(self, item: Item) -> Optional[int]:
        """F2's TTL: that of the record's kind, but at least TOMBSTONE_TTL for an
        item that carried ``q`` (requeued, or delayed): a late Q3 or a late copy
        of D2 may create it again, and its first claim must find the record (C3).
        None (kept until purged) stays None."""
        assert item.outcome is not None
        ttl = self.record_ttls[item.outcome]
        return max(ttl, TOMBSTONE_TTL) if ttl is not None and item.requeued else ttl

    def _record(self, item_id: str, item: Item, record: str, committed: Entry) -> Step[bool]:
        """F2: PUT the record prevExist=false; "already exists" is read back.
        False if a read showed ``work/<id>`` is not the item F1 wrote (F3 is
        not to be sent), else True.

        A record that is gone when read back expired (its TTL) or was purged
        in between: if the item is still in work/ as F1 wrote it
        (``committed``) it still carries the record, so F2 is sent again (a
        few times: each needs the record to vanish again).  An item gone too
        was purged with its record, or finished by another claimer: nothing
        to write.
        """
        assert item.outcome is not None
        key = self.layout.key(item.outcome, item_id)
        for _ in range(5):
            try:
                yield Request("PUT", key, record, ttl=self._record_ttl(item), prev_exist=False)
                return True
            except AlreadyExists:
                existing = yield from self.read_step(item.outcome, item_id)
            if existing is not None:
                found = yield from self._found_record(item_id, item, record, existing, committed)
                if found is not None:
                    return found
                continue  # replaced meanwhile, or gone: F2 again
            if not (yield from self._still_committed(item_id, committed)):
                log.info("the %s record of item %s of %s vanished as it was read back, and "
                         "so did the item (purged, or finished by another claimer); not "
                         "writing it again", item.outcome, item_id, self.layout.root,
                         extra=item_fields(self.layout.name, item_id, item.attempts))
                return False
            log.info("the %s record of item %s of %s vanished as it was read back; "
                     "writing it again", item.outcome, item_id, self.layout.root,
                     extra=item_fields(self.layout.name, item_id, item.attempts))
        raise EtcdRejected(f"{key} kept vanishing as it was written; the item stays in "
                           "work/, committed, until it is removed", code=AlreadyExists.code)

    def _still_committed(self, item_id: str, committed: Entry) -> Step[bool]:
        """``work/<id>`` is still the item F1 wrote: its index and its value (an
        index alone may be another history's, once etcd was restored)."""
        entry = yield from self.read_step("work", item_id)
        return entry is not None and (entry.index, entry.value) == (committed.index,
                                                                    committed.value)

    def _found_record(self, item_id: str, item: Item, record: str, existing: Entry,
                      committed: Entry) -> Step[Optional[bool]]:
        """F2 found ``existing``: None to send F2 again, else as :meth:`_record`.

        Ours (resent, or written by a claimer) stays.  So does one of another
        claim of this item (the same put token, or none): 0.1.0's, whose record
        was its commit, or one of a history etcd lost; the item has one record,
        the first, which a wait may have reported.  One of another item that had
        the id (:func:`of_another_item`) is replaced (:meth:`_replace_record`).
        Junk must not take the place of the record: the item stays."""
        assert item.outcome is not None
        if not record_finishes(existing.value, item):
            return (yield from self._replace_record(item_id, item, record, existing, committed))
        try:
            holder = Record.decode(existing.value).claim
        except Junk:
            raise EtcdRejected(
                f"{self.layout.key(item.outcome, item_id)} holds something that is not a "
                "record; the item stays in work/, committed, until it is removed",
                code=AlreadyExists.code) from None
        if holder != item.claim:
            log.warning("item %s of %s has a %s record of another claim of it (0.1.0's "
                        "unfenced commit, or one etcd lost in a restore); keeping it",
                        item_id, self.layout.root, item.outcome,
                        extra=item_fields(self.layout.name, item_id, item.attempts))
        return True

    def _replace_record(self, item_id: str, item: Item, record: str, existing: Entry,
                        committed: Entry) -> Step[Optional[bool]]:
        """F2 on the record of another item that had the id: a CAS on its index,
        only while ``work/<id>`` is the item F1 wrote (True once replaced).
        Otherwise this finisher's F1 applied in a history etcd lost, and the
        record (of the item this history holds, or held) stays: False.  None if
        the record changed or went meanwhile (a claimer finishing our item
        replaced it; it expired): F2 again."""
        assert item.outcome is not None
        key = self.layout.key(item.outcome, item_id)
        if not (yield from self._still_committed(item_id, committed)):
            log.warning("%s holds the record of another item that had id %s, and our "
                        "commit is no longer in work/ (it applied in a history etcd lost "
                        "when it was restored from an older backup); keeping that record",
                        key, item_id, extra=item_fields(self.layout.name, item_id,
                                                        item.attempts))
            return False
        try:
            yield from put(key, record, ttl=self._record_ttl(item), prev_index=existing.index)
        except (CompareFailed, KeyMissing):
            return None
        log.warning("%s held the record of another item that had id %s (etcd, restored "
                    "from an older backup, gave the id again); replaced by this item's",
                    key, item_id, extra=item_fields(self.layout.name, item_id, item.attempts))
        return True

    def _is_our_record(self, kind: str, state: ClaimState) -> Step[bool]:
        try:
            return (yield from self._record_claim(kind, state.id)) == state.lock.token
        except Junk:
            return False

    def _record_claim(self, kind: str, item_id: str) -> Step[Optional[str]]:
        """The claim token of ``kind/<id>``'s record; None if there is none, Junk if
        something else has the key."""
        existing = yield from self.read_step(kind, item_id)
        return Record.decode(existing.value).claim if existing else None

    # -- heartbeat ---------------------------------------------------------------
    def confirm_step(self, state: ClaimState) -> Step[None]:
        """Claim.refresh(): a CAS refresh of our lock; the lock is confirmed ours
        from the refresh's send (``state.confirmed``), re-created if it expired
        while the item is still ours (KeyMissing), or LockLost (the claim is
        lost: ``confirmed`` is -inf)."""
        started = yield from now()
        try:
            try:
                yield from put(self.layout.key("locks", state.id), ttl=self.lock_ttl,
                               refresh=True, prev_exist=True, prev_value=state.lock.encode())
            except CompareFailed:
                raise LockLost(f"item {state.id}: another claim holds the lock") from None
            except KeyMissing:
                yield from self.retake_step(state, state.lock, self.lock_ttl)
        except LockLost:
            state.confirmed = float("-inf")
            raise
        state.confirmed = started

    def retake_step(self, state: ClaimState, lock: Lock, ttl: int) -> Step[int]:
        """Re-create our expired lock, if the item is still ours, or raise LockLost;
        the new lock's index.

        Checked before (no use taking it otherwise) and again after: another
        claim may have come and gone in between (C1, C2, release), and while
        we hold the lock no new C2 can apply, so the second check decides.
        """
        yield from self.still_ours_step(state)
        try:
            index = yield from self.lock_step(state.id, lock, ttl)
        except Taken:
            raise LockLost(f"item {state.id}: the lock expired and another claim took it"
                           ) from None
        try:
            yield from self.still_ours_step(state)
        except LockLost:
            yield from self.drop_lock_step(state.id, lock)
            raise
        return index

    def still_ours_step(self, state: ClaimState) -> Step[None]:
        """After our lock expired: the claim is still ours if nobody claimed since."""
        entry = yield from self.read_step("work", state.id)
        try:
            holder = Item.decode(entry.value).claim if entry else None
        except Junk:
            holder = None
        if holder != state.lock.token:
            raise LockLost(f"item {state.id}: the lock expired and the item was claimed again"
                           if entry else f"item {state.id} is no longer in work/")

    # -- R: release, fail ----------------------------------------------------
    def release_step(self, state: ClaimState, ttl: int) -> Step[GivenBack]:
        """R0, then R1: give the attempt back, then the item (now, or after ``ttl``
        seconds); R1's :data:`GivenBack`."""
        yield from self.give_back_step(state)
        return (yield from self.unlock_step(state, ttl))

    def give_back_step(self, state: ClaimState) -> Step[None]:
        """R0: CAS ``work/<id>`` on the claim's index to a-1, our claim token kept.

        A release is not an attempt (a worker shutting down, a rolling deploy):
        the next claim counts ``a`` again.  The write is fenced like F1, so a
        stale claim changes nothing.  A second call (the first one's R1 got no
        answer) finds the claim's version already at a-1, and writes nothing.
        """
        yield from self._set_attempts(state, state.attempt - 1)

    def dead_letters(self, state: ClaimState, retry: bool) -> bool:
        """fail() dead-letters (F1-F4) when asked to (``retry`` False: no retry
        can help) or once the item used its attempts; else it is retried."""
        return not retry or bool(self.max_attempts and state.attempt >= self.max_attempts)

    def retry_step(self, state: ClaimState, delay: float, reason: Optional[str],
                   traceback: Optional[str]) -> Step[GivenBack]:
        """A failure with attempts left: R1 with ``delay``, carrying the reason.
        No R0 (a failure counts), and a release that stopped after its R0 is
        undone first."""
        yield from self._set_attempts(state, state.attempt)
        return (yield from self.unlock_step(state, delay, reason, traceback))

    def _set_attempts(self, state: ClaimState, attempts: int) -> Step[None]:
        """Make the item count ``attempts``: R0 (a-1), or a failure undoing a
        release's R0 (``a`` again: a release that stopped after R0 and was then
        failed).  A CAS on the claim's version, our token kept; nothing to write
        if that version already counts ``attempts``."""
        if state.item.attempts == attempts:
            return
        written = replace(state.item, attempts=attempts)
        try:
            reply = yield from put(self.layout.key("work", state.id),
                                   written.encode(stored=True), prev_index=state.index)
            state.wrote(written, reply.written_index)
        except (CompareFailed, KeyMissing):
            state.wrote(written, (yield from self._attempts_set(state, attempts)))

    def _attempts_set(self, state: ClaimState, attempts: int) -> Step[int]:
        """After R0 (or its undoing) failed: the index of our own write (a resent
        request, or an earlier call), ClaimClosed if an earlier call of ours
        committed the item, else LockLost."""
        entry = yield from self.read_step("work", state.id)
        if entry is None:
            for done in (COMPLETED, FAILED):
                if (yield from self._is_our_record(done, state)):
                    raise committed_before(state, done)
        else:
            item = item_of(entry)
            if item is not None and item.claim == state.lock.token:
                if item.outcome:
                    raise committed_before(state, item.outcome)
                if item.attempts == attempts:
                    return entry.index
        raise LockLost(f"item {state.id}: another claim took it, or it is finished")

    def unlock_step(self, state: ClaimState, delay: float = 0, reason: Optional[str] = None,
                    traceback: Optional[str] = None) -> Step[GivenBack]:
        """R1: the item is claimable again now, or after ``delay`` seconds (etcd's
        clock): returns those seconds as the lock's TTL (0: now), and the etcd
        index at which R1 applied (or at which our lock was found gone).  The
        delay lock carries a failed attempt's ``reason`` and ``traceback``,
        made to encode and cut short (codec.IN_LOCK): every view lists locks/."""
        key, mine = self.layout.key("locks", state.id), state.lock.encode()
        if delay <= 0:
            try:
                return 0, (yield from delete(key, prev_value=mine)).written_index
            except KeyMissing as exc:
                yield from self.still_ours_step(state)
                return 0, exc.index or 0
            except CompareFailed:
                raise LockLost(f"item {state.id}: another claim holds the lock") from None
        why, trace = failure_text(reason, traceback, IN_LOCK)
        delayed = replace(state.lock, delay=True, reason=why, traceback=trace)
        ttl = ttl_seconds(delay)
        try:
            return ttl, (yield from put(key, delayed.encode(), ttl=ttl,
                                        prev_value=mine)).written_index
        except KeyMissing:
            return ttl, (yield from self.retake_step(state, delayed, ttl))
        except CompareFailed:
            return (yield from self._delay_lock_back(state))

    def _delay_lock_back(self, state: ClaimState) -> Step[GivenBack]:
        """R1 (a delay) found the lock changed: our own PUT may have applied, a
        resent one's first copy or an earlier call's that timed out (a release,
        or a fail with another reason).  Ours if the lock is a delay lock with
        our claim token (its reason and traceback are the first call's), or
        gone (expired meanwhile) with the item still ours; else LockLost."""
        try:
            node = (yield from get(self.layout.key("locks", state.id), quorum=True)).node
        except KeyMissing as exc:
            yield from self.still_ours_step(state)
            return 0, exc.index or 0
        if not _our_delay_lock(node.get("value"), state.lock):
            raise LockLost(f"item {state.id}: another claim holds the lock")
        # Still there: at least a second, even past its expiry (no ttl), which
        # etcd's sweep (every 0.5 s) is due to remove: reported as given back
        # at once, a consumer's claim would be refused on it, and a quiet view
        # would hold the item a lock TTL.
        return max(1, int(node.get("ttl", 0))), node["modifiedIndex"]


def _our_delay_lock(raw: Optional[str], ours: Lock) -> bool:
    """``raw`` is a delay lock of our claim: our node and claim token, ``"d"``
    (whatever reason and traceback it carries)."""
    try:
        lock = Lock.decode(raw)
    except Junk:
        return False
    return lock.delay and (lock.node_id, lock.token) == (ours.node_id, ours.token)


def committed_before(state: ClaimState, done: str) -> ClaimClosed:
    """A release found the item committed by an earlier call of the same claim."""
    return ClaimClosed(f"item {state.id} was already committed as {done} by this claim "
                       "(an earlier call whose reply was lost)", outcome=done)
