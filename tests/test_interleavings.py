"""Interleavings hostile reviews found: of the fenced commit (R-1 to R-7), and of
the view (V-1, V-2).

Each test drives the protocol's steps by hand up to a crash or a pause,
against a real etcd, and checks what docs/guarantees.md promises: one
outcome per item, a requeued dead letter never comes back, a claim that
lost its item never holds on to it.
"""
from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest

from etcdq_v2 import ClaimClosed, LockLost, NotFound, Queue, Unavailable, connect
from etcdq_v2.codec import Item
from etcdq_v2.driver import run
from etcdq_v2.errors import AlreadyExists
from etcdq_v2.protocol import COMPLETED, FAILED

from crashes import (commit, commit_then_crash, record_like_0_1_0_then_crash,
                     stalled_claim)
from faultproxy import FaultProxy
from helpers import in_background, wait_until


def drain(queue: Queue) -> list:
    handed = []
    while (claim := queue.claim(timeout=3)) is not None:
        handed.append((claim.id, claim.payload))
        claim.complete("ran")
    return handed


def test_r1_requeue_of_a_dead_letter_whose_item_is_still_in_work(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1, max_attempts=1) as crashed, \
            Queue(etcd_url, queue_name, lock_ttl=30, max_attempts=1) as operator:
        crashed.put("run me once more")
        dead = commit_then_crash(crashed, FAILED)
        operator.requeue(dead)  # waits out the crashed claim's lock (Q0)
        assert [payload for _, payload in drain(operator)] == ["run me once more"]
        assert operator.stats() == {"pending": 0, "running": 0, "completed": 1, "failed": 0}
        with pytest.raises(NotFound):
            operator.requeue(dead)


def test_r2_requeue_of_a_0_1_0_dead_letter_whose_item_is_still_in_work(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1) as crashed, \
            Queue(etcd_url, queue_name, lock_ttl=30) as operator:
        crashed.put("poison")
        item_id = record_like_0_1_0_then_crash(crashed, FAILED)
        operator.requeue(item_id)  # 0.1.0 died after its F2; this is the upgraded operator
        assert len(drain(operator)) == 1


def test_r3_a_requeue_paused_past_its_lock_ttl_requeues_once(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1, max_attempts=1) as r1, \
            Queue(etcd_url, queue_name, lock_ttl=1, max_attempts=1) as r2:
        r1.put("once")
        claim = r1.claim()
        claim.fail("boom")
        dead, p = claim.id, r1._protocol
        lock = run(p._lock_dead_letter(dead), p.etcd)                 # Q0
        (token, index), record = run(p._requeue_token(dead, None), p.etcd)  # Q1, then R1 pauses
        wait_until(lambda: p.read("locks", dead) is None, 5, message="R1's lock to expire")
        r2.requeue(dead)                                 # R2 does it all
        assert len(drain(r2)) == 1                       # ... and the item runs
        raw = Item(record.payload, token, requeued=True).encode()
        run(p._create_item(f"{index:020d}", raw), p.etcd)             # R1 wakes: its Q3
        p._drop_lock(dead, lock)
        assert drain(r2) == []  # created again, but its first claim finds the record


