"""The consumer's view: what another process writes reaches it, and freed items come back.

A view watches nothing while it has a backlog (it learns by missing and
listing), and the whole queue directory while its process finds nothing to
claim (docs/protocol.md, "The consumer's view"); these tests pin down each
way an item reaches a consumer whose view is already running.
"""
from __future__ import annotations

import ctypes
import logging
import re
import threading
import time
from typing import List

import pytest

from etcdq_v2 import Queue, connect
from etcdq_v2 import queue as queue_module
from etcdq_v2 import viewstate as viewstate_module
from etcdq_v2.server import free_port
from etcdq_v2.viewstate import BACKLOG

from faultproxy import FaultProxy
from helpers import in_background, wait_until

#: Values whose JSON encoding has escapes, non-ASCII text, and one too large
#: for the view to keep (a claim reads that one).
TRICKY_PAYLOADS = ['"', "\\", 'a"}\n{"b', "é ü \u2028 \U0001F600", {"k": "\"}"}, [None, 1.5],
                   b"\x00\xff\"\\", "x" * 70_000]


def claim_until(consumer: Queue, item_id: str, message: str) -> None:
    """Claim (and release) other items until ``item_id`` comes; 10 s at most."""
    def claims_it() -> bool:
        claim = consumer.claim()
        assert claim is not None
        if claim.id == item_id:
            return True
        claim.release()
        return False

    wait_until(claims_it, 10, interval=0.1, message=message)


def test_items_put_by_another_process_reach_a_running_view_intact(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name) as consumer, Queue(etcd_url, queue_name) as producer:
        assert consumer.claim() is None  # the view is up; what follows comes as events
        ids = producer.put_many(TRICKY_PAYLOADS)
        got = []
        for _ in TRICKY_PAYLOADS:
            claim = consumer.claim(timeout=5)
            assert claim is not None
            got.append((claim.id, claim.payload))
            claim.complete()
        assert got == list(zip(ids, TRICKY_PAYLOADS))


def test_a_waiting_consumer_gets_an_item_another_process_releases(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name) as consumer, Queue(etcd_url, queue_name) as holder:
        item_id = holder.put("released elsewhere")
        held = holder.claim()
        assert consumer.claim() is None  # it is held: the consumer follows locks/ now
        held.release()
        # The lock TTL is 30 s, so only the locks/ stream can bring it back this soon.
        claim = consumer.claim(timeout=10)
        assert claim is not None and claim.id == item_id and claim.attempt == 1


def test_an_expired_lock_is_noticed_under_a_steady_backlog(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1) as consumer:
        first, *rest = consumer.put_many(range(BACKLOG + 10))
        with Queue(etcd_url, queue_name, lock_ttl=1) as crashed:
            assert crashed.claim().id == first
        # ``crashed`` stopped refreshing its lock, which expires in 1-1.5 s.
        # The consumer always finds free items, so it never follows locks/:
        # only its periodic listing of locks/ can show the item free again.
        claim_until(consumer, first, "the crashed claim's item to come back")
        assert not consumer._view.watching_locks  # the backlog kept locks/ unwatched


def test_a_claim_whose_lock_expired_gives_its_item_back_to_its_own_queue(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1) as consumer:
        first, *rest = consumer.put_many(range(BACKLOG + 10))
        stalled = consumer.claim()
        assert stalled.id == first
        consumer._heartbeat.discard(stalled)  # as for a hung handler: the lock runs out
        claim_until(consumer, first, "the stalled claim's item to come back")
        assert not consumer._view.watching_locks


def test_an_item_whose_race_was_lost_comes_back_when_its_holder_releases_it(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1) as consumer, \
            Queue(etcd_url, queue_name) as holder:
        consumer.put_many(range(BACKLOG + 10))
        consumer.claim().complete()  # the view is up, with a backlog: it is quiet
        held = holder.claim()
        # The consumer hears nothing of that claim; it tries the head, loses the race, and
        # takes the next item instead.
        other = consumer.claim()
        assert other.id != held.id and not consumer._view.watching_locks
        other.release()
        held.release()  # nor does it hear of this: a listing of locks/ must show it
        claim_until(consumer, held.id, "the released item to come back")
        assert not consumer._view.watching_locks


