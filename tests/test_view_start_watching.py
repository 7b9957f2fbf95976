"""A view that starts watching (claims read off work/, CONFIRM checks):

- a lost race whose reply is applied after the watching listing, or after a
  stream restart, strands nothing;
- every new delayed item is planned, not tried before its delay;
- a consumer's own running claims cost no listing of locks/;
- an item released elsewhere comes back to a quiet view within a lock TTL, and
  a pending CONFIRM check costs one listing, no loop.

Each test forces its interleaving against a real etcd.
"""
from __future__ import annotations

import re
import threading
import time

from helpers import hands_out, in_background, wait_until

from etcdq_v2 import Queue
from etcdq_v2.codec import Lock, new_token
from etcdq_v2.transport import connect

LOCK_TTL = 2  # <= LINGER_MAX: F4 skipped


def _dead_claimer_c1_only(actor: Queue, item_id: str, ttl: int = 1) -> int:
    """A claimer's C1 on the item, then it dies before C2 (killed, or its C2
    failed): the lock expires after ``ttl`` s and the item is left unchanged,
    with no claim token.  Returns C1's index."""
    return actor._protocol._create_lock(item_id, Lock(actor.node_id, new_token()), ttl)


def test_lost_race_reply_applied_after_the_watching_listing_strands_the_item(
        etcd_url: str, queue_name: str, proxy) -> None:
    """Two threads claim from one Queue (several threads on one Queue).

    1. The consumer's quiet view lists X free.  Another process's claimer
       creates X's lock (C1, ttl 1 s) and dies before its C2.
    2. Thread A tries X: its C1 gets "already exists" at etcd index I; the
       reply is slow (held on the way back, or thread A is descheduled).
    3. The dead claimer's lock expires (no C2: X is unchanged, free in etcd).
    4. Thread B finds nothing free (X is A's attempt) and starts watching: the
       new follower lists work/ only (no sign noted before; X carries no claim
       token), no confirm is planned, and the stream registers after the expiry.
    5. A's reply arrives: _lost_race -> locked_at(X, I) marks X taken at I,
       an index before the watch began.  No event will free it, no confirm is
       planned, and a watching view never lists locks/ on its own: X is
       stranded for as long as the stream lives (idle_timeout, 60 s without
       any event in the whole store's queue directory; never while busy).

    A watching follower that listed locks/ would free it (X's absence notes
    "gone at W" in _trying, and locked_at(X, I < W) frees it), but listing
    locks/ at every start of watching costs a lock TTL's worth of lingering
    locks; instead, a sign from before the watching listing is checked
    CONFIRM later (check_locks).
    """
    transport = connect(proxy.url, timeout=8.0)
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as dead, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as other:
        item_id = producer.put("x")
        with Queue(transport, queue_name, lock_ttl=LOCK_TTL) as consumer:
            view = consumer._ensure_view()  # quiet; lists X free
            assert not view.watching_locks and view.state.is_free(item_id)
            _dead_claimer_c1_only(dead, item_id, ttl=1)
            # Hold the reply of A's C1 ("already exists" is errorCode 105).
            proxy.hold("down", match=rb'"errorCode":105')
            thread_a, outcome_a = in_background(lambda: consumer.claim(timeout=0), "claimer-a")
            wait_until(lambda: re.search(rb'"errorCode":105', proxy.held("down")), 5,
                       message="A's C1 answered 'already exists' (held)")
            wait_until(lambda: dead._protocol.read("locks", item_id) is None, 5,
                       message="etcd expired the dead claimer's lock")
            assert consumer.claim(timeout=0) is None  # thread B: starved, starts watching
            assert view.watching_locks
            proxy.pass_through()  # A's reply comes in: Taken(I)
            thread_a.join(10)
            assert not thread_a.is_alive() and "raised" not in outcome_a, outcome_a
            if outcome_a["returned"] is not None:  # A's next round took X
                assert outcome_a["returned"].id == item_id
                outcome_a["returned"].complete()
                return
            got = hands_out(consumer, item_id, 2 * LOCK_TTL, other)
            got.complete()


