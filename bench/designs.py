"""The queue designs under test, behind one interface the measurements drive.

A *design* is one way to build a work queue: etcdq_v2 itself, or one of the
peers in bench/peers.py.  A :class:`Target` names a design plus where its
queue lives; it is small and picklable, so a consumer process can be told
what to open.  :func:`open_design` turns it into an object with the
:class:`Design` interface.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Optional, Protocol, Sequence

from etcdq_v2 import Claim, Queue

from . import peers

#: etcdq_v2 sends four PUTs for an item it claims and completes without any
#: lost race: lock (C1), item CAS (C2), the fenced commit's item CAS (F1),
#: completion record (F2); see etcdq_v2/protocol.py.  Every PUT beyond that
#: is a failed attempt.  (A heartbeat refresh is a PUT too, but comes only
#: every lock_ttl/3 = 10 s.)
ETCDQ_PUTS_PER_ITEM = 4

#: The design under test, as named in DESIGNS and in Target.design.
ETCDQ = "etcdq_v2"


class Design(Protocol):
    """What a benchmark consumer or producer needs from a queue."""

    @property
    def requests(self) -> "Counter[str]":
        """Requests sent so far by this instance, by HTTP method (empty if not counted)."""

    @property
    def lock_failures(self) -> Optional[int]:
        """Failed lock attempts so far (lost races); None if the design hides them."""

    def put_many(self, payloads: Sequence[str]) -> None:
        """Enqueue the payloads."""

    def claim(self) -> Optional[str]:
        """Take the next free item and return its payload; None when none is free."""

    def finish(self) -> None:
        """Mark the item of the last successful claim() as done."""

    def runs_recorded_twice(self) -> Optional[int]:
        """Items the queue's own records show were run more than once; None if it keeps none."""

    def close(self) -> None:
        """Release connections and background threads."""


class EtcdqDesign:
    """etcdq_v2 through its public API only, as an application would use it."""

    def __init__(self, url: str, name: str) -> None:
        self.queue = Queue(url, name, lock_ttl=peers.LOCK_TTL)
        self._claim: Optional[Claim] = None
        self._finished = 0

    @property
    def requests(self) -> "Counter[str]":
        return self.queue.etcd.requests

    @property
    def lock_failures(self) -> int:
        expected = ETCDQ_PUTS_PER_ITEM * self._finished
        return max(0, self.requests["PUT"] - expected)

    def put_many(self, payloads: Sequence[str]) -> None:
        self.queue.put_many(list(payloads))

    def claim(self) -> Optional[str]:
        self._claim = self.queue.claim(timeout=0)
        return None if self._claim is None else str(self._claim.payload)

    def finish(self) -> None:
        assert self._claim is not None, "finish() without a claim"
        self._claim.complete(None)
        self._claim = None
        self._finished += 1

    def runs_recorded_twice(self) -> int:
        # Each item has at most one completed/ record; its attempt count says
        # how many times the item was claimed before that record was written.
        return sum(1 for info in self.queue.items("completed") if info.attempts > 1)

    def close(self) -> None:
        self.queue.close()


@dataclass(frozen=True)
class DesignInfo:
    """What the report needs to know about a design."""

    name: str
    label: str
    backend: str  # "etcd" or "zookeeper"
    peer: bool    # a baseline, as opposed to etcdq_v2 itself
    #: etcd writes one item needs at the least, put to done, with no lost race.
    min_writes_per_item: Optional[int]


DESIGNS: Dict[str, DesignInfo] = {info.name: info for info in (
    # put 1 + mutex 1 + delete item 1 + delete mutex 1
    DesignInfo("mutex", "global-mutex queue (peer)", "etcd", True, 4),
    # put 1 + lock 1 + completed 1 + delete work 1 + delete lock 1
    DesignInfo("literal", "literal directory-lock queue (peer)", "etcd", True, 5),
    DesignInfo("kazoo", "Kazoo LockingQueue on ZooKeeper (peer)", "zookeeper", True, None),
    # put 1 + claim 2 (lock, item CAS) + complete 3 (F1 the fenced commit, F2 the record,
    # F3 delete item).  F4, the lock's delete, is skipped at the default lock_ttl (30 s
    # <= LINGER_MAX): the lock expires, which is no write.  It was 7 with F4 (issue 11).
    DesignInfo(ETCDQ, "etcdq_v2", "etcd", False, 6),
)}


def peer_names() -> List[str]:
    return [info.name for info in DESIGNS.values() if info.peer]


@dataclass(frozen=True)
class Target:
    """A design and the queue it should use: picklable, for consumer processes."""

    design: str
    address: str  # an etcd client URL, or ZooKeeper's host:port
    queue: str


def open_design(target: Target) -> Design:
    """Connect to ``target``'s queue with its design."""
    if target.design == ETCDQ:
        return EtcdqDesign(target.address, target.queue)
    if target.design == "mutex":
        return peers.MutexQueue(target.address, target.queue)
    if target.design == "literal":
        return peers.LiteralQueue(target.address, target.queue)
    if target.design == "kazoo":
        return peers.KazooQueue(target.address, target.queue)
    raise ValueError(f"unknown design {target.design!r}; known: {', '.join(DESIGNS)}")
