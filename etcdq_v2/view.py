"""A consumer's view of the queue: the items in work/ and which are locked, kept current.

Listing work/ on every claim costs time and memory in proportion to the
queue's length (etcd v2 sends every value with a listing).  Instead, each
Queue keeps one view, built once and then updated by a *streaming* watch of
work/ (``?wait=true&recursive=true&stream=true``: one HTTP response, one JSON
event per line):

1. open the stream first (etcd registers it at its current index S);
2. list work/, then locks/, with quorum reads (at indexes >= S);
3. apply each streamed event newer than the listing.

Nothing is missed between 1 and 2, and nothing is applied twice.  If the
stream ends (etcd drops a watcher that falls 100 events behind, a member
dies) the view starts again at 1.

Which items are locked.  Every claim changes its item in work/ (C2), so the
work/ stream alone shows items being taken.  An item is free again only when
its lock goes (released, expired), which shows in locks/ alone.  Watching
locks/ all the time would nearly double what every consumer receives and
etcd sends (each claim's lock create and delete, to every consumer), so
locks/ is followed the same way (stream, list, apply) only while this
process finds nothing to claim, and not while it has a backlog of free
items.  Meanwhile, if items are known taken, locks/ is listed once per lock
TTL, so an item whose worker died comes back under a steady backlog too.

A claim never trusts the view: the lock create (C1) and the compare-and-swap
on the item (C2) decide, so a stale view costs a retry, never a wrong answer.

Free items (in work/, not locked) are kept in a sorted list: new items always
sort last (their ids are etcd indexes), so appending is cheap and the head of
the queue is at the front.
"""
from __future__ import annotations

import bisect
import json
import logging
import re
import threading
import time
from typing import Callable, Dict, List, Optional, Set, Tuple

from .errors import EtcdqError, Unavailable
from .keys import Layout
from .protocol import Entry, Protocol
from .transport import EventStream

log = logging.getLogger("etcdq_v2.view")

#: One event: action, key, value (absent for deletions) or dir flag, and the
#: node's modifiedIndex.  etcd writes a node's fields in this order (Go
#: encodes struct fields in order); a JSON decoder per event cost several
#: times more, and every consumer reads every event of work/.
_EVENT = re.compile(rb'\{"action":"(\w+)","node":\{"key":"([^"]*)"'
                    rb'(?:,"value":"((?:[^"\\]|\\.)*)"|(,"dir":true))?'
                    rb'[^{}]*?"modifiedIndex":(\d+)')
_REMOVED = (b"delete", b"compareAndDelete", b"expire")
_CLAIMED = b"compareAndSwap"  # on work/: a claim's C2 (nothing else CASes an item)
#: Values larger than this are not kept in memory; a claim reads them.
MAX_CACHED_VALUE = 64 * 1024
#: Free items that count as a backlog: with that many, locks/ is not followed.
BACKLOG = 32
#: Seconds a follower waits after applying events, so that the next come in one block.
COALESCE = 0.005
_LOCAL = -1  # a lock this process knows of before etcd's event arrives

Candidate = Tuple[str, int, Optional[str]]


