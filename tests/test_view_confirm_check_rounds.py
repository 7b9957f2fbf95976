"""A watching view's CONFIRM check is applied only if no listing of work/ came
in since it was decided: a check's listing answered late, across a stream
restart, a quiet relist or a return to watching, strands nothing and loops
not; and whether a new item may be delayed is read from the decoded item, not
from a text test on its payload.

Each test forces its interleaving against a real etcd (the proxy holding the
check's listing, or a stalled thread); the first tells it as it went before
the rule.
"""
from __future__ import annotations

import contextlib
import re
import threading
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


def test_confirm_listing_applied_after_a_stream_restart_strands_the_item(
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

    The guard `follower is self._follower` does not cover a follower's own
    stream restart, and _gone only items the view held taken."""
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
        assert view.watching_locks and view.state.confirm_at < float("inf")
        item_id = producer.put("x")
        wait_until(lambda: view.state.is_free(item_id), 5, message="X's event")
        # Slow: stream 1's event of X's lock, and any listing that shows it.
        proxy.hold("down", match=re.compile(rb"/locks/" + item_id.encode()))
        wait_until(lambda: time.monotonic() >= view.state.confirm_at, 3, interval=0.01,
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


def test_payload_with_a_q_key_makes_listings_read_locks(
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


def test_an_idle_watching_stage_putting_delayed_items_sends_no_loop(
        etcd_url: str, queue_name: str, proxy) -> None:
    """a pipeline stage that waits in claim() (watching) while it puts
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


def _claimed_by_the_dead(producer: Queue, dead: Queue, payload: object) -> str:
    """An item claimed (C1, C2: it carries a claim token) by a claimer that then
    died: its 1 s lock expires and the item stays in work/ with its token."""
    item_id = producer.put(payload)
    entry = dead._protocol.read("work", item_id)
    state = dead._protocol.claim(item_id, entry.version)  # no heartbeat
    assert state is not None
    wait_until(lambda: dead._protocol.read("locks", item_id) is None, 5,
               message="etcd expired the dead claimer's lock")
    return item_id


class _Stalled:
    """Wraps the view's protocol.list: a listing of locks/ made in a thread
    named ``name`` gets its reply, then waits for :meth:`go` before returning
    (the checking claimer descheduled, or its reply slow on the way)."""

    def __init__(self, view, name: str) -> None:
        self.view, self.name = view, name
        self.answered, self.resume = threading.Event(), threading.Event()
        self.lists: list = []
        self._original = view._protocol.list
        view._protocol.list = self  # type: ignore[method-assign]

    def __call__(self, kind, *args, **kwargs):
        self.lists.append((threading.current_thread().name, kind))
        reply = self._original(kind, *args, **kwargs)
        if kind == "locks" and threading.current_thread().name == self.name:
            self.answered.set()
            assert self.resume.wait(20)
        return reply

    def go(self) -> None:
        self.resume.set()


def _watching_with_a_confirm(consumer: Queue, producer: Queue, dead: Queue):
    """The consumer starts watching with one item Y taken on a sign read off
    work/ (a dead claimer's token; its lock expired before the watch began):
    only the CONFIRM check frees Y.  (view, Y)"""
    view = consumer._ensure_view()  # quiet, empty: Y is new to it
    item_id = _claimed_by_the_dead(producer, dead, {"y": 1})
    assert consumer.claim(timeout=0) is None  # starts watching; Y taken, no locks/ listing
    assert view.watching_locks and item_id in view.state.locks
    assert view.state.confirm_at < float("inf")
    return view, item_id


def _check_in_background(view, stalled: _Stalled):
    """Run the due check (check_locks) in the stalled thread; wait until its
    listing of locks/ is answered and it is held before applying it."""
    wait_until(lambda: time.monotonic() >= view.state.confirm_at, 3, interval=0.01,
               message="the confirm is due")
    thread, outcome = in_background(view.check_locks, stalled.name)
    assert stalled.answered.wait(5)
    assert view.state.confirm_at == float("inf")  # decided: only this check covers Y now
    return thread, outcome


@contextlib.contextmanager
def _a_held_check(etcd_url: str, queue_name: str):
    """A watching consumer whose due check of Y (see _watching_with_a_confirm)
    runs in a stalled thread, its listing of locks/ answered and held:
    (consumer, other, view, Y, the stall, the thread, its outcome)."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=1) as dead, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as other, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer:
        view, item_id = _watching_with_a_confirm(consumer, producer, dead)
        stalled = _Stalled(view, "checker")
        thread, outcome = _check_in_background(view, stalled)
        yield consumer, other, view, item_id, stalled, thread, outcome


def test_check_dropped_across_quiet_relist_and_back_to_watching(
        etcd_url: str, queue_name: str) -> None:
    """With a change of follower: the check is decided by watching
    follower W1 at round r; before it applies, the view goes quiet (follower Q
    lists: relists r+1), a quiet relist_work lists work/ again (r+2), and the
    view starts watching again (W2 lists: r+3).  The check is dropped (W1 is
    not the follower; its round is old too).  W2's listing does not rely on
    it: Y's sign (the C2 index, read off work/ by W1's listing) is <= the
    _known of Q's relist, so W2 lists locks/ (_noted_before), and frees Y.
    In general a sign the check covered is <= _confirm_upto <= _known, so any
    later watching listing (of the same follower after a stream restart, or
    of a new one after a quiet spell) lists locks/ for it."""
    with _a_held_check(etcd_url, queue_name) as (consumer, other, view, item_id, stalled,
                                                 thread, outcome):
        relists = view.relists
        view._watch(locks=False).wait_listed(5)  # quiet (a backlog came)
        assert not view.watching_locks and view.relists == relists + 1
        view.relist_work()  # misses: the quiet view lists work/ again
        assert view.relists == relists + 2
        view.starved(5)  # nothing free: watching again
        wait_until(lambda: view.relists == relists + 3, 5, message="W2's listing")
        stalled.go()
        thread.join(10)
        assert not thread.is_alive() and "raised" not in outcome, outcome
        assert view.watching_locks
        got = hands_out(consumer, item_id, 2 * LOCK_TTL, other)
        got.complete()


def test_check_dropped_by_stream_restarts_is_not_needed_and_no_loop(
        etcd_url: str, queue_name: str) -> None:
    """With the same follower, and the loop: while the check's
    listing is held, the stream restarts three times (each round lists work/,
    relists moves on; the first reads Y's lock, its sign being <= _known).
    The held check is then dropped; Y is free already; no confirm is left
    planned, and an idle waiting claim sends no listing (no re-plan loop)."""
    with _a_held_check(etcd_url, queue_name) as (consumer, other, view, item_id, stalled,
                                                 thread, outcome):
        reads: list = []
        read_locks = view._protocol.read_locks
        view._protocol.read_locks = lambda ids, *args: (
            reads.append(list(ids)) or read_locks(ids, *args))
        for _ in range(3):
            relists = view.relists
            view._follower.drop_stream()
            wait_until(lambda before=relists: view.relists > before, 5, message="the follower listed again")
        rounds = [kind for name, kind in stalled.lists if name == "etcdq-view"]
        # The first new round checks Y itself (Y's sign is <= _known): it reads
        # Y's lock (one of FEW_LOCKS) and frees Y; later ones have no old sign left, so
        # they list work/ only.
        assert rounds == ["work", "work", "work"] and reads == [[item_id]], (rounds, reads)
        wait_until(lambda: view.state.is_free(item_id), 2, message="Y freed by a new round")
        stalled.go()
        thread.join(10)
        assert not thread.is_alive() and "raised" not in outcome, outcome
        assert view.state.is_free(item_id) and view.state.confirm_at == float("inf")
        got = hands_out(consumer, item_id, 2 * LOCK_TTL, other)
        got.complete()
        before = len(stalled.lists)
        assert consumer.claim(timeout=2.5) is None  # idle: past CONFIRM, nothing planned
        assert stalled.lists[before:] == [], stalled.lists[before:]


def test_check_answered_before_the_new_round_applies(
        etcd_url: str, queue_name: str) -> None:
    """The other order: the check's listing (at L) is applied while
    the follower's new round is under way (its stream ended, its listing not
    in yet): relists has not moved, so it is applied; a lock it shows (X's,
    created by a claimer that died before C2) expires after L, before the new
    stream subscribes.  The new round lists locks/ (X's sign, the lock's own
    index, is noted before) and frees X: no sign from the check outlives the
    next round."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=1) as dead, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as other, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer:
        view, y_id = _watching_with_a_confirm(consumer, producer, dead)
        x_id = producer.put("x")
        wait_until(lambda: view.state.is_free(x_id), 5, message="X's event")
        # The follower's next listing of work/ waits until the check applied.
        gate, listing = threading.Event(), threading.Event()
        original = view._protocol.list

        def slow_rounds(kind, *args, **kwargs):
            reply = original(kind, *args, **kwargs)
            if kind == "work" and threading.current_thread().name == "etcdq-view":
                listing.set()
                assert gate.wait(20)
            return reply

        view._protocol.list = slow_rounds  # type: ignore[method-assign]
        dead._protocol._create_lock(x_id, Lock(dead.node_id, new_token()), 1)  # C1, dies
        wait_until(lambda: x_id in view.state.locks, 5, message="X's lock event")
        view._follower.drop_stream()  # X's expiry will go unheard by stream 1
        assert listing.wait(5)
        relists = view.relists
        wait_until(lambda: time.monotonic() >= view.state.confirm_at, 3, interval=0.01,
                   message="the confirm is due")
        view.check_locks()  # applied: the round has not moved
        assert view.relists == relists
        wait_until(lambda: dead._protocol.read("locks", x_id) is None, 5,
                   message="etcd expired X's lock")
        # X's sign may be the check's (lock index) or the event's: either is old.
        gate.set()
        wait_until(lambda: view.relists > relists, 5, message="the new round")
        for item_id in (y_id, x_id):
            got = hands_out(consumer, item_id, 2 * LOCK_TTL, other)
            got.complete()


