"""Queue.cancel and ``etcdq cancel`` against a real etcd: steps K1-K4 of docs/protocol.md.

A cancel is a dead letter ("cancelled") made under a lock, committed by a
compare-and-swap of the item: it races claims, other cancels and claims
held in flight, and exactly one of them wins.  A canceller that dies after
K1 or after K3 is recovered from by another Queue.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterator, List, Optional, Tuple

import pytest

from etcdq_v2 import Claim, InvalidName, LockLost, NotFound, Queue, Unavailable, connect
from etcdq_v2.codec import Lock, Record
from etcdq_v2.driver import run
from etcdq_v2.protocol import CANCELLED, COMPLETED, FAILED, ClaimState

from crashes import commit_then_crash, left_lock, stalled_claim
from faultproxy import FaultProxy
from helpers import in_background, wait_until

UNKNOWN = "00000000000000999999"
#: A claim's C2, and a cancel's K3: the compare-and-swap of the item.
ITEM_CAS = re.compile(rb"^PUT /v2/keys/\S+/work/", re.MULTILINE)
#: etcd's reply to a compare-and-swap (C2, R0, K3, F1).
CAS_REPLY = re.compile(rb'"action":"compareAndSwap"')


@pytest.fixture
def queue(etcd_url: str, queue_name: str) -> Iterator[Queue]:
    with Queue(etcd_url, queue_name, lock_ttl=2, max_attempts=1) as q:
        yield q


@pytest.fixture
def other(etcd_url: str, queue_name: str) -> Iterator[Queue]:
    """Another process's Queue on the same queue: it recovers after crashes."""
    with Queue(etcd_url, queue_name, lock_ttl=2) as q:
        yield q


def lock_of(queue: Queue, item_id: str) -> Optional[Lock]:
    entry = queue._protocol.read("locks", item_id)
    return Lock.decode(entry.value) if entry else None


def assert_cancelled(queue: Queue, item_id: str, payload: Any, attempts: int = 0) -> None:
    """A dead letter with the reason "cancelled", nothing left in work/; in locks/ at
    most the cancel's own lock, left to expire (K4 skips F4: lock_ttl <= LINGER_MAX)."""
    info = queue.get(item_id)
    assert (info.state, info.reason, info.payload, info.attempts) == \
        (FAILED, CANCELLED, payload, attempts)
    assert queue._protocol.read("work", item_id) is None
    lock = left_lock(queue, FAILED, item_id)
    assert lock is None or lock.delay  # K1's lock: a delay lock, never a claim's


# -- what cancel does ----------------------------------------------------------------------

def test_cancel_dead_letters_a_pending_item_that_is_never_handed_out(
        queue: Queue, other: Queue) -> None:
    first, second = queue.put_many(["cancel me", "keep me"])
    assert queue.cancel(first) is True
    assert_cancelled(queue, first, "cancel me")
    assert queue.stats() == {"pending": 1, "running": 0, "completed": 0, "failed": 1}
    claim = other.claim(timeout=2)
    assert claim is not None and claim.id == second
    claim.complete()
    assert other.claim(timeout=0.5) is None
    assert queue.cancel(first) is False  # already a dead letter: nothing changes
    assert_cancelled(queue, first, "cancel me")


def test_cancel_leaves_a_running_item_alone(queue: Queue, other: Queue) -> None:
    item_id = queue.put("running")
    claim = other.claim(timeout=2)
    assert claim is not None and claim.id == item_id
    lock = lock_of(queue, item_id)
    assert queue.cancel(item_id) is False
    assert lock_of(queue, item_id) == lock  # the claim's lock, untouched
    claim.refresh()
    claim.complete("ran")
    assert queue.get(item_id).state == COMPLETED


@pytest.mark.parametrize("finish", ["completed", "failed", "committed-after-F1"])
def test_cancel_of_a_finished_item_returns_false(queue: Queue, finish: str) -> None:
    item_id = queue.put("finished")
    if finish == "committed-after-F1":
        assert commit_then_crash(queue, COMPLETED, record=False) == item_id
    else:
        claim = queue.claim(timeout=2)
        assert claim is not None
        claim.complete() if finish == "completed" else claim.fail("no")
    before = queue.get(item_id)
    assert queue.cancel(item_id) is False
    assert queue.get(item_id) == before
    assert before.reason != CANCELLED


