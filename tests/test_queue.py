"""Behaviour of one queue against a real etcd: the API the issue names."""
from __future__ import annotations

import threading
import time

import pytest

from etcdq_v2 import ClaimClosed, EtcdqError, InvalidArgument, LockLost, NotFound, Queue
from etcdq_v2.codec import Lock
from etcdq_v2.protocol import boot_clock

from helpers import wait_until


@pytest.fixture
def queue(etcd_url: str, queue_name: str):
    with Queue(etcd_url, queue_name, lock_ttl=2) as q:
        yield q


def test_items_come_out_in_fifo_order(queue: Queue) -> None:
    ids = queue.put_many([{"n": n} for n in range(30)])
    assert ids == sorted(ids)
    taken = []
    while True:
        claim = queue.claim()
        if claim is None:
            break
        taken.append(claim.payload["n"])
        claim.complete()
    assert taken == list(range(30))


def test_complete_records_the_item_and_removes_it(queue: Queue) -> None:
    item_id = queue.put("hello")
    claim = queue.claim()
    assert (claim.id, claim.payload, claim.attempt) == (item_id, "hello", 1)
    assert queue.stats() == {"pending": 0, "running": 1, "completed": 0, "failed": 0}
    claim.complete({"answer": 42})
    info = queue.get(item_id)
    assert (info.state, info.result, info.attempts, info.node_id) == \
        ("completed", {"answer": 42}, 1, queue.node_id)
    assert queue.stats() == {"pending": 0, "running": 0, "completed": 1, "failed": 0}
    assert queue.claim() is None
    for again in (claim.complete, claim.fail, claim.release, claim.refresh):
        with pytest.raises(ClaimClosed, match="already completed"):
            again()


def test_items_of_an_unknown_state_is_an_invalid_argument(queue: Queue) -> None:
    with pytest.raises(InvalidArgument, match="unknown state 'done'"):
        queue.items("done")
    assert issubclass(InvalidArgument, ValueError)


@pytest.mark.parametrize("lock_ttl", [2, 61], ids=["lock-lingers", "F4-sent"])
def test_claim_costs_two_requests_and_complete_three_in_three_round_trips(
        etcd_url: str, queue_name: str, lock_ttl: int) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as queue:
        queue.put_many(["a", "b"])
        queue.claim().complete()  # starts the view
        queue.etcd.requests.clear()
        claim = queue.claim()
        assert queue.etcd.requests == {"PUT": 2}  # C1 lock, C2 item
        queue.etcd.requests.clear()
        claim.complete()
        # F1 the fenced commit on the item, F2 the record, then F3; F4 (sent with F3)
        # only for a lock_ttl over LINGER_MAX: a shorter lock is left to expire.
        assert queue.etcd.requests == {"PUT": 2, "DELETE": 1 if lock_ttl <= 60 else 2}
        lock = queue._protocol.read("locks", claim.id)
        if lock_ttl <= 60:
            assert lock is not None and Lock.decode(lock.value).token == claim._state.lock.token
            wait_until(lambda: queue._protocol.read("locks", claim.id) is None, 5,
                       message="the finisher's lock to expire")
        else:
            assert lock is None


def test_a_finished_items_lingering_lock_counts_for_nothing_in_stats_items_and_get(
        etcd_url: str, queue_name: str) -> None:
    """issue 14: F4 is skipped (lock_ttl 30 s), so a completed item's and a dead
    letter's locks are still in locks/.  Neither is running, nor blocks anything."""
    with Queue(etcd_url, queue_name, max_attempts=1) as queue:
        done, dead, waiting = queue.put_many(["done", "dead", "waiting"])
        queue.claim().complete("ok")
        queue.claim().fail("no")
        assert {e.id for e in queue._protocol.list("locks")[1]} == {done, dead}  # lingering
        assert queue.stats() == {"pending": 1, "running": 0, "completed": 1, "failed": 1}
        assert queue.items("running") == []
        assert [info.id for info in queue.items("pending")] == [waiting]
        assert [info.id for info in queue.items("completed")] == [done]
        assert [info.id for info in queue.items("failed")] == [dead]
        assert (queue.get(done).state, queue.get(dead).state, queue.get(waiting).state) == \
            ("completed", "failed", "pending")
        view = queue.overview()
        assert view.counts == queue.stats() and view.running == []
        claim = queue.claim()
        assert claim is not None and claim.id == waiting
        assert [info.id for info in queue.items("running")] == [waiting]
        claim.complete()


