"""Hostile review rv17 of 2d18f68 (view: a watching view's CONFIRM check is
applied only if no listing of work/ came in since it was decided; _new_delayed
decodes the item instead of a text test for '"q":').

Every test here is an attack that HELD on 2d18f68 (test_rv17_held_*): each
passes, and would fail if the interleaving stranded the item, tried a delayed
item before its delay, or looped.
"""
from __future__ import annotations

import contextlib

import threading
import time

from helpers import hands_out, in_background, record_calls, wait_until

from etcdq_v2 import Queue
from etcdq_v2.codec import Lock, new_token

LOCK_TTL = 2


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
    assert view.watching_locks and item_id in view._locks
    assert view._confirm_at < float("inf")
    return view, item_id


def _check_in_background(view, stalled: _Stalled):
    """Run the due check (check_locks) in the stalled thread; wait until its
    listing of locks/ is answered and it is held before applying it."""
    wait_until(lambda: time.monotonic() >= view._confirm_at, 3, interval=0.01,
               message="the confirm is due")
    thread, outcome = in_background(view.check_locks, stalled.name)
    assert stalled.answered.wait(5)
    assert view._confirm_at == float("inf")  # decided: only this check covers Y now
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


def test_rv17_held_check_dropped_across_quiet_relist_and_back_to_watching(
        etcd_url: str, queue_name: str) -> None:
    """Held.  (a) with a change of follower: the check is decided by watching
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


def test_rv17_held_check_dropped_by_stream_restarts_is_not_needed_and_no_loop(
        etcd_url: str, queue_name: str) -> None:
    """Held.  (a) with the same follower, and the loop: while the check's
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
        # Y's lock (one of FEW_LOCKS; before the sixth pass of issue 14 it
        # listed locks/) and frees Y; later ones have no old sign left, so
        # they list work/ only.
        assert rounds == ["work", "work", "work"] and reads == [[item_id]], (rounds, reads)
        wait_until(lambda: view._is_free(item_id), 2, message="Y freed by a new round")
        stalled.go()
        thread.join(10)
        assert not thread.is_alive() and "raised" not in outcome, outcome
        assert view._is_free(item_id) and view._confirm_at == float("inf")
        got = hands_out(consumer, item_id, 2 * LOCK_TTL, other)
        got.complete()
        before = len(stalled.lists)
        assert consumer.claim(timeout=2.5) is None  # idle: past CONFIRM, nothing planned
        assert stalled.lists[before:] == [], stalled.lists[before:]


def test_rv17_held_check_answered_before_the_new_round_applies(
        etcd_url: str, queue_name: str) -> None:
    """Held.  (a) the other order: the check's listing (at L) is applied while
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
        wait_until(lambda: view._is_free(x_id), 5, message="X's event")
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
        wait_until(lambda: x_id in view._locks, 5, message="X's lock event")
        view._follower.drop_stream()  # X's expiry will go unheard by stream 1
        assert listing.wait(5)
        relists = view.relists
        wait_until(lambda: time.monotonic() >= view._confirm_at, 3, interval=0.01,
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


def test_rv17_held_new_delayed_item_decoded_whatever_its_payload(
        etcd_url: str, queue_name: str) -> None:
    """Held.  (b) _maybe_delayed: a delayed put whose payload is itself a dict
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
        assert delayed_id in view._locks and running_id in view._locks
        assert delayed_id not in tried and running_id not in tried, tried
        got = consumer.claim(timeout=3 + 2 * LOCK_TTL)
        assert got is not None and got.id == delayed_id, got
        assert tried.count(delayed_id) == 1, tried  # tried once: after its delay
        got.complete()
        running.complete()