@pytest.mark.parametrize("finish", ["complete", "fail"])
def test_cancel_of_a_finished_item_whose_lock_lingers_returns_false_at_k1(
        etcd_url: str, queue_name: str, finish: str) -> None:
    """The finisher left its lock to expire (F4 skipped, lock_ttl 30 s): K1 finds a
    claim's lock, and the cancel says False with one failed write and one read,
    touching nothing (issue 14)."""
    with Queue(etcd_url, queue_name, max_attempts=1) as finisher, \
            Queue(etcd_url, queue_name) as canceller:
        item_id = finisher.put("finished")
        claim = finisher.claim(timeout=2)
        assert claim is not None
        claim.complete() if finish == "complete" else claim.fail("no")
        kind = COMPLETED if finish == "complete" else FAILED
        lingering = canceller._protocol.read("locks", item_id)
        assert lingering is not None and left_lock(canceller, kind, item_id) is not None
        before = canceller.get(item_id)
        canceller.etcd.requests.clear()
        assert canceller.cancel(item_id) is False
        assert dict(canceller.etcd.requests) == {"PUT": 1, "GET": 1}
        assert canceller._protocol.read("locks", item_id) == lingering  # untouched
        assert canceller.get(item_id) == before and before.state == kind


@pytest.mark.parametrize("lock_ttl", [2, 61], ids=["lingers", "deleted"])
def test_a_cancel_leaves_its_lock_to_expire_only_when_lock_ttl_is_at_most_60_s(
        etcd_url: str, queue_name: str, lock_ttl: int) -> None:
    """K4 is F2-F4: F4 is skipped for lock_ttl <= LINGER_MAX (the lock expires), sent
    for a longer one.  Either way nothing is pending or running meanwhile."""
    with Queue(etcd_url, queue_name, lock_ttl=lock_ttl) as queue:
        item_id = queue.put("cancel me")
        assert queue.cancel(item_id) is True
        lock = lock_of(queue, item_id)
        if lock_ttl > 60:
            assert lock is None  # F4 sent
        else:
            assert lock is not None and lock.delay  # K1's lock, left to expire
            assert queue.stats() == {"pending": 0, "running": 0, "completed": 0, "failed": 1}
            wait_until(lambda: lock_of(queue, item_id) is None, 5, message="the lock to expire")
        assert queue.stats() == {"pending": 0, "running": 0, "completed": 0, "failed": 1}
        assert queue.get(item_id).reason == CANCELLED


def test_cancel_of_an_unknown_id_raises_not_found_and_leaves_no_lock(queue: Queue) -> None:
    with pytest.raises(NotFound):
        queue.cancel(UNKNOWN)
    assert queue._protocol.read("locks", UNKNOWN) is None
    for bad in ("1", "../locks/00000000000000000001", 7):
        with pytest.raises(InvalidName):
            queue.cancel(bad)  # type: ignore[arg-type]


def test_a_cancelled_item_is_requeued_like_any_dead_letter(queue: Queue, other: Queue) -> None:
    item_id = queue.put({"job": 1})
    assert queue.cancel(item_id)
    new_id = queue.requeue(item_id)
    claim = other.claim(timeout=2)
    assert claim is not None and (claim.id, claim.payload) == (new_id, {"job": 1})
    claim.complete()
    assert queue.stats() == {"pending": 0, "running": 0, "completed": 1, "failed": 0}


def test_a_wait_under_way_is_woken_by_a_cancel(queue: Queue, other: Queue) -> None:
    item_id = queue.put("waited for")
    thread, outcome = in_background(lambda: other.wait(item_id, timeout=20))
    assert queue.cancel(item_id)
    thread.join(10)
    info = outcome["returned"]
    assert (info.state, info.reason) == (FAILED, CANCELLED)


# -- delayed items (a delay lock, as release(delay) makes) ------------------------------------

def released_with_delay(queue: Queue, delay: float) -> Tuple[str, float]:
    """An item claimed and released with ``delay``: (its id, time.monotonic() of the release)."""
    item_id = queue.put("later")
    claim = queue.claim(timeout=2)
    assert claim is not None and claim.id == item_id
    claim.release(delay=delay)
    released = time.monotonic()
    lock = lock_of(queue, item_id)
    assert lock is not None and lock.delay
    return item_id, released


def test_cancel_of_a_delayed_item_takes_its_delay_lock_over(queue: Queue, other: Queue) -> None:
    item_id, _ = released_with_delay(queue, 30)
    assert queue.cancel(item_id) is True
    assert_cancelled(queue, item_id, "later", attempts=0)  # a release gives its attempt back
    # K4 leaves a lock of lock_ttl to expire, but not one taken over from a delay
    # lock: its TTL (the delay's 30 s here; hours for a backoff) is deleted (F4).
    assert lock_of(queue, item_id) is None
    assert other.claim(timeout=0.5) is None


def test_crash_after_k1_on_a_delayed_item_never_makes_it_claimable_early(
        etcd_url: str, queue_name: str, other: Queue) -> None:
    """K1 took the delay lock over, then the canceller died.  The lock keeps at least
    the delay's time left (max(lock_ttl, ttl left)): no claim before the delay ends."""
    delay = 3.0
    with Queue(etcd_url, queue_name, lock_ttl=1) as crashed:
        item_id, released = released_with_delay(crashed, delay)
        taken = run(crashed._protocol._cancel_lock(item_id), crashed.etcd)  # K1; then it dies
        assert taken is not None and taken[1] is True  # took the delay lock over
    claim = None
    while claim is None:
        claim = other.claim(timeout=0.2)
        if claim is None:
            assert time.monotonic() - released < delay + 5, "never claimable"
    assert time.monotonic() - released >= delay
    assert (claim.id, claim.attempt) == (item_id, 1)  # the release gave its attempt back
    claim.complete()