@pytest.mark.parametrize("lock_ttl", [30, 61], ids=["locks-linger", "F4-sent"])
def test_a_view_that_fell_behind_lists_again_instead_of_trying_each_stale_item(
        etcd_url: str, queue_name: str, lock_ttl: int) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as other:
        other.put_many(range(10))
        view = consumer._ensure_view()  # it lists the ten items; quiet, it hears nothing
        while (claim := other.claim()) is not None:
            claim.complete()
        fresh = other.put("fresh")
        relists, limit = view.relists, view.state.miss_limit
        consumer.etcd.requests.clear()
        claim = consumer.claim(timeout=5)
        assert claim is not None and claim.id == fresh
        assert view.relists == relists + 1
        # Not one try for each of the ten finished items the view still held, but
        # ``limit`` (the view is quiet: it lists work/ again once its misses cost
        # what that listing does), then the fresh one (lock create, item CAS).
        # With F4 sent, each miss finds the item gone (lock create, item CAS; its
        # lock dropped).  With their finishers' locks left to expire (issue 14),
        # each is a lost race (a lock create refused).  The relist lists work/
        # alone (one GET).
        if lock_ttl <= 60:
            assert dict(consumer.etcd.requests) == {"PUT": limit + 2, "GET": 1}
        else:
            assert dict(consumer.etcd.requests) == {"PUT": limit * 2 + 2, "DELETE": limit,
                                                    "GET": 1}


def test_a_lost_race_widens_the_claim_window_eightfold(etcd_url: str, queue_name: str) -> None:
    """Consumers that start together on a backlog all race for the head until
    their windows are wide apart: doubling cost each of 64 consumers about 8
    lost races (failed lock creates, raft writes all), eightfold about 3
    (issue 14)."""
    with Queue(etcd_url, queue_name) as consumer, Queue(etcd_url, queue_name) as other:
        other.put_many(range(100))
        view = consumer._ensure_view()
        order = list(view.state.free)
        held = other.claim()  # the head, unseen by the quiet view
        assert held is not None and held.id == order[0]
        claim = consumer.claim(timeout=5)
        assert claim is not None and claim.id in order[1:8]
        # Widened to 8 by the lost race, narrowed by one by the clean claim.
        assert consumer._window == 7 and not view.watching_locks


def test_a_quiet_view_counts_lost_races_as_misses_and_reads_no_item(
        etcd_url: str, queue_name: str, monkeypatch) -> None:
    """A quiet view counts each lost race as one miss and reads no item for
    it: it lists work/ again once its misses reach the miss limit, here the
    miss rate's (MISS_RATE_MIN misses with no hit), below the cost limit.
    Before, the sixth lost race within one claim also read the item, and an
    item finished elsewhere made the view list its whole backlog at once: at
    the start of a drain with 64 consumers (every claim loses races while the
    windows widen), one relist of the backlog in every second consumer."""
    # Doubling windows from one: MISS_RATE_MIN tries (windows 1 to 128) all
    # land among the 128 stale items at the head, whatever the walk picks.
    monkeypatch.setattr(queue_module, "WINDOW_GROWTH", 2)
    stale_count = 2 ** (viewstate_module.MISS_RATE_MIN - 1)
    with Queue(etcd_url, queue_name) as consumer, Queue(etcd_url, queue_name) as other:
        other.put_many(range(2000), in_flight=16)
        view = consumer._ensure_view()  # quiet: 2,000 items, a cost limit of 20
        stale = set()
        for _ in range(stale_count):  # finished at the head; locks linger (F4 skipped)
            claim = other.claim()
            assert claim is not None
            stale.add(claim.id)
            claim.complete()
        relists = view.relists
        assert view.state.miss_limit == viewstate_module.MISS_RATE_MIN < 20
        consumer.etcd.requests.clear()
        claim = consumer.claim(timeout=5)
        assert claim is not None and claim.id not in stale and not view.watching_locks
        # MISS_RATE_MIN lost races (C1 each), one listing of work/ (no GET of
        # an item), then C1 and C2 of a free item.
        assert view.relists == relists + 1
        assert consumer.etcd.requests["GET"] == 1
        assert consumer.etcd.requests["PUT"] == viewstate_module.MISS_RATE_MIN + 2


# -- issue 11 -----------------------------------------------------------------------


