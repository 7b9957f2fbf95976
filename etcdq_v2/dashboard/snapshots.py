"""The dashboard's one reader of etcd: a snapshot of every queue, shared by all pages.

A page polls ``/api/overview`` every period the document names, and so does
every other open page.  Each request is answered from the last snapshot while
it is younger than that period; the first request after that takes a new one
while the others wait for it (one at a time, under a lock).  The period is
``interval``, or :data:`PACE` times as long as the last snapshot took if that
is longer: a snapshot of a big queue (100,000 items: about 2 s) is not taken
again the moment it is done, so etcd serves these reads at most a fifth of
the time.  So etcd sees one round of reads per period however many pages
are open, and none while no page is: a round lists the prefix, then reads
each queue in one GET (:meth:`Queue.overview`), with serializable reads,
which downloads every key and value under it.

Throughput comes from the records themselves: each completion record and
dead letter carries its finish time (``fin``), counted into buckets over the
last ``window`` seconds.  Records that expired (``completed_ttl``) or were
purged within the window are no longer counted.

A running item's age is the time since a snapshot first saw its claim (etcd
stores no time for a write); claims already running at the first snapshot
are marked, as their age is a lower bound.
"""
from __future__ import annotations

import json
import logging
import math
import threading
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from ..codec import strict_json
from ..errors import EtcdqError
from ..overview import DeadLetter, QueueOverview, RunningItem
from ..protocol import queue_names
from ..queue import ItemInfo, Queue
from ..transport import Transport

log = logging.getLogger("etcdq_v2.dashboard")

#: A snapshot is reused for at least this many times as long as the last one took.
PACE = 4
#: The characters of a dead letter's payload shown on the page.
PREVIEW = 160

ClaimKey = Tuple[str, str, Optional[str], int]