def test_a_cancel_that_fails_midway_leaves_the_delay_lock_it_took_over(
        proxy: FaultProxy, queue_name: str, queue: Queue, other: Queue) -> None:
    """An item released with delay=30: a delay lock.  A cancel takes it over (K1, ttl
    = max(lock_ttl, 30)), reads the item (K2), and gets no answer to K3 (held: a
    frozen member): Unavailable.  The lock it took over stays, with the delay's
    time: the item is not claimable before its delay."""
    item_id, _ = released_with_delay(queue, 30)
    with Queue(connect(proxy.url, timeout=0.5, deadline=1.5), queue_name,
               lock_ttl=2) as canceller:
        proxy.hold("up", match=ITEM_CAS)
        with pytest.raises(Unavailable):
            canceller.cancel(item_id)
    lock = lock_of(queue, item_id)
    assert lock is not None and lock.delay, "the failed cancel dropped the delay lock"
    early = other.claim(timeout=1)
    if early is not None:
        early.abandon()
    assert early is None, "claimed long before its delay"
    assert queue.get(item_id).state == "pending"


def test_crash_after_k1_leaves_the_item_pending_for_another_queue(
        queue: Queue, other: Queue) -> None:
    """The canceller died after K1 (its lock, created fresh): the cancel was not
    acknowledged, the item stays pending (stats say so), no claim runs it while the
    lock lasts, and once it expired another Queue claims it, as the first attempt."""
    item_id = queue.put("pending still")
    taken = run(queue._protocol._cancel_lock(item_id), queue.etcd)  # K1, then the canceller dies
    assert taken is not None and taken[1] is False
    assert queue.stats()["pending"] == 1
    locked_until = time.monotonic() + 2  # lock_ttl
    claim = None
    while claim is None:
        claim = other.claim(timeout=0.2)
        assert claim is not None or time.monotonic() < locked_until + 5, "never claimable"
    assert time.monotonic() >= locked_until - 0.1
    assert (claim.id, claim.attempt) == (item_id, 1)


def test_crash_after_k1_another_cancel_takes_the_lock_over(queue: Queue, other: Queue) -> None:
    item_id = queue.put("cancel me twice")
    assert run(queue._protocol._cancel_lock(item_id), queue.etcd) is not None  # K1; it dies
    assert other.cancel(item_id) is True  # its lock is a delay lock: taken over
    assert_cancelled(other, item_id, "cancel me twice")


def cancel_until_k3(queue: Queue, item_id: str) -> ClaimState:
    """K1, K2 and K3 (the commit F1) as cancel() makes them; then the canceller dies."""
    protocol = queue._protocol
    taken = run(protocol._cancel_lock(item_id), protocol.etcd)
    assert taken is not None
    state = run(protocol._pending_item(item_id, taken[0]), protocol.etcd)
    assert state is not None
    item = state.item
    record = Record(item.payload, state.lock.token, queue.node_id, item.attempts,
                    item.created, time.time(), reason=CANCELLED, token=item.token)
    assert protocol._commit(state, FAILED, record.encode(outcome=FAILED)) is not None
    return state


def test_crash_after_k3_the_next_claimer_finishes_the_cancel(queue: Queue, other: Queue) -> None:
    """The item carries the dead letter ("o"): it is cancelled at once for get, stats
    and wait; once the canceller's lock expired, a claimer writes the dead letter
    (F2), removes the item (F3) and hands nothing out."""
    item_id = queue.put("cancelled by a dying canceller")
    cancel_until_k3(queue, item_id)
    info = other.get(item_id)
    assert (info.state, info.reason) == (FAILED, CANCELLED)
    assert other.wait(item_id, timeout=0) == info
    assert other.stats()["failed"] == 1
    assert other.cancel(item_id) is False
    wait_until(lambda: other.claim(timeout=0.3) is None
               and other._protocol.read("work", item_id) is None, 8,
               message="a claimer to finish the committed cancel")
    assert_cancelled(other, item_id, "cancelled by a dying canceller")


# -- races -------------------------------------------------------------------------------------

def knows(queue: Queue, item_id: str) -> bool:
    view = queue._view
    return view is not None and any(c[0] == item_id for c in view.candidates(64))