def in_thread(call):
    """Run ``call`` in a thread: ``(thread, result)``; ``result`` gets "value" or "error"."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = call()
        except BaseException as exc:  # noqa: B036 - handed to the test thread
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


@pytest.mark.parametrize("lock_goes_by", ["release", "expiry"])
def test_an_item_whose_race_was_lost_during_a_relist_comes_back_when_its_lock_goes(
        etcd_url: str, queue_name: str, lock_goes_by: str) -> None:
    with FaultProxy.to(etcd_url) as proxy, Queue(proxy.url, queue_name) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=1) as holder:
        item_id = holder.put("contended")
        view = consumer._ensure_view()  # it lists the item, free; it watches nothing
        held = holder.claim()
        assert held.id == item_id and not view.watching_locks
        # The consumer tries the item (it heard nothing of that claim) and loses the race:
        # etcd's "already exists" is held on its way back while the rest happens.
        proxy.hold("down", match=rb'"errorCode":105')
        thread, result = in_thread(lambda: consumer.claim(timeout=3))
        wait_until(lambda: proxy.held("down"), 5, message="the lost lock create's reply")
        if lock_goes_by == "release":
            held.release()
        else:
            holder._heartbeat.discard(held)  # as for a crashed holder: its lock expires
            wait_until(lambda: holder.get(item_id).state == "pending", 5,
                       message="the holder's lock to expire")
        # Meanwhile another claimer of the same Queue found nothing: the view follows the
        # whole queue directory now, and its listing shows no lock on the item.
        view.starved(5)
        assert view.watching_locks
        proxy.release()
        thread.join(10)
        claim = result.get("value")
        assert claim is not None and claim.id == item_id, result
        assert claim.attempt == (1 if lock_goes_by == "release" else 2)


#: etcd's reply to a compare-and-swap (a claim's C2).
CAS_REPLY = re.compile(rb'"action":"compareAndSwap"')


def knows(queue: Queue, item_id: str) -> bool:
    view = queue._view
    return view is not None and any(c[0] == item_id for c in view.candidates(64))


def test_a_claim_that_finds_another_claims_lock_at_c3_keeps_the_item_in_its_view(
        proxy: FaultProxy, etcd_url: str, queue_name: str) -> None:
    """Claimer C's C2 applies, its reply is held past its lock's TTL.  Claimer Z takes
    the item meanwhile.  C's reply arrives: C3 finds Z's lock.  The item is still in
    work/ without an outcome, so C's view is told it is taken (free once Z's lock
    goes), not gone.  Z's worker dies, its lock expires: C's next claim gets the
    item.  (C3 said "gone": C's view forgot a live item until it listed work/
    again, up to a minute of silence later.)"""
    with Queue(connect(proxy.url, timeout=8, deadline=20), queue_name, lock_ttl=2,
               max_attempts=None) as c, \
            Queue(etcd_url, queue_name, lock_ttl=2, max_attempts=None) as z, \
            Queue(etcd_url, queue_name) as look:
        for q in (c, z):
            assert q.claim(timeout=0) is None  # its view is listed and followed
        item_id = look.put("still here")
        for q in (c, z):
            wait_until(lambda q=q: knows(q, item_id), 5, message="the views to see it")
        proxy.hold("down", match=CAS_REPLY)
        thread, outcome = in_background(lambda: c.claim(timeout=0))
        wait_until(lambda: CAS_REPLY.search(proxy.held("down")), 5,
                   message="C's C2 reply held")
        wait_until(lambda: look._protocol.read("locks", item_id) is None, 8,
                   message="C's lock to expire")
        taken = z.claim(timeout=5)
        assert taken is not None and taken.id == item_id
        proxy.release()
        thread.join(20)
        assert outcome == {"returned": None}, outcome  # not handed out
        taken.abandon()  # Z's worker dies
        wait_until(lambda: look._protocol.read("locks", item_id) is None, 8,
                   message="Z's lock to expire")
        got = c.claim(timeout=6)
        assert got is not None and got.id == item_id, (
            f"C's view forgot a pending, free item (stats: {look.stats()})")
        got.complete()


def test_a_consumer_that_also_puts_claims_other_producers_items_in_put_order(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name) as stage, Queue(etcd_url, queue_name) as other:
        stage.put_many(range(BACKLOG + 8))
        foreign: List[str] = []
        claimed: List[str] = []
        for step in range(4 * (BACKLOG + 8)):
            if step in (3, 10, 20):
                foreign.append(other.put(f"from another producer at step {step}"))
            claim = stage.claim()  # a pipeline stage: take one, put its follow-up, finish
            assert claim is not None
            claimed.append(claim.id)
            stage.put(f"follow-up of {claim.id}")
            claim.complete()
            if step > 20 and set(foreign) <= set(claimed):
                break
        assert set(foreign) <= set(claimed), "another producer's items were never claimed"
        assert claimed == sorted(claimed), "not claimed in put order"
        view = stage._view
        # Still quiet (no watch), and a listing per backlog, not per put.
        assert not view.watching_locks
        assert view.relists <= 2 + len(claimed) // BACKLOG


# -- issue 14: finished items' locks are left to expire (F4 skipped) ----------------


def test_a_consumer_that_comes_after_others_completed_items_is_not_held_up_by_their_locks(
        etcd_url: str, queue_name: str) -> None:
    """Another consumer completed the head of the queue and left its locks to expire
    (lock_ttl 5 s <= LINGER_MAX).  A new consumer lists those locks, of items no
    longer in work/: it claims the rest in put order without losing a race.  Then,
    waiting (the whole directory watched), it hears every lock expire: nothing comes
    back."""
    with Queue(etcd_url, queue_name, lock_ttl=5) as other, \
            Queue(etcd_url, queue_name, lock_ttl=5) as consumer:
        ids = other.put_many(range(BACKLOG + 10))
        for item_id in ids[:10]:
            claim = other.claim()
            assert claim is not None and claim.id == item_id
            claim.complete()
        assert {entry.id for entry in other._protocol.list("locks")[1]} == set(ids[:10])
        got = []
        while (claim := consumer.claim()) is not None:
            got.append(claim.id)
            claim.complete()
        view = consumer._view
        assert view is not None
        assert got == ids[10:]
        assert consumer.etcd.requests["PUT"] == 4 * len(got)  # C1 C2 F1 F2: no lost race
        assert view.watching_locks  # it found nothing: it hears the expire events now
        wait_until(lambda: not other._protocol.list("locks")[1], 10,
                   message="every lingering lock to expire")
        assert consumer.claim(timeout=0.5) is None and not view.state.items
        assert consumer.stats() == {"pending": 0, "running": 0, "completed": len(ids),
                                    "failed": 0}


def locks_listings(proxy: FaultProxy, queue: Queue) -> int:
    """Listings of the queue's locks/ that went through ``proxy``."""
    start = f"GET /v2/keys{queue.layout.locks}?".encode()
    return sum(1 for line in proxy.requests if line.startswith(start))


