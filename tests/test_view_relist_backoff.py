"""Misses back off before listing work/ again after a failed listing
(``_relist_after``), and any listing of work/ the view applies lifts that
backoff (ViewState.take_listing), the once-per-lock-TTL full listing
included: a view whose listings answer again is not left stale.

Also checked:

- KeyboardInterrupt (any BaseException not etcd's) in a relist of work/ is
  raised, ends the listing (``_listing`` cleared) and sets no backoff.
- A starved claim that waits for another thread's relist of work/ is woken
  when that listing fails, and goes on to watch: it hands out the item put
  meanwhile long before its timeout.
- The once-per-lock-TTL listing whose listing of work/ fails is due again
  CONFIRM later, not lost: a taken item whose lock expired (its worker died)
  is handed out once listings answer again.
- Gone(by_us=True) is raised for an item another consumer finished (a quiet
  view's cached value carried F1's outcome; the finisher resumed and did
  F2-F3 after the view freed it): the claim "finishes" it again (F2 finds the
  record, F3 finds it gone), and it counts as no miss.  A misclassification,
  but harmless: the view forgets the item, nothing is stranded, nothing is
  recorded or run twice.
"""
from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from helpers import (
    in_background,
    quiet_view_whose_head_is_held,
    record_calls,
    wait_until,
    work_listing,
)

from etcdq_v2 import Queue
from etcdq_v2.errors import EtcdqError, Unavailable
from etcdq_v2.protocol import COMPLETED, Gone
from etcdq_v2.transport import connect


def _behind_lists(view: Any, listed: list[Any]) -> bool:
    """What a miss over the limit does (view.behind); True if it listed work/."""
    before = listed.count("work")
    try:
        view.behind(1.0)
    except EtcdqError:
        pass  # before 017af69 a failed listing raised
    return listed.count("work") > before


def test_a_listing_of_work_that_works_does_not_lift_the_relist_backoff(
        etcd_url: str, queue_name: str, proxy: Any) -> None:
    """Three misses over the limit whose listings of work/ fail (held by the
    proxy; each costs the request's deadline, 3 s): the backoff grows to 4 s.  Listings
    answer again, and the once-per-lock-TTL listing (full) lists work/ and
    locks/: it works.  The next miss over the limit must list work/ again:
    the backoff is for listings that fail.  On 017af69 it lists nothing,
    gated by the failed listings' ``_relist_after`` for about 4 s more
    (up to a lock TTL after more failures)."""
    with quiet_view_whose_head_is_held(etcd_url, proxy.url, queue_name, lock_ttl=10,
                                       items=40) as (_, _other, _consumer, _ids, view, _held):
        listed = record_calls(view._protocol, "list")
        proxy.hold(match=work_listing(queue_name))
        try:
            for _ in range(3):  # each waits out the backoff of the one before
                wait_until(lambda: _behind_lists(view, listed), 15,
                           message="a miss over the limit that lists work/")
        finally:
            proxy.pass_through()
        relists = view.relists
        view.relist_work(full=True)  # check_locks' once-per-lock-TTL listing
        assert view.relists == relists + 1, "the full listing worked"
        worked_at = time.monotonic()
        gate = view.state.relist_after - worked_at
        assert _behind_lists(view, listed), (
            f"a miss right after a listing of work/ that worked listed nothing: the failed "
            f"listings' backoff still gates it for {gate:.1f} s (_work_retry="
            f"{view.state.work_retry})")


def test_a_keyboard_interrupt_in_a_relist_ends_it_and_sets_no_backoff(
        etcd_url: str, queue_name: str) -> None:
    """A relist of work/ interrupted by KeyboardInterrupt raises it, clears
    ``_listing`` (no starved claim waits for it), and the next miss lists."""
    with Queue(etcd_url, queue_name, lock_ttl=10) as queue:
        queue.put_many(range(40))
        view = queue._ensure_view()
        assert not view.watching_locks
        original = view._protocol.list
        interrupted: list[str] = []

        def interrupting(kind: str, *args: Any, **kwargs: Any) -> Any:
            if kind == "work" and not interrupted:
                interrupted.append(kind)
                raise KeyboardInterrupt
            return original(kind, *args, **kwargs)

        view._protocol.list = interrupting
        with pytest.raises(KeyboardInterrupt):
            view.behind(1.0)
        assert interrupted and not view.state.listing
        listed = record_calls(view._protocol, "list")
        relists = view.relists
        view.behind(1.0)
        assert listed.count("work") == 1 and view.relists == relists + 1


def test_a_starved_claim_waiting_for_a_failing_relist_goes_on_to_watch(
        etcd_url: str, queue_name: str) -> None:
    """The consumer's quiet view knows no free item; another producer's item
    is in etcd.  Another thread's relist of work/ is under way (its listing
    stalls, then fails); a claim that starves waits for it, is woken by the
    failure, watches, and hands out the item within a few seconds (timeout 20)."""
    with Queue(etcd_url, queue_name, lock_ttl=10) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=10) as consumer:
        producer.put_many(range(40))
        view = consumer._ensure_view()
        for _ in range(40):
            claim = consumer.claim(timeout=0)
            assert claim is not None
            claim.complete()
        assert not view.watching_locks
        new = producer.put("new")
        original = view._protocol.list
        stalled, fail = threading.Event(), threading.Event()

        def stalling(kind: str, *args: Any, **kwargs: Any) -> Any:
            if kind == "work" and threading.current_thread().name == "lister":
                stalled.set()
                assert fail.wait(20)
                raise Unavailable("the listing failed (test)")
            return original(kind, *args, **kwargs)

        view._protocol.list = stalling
        lister, listed = in_background(lambda: view.relist_work(), name="lister")
        assert stalled.wait(10)
        claimer, claimed = in_background(lambda: consumer.claim(timeout=20), name="claimer")
        # the claim starved and waits on the view's condition for the listing
        wait_until(lambda: len(view._cond._waiters) > 0, 5, message="the claim to wait")
        assert view.state.listing and claimer.is_alive()
        started = time.monotonic()
        fail.set()
        claimer.join(20)
        lister.join(5)
        took = time.monotonic() - started
        assert "raised" not in listed, listed  # goes on with what the view holds
        got = claimed.get("returned")
        assert got is not None and got.id == new, claimed
        assert took < 10, took
        got.complete()


