"""An item this process gives back comes back on time to a quiet view.

A view with a backlog watches nothing (docs/protocol.md, "The consumer's
view"), so it hears no expiry of a delay lock.  Before the fix, an item
given back with ``release(delay)`` or ``fail()`` (a retry after a backoff)
stayed locked in the view of the very process that gave it back until the
view listed locks/ again: once per lock TTL (30 s by default), or when its
backlog ran out.  A lone consumer takes the head of its view, so the item
must be its next claim once etcd no longer holds it; before the fix the
next claim was the item after it.
"""
from __future__ import annotations

from typing import Callable

import pytest

from etcdq_v2 import Claim, Queue

from helpers import wait_until

#: Items in the queue: many more than view.BACKLOG, so the view stays quiet.
ITEMS = 100


def give_back_head(queue: Queue, give_back: Callable[[Claim], None]) -> str:
    """Put ITEMS items, claim the head, give it back; its id once etcd has let it go."""
    queue.put_many(range(ITEMS))
    claim = queue.claim(timeout=5)
    assert claim is not None and not queue._view.watching_locks  # quiet: a backlog
    give_back(claim)
    wait_until(lambda: queue._protocol.read("locks", claim.id) is None, 10,
               message="etcd still holds the given-back item's lock")
    return claim.id


@pytest.mark.parametrize("give_back", [
    pytest.param(lambda claim: claim.release(delay=1), id="release-delay"),
    pytest.param(lambda claim: claim.fail("again"), id="fail-backoff"),
])
def test_an_item_given_back_with_a_delay_is_the_next_claim_once_its_lock_expired(
        etcd_url: str, queue_name: str, give_back: Callable[[Claim], None]) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=30, backoff=(1,)) as queue:
        item_id = give_back_head(queue, give_back)
        again = queue.claim(timeout=5)
        assert again is not None and again.id == item_id, (
            f"expected {item_id} back at the head, got {again and again.id}")


def test_an_item_failed_with_no_backoff_is_the_next_claim(
        etcd_url: str, queue_name: str) -> None:
    """A backoff of 0 deletes the lock: the view is told at once, as for release()."""
    with Queue(etcd_url, queue_name, lock_ttl=30, backoff=(0,)) as queue:
        item_id = give_back_head(queue, lambda claim: claim.fail("again"))
        again = queue.claim(timeout=5)
        assert again is not None and again.id == item_id, (
            f"expected {item_id} back at the head, got {again and again.id}")