def test_a_pipeline_stage_lists_locks_once_per_lock_ttl_not_at_each_catch_up(
        proxy: FaultProxy, queue_name: str) -> None:
    """Finished items' locks linger in locks/ (F4 skipped), so a stage that listed
    locks/ with work/ at each catch-up (once per backlog) read the last lock TTL's
    completions each time, which cost it more than the write F4 saved.  With a
    backlog it lists work/ alone while its last listing of locks/ is fresh."""
    with Queue(proxy.url, queue_name) as stage:
        stage.put_many(range(BACKLOG + 8))
        for _ in range(3 * (BACKLOG + 8)):
            claim = stage.claim()
            assert claim is not None
            stage.put(f"follow-up of {claim.id}")
            claim.complete()
        view = stage._view
        assert view is not None and not view.watching_locks and view.relists >= 3
        assert locks_listings(proxy, stage) == 1  # the first listing's, 30 s ago at most


def test_a_catch_up_that_finds_a_delayed_item_of_another_producer_lists_locks(
        proxy: FaultProxy, queue_name: str, etcd_url: str) -> None:
    """A new item with "q" (a delayed put) in a catch-up's listing of work/: locks/
    is listed as well, so that the view plans the delay lock's expiry and claims
    the item promptly, not a lock TTL (30 s) later."""
    with Queue(proxy.url, queue_name) as stage, Queue(etcd_url, queue_name) as other:
        stage.put_many(range(BACKLOG + 8))
        for _ in range(4):  # the view is up, with a backlog: completed/ only
            claim = stage.claim()
            stage.put("follow-up")
            claim.complete()
        listed = locks_listings(proxy, stage)
        delayed = other.put("later", delay=1)
        claimed: List[str] = []

        def stage_claims_it() -> bool:
            claim = stage.claim()
            assert claim is not None
            claimed.append(claim.id)
            stage.put("follow-up")
            claim.complete()
            return claim.id == delayed
        wait_until(stage_claims_it, 6, interval=0.02, message="the delayed item")
        assert locks_listings(proxy, stage) > listed and not stage._view.watching_locks


def test_a_new_queue_claims_when_its_first_endpoint_is_dead(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name) as producer:
        item_id = producer.put("through the live member")
    client = connect(f"http://127.0.0.1:{free_port()},{etcd_url}", timeout=1)
    try:
        with Queue(client, queue_name) as consumer:  # its view's first watch goes to the dead one
            claim = consumer.claim(timeout=5)
            assert claim is not None and claim.id == item_id
            claim.complete()
    finally:
        client.close()


