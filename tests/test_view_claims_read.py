"""A view reads others' claims off its listings of work/.

A claim's C2 writes its claim token into the item, so a listing of work/ shows
which items were claimed since the view's previous one: the view takes those for
running instead of listing locks/, which holds a lock TTL's worth of finished
items' lingering locks (F4 skipped) and cost every consumer at 64 of them.  A
view that starts watching checks the newer of those signs CONFIRM s later if
they are still there (docs/protocol.md, "Which listings read locks/").
"""
from __future__ import annotations

import time
from typing import Callable, List

from etcdq_v2 import Claim, Queue
from etcdq_v2.view import QueueView
from etcdq_v2.viewstate import CONFIRM

from helpers import record_calls, wait_until


def count_misses(view: QueueView) -> List[int]:
    counter = [0]
    original: Callable[[str], bool] = view.missed

    def counted(item_id: str) -> bool:
        counter[0] += 1
        return original(item_id)

    view.missed = counted  # type: ignore[method-assign]
    return counter


def hold(holder: Queue, count: int) -> List[Claim]:
    held = [holder.claim() for _ in range(count)]
    assert all(claim is not None for claim in held)
    return held  # type: ignore[return-value]


def test_a_quiet_relist_takes_items_claimed_elsewhere_without_listing_locks(
        etcd_url: str, queue_name: str) -> None:
    """A consumer lists a backlog of 400 (quiet), then another process claims 300
    of them for long jobs.  Its claims miss some of those, which makes it list
    work/ again: that listing shows the 300 carrying a claim token, so it takes
    them for running, and claims the free 99 without another miss.  Before,
    misses whose items were still in work/ made it list locks/ in full, and
    the relist told it nothing about the items it had not missed yet."""
    with Queue(etcd_url, queue_name) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=60) as holder:
        consumer.put_many(range(400))
        first = consumer.claim()
        view = consumer._view
        assert first is not None and view is not None and not view.watching_locks
        held = hold(holder, 300)
        lists, misses = record_calls(view._protocol, "list"), count_misses(view)
        relists = view.relists
        got = [first]
        while len(got) < 100:
            claim = consumer.claim()
            assert claim is not None, f"claimed only {len(got)} of the 100 free items"
            got.append(claim)
        assert not {claim.id for claim in got} & {claim.id for claim in held}
        assert view.relists > relists, "the misses should have made it list work/ again"
        assert "locks" not in lists, f"listed locks/ {lists.count('locks')} times while quiet"
        assert misses[0] <= view.state.miss_limit + 1, (
            f"{misses[0]} misses: the relist did not take the held items for running")


def keep_all(consumer: Queue, count: int) -> List[Claim]:
    """The consumer's first listing shows ``count`` items: it claims them all."""
    consumer.put_many(range(count))
    got = hold(consumer, count)
    assert consumer._view is not None and not consumer._view.watching_locks
    return got


def test_a_view_that_starts_watching_takes_claimed_items_for_running_for_a_while(
        etcd_url: str, queue_name: str) -> None:
    """A consumer claims the whole backlog it listed; another process then puts
    5 items and claims them.  The consumer finds nothing free and starts
    watching: its listing of work/ shows the 5 new items carrying a claim token,
    so it does not list locks/ (a lock TTL's worth of lingering locks, for
    each consumer at the end of every backlog, if every view that started
    watching did).  Both finish their items within
    CONFIRM: the events tell the view, and nothing is listed later either."""
    with Queue(etcd_url, queue_name) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=60) as holder:
        mine = keep_all(consumer, 10)
        view = consumer._view
        assert view is not None
        holder.put_many(range(5))
        held = hold(holder, 5)
        lists = record_calls(view._protocol, "list")
        assert consumer.claim() is None and view.watching_locks
        assert "locks" not in lists, "the view listed locks/ when it started watching"
        for claim in mine + held:
            claim.complete()
        wait_until(lambda: not view.state.items, 5, message="the completions' events")
        started = time.monotonic()
        while time.monotonic() - started < CONFIRM + 0.5:
            assert consumer.claim(timeout=0.2) is None
        assert "locks" not in lists, "the view listed locks/ though no item was left"


