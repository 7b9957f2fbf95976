"""A closed Queue hands out no claim, and says its open claims are lost.

After close() nothing refreshes a queue's locks: its open claims are lost at
once, claim() and claim_first() raise QueueClosed (also one waiting then),
and a Worker whose queue is closed under it starts no more handlers and says
why.  Real etcd.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Iterator, List

import pytest

from etcdq_v2 import Queue, QueueClosed, Worker, claim_first
from etcdq_v2.worker import current_task

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
