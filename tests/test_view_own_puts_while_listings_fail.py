"""A quiet view catches up with relist_work, staying ready, and offers its own
puts up to the held-back index, ``_own_upto``, when that listing fails or its
backoff is on (QueueView._catch_up_quietly); a failed full listing is due
again after ``_work_retry``:

- put order: a catch-up lists again a second after the last failure, whatever
  the misses' backoff, so own puts do not overtake older items once listings
  answer (docs/guarantees.md, "Order");
- a catch-up on a closed view raises Unavailable: no item is handed out on a
  closed queue;
- a watching view whose follower's last listing failed offers its own puts
  after waiting for their events, rather than relisting through a new,
  unready follower;
- threads sharing a view while listings fail hand out each item once and do
  not spin; a delayed own put is held by its delay lock; and ``_own_upto`` is
  dropped by the next listing that works.

Not tested, read: ``_own_upto`` cannot offer another producer's item the view
knows: a quiet view learns items above ``_known`` only from this process's
puts (added, delayed), and every listing sets ``_known`` and resets
``_own_upto``; a stale listing (taken before an own put, applied after) drops
that put from the view rather than offering others' items.
"""
from __future__ import annotations

import contextlib

import threading
import time
from collections.abc import Iterator
from typing import Any

from helpers import claim_one_of, in_background, wait_until, work_listing

from etcdq_v2 import Queue
from etcdq_v2.errors import EtcdqError
from etcdq_v2.transport import connect
from etcdq_v2.viewstate import CONFIRM

TIMEOUT, DEADLINE = 0.5, 0.6  # the consumer's request timeout and deadline (one try)


@contextlib.contextmanager
def _drained_stage(etcd_url: str, proxy_url: str, name: str, lock_ttl: int = 10,
                   items: int = 40) -> Iterator[tuple[Any, Any, Any]]:
    """A producer (direct) and a pipeline stage (through the proxy, with a
    Transport the test owns); ``items`` put by the producer and worked off by
    the stage alone, in put order, without listing: its view stays quiet and
    knows work/ up to its first listing.  Yields (producer, stage, view)."""
    transport = connect(proxy_url, timeout=TIMEOUT, deadline=DEADLINE)
    try:
        with Queue(etcd_url, name, lock_ttl=lock_ttl) as producer, \
                Queue(transport, name, lock_ttl=lock_ttl) as stage:
            ids = producer.put_many([{"b": n} for n in range(items)])
            view = stage._ensure_view()
            assert not view.watching_locks and set(ids) <= set(view.state.items)
            for item_id in ids:
                claim = stage.claim(timeout=0)
                assert claim is not None and claim.id == item_id
                claim.complete()
            assert not view.watching_locks
            yield producer, stage, view
    finally:
        transport.close()


def _claim_one(queue: Any, timeout: float = 0) -> Any | None:
    try:
        return queue.claim(timeout=timeout)
    except EtcdqError:
        return None


def test_own_puts_overtake_older_items_after_listings_answer_again(
        etcd_url: str, queue_name: str, proxy: Any) -> None:
    """A pipeline stage (a lone consumer that puts
    follow-ups through the same Queue) whose catch-up listings of work/ fail
    three times in a row (an outage: the backoff grows to 4 s) offers its own
    puts without them, as the new sentence of docs/guarantees.md allows.
    Then etcd answers listings of work/ again.  Another producer puts X, and
    the stage puts P after it.  catch_up's relist_work returns at once (the
    backoff of the failed listings, ``_relist_after``, is on: up to a lock
    TTL after the last failure), ``_known`` is below P, so ``_own_upto`` = P:
    the stage claims P before X, with etcd answering every listing.
    docs/guarantees.md keeps put order "while etcd answers its listings of
    work/" (the exception is "while they fail"); docs/protocol.md says "or
    its backoff is on": one of them is wrong, for up to a lock TTL (30 s by
    default) after each outage.  On a674c4e the catch-up relisted (relist):
    X first."""
    with _drained_stage(etcd_url, proxy.url, queue_name, lock_ttl=10) as (producer, stage, view):
        proxy.hold(match=work_listing(queue_name))
        try:
            for n in range(3):  # each catch-up listing fails; the backoff doubles (1, 2, 4 s)
                wait_until(lambda: time.monotonic() >= view.state.relist_after, 10)
                stage.put(f"own-{n}")
                claim = _claim_one(stage)  # a674c4e: Unavailable
                if claim is not None:
                    claim.complete()
        finally:
            proxy.pass_through()
        # etcd answers listings of work/ again (through the stage's own transport too)
        wait_until(lambda: stage._protocol.list("work") is not None, 10,
                   ignore=(EtcdqError,))
        # Fixed: a catch-up lists again a second (CONFIRM) after the last
        # failure, whatever the misses' backoff; the guarantee is put order
        # from a second after listings answer again.
        wait_until(lambda: time.monotonic() >= view.state.work_failed_at + CONFIRM, 10,
                   message="a second since the last failed listing")
        other = producer.put("other")  # put first
        own = stage.put("follow-up")  # put after it
        backoff_left = view.state.relist_after - time.monotonic()
        got: list[str] = []
        for _ in range(8):
            claim = _claim_one(stage, timeout=2)
            if claim is None:
                continue
            got.append(claim.id)
            claim.complete()
            if other in got and own in got:
                break
    assert other in got and own in got, got
    assert got.index(other) < got.index(own), (
        f"with etcd answering listings of work/, the stage claimed its own {own} before "
        f"{other}, put earlier by another producer: catch_up listed nothing, the backoff "
        f"of the failed listings had {backoff_left:.1f} s left (order: {got})")