def test_a_dead_letter_is_requeued_at_once_though_its_finishers_lock_lingers(
        etcd_url: str, queue_name: str) -> None:
    """Q0 takes over the lock the finisher left to expire (its claim token is the
    dead letter's) instead of waiting up to lock_ttl for it: 5 PUTs in all (Q0's
    refused create and its CAS, Q1, Q3, Q4), no polling."""
    with Queue(etcd_url, queue_name, lock_ttl=60, max_attempts=1) as queue:
        dead = queue.put("dead")
        claim = queue.claim()
        claim.fail("no")
        lingering = queue._protocol.read("locks", dead)
        assert lingering is not None and Lock.decode(lingering.value).token == \
            claim._state.lock.token
        queue.etcd.requests.clear()
        new_id = queue.requeue(dead)
        assert queue.etcd.requests["PUT"] == 5
        assert queue._protocol.read("locks", dead) is None  # Q5 dropped ours
        again = queue.claim()
        assert again is not None and (again.id, again.payload) == (new_id, "dead")
        again.complete()
        assert queue.stats() == {"pending": 0, "running": 0, "completed": 1, "failed": 0}


def test_a_commit_that_etcd_applies_after_another_claim_is_refused(
        etcd_url: str, queue_name: str) -> None:
    """The stale claim believes its lease (its clock says the lock is fresh, as when
    its write was held in flight): only etcd's compare on the item can refuse it."""
    with Queue(etcd_url, queue_name, lock_ttl=1, max_attempts=2) as slow, \
            Queue(etcd_url, queue_name, lock_ttl=30, max_attempts=2) as fast:
        item_id = slow.put("contested")
        stale = slow.claim()
        slow._heartbeat.discard(stale)
        winner = fast.claim(timeout=10)
        assert (winner.id, winner.attempt) == (item_id, 2)
        winner.fail("attempt 2 of 2: dead-lettered")
        stale._state.confirmed = boot_clock()  # "the lock is certainly still mine"
        with pytest.raises(LockLost):
            stale.complete("too late")
        assert fast.stats() == {"pending": 0, "running": 0, "completed": 0, "failed": 1}
        assert fast.get(item_id).reason == "attempt 2 of 2: dead-lettered"


def test_release_with_delay_hides_the_item_until_etcd_expires_it(queue: Queue) -> None:
    queue.put("later")
    claim = queue.claim()
    started = time.monotonic()
    claim.release(delay=1)
    assert queue.claim() is None
    assert queue.stats()["pending"] == 1
    again = queue.claim(timeout=5)
    assert again is not None and again.attempt == 1  # a release gives the attempt back
    assert time.monotonic() - started >= 0.9
    again.complete()


def test_release_now_makes_the_item_claimable_at_once(queue: Queue) -> None:
    queue.put("x")
    queue.claim().release()
    claim = queue.claim()
    assert claim is not None and claim.attempt == 1


def test_fail_retries_after_a_backoff_then_dead_letters(etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=2, max_attempts=2, backoff=[1]) as queue:
        item_id = queue.put({"poison": True})
        queue.claim().fail("first")
        assert queue.claim() is None  # backing off (1 s)
        second = queue.claim(timeout=5)
        assert second.attempt == 2
        second.fail("second")
        assert queue.stats() == {"pending": 0, "running": 0, "completed": 0, "failed": 1}
        dead = queue.items("failed")
        assert [(d.id, d.reason, d.attempts) for d in dead] == [(item_id, "second", 2)]
        assert queue.claim(timeout=1.5) is None

        new_id = queue.requeue(item_id)
        assert new_id > item_id
        assert queue.stats()["failed"] == 0
        again = queue.claim()
        assert (again.id, again.payload, again.attempt) == (new_id, {"poison": True}, 1)
        again.complete()
        with pytest.raises(NotFound):
            queue.requeue(item_id)


