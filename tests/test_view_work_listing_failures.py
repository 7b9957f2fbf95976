"""While listings of work/ fail and the rest of etcd answers, a quiet view's
claims go on: a failed full listing is due again after the backoff of failed
listings of work/ (``_work_retry``), which a listing of locks/ does not reset;
a quiet view catches up with relist_work, staying ready, and offers its own
puts if that listing fails (QueueView._catch_up_quietly).

Also checked:

- No spin: a quiet view all of whose free items are stale, while listings of
  work/ fail, tries each item once, lists work/ once or twice (the gate),
  starves and watches; a claim returns None in bounded time, and hands out a
  new item once listings answer.
- A follower's listing answered before a relist's failure and applied after
  it lifts the backoff (and the miss count): one more failed listing, then
  the gate holds (no loop).
- A failed full listing followed by a miss's non-full listing that works:
  the full listing is still due (CONFIRM), made, and the dead worker's item
  handed out within seconds.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from helpers import (claim_one_of, in_background, pause_listing, record_calls, wait_until,
                     work_listing)

from etcdq_v2 import Queue
from etcdq_v2.errors import EtcdqError
from etcdq_v2.transport import connect

TIMEOUT, DEADLINE = 0.5, 0.6  # the consumer's request timeout and deadline (one try)


@contextlib.contextmanager
def _quiet(etcd_url: str, proxy_url: str, name: str, lock_ttl: int, items: int = 40
           ) -> Iterator[tuple[Any, ...]]:
    """A producer, ``other``, and a consumer through the fault proxy (a listing
    that is held fails within DEADLINE); ``items`` items put; the consumer's
    view quiet (a backlog).  Yields (producer, other, consumer, ids, view)."""
    with Queue(etcd_url, name, lock_ttl=lock_ttl) as producer, \
            Queue(etcd_url, name, lock_ttl=lock_ttl) as other, \
            Queue(connect(proxy_url, timeout=TIMEOUT, deadline=DEADLINE), name,
                  lock_ttl=lock_ttl) as consumer:
        ids = producer.put_many([{"b": n} for n in range(items)])
        view = consumer._ensure_view()
        assert not view.watching_locks and set(ids) <= set(view.state.items)
        yield producer, other, consumer, ids, view


def _checks_until(view: Any, done: Any, within: float) -> None:
    """What each claim round does first (check_locks), until ``done()``."""
    def step() -> bool:
        view.check_locks()
        return bool(done())
    wait_until(step, within, interval=0.02, message="check_locks to do it")


def test_a_delay_listing_of_locks_resets_the_backoff_of_failing_full_listings(
        etcd_url: str, queue_name: str, proxy: Any) -> None:
    """A failed listing of work/ in the
    once-per-lock-TTL (full) listing is made due again through
    ``_locks_unlisted_due``, i.e. on ``_locks_retry``, the backoff of failed
    listings of *locks/*.  Any listing of locks/ that works resets
    ``_locks_retry`` to 0 (``_reconcile_locks``, tests/test_view_locks_listing_backoff.py), including the
    delays-only listing check_locks makes whenever a delay lock of a known
    item is due (a worker that releases with a delay, a delayed put).  So
    while listings of work/ keep failing (the half-answering etcd the change
    is for: small requests answer, the big listing does not) and locks/ answers,
    the full listing never backs off past CONFIRM: a claim pays a listing's
    deadline about every second, not at most once per lock TTL as the commit
    and docs/protocol.md say ("CONFIRM, doubling up to a lock TTL").

    Measured on a674c4e: after three failed full listings (backoff 4 s) and
    one delay listing of locks/ that worked, the fourth failure made the next
    full listing due 1 s later (should be 8 s), and check_locks listed work/
    again within that.  On df428a7 it fails too (worse: a failed full listing
    raised from every claim, staying due)."""
    with _quiet(etcd_url, proxy.url, queue_name, lock_ttl=10) as (_, other, consumer, ids, view):
        held = other.claim(timeout=0)
        assert held is not None and held.id == ids[0]
        claim = consumer.claim(timeout=0)  # misses the head, lists work/ again, claims another
        assert claim is not None and ids[0] in view.state.locks and claim.id in view.state.locks
        listed = record_calls(view._protocol, "list")
        proxy.hold(match=work_listing(queue_name))
        try:
            for _ in range(3):  # the once-per-lock-TTL listing, each time it is due again
                try:
                    view.relist_work(full=True)
                except EtcdqError:
                    pass  # df428a7 raised
            assert listed.count("work") == 3, listed
            retry_before = view.state.locks_retry
            # A worker gives its item back to try it later: a delay lock the view plans.
            claim.release(delay=1)
            locks_before = listed.count("locks")
            _checks_until(view, lambda: listed.count("locks") > locks_before, 5)
            assert view.state.locks_retry == 0.0  # the listing of locks/ worked
            # The full listing is due again (4 s after the third failure): it fails.
            _checks_until(view, lambda: listed.count("work") >= 4, 8)
            failed_at = time.monotonic()
            due_in = view.state.locks_listed + view._protocol.lock_ttl - failed_at
            # Claims go on for a while (each round checks first) while work/ still fails.
            deadline = failed_at + 3.0
            while time.monotonic() < deadline and listed.count("work") == 4:
                view.check_locks()
                time.sleep(0.02)
            relisted = listed.count("work") - 4
        finally:
            proxy.pass_through()
        assert relisted == 0 and due_in >= 2 * retry_before - 0.5, (
            f"after a fourth failed listing of work/ (backoff was {retry_before:g} s), the "
            f"full listing was due again in {due_in:.1f} s and tried {relisted} more time(s) "
            f"within 3 s: a delay listing of locks/ reset its backoff (_locks_retry)")


def test_catch_up_while_listings_of_work_fail_fails_every_claim(
        etcd_url: str, queue_name: str, proxy: Any) -> None:
    """017af69 made a failed listing of
    work/ in relist_work let the claim go on with what the view holds; the
    other way a quiet view lists work/ from a claim, catch_up (a pipeline
    stage whose only free items are ones it put after its listing), still
    goes through relist(): it drops the view's readiness and replaces the
    follower, whose listing fails while listings of work/ fail; wait_ready
    raises Unavailable, and so does every later claim of the process (each
    after waiting out the deadline in _ensure_view) until a listing works,
    though the view holds a free item: the stage stops for the outage."""
    with _quiet(etcd_url, proxy.url, queue_name, lock_ttl=10) as (_, _other, stage, ids, _view):
        for _ in ids:  # a lone consumer: in put order, no miss, no listing
            claim = stage.claim(timeout=0)
            assert claim is not None
            claim.complete()
        own = stage.put("follow-up")  # after the view's listing: held back (FIFO)
        proxy.hold(match=work_listing(queue_name))
        failed: list[BaseException] = []
        got: list[str] = []
        try:
            claim_one_of(stage, got, failed, tries=3)
        finally:
            proxy.pass_through()
        assert not failed, (
            f"claims failed while only listings of work/ failed, the view holding item {own} "
            f"free: {failed}")
        assert got == [own]


# -- held ------------------------------------------------------------------------
def test_no_spin_a_stale_quiet_view_falls_back_to_watching_while_work_fails(
        etcd_url: str, queue_name: str, proxy: Any) -> None:
    """Every item the consumer's quiet view holds free is taken by another
    consumer; listings of work/ fail (held).  A claim misses (the first miss
    over the limit lists, fails, and backs off; the later ones list nothing),
    drops each stale item once, starves, and watches: it returns None in
    bounded time, having tried each item at most once and listed work/ a few
    times (no relist per miss, no spin).  Once listings answer, a new item is
    handed out by a waiting claim."""
    with _quiet(etcd_url, proxy.url, queue_name, lock_ttl=10, items=40) as (
            producer, other, consumer, ids, view):
        taken = [other.claim(timeout=0) for _ in ids]
        assert all(c is not None for c in taken)
        listed = record_calls(view._protocol, "list")
        tried = record_calls(consumer._protocol, "claim")
        proxy.hold(match=work_listing(queue_name))
        try:
            started = time.monotonic()
            assert consumer.claim(timeout=0) is None
            took = time.monotonic() - started
            work_listings = listed.count("work")
        finally:
            proxy.pass_through()
        assert len(tried) == len(set(tried)) <= len(ids), tried
        assert 1 <= work_listings <= 4, listed
        assert took < 10, took
        new = producer.put("new")
        claim = consumer.claim(timeout=15)
        assert claim is not None and claim.id == new
        claim.complete()
        for c in taken:
            c.complete()


def test_a_late_applied_listing_lifts_the_backoff_once_then_the_gate_holds(
        etcd_url: str, queue_name: str, proxy: Any) -> None:
    """A new quiet follower's listing of work/ is answered before a claim's
    relist of work/ fails, and applied after it (paused in between): it lifts
    the backoff (a674c4e: any listing applied).  It was a listing that worked,
    and it resets the miss count too: the next miss over the limit lists
    again and fails (one more deadline), and the gate is back (CONFIRM): the
    misses right after list nothing.  A cost of one listing, no loop."""
    with _quiet(etcd_url, proxy.url, queue_name, lock_ttl=10) as (_, other, consumer, _ids, view):
        reached, resume = pause_listing(view._protocol, "work", "etcdq-view")
        relister, outcome = in_background(lambda: view.relist(20), name="relister")
        assert reached.wait(10)
        # taken after the follower's listing: news to the view, each a miss
        held = [other.claim(timeout=0) for _ in range(10)]
        assert all(c is not None for c in held)
        listed = record_calls(view._protocol, "list")
        proxy.hold(match=work_listing(queue_name))
        try:
            view.behind(1.0)  # a miss over the limit: its listing fails
            assert listed.count("work") == 1 and view.state.relist_after > time.monotonic()
            resume.set()  # the follower's older listing is applied now
            relister.join(10)
            assert "raised" not in outcome, outcome
            assert view.state.relist_after == float("-inf") and view.state.misses == 0
            got: list[str] = []
            for _ in range(8):  # each misses some of other's items first
                claim = consumer.claim(timeout=0)
                assert claim is not None
                got.append(claim.id)
                claim.complete()
            work_listings = listed.count("work")
        finally:
            proxy.pass_through()
        assert work_listings == 2, listed  # one more failure, then the gate held
        assert not {c.id for c in held} & set(got)
        for c in held:
            c.complete()


def test_failed_full_then_working_miss_listing_still_frees_a_dead_workers_item(
        etcd_url: str, queue_name: str, proxy: Any) -> None:
    """A worker claimed the first item and died.  The consumer's quiet view
    holds it taken; its lock expires.  The once-per-lock-TTL listing fails
    (work/ held); listings answer again, and a miss's listing of work/ (not
    full) works first: it lifts the backoff but lists no locks/.  The full
    listing is still due (its own backoff, CONFIRM): check_locks makes it,
    and the dead worker's item is handed out within seconds."""
    with _quiet(etcd_url, proxy.url, queue_name, lock_ttl=2) as (_, crashed, consumer, ids, view):
        entry = crashed._protocol.read("work", ids[0])
        assert entry is not None
        assert crashed._protocol.claim(ids[0], entry.version) is not None
        view.relist_work()  # lists work/: the claim token says it is taken
        assert ids[0] in view.state.locks
        wait_until(lambda: crashed._protocol.read("locks", ids[0]) is None, 6,
                   message="the dead worker's lock to expire")
        wait_until(lambda: time.monotonic() - view.state.locks_listed >= 2, 5)
        listed = record_calls(view._protocol, "list")
        proxy.hold(match=work_listing(queue_name))
        try:
            view.check_locks()  # the full listing: fails
            assert listed.count("work") == 1 and ids[0] in view.state.locks
        finally:
            proxy.pass_through()
        wait_until(lambda: time.monotonic() >= view.state.relist_after, 3)
        relists = view.relists
        view.behind(1.0)  # a miss over the limit: lists work/ only, and works
        assert view.relists == relists + 1 and listed.count("locks") == 0
        assert ids[0] in view.state.locks
        started = time.monotonic()
        got: list[str] = []

        def handed_out() -> bool:
            claim = consumer.claim(timeout=0.2)
            if claim is None:
                return False
            got.append(claim.id)
            claim.complete()
            return claim.id == ids[0]

        wait_until(handed_out, 8, interval=0.0, message="the dead worker's item")
        assert time.monotonic() - started < 4, time.monotonic() - started
        assert len(got) == len(set(got))