def test_a_view_that_starts_watching_tries_every_new_delayed_item(
        etcd_url: str, queue_name: str) -> None:
    """Another process puts 40 items with a delay (D1: delay lock, D2: the item
    with "q", no claim token) after the consumer's last listing.  The consumer
    finds nothing and starts watching: the watching follower lists work/ only
    (no sign noted before, no claim token), and _new_delayed() is acted on
    only by a quiet follower, so every delayed item looks free: the claim
    tries each one, a failed C1 (lock create) apiece, 40 failed writes, and
    every consumer does so each time it starts watching with delayed items
    new to it.  A watching follower that lists locks/ tries none."""
    with Queue(etcd_url, queue_name) as consumer, Queue(etcd_url, queue_name) as producer:
        view = consumer._ensure_view()  # quiet, empty
        producer.put_many(range(40), delay=30)
        tries = []
        original = consumer._protocol._create_lock

        def counted(item_id, lock, ttl):
            tries.append(item_id)
            return original(item_id, lock, ttl)

        consumer._protocol._create_lock = counted  # type: ignore[method-assign]
        assert consumer.claim(timeout=0.5) is None
        assert view.watching_locks
        assert len(tries) <= 2, (
            f"the consumer tried {len(tries)} of the 40 delayed items (each a failed "
            f"lock create) when it started watching")


def test_a_consumer_running_its_own_item_lists_no_locks_when_it_starts_watching(
        etcd_url: str, queue_name: str) -> None:
    """docs/protocol.md, "A view that starts watching": the signs of the
    process's own live claims (ViewState.own) are not checked: its heartbeat
    keeps those locks.  A Worker's main thread claims the next item while a
    slot runs the last one; at the end of a backlog it starts watching, and
    its own item runs longer than CONFIRM (1 s): its lock (locked_at after
    C2, newer than the last listing and no newer than the watching one's) is
    not confirmed by a listing of locks/ (a lock TTL's worth of lingering
    locks)."""
    from etcdq_v2.viewstate import CONFIRM
    with Queue(etcd_url, queue_name) as consumer:
        consumer.put_many(range(3))
        held = [consumer.claim(timeout=0) for _ in range(3)]  # the first listing knows all
        assert all(held)
        view = consumer._view
        consumer.put("last")  # own put: known at once, claimed after the last listing
        mine = consumer.claim(timeout=0)
        assert mine is not None
        for claim in held:
            claim.complete()
        lists = []
        original = view._protocol.list

        def counted(kind, *args, **kwargs):
            lists.append((kind, round(time.monotonic() - started, 2)))
            return original(kind, *args, **kwargs)

        view._protocol.list = counted  # type: ignore[method-assign]
        started = time.monotonic()
        assert consumer.claim(timeout=CONFIRM + 1.0) is None  # the handler still runs
        assert view.watching_locks
        mine.complete()
        locks = [at for kind, at in lists if kind == "locks"]
        assert not locks, (
            f"listed locks/ {len(locks)} time(s) (s after the claim began: {locks}) to confirm the consumer's own "
            f"live claim {mine.id}: listings {lists}")


def test_an_own_claim_lost_unheard_before_the_view_starts_watching_is_offered_again(
        etcd_url: str, queue_name: str) -> None:
    """docs/protocol.md, "A view that starts watching": an own claim's sign is
    trusted only while the heartbeat keeps its lock.  The consumer claims X
    with a quiet view; its heartbeat's refresh hangs (as in a process paused)
    and X's lock goes (deleted here, as if etcd expired it), which the quiet
    view does not hear.  The view starts watching and, X being its own live
    claim, checks nothing.  Then the refresh fails until the lock TTL has
    passed: the claim is lost, the heartbeat drops it, the view
    disowns X and checks its sign CONFIRM later, so X is offered again.  A
    view that kept trusting a lost claim's sign would hold X taken for as
    long as it watches."""
    from etcdq_v2.errors import Unavailable
    from etcdq_v2.viewstate import CONFIRM
    ttl = 2
    with Queue(etcd_url, queue_name, lock_ttl=ttl) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=ttl) as other:
        item_id = consumer.put("x")
        gate = threading.Event()

        def hung_refresh(state):
            gate.wait(10)
            return Unavailable("the refresh was held (a paused process)")

        consumer._protocol.confirm_in_time = hung_refresh  # type: ignore[method-assign]
        mine = consumer.claim(timeout=0)
        assert mine is not None and mine.id == item_id
        view = consumer._view
        assert not view.watching_locks and item_id in view.state.own
        other.etcd.delete(other._protocol.layout.key("locks", item_id))  # as if expired
        assert consumer.claim(timeout=0) is None  # starts watching, X its own
        assert view.watching_locks and item_id in view.state.own
        gate.set()
        got = hands_out(consumer, item_id, CONFIRM + 2 * ttl, other)
        assert mine.lost
        got.complete()