class Snapshots:
    """The cached overview of all queues under a prefix, as the page's JSON."""

    def __init__(self, transport: Transport, prefix: str, *, interval: float, window: float,
                 bucket: float, actions: bool) -> None:
        self._etcd = transport
        self._prefix = prefix
        self._interval = interval
        self._window, self._bucket = window, bucket
        self._actions = actions
        self._queues: Dict[str, Queue] = {}
        self._queues_lock = threading.Lock()
        self._lock = threading.Lock()  # one snapshot at a time
        self._body: Optional[bytes] = None
        self._status = 200
        self._taken = -math.inf   # time.monotonic() of the last snapshot
        self._took = 0.0          # how long it took
        self._last: Dict[str, Any] = {"queues": []}  # the last good document
        #: When each running claim was first seen, and those seen at the first look.
        self._seen: Dict[ClaimKey, float] = {}
        self._at_start: Set[ClaimKey] = set()
        self._looked = False
        self.rounds = 0

    def current(self) -> Tuple[int, bytes]:
        """``(HTTP status, JSON body)``: the last snapshot, or a new one if it is stale."""
        with self._lock:
            if self._body is None or time.monotonic() - self._taken >= self.period():
                self._status, self._body = self._take()
                self._taken = time.monotonic()
            return self._status, self._body

    def period(self) -> float:
        """Seconds a snapshot is reused for: ``interval``, or PACE times the last one's time."""
        return max(self._interval, PACE * self._took)

    def invalidate(self) -> None:
        """After an action: the next request takes a new snapshot."""
        with self._lock:
            self._taken = -math.inf

    def queue(self, name: str) -> Queue:
        """The Queue for ``name`` under the prefix (InvalidName for a bad name).

        Under a lock of its own: an action does not wait for a snapshot under way."""
        with self._queues_lock:
            if name not in self._queues:
                self._queues[name] = Queue(self._etcd, name, prefix=self._prefix)
            return self._queues[name]

    def close(self) -> None:
        with self._queues_lock:
            for queue in self._queues.values():
                queue.close()
            self._queues.clear()

    def _take(self) -> Tuple[int, bytes]:
        """One round of reads: the new document, or the last one with etcd's error."""
        self.rounds += 1
        started = time.monotonic()
        try:
            overviews = [self.queue(name).overview()
                         for name in queue_names(self._etcd, self._prefix)]
        except EtcdqError as exc:
            self._took = time.monotonic() - started
            log.warning("dashboard: reading %s failed: %s", self._prefix, exc)
            return 503, _dumps({**self._last, "error": str(exc), "generated": time.time()})
        self._took = time.monotonic() - started
        self._last = self._document(overviews, time.time())
        return 200, _dumps(self._last)

    def _document(self, overviews: List[QueueOverview], now: float) -> Dict[str, Any]:
        start = math.ceil(now / self._bucket) * self._bucket - self._buckets() * self._bucket
        queues = [self._queue_document(view, start, now) for view in overviews]
        self._forget_finished(overviews)
        return {"prefix": self._prefix, "generated": now, "interval": self.period(),
                "actions": self._actions, "error": None,
                "throughput": {"start": start, "bucket": self._bucket,
                               "completed": self._sums(queues, "completed"),
                               "failed": self._sums(queues, "failed")},
                "queues": queues}

    def _queue_document(self, view: QueueOverview, start: float, now: float
                        ) -> Dict[str, Any]:
        return {"name": view.name, "counts": view.counts,
                "running": [self._running(view.name, item, now) for item in view.running],
                "dead_letters": [_dead_letter(dead) for dead in view.dead_letters],
                "throughput": {"completed": self._histogram(view.completed_at, start),
                               "failed": self._histogram(view.failed_at, start)}}

    def _running(self, queue: str, item: RunningItem, now: float) -> Dict[str, Any]:
        key = (queue, item.id, item.claim, item.attempt)
        if key not in self._seen:
            self._seen[key] = now
            if not self._looked:
                self._at_start.add(key)
        return {"id": item.id, "node": item.node_id, "attempt": item.attempt,
                "age": round(now - self._seen[key], 1), "age_is_minimum": key in self._at_start,
                "created": item.created, "lock_ttl": item.lock_ttl}

    def _forget_finished(self, overviews: List[QueueOverview]) -> None:
        """Drop the claims no longer running, so the memory follows the running items."""
        running = {(view.name, item.id, item.claim, item.attempt)
                   for view in overviews for item in view.running}
        self._seen = {key: seen for key, seen in self._seen.items() if key in running}
        self._at_start &= running
        self._looked = True

    def _buckets(self) -> int:
        return max(1, round(self._window / self._bucket))

    def _sums(self, queues: List[Dict[str, Any]], kind: str) -> List[int]:
        """The queues' histograms of ``kind``, added up bucket by bucket."""
        totals = [0] * self._buckets()
        for queue in queues:
            for position, count in enumerate(queue["throughput"][kind]):
                totals[position] += count
        return totals

    def _histogram(self, times: List[float], start: float) -> List[int]:
        """How many of ``times`` fall in each bucket from ``start`` (later ones: the last)."""
        counts = [0] * self._buckets()
        for at in times:
            if start <= at < math.inf:  # a time another writer stored may be infinite
                counts[min(int((at - start) // self._bucket), len(counts) - 1)] += 1
        return counts


def _dead_letter(dead: DeadLetter) -> Dict[str, Any]:
    return {"id": dead.id, "reason": dead.reason, "attempts": dead.attempts,
            "node": dead.node_id, "finished": dead.finished, "payload": _preview(dead.payload),
            "traceback": dead.traceback}


def item_document(info: ItemInfo) -> Dict[str, Any]:
    """``GET /api/item``: one item as Queue.get found it (a requeued dead letter
    followed: ``requeued_from``), payload and result as previews."""
    return {"id": info.id, "state": info.state, "attempts": info.attempts,
            "node": info.node_id, "reason": info.reason, "traceback": info.traceback,
            "created": info.created, "finished": info.finished, "due": info.due,
            "requeued_from": info.requeued_from, "payload": _preview(info.payload),
            "result": None if info.result is None else _preview(info.result)}


def _preview(payload: Any) -> str:
    """The start of a payload as text: JSON, or the size of a bytes payload."""
    if isinstance(payload, bytes):
        return f"<{len(payload)} bytes>"
    text = json.dumps(payload, ensure_ascii=False)
    return text if len(text) <= PREVIEW else text[:PREVIEW - 1] + "\u2026"


def _dumps(document: Dict[str, Any]) -> bytes:
    """Strict JSON, which a browser's JSON.parse reads: a stored NaN or Infinity
    (a payload, an item's time) is null here (codec.strict_json)."""
    try:
        text = json.dumps(document, separators=(",", ":"), allow_nan=False)
    except ValueError:  # rare: a stored value holds NaN or Infinity
        text = json.dumps(strict_json(document), separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8")
