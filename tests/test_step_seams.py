"""The seams a mutant or a test replaces are the steps (steps.py), and what a
failed step leaves behind.

docs/decisions.md ("Steps are generators of requests"): every C1 runs
``Steps.lock_step``, every F1 ``Steps.commit_step``, every F2-F4
``Steps.record_step``, whichever step or Protocol method drives it; a
replacement on the class (a mutant) or the instance (a test) sees each.  The
simulator's ``f1-unfenced`` mutant relies on it for every F1, C3's dead
letter at max_attempts included.
"""
from __future__ import annotations

import gc
import weakref
from typing import Any, Callable, Iterator, List, Optional

import pytest

from etcdq_v2 import Queue
from etcdq_v2.codec import Lock, Record
from etcdq_v2.errors import AlreadyExists, KeyMissing
from etcdq_v2.keys import Layout
from etcdq_v2.protocol import COMPLETED, FAILED, Gone, Protocol, Taken, Version
from etcdq_v2.runtime import SYSTEM
from etcdq_v2.testing.sim.mutants import mutant

from crashes import commit_then_crash
from helpers import record_calls, wait_until

ITEM = "00000000000000000042"


def test_the_f1_unfenced_mutant_unfences_the_dead_letter_of_c3(etcd_url: str,
                                                               queue_name: str) -> None:
    """A claim A whose C2 reply came after its lock went (B claimed meanwhile)
    dead-letters the item at C3 (max_attempts): with F1 unfenced (the mutant)
    that F1 writes over B's claim, which is what the mutant is there to show."""
    with Queue(etcd_url, queue_name, lock_ttl=30, max_attempts=1) as a, \
            Queue(etcd_url, queue_name, lock_ttl=30, max_attempts=None) as b:
        item_id = a.put("poison")
        work_key, lock_key = (a._protocol.layout.key(kind, item_id) for kind in ("work", "locks"))
        first = b._protocol.claim(item_id, Version(a._protocol.read("work", item_id).index))
        assert first is not None and first.attempt == 1
        b.etcd.delete(lock_key)  # that claim's worker died: a=1, its lock gone
        put = a.etcd.put
        others = []

        def c2_reply_held_past_the_lock(key: str, value: Optional[str] = None, **kw: Any) -> Any:
            reply = put(key, value, **kw)
            if key == work_key and kw.get("prev_index") and '"o":' not in (value or "") \
                    and not others:
                b.etcd.delete(lock_key)  # A's lock expired while its C2 reply was held
                seen = b._protocol.read("work", item_id)
                others.append(b._protocol.claim(item_id, seen.version))  # B: C1, C2 (a=3)
            return reply

        a.etcd.put = c2_reply_held_past_the_lock  # type: ignore[method-assign]
        with mutant("f1-unfenced"):
            with pytest.raises(Gone):
                a._protocol.claim(item_id, Version(a._protocol.read("work", item_id).index))
        a.etcd.put = put  # type: ignore[method-assign]
        assert others and others[0] is not None and others[0].attempt == 3
        record = a._protocol.read(FAILED, item_id)
        assert record is not None, "F1 of C3's dead letter was fenced: the mutant did nothing"
        assert Record.decode(record.value).reason.startswith("abandoned")


def test_a_replaced_lock_step_sees_every_lock_create_of_a_claim(etcd_url: str,
                                                                 queue_name: str) -> None:
    """C1 (``Steps.lock_step``) is the seam of every lock create of a claim:
    the claim's own, and the heartbeat's retake of an expired lock."""
    with Queue(etcd_url, queue_name, lock_ttl=1) as queue:
        item_id = queue.put("x")
        created = record_calls(queue._protocol, "lock_step")
        state = queue._protocol.claim(item_id, Version(queue._protocol.read("work", item_id).index))
        assert state is not None  # no heartbeat: its lock expires
        assert created == [item_id]
        wait_until(lambda: queue._protocol.read("locks", item_id) is None, 5,
                   message="the lock to expire")
        queue._protocol.confirm(state)  # KeyMissing: the item is still ours, so retaken
        assert queue._protocol.read("locks", item_id) is not None
        assert created == [item_id, item_id]


def test_a_replaced_record_step_sees_every_record_write(etcd_url: str,
                                                        queue_name: str) -> None:
    """F2-F4 (``Steps.record_step``) is the seam of every record write: a
    finisher's, and a claimer's that finds an item committed by a finisher
    that died after F1 (C3)."""
    with Queue(etcd_url, queue_name, lock_ttl=1) as finisher, \
            Queue(etcd_url, queue_name, lock_ttl=1) as claimer:
        finisher.put("x")
        item_id = commit_then_crash(finisher, COMPLETED, record=False)  # F1 only
        wait_until(lambda: claimer._protocol.read("locks", item_id) is None, 5,
                   message="the finisher's lock to expire")
        recorded = record_calls(claimer._protocol, "record_step")
        seen = claimer._protocol.read("work", item_id)
        with pytest.raises(Gone):
            claimer._protocol.claim(item_id, seen.version)
        assert claimer._protocol.read(COMPLETED, item_id) is not None
        assert recorded == [item_id]
        other = finisher.put("y")
        claim = claimer.claim(timeout=5)
        assert claim is not None and claim.id == other
        claim.complete()
        assert recorded == [item_id, other]


class RefusingTransport:
    """etcd refusing every request: a PUT "already exists" (C1 on a lock another
    claim holds), a GET "not found".  ``raised``: a weak reference to each error."""

    runtime = SYSTEM

    def __init__(self) -> None:
        self.raised: List["weakref.ref[BaseException]"] = []

    def _raise(self, exc: BaseException) -> Any:
        self.raised.append(weakref.ref(exc))
        try:
            raise exc
        finally:
            del exc  # this frame holds no cycle of its own

    def put(self, key: str, value: Optional[str] = None, **kw: Any) -> Any:
        return self._raise(AlreadyExists("Key already exists", code=AlreadyExists.code,
                                         index=7))

    def get(self, key: str, **kw: Any) -> Any:
        return self._raise(KeyMissing("Key not found", code=KeyMissing.code, index=7))


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def refused_lock_create(protocol: Protocol) -> None:
    with pytest.raises(Taken):  # the step raises: the request's error is not handled
        protocol._create_lock(ITEM, Lock("node-a", "claim-token"), 30)


def read_of_a_missing_key(protocol: Protocol) -> None:
    assert protocol.read("locks", ITEM) is None  # the step handles the request's error


@pytest.mark.parametrize("call", [refused_lock_create, read_of_a_missing_key],
                         ids=["refused-C1", "missing-key-read"])
def test_a_request_that_fails_leaves_no_reference_cycle(collector_off: None,
                                                        call: Callable[[Protocol], None]) -> None:
    """A failed request is the claim race's common case (a refused C1, a C2 on a
    changed item, a read of a lock that is gone): what it made must be freed
    with its result, not left to the cyclic collector."""
    transport = RefusingTransport()
    protocol = Protocol(transport, Layout("/etcdq", "jobs"),  # type: ignore[arg-type]
                        node_id="node-a", lock_ttl=30, max_attempts=None, max_payload=1 << 20,
                        backoff=lambda attempt: 1.0)
    for _ in range(10):
        call(protocol)
    # With the collector off, an error in a cycle (its traceback holding a frame
    # that holds it) outlives the call; freed by its reference count, it does not.
    assert len(transport.raised) == 10
    assert [ref for ref in transport.raised if ref() is not None] == []
