"""Items with ``"q"`` and no lock (a requeued dead letter, an imported item, a
delayed put whose delay ended), noted _unplanned until a listing of locks/
plans them: a lone stage hands them out in put order before its own later
items; while listings of locks/ fail, claims go on and hand out other items;
another claimer thread that finds only such items waits for the planning
listing rather than starving to a watch; a transient failure costs one
listing; and eight threads on a flow of them hand out each item once.

Interleavings are forced with the fault proxy (network) or by wrapping
``protocol.list`` in one thread (a pause around the reply); no method of the
view is changed.
"""
from __future__ import annotations

import threading
import time


from helpers import (claim_and_complete, claim_until_idle, in_background, locks_get,
                     pause_listing, q_item, quiet_view_whose_head_is_held, record_calls,
                     unplanned, wait_until)

from etcdq_v2 import Queue
from etcdq_v2.errors import Unavailable
from etcdq_v2.transport import connect

#: Long enough that no once-per-lock-TTL listing of locks/ happens during a test.
LOCK_TTL = 30








def _slow_follower_locks(view, seconds: float) -> None:
    """The view's follower thread (etcdq-view) gets its replies to listings of
    locks/ ``seconds`` late: a slow reply (a big locks/, a busy member)."""
    original = view._protocol.list

    def slow(kind, *args, **kwargs):
        reply = original(kind, *args, **kwargs)
        if kind == "locks" and threading.current_thread().name == "etcdq-view":
            time.sleep(seconds)
        return reply

    view._protocol.list = slow  # type: ignore[method-assign]