def test_blocking_claim_is_woken_by_a_put_without_polling(queue: Queue, etcd_url: str) -> None:
    queue.claim()  # the view is ready
    got = []
    waiter = threading.Thread(target=lambda: got.append(queue.claim(timeout=30)))
    waiter.start()
    queue.etcd.requests.clear()
    waiter.join(1.0)  # blocked for a second ...
    assert waiter.is_alive() and sum(queue.etcd.requests.values()) == 0  # ... sending nothing
    with Queue(etcd_url, queue.name) as producer:
        item_id = producer.put("wake up")
    waiter.join(30)
    assert got and got[0].id == item_id  # woken by the watch's event, well before 30 s


def test_claim_timeout_none_waits_and_zero_does_not(queue: Queue) -> None:
    started = time.monotonic()
    assert queue.claim(timeout=0) is None
    assert queue.claim(timeout=0.5) is None
    assert 0.45 <= time.monotonic() - started < 3


def test_context_manager_completes_or_fails(queue: Queue) -> None:
    ok_id, bad_id = queue.put_many(["ok", "bad"])
    with queue.claim() as claim:
        assert claim.id == ok_id
    with pytest.raises(RuntimeError):
        with queue.claim() as claim:
            raise RuntimeError("handler broke")
    assert queue.get(ok_id).state == "completed"
    assert queue.get(bad_id).state == "pending"
    assert claim.outcome == "failed"


def test_complete_after_the_lock_expired_still_works(queue: Queue) -> None:
    item_id = queue.put("slow")
    claim = queue.claim()
    queue._heartbeat.discard(claim)  # stop refreshing: simulate a stalled worker
    wait_until(lambda: queue._protocol.read("locks", item_id) is None, 10,
               message="the lock to expire")
    claim.complete("late but fine")
    assert queue.get(item_id).result == "late but fine"


@pytest.mark.parametrize("finish", ["complete", "release", "release-later", "fail"])
def test_finishing_a_claim_taken_over_raises_lock_lost_and_changes_nothing(
        etcd_url: str, queue_name: str, finish: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1, max_attempts=2) as slow, \
            Queue(etcd_url, queue_name, lock_ttl=30) as fast:
        item_id = slow.put("contested")
        stale = slow.claim()
        slow._heartbeat.discard(stale)
        winner = fast.claim(timeout=10)
        assert winner.id == item_id and winner.attempt == 2
        calls = {"complete": stale.complete, "release": stale.release,
                 "release-later": lambda: stale.release(delay=5),
                 "fail": lambda: stale.fail("x")}  # attempt 1 of 2: would back off
        with pytest.raises(LockLost):
            calls[finish]()
        assert stale.lost
        assert fast.stats() == {"pending": 0, "running": 1, "completed": 0, "failed": 0}
        assert fast.get(item_id).node_id == fast.node_id
        winner.complete("mine")
        assert fast.get(item_id).result == "mine"


def test_heartbeat_keeps_the_lock_and_detects_its_loss(etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1) as queue, \
            Queue(etcd_url, queue_name, lock_ttl=30) as thief:
        item_id = queue.put("held")
        claim = queue.claim()
        time.sleep(2.5)  # several TTLs: only the heartbeat keeps the lock alive
        assert not claim.lost
        assert queue.stats()["running"] == 1
        # Delete the lock behind the claimer's back and let another node take the
        # item.  The heartbeat is held meanwhile: it would re-create a lock that
        # vanished while the item is still ours, and could win the race.
        queue._heartbeat.discard(claim)
        queue.etcd.delete(queue.layout.key("locks", item_id))
        taken = thief.claim(timeout=5)
        assert taken.id == item_id
        queue._heartbeat.add(claim)
        wait_until(lambda: claim.lost, 5, message="the heartbeat to notice the lost lock")
        with pytest.raises(LockLost):
            claim.refresh()
        with pytest.raises(EtcdqError):
            claim.complete()
        assert Lock.decode(thief._protocol.read("locks", item_id).value).node_id == thief.node_id
        taken.complete()