def test_a_late_q3_after_completed_ttl_passed_still_finds_the_record_and_runs_nothing(
        etcd_url: str, queue_name: str) -> None:
    """r3 with completed_ttl=1: R1 does Q0-Q2 and pauses; R2 requeues (same token, the
    same new id m); m is claimed and completed; completed_ttl passes (an ordinary
    record written after it expires); R1 wakes and its Q3 creates work/<m> again.
    The record of an item carrying "q" is kept a week whatever completed_ttl says,
    so that claim finds it (C3) and the item never runs twice."""
    with Queue(etcd_url, queue_name, lock_ttl=1, max_attempts=1, completed_ttl=1) as r1, \
            Queue(etcd_url, queue_name, lock_ttl=1, max_attempts=1, completed_ttl=1) as r2:
        r1.put("run me once")
        claim = r1.claim(timeout=2)
        assert claim is not None
        claim.fail("boom")  # max_attempts=1: a dead letter
        dead, p = claim.id, r1._protocol
        lock = run(p._lock_dead_letter(dead), p.etcd)                 # Q0
        (token, index), record = run(p._requeue_token(dead, None), p.etcd)  # Q1 (Q2: none in work/), then R1 pauses
        wait_until(lambda: p.read("locks", dead) is None, 5, message="R1's lock to expire")
        new_id = r2.requeue(dead)                        # R2 does it all
        assert new_id == f"{index:020d}"
        for expected in (new_id, r2.put("an ordinary item, completed after it")):
            claim = r2.claim(timeout=3)                  # the requeued item runs, then
            assert claim is not None and claim.id == expected  # the ordinary one
            claim.complete("ran")
        ordinary = expected
        wait_until(lambda: p.read(COMPLETED, ordinary) is None, 10,
                   message="completed_ttl to pass: the ordinary record to expire")
        raw = Item(record.payload, token, requeued=True).encode()
        run(p._create_item(new_id, raw), p.etcd)                      # R1 wakes: its Q3
        p._drop_lock(dead, lock)
        assert r2.claim(timeout=1) is None  # created again; its first claim finds the record
        assert p.read("work", new_id) is None


def test_r4_a_late_f2_after_requeue_finds_the_key_taken(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=30, max_attempts=1) as queue:
        queue.put("once")
        claim = queue.claim()
        claim.fail("boom")
        p = queue._protocol
        held = p.read(FAILED, claim.id).value  # the copy of F2 a frozen member holds
        queue.requeue(claim.id)
        with pytest.raises(AlreadyExists):      # it thaws: the tombstone takes the key
            p.etcd.put(p.layout.key(FAILED, claim.id), held, prev_exist=False)
        assert queue.stats()["failed"] == 0
        with pytest.raises(NotFound):
            queue.requeue(claim.id)


#: A claimer's F2 of a dead letter.
DEAD_LETTER_PUT = re.compile(rb"^PUT /v2/keys/\S+/failed/\d{20}", re.MULTILINE)
#: Q4: the tombstone's value.
TOMBSTONE_PUT = re.compile(rb"requeued_as")


def create_failures(etcd_url: str) -> int:
    """etcd's count of PUTs prevExist=false that found the key taken."""
    with urllib.request.urlopen(f"{etcd_url}/v2/stats/store", timeout=5) as reply:
        return int(json.load(reply)["createFail"])


