"""Hostile review rv16 of b177b63 (view: a lost race answered after a watching
listing plans a confirm; a watching listing reads locks/ for new delayed items).

Each test_rv16_* test reproduces a finding against a real etcd and FAILS on
b177b63 (bb7df25); test_rv16_held_* are attacks that held (bounds checked).
"""
from __future__ import annotations

import re
import time

from helpers import hands_out, in_background, record_calls, wait_until

from etcdq_v2 import Queue
from etcdq_v2.codec import Lock, new_token
from etcdq_v2.transport import connect

LOCK_TTL = 2  # <= LINGER_MAX: F4 skipped


def _dead_claimer_c1_only(actor: Queue, item_id: str, ttl: int = 1) -> int:
    """A claimer's C1 on the item, then it dies before C2: the lock expires
    after ``ttl`` s and the item is left unchanged (no claim token)."""
    return actor._protocol._create_lock(item_id, Lock(actor.node_id, new_token()), ttl)


def test_rv16_confirm_listing_applied_after_a_stream_restart_strands_the_item(
        etcd_url: str, queue_name: str, proxy) -> None:
    """A CONFIRM check's listing of locks/, answered late, is applied after the
    same follower's stream restarted and listed again: it marks an item locked
    by a lock that expired before the new stream began, and nothing frees it.

    1. The consumer watches (follower F, stream 1) with a confirm planned: Y,
       claimed by a live holder, was read off work/ when it started watching.
       X is free in the view.
    2. A claimer of another process creates X's lock (C1, ttl 1 s) and dies
       before C2 (X unchanged).  Its create event is slow on stream 1.
    3. The confirm is due: the consumer's claim runs check_locks, which sets
       _confirm_at = inf and lists locks/ at L (X's lock is there); the reply
       is slow (held on the way back; or the thread is descheduled).
    4. X's lock expires.  Stream 1 ends (etcd drops a slow watcher, a member
       goes, a connection drops: drop_stream() here); F subscribes again
       (S2, after the expiry) and lists work/ at W2 (X free, no claim token)
       and locks/ (for Y, noted before): X is in neither _locks nor _trying,
       so the listing notes no _gone for it; _confirm_at = inf.
    5. The confirm's reply comes: _list_locks sees `follower is self._follower`
       (the same F) and applies L: _locked(X, c) (c > _gone.get(X, 0) = 0).
       X is taken at c < S2: no event will free it, no confirm is planned
       (check_locks cleared it, F's listing cleared it again), and a watching
       view lists locks/ on nothing else.  X is stranded while stream 2 lives
       (60 s idle; never while the queue is busy).

    rv9's guard (`follower is self._follower`) does not cover a follower's own
    stream restart, and rv11's (_gone) only items the view held taken."""
    transport = connect(proxy.url, timeout=8.0)
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=60) as holder, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as dead, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as other, \
            Queue(transport, queue_name, lock_ttl=LOCK_TTL) as consumer:
        view = consumer._ensure_view()  # quiet, empty
        holder.put("y")
        held = holder.claim(timeout=0)
        assert held is not None
        assert consumer.claim(timeout=0) is None  # starved: watching, Y read off work/
        assert view.watching_locks and view._confirm_at < float("inf")
        item_id = producer.put("x")
        wait_until(lambda: view._is_free(item_id), 5, message="X's event")
        # Slow: stream 1's event of X's lock, and any listing that shows it.
        proxy.hold("down", match=re.compile(rb"/locks/" + item_id.encode()))
        wait_until(lambda: time.monotonic() >= view._confirm_at, 3, interval=0.01,
                   message="the confirm is due")
        _dead_claimer_c1_only(dead, item_id, ttl=1)
        thread_a, outcome_a = in_background(lambda: consumer.claim(timeout=3), "claimer-a")
        wait_until(lambda: b'"action":"get"' in proxy.held("down"), 5,
                   message="the confirm's listing of locks/ answered (held)")
        wait_until(lambda: dead._protocol.read("locks", item_id) is None, 5,
                   message="etcd expired the dead claimer's lock")
        relists = view.relists
        view._follower.drop_stream()
        wait_until(lambda: view.relists > relists, 5, message="the follower listed again")
        proxy.pass_through()  # the confirm's reply comes in
        thread_a.join(10)
        assert not thread_a.is_alive() and "raised" not in outcome_a, outcome_a
        if outcome_a["returned"] is not None:  # not stranded: thread A got X
            assert outcome_a["returned"].id == item_id
            outcome_a["returned"].complete()
        else:
            got = hands_out(consumer, item_id, 2 * LOCK_TTL, other)
            got.complete()
        held.complete()


def test_rv16_payload_with_a_q_key_makes_listings_read_locks(
        etcd_url: str, queue_name: str) -> None:
    """Low (cost).  _new_delayed() tested the raw value for the text '"q":'
    without decoding it (unlike _claimed, which decodes after its cheap test),
    and an item's value is {"p": <the payload as JSON>, ...}: any item whose
    payload is a dict with a key "q" (a search query, a queue name...) counted
    as delayed, so a listing that showed such items new to the view read all
    of locks/ (a lock TTL's worth of finished items' lingering locks): a quiet
    relist, and since b177b63 a view that starts watching.  A delayed item,
    the control, must still make the listing read locks/.

    As first written, this test counted a watching view's relists while others
    ran the items: their lock events, applied before the relist, are signs the
    view had before it (_noted_before), which rightly make it read locks/, so
    it failed or passed by timing; now a quiet view relists items nobody runs."""
    with Queue(etcd_url, queue_name) as consumer, Queue(etcd_url, queue_name) as producer:
        consumer.put_many(range(40))  # a backlog: the view stays quiet
        first = consumer.claim()
        view = consumer._view
        assert first is not None and view is not None and not view.watching_locks
        lists = record_calls(view._protocol, "list")
        producer.put_many([{"q": i} for i in range(5)])  # not delayed
        view.relist_work()
        assert lists == ["work"], (
            f"a relist read locks/ for items that are not delayed, whose payload has "
            f"a key 'q' (listings: {lists})")
        producer.put("later", delay=30)  # the control: delayed
        view.relist_work()
        assert lists == ["work", "work", "locks"], lists
        first.complete()


def test_rv16_held_an_idle_watching_stage_putting_delayed_items_sends_no_loop(
        etcd_url: str, queue_name: str, proxy) -> None:
    """Held: a pipeline stage that waits in claim() (watching) while it puts
    delayed items itself: its own puts are in the view at once (delayed()),
    so no watching listing reads locks/ for them, nothing is tried before its
    delay, and the waiting claim sends nothing but the puts (no loop)."""
    transport = connect(proxy.url, timeout=5.0)
    with Queue(transport, queue_name) as stage:
        assert stage.claim(timeout=0) is None
        view = stage._view
        assert view.watching_locks
        thread, outcome = in_background(lambda: stage.claim(timeout=3), "waiting")
        time.sleep(0.3)
        before = len(proxy.requests)
        for i in range(5):
            stage.put({"n": i}, delay=30)
        thread.join(10)
        assert not thread.is_alive() and outcome.get("returned") is None, outcome
        sent = [line for line in proxy.requests[before:] if b"wait=true" not in line]
        assert not [line for line in sent if line.startswith(b"GET")], sent
        assert len(sent) <= 10, sent  # D1 + D2 per put