def test_claims_and_cancels_racing_for_an_item_exactly_one_wins(
        etcd_url: str, queue_name: str) -> None:
    """Two claimers and two cancellers start together on each of 25 items: one of the
    four wins, and the item ends as that one says."""
    queues = [Queue(etcd_url, queue_name, lock_ttl=5) for _ in range(4)]
    claimers, cancellers = queues[:2], queues[2:]
    tally = {"claimed": 0, "cancelled": 0}
    try:
        for claimer in claimers:
            assert claimer.claim(timeout=0) is None  # views ready
        for round_ in range(25):
            item_id = cancellers[0].put({"round": round_})
            for claimer in claimers:
                wait_until(lambda q=claimer, i=item_id: knows(q, i), 5,
                           message="the views to see it")
            winners = race(item_id, claimers, cancellers)
            assert len(winners) == 1, (round_, winners)
            winner = winners[0]
            if isinstance(winner, Claim):
                tally["claimed"] += 1
                winner.complete("ran")
                assert cancellers[0].get(item_id).state == COMPLETED
            else:
                tally["cancelled"] += 1
                assert_cancelled(cancellers[0], item_id, {"round": round_})
        assert cancellers[0].stats()["pending"] == 0
    finally:
        for q in queues:
            q.close()
    print("race winners:", tally)


def race(item_id: str, claimers: List[Queue], cancellers: List[Queue]) -> List[Any]:
    """Start every claim and cancel at once: the claims that got the item and the
    cancels that returned True."""
    start = threading.Barrier(len(claimers) + len(cancellers))
    calls = [lambda q=q: (start.wait(5), q.claim(timeout=0))[1] for q in claimers] + \
            [lambda q=q: (start.wait(5), q.cancel(item_id))[1] for q in cancellers]
    started = [in_background(call) for call in calls]
    results = []
    for thread, outcome in started:
        thread.join(20)
        assert "returned" in outcome, outcome
        results.append(outcome["returned"])
    claims = [r for r in results[:len(claimers)] if r is not None]
    assert all(claim.id == item_id for claim in claims)
    return claims + [True for r in results[len(claimers):] if r is True]


def test_a_claim_held_in_flight_loses_to_the_cancel_that_committed_first(
        proxy: FaultProxy, etcd_url: str, queue_name: str, queue: Queue) -> None:
    """A claimer's C1 applies, its C2 is held past its lock's TTL; a cancel locks,
    reads and commits the item (K1-K4).  The held C2 then lands: it must fail, and
    the claim is not handed out."""
    with Queue(connect(proxy.url, timeout=8, deadline=20), queue_name, lock_ttl=2) as claimer:
        item_id = queue.put("contested")
        proxy.hold("up", match=ITEM_CAS)
        thread, outcome = in_background(lambda: claimer.claim(timeout=0))
        wait_until(lambda: ITEM_CAS.search(proxy.held()), 5, message="the claim's C2 held")
        wait_until(lambda: queue.cancel(item_id), 8, interval=0.2,
                   message="the cancel, once the claim's lock expired")
        proxy.release()
        thread.join(20)
        assert outcome == {"returned": None}, outcome
        assert_cancelled(queue, item_id, "contested")


def test_a_claim_whose_c2_reply_came_after_its_lock_expired_is_not_handed_out_once_cancelled(
        proxy: FaultProxy, queue_name: str, queue: Queue) -> None:
    """A claimer's C1 and C2 apply; the reply of its C2 is held (a slow network, or the
    process stalls between C2 and the hand-out) past its lock's TTL, and nothing
    refreshes that lock (no Claim, no heartbeat yet).  A cancel then locks the item
    (K1), finds it claimed but not finished (K2), commits (K3, K4): True.  When the C2
    reply arrives, more than half a lock TTL has passed since C1, so C3 confirms the
    lock before handing out: it is gone, and the claim is not handed out."""
    with Queue(connect(proxy.url, timeout=8, deadline=20), queue_name, lock_ttl=2,
               max_attempts=None) as claimer:
        assert claimer.claim(timeout=0) is None  # its view is ready
        item_id = queue.put("cancel me")
        wait_until(lambda: knows(claimer, item_id), 5, message="the claimer's view to see it")
        proxy.hold("down", match=CAS_REPLY)
        thread, outcome = in_background(lambda: claimer.claim(timeout=0))
        wait_until(lambda: CAS_REPLY.search(proxy.held("down")), 5,
                   message="the reply of the claim's C2 held")
        assert queue.get(item_id).attempts == 1  # C2 applied
        wait_until(lambda: queue.cancel(item_id), 10, interval=0.2,
                   message="the cancel, once the claim's lock expired")
        proxy.release()
        thread.join(20)
        handed = outcome.get("returned")
        if isinstance(handed, Claim):
            handed.abandon()
        assert outcome == {"returned": None}, \
            f"cancel() returned True, then the claimer was handed the item: {outcome}"
        assert_cancelled(queue, item_id, "cancel me", attempts=1)