@pytest.mark.parametrize("first", ["q4", "late-f2"])
def test_r4_a_q4_after_the_dead_letter_was_purged_still_leaves_the_tombstone(
        proxy_factory, etcd_url: str, queue_name: str, first: str) -> None:
    """failed_ttl=6.  A finisher dead-letters item X (F1, F2) and dies before F3.
    Claimer K finds "o" and finishes for it: its F2 is held in flight (K gives up).
    A requeue runs Q0-Q3 (new item m) and its Q4 is held until failed/X is gone:
    purged (it cannot expire: Q1 gave it a week, TOMBSTONE_TTL).
    q4: Q4 lands first ("not found") and creates the tombstone; K's F2 then finds
    the key taken.  late-f2: K's F2 lands first, writing the dead letter again;
    Q4 ("compare failed") finds that copy (the same claim token) and buries it.
    Either way a second requeue of X finds nothing, and the payload runs once (Q4
    used to ignore "not found": the late F2 wrote the dead letter again, and a
    second requeue ran it twice)."""
    ttl = 6
    with Queue(etcd_url, queue_name, lock_ttl=1, max_attempts=1, failed_ttl=ttl) as q:
        q.put("run me once")
        dead = commit_then_crash(q, FAILED, record=True)  # F1, F2; the finisher dies
        wait_until(lambda: q._protocol.read("locks", dead) is None, 5,
                   message="the finisher's lock to expire")
        k_proxy, r_proxy = proxy_factory(etcd_url), proxy_factory(etcd_url)
        k_proxy.hold("up", match=DEAD_LETTER_PUT)
        with Queue(connect(k_proxy.url, timeout=1, deadline=2), queue_name, lock_ttl=1,
                   failed_ttl=ttl) as k:
            with pytest.raises(Unavailable):
                k.claim(timeout=0)  # its F2 held: Unavailable
        assert DEAD_LETTER_PUT.search(k_proxy.held())
        r_proxy.hold("up", match=TOMBSTONE_PUT)
        with Queue(connect(r_proxy.url, timeout=8, deadline=20), queue_name,
                   lock_ttl=5) as requeuer:
            thread, requeued = in_background(lambda: requeuer.requeue(dead))
            wait_until(lambda: TOMBSTONE_PUT.search(r_proxy.held()), 5, message="Q4 held")
            assert q.purge(failed=True) == 1  # the marked dead letter, as an operator would
            assert q._protocol.read(FAILED, dead) is None
            refused = create_failures(etcd_url)
            if first == "late-f2":
                k_proxy.release()
                wait_until(lambda: q._protocol.read(FAILED, dead) is not None, 5,
                           message="K's held F2 to write the dead letter again")
            r_proxy.release()
            thread.join(20)
        new_id = requeued["returned"]
        buried = q._protocol.read(FAILED, dead)
        assert buried is not None and "requeued_as" in (buried.value or ""), (
            f"no tombstone after requeue: failed/{dead} is {buried}")
        if first == "q4":
            k_proxy.release()
            wait_until(lambda: create_failures(etcd_url) > refused, 5,
                       message="K's held F2 to land, and find the key taken")
        with pytest.raises(NotFound):
            q.requeue(dead)
        assert drain(q) == [(new_id, "run me once")]


def test_r4_a_requeue_dead_after_q3_keeps_the_marked_dead_letter_against_a_late_f2(
        proxy_factory, etcd_url: str, queue_name: str) -> None:
    """failed_ttl=4.  A finisher dead-letters X (F1, F2) and dies before F3; claimer
    K finds "o" and finishes for it: its F2 is held in flight.  A requeue runs
    Q0-Q3 (item m, with the requeue token) and dies: no Q4, no tombstone.  Q1
    gave the marked dead letter a week (TOMBSTONE_TTL), so it outlives
    failed_ttl; K's held F2 then finds the key taken, and a second requeue
    reuses the token (Q3: "already exists"): the payload runs once.  (With
    failed_ttl kept, the dead letter expired, the late F2 wrote it again
    without the token, and the second requeue created a second item.)"""
    ttl = 4
    with Queue(etcd_url, queue_name, lock_ttl=1, max_attempts=1, failed_ttl=ttl) as q:
        q.put("run me once")
        dead = commit_then_crash(q, FAILED, record=True)  # F1, F2; the finisher dies
        wait_until(lambda: q._protocol.read("locks", dead) is None, 5,
                   message="the finisher's lock to expire")
        k_proxy = proxy_factory(etcd_url)
        k_proxy.hold("up", match=DEAD_LETTER_PUT)
        with Queue(connect(k_proxy.url, timeout=1, deadline=2), queue_name, lock_ttl=1,
                   failed_ttl=ttl) as k:
            with pytest.raises(Unavailable):
                k.claim(timeout=0)  # its F2 held
        assert DEAD_LETTER_PUT.search(k_proxy.held())
        p = q._protocol
        run(p._lock_dead_letter(dead), p.etcd)                                 # Q0
        (token, index), record = run(p._requeue_token(dead, None), p.etcd)           # Q1 (Q2: none in work/)
        first = f"{index:020d}"
        raw = Item(record.payload, token, requeued=True).encode()
        assert run(p._create_item(first, raw), p.etcd)            # Q3
        # The requeue dies here.  Past the time failed_ttl would have expired the key:
        marked_at = time.monotonic()
        wait_until(lambda: time.monotonic() > marked_at + ttl + 1.5, ttl + 3,
                   message="failed_ttl to pass")
        left = p.read(FAILED, dead)
        assert left is not None and token in (left.value or ""), (
            "the marked dead letter expired before its requeue finished")
        refused = create_failures(etcd_url)
        k_proxy.release()  # K's F2 lands: the key is taken
        wait_until(lambda: create_failures(etcd_url) > refused, 5,
                   message="K's held F2 to land, and find the key taken")
        second = q.requeue(dead)  # waits out the dead requeuer's lock (Q0)
        assert second == first
        assert drain(q) == [(first, "run me once")]


