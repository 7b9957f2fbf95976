"""A watching view with a free item among many running elsewhere keeps
watching (docs/protocol.md, "Modes: quiet and watching", Switches): the
backlog that makes it go quiet is of items free by its own rule, not of every
item it heard of since its listing.  Real etcd; the listings are counted at a
fault proxy between the consumer and etcd.
"""
from __future__ import annotations

from etcdq_v2 import Queue
from etcdq_v2.viewstate import BACKLOG

from faultproxy import FaultProxy
from helpers import wait_until, work_listing

#: Items another process holds while the consumer watches: more than a backlog.
HELD = BACKLOG + 8


def test_a_watching_consumer_that_claims_the_one_free_item_lists_nothing(
        etcd_url: str, queue_name: str) -> None:
    """The consumer starts watching (nothing to claim); another process puts
    HELD + 1 items, claims them all and releases the first, their lock events
    heard.  The consumer's claim takes that one free item, the head of its
    view, and lists nothing:
    going quiet would list work/ and locks/ now, and its next claim, which
    finds nothing, would start watching and list again."""
    with FaultProxy.to(etcd_url) as proxy, Queue(proxy.url, queue_name) as consumer, \
            Queue(etcd_url, queue_name) as other:
        assert consumer.claim(timeout=0) is None
        view = consumer._ensure_view()
        assert view.watching_locks
        ids = other.put_many(range(HELD + 1))
        held = [other.claim(timeout=5) for _ in range(HELD + 1)]
        assert [c.id for c in held if c is not None] == ids
        head = held.pop(0)
        assert head is not None
        head.release()  # the head free, the items after it locked: none dropped at the head
        index = other.etcd.put(f"{other.layout.root}/sentinel", "x").written_index
        wait_until(lambda: view.state.known >= index, 10, message="the consumer's events")
        listing = work_listing(queue_name)
        proxy.requests.clear()
        got = consumer.claim(timeout=0)
        assert got is not None and got.id == ids[0]
        got.complete()
        listings = [line for line in proxy.requests if listing.match(line)]
        assert view.watching_locks and not listings, (
            f"one free item of {HELD + 1}: the view went quiet and listed {listings}")
        for claim in held:
            assert claim is not None
            claim.complete()
