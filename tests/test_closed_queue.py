"""A closed Queue hands out no claim, and says its open claims are lost.

After close() nothing refreshes a queue's locks: its open claims are lost at
once, claim() and claim_first() raise QueueClosed (also one waiting then),
and a Worker whose queue is closed under it starts no more handlers and says
why.  Real etcd.
"""
from __future__ import annotations

import re
import threading
import time
from typing import Any, Dict, Iterator, List

import pytest

from etcdq_v2 import Queue, QueueClosed, Worker, claim_first
from etcdq_v2.worker import current_task

from faultproxy import FaultProxy
from helpers import in_background, wait_until

BOUND = 15.0  # seconds any single wait may take before it counts as a hang


@pytest.fixture
def other(etcd_url: str, queue_name: str) -> Iterator[Queue]:
    """Another consumer of the same queue, left open."""
    with Queue(etcd_url, queue_name, lock_ttl=30) as queue:
        yield queue


def test_claim_on_a_closed_queue_raises_queue_closed(etcd_url: str, queue_name: str,
                                                     other: Queue) -> None:
    queue = Queue(etcd_url, queue_name, lock_ttl=2)
    queue.put("waiting")
    queue.close()
    with pytest.raises(QueueClosed):
        queue.claim()
    with pytest.raises(QueueClosed):
        queue.claim(timeout=1)
    with pytest.raises(QueueClosed):
        claim_first([queue])
    with pytest.raises(QueueClosed):
        claim_first([other, queue])  # also when an open queue comes first
    assert other.stats()["pending"] == 1  # nothing was claimed


def test_a_claim_waiting_when_the_queue_closes_raises_queue_closed(
        etcd_url: str, queue_name: str) -> None:
    queue = Queue(etcd_url, queue_name, lock_ttl=2)
    thread, outcome = in_background(lambda: queue.claim(timeout=None), "waiting claim")
    time.sleep(0.3)  # in its wait for an item
    queue.close()
    thread.join(BOUND)
    assert not thread.is_alive(), "claim() went on waiting on a closed queue"
    assert isinstance(outcome.get("raised"), QueueClosed), outcome


def test_close_marks_the_open_claims_lost_at_once_and_they_can_still_be_released(
        etcd_url: str, queue_name: str, other: Queue, caplog: pytest.LogCaptureFixture) -> None:
    queue = Queue(etcd_url, queue_name, lock_ttl=30)
    first, second = queue.put_many(["one", "two"])
    held, kept = queue.claim(), queue.claim()
    assert (held.id, kept.id) == (first, second) and not held.lost
    queue.close()
    assert held.lost and kept.lost  # now, not a lock TTL later
    assert sum("queue was closed" in record.getMessage() for record in caplog.records) == 2
    held.release()  # a lost claim may still settle: the fence decides
    again = other.claim()
    assert again is not None and again.id == first
    again.complete()
    kept.complete("late but ours")
    assert other.get(second).result == "late but ours"


def test_a_worker_whose_queue_is_closed_starts_no_more_handlers_and_raises(
        etcd_url: str, queue_name: str, other: Queue) -> None:
    queue = Queue(etcd_url, queue_name, lock_ttl=30)
    queue.put_many([{"n": n} for n in range(6)])
    started: List[Any] = []
    two_running = threading.Barrier(3, timeout=BOUND)
    cancelled: List[bool] = []

    def handler(payload: Any) -> None:
        started.append(payload)
        if len(started) <= 2:
            two_running.wait()
        cancelled.append(current_task().cancelled.wait(BOUND))

    worker = Worker(queue, handler, concurrency=2, claim_timeout=0.2,
                    install_signal_handlers=False)
    thread, outcome = in_background(worker.run, "worker")
    two_running.wait()
    queue.close()
    thread.join(BOUND)
    assert not thread.is_alive(), "the worker went on with a closed queue"
    assert isinstance(outcome.get("raised"), QueueClosed), outcome
    assert len(started) == 2, f"handlers started after the close: {started[2:]}"
    assert cancelled == [True, True]  # their claims were lost: the handlers were told
    assert worker.stats.lost == 2 and worker.stats.completed == 0
    # Nothing was recorded: the items come back (their locks expire), none is done.
    assert other.stats()["completed"] == 0
    wait_until(lambda: other.stats()["running"] == 2, 5, message="the two locks")


