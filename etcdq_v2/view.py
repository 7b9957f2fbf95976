"""A consumer's view of the queue: the items in work/ and the locks, kept current.

Listing work/ on every claim costs time and memory in proportion to the
queue's length (etcd v2 sends every value with a listing).  Instead, each
Queue keeps one view, built once and then updated by a *streaming* watch of
the queue's directory (``?wait=true&recursive=true&stream=true``: one HTTP
response, one JSON event per line):

1. open the stream first (etcd registers it at its current index S);
2. list work/ and locks/ with quorum reads (at indexes >= S);
3. apply each streamed event that is newer than the listing it concerns.

Nothing is missed between 1 and 2, and nothing is applied twice.  If the
stream ends (etcd drops a watcher that falls 100 events behind, a member
dies) the view starts again at 1.  A claim never trusts the view: the
protocol's compare-and-swap on the item (C3) is what decides, so a stale view
costs a retry, never a wrong answer.

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
from typing import Any, Dict, List, Optional, Set, Tuple

from .errors import EtcdqError, Unavailable
from .keys import Layout
from .protocol import Protocol

log = logging.getLogger("etcdq_v2.view")

_REMOVED = ("delete", "compareAndDelete", "expire")
_HEAD = re.compile(rb'\{"action":"(\w+)","node":\{"key":"([^"]*)"')
_MODIFIED = re.compile(rb'"modifiedIndex":(\d+)')
#: Values larger than this are not kept in memory; a claim reads them.
MAX_CACHED_VALUE = 64 * 1024
_LOCAL = -1  # a lock this process knows of before etcd's event arrives

Candidate = Tuple[str, int, Optional[str]]


class QueueView:
    """work/ and locks/ of one queue, updated in a background thread."""

    def __init__(self, protocol: Protocol, *, idle_timeout: float = 60.0) -> None:
        self._protocol = protocol
        self._layout: Layout = protocol.layout
        self._idle_timeout = idle_timeout
        self._cond = threading.Condition()
        self._items: Dict[str, Tuple[int, Optional[str]]] = {}
        self._locks: Dict[str, int] = {}
        self._free: List[str] = []
        self._in_free: Set[str] = set()
        self._skip: Dict[str, int] = {}
        self.version = 0
        self._ready = False
        self._error: Optional[BaseException] = None
        self._stream: Any = None
        self._closed = threading.Event()
        self.relists = 0
        self._thread = threading.Thread(target=self._run, name="etcdq-view", daemon=True)
        self._thread.start()

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
        return found

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

    def skip(self, item_id: str, index: int) -> None:
        """Never offer this version of the item again (it is junk)."""
        with self._cond:
            self._skip[item_id] = index

    def wait_for_change(self, version: int, timeout: Optional[float]) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.version != version or self._closed.is_set(), timeout)

    def close(self) -> None:
        self._closed.set()
        stream = self._stream
        if stream is not None:
            stream.close()
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

    def _load(self, work: List[Any], locks: List[Any]) -> None:
        with self._cond:
            self._items = {e.id: (e.index, _cacheable(e.value)) for e in work}
            self._locks = {e.id: e.index for e in locks}
            self._free = [e.id for e in work if e.id not in self._locks]
            self._in_free = set(self._free)
            self._ready, self._error = True, None
            self.relists += 1
            self.version += 1
            self._cond.notify_all()

    def _apply(self, line: bytes, floors: Dict[str, int]) -> None:
        """Apply one streamed event (a JSON line) newer than the listing it concerns."""
        event = _parse(line)
        if event is None:
            return
        action, key, index = event
        parsed = self._layout.split(key)
        if parsed is None or parsed[0] not in floors or index <= floors[parsed[0]]:
            return
        kind, item_id = parsed
        removed = action in _REMOVED
        if kind == "work" and not removed:
            node = json.loads(line).get("node") or {}
            if node.get("dir"):
                return
            with self._cond:
                self._apply_item(item_id, index, node.get("value"))
            return
        with self._cond:
            if kind == "work":
                self._items.pop(item_id, None)
            elif removed:
                if self._locks.get(item_id, index) <= index:
                    self._locks.pop(item_id, None)
                    self._make_free(item_id)
            else:
                self._locks[item_id] = index

    def _apply_item(self, item_id: str, index: int, value: Optional[str]) -> None:
        self._items[item_id] = (index, _cacheable(value))
        self._make_free(item_id)

    # -- the background thread -----------------------------------------------------
    def _run(self) -> None:
        pause = 0.1
        while not self._closed.is_set():
            try:
                self._follow()
                pause = 0.1
            except Exception as exc:  # keep following; claimers see the error
                if self._closed.is_set():
                    break
                log.warning("watch of %s failed (%s); listing again", self._layout.root, exc)
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                time.sleep(pause)
                pause = min(pause * 2, 2.0)

    def _follow(self) -> None:
        """One round: subscribe, list, then apply events until the stream ends."""
        stream = self._protocol.etcd.stream(self._layout.root, idle_timeout=self._idle_timeout)
        self._stream = stream
        try:
            if self._closed.is_set():
                return
            work_index, work = self._protocol.list("work")
            locks_index, locks = self._protocol.list("locks")
            self._load(work, locks)
            floors = {"work": work_index, "locks": locks_index}
            for line in stream.lines():
                self._apply(line, floors)
        finally:
            stream.release()


def _parse(line: bytes) -> Optional[Tuple[str, str, int]]:
    """``(action, key, modifiedIndex)`` of an event, or None for one we ignore.

    Every consumer receives every event of the queue, so this runs often: a
    regular expression reads the three fields etcd writes first (Go encodes
    struct fields in order), and JSON is decoded only for what needs the value.
    A compare-and-swap (a claim's C2, a release delay) changes no item's
    presence and no lock's, so it is ignored before any decoding.
    """
    head = _HEAD.match(line)
    if head is None:
        return None
    action = head.group(1).decode()
    if action == "compareAndSwap":
        return None
    index = _MODIFIED.search(line, head.end())
    if index is None:
        return None
    return action, head.group(2).decode(), int(index.group(1))


def _cacheable(value: Optional[str]) -> Optional[str]:
    return value if value is not None and len(value) <= MAX_CACHED_VALUE else None