def test_r5_complete_after_a_fail_that_committed_reports_the_dead_letter(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=30, max_attempts=1) as queue:
        item_id = queue.put("x")
        claim = queue.claim()
        commit(queue, claim, FAILED, record=False)  # fail()'s F1 applied; its reply was lost
        with pytest.raises(ClaimClosed) as closed:
            claim.complete("ok")
        assert closed.value.outcome == FAILED and claim.outcome == "dead-lettered"
        assert queue.get(item_id).state == FAILED


def test_r6_a_retake_after_another_claim_came_and_went_lets_go(
        etcd_url: str, queue_name: str, monkeypatch) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1) as a, \
            Queue(etcd_url, queue_name, lock_ttl=30) as b:
        item_id = a.put("x")
        claim_a = a.claim()
        a._heartbeat.discard(claim_a)
        p = a._protocol
        wait_until(lambda: p.read("locks", item_id) is None, 5, message="A's lock to expire")
        lock_key, put = p.layout.key("locks", item_id), p.etcd.put

        def pause_before_the_lock_create(key, value=None, **kw):
            # A pauses right after the retake's check, before it creates the lock ...
            if key == lock_key and kw.get("prev_exist") is False:
                monkeypatch.setattr(p.etcd, "put", put)
                claim_b = b.claim(timeout=3)   # ... while B claims and releases
                assert claim_b is not None and claim_b.id == item_id
                claim_b.release()
            return put(key, value, **kw)

        monkeypatch.setattr(p.etcd, "put", pause_before_the_lock_create)
        with pytest.raises(LockLost):
            claim_a.refresh()
        assert claim_a.lost
        assert p.read("locks", item_id) is None  # A let go: the item is claimable
        again = b.claim(timeout=3)
        assert again is not None and again.id == item_id


def test_r7_a_watching_view_finishes_an_item_whose_finisher_crashed_after_f2(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=1) as crashed, \
            Queue(etcd_url, queue_name, lock_ttl=30) as survivor:
        assert survivor.claim(timeout=0) is None  # the survivor now watches everything
        assert survivor._view.watching_locks
        crashed.put("finish me once")
        item_id = commit_then_crash(crashed, COMPLETED)
        wait_until(lambda: survivor._protocol.read("locks", item_id) is None, 5,
                   message="the crashed finisher's lock to expire")
        assert survivor.claim(timeout=4) is None
        wait_until(lambda: survivor._protocol.read("work", item_id) is None, 6,
                   message="the committed item to be finished by the watching consumer")


def _watching(queue: Queue) -> None:
    assert queue.claim(timeout=0) is None  # found nothing: now watches the whole directory
    assert queue._view is not None and queue._view.watching_locks