def test_a_claim_under_way_when_its_queue_closes_is_handed_out_lost_or_raises(
        proxy: FaultProxy, queue_name: str, etcd_url: str) -> None:
    """close() while the claim's C2 is held in flight: the claim that returns
    (its C2 applied on release) says lost at once, never a live claim that
    nothing refreshes; the item comes back to another consumer."""
    queue = Queue(proxy.url, queue_name, lock_ttl=2)
    try:
        assert queue.claim() is None
        item_id = queue.put("closing")
        proxy.hold("up", match=re.compile(
            rb"PUT /v2/keys/\S*/work/" + item_id.encode() + rb" HTTP"))
        outcome: Dict[str, object] = {}

        def claim() -> None:
            try:
                outcome["claim"] = queue.claim()
            except Exception as exc:  # QueueClosed or the closed transport's error
                outcome["error"] = exc

        claimer = threading.Thread(target=claim)
        claimer.start()
        time.sleep(1.0)  # C1 applied, C2 held
        queue.close()
        proxy.release()
        claimer.join(20)
        assert not claimer.is_alive()
        got = outcome.get("claim")
        assert got is None or got.lost, "a closed queue handed out a live-looking claim"
    finally:
        proxy.pass_through()
        queue.close()
    with Queue(etcd_url, queue_name, lock_ttl=30) as other:
        again = other.claim(timeout=10)
        assert again is not None and again.id == item_id
        again.complete()


def test_claim_first_waiting_on_two_queues_ends_when_one_is_closed(
        etcd_url: str, queue_name: str) -> None:
    """claim_first(timeout=None) on two empty queues; one is closed: the wait
    ends with QueueClosed, it does not sleep on forever."""
    with Queue(etcd_url, queue_name + "-a") as first, \
            Queue(etcd_url, queue_name + "-b") as second:
        outcome: Dict[str, object] = {}

        def wait() -> None:
            try:
                outcome["claim"] = claim_first([first, second], timeout=None)
            except Exception as exc:
                outcome["error"] = exc

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        time.sleep(1.0)
        second.close()
        waiter.join(10)
        assert not waiter.is_alive(), "claim_first slept on after a queue closed"
        assert isinstance(outcome.get("error"), QueueClosed), outcome


def test_a_worker_over_two_queues_finishes_the_open_queues_item_and_stops_when_one_closes(
        etcd_url: str, queue_name: str) -> None:
    """A Worker over queues a and b runs an item of a (3 s); b is closed under
    it.  a's claim is not lost (its queue is open): the handler runs on and
    its result is recorded; then the Worker's next claim raises QueueClosed
    and run() propagates it.  Nothing is left locked."""
    with Queue(etcd_url, queue_name + "-a") as a, Queue(etcd_url, queue_name + "-b") as b:
        item_id = a.put("running")
        started = threading.Event()

        def handler(payload: str) -> str:
            started.set()
            current_task().cancelled.wait(3)
            return "done"

        worker = Worker([a, b], handler, install_signal_handlers=False)
        outcome: Dict[str, object] = {}

        def run() -> None:
            try:
                outcome["stats"] = worker.run()
            except Exception as exc:
                outcome["error"] = exc

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        assert started.wait(10)
        b.close()
        runner.join(15)
        assert not runner.is_alive(), "the Worker ran on after one of its queues closed"
        assert isinstance(outcome.get("error"), QueueClosed), outcome
        assert a.get(item_id).state == "completed"