def test_a_claim_whose_c2_reply_came_after_its_lock_expired_retakes_the_lock(
        proxy: FaultProxy, queue_name: str, queue: Queue) -> None:
    """The same held C2 reply, with nobody touching the item meanwhile: C3 takes the
    expired lock again, fences the item again (a CAS on its C2 index: the claim's
    index moves on) and hands the claim out holding it (the handler never runs
    without its lock)."""
    with Queue(connect(proxy.url, timeout=8, deadline=20), queue_name, lock_ttl=2,
               max_attempts=None) as claimer:
        assert claimer.claim(timeout=0) is None
        item_id = queue.put("slow reply")
        wait_until(lambda: knows(claimer, item_id), 5, message="the claimer's view to see it")
        proxy.hold("down", match=CAS_REPLY)
        thread, outcome = in_background(lambda: claimer.claim(timeout=0))
        wait_until(lambda: CAS_REPLY.search(proxy.held("down")), 5,
                   message="the reply of the claim's C2 held")
        wait_until(lambda: lock_of(queue, item_id) is None, 8,
                   message="the claim's lock to expire")
        proxy.release()
        thread.join(20)
        claim = outcome.get("returned")
        assert isinstance(claim, Claim) and claim.id == item_id, outcome
        assert lock_of(queue, item_id) == claim._state.lock
        assert queue._protocol.read("work", item_id).index == claim._state.index
        claim.complete("ran")
        assert queue.get(item_id).state == COMPLETED


def test_a_cancel_held_in_flight_loses_to_the_claim_that_took_the_item(
        proxy: FaultProxy, queue_name: str, queue: Queue, other: Queue) -> None:
    """A canceller's K1 and K2 apply, its K3 is held past its lock's TTL; a claim takes
    the item meanwhile.  The held K3 then lands: it must fail (False), and the claim
    keeps the item and completes it."""
    with Queue(connect(proxy.url, timeout=8, deadline=20), queue_name, lock_ttl=2) as canceller:
        item_id = queue.put("contested")
        proxy.hold("up", match=ITEM_CAS)
        thread, outcome = in_background(lambda: canceller.cancel(item_id))
        wait_until(lambda: ITEM_CAS.search(proxy.held()), 5, message="the cancel's K3 held")
        claim = other.claim(timeout=8)  # once the cancel's lock expired
        assert claim is not None and claim.id == item_id
        proxy.release()
        thread.join(20)
        assert outcome == {"returned": False}, outcome
        claim.refresh()  # the claim's lock is still the claim's
        claim.complete("ran")
        info = queue.get(item_id)
        assert (info.state, info.result) == (COMPLETED, "ran")


#: A read of one item (a cancel's K2).
WORK_READ = re.compile(rb"^GET /v2/keys/\S+/work/\d{20}", re.MULTILINE)


def ready(queue: Queue) -> Queue:
    assert queue.claim(timeout=0) is None  # its view is listed and followed
    return queue


def test_a_cancel_stalled_past_its_lock_after_k1_returns_false_to_a_claim_that_took_the_item(
        proxy: FaultProxy, etcd_url: str, queue_name: str, queue: Queue) -> None:
    """K1 creates the cancel's lock; the canceller then stalls (its K2 read held) past
    lock_ttl.  Its lock expires, and a claim takes the item the ordinary way: its own
    lock, C2, handed out, refreshed.  The cancel resumes: K2 reads the item as the
    claim left it (no outcome).  K2' finds the lock is no longer the one K1 wrote, so
    the cancel starts again at K1, finds the claim's lock: False.  (K3 on K2's index
    used to apply: cancel() returned True while a claim with a live lock ran it.)"""
    with Queue(connect(proxy.url, timeout=8, deadline=20), queue_name,
               lock_ttl=2) as canceller, \
            ready(Queue(etcd_url, queue_name, lock_ttl=2, max_attempts=None)) as claimer:
        item_id = queue.put("cancel me, or run me: not both")
        wait_until(lambda: knows(claimer, item_id), 5, message="the claimer's view to see it")
        proxy.hold("up", match=WORK_READ)
        thread, outcome = in_background(lambda: canceller.cancel(item_id))
        wait_until(lambda: WORK_READ.search(proxy.held()), 5, message="the cancel's K2 held")
        held = lock_of(queue, item_id)
        assert held is not None and held.delay  # K1 applied: the cancel's lock
        claim = claimer.claim(timeout=8)  # once the cancel's lock expired
        assert claim is not None and claim.id == item_id
        claim.refresh()
        proxy.release()
        thread.join(20)
        assert outcome == {"returned": False}, (
            f"cancel() gave {outcome} while a claim with a live lock held the item, "
            f"now {queue.get(item_id).state}/{queue.get(item_id).reason}")
        claim.refresh()  # still the claim's lock
        claim.complete("ran")
        info = queue.get(item_id)
        assert (info.state, info.result) == (COMPLETED, "ran")