def test_a_failed_once_per_ttl_listing_is_due_again_and_frees_a_dead_workers_item(
        etcd_url: str, queue_name: str, proxy: Any) -> None:
    """A worker claimed the first item and died (no heartbeat): the consumer's
    quiet view holds it taken.  Its lock expires; the once-per-lock-TTL
    listing comes while listings of work/ fail (held): the claim goes on
    with other items.  Once listings answer, the listing is due again
    (CONFIRM later) and the item is handed out, within a few seconds."""
    with Queue(etcd_url, queue_name, lock_ttl=2) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=2) as crashed:
        ids = producer.put_many(range(40))
        entry = crashed._protocol.read("work", ids[0])
        assert entry is not None
        assert crashed._protocol.claim(ids[0], entry.version) is not None
        with Queue(connect(proxy.url, timeout=1.0), queue_name, lock_ttl=2) as consumer:
            view = consumer._ensure_view()
            assert not view.watching_locks and ids[0] in view.state.locks
            wait_until(lambda: crashed._protocol.read("locks", ids[0]) is None, 5,
                       message="the dead worker's lock to expire")
            wait_until(lambda: time.monotonic() - view.state.locks_listed >= 2, 5)
            listed = record_calls(view._protocol, "list")
            proxy.hold(match=work_listing(queue_name))
            got: list[str] = []
            try:
                claim = consumer.claim(timeout=0)  # its check_locks lists, and fails
                assert claim is not None and claim.id != ids[0]
                got.append(claim.id)
                claim.complete()
                assert listed.count("work") == 1
            finally:
                proxy.pass_through()
            started = time.monotonic()

            def handed_out() -> bool:
                claim = consumer.claim(timeout=0.2)
                if claim is None:
                    return False
                got.append(claim.id)
                claim.complete()
                return claim.id == ids[0]

            wait_until(handed_out, 8, interval=0.0, message="the dead worker's item")
            assert time.monotonic() - started < 8
            assert len(got) == len(set(got))


def test_an_item_finished_by_another_since_the_view_cached_its_commit_is_a_miss_and_strands_nothing(
        etcd_url: str, queue_name: str) -> None:
    """A finisher commits the first item (F1) and stalls; the consumer's quiet
    view lists it (taken: F1's value carries the claim), and once the
    finisher's lock expired its once-per-lock-TTL listing frees it, with
    F1's value cached.  The finisher resumes: F2, F3.  The consumer's claim
    tries the item: its cached value has an outcome, so before finishing it
    for its finisher it reads the item again, finds it gone and raises
    Gone(by_us=False): another consumer finished it, a miss.  The claim goes
    on to the next item, the view forgets the first, one record, no rerun."""
    with Queue(etcd_url, queue_name, lock_ttl=2) as producer, \
            Queue(etcd_url, queue_name, lock_ttl=2) as finisher:
        ids = producer.put_many(range(40))
        protocol = finisher._protocol
        entry = protocol.read("work", ids[0])
        assert entry is not None
        state = protocol.claim(ids[0], entry.version)
        assert state is not None
        committed: list[Any] = []
        real_finish_committed = protocol.finish_committed
        protocol.finish_committed = lambda *args: committed.append(args)  # stalls after F1
        protocol.finish(state, COMPLETED, result="done")
        protocol.finish_committed = real_finish_committed
        assert len(committed) == 1
        with Queue(etcd_url, queue_name, lock_ttl=2) as consumer:
            view = consumer._ensure_view()
            assert not view.watching_locks and ids[0] in view.state.locks
            wait_until(lambda: protocol.read("locks", ids[0]) is None, 5,
                       message="the finisher's lock to expire")
            wait_until(lambda: time.monotonic() - view.state.locks_listed >= 2, 5)
            view.check_locks()  # the once-per-lock-TTL listing: free, F1's value cached
            assert view.state.is_free(ids[0])
            real_finish_committed(*committed[0])  # the finisher resumes: F2, F3
            gones: list[Gone] = []
            real_claim = consumer._protocol.claim

            def claim(*args: Any) -> Any:
                try:
                    return real_claim(*args)
                except Gone as exc:
                    gones.append(exc)
                    raise

            consumer._protocol.claim = claim
            misses = record_calls(view, "missed")
            got = consumer.claim(timeout=0)
            assert got is not None and got.id != ids[0]
            got.complete()
            assert [g.by_us for g in gones] == [False] and len(misses) == 1, misses
            assert ids[0] not in view.state.items
            assert producer.get(ids[0]).state == COMPLETED
            assert producer.stats()[COMPLETED] == 2