class QueueView:
    """work/ and the locked items of one queue, updated in background threads."""

    def __init__(self, protocol: Protocol, *, idle_timeout: float = 60.0) -> None:
        self._protocol = protocol
        self._layout: Layout = protocol.layout
        self._cond = threading.Condition()
        self._items: Dict[str, Tuple[int, Optional[str]]] = {}
        #: Locked items: id -> index of the newest sign of it (lock or C2), or _LOCAL.
        self._locks: Dict[str, int] = {}
        self._free: List[str] = []
        self._in_free: Set[str] = set()
        self._skip: Dict[str, int] = {}
        self._locks_listed = 0.0  # time.monotonic() of the last locks/ listing
        self.version = 0
        self._ready = False
        self._error: Optional[BaseException] = None
        self.relists = 0
        self._work = _Follower(self, self._layout.work, self._list_work, self._apply_work,
                               idle_timeout)
        self._lock_follower: Optional[_Follower] = None
        self._idle_timeout = idle_timeout

    # -- for claimers ----------------------------------------------------------
    def wait_ready(self, timeout: float) -> None:
        """Block until the first listing is in, or raise what prevented it."""
        with self._cond:
            self._cond.wait_for(lambda: self._ready or self._error is not None, timeout)
            if self._ready:
                return
            error = self._error
        if isinstance(error, EtcdqError):
            raise error
        raise Unavailable(f"could not list {self._layout.root}: {error or 'timed out'}")

    def candidates(self, limit: int) -> List[Candidate]:
        """Up to ``limit`` free items from the head: ``(id, index, raw value or None)``."""
        found: List[Candidate] = []
        with self._cond:
            stale = 0
            for position, item_id in enumerate(self._free):
                if self._is_free(item_id):
                    index, raw = self._items[item_id]
                    found.append((item_id, index, raw))
                    if len(found) == limit:
                        break
                elif position == stale:
                    stale += 1
            for item_id in self._free[:stale]:
                self._in_free.discard(item_id)
            del self._free[:stale]
            backlog = len(self._in_free) >= BACKLOG
        if backlog:
            self._stop_following_locks()
        return found

    def starved(self, timeout: float) -> None:
        """A claim found nothing: make sure locks/ is followed, and its listing is in."""
        with self._cond:
            follower = self._lock_follower
            if self._work.stopped:  # closed: start nothing new
                return
            if follower is None:
                follower = self._lock_follower = _Follower(
                    self, self._layout.locks, self._list_locks, self._apply_locks,
                    self._idle_timeout)
        follower.wait_listed(timeout)

    def check_locks(self) -> None:
        """List locks/ once per lock TTL while it is not followed and items are taken."""
        with self._cond:
            due = (self._lock_follower is None
                   and time.monotonic() - self._locks_listed >= self._protocol.lock_ttl
                   and any(index != _LOCAL for index in self._locks.values()))
        if due:
            self._list_locks()

    def taken(self, item_id: str) -> None:
        """A claim of this process holds the item, or lost the race for it."""
        with self._cond:
            self._locks.setdefault(item_id, _LOCAL)

    def untaken(self, item_id: str) -> None:
        """Undo :meth:`taken` after a claim attempt failed before reaching etcd."""
        with self._cond:
            if self._locks.get(item_id) == _LOCAL:
                del self._locks[item_id]
                self._make_free(item_id)

    def added(self, item_id: str, index: int, raw: str) -> None:
        """This process put the item: offer it before etcd's event arrives."""
        with self._cond:
            if self._ready and index > self._items.get(item_id, (0, None))[0]:
                self._apply_item(item_id, index, raw)

    def released(self, item_id: str) -> None:
        """A claim of this process released the item: offer it before etcd's event arrives."""
        with self._cond:
            self._locks.pop(item_id, None)
            self._make_free(item_id)

    def finished(self, item_id: str) -> None:
        """A claim of this process completed or dead-lettered the item: it is gone.

        F3 and F4 are committed together and their events may come in either
        order; without this, the lock's removal could offer the item again.
        """
        with self._cond:
            self._items.pop(item_id, None)
            self._locks.pop(item_id, None)

    def skip(self, item_id: str, index: int) -> None:
        """Never offer this version of the item again (it is junk)."""
        with self._cond:
            self._skip[item_id] = index

    def wait_for_change(self, version: int, timeout: Optional[float]) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.version != version or self._work.stopped, timeout)

    def close(self) -> None:
        self._work.stop()
        self._stop_following_locks()
        with self._cond:
            self._cond.notify_all()

    # -- the state ---------------------------------------------------------------
    def _is_free(self, item_id: str) -> bool:
        entry = self._items.get(item_id)
        return (entry is not None and item_id not in self._locks
                and self._skip.get(item_id) != entry[0])

    def _make_free(self, item_id: str) -> None:
        if self._is_free(item_id):
            if item_id not in self._in_free:
                bisect.insort(self._free, item_id)
                self._in_free.add(item_id)
            self.version += 1
            self._cond.notify_all()

    def _apply_item(self, item_id: str, index: int, value: Optional[str]) -> None:
        self._items[item_id] = (index, _cacheable(value))
        self._make_free(item_id)

    def _locked(self, item_id: str, index: int) -> None:
        """A sign at ``index`` that the item is locked."""
        if index > self._locks.get(item_id, 0):
            self._locks[item_id] = index

    def _unlocked(self, item_id: str, index: int) -> None:
        """The item's lock was gone at ``index``: free, unless locked again since."""
        if 0 <= self._locks.get(item_id, -1) <= index:
            del self._locks[item_id]
            self._make_free(item_id)

    def _reconcile_locks(self, index: int, locks: List[Entry]) -> None:
        """Apply a listing of locks/ taken at ``index``."""
        listed = {entry.id: entry.index for entry in locks}
        with self._cond:
            for item_id in [i for i in self._locks if i not in listed]:
                self._unlocked(item_id, index)
            for item_id, lock_index in listed.items():
                self._locked(item_id, lock_index)
            self._locks_listed = time.monotonic()

    # -- listings and events (follower threads) --------------------------------------
    def _list_work(self) -> int:
        work_index, work = self._protocol.list("work")
        with self._cond:
            self._items = {e.id: (e.index, _cacheable(e.value)) for e in work}
            self._free = [e.id for e in work]
            self._in_free = set(self._free)
        self._list_locks()
        with self._cond:
            self._ready, self._error = True, None
            self.relists += 1
            self.version += 1
            self._cond.notify_all()
        return work_index

    def _list_locks(self) -> int:
        index, locks = self._protocol.list("locks")
        self._reconcile_locks(index, locks)
        return index

    def _apply_work(self, block: bytes, floor: int) -> None:
        with self._cond:
            for action, item_id, value, index in self._events(block, floor):
                if action in _REMOVED:
                    self._items.pop(item_id, None)
                    self._locks.pop(item_id, None)
                elif action == _CLAIMED:
                    if item_id in self._items:
                        self._items[item_id] = (index, None)  # a claim reads it afresh
                        self._locked(item_id, index)
                elif value is not None:
                    self._apply_item(item_id, index, _unescape(value))

    def _apply_locks(self, block: bytes, floor: int) -> None:
        with self._cond:
            for action, item_id, _, index in self._events(block, floor):
                if action in _REMOVED:
                    self._unlocked(item_id, index)
                elif action != _CLAIMED:  # a CAS keeps the item locked (a release delay)
                    self._locked(item_id, index)

    def _events(self, block: bytes, floor: int
                ) -> List[Tuple[bytes, str, Optional[bytes], int]]:
        """(action, item id, raw JSON value, index) of events newer than ``floor``.

        Events of keys that are not items (sub-directories, other names) are
        left out; so is a directory's value.
        """
        events = []
        for action, key, value, is_dir, index in _EVENT.findall(block):
            number = int(index)
            parsed = self._layout.split(key.decode("utf-8", "replace"))
            if number > floor and parsed is not None and not is_dir:
                events.append((action, parsed[1], value if action in (b"create", b"set", b"update")
                               else None, number))
        return events

    def _failed(self, exc: BaseException) -> None:
        with self._cond:
            self._error = exc
            self._cond.notify_all()

    def _stop_following_locks(self) -> None:
        with self._cond:
            follower, self._lock_follower = self._lock_follower, None
        if follower is not None:
            follower.stop()


