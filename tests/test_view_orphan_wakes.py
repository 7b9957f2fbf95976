"""An orphan (an item whose outcome record F2 and lock delete F4 a watching
view saw, but not F3) is offered once its F3 is overdue (the transport's
deadline after F4), also to a claim that was already waiting, with no
timeout, when the orphan was noted (docs/protocol.md, "Deadlines": a waiting
claim wakes for the first orphan due).

Real etcd; the finisher's F3 is dropped before it is sent (its delete_all
sends only the lock's delete), as test_claim_walk_drops.py does.
"""
from __future__ import annotations

import time
from typing import Any, List


from etcdq_v2 import Queue, connect
from etcdq_v2.errors import QueueClosed

from helpers import in_background, work_ids

DEADLINE = 3.0  # the waiting consumer's transport deadline: its orphans' delay


def _drop_f3(queue: Queue) -> None:
    """The queue's finishes send F4 (the lock's delete) and never F3."""
    real = queue._protocol.etcd.delete_all

    def f3_lost(deletes: List[Any]) -> Any:
        return real([d for d in deletes if "/locks/" in d[0]])

    queue._protocol.etcd.delete_all = f3_lost  # type: ignore[method-assign]


def test_an_orphan_noted_while_a_claim_waits_forever_is_offered_once_due(
        etcd_url: str, queue_name: str) -> None:
    """Consumer ``q`` waits with claim(timeout=None), its view watching; another
    consumer (lock TTL > LINGER_MAX, so F4 is sent) holds X and completes it,
    its F3 lost.  X is then in work/ with no lock; the waiting claim must take
    it about DEADLINE after F4 and finish it (F3: a claim that finds X's
    outcome finishes it and hands nothing out), not at its watching round's
    end a minute later."""
    transport = connect(etcd_url, timeout=1.0, deadline=DEADLINE)
    with Queue(transport, queue_name) as q, \
            Queue(etcd_url, queue_name, lock_ttl=120) as other:
        x = other.put("x")
        held = other.claim(timeout=5)
        assert held is not None and held.id == x
        thread, outcome = in_background(lambda: q.claim(timeout=None), "waiting-claim")
        time.sleep(2 * DEADLINE)  # q found X locked, watches, and waits (its checks done)
        assert thread.is_alive() and x in work_ids(q)
        _drop_f3(other)
        held.complete()
        assert x in work_ids(q), "F3 applied after all: not the case under test"
        completed = time.monotonic()
        finished = _gone_within(q, x, DEADLINE + 7)
        waited = time.monotonic() - completed
    thread.join(10)  # close() ends the wait (QueueClosed)
    assert finished, (
        f"X ({x}) in work/ with no lock for {waited:.1f} s, not taken by the waiting "
        f"claim (orphan delay {DEADLINE:g} s)")
    assert isinstance(outcome.get("raised"), QueueClosed), outcome


def _gone_within(queue: Queue, item_id: str, seconds: float) -> bool:
    """Whether ``item_id`` leaves work/ within ``seconds``."""
    give_up = time.monotonic() + seconds
    while item_id in work_ids(queue):
        if time.monotonic() >= give_up:
            return False
        time.sleep(0.2)
    return True
