"""A won C2 whose Claim was never handed out (its construction raised: the
heartbeat could not start its thread) leaves no item trusted as a live
claim's (ViewState.own): nothing keeps that lock, and no heartbeat will ever
disown it.  Against a real etcd.
"""
from __future__ import annotations

import time
from typing import Any

import pytest
from helpers import wait_until

from etcdq_v2 import Queue
from etcdq_v2.viewstate import CONFIRM

LOCK_TTL = 30  # the consumer's: its quiet view's full listing is not due in the test
OTHER_TTL = 1  # the other process's lock expires soon


def test_an_item_is_freed_once_its_lock_goes_after_a_claim_that_raised(
        etcd_url: str, queue_name: str) -> None:
    """1. The consumer's quiet view lists X; its claim wins C2 on X, then
       Claim() raises (heartbeat.add: "can't start new thread"): no claim,
       nothing keeps the lock.
    2. That lock goes (deleted here, as its expiry would), unheard by the
       quiet view.  Another process claims X (C2: a claim token) and dies:
       its lock expires a second later, X is free in etcd.
    3. The consumer finds nothing free and starts watching: X is taken on a
       sign from before its listing, so it is checked at once or CONFIRM
       later, and X is handed out."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=OTHER_TTL) as other:
        item_id = consumer.put("x")
        view = consumer._ensure_view()
        assert view.state.is_free(item_id) and not view.watching_locks
        heartbeat = consumer._heartbeat
        real_add = heartbeat.add

        def add(claim: Any) -> None:
            heartbeat.add = real_add  # type: ignore[method-assign]
            raise RuntimeError("can't start new thread")

        heartbeat.add = add  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="new thread"):
            consumer.claim(timeout=0)
        consumer.etcd.delete(consumer._protocol.layout.key("locks", item_id))
        taken = other.claim(timeout=5)
        assert taken is not None and taken.id == item_id
        taken.abandon()  # the other process dies: its lock expires unrefreshed
        wait_until(lambda: other._protocol.read("locks", item_id) is None, 5,
                   message="etcd expired the other process's lock")
        assert consumer.claim(timeout=0) is None  # X taken in the view: starts watching
        assert view.watching_locks
        time.sleep(CONFIRM + 1.0)
        claim = consumer.claim(timeout=2)
        assert claim is not None and claim.id == item_id
        claim.complete()