class _Follower:
    """One directory followed in a thread of its own: subscribe, list, apply events."""

    def __init__(self, view: QueueView, directory: str, listing: Callable[[], int],
                 apply: Callable[[bytes, int], None], idle_timeout: float) -> None:
        self._view = view
        self._directory = directory
        self._listing = listing
        self._apply = apply
        self._idle_timeout = idle_timeout
        self._listed = threading.Event()
        self._stop = threading.Event()
        self._stream: Optional[EventStream] = None
        name = f"etcdq-view-{directory.rsplit('/', 1)[-1]}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def wait_listed(self, timeout: float) -> None:
        self._listed.wait(timeout)

    def drop_stream(self) -> None:
        """End the current stream as if the connection dropped (tests use it)."""
        stream = self._stream
        if stream is not None:
            stream.close()

    def stop(self) -> None:
        self._stop.set()
        self.drop_stream()

    def _run(self) -> None:
        pause = 0.1
        while not self._stop.is_set():
            try:
                self._follow()
                pause = 0.1
            except Exception as exc:  # keep following; claimers see the error
                if self._stop.is_set():
                    break
                log.warning("watch of %s failed (%s); listing again", self._directory, exc)
                self._view._failed(exc)
                time.sleep(pause)
                pause = min(pause * 2, 2.0)

    def _follow(self) -> None:
        """One round: subscribe, list, then apply events until the stream ends."""
        stream = self._view._protocol.etcd.stream(self._directory,
                                                  idle_timeout=self._idle_timeout)
        self._stream = stream
        try:
            if self._stop.is_set():
                return
            floor = self._listing()
            self._listed.set()
            for block in stream.blocks():
                self._apply(block, floor)
                # Each wake-up of this thread (a context switch, the GIL taken
                # from the claimer) cost more than parsing the events; a short
                # pause lets the next few arrive together.  An event after a
                # quiet spell is still applied at once.
                time.sleep(COALESCE)
        finally:
            stream.release()


def _unescape(value: bytes) -> str:
    """A JSON string's contents (as matched by _EVENT) as the string it encodes."""
    return json.loads(b'"' + value + b'"') if b"\\" in value else value.decode("utf-8")


def _cacheable(value: Optional[str]) -> Optional[str]:
    return value if value is not None and len(value) <= MAX_CACHED_VALUE else None
