"""Queue.wait and ``etcdq wait`` against a real etcd: woken by a watch, never by polling.

The waiting Queue talks to etcd through a FaultProxy, which counts the HTTP
requests it forwards: a wait costs its stream and its first reads, and not
one request more however long it waits.  The proxy also ends the stream
(refuse, restart) to show that a wait watches again and misses nothing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any, Dict, Iterator, List, Optional

import pytest

from etcdq_v2 import (InvalidArgument, InvalidName, ItemInfo, NotFound, Queue, Unavailable,
                      connect)
from etcdq_v2.protocol import COMPLETED, FAILED

from crashes import commit_then_crash, record_like_0_1_0_then_crash
from faultproxy import FaultProxy
from helpers import wait_until

#: What a wait on a pending item sends: its stream, then the records, the item and
#: the records again (W1, W2).
FIRST_REQUESTS = 4
UNKNOWN = "00000000000000999999"


class Waiting:
    """``queue.wait(item_id, timeout)`` in a thread; its result or error when it ends."""

    def __init__(self, queue: Queue, item_id: str, timeout: Optional[float] = 20) -> None:
        self.outcome: Dict[str, Any] = {}
        self.started = time.monotonic()
        self.ended = 0.0
        self._thread = threading.Thread(target=self._run, args=(queue, item_id, timeout),
                                        daemon=True)
        self._thread.start()

    def _run(self, queue: Queue, item_id: str, timeout: Optional[float]) -> None:
        try:
            self.outcome["returned"] = queue.wait(item_id, timeout)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            self.outcome["raised"] = exc
        self.ended = time.monotonic()

    def result(self, bound: float = 10) -> Any:
        self._thread.join(bound)
        assert not self._thread.is_alive(), f"the wait did not end within {bound:g} s"
        if "raised" in self.outcome:
            raise self.outcome["raised"]
        return self.outcome["returned"]

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()


@pytest.fixture
def waiter(proxy: FaultProxy, queue_name: str) -> Iterator[Queue]:
    """A Queue whose every request goes through ``proxy``, which counts them."""
    with Queue(connect(proxy.url, timeout=1, deadline=10), queue_name) as queue:
        yield queue
        queue.etcd.close()


@pytest.fixture
def queue(etcd_url: str, queue_name: str) -> Iterator[Queue]:
    """The producer and consumer, straight to etcd (its requests are not counted)."""
    with Queue(etcd_url, queue_name, lock_ttl=2, max_attempts=1) as q:
        yield q


def following(proxy: FaultProxy, before: int = 0) -> None:
    """Until the wait sent its stream and first reads: from then on it follows events."""
    wait_until(lambda: len(proxy.requests) >= before + FIRST_REQUESTS, 5,
               message="the wait's stream and first reads")


# -- what a wait returns ----------------------------------------------------------------

def test_a_wait_returns_the_record_of_an_item_that_completes(
        waiter: Queue, queue: Queue, proxy: FaultProxy) -> None:
    item_id = queue.put({"n": 1})
    waiting = Waiting(waiter, item_id)
    following(proxy)
    claim = queue.claim(timeout=5)  # its C2 wakes no wait: the item is still running
    assert claim is not None and claim.id == item_id
    assert not waiting.done
    claim.complete({"sent": True})
    info = waiting.result()
    assert isinstance(info, ItemInfo)
    assert (info.id, info.state, info.payload, info.result, info.attempts) == \
        (item_id, COMPLETED, {"n": 1}, {"sent": True}, 1)
    assert info == queue.get(item_id)
    # Woken by the commit's event, which carries the record: not one read after it.
    assert len(proxy.requests) == FIRST_REQUESTS


def test_a_wait_returns_the_dead_letter_of_an_item_that_fails(
        waiter: Queue, queue: Queue, proxy: FaultProxy) -> None:
    item_id = queue.put("poison")
    waiting = Waiting(waiter, item_id)
    following(proxy)
    claim = queue.claim(timeout=5)
    assert claim is not None
    claim.fail("it broke")
    info = waiting.result()
    assert (info.state, info.reason, info.payload) == (FAILED, "it broke", "poison")


def test_a_wait_on_a_finished_item_returns_at_once(waiter: Queue, queue: Queue) -> None:
    done, dead = queue.put_many(["done", "dead"])
    queue.claim(timeout=5).complete("ok")
    queue.claim(timeout=5).fail("no")
    assert waiter.wait(done, timeout=0).state == COMPLETED
    assert waiter.wait(dead, timeout=None).state == FAILED  # no timeout: it returns anyway


@pytest.mark.parametrize("kind, record", [(COMPLETED, False), (FAILED, False),
                                          (COMPLETED, True)],
                         ids=["completed-after-F1", "failed-after-F1", "completed-after-F2"])
def test_a_wait_reports_an_item_whose_finisher_crashed_after_its_commit(
        waiter: Queue, queue: Queue, proxy: FaultProxy, kind: str, record: bool) -> None:
    """Committed (F1) is finished: a wait under way is woken by F1's event, whose value
    is the record, and a new wait reads the outcome from the item itself."""
    item_id = queue.put("committed, then its finisher died")
    waiting = Waiting(waiter, item_id)
    following(proxy)
    assert commit_then_crash(queue, kind, record=record) == item_id
    info = waiting.result()
    assert (info.state, info.reason if kind == FAILED else info.result) == \
        (kind, "boom" if kind == FAILED else "done")
    assert len(proxy.requests) == FIRST_REQUESTS  # not one read after the event
    assert waiter.wait(item_id, timeout=0) == info
    assert queue._protocol.read("work", item_id) is not None  # still in work/, committed


def test_a_wait_reads_the_records_when_the_item_is_removed(
        waiter: Queue, queue: Queue, proxy: FaultProxy) -> None:
    """0.1.0's finisher wrote the record (no event of work/) and died; a claimer finds
    the record and removes the item: its delete event sends the wait to the records."""
    item_id = queue.put("finished by 0.1.0")
    waiting = Waiting(waiter, item_id)
    following(proxy)
    assert record_like_0_1_0_then_crash(queue, COMPLETED) == item_id
    assert not waiting.done  # nothing in work/ changed yet
    with Queue(queue.etcd, queue.name, lock_ttl=2) as claimer:
        # Once the crashed claim's lock expired, a claim finds the record (C3) and
        # removes the item, handing out nothing.
        wait_until(lambda: claimer.claim(timeout=0.3) is None and waiting.done, 8,
                   message="a claimer to remove the item, and the wait to end")
    info = waiting.result()
    assert (info.state, info.result) == (COMPLETED, "done")
    assert len(proxy.requests) == FIRST_REQUESTS + 1  # the delete event: a read of completed/


def test_a_wait_raises_not_found_when_the_item_vanishes_without_a_record(
        waiter: Queue, queue: Queue, proxy: FaultProxy) -> None:
    item_id = queue.put("removed by hand")
    waiting = Waiting(waiter, item_id)
    following(proxy)
    queue.etcd.delete(queue.layout.key("work", item_id))
    with pytest.raises(NotFound):
        waiting.result()


def test_a_wait_on_an_unknown_or_purged_item_raises_not_found(
        waiter: Queue, queue: Queue) -> None:
    with pytest.raises(NotFound):
        waiter.wait(UNKNOWN, timeout=5)
    item_id = queue.put("purged")
    queue.claim(timeout=5).complete()
    assert queue.purge(completed=True) == 1
    started = time.monotonic()
    with pytest.raises(NotFound):
        waiter.wait(item_id)  # no timeout: NotFound at once, not a wait forever
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("bad", ["42", "../work/00000000000000000001", 42, None])
def test_a_wait_on_a_malformed_id_raises_invalid_name(waiter: Queue, bad: Any) -> None:
    with pytest.raises(InvalidName):
        waiter.wait(bad)


@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), float("inf"), "5", True])
def test_a_bad_timeout_raises_invalid_argument(waiter: Queue, queue: Queue, bad: Any) -> None:
    item_id = queue.put("x")
    with pytest.raises(InvalidArgument):
        waiter.wait(item_id, timeout=bad)


# -- timeouts, and no requests while waiting ------------------------------------------------

def test_a_wait_times_out_with_none(waiter: Queue, queue: Queue) -> None:
    item_id = queue.put("nobody works")
    assert waiter.wait(item_id, timeout=0) is None
    started = time.monotonic()
    assert waiter.wait(item_id, timeout=0.6) is None
    elapsed = time.monotonic() - started
    assert 0.6 <= elapsed < 1.6, elapsed
    claim = queue.claim(timeout=5)
    assert claim is not None
    assert waiter.wait(item_id, timeout=0.3) is None  # running is not finished


def test_a_timeout_is_kept_while_events_arrive(waiter: Queue, queue: Queue,
                                               proxy: FaultProxy) -> None:
    """Claims and releases of the item wake the stream; they must not extend the wait."""
    item_id = queue.put("claimed and released again and again")
    waiting = Waiting(waiter, item_id, timeout=1.5)
    following(proxy)
    with Queue(queue.etcd, queue.name, lock_ttl=2) as churn:
        while not waiting.done and time.monotonic() - waiting.started < 5:
            claim = churn.claim(timeout=1)
            if claim is not None:
                claim.release()
    assert waiting.result() is None
    assert 1.5 <= waiting.ended - waiting.started < 2.5


def test_etcd_gets_no_request_while_a_wait_waits(waiter: Queue, queue: Queue,
                                                 proxy: FaultProxy) -> None:
    """A wait of 0.3 s and one of 3 s send the same requests: the stream and the
    first reads.  (A wait that polled would send more the longer it waited.)"""
    item_id = queue.put("pending for a while")
    assert waiter.wait(item_id, timeout=0.3) is None
    short = len(proxy.requests)
    assert waiter.wait(item_id, timeout=3) is None
    long = len(proxy.requests) - short
    assert short == long == FIRST_REQUESTS


def test_close_ends_a_wait_with_unavailable(proxy: FaultProxy, queue: Queue) -> None:
    item_id = queue.put("never finished")
    waiter = Queue(connect(proxy.url, timeout=1), queue.name)
    try:
        waiting = Waiting(waiter, item_id, timeout=None)
        following(proxy)
        waiter.close()
        with pytest.raises(Unavailable, match="closed"):
            waiting.result(bound=5)
    finally:
        waiter.close()
        waiter.etcd.close()


# -- a stream that ends ---------------------------------------------------------------------

@pytest.mark.parametrize("finish", ["while-refused", "after-restart"])
def test_a_wait_watches_again_when_its_stream_ends(
        waiter: Queue, queue: Queue, proxy: FaultProxy, finish: str) -> None:
    """The proxy refuses (the stream's connection closes, new ones are refused), then
    listens again.  An item finished while nothing watched is found by the new
    round's read; one finished afterwards by the new stream's event."""
    item_id = queue.put("outlives its watch")
    waiting = Waiting(waiter, item_id, timeout=30)
    following(proxy)
    claim = queue.claim(timeout=5)
    assert claim is not None
    proxy.refuse()
    if finish == "while-refused":
        claim.complete("seen by the read")
    proxy.restart()
    if finish == "after-restart":
        following(proxy, before=FIRST_REQUESTS)  # watching again
        assert not waiting.done
        claim.complete("seen by the event")
    info = waiting.result()
    assert (info.state, info.result) == (COMPLETED, "seen by the read" if finish ==
                                         "while-refused" else "seen by the event")


def test_a_wait_watches_again_after_a_quiet_stream_ends(
        proxy: FaultProxy, queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """etcd's stream may stay quiet for good (a member gone without a word): after
    WAIT_IDLE seconds without events the wait subscribes and reads again."""
    monkeypatch.setattr("etcdq_v2.queue.WAIT_IDLE", 0.5)
    item_id = queue.put("quiet")
    with Queue(connect(proxy.url, timeout=1), queue.name) as waiter:
        waiting = Waiting(waiter, item_id, timeout=30)
        following(proxy, before=2 * FIRST_REQUESTS)  # two rounds at least
        queue.claim(timeout=5).complete("late")
        assert waiting.result().result == "late"
        waiter.etcd.close()


# -- the command line -----------------------------------------------------------------------

def etcdq(etcd_url: str, *args: str, timeout: float = 60) -> "subprocess.CompletedProcess[str]":
    env = {**os.environ, "ETCDQ_ENDPOINTS": etcd_url}
    return subprocess.run([sys.executable, "-m", "etcdq_v2", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def finished_items(queue: Queue, outcomes: List[str]) -> List[str]:
    """One item per outcome ("completed" or "failed"), finished in that order."""
    ids = queue.put_many([f"item {n}" for n in range(len(outcomes))])
    for outcome in outcomes:
        claim = queue.claim(timeout=5)
        assert claim is not None
        if outcome == COMPLETED:
            claim.complete({"for": claim.payload})
        else:
            claim.fail(f"failed {claim.payload}")
    return ids


def test_cli_wait_exits_0_when_all_completed(etcd_url: str, queue: Queue) -> None:
    ids = finished_items(queue, [COMPLETED, COMPLETED])
    done = etcdq(etcd_url, "wait", queue.name, *ids)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f'{ids[0]}  completed  {{"for": "item 0"}}', f'{ids[1]}  completed  {{"for": "item 1"}}']


def test_cli_wait_waits_for_an_item_finished_meanwhile(etcd_url: str, queue: Queue) -> None:
    item_id = queue.put("later")
    finisher = threading.Timer(1.0, lambda: queue.claim(timeout=5).complete("now"))
    finisher.start()
    try:
        done = etcdq(etcd_url, "wait", queue.name, item_id, "--timeout", "20")
    finally:
        finisher.join()
    assert (done.returncode, done.stdout) == (0, f"{item_id}  completed  now\n"), done.stderr


def test_cli_wait_exits_1_when_any_failed(etcd_url: str, queue: Queue) -> None:
    ids = finished_items(queue, [COMPLETED, FAILED])
    done = etcdq(etcd_url, "--json", "wait", queue.name, *ids)
    assert done.returncode == 1, done.stderr
    states = [(doc["id"], doc["state"], doc["reason"]) for doc in json.loads(done.stdout)]
    assert states == [(ids[0], COMPLETED, None), (ids[1], FAILED, "failed item 1")]


def test_cli_wait_exits_124_when_the_timeout_passes_first(etcd_url: str,
                                                          queue: Queue) -> None:
    """The timeout is for all ids together: two pending items, 1 s in all; a failed
    item after them is still reported (looked at once the time is up)."""
    failed = finished_items(queue, [FAILED])
    pending = queue.put_many(["a", "b"])
    started = time.monotonic()
    done = etcdq(etcd_url, "wait", queue.name, *pending, *failed, "--timeout", "1")
    elapsed = time.monotonic() - started
    assert done.returncode == 124, done.stderr
    assert done.stdout.splitlines() == [f"{pending[0]}  timed out", f"{pending[1]}  timed out",
                                        f"{failed[0]}  failed  failed item 0"]
    assert elapsed < 1 + 5, elapsed  # one timeout, plus the interpreter's start


def test_cli_wait_exits_5_for_an_unknown_id_which_wins(etcd_url: str, queue: Queue) -> None:
    pending = queue.put("pending")
    done = etcdq(etcd_url, "--json", "wait", queue.name, UNKNOWN, pending, "--timeout", "0.2")
    assert done.returncode == 5, done.stderr
    assert f"no item {UNKNOWN}" in done.stderr
    assert [doc["error"] for doc in json.loads(done.stdout)] == ["not found", "timed out"]


@pytest.mark.parametrize("args, fragment", [
    (["12a"], "invalid item id"), ([UNKNOWN, "--timeout", "-1"], "--timeout"),
    ([], "the following arguments are required")])
def test_cli_wait_rejects_bad_usage_with_2(etcd_url: str, queue: Queue, args: List[str],
                                           fragment: str) -> None:
    done = etcdq(etcd_url, "wait", queue.name, *args)
    assert done.returncode == 2 and fragment in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_cli_help_lists_wait_and_its_exit_codes() -> None:
    done = etcdq("http://127.0.0.1:1", "wait", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for fragment in ("--timeout", "0 all completed", "1 any failed", "124 the timeout",
                     "5 an unknown id"):
        assert fragment in text, fragment