def test_closing_the_queue_during_catch_up_hands_out_an_item_afterwards(
        etcd_url: str, queue_name: str, proxy: Any) -> None:
    """A claim catches up (its only free item is an
    own put newer than the view's listing) and its listing of work/ is under
    way (held: it fails after the deadline) when another thread closes the
    queue.  _catch_up_quietly returns once the listing ends, sets
    ``_own_upto`` (the listing failed), and catch_up returns True; the claim
    loop goes on, and claims the own put on the closed queue (the Transport
    is the caller's, so requests still work): the Claim is handed out after
    close(), its heartbeat thread closed, so its lock is never refreshed and
    expires under its handler; another consumer is handed the item while it
    runs.  On a674c4e, catch_up's relist() waited for a listing and raised
    Unavailable ("the queue was closed")."""
    with _drained_stage(etcd_url, proxy.url, queue_name, lock_ttl=2) as (_producer, stage, view):
        own = stage.put("follow-up")
        listing = threading.Event()
        original = stage._protocol.list

        def noting(kind: str, *args: Any, **kwargs: Any) -> Any:
            if kind == "work" and threading.current_thread().name in ("claimer", "etcdq-view"):
                listing.set()  # the catch-up's listing (a674c4e: its new follower's)
            return original(kind, *args, **kwargs)
        stage._protocol.list = noting
        proxy.hold(match=work_listing(queue_name))
        listing.clear()
        try:
            claimer, outcome = in_background(lambda: stage.claim(timeout=0), name="claimer")
            assert listing.wait(10)
            stage.close()
            closed_at = time.monotonic()
            claimer.join(10)
            assert not claimer.is_alive()
        finally:
            proxy.pass_through()
        handed = outcome.get("returned")
        if handed is not None:  # what it costs: the lock is not refreshed
            with Queue(etcd_url, queue_name, lock_ttl=2) as other:
                again = wait_until(lambda: other.claim(timeout=0), 10,
                                   message="the item to be free again")
                assert again.id == handed.id
                again.complete()
    assert handed is None, (
        f"claim() handed out {handed.id} (own put {own}) {time.monotonic() - closed_at:.1f} s "
        f"after the queue was closed during its catch-up (view closed: {view.state.closed}); "
        f"its lock was never refreshed and another consumer was handed the item while "
        f"it was still held: {outcome}")


def test_a_stage_that_ran_dry_while_listings_fail_fails_every_claim(
        etcd_url: str, queue_name: str, proxy: Any) -> None:
    """4eab8b4 lets a *quiet* view offer its own puts while
    listings of work/ fail; but a stage whose claim finds nothing (the queue
    ran dry for a moment: its follow-up not put yet) starves and starts
    watching, and the watching follower's listing fails: no event is ever
    applied, ``_known`` stays, yet the view is ready and watching.  The next
    follow-up P: candidates holds it back, catch_up (watching) waits a
    deadline for P's event, then relist(): the view is unready, Unavailable;
    every later claim raises in _ensure_view until a listing works, though
    the view holds P free.  So the fix holds for one follow-up, until the
    first dry moment.  (Same with a watching view whose stream drops while
    listings fail; and a delayed own put is not freed either: a watching
    view waits for its expire event.)"""
    with _drained_stage(etcd_url, proxy.url, queue_name, lock_ttl=10) as (_producer, stage, view):
        proxy.hold(match=work_listing(queue_name))
        failed: list[BaseException] = []
        got: list[str] = []
        try:
            first = stage.put("follow-up-1")
            claim = _claim_one(stage)  # 4eab8b4: offered without a listing
            if claim is not None:
                got.append(claim.id)
                claim.complete()
            _claim_one(stage)  # dry for a moment: starved, watching (its listing fails)
            second = stage.put("follow-up-2")
            claim_one_of(stage, got, failed, tries=3)
            watching = view.watching_locks
        finally:
            proxy.pass_through()
    assert not failed and got == [first, second], (
        f"while only listings of work/ failed, a stage that ran dry once (watching: "
        f"{watching}) had its claims raise {[type(e).__name__ for e in failed]} (got {got}), "
        f"its own item {second} free in the view: {failed[:1]}")


# -- held ------------------------------------------------------------------------
@contextlib.contextmanager
def _stage_with_backlog(etcd_url: str, proxy_url: str, name: str, backlog: int,
                        lock_ttl: int = 10) -> Iterator[tuple[Any, Any, Any, list[str]]]:
    """As _drained_stage, then ``backlog`` more items put by the producer and
    listed by the stage (a miss-free relist of work/): free, known, quiet."""
    with _drained_stage(etcd_url, proxy_url, name, lock_ttl) as (producer, stage, view):
        ids = producer.put_many([{"k": n} for n in range(backlog)])
        view.relist_work()
        assert set(ids) <= set(view.state.items) and not view.watching_locks
        yield producer, stage, view, ids


