"""A result or a reason is held to the payload limit as a payload is: PayloadTooLarge,
nothing stored, the claim still open; a worker fails such an item with a short reason
instead of leaving it claimed to run again."""
from __future__ import annotations

from typing import Iterator

import pytest

from etcdq_v2 import PayloadTooLarge, Queue
from etcdq_v2.worker import Worker

LIMIT = 64 * 1024


@pytest.fixture
def queue(etcd_url: str, queue_name: str) -> Iterator[Queue]:
    with Queue(etcd_url, queue_name, max_attempts=1, max_payload_bytes=LIMIT) as q:
        yield q


@pytest.mark.parametrize("result", ["x" * (LIMIT + 1), ["y" * 1000] * 100, b"z" * LIMIT])
def test_a_result_over_the_limit_is_refused_and_nothing_is_stored(queue: Queue,
                                                                  result: object) -> None:
    item_id = queue.put(1)
    claim = queue.claim()
    with pytest.raises(PayloadTooLarge, match="result too large"):
        claim.complete(result)
    assert queue.get(item_id).state == "running"
    assert queue.stats()["completed"] == 0
    claim.complete("small")  # the claim is still open
    assert queue.get(item_id).result == "small"


def test_a_result_at_the_limit_is_stored(queue: Queue) -> None:
    item_id = queue.put(1)
    queue.claim().complete("x" * (LIMIT - 2))  # its JSON: two quotes more
    assert queue.get(item_id).result == "x" * (LIMIT - 2)


@pytest.mark.parametrize("attempts", [1, 5])
def test_a_reason_over_the_limit_is_refused_whether_or_not_it_is_stored(
        etcd_url: str, queue_name: str, attempts: int) -> None:
    with Queue(etcd_url, queue_name, max_attempts=attempts, max_payload_bytes=LIMIT) as queue:
        item_id = queue.put(1)
        claim = queue.claim()
        with pytest.raises(PayloadTooLarge, match="reason too large"):
            claim.fail("r" * (LIMIT + 1))
        assert queue.get(item_id).state == "running"
        claim.fail("short")
        assert queue.get(item_id).state == ("failed" if attempts == 1 else "pending")


def test_a_worker_fails_an_item_whose_result_or_reason_is_too_large(queue: Queue) -> None:
    big_result, big_reason = queue.put("result"), queue.put("reason")

    def handler(payload: str) -> str:
        if payload == "reason":
            raise RuntimeError("e" * (LIMIT + 1))
        return "x" * (LIMIT + 1)

    worker = Worker(queue, handler, install_signal_handlers=False)
    try:
        stats = worker.run(until_empty=True)
    finally:
        worker.close()
    assert (stats.failed, stats.lost, stats.completed) == (2, 0, 0)
    assert "result too large" in queue.get(big_result).reason
    reason = queue.get(big_reason).reason
    assert "reason too large" in reason and len(reason) < 200