def test_payloads_round_trip(queue: Queue) -> None:
    payloads = [None, 0, -1.5, "ünïcødé ✓", [1, [2, {"a": None}]], {"nested": {"k": [True]}},
                b"", b"\xff\xfe\x00bin\n", bytes(range(256)), "?#%2F/../x"]
    queue.put_many(payloads)
    got = []
    while (claim := queue.claim()) is not None:
        got.append(claim.payload)
        claim.complete()
    assert got == payloads
    assert type(got[7]) is bytes


def test_get_shows_pending_and_running_items(queue: Queue) -> None:
    first, second = queue.put_many(["one", "two"])
    claim = queue.claim()
    assert queue.get(first).state == "running"
    assert queue.get(first).node_id == queue.node_id
    assert queue.get(second).state == "pending"
    assert [i.id for i in queue.items("pending")] == [second]
    assert [i.id for i in queue.items("running")] == [first]
    claim.complete()
    with pytest.raises(NotFound):
        queue.get("00000000000000000001")


def test_purge_removes_only_records(queue: Queue) -> None:
    queue.put_many(["a", "b", "c"])
    for _ in range(2):
        queue.claim().complete()
    assert queue.purge(completed=True) == 2
    assert queue.stats() == {"pending": 1, "running": 0, "completed": 0, "failed": 0}


def test_a_put_is_claimable_at_once_by_the_same_queue(queue: Queue) -> None:
    queue.claim()  # the view is running
    for n in range(20):
        item_id = queue.put(n)
        claim = queue.claim(timeout=0)
        assert claim is not None and claim.id == item_id
        claim.complete()


def test_complete_can_be_retried_after_an_unavailable_etcd(queue: Queue, monkeypatch) -> None:
    from etcdq_v2 import Unavailable
    item_id = queue.put("retry me")
    claim = queue.claim()
    real_delete_all = queue.etcd.delete_all

    def failing_delete_all(*args, **kwargs):  # the record is written, then etcd goes away
        raise Unavailable("etcd went away")

    monkeypatch.setattr(queue.etcd, "delete_all", failing_delete_all)
    with pytest.raises(Unavailable):
        claim.complete("first try")
    monkeypatch.setattr(queue.etcd, "delete_all", real_delete_all)
    claim.complete("second try")  # our own record is recognised, not "another claim's"
    assert queue.get(item_id).result == "first try"
    assert queue.stats() == {"pending": 0, "running": 0, "completed": 1, "failed": 0}


def test_a_python_etcd_client_is_accepted(etcd_url: str, queue_name: str) -> None:
    import etcd
    from urllib.parse import urlsplit
    parts = urlsplit(etcd_url)
    client = etcd.Client(host=parts.hostname, port=parts.port, protocol="http")
    with Queue(client, queue_name) as queue:
        item_id = queue.put("via python-etcd's configuration")
        claim = queue.claim(timeout=5)
        assert claim.id == item_id
        claim.complete()
        assert queue.etcd.endpoints == [etcd_url]


def test_concurrent_requeues_of_one_dead_letter_requeue_it_once(
        etcd_url: str, queue_name: str) -> None:
    """Q1's compare-and-swap loses to another requeue: NotFound or the same item,
    never a raw etcd error, never two items."""
    from concurrent.futures import ThreadPoolExecutor
    from etcdq_v2 import NotFound
    with Queue(etcd_url, queue_name, max_attempts=1) as queue:
        dead = queue.put_many(range(6))
        for _ in dead:
            queue.claim().fail("dead")
        assert queue.stats()["failed"] == 6

        def requeue(item_id: str):
            try:
                return queue.requeue(item_id)
            except NotFound:
                return None

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(requeue, [i for i in dead for _ in range(4)]))
        assert all(r is None or len(r) == 20 for r in results)
        assert queue.stats() == {"pending": 6, "running": 0, "completed": 0, "failed": 0}
        payloads = sorted(info.payload for info in queue.items("pending"))
        assert payloads == list(range(6))
