"""One look at a queue for an operator: counts, running claims, dead letters, finish times.

:meth:`Queue.overview` reads the whole queue in one GET, as ``stats()``
does (:meth:`Protocol.snapshot`: ``stats()``, ``items("running")`` and
``items("failed")`` together would make five requests), with a
serializable read: any member answers from its own store, so a dashboard
that looks every few seconds adds no raft traffic.  The four directories
are seen at one etcd index, so an item finishing meanwhile shows in work/
or in its record, never in both or neither.

The counts follow ``stats()``: an item is *running* while a claim's lock
(not a delay lock) is on it, an item committed (F1) but not yet recorded
(F2) counts as finished, and junk is not counted.  etcd keeps no time of
writes, so a running item's claim time is unknown here: the item's put
time (``created``) and its lock's seconds left are what the keys hold.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .codec import Item, Lock, Record
from .protocol import COMPLETED, FAILED, Entry, Protocol, finished_records, lock_states

#: How many dead letters an overview carries by default (the newest ones).
DEAD_LETTERS = 100


@dataclass
class RunningItem:
    """An item under a claim's lock."""

    id: str
    node_id: str
    attempt: int
    #: The claim's token: tells a new claim of the same item from the old one.
    claim: Optional[str]
    created: Optional[float]
    #: Seconds etcd gave the lock left when listed (0: no TTL).
    lock_ttl: int


@dataclass
class DeadLetter:
    """A record in failed/: why, how often tried, by whom, when."""

    id: str
    reason: Optional[str]
    attempts: int
    node_id: str
    finished: Optional[float]
    payload: Any
    #: The end of the failed handler's traceback, if a Python handler raised.
    traceback: Optional[str] = None


@dataclass
class QueueOverview:
    """What :meth:`Queue.overview` saw: counts as ``stats()`` gives them, the
    running items, the newest dead letters, and the finish times (``fin``,
    the finisher's clock) of the records still kept, oldest first."""

    name: str
    counts: Dict[str, int]
    running: List[RunningItem] = field(default_factory=list)
    dead_letters: List[DeadLetter] = field(default_factory=list)
    completed_at: List[float] = field(default_factory=list)
    failed_at: List[float] = field(default_factory=list)


def overview(protocol: Protocol, dead_letters: int = DEAD_LETTERS) -> QueueOverview:
    """One GET of the queue from the member's own copy (work/, locks/, completed/ and
    failed/ at one index), summed up; junk skipped."""
    found = protocol.snapshot(quorum=False)
    # Unsorted from a recursive GET: by id (etcd's index, so put order) for the page.
    work: List[Tuple[Entry, Item]] = sorted(protocol.decode_entries("work", found["work"]),
                                            key=lambda pair: pair[0].id)
    locks = found["locks"]
    records = finished_records(work, {kind: protocol.decode_entries(kind, found[kind])
                                      for kind in (COMPLETED, FAILED)})
    waiting = [(entry, item) for entry, item in work if not item.outcome]
    running = _running(waiting, locks)
    counts = {"pending": len(waiting) - len(running), "running": len(running),
              COMPLETED: len(records[COMPLETED]), FAILED: len(records[FAILED])}
    return QueueOverview(protocol.layout.name, counts, running,
                         _dead_letters(records[FAILED], dead_letters),
                         _finish_times(records[COMPLETED]), _finish_times(records[FAILED]))


def _running(waiting: List[Tuple[Entry, Item]], locks: List[Entry]) -> List[RunningItem]:
    """The waiting items under a claim's lock, as ``stats()`` counts them."""
    states: Dict[str, Lock] = lock_states(locks)
    ttls = {entry.id: entry.ttl for entry in locks}
    found = []
    for entry, item in waiting:
        lock = states.get(entry.id)
        if lock is not None and not lock.delay:
            found.append(RunningItem(entry.id, lock.node_id, item.attempts, item.claim,
                                     item.created or None, ttls[entry.id]))
    return found


def _dead_letters(records: Dict[str, Record], limit: int) -> List[DeadLetter]:
    """The ``limit`` newest dead letters, newest first."""
    newest = sorted(records.items(), key=lambda pair: (pair[1].finished, pair[0]),
                    reverse=True)[:max(limit, 0)]
    return [DeadLetter(item_id, record.reason, record.attempts, record.node_id,
                       record.finished or None, record.payload, record.traceback)
            for item_id, record in newest]


def _finish_times(records: Dict[str, Record]) -> List[float]:
    return sorted(record.finished for record in records.values() if record.finished)
