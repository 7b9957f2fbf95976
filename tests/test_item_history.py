"""What happened to an item: the last error with its traceback, the attempts, when
the next try is due, and a requeued dead letter's old id followed to its new item.

Through the Python API and the ``etcdq`` command line, against a real etcd.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any, Iterator, List, Optional

import pytest

from etcdq_v2 import ItemInfo, NotFound, Queue, Worker
from etcdq_v2 import codec

BOUND = 20.0


@pytest.fixture
def queue(etcd_url: str, queue_name: str) -> Iterator[Queue]:
    with Queue(etcd_url, queue_name, max_attempts=3, backoff=[30]) as q:
        yield q


def etcdq(etcd_url: str, *args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, "-m", "etcdq_v2", "--endpoints", etcd_url, *args],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ))


def check_the_order(n: int) -> None:
    """A handler that fails with a traceback naming this function."""
    raise ValueError(f"order {n} is not valid")


def run_once(queue: Queue, handler: Any = None) -> Any:
    worker = Worker(queue, handler or (lambda payload: check_the_order(payload["n"])),
                    install_signal_handlers=False, claim_timeout=0.2)
    return worker.run(max_items=1)


def test_a_failed_attempt_shows_its_error_traceback_and_next_try_while_it_waits(
        queue: Queue, etcd_url: str) -> None:
    item_id = queue.put({"n": 7})
    run_once(queue)
    before = time.time()
    info = queue.get(item_id)
    assert (info.state, info.attempts) == ("pending", 1)
    assert info.reason == "ValueError: order 7 is not valid"
    assert info.traceback is not None and "in check_the_order" in info.traceback
    # From the handler's first frame: none of the worker's own.
    assert info.traceback.splitlines()[1].endswith("in <lambda>")
    assert "worker.py" not in info.traceback
    assert info.traceback.rstrip().endswith("ValueError: order 7 is not valid")
    assert info.due is not None and before + 20 < info.due < before + 32  # backoff [30]
    assert [i.reason for i in queue.items("pending")] == [info.reason]
    shown = etcdq(etcd_url, "show", queue.name, item_id)
    assert shown.returncode == 0, shown.stderr
    assert "reason:" in shown.stdout and "due:" in shown.stdout
    assert "  raise ValueError" in shown.stdout.split("traceback:", 1)[1]
    as_json = json.loads(etcdq(etcd_url, "--json", "show", queue.name, item_id).stdout)
    assert as_json["traceback"] == info.traceback and as_json["due"] == pytest.approx(info.due)


def test_stats_counts_delayed_items_within_pending(queue: Queue, etcd_url: str) -> None:
    failing = queue.put({"n": 1})
    run_once(queue)  # fails: back in 30 s (backoff)
    assert queue.get(failing).attempts == 1
    queue.put({"n": 2}, delay=60)
    ready = queue.put({"n": 3})
    counts = queue.stats()
    assert counts == {"pending": 3, "running": 0, "completed": 0, "failed": 0}
    assert counts.delayed == 2
    assert [info.id for info in queue.items("pending") if info.due is None] == [ready]
    line = etcdq(etcd_url, "stats", queue.name).stdout
    assert "pending 3 (delayed 2)  running 0" in line


def test_a_dead_letter_keeps_the_end_of_a_long_traceback(queue: Queue) -> None:
    def deep(level: int) -> None:
        """200 chained exceptions: a traceback far longer than the bound."""
        if level == 0:
            raise RuntimeError("the bottom")
        try:
            deep(level - 1)
        except RuntimeError as exc:
            raise RuntimeError(f"level {level}") from exc

    item_id = queue.put({"n": 1})
    with Queue(queue.etcd, queue.name, max_attempts=1) as once:
        stats = Worker(once, lambda _: deep(200), install_signal_handlers=False).run(max_items=1)
    assert (stats.dead_lettered, stats.attempts_failed) == (1, 0)
    info = queue.get(item_id)
    assert (info.state, info.reason) == ("failed", "RuntimeError: level 200")
    assert info.traceback is not None
    assert info.traceback.startswith("[") and "characters cut]" in info.traceback
    assert len(info.traceback) <= codec.TRACEBACK_LIMIT + 40
    assert info.traceback.rstrip().endswith("RuntimeError: level 200")
    assert [i.traceback for i in queue.items("failed")] == [info.traceback]


def test_the_worker_counts_failed_attempts_apart_from_dead_letters(etcd_url: str,
                                                                  queue_name: str) -> None:
    """An item failed twice: one attempt retried, then dead-lettered."""
    with Queue(etcd_url, queue_name, max_attempts=2, backoff=[0.0]) as queue:
        queue.put({"n": 1})
        stats = Worker(queue, lambda payload: check_the_order(payload["n"]),
                       install_signal_handlers=False, claim_timeout=0.2).run(until_empty=True)
        assert (stats.attempts_failed, stats.dead_lettered, stats.failed) == (1, 1, 2)
        assert str(stats) == ("completed 0  attempts failed 1  dead-lettered 1  lost 0  "
                              "released 0")


def test_etcdq_work_says_attempts_failed_and_dead_lettered(etcd_url: str,
                                                           queue_name: str) -> None:
    with Queue(etcd_url, queue_name) as queue:
        retried, dead = queue.put("retried"), queue.put("dead")
        done = etcdq(etcd_url, "work", queue.name, "--max-items", "1", "--", "false")
        assert done.returncode == 1
        assert done.stdout.split() == ["completed", "0", "attempts", "failed", "1",
                                       "dead-lettered", "0", "lost", "0", "released", "0"]
        info = queue.get(retried)
        assert (info.state, info.attempts) == ("pending", 1)
        # A command's reason is its exit status (and stderr): no traceback of etcdq's own.
        assert (info.reason, info.traceback) == ("CommandFailed: exit status 1", None)
        done = etcdq(etcd_url, "work", queue.name, "--max-items", "1", "--max-attempts", "1",
                     "--", "false")
        assert "attempts failed 0  dead-lettered 1" in done.stdout
        assert queue.get(dead).state == "failed"


def dead_letter(queue: Queue, payload: Any) -> str:
    item_id = queue.put(payload)
    with Queue(queue.etcd, queue.name, max_attempts=1) as once:
        claim = once.claim(timeout=BOUND)
        assert claim is not None and claim.id == item_id
        claim.fail("on purpose")
    return item_id


def test_get_follows_a_requeued_dead_letter_to_its_new_item(queue: Queue,
                                                            etcd_url: str) -> None:
    old = dead_letter(queue, {"n": 1})
    new = queue.requeue(old)
    info = queue.get(old)
    assert (info.id, info.state, info.requeued_from) == (new, "pending", [old])
    assert queue.get(new).requeued_from == []
    # Requeued again: the chain is followed to the end.
    with Queue(queue.etcd, queue.name, max_attempts=1) as once:
        claim = once.claim(timeout=BOUND)
        assert claim is not None and claim.id == new
        claim.fail("again")
    newest = queue.requeue(new)
    assert (queue.get(old).id, queue.get(old).requeued_from) == (newest, [old, new])
    shown = etcdq(etcd_url, "show", queue.name, old)
    assert shown.returncode == 0, shown.stderr
    assert f"{old} -> {new} -> {newest}" in shown.stdout and "requeued" in shown.stdout


def test_wait_on_a_requeued_dead_letters_old_id_returns_the_new_items_outcome(
        queue: Queue, etcd_url: str) -> None:
    old = dead_letter(queue, {"n": 2})
    new = queue.requeue(old)
    waited: List[Optional[ItemInfo]] = []
    waiter = threading.Thread(target=lambda: waited.append(queue.wait(old, BOUND)))
    waiter.start()
    time.sleep(0.3)  # the wait is under way before the new item finishes
    claim = queue.claim(timeout=BOUND)
    assert claim is not None and claim.id == new
    claim.complete("done at last")
    waiter.join(BOUND)
    [info] = waited
    assert info is not None
    assert (info.id, info.state, info.result, info.requeued_from) == \
        (new, "completed", "done at last", [old])
    done = etcdq(etcd_url, "wait", queue.name, old, "--timeout", "5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:3] == [old, "completed", "done"]
    assert f"(requeued as {new})" in done.stdout


def test_a_tombstone_naming_no_later_id_is_not_followed(queue: Queue) -> None:
    old = dead_letter(queue, {"n": 3})
    queue.requeue(old)
    key = queue.layout.key("failed", old)
    queue.etcd.put(key, json.dumps({"requeued_as": old}))  # junk: names itself
    with pytest.raises(NotFound, match="no item"):
        queue.get(old)
