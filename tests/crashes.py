"""A finisher's steps driven by hand up to a crash, for the crash and interleaving tests.

docs/protocol.md's crash tables say what the next consumer sees after a
process dies between two writes; these helpers make those writes (and only
those) the way the protocol does, so a test can stop anywhere.
"""
from __future__ import annotations

from etcdq_v2 import Claim, Queue
from etcdq_v2.codec import Record


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