def test_new_delayed_item_decoded_whatever_its_payload(
        etcd_url: str, queue_name: str) -> None:
    """_maybe_delayed: a delayed put whose payload is itself a dict
    with a key "q" (decoded: "q" at the top level, so delayed), a junk value
    that contains '"q":' (not decoded: not delayed), and an item claimed
    elsewhere that carries "q" and a claim token (a delayed item now running),
    all new to a view that starts watching: its listing reads locks/ (for the
    delayed ones), so no claim tries the delayed item before its delay, the
    running one is not tried either, and the delayed one is handed out after
    its delay."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=30) as runner, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer:
        view = consumer._ensure_view()  # quiet, empty
        tried = record_calls(consumer._protocol, "_create_lock")
        running_id = producer.put_many([{"q": "search"}], delay=1)[0]
        delayed_id = producer.put_many([{"q": "later"}], delay=3)[0]
        junk_key = producer._protocol.layout.key("work", "00000000000000000001")
        producer.etcd.put(junk_key, '{"q":1, not json')
        wait_until(lambda: producer._protocol.read("locks", running_id) is None, 5,
                   message="the first delay")
        running = runner.claim(timeout=3)
        assert running is not None and running.id == running_id
        assert consumer.claim(timeout=0) is None  # starts watching: lists work/ and locks/
        assert view.watching_locks
        assert delayed_id in view.state.locks and running_id in view.state.locks
        assert delayed_id not in tried and running_id not in tried, tried
        got = consumer.claim(timeout=3 + 2 * LOCK_TTL)
        assert got is not None and got.id == delayed_id, got
        assert tried.count(delayed_id) == 1, tried  # tried once: after its delay
        got.complete()
        running.complete()