def test_pipeline_stage_hands_out_its_own_later_item_before_a_free_q_item(
        etcd_url: str, queue_name: str) -> None:
    """1. A lone consumer S (a pipeline stage) has a quiet view.
    2. Another process puts X, an item with "q" and no lock (a requeued dead
       letter, an imported item; or a delayed put whose delay ended).
    3. S puts Y (its own follow-up): Y is newer than what S's view knows.
    4. S claims: Y is held back (it may follow an unseen item) -> catch_up ->
       relist: a new quiet follower lists work/ (X new with "q": 5bc1f41 marks
       it taken at W), sets _ready, and only then lists locks/ to plan X.
    5. The claimer wakes on _ready and claims before that listing of locks/ is
       applied: X is taken in the view, Y (known now) is free: S hands out Y
       before X, which was put first and is free in etcd.  On ce43349 X is free
       as soon as the listing of work/ is applied: S hands out X, then Y.

    The follower's reply to locks/ is slowed by 0.3 s to hold the window open;
    without it the claimer wins anyway (30 of 30 runs out of order before the
    rule).  X is handed out one claim late.

    Suggested fix: do not mark an item _unplanned when its listing of locks/
    follows in the same round before anyone can claim (apply the work/ listing
    and set _ready only after the listing of locks/, as a follower with
    list_locks does), or let a claim that finds only _unplanned items ahead of
    a free one wait for the planning listing rather than skip them."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as stage:
        view = stage._ensure_view()
        assert not view.watching_locks
        x_id = q_item(producer)
        y_id = stage.put({"y": 1})
        assert y_id > x_id
        _slow_follower_locks(view, 0.3)
        got = []
        for _ in range(2):
            claim = stage.claim(timeout=3)
            assert claim is not None
            got.append(claim.id)
            claim.complete()
        assert got == [x_id, y_id], (
            f"the lone stage handed out {got}: its own Y (put after X) before X, a "
            f"free item with \"q\" held taken by its _unplanned mark")


def test_failing_locks_listing_makes_every_claim_fail(
        etcd_url: str, queue_name: str, proxy) -> None:
    """1. A consumer C (through the fault proxy, request timeout 1 s) has a quiet
       view of B0..B39; another consumer holds B0.
    2. X, an item with "q" and no lock, is put.  Listings of locks/ start to
       fail (held by the network: a slow member, a locks/ too large to list
       within the timeout); every other request goes through.
    3. C's claim misses B0 -> relist_work lists work/ (X marked _unplanned),
       then locks/: it fails; b906cad sets _next_delay = -inf; the claim raises.
    4. Every later claim of C starts with check_locks: _next_delay <= now, so it
       lists locks/ (delays only), which fails, and the claim raises
       Unavailable without trying any item.  B1..B39 are free in etcd and C
       claims nothing until listings of locks/ work again.  On ce43349 (and
       5bc1f41) the next claims hand out B1, B2, ... (X waits, 5bc1f41; or is
       offered, ce43349).

    Suggested fix: a delays-only listing made for _unplanned items (or a due
    delay) that fails should not fail the claim: log it, keep the items taken,
    and retry it later (e.g. _next_delay = now + a backoff, RELIST_DUE and up)
    while the claim goes on with the free items the view has."""
    with quiet_view_whose_head_is_held(etcd_url, proxy.url, queue_name, LOCK_TTL) as (
            producer, other, consumer, b_ids, view, held):
        x_id = q_item(producer)
        proxy.hold(match=locks_get(queue_name))
        try:
            first = claim_and_complete(consumer)  # miss on B0 -> relist_work; locks/ lost
            assert x_id in view.state.items
            got, failed = [first] if first else [], 0
            started = time.monotonic()
            while time.monotonic() - started < 4 and len(got) < 3:
                try:
                    claim = consumer.claim(timeout=0)
                except Unavailable:
                    failed += 1
                    continue
                if claim is not None:
                    got.append(claim.id)
                    claim.complete()
        finally:
            proxy.pass_through()
            held.complete()
        assert len(got) >= 3, (
            f"{len(got)} items handed out in 4 s while only listings of locks/ "
            f"failed ({failed} claims raised Unavailable): B1..B39 free in etcd; "
            f"_next_delay={view.state.next_delay}")


def test_another_thread_starves_on_unplanned_items_and_rewatches(
        etcd_url: str, queue_name: str) -> None:
    """A process with several claimer threads (a Worker with concurrency > 1)
    whose quiet view's free items are all new items with "q" (an import, a
    requeue of the dead letters, delayed puts whose delay ended):

    1. Thread T1's relist_work lists work/: X1..X3 are marked _unplanned
       (taken); T1 lists locks/ to plan them.
    2. Thread T2 claims meanwhile: nothing is free in the view, so the claim
       is "starved": the view switches to watching the whole directory (a new
       follower: a stream, a listing of work/ and, for the _unplanned items,
       of locks/), and T1's listing of locks/ is dropped (its follower was
       replaced).  The view then watches every event of the queue until its
       backlog reaches 32 (then another listing of work/ and locks/ to go
       quiet).  On ce43349 T2 claims X1 at once and nothing is listed again.

    Suggested fix: a claim that finds only _unplanned items wait for the
    planning listing under way (a condition on it) instead of starving; or
    don't count _unplanned items out of the backlog when deciding to watch."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer:
        view = consumer._ensure_view()
        x_ids = [q_item(producer, n) for n in range(3)]
        answered, resume = pause_listing(view._protocol, "locks", "claimer")
        follower = view._follower
        thread, outcome = in_background(view.relist_work, "claimer")
        try:
            assert answered.wait(5)
            listed = record_calls(view._protocol, "list")
            # T1's reply comes while T2's claim runs (T2 waits
            # for it; a T1 paused for good would only make T2 wait longer).
            threading.Timer(0.5, resume.set).start()
            claim = consumer.claim(timeout=2)  # thread T2
        finally:
            resume.set()
            thread.join(5)
        assert claim is not None and claim.id in x_ids
        claim.complete()
        assert view._follower is follower and not view.watching_locks and listed == [], (
            f"a claim in another thread while T1 planned the \"q\" items switched the "
            f"view to watching={view.watching_locks} (follower replaced: "
            f"{view._follower is not follower}), listings {listed}")



def test_a_transient_locks_failure_costs_one_listing_then_none(
        etcd_url: str, queue_name: str, proxy) -> None:
    """relist_work's listing of locks/ for X ("q", no lock) fails once
    (b906cad: _next_delay = -inf).  Once listings work again, the next claim
    lists locks/ once (delays only), which plans X (free) and resets
    _next_delay from the listing (_plan_delays: not kept at -inf by min());
    the drain that follows lists locks/ no more, and hands X out before the
    items put after it."""
    with quiet_view_whose_head_is_held(etcd_url, proxy.url, queue_name, LOCK_TTL) as (
            producer, other, consumer, b_ids, view, held):
        x_id = q_item(producer)
        y_ids = producer.put_many([{"y": n} for n in range(5)])
        proxy.hold(match=locks_get(queue_name))
        first = claim_and_complete(consumer)  # the claim goes on
        proxy.pass_through()
        assert x_id in unplanned(view) or first == x_id
        listed = record_calls(consumer._protocol, "list")
        got = [first] if first else []
        for _ in range(len(b_ids) - 1 + 1 + len(y_ids) - len(got)):
            claim = consumer.claim(timeout=2)
            assert claim is not None
            got.append(claim.id)
            claim.complete()
        held.complete()
        assert got.index(x_id) < got.index(y_ids[0]), got
        assert len(got) == len(set(got))
        assert listed.count("locks") == 1, listed
        assert view.state.next_delay == float("inf") and not unplanned(view)