def test_threads_sharing_a_view_while_listings_fail_no_spin_no_double(
        etcd_url: str, queue_name: str, proxy: Any) -> None:
    """Four threads claim (timeout 0) from one stage (one Queue, one quiet
    view holding 40 known items) while listings of work/ fail; the stage
    has put 12 follow-ups.  Every item is handed out exactly once, the
    known ones and then the own puts (offered through ``_own_upto``), no
    claim raises, catch_up is called a bounded number of times (each call
    offers one more own put, or waits for another thread's listing), and
    the claimers' CPU time stays well below their wall time (no busy loop
    in catch_up while another thread's listing is under way)."""
    with _stage_with_backlog(etcd_url, proxy.url, queue_name, 40) as (_p, stage, view, known):
        calls: list[float] = []
        original = view.catch_up

        def counted(timeout: float) -> bool:
            calls.append(time.monotonic())
            return original(timeout)
        view.catch_up = counted
        proxy.hold(match=work_listing(queue_name))
        got: list[str] = []
        errors: list[BaseException] = []
        lock = threading.Lock()
        cpu: list[float] = []
        try:
            own = [stage.put(f"f{n}") for n in range(12)]
            everything = set(known) | set(own)

            def claimer() -> None:
                started = time.thread_time()
                try:
                    while not everything <= set(got):
                        try:
                            claim = stage.claim(timeout=0)
                        except EtcdqError as exc:
                            with lock:
                                errors.append(exc)
                            continue
                        if claim is None:
                            return  # dry: it starved (and watches)
                        with lock:
                            got.append(claim.id)
                        claim.complete()
                finally:
                    with lock:
                        cpu.append(time.thread_time() - started)
            started = time.monotonic()
            threads = [threading.Thread(target=claimer, name=f"c{n}", daemon=True)
                       for n in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            wall = time.monotonic() - started
            assert not any(thread.is_alive() for thread in threads)
        finally:
            proxy.pass_through()
    assert not errors, errors
    assert sorted(got) == sorted(everything), (len(got), len(everything))
    assert len(calls) <= 12 * 4 * 2, len(calls)
    assert sum(cpu) < 0.5 * wall * 4, (cpu, wall)


def test_a_delayed_own_put_is_held_by_its_delay_lock(
        etcd_url: str, queue_name: str, proxy: Any) -> None:
    """While listings of work/ fail, a quiet stage (20 known items, claimed
    one every 0.15 s, so it never runs dry) puts a delayed item D (delay 2
    s).  ``_own_upto`` never offers D before its delay lock expired: the
    delay lock (noted by QueueView.delayed) keeps it taken; once due, the
    listing of locks/ for due delays (which works) frees it; it is held back
    as an own put newer than the view's listing, and catch_up (whose
    listing fails) offers it: handed out after its delay, never before."""
    with _stage_with_backlog(etcd_url, proxy.url, queue_name, 20) as (_p, stage, _view, known):
        proxy.hold(match=work_listing(queue_name))
        handed: list[tuple[str, float]] = []
        try:
            put_at = time.monotonic()
            delayed = stage.put("later", delay=2)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and delayed not in [i for i, _ in handed]:
                claim = stage.claim(timeout=0)
                assert claim is not None, handed  # never dry meanwhile
                handed.append((claim.id, time.monotonic() - put_at))
                claim.complete()
                time.sleep(0.15)  # pacing: the backlog lasts past the delay
        finally:
            proxy.pass_through()
    at = dict(handed)
    assert delayed in at, handed
    assert at[delayed] >= 1.5, at[delayed]
    assert {i for i, _ in handed} - {delayed} <= set(known), handed


def test_own_upto_is_dropped_by_the_next_listing_that_works(
        etcd_url: str, queue_name: str, proxy: Any) -> None:
    """After a failed catch-up set ``_own_upto``, the queue runs dry and the
    view starts watching: its listing (which works) resets ``_own_upto``, and
    from then on put order holds: another producer's X before the stage's P
    (the watching catch_up waits for P's event, which comes after X's)."""
    with _drained_stage(etcd_url, proxy.url, queue_name, lock_ttl=10) as (producer, stage, view):
        proxy.hold(match=work_listing(queue_name))
        try:
            first = stage.put("own")
            claim = stage.claim(timeout=0)
            assert claim is not None and claim.id == first and view.state.own_upto >= int(first)
            claim.complete()
        finally:
            proxy.pass_through()
        assert stage.claim(timeout=0) is None  # dry: watching, listed
        assert view.watching_locks and view.state.own_upto == 0
        other = producer.put("other")
        own = stage.put("own-2")
        got = []
        for _ in range(4):
            claim = stage.claim(timeout=2)
            if claim is not None:
                got.append(claim.id)
                claim.complete()
            if len(got) == 2:
                break
    assert got == [other, own], got
