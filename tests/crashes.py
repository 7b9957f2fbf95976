"""A finisher's steps driven by hand up to a crash, for the crash and interleaving tests.

docs/protocol.md's crash tables say what the next consumer sees after a
process dies between two writes; these helpers make those writes (and only
those) the way the protocol does, so a test can stop anywhere.
"""
from __future__ import annotations

from typing import Optional

from etcdq_v2 import Claim, Queue
from etcdq_v2.codec import Lock, Record


def stalled_claim(queue: Queue) -> Claim:
    """A claim whose heartbeat has stopped, as a frozen or dying worker's has."""
    claim = queue.claim()
    assert claim is not None
    queue._heartbeat.discard(claim)
    return claim


def outcome_of(queue: Queue, claim: Claim, *, result: object = "done",
               reason: object = "boom") -> Record:
    state = claim._state
    return Record(state.item.payload, state.lock.token, queue.node_id, state.item.attempts,
                  state.item.created, 0.0, result, reason, token=state.item.token)


def commit(queue: Queue, claim: Claim, kind: str, *, record: bool = True) -> int:
    """F1 (the fenced commit) and, with ``record``, F2: the index of the last write."""
    protocol, outcome = queue._protocol, outcome_of(queue, claim)
    committed = protocol._commit(claim._state, kind, outcome.encode(outcome=kind))
    assert committed is not None
    if not record:
        return committed.index
    return protocol.etcd.put(protocol.layout.key(kind, claim.id), outcome.encode(),
                             ttl=protocol.record_ttls[kind], prev_exist=False).index


def commit_then_crash(queue: Queue, kind: str, *, record: bool = True) -> str:
    """Claim an item, commit it (F1, and F2 with ``record``), and die: its id."""
    claim = stalled_claim(queue)
    commit(queue, claim, kind, record=record)
    return claim.id


def record_like_0_1_0_then_crash(queue: Queue, kind: str) -> str:
    """0.1.0's completion up to a crash: the record was its commit (the item unchanged)."""
    claim = stalled_claim(queue)
    record = outcome_of(queue, claim)
    queue.etcd.put(queue.layout.key(kind, claim.id), record.encode(), prev_exist=False)
    return claim.id


def left_lock(queue: Queue, kind: str, item_id: str) -> Optional[Lock]:
    """The lock a finished item's finisher left to expire (F4 is skipped when
    lock_ttl <= LINGER_MAX), or None once it is gone.  Any other lock there
    (one whose claim token is not the record's) fails the test."""
    entry = queue._protocol.read("locks", item_id)
    if entry is None:
        return None
    record = queue._protocol.read(kind, item_id)
    assert record is not None, f"a lock on {item_id}, which has no {kind} record"
    lock = Lock.decode(entry.value)
    assert lock.token == Record.decode(record.value).claim, \
        f"{item_id} is finished, but locks/ holds another lock: {lock}"
    return lock