def test_a_cancel_stalled_past_its_lock_after_k1_starts_again_and_cancels_an_untouched_item(
        proxy: FaultProxy, queue_name: str, queue: Queue) -> None:
    """The same stall with nobody claiming the item: K2' finds the lock K1 wrote gone
    (expired), and the cancel starts again at K1 rather than call a pending item
    running: True."""
    with Queue(connect(proxy.url, timeout=8, deadline=20), queue_name,
               lock_ttl=2) as canceller:
        item_id = queue.put("cancel me late")
        proxy.hold("up", match=WORK_READ)
        thread, outcome = in_background(lambda: canceller.cancel(item_id))
        wait_until(lambda: WORK_READ.search(proxy.held()), 5, message="the cancel's K2 held")
        wait_until(lambda: lock_of(queue, item_id) is None, 8,
                   message="the cancel's lock to expire")
        proxy.release()
        thread.join(20)
        assert outcome == {"returned": True}, outcome
        assert_cancelled(queue, item_id, "cancel me late")


#: A claim's C1 (or a cancel's K1): the PUT of a lock.
LOCK_PUT = re.compile(rb"^PUT /v2/keys/\S+/locks/\d{20}", re.MULTILINE)


def test_a_claim_whose_lock_a_late_copy_of_its_c1_recreated_after_a_cancel_is_not_handed_out(
        proxy_factory: Callable[[str], FaultProxy], etcd_url: str, queue_name: str,
        queue: Queue) -> None:
    """Two endpoints (A, B) to one etcd.  The claimer's C1 to A is held; the transport
    sends it again to B, where it applies.  C2 applies too, its reply held.  The
    lock expires; a cancel runs K1-K4 (True: item and lock removed).  A's held C1
    then lands on the free key: the claimer's lock again, with its value.  C2's
    reply arrives past half a TTL: C3's refresh on our value succeeds, but the
    lock's createdIndex is not C1's: it lapsed.  The item is fenced again (a CAS on
    our C2 index), which finds it gone: nothing is handed out.  (The refresh alone
    used to hand out the claim of a cancelled item.)"""
    a, b = proxy_factory(etcd_url), proxy_factory(etcd_url)
    with ready(Queue(connect([a.url, b.url], timeout=6, deadline=30), queue_name,
                     lock_ttl=2, max_attempts=None)) as claimer:
        item_id = queue.put("cancelled, then handed out")
        wait_until(lambda: knows(claimer, item_id), 5, message="the claimer's view to see it")
        a.hold("up", match=LOCK_PUT)
        b.hold("down", match=CAS_REPLY)
        thread, outcome = in_background(lambda: claimer.claim(timeout=0))
        wait_until(lambda: LOCK_PUT.search(a.held()), 5, message="C1 held on A")
        wait_until(lambda: CAS_REPLY.search(b.held("down")), 10,
                   message="C1 sent again to B, applied; C2 applied, its reply held")
        wait_until(lambda: lock_of(queue, item_id) is None, 8,
                   message="the claim's lock to expire")
        wait_until(lambda: queue.cancel(item_id), 5, interval=0.2, message="the cancel")
        assert queue.get(item_id).reason == CANCELLED
        a.release()  # the held C1 lands: the claimer's lock, again
        wait_until(lambda: lock_of(queue, item_id) is not None, 5,
                   message="the held C1 to land")
        b.release()
        thread.join(20)
        handed = outcome.get("returned")
        if isinstance(handed, Claim):
            handed.abandon()
        assert outcome == {"returned": None}, (
            f"cancel() returned True, then the claim was handed out: {outcome}")
        assert_cancelled(queue, item_id, "cancelled, then handed out", attempts=1)


def test_a_claim_retaking_its_lapsed_lock_at_c3_fences_out_a_cancel_between_k2_and_k3(
        proxy_factory: Callable[[str], FaultProxy], etcd_url: str, queue_name: str,
        queue: Queue) -> None:
    """A claim's C2 applies, its reply held past its lock's TTL.  A cancel takes the
    free lock (K1), reads the item claimed but unfinished (K2), finds its lock its
    own (K2'), and its K3 is held past the cancel's lock's TTL too.  The claim's C2
    reply arrives: C3 finds no lock, retakes it (the item still carries its token)
    and, since its lock lapsed, fences the item again (a CAS on its C2 index) before
    the hand-out.  The cancel's K3 then lands on the old index: it fails, and the
    cancel, its own lock gone, starts again and finds the claim's: False.  (A retake
    alone let K3 apply: cancel() True over a claim handed out after it.)"""
    c_proxy, k_proxy = proxy_factory(etcd_url), proxy_factory(etcd_url)
    with ready(Queue(connect(c_proxy.url, timeout=8, deadline=20), queue_name, lock_ttl=2,
                     max_attempts=None)) as claimer, \
            Queue(connect(k_proxy.url, timeout=8, deadline=20), queue_name,
                  lock_ttl=2) as canceller:
        item_id = queue.put("run me")
        wait_until(lambda: knows(claimer, item_id), 5, message="the claimer's view to see it")
        c_proxy.hold("down", match=CAS_REPLY)
        c_thread, claimed = in_background(lambda: claimer.claim(timeout=0))
        wait_until(lambda: CAS_REPLY.search(c_proxy.held("down")), 5,
                   message="the claim's C2 reply held")
        wait_until(lambda: lock_of(queue, item_id) is None, 8,
                   message="the claim's lock to expire")
        k_proxy.hold("up", match=ITEM_CAS)
        k_thread, cancelled = in_background(lambda: canceller.cancel(item_id))
        wait_until(lambda: ITEM_CAS.search(k_proxy.held()), 5, message="the cancel's K3 held")
        wait_until(lambda: lock_of(queue, item_id) is None, 8,
                   message="the cancel's lock to expire")
        c_proxy.release()
        c_thread.join(20)
        claim = claimed.get("returned")
        assert isinstance(claim, Claim) and claim.id == item_id, claimed
        k_proxy.release()
        k_thread.join(20)
        assert cancelled == {"returned": False}, (
            f"cancel() gave {cancelled} after the claim was handed out")
        claim.complete("ran")
        info = queue.get(item_id)
        assert (info.state, info.result) == (COMPLETED, "ran")