def test_a_new_queue_claims_when_its_first_endpoint_never_answers(
        etcd_url: str, queue_name: str) -> None:
    with FaultProxy.to(etcd_url) as frozen, Queue(etcd_url, queue_name) as producer:
        item_id = producer.put("through the live member")
        frozen.black_hole()  # accepts connections, never answers: a frozen host
        client = connect(f"{frozen.url},{etcd_url}", timeout=1)
        try:
            with Queue(client, queue_name) as consumer:
                started = time.monotonic()
                claim = consumer.claim(timeout=5)
                assert claim is not None and claim.id == item_id
                assert time.monotonic() - started < client.deadline
                claim.complete()
        finally:
            client.close()


def raise_in(thread: threading.Thread, exc_type: type) -> None:
    """Raise ``exc_type`` in ``thread`` when it next runs Python code, as some timeout
    and debugger tools do (CPython's PyThreadState_SetAsyncExc)."""
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    assert set_async_exc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type)) == 1


def test_the_view_reports_an_unexpected_exception_and_keeps_following(
        etcd_url: str, queue_name: str, caplog) -> None:
    exc_type = SystemExit  # a thread that lets it out ends without a word
    with Queue(etcd_url, queue_name) as consumer, Queue(etcd_url, queue_name) as producer:
        assert consumer.claim() is None  # the view follows the whole directory now
        follower = consumer._view._follower
        raise_in(follower._thread, exc_type)
        first = producer.put("wakes the follower, which meets the exception")
        wait_until(lambda: [r for r in caplog.records if r.name == "etcdq_v2.view"
                            and r.levelno >= logging.ERROR and exc_type.__name__ in r.getMessage()
                            + str(r.exc_info)], 5, message="the exception to be logged")
        assert consumer._view._follower is follower and follower._thread.is_alive()
        second = producer.put("an event for the follower that listed again")
        got = []
        for _ in range(2):
            claim = consumer.claim(timeout=5)
            assert claim is not None
            got.append(claim.id)
            claim.complete()
        assert got == [first, second]


# -- issue 14: a view with a backlog watches nothing ----------------------------------


def watch_requests(proxy: FaultProxy) -> List[bytes]:
    return [line for line in proxy.requests if b"wait=true" in line]


def test_a_consumer_with_a_backlog_holds_no_watch(etcd_url: str, queue_name: str) -> None:
    """etcd sends every event of a watched directory to every watcher, so a watch per
    consumer made an item's cost grow with the number of consumers.  With a backlog
    a view watches nothing; others' completions reach it as misses and listings."""
    with FaultProxy.to(etcd_url) as proxy, Queue(proxy.url, queue_name) as consumer, \
            Queue(etcd_url, queue_name) as other:
        other.put_many(range(BACKLOG + 40))
        consumer.claim().complete()
        for _ in range(20):
            other.claim().complete()
        for _ in range(BACKLOG):
            claim = consumer.claim()
            assert claim is not None
            claim.complete()
        assert watch_requests(proxy) == []
        assert not consumer._view.watching_locks


def test_a_quiet_view_lists_work_again_after_a_few_misses_and_not_locks(
        etcd_url: str, queue_name: str) -> None:
    """Another consumer finished most of what the view listed.  The view finds that out
    by missing (view.state.miss_limit tries at most), then lists work/ only: locks/ holds every
    finished item's lock until it expires, so listing it would cost every relist."""
    with FaultProxy.to(etcd_url) as proxy, Queue(proxy.url, queue_name) as consumer, \
            Queue(etcd_url, queue_name) as other:
        ids = other.put_many(range(BACKLOG + 40))
        first = consumer.claim()  # the view lists the whole backlog
        view = consumer._view
        relists = view.relists
        done = {first.id}
        first.complete()
        while len(done) < len(ids) - 8:
            claim = other.claim()
            done.add(claim.id)
            claim.complete()
        proxy.requests.clear()
        claim = consumer.claim()
        assert claim is not None and claim.id not in done
        claim.complete()
        listings = [line for line in proxy.requests if line.startswith(b"GET ")]
        lock_tries = [line for line in proxy.requests
                      if line.startswith(b"PUT ") and b"/locks/" in line]
        assert view.relists == relists + 1, proxy.requests
        assert len(listings) == 1 and b"/work" in listings[0], listings
        assert len(lock_tries) <= view.state.miss_limit + 1, lock_tries