def test_follower_listing_after_the_failure_resets_next_delay(
        etcd_url: str, queue_name: str, proxy) -> None:
    """relist_work's listing of locks/ fails (_next_delay = -inf); before
    any claim, the view relists (a new quiet follower: catch_up, behind): its
    round lists locks/ for the _unplanned X and applies it, which resets
    _next_delay; the claims that follow list nothing more, and X is handed out."""
    transport = connect(proxy.url, timeout=1.0)
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(transport, queue_name, lock_ttl=LOCK_TTL) as consumer:
        view = consumer._ensure_view()
        x_id = q_item(producer)
        proxy.hold(match=locks_get(queue_name))
        view.relist_work()  # logged, not raised
        proxy.pass_through()
        assert x_id in unplanned(view)
        view.relist(5)
        wait_until(lambda: not unplanned(view), 5, message="the follower planned X")
        assert view.state.next_delay == float("inf")
        listed = record_calls(consumer._protocol, "list")
        claim = consumer.claim(timeout=2)
        assert claim is not None and claim.id == x_id
        claim.complete()
        assert listed == [], listed


def test_q_item_claimed_elsewhere_between_the_two_listings(
        etcd_url: str, queue_name: str) -> None:
    """X, a requeued item ("q", no lock), is shown by a quiet view's
    relist_work listing of work/ (X _unplanned at W); before that claimer
    lists locks/, another consumer claims X (C1, C2) and holds it.  The listing
    of locks/ (after W) shows X's claim lock: X is taken (not freed, not given
    a delay); the consumer hands out every other item and never X, also after
    the other consumer completes it."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as other, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer:
        b_ids = producer.put_many([{"b": n} for n in range(40)])
        view = consumer._ensure_view()
        x_id = q_item(producer)
        listed_work, resume = pause_listing(view._protocol, "locks", "claimer",
                                            after_reply=False)
        thread, outcome = in_background(view.relist_work, "claimer")
        assert listed_work.wait(5)
        assert not view.state.is_free(x_id)  # not applied yet , or taken
        entry = other._protocol.read("work", x_id)
        state = other._protocol.claim(x_id, entry.version)
        assert state is not None
        resume.set()
        thread.join(5)
        assert not thread.is_alive() and "raised" not in outcome, outcome
        assert not unplanned(view) and not view.state.is_free(x_id) and x_id not in view.state.delays
        tried = record_calls(consumer._protocol, "claim")
        got = []
        for _ in b_ids:
            claim = consumer.claim(timeout=2)
            assert claim is not None
            got.append(claim.id)
            claim.complete()
        assert sorted(got) == sorted(b_ids) and x_id not in tried
        other._protocol.finish(state, "completed")
        assert consumer.claim(timeout=0.5) is None


def test_eight_threads_on_a_flow_of_q_items(
        etcd_url: str, queue_name: str) -> None:
    """One consumer, 8 claimer threads (a Worker's concurrency), and a
    second consumer with 2, drain 120 "q" items (requeued/imported, no lock)
    while 40 more are put: each item handed out once, and at the end no view
    holds _unplanned items or _next_delay at -inf."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer:
        ids = [q_item(producer, n) for n in range(120)]
        consumers = [Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) for _ in range(2)]
        got, lock = [], threading.Lock()

        def record(item_id: str) -> None:
            with lock:
                got.append(item_id)

        threads = [threading.Thread(target=claim_until_idle, args=(consumers[n // 8], 6, record))
                   for n in range(10)]  # 8 threads on the first consumer, 2 on the second
        try:
            for thread in threads:
                thread.start()
            for n in range(120, 160):
                ids.append(q_item(producer, n))
                time.sleep(0.01)
            for thread in threads:
                thread.join(15)
            assert sorted(got) == sorted(ids), (len(got), len(set(got)))
            for queue in consumers:
                assert not unplanned(queue._view)
                assert queue._view.state.next_delay > float("-inf")
        finally:
            for queue in consumers:
                queue.close()