# -- V-1 (a second review, of the view): an item whose F2 was seen live and whose lock was DELETED (F4) before F3 applied
@pytest.mark.parametrize("lock_ttl", [61, 5], ids=["F4-sent", "lock-lingers"])
def test_v1_a_watching_view_finishes_an_item_whose_f3_never_applied(
        etcd_url: str, queue_name: str, proxy: FaultProxy, lock_ttl: int) -> None:
    """complete(): F1, F2 and F4 apply, F3 never does (held, then the link is reset);
    complete() raises Unavailable.  A consumer that watched all along must still
    finish the committed item (F3), as a fresh consumer would.  With lock_ttl <=
    LINGER_MAX no F4 is sent: the abandoned claim's lock expires, and its expire
    event (not a delete) makes the watcher finish the item (issue 14)."""
    finisher = Queue(connect(proxy.url, timeout=0.5), queue_name, lock_ttl=lock_ttl)
    with Queue(connect(etcd_url, timeout=0.5), queue_name, lock_ttl=30) as watcher:
        try:
            finisher.put("finish me once")
            claim = finisher.claim(timeout=2)
            assert claim is not None
            _watching(watcher)
            proxy.hold("up", match=re.compile(rb"DELETE /v2/keys/etcdq/[^/ ]+/work/"))
            with pytest.raises(Unavailable):
                claim.complete("done")   # F3 is held on every try; F4 went through, if sent
            claim.abandon()             # as a Worker does: the heartbeat stops
            proxy.reset()               # the held F3 never reaches etcd
            proxy.pass_through()
            p = watcher._protocol
            if lock_ttl > 60:
                assert p.read("locks", claim.id) is None      # F4 applied
            else:
                assert p.read("locks", claim.id) is not None  # no F4: it lingers
            assert p.read(COMPLETED, claim.id) is not None    # F2 applied
            assert p.read("work", claim.id) is not None       # F3 did not
            # The watcher waits for work: it must finish the committed item (once
            # the lingering lock expired: up to lock_ttl after the last refresh).
            def finished_by_the_watcher() -> bool:
                assert watcher.claim(timeout=0.5) is None
                return p.read("work", claim.id) is None
            wait_until(finished_by_the_watcher, 7 if lock_ttl > 60 else lock_ttl + 7,
                       message="the watching consumer to finish the committed item (F3)")
        finally:
            finisher.close()
            finisher.etcd.close()


def test_v1_a_watching_view_finishes_an_item_after_a_crash_between_f4_and_f3(etcd_url: str, queue_name: str) -> None:
    """Same interleaving driven by hand: F1, F2, F4 apply, then the finisher dies."""
    with Queue(etcd_url, queue_name, lock_ttl=30) as crashed, \
            Queue(connect(etcd_url, timeout=0.5), queue_name, lock_ttl=30) as watcher:
        _watching(watcher)
        crashed.put("finish me once")
        item_id = commit_then_crash(crashed, COMPLETED)
        p = crashed._protocol
        lock = p.read("locks", item_id)
        assert lock is not None
        f4 = p.etcd.delete(p.layout.key("locks", item_id), prev_value=lock.value).index
        view = watcher._view
        assert view is not None
        wait_until(lambda: view.state.known >= f4, 3, message="the watcher's view to apply F4")
        assert watcher.claim(timeout=3) is None
        wait_until(lambda: p.read("work", item_id) is None, 4,
                   message="the watching consumer to finish the committed item (F3)")


# -- V-2: a finisher whose lock merely expired commits (F1 needs no lock), then dies
@pytest.mark.parametrize("record", [False, True], ids=["after-F1", "after-F2"])
def test_v2_a_watching_view_finishes_an_item_committed_after_its_lock_expired(etcd_url: str, queue_name: str,
                                                     record: bool) -> None:
    """The finisher's lock expires (nobody claims the item meanwhile), its F1 still
    applies, as docs/protocol.md allows, then it dies before F3.  No lock is left to
    expire or be deleted; a watching consumer must still finish the item."""
    with Queue(etcd_url, queue_name, lock_ttl=1) as crashed, \
            Queue(connect(etcd_url, timeout=0.5), queue_name, lock_ttl=30) as watcher:
        _watching(watcher)
        crashed.put("finish me once")
        claim = stalled_claim(crashed)  # its heartbeat stalls: the lock expires
        p = crashed._protocol
        wait_until(lambda: p.read("locks", claim.id) is None, 5, message="the lock to expire")
        # F1 (and F2) of the claim whose lock expired, then the finisher dies.
        last = commit(crashed, claim, COMPLETED, record=record)
        view = watcher._view
        assert view is not None
        wait_until(lambda: view.state.known >= last, 3, message="the watcher's view to apply F1/F2")
        assert watcher.claim(timeout=3) is None
        wait_until(lambda: p.read("work", claim.id) is None, 4,
                   message="the watching consumer to finish the committed item")
        assert p.read(COMPLETED, claim.id) is not None