@pytest.mark.parametrize("end", ["complete", "fail", "release"])
def test_a_handler_whose_lock_expired_may_run_on_after_a_cancel_but_its_outcome_is_refused(
        queue: Queue, other: Queue, end: str) -> None:
    """The limit every lock has: a claim's heartbeat starved (here: stopped) past its
    lock's TTL while its handler runs.  A cancel takes the expired lock and returns
    True; the handler is still running, but its outcome is refused (LockLost: K3
    changed the item's index) and the item stays cancelled."""
    item_id = queue.put("slow handler")
    claim = stalled_claim(other)
    assert claim.id == item_id
    wait_until(lambda: lock_of(queue, item_id) is None, 8, message="the claim's lock to expire")
    assert queue.cancel(item_id) is True
    with pytest.raises(LockLost):
        getattr(claim, end)()
    assert claim.outcome == "lost"
    assert_cancelled(queue, item_id, "slow handler", attempts=1)


def test_a_release_held_in_flight_that_lands_between_k2_and_k3_does_not_stop_the_cancel(
        proxy_factory: Callable[[str], FaultProxy], etcd_url: str, queue_name: str,
        queue: Queue) -> None:
    """A claimer releases: its R0 is held past its lock's TTL.  A cancel locks the item
    (K1) and reads it (K2); its K3 is held.  R0 lands (fenced on the claim's C2 index,
    which nothing changed: it applies, a-1, the claim token kept); R1 finds the
    cancel's lock (LockLost).  K3 lands: "compare failed".  The item has no outcome,
    the same claim token and the cancel's lock: nothing took it, so the cancel reads
    it again and commits (True), instead of calling a pending item running."""
    releaser_proxy, canceller_proxy = proxy_factory(etcd_url), proxy_factory(etcd_url)
    with Queue(connect(releaser_proxy.url, timeout=8, deadline=20), queue_name,
               lock_ttl=2) as releaser, \
            Queue(connect(canceller_proxy.url, timeout=8, deadline=20), queue_name,
                  lock_ttl=2) as canceller:
        item_id = queue.put("pending, really")
        claim = releaser.claim(timeout=5)
        assert claim is not None and claim.id == item_id
        releaser_proxy.hold("up", match=ITEM_CAS)
        rel_thread, released = in_background(claim.release)
        wait_until(lambda: ITEM_CAS.search(releaser_proxy.held()), 5, message="R0 held")
        wait_until(lambda: lock_of(queue, item_id) is None, 8,
                   message="the releasing claim's lock to expire")
        canceller_proxy.hold("up", match=ITEM_CAS)
        can_thread, cancelled = in_background(lambda: canceller.cancel(item_id))
        wait_until(lambda: ITEM_CAS.search(canceller_proxy.held()), 5, message="K3 held")
        releaser_proxy.release()
        rel_thread.join(20)
        assert isinstance(released.get("raised"), LockLost), released  # R1 found our lock
        canceller_proxy.release()
        can_thread.join(20)
        assert cancelled == {"returned": True}, (
            f"cancel() said {cancelled} for an item that is {queue.get(item_id).state!r}")
        assert_cancelled(queue, item_id, "pending, really")  # R0 gave the attempt back


#: A delayed put's D2: the PUT of the item.
D2_PUT = re.compile(rb"^PUT /v2/keys/\S+/work/\d{20}", re.MULTILINE)


