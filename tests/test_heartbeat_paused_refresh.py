"""A claim lost while its refresh is held up (its process paused before the
send) is disowned when it turns lost, on real etcd: the view stops trusting
the item's sign as its own live claim's then, another consumer takes the item
once etcd drops the lock, and the paused claim's complete() raises LockLost
(docs/protocol.md, **heartbeat**).  The pause is the refresh sleeping before
it calls the protocol: SIGSTOP would stop the test too.
"""
from __future__ import annotations

import threading
import time

import pytest

from etcdq_v2 import Queue
from etcdq_v2.errors import LockLost
from etcdq_v2.protocol import ClaimState

LOCK_TTL = 2
PAUSE = 5.0  # past lock_ttl, and past the other consumer's claim


def test_a_claim_whose_refresh_is_paused_past_lock_ttl_is_disowned_when_it_turns_lost(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as holder, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as other:
        item_id = holder.put("x")
        refresh = holder._protocol.confirm_in_time
        paused = threading.Event()

        def paused_refresh(state: ClaimState) -> object:
            paused.set()
            time.sleep(PAUSE)
            return refresh(state)

        holder._protocol.confirm_in_time = paused_refresh  # type: ignore[method-assign]
        before_c1 = time.monotonic()
        claim = holder.claim(timeout=5)
        assert claim is not None and claim.id == item_id
        assert paused.wait(LOCK_TTL), "the first refresh was not due within lock_ttl"
        time.sleep(max(LOCK_TTL + 0.5 - (time.monotonic() - before_c1), 0.0))
        assert holder._view is not None
        trusted = item_id in holder._view.state.own
        assert claim.lost
        taken = other.claim(timeout=8)
        assert taken is not None and taken.id == item_id
        taken.complete("other's")
        with pytest.raises(LockLost):
            claim.complete("paused")
        assert claim.outcome == "lost"
        assert not trusted, "half a second after the claim turned lost, its view still " \
                            "trusted the item's sign as its own live claim's"