def test_an_item_released_before_the_view_started_watching_comes_back_within_confirm(
        etcd_url: str, queue_name: str) -> None:
    """The window the above opens: an item claimed elsewhere since the view's
    last listing and released before it starts watching is free in etcd, but
    the view takes it for running (its listing shows a claim token) and no
    event will say otherwise.  The view lists locks/ CONFIRM s after it started
    watching: a claim waiting meanwhile gets the item then."""
    with Queue(etcd_url, queue_name) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=60) as holder:
        mine = keep_all(consumer, 5)
        holder.put_many(range(3))
        held = hold(holder, 3)
        for claim in held[1:]:
            claim.complete()
        held[0].release()  # free in etcd, carrying the holder's claim token
        started = time.monotonic()
        claim = consumer.claim(timeout=CONFIRM + 5)
        took = time.monotonic() - started
        assert claim is not None and claim.id == held[0].id, (
            f"the released item did not come back within {CONFIRM + 5:g} s")
        assert took <= CONFIRM + 2, f"it came back {took:.1f} s later"
        for done in mine + [claim]:
            done.complete()


def test_a_view_that_starts_watching_reads_a_few_old_locks_instead_of_listing_locks(
        etcd_url: str, queue_name: str) -> None:
    """The end of a backlog: another process ran 39 of
    a consumer's 40 listed items, whose locks linger in locks/ (F4 skipped),
    and released the 40th after the consumer's listing had shown its lock.
    The consumer misses, lists work/ again (the 40th alone, taken on that old
    sign), finds nothing free and starts watching.  It reads that one lock,
    finds it gone and claims the item at once.  Before, it listed locks/: 40
    lingering locks for one item; at the end of a 2,000-item drain, 2,000."""
    with Queue(etcd_url, queue_name) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=60) as other:
        ids = other.put_many(range(40))
        held = other.claim()
        assert held is not None and held.id == ids[0]
        view = consumer._ensure_view()  # quiet; the first listing shows the held lock
        assert not view.watching_locks and held.id in view.state.locks
        while (claim := other.claim()) is not None:
            claim.complete()
        held.release()  # unheard: the consumer's view is quiet
        lists = record_calls(view._protocol, "list")
        reads = record_calls(view._protocol, "read_locks")
        started = time.monotonic()
        got = consumer.claim(timeout=0)
        assert got is not None and got.id == held.id, "the released item was not claimed"
        assert time.monotonic() - started < CONFIRM, "it waited for the CONFIRM check"
        assert view.watching_locks and "locks" not in lists, lists
        assert [list(ids) for ids in reads] == [[held.id]], reads
        since = view._follower.since  # the watch's X-Etcd-Index: reads at or after it count
        assert since is not None and since > 0
        got.complete()


def test_reads_of_locks_from_a_member_behind_the_stream_are_read_again_through_raft(
        etcd_url: str, queue_name: str) -> None:
    """Protocol.read_locks serves the reads from the member's own copy, and
    keeps each one at or after the index the stream began at; one behind it
    (a lagging member) is read again with quorum=true.  A lagging member
    cannot be made to order here, so an index past etcd's stands for it."""
    with Queue(etcd_url, queue_name) as queue:
        held, free = queue.put_many(["held", "free"])
        claim = queue.claim()
        assert claim is not None and claim.id == held
        quorums: List[bool] = []
        get_all = queue.etcd.get_all

        def record(keys, quorum=False):  # type: ignore[no-untyped-def]
            quorums.append(quorum)
            return get_all(keys, quorum=quorum)

        queue.etcd.get_all = record  # type: ignore[method-assign]
        now = queue.etcd.get(queue.layout.work, quorum=True).index
        found = queue._protocol.read_locks([held, free], since=now)
        assert [(i, lock is not None) for i, _, lock in found] == [(held, True), (free, False)]
        assert all(index >= now for _, index, _ in found) and quorums == [False]
        quorums.clear()
        ahead = now + 1000
        found = queue._protocol.read_locks([held, free], since=ahead)
        assert [(i, lock is not None) for i, _, lock in found] == [(held, True), (free, False)]
        assert quorums == [False, True], quorums
        claim.complete()
