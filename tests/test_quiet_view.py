"""The quiet view under attack: an item stranded, a claim hung, an idle consumer kept busy.

A view with a backlog watches nothing (docs/protocol.md, "The consumer's
view").  Each test reproduces, against a real etcd, a way the first version
of that stranded an item, hung a claim, or kept an idle consumer busy; the
docstrings tell the interleaving as it was found, before the fix.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import time
from typing import List

import pytest

from etcdq_v2 import Claim, Queue, Worker, connect
from etcdq_v2.codec import Lock
from etcdq_v2.errors import EtcdqError, Unavailable
from etcdq_v2.view import QueueView
from etcdq_v2.viewstate import BACKLOG, _is_delay

from faultproxy import FaultProxy
from helpers import in_background, wait_until


def lock_creates(proxy: FaultProxy) -> List[bytes]:
    return [line for line in proxy.requests if line.startswith(b"PUT ") and b"/locks/" in line]


#: Items held in the hang tests: many more than BACKLOG.
HELD = 200


def claim_in_background(queue: Queue, timeout: float, held: List[Claim], wait: float = 8.0):
    """Run queue.claim(timeout) in a thread for up to ``wait`` s; then release ``held``
    (which ends a hung claim: it gets one of them) and report."""
    started = time.monotonic()
    thread, outcome = in_background(lambda: queue.claim(timeout=timeout))
    thread.join(wait)
    hung = thread.is_alive()
    took = time.monotonic() - started
    for claim in held:
        claim.release()
    thread.join(15)
    return hung, took, outcome


def hold_all_then_claim(proxy: FaultProxy, holder: Queue, consumer: Queue, timeout: float):
    """``holder`` puts HELD items and claims them all; then ``consumer`` (through
    ``proxy``) claims with ``timeout`` (see claim_in_background): hung, took,
    outcome, and the lock creates sent meanwhile."""
    holder.put_many(range(HELD))
    held = [holder.claim() for _ in range(HELD)]
    assert all(c is not None for c in held)
    proxy.requests.clear()
    hung, took, outcome = claim_in_background(consumer, timeout, held)
    return hung, took, outcome, len(lock_creates(proxy))


def test_claim_timeout_0_returns_when_this_queue_holds_every_item(
        etcd_url: str, queue_name: str) -> None:
    """A Queue holds HELD items (a Worker with high concurrency, long jobs).  Its next
    claim(timeout=0) must return None at once.

    Now it never returns while the items are held: nothing free -> starved -> the view
    watches the whole directory, whose listing forgets every lock (_forget_locks) and
    bumps the version, so claim() `continue`s without looking at its deadline; the
    forgotten items are >= BACKLOG free-looking ids in _in_free, so candidates()
    switches back to quiet (whose listing does not list locks/); each held item is
    tried (C1 "already exists" on our own lock), each miss relists work/ (miss_limit
    is 1 below 450 items); all locked again -> starved -> watching -> forget -> ..."""
    with FaultProxy.to(etcd_url) as proxy, Queue(proxy.url, queue_name) as queue:
        hung, took, outcome, sent = hold_all_then_claim(proxy, queue, queue, 0)
        assert not hung, (f"claim(timeout=0) still running after {took:.1f} s, all "
                          f"{HELD} items held by this very Queue; {sent} failed lock "
                          f"creates meanwhile")
        assert outcome == {"returned": None}, outcome


def test_claim_with_a_timeout_returns_when_every_item_is_held_elsewhere(
        etcd_url: str, queue_name: str) -> None:
    """The same from another consumer: HELD items, each held by another process.
    claim(timeout=1) must return None after about 1 s, having tried each item at
    most a couple of times.  Now it runs for as long as they are held (hundreds of
    failed lock creates and dozens of listings of work/ a second)."""
    with FaultProxy.to(etcd_url) as proxy, Queue(proxy.url, queue_name) as consumer, \
            Queue(etcd_url, queue_name) as holder:
        hung, took, outcome, sent = hold_all_then_claim(proxy, holder, consumer, 1)
        listings = len([line for line in proxy.requests
                        if line.startswith(b"GET ") and b"wait=true" not in line])
        assert not hung, (f"claim(timeout=1) still running after {took:.1f} s, every "
                          f"item held elsewhere: {sent} failed lock creates and "
                          f"{listings} listings meanwhile")
        assert outcome == {"returned": None}, outcome
        assert sent <= 2 * HELD, f"{sent} failed lock creates for {HELD} held items"



def test_a_worker_stops_while_every_item_is_held_elsewhere(
        etcd_url: str, queue_name: str) -> None:
    """What the hang above does to a Worker: its claim_first(timeout=claim_timeout)
    never returns while HELD items run elsewhere, so stop() (a rolling deploy's
    SIGTERM) is not noticed and run() does not return, nor does run(until_empty=True)
    -- and meanwhile the idle worker hammers etcd."""
    with Queue(etcd_url, queue_name) as queue, Queue(etcd_url, queue_name) as holder:
        holder.put_many(range(HELD))
        held = [holder.claim() for _ in range(HELD)]
        assert all(c is not None for c in held)
        worker = Worker(queue, lambda payload: None, claim_timeout=0.5,
                        install_signal_handlers=False)
        thread, outcome = in_background(worker.run)
        time.sleep(1)
        worker.stop()
        thread.join(6)
        hung = thread.is_alive()
        for claim in held:
            claim.release()
        worker.stop(grace=False)
        thread.join(15)
        assert not hung, "Worker.run() did not return within 6 s of stop()"
        assert "returned" in outcome, outcome


@pytest.mark.parametrize("own_delayed_puts", [False, True])
def test_a_released_item_comes_back_to_a_quiet_view_while_delay_locks_fall_due(
        etcd_url: str, queue_name: str, own_delayed_puts: bool) -> None:
    """A quiet view lost the race for X (C1 "already exists": X taken in the view).
    X's holder releases it; X is free in etcd.  The view frees X at its once-per-
    lock-TTL listing (check_locks "stale": now - _locks_listed >= lock_ttl).

    But the delay-only listing of locks/ (check_locks "due", _list_locks with
    delays=True) frees only items with a known delay lock, and still sets
    _locks_listed (_reconcile_locks).  A consumer that puts a delayed item now and
    then (a pipeline stage scheduling retries; own fail()/release(delay) backoffs
    do the same once listed) keeps a delay lock falling due more often than once
    per lock TTL: the full listing never comes, and X stays taken in the view for as
    long as the view is quiet (until its backlog is drained), however long that is.
    With own_delayed_puts=False this is the control: X comes back within a lock TTL."""
    with Queue(etcd_url, queue_name, lock_ttl=2) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=2) as holder, \
            Queue(etcd_url, queue_name) as look:
        consumer.put_many(range(4 * BACKLOG))
        consumer.claim().complete()  # the view is up, quiet
        held = holder.claim()
        other = consumer.claim()  # tries the head, held.id: "already exists"; takes another
        assert other is not None and other.id != held.id
        assert held.id in consumer._view.state.locks
        other.release()
        held.release()  # X is free in etcd; the quiet view hears nothing of it
        assert look._protocol.read("locks", held.id) is None
        last_put = 0.0

        def claims_x() -> bool:
            nonlocal last_put
            if own_delayed_puts and time.monotonic() - last_put > 0.5:
                consumer.put("scheduled for later", delay=1)
                last_put = time.monotonic()
            claim = consumer.claim()
            assert claim is not None
            if claim.id == held.id:
                claim.complete()
                return True
            claim.release()
            return False

        deadline = time.monotonic() + 4 * 2  # two lock TTLs: 4 s; give it 8
        while not claims_x():
            if time.monotonic() > deadline:
                view = consumer._view
                pytest.fail(f"the released item {held.id} did not come back in 8 s; "
                            f"taken in the view: {held.id in view.state.locks}; its lock in "
                            f"etcd: {look._protocol.read('locks', held.id)}; last listing "
                            f"of locks/ {time.monotonic() - view.state.locks_listed:.1f} s ago")
            time.sleep(0.1)
        assert not consumer._view.watching_locks



def test_a_released_item_comes_back_to_a_quiet_view_while_others_back_off(
        etcd_url: str, queue_name: str) -> None:
    """The same stranding with nothing unusual in this process: other consumers'
    failing items retry after a 1 s backoff (fail()'s R1 turns the claim's lock
    into a delay lock, ttl 1; written here directly, as R1 leaves it, on items at
    the tail of the backlog).  The quiet view's listing of locks/ sees such a delay
    lock of a known item, so a delay-only listing falls due about every second, and
    each one sees the next backoff's delay lock: the once-per-lock-TTL full listing
    never comes.  X, locked at the view's listing (held by another consumer, then
    released), stays taken in the view for as long as it is quiet."""
    with Queue(etcd_url, queue_name, lock_ttl=2) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=2) as holder, \
            Queue(etcd_url, queue_name) as look:
        x = holder.put("X")
        backlog = holder.put_many(range(4 * BACKLOG))
        held = holder.claim()
        assert held.id == x
        stop = threading.Event()

        def others_back_off() -> None:
            for n in itertools.count():
                if stop.wait(0.3):
                    return
                item_id = backlog[-1 - n % 10]
                with contextlib.suppress(EtcdqError):  # still backing off: fine
                    look.etcd.put(look.layout.key("locks", item_id),
                                  Lock("another-worker", f"t{n}", delay=True).encode(),
                                  ttl=1, prev_exist=False)

        thread = threading.Thread(target=others_back_off, daemon=True)
        thread.start()
        try:
            wait_until(lambda: any(_is_delay(e.value) for e in look._protocol.list("locks")[1]),
                       5, message="a backoff's delay lock")
            first = consumer.claim()  # the view lists: X locked, a delay lock due soon
            assert first is not None and first.id != x
            view = consumer._view
            assert x in view.state.locks and view.state.delays and not view.watching_locks
            first.release()
            held.release()  # X is free in etcd; the quiet view hears nothing of it
            deadline = time.monotonic() + 4 * 2  # two lock TTLs: 4 s; give it 8
            while True:
                claim = consumer.claim()
                assert claim is not None
                if claim.id == x:
                    break
                claim.release()
                if time.monotonic() > deadline:
                    pytest.fail(f"the released item did not come back in 8 s; taken in "
                                f"the view: {x in view.state.locks}; its lock in etcd: "
                                f"{look._protocol.read('locks', x)}; last listing of "
                                f"locks/ {time.monotonic() - view.state.locks_listed:.1f} s ago")
                time.sleep(0.1)
        finally:
            stop.set()
            thread.join(5)


@pytest.mark.alone  # timing: a busy machine stretches its fault's window past its bounds
def test_a_quiet_view_forgets_locks_of_items_finished_elsewhere_while_delay_locks_fall_due(
        etcd_url: str, queue_name: str) -> None:
    """The same root cause, as memory: each delay-only listing of locks/
    (_reconcile_locks with delays=True) marks every listed lock's item taken --
    other consumers' running items, and (F4 dropped) finished items' lingering
    locks -- and removes none of them but delay-locked ones.  Only the full listing
    once per lock TTL removes the rest, and it never comes while delay locks fall
    due more often (see the test above).  So _locks grows with every item other
    consumers run, for as long as the view stays quiet (a worker with a standing
    backlog: days).  Expected: after two lock TTLs, no item that left work/ (and
    whose lock is gone) is still in _locks."""
    with Queue(etcd_url, queue_name, lock_ttl=2) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=2) as other, \
            Queue(etcd_url, queue_name) as look:
        consumer.put_many(range(4 * BACKLOG))
        consumer.claim().complete()  # the view is up, quiet
        view = consumer._view
        last_put = 0.0

        def tick() -> None:
            nonlocal last_put
            if time.monotonic() - last_put > 0.5:
                consumer.put("scheduled for later", delay=1)
                last_put = time.monotonic()
            claim = consumer.claim()
            assert claim is not None
            claim.release()

        finished_elsewhere: List[str] = []
        for _ in range(6):  # the other consumer runs batches of 5 items, ~0.6 s each
            batch = [other.claim() for _ in range(5)]
            started = time.monotonic()
            while time.monotonic() - started < 0.6:
                tick()
                time.sleep(0.05)
            for claim in batch:
                finished_elsewhere.append(claim.id)
                claim.complete()
        started = time.monotonic()
        while time.monotonic() - started < 2 * 2:  # two lock TTLs
            tick()
            time.sleep(0.05)
        work = {entry.id for entry in look._protocol.list("work")[1]}
        locks = {entry.id for entry in look._protocol.list("locks")[1]}
        stale = [i for i in view.state.locks if i not in work and i not in locks]
        assert not stale, (f"{len(stale)} items finished elsewhere (gone from work/ and "
                           f"locks/) still taken in the quiet view's _locks "
                           f"({len(view.state.locks)} entries)")


def test_an_idle_consumer_sends_nothing_while_items_run_elsewhere(
        etcd_url: str, queue_name: str) -> None:
    """An idle consumer (nothing claimable: a few items, each running elsewhere with a
    long job, whose heartbeats make no events) must send etcd nothing while it waits.

    Its watch of the whole directory ends after idle_timeout without events (60 s by
    default; 1 s here, QueueView's own parameter) or when a member restarts, and the
    follower subscribes and lists again.  That listing now reads work/ only and
    forgets every lock (_forget_locks), and bumps the version: the waiting claim
    wakes and tries every running item again (C1 "already exists" each).  So an idle
    consumer sends one failed lock create per running item per minute of silence
    (64 idle consumers, 64 long jobs: ~4,000 failed writes a minute), and with
    BACKLOG or more running items the flapping of the first test on top."""
    few = BACKLOG // 2
    with FaultProxy.to(etcd_url) as proxy, Queue(proxy.url, queue_name) as consumer, \
            Queue(etcd_url, queue_name) as holder:
        holder.put_many(range(few))
        held = [holder.claim() for _ in range(few)]
        assert all(c is not None for c in held)
        consumer._view = QueueView(consumer._protocol, idle_timeout=1.0)
        assert consumer.claim(timeout=2) is None  # learnt (by missing) that all are held
        assert consumer._view.watching_locks
        proxy.requests.clear()
        try:
            assert consumer.claim(timeout=5) is None  # idle: 5 s, ~4 silent stream ends
        finally:
            for claim in held:
                claim.release()
        sent = lock_creates(proxy)
        listings = [line for line in proxy.requests
                    if line.startswith(b"GET ") and b"wait=true" not in line]
        assert not sent, (f"an idle consumer sent {len(sent)} lock creates in 5 s for "
                          f"{few} running items ({len(listings)} listings)")
        # Each silent end of the stream (about one a second here) lists work/ and
        # locks/ once: no more.
        assert len(listings) <= 2 * 6, listings


def test_a_requeue_right_after_a_dead_letter_does_not_wait_out_the_lingering_lock(
        etcd_url: str, queue_name: str) -> None:
    """Without F4, a dead-lettered item's lock (its last claim's) stays in locks/ for
    up to the worker's lock_ttl.  requeue's Q0 creates locks/<id> with prevExist=false
    and waits for any lock there, up to ITS OWN lock_ttl + deadline, then raises
    Unavailable ("dead letter stayed locked").  So an operator's requeue (etcdq
    requeue, the dashboard) right after a dead letter blocks for up to lock_ttl, and
    fails outright when the worker's lock_ttl is longer than the requeuer's plus its
    deadline (workers at 60 s, the CLI at its default 30 s + 15 s).  Here: worker
    lock_ttl 20 s, requeuer 1 s with a 2 s deadline."""
    with Queue(etcd_url, queue_name, lock_ttl=20, max_attempts=1) as worker, \
            Queue(connect(etcd_url, timeout=1, deadline=2), queue_name,
                  lock_ttl=1) as operator:
        item_id = worker.put("poison")
        claim = worker.claim()
        claim.fail("boom")
        assert claim.outcome == "dead-lettered"
        assert operator.get(item_id).state == "failed"
        started = time.monotonic()
        try:
            new_id = operator.requeue(item_id)
        except Unavailable as exc:
            pytest.fail(f"requeue of a dead letter failed after "
                        f"{time.monotonic() - started:.1f} s: {exc}")
        assert operator.get(new_id).state == "pending"
        assert time.monotonic() - started < 5


# -- an item given back with a delay comes back on time to its own quiet view -----------

#: How late an item held by a delay lock may come back to a consumer working
#: through a backlog: etcd rounds TTLs up and sweeps every 0.5 s, the view lists
#: locks/ 0.2 s later again; the rest is a loaded machine.  docs/protocol.md
#: ("Delay locks") measured 0.62-0.65 s.
PROMPT = 3.0
#: lock_ttl of the consumers: the once-per-lock-TTL listing of locks/ must not be
#: what frees the item within PROMPT.
LOCK_TTL = 20


def work_through_until(consumer: Queue, item_id: str, due: float, bound: float) -> float:
    """Claim (and release) the consumer's other items until ``item_id`` comes; seconds
    after ``due`` (time.monotonic()) it came.  Fails after ``bound`` s past due."""
    while True:
        claim = consumer.claim()
        assert claim is not None
        if claim.id == item_id:
            claim.complete()
            return time.monotonic() - due
        claim.release()  # the backlog stays: the view stays quiet
        if time.monotonic() > due + bound:
            view = consumer._view
            pytest.fail(f"item {item_id} not claimed {bound:g} s after its delay ended, "
                        f"while the consumer claimed others (taken in the view: "
                        f"{item_id in view.state.locks}, its expiry known: "
                        f"{item_id in view.state.delays}, view watching: {view.watching_locks})")
        time.sleep(0.02)


def test_a_delayed_item_put_while_the_view_watched_comes_promptly_once_it_is_quiet(
        etcd_url: str, queue_name: str) -> None:
    """An idle consumer watches the whole directory.  Another producer puts a
    delayed item D (its lock's create event: D taken in the view, no expiry noted:
    only listings of locks/ plan delay locks, _plan_delays), then a backlog.  The
    consumer's next claim sees the backlog and goes quiet: the quiet listing reads
    work/ only, and D is no new item (_new_delayed), so locks/ is not listed.  No
    event will say D's lock expired, and _delays has no entry for it: D comes back
    only at the once-per-lock-TTL full listing, up to lock_ttl after its delay,
    while the consumer claims the items put after it.  docs/protocol.md ("Delay
    locks"): 0.62-0.65 s.  A switch whose listing read locks/ too brought D back
    0.23 s late (lock_ttl 10 s, delay 1 s); this one, 8.7 s."""
    delay = 3
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer, \
            Queue(etcd_url, queue_name) as producer:
        assert consumer.claim(timeout=0.3) is None
        assert consumer._view.watching_locks
        item_id = producer.put("later", delay=delay)
        due = time.monotonic() + delay
        producer.put_many(range(8 * BACKLOG))
        wait_until(lambda: item_id in consumer._view.state.locks, 5,
                   message="the delay lock's event")
        late = work_through_until(consumer, item_id, due, PROMPT + 1)
        assert not consumer._view.watching_locks, "the backlog should have kept it quiet"
        assert late <= PROMPT, f"claimed {late:.1f} s after its delay"


def test_a_quiet_view_that_missed_others_long_running_claims_lists_work_a_few_times(
        etcd_url: str, queue_name: str) -> None:
    """A consumer's view listed a backlog of N free items (its first claim), then
    other workers claimed all of them for long jobs (their heartbeats make no events;
    the quiet view hears nothing anyway).  Its next claim tries items, each a lost
    race (C1 "already exists"), a miss; every miss_limit misses (about N/300) it
    lists work/ again.  But a listing of work/ cannot tell a running item from a
    free one, and every item is still there: the relist changes nothing, the miss
    limit stays N/300, and the claim goes on trying the rest.  One claim(timeout=0.5)
    that finds nothing thus sends N failed lock creates (as a view that watched
    everything did) plus about 300 listings of the whole of work/ (302 GETs of
    3,000 items, 4.8 s, where a view that watched everything made 2 GETs in 1.1 s).  Expected: a relist that shows the
    misses' items still in work/ reads locks/ (one listing) instead of more of
    the same; the claim returns about when its timeout ends."""
    n = 2000
    with Queue(etcd_url, queue_name) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=60) as holder:
        consumer.put_many(range(n))
        first = consumer.claim()  # the view lists the whole backlog: quiet
        assert first is not None and not consumer._view.watching_locks
        held = 0
        while holder.claim() is not None:  # long jobs elsewhere, never finished here
            held += 1
        assert held == n - 1
        first.complete()
        consumer.etcd.requests.clear()
        started = time.monotonic()
        assert consumer.claim(timeout=0.5) is None
        took = time.monotonic() - started
        sent = dict(consumer.etcd.requests)
        assert sent.get("GET", 0) <= 5, (f"one claim(timeout=0.5) listed work/ "
                                         f"{sent.get('GET', 0)} times ({n} items each) "
                                         f"and sent {sent.get('PUT', 0)} lock creates in "
                                         f"{took:.1f} s")