def test_a_cancel_of_an_item_a_late_d2_recreated_after_its_requeue_finds_the_tombstone(
        proxy_factory: Callable[[str], FaultProxy], etcd_url: str, queue_name: str,
        queue: Queue) -> None:
    """put(delay=1) through endpoints A, B: D2 to A is held, the transport sends it
    again to B, where it applies: item m.  m is dead-lettered (max_attempts=1) and
    requeued: failed/m becomes a tombstone.  A's held D2 lands: work/m exists again.
    cancel(m) finds the tombstone at K2 (any key counts, as in C3): the item is a
    leftover, removed, and cancel returns False.  (K2 used to skip the tombstone:
    K3 committed m, F2 hit the tombstone (EtcdRejected) and m stayed in work/.)"""
    a, b = proxy_factory(etcd_url), proxy_factory(etcd_url)
    with Queue(connect([a.url, b.url], timeout=1, deadline=6), queue_name) as producer:
        a.hold("up", match=D2_PUT)
        item_id = producer.put("delayed", delay=1)
        assert D2_PUT.search(a.held())  # the first copy of D2, still in flight
        claim = queue.claim(timeout=5)
        assert claim is not None and claim.id == item_id
        claim.fail("boom")  # max_attempts=1: a dead letter
        requeued = queue.requeue(item_id)
        a.release()  # the held D2 lands: work/m again
        wait_until(lambda: queue._protocol.read("work", item_id) is not None, 5,
                   message="the held D2 to land")
        assert queue.cancel(item_id) is False
        assert queue._protocol.read("work", item_id) is None
        assert lock_of(queue, item_id) is None
        assert "requeued_as" in (queue._protocol.read(FAILED, item_id).value or "")
        got = queue.claim(timeout=5)
        assert got is not None and (got.id, got.payload) == (requeued, "delayed")
        got.complete()
        assert queue.claim(timeout=0.5) is None


# -- the command line -----------------------------------------------------------------------

def etcdq(etcd_url: str, *args: str) -> "subprocess.CompletedProcess[str]":
    env = {**os.environ, "ETCDQ_ENDPOINTS": etcd_url}
    return subprocess.run([sys.executable, "-m", "etcdq_v2", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_cli_cancel_exits_0_when_every_id_was_cancelled(etcd_url: str, queue: Queue) -> None:
    ids = queue.put_many(["a", "b"])
    done = etcdq(etcd_url, "cancel", queue.name, *ids)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{ids[0]}  cancelled", f"{ids[1]}  cancelled"]
    for item_id, payload in zip(ids, "ab"):
        assert_cancelled(queue, item_id, payload)


@pytest.mark.parametrize("option, expected", [([], None), (["--failed-ttl", "600"], 600)],
                         ids=["kept", "ttl"])
def test_cli_cancel_writes_the_dead_letter_with_the_failed_ttl_given(
        etcd_url: str, queue: Queue, option: List[str], expected: Optional[int]) -> None:
    item_id = queue.put("a")
    done = etcdq(etcd_url, "cancel", queue.name, *option, item_id)
    assert done.returncode == 0, done.stderr
    ttl = queue._protocol.read(FAILED, item_id)
    assert ttl is not None
    if expected is None:
        assert ttl.expiration is None
    else:
        assert expected - 10 <= ttl.ttl <= expected


def test_cli_cancel_exits_1_when_any_was_running_or_finished(etcd_url: str,
                                                             queue: Queue) -> None:
    running, pending = queue.put_many(["running", "pending"])
    claim = queue.claim(timeout=2)
    assert claim is not None and claim.id == running
    done = etcdq(etcd_url, "--json", "cancel", queue.name, running, pending)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout) == [{"id": running, "cancelled": False},
                                       {"id": pending, "cancelled": True}]
    assert queue.get(running).state == "running"
    claim.complete()


def test_cli_cancel_exits_5_for_an_unknown_id_which_wins_over_1(etcd_url: str,
                                                               queue: Queue) -> None:
    item_id = queue.put("x")
    queue.claim(timeout=2).complete()
    done = etcdq(etcd_url, "cancel", queue.name, item_id, UNKNOWN)
    assert done.returncode == 5, done.stderr
    assert done.stdout == f"{item_id}  not cancelled: running or finished\n"
    assert done.stderr.strip() == f"etcdq: error: no item {UNKNOWN} in queue {queue.name}"
    bad = etcdq(etcd_url, "cancel", queue.name, "12a")  # "12" is an id without its zeros
    assert bad.returncode == 2 and "invalid item id" in bad.stderr


def test_a_cancel_that_keeps_losing_its_lock_is_unavailable_not_false(
        proxy: FaultProxy, etcd_url: str, queue_name: str) -> None:
    """Requests take 1 s each way up (a slow link; lock_ttl=1 keeps the test short:
    with the default 30 s the same happens at ~10 s per request).  Each round K1
    creates the lock, K2 reads the item and K2' finds the lock expired: the cancel
    starts again.  After the third round it must not say False ("running or
    finished") for an item that is pending and unheld: Unavailable, nothing written."""
    with Queue(etcd_url, queue_name, lock_ttl=1) as queue, \
            Queue(connect(proxy.url, timeout=5, deadline=20), queue_name,
                  lock_ttl=1) as canceller:
        item_id = queue.put("cancel me")
        proxy.delay(1000, "up")
        try:
            with pytest.raises(Unavailable, match="lock .* long enough to cancel"):
                canceller.cancel(item_id)
        finally:
            proxy.pass_through()
        assert queue.get(item_id).state == "pending"
        claim = queue.claim(timeout=5)  # unheld: claimable once our last lock is gone
        assert claim is not None and claim.id == item_id
        claim.complete()