def test_an_item_released_elsewhere_comes_back_to_a_quiet_view_within_a_lock_ttl(
        etcd_url: str, queue_name: str) -> None:
    """another process claims the head of a
    quiet consumer's backlog and releases it (R0 keeps its claim token, R1
    deletes the lock).  The consumer's next relist of work/ reads the R0
    version as a claim and takes the item for running; it comes back at the
    once-per-lock-TTL listing of locks/, not at the relist.
    Bound: one lock TTL after the view's last listing of locks/."""
    ttl = 3
    with Queue(etcd_url, queue_name, lock_ttl=ttl) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=ttl) as other:
        consumer.put_many(range(300))
        first = consumer.claim(timeout=0)
        assert first is not None
        first.complete()
        view = consumer._view
        head = other.claim(timeout=0)  # the next head: the consumer's view holds it free
        assert head is not None
        head.release()
        view.relist_work()  # as after MISS_COST misses
        assert head.id in view.state.locks, "the relist read the R0 version as a claim"
        started = time.monotonic()
        got = []
        while time.monotonic() - started < 2 * ttl:
            claim = consumer.claim(timeout=0)
            assert claim is not None
            got.append(claim.id)
            claim.complete()
            if claim.id == head.id:
                break
            time.sleep(0.02)
        took = time.monotonic() - started
        assert head.id in got, f"released head not back within {2 * ttl} s"
        print(f"released head back after {took:.2f} s, {len(got) - 1} newer items first")
        assert took <= ttl + 1, f"back after {took:.1f} s, {len(got)} newer items first"


def test_claim_first_waiting_on_a_pending_confirm_sends_one_listing(
        etcd_url: str, queue_name: str, proxy) -> None:
    """claim_first over two queues whose first view plans a CONFIRM check
    (an item claimed elsewhere, read off work/ when it starts watching) wakes
    once for it, lists locks/ once, and then sends nothing while it waits:
    no loop of requests, no spin (until_due with _confirm_at reset)."""
    from etcdq_v2.queue import claim_first
    transport = connect(proxy.url, timeout=5.0)
    with Queue(transport, queue_name) as high, \
            Queue(transport, queue_name + "-low") as low, \
            Queue(etcd_url, queue_name, lock_ttl=60) as holder:
        high._ensure_view(), low._ensure_view()
        holder.put("x")
        held = holder.claim(timeout=0)
        assert held is not None
        before = len(proxy.requests)
        cpu = time.process_time()
        assert claim_first([high, low], timeout=4) is None
        cpu = time.process_time() - cpu
        sent = [line for line in proxy.requests[before:] if b"wait=true" not in line]
        held.complete()
        locks = [line for line in sent if b"/locks" in line]
        assert len(locks) == 1, sent  # the confirm, once
        assert len(sent) <= 6, sent
        assert cpu < 1.0, f"{cpu:.2f} s of CPU in a 4 s wait"


def test_lost_race_reply_applied_after_a_stream_restart_strands_the_item(
        etcd_url: str, queue_name: str, proxy) -> None:
    """The same strand through a watching view's own stream restart (a dropped
    connection, etcd ending the stream: drop_stream() here), one claiming thread.

    The view watches and holds X free.  A dead claimer's C1 lands on X; its
    event is slow to reach the consumer (held on the stream's connection), and
    so is the "already exists" reply to the consumer's own C1 on X.  The
    dead claimer's lock expires; the stream drops and the same follower
    subscribes and lists work/ again: no sign of X noted (the C1 event never
    came), no claim token, so neither locks/ nor a confirm.  Then the reply
    comes: locked_at(X, I), I below the new listing's index, X taken for good."""
    transport = connect(proxy.url, timeout=8.0)
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as dead, \
            Queue(transport, queue_name, lock_ttl=LOCK_TTL) as consumer:
        assert consumer.claim(timeout=0) is None
        view = consumer._view
        assert view.watching_locks
        item_id = producer.put("x")
        wait_until(lambda: view.state.is_free(item_id), 5, message="X's event")
        proxy.hold("down", match=rb'"action":"create","node":\{"key":"[^"]*/locks/'
                                 rb'|"errorCode":105')
        _dead_claimer_c1_only(dead, item_id, ttl=1)
        thread_a, outcome_a = in_background(lambda: consumer.claim(timeout=0), "claimer-a")
        wait_until(lambda: re.search(rb'"errorCode":105', proxy.held("down")), 5,
                   message="A's C1 answered 'already exists' (held)")
        assert view.state.is_free(item_id) or item_id in view.state.trying
        wait_until(lambda: dead._protocol.read("locks", item_id) is None, 5,
                   message="etcd expired the dead claimer's lock")
        relists = view.relists
        view._follower.drop_stream()
        wait_until(lambda: view.relists > relists, 5, message="the follower listed again")
        proxy.pass_through()
        thread_a.join(10)
        assert not thread_a.is_alive() and "raised" not in outcome_a, outcome_a
        if outcome_a["returned"] is not None:
            assert outcome_a["returned"].id == item_id
            outcome_a["returned"].complete()
            return
        got = hands_out(consumer, item_id, 2 * LOCK_TTL)
        got.complete()
