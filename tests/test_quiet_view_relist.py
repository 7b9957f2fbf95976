"""A quiet view whose listings of work/ fail while the rest of etcd answers
(a half-answering etcd: a big listing that times out, a proxy that drops it).

Before: relist_work raised, so every claim that missed once the view's miss
limit was reached failed with Unavailable, though the view held free items,
and paid a request's deadline for the listing each time.  Now the claim goes
on with what the view holds, and the listing is tried again after a backoff
(CONFIRM, doubling up to a lock TTL), as a failed listing of locks/ is."""
from __future__ import annotations

import time
from typing import List, Set

from helpers import quiet_view_whose_head_is_held, record_calls, wait_until, work_listing

from etcdq_v2.errors import EtcdqError
from etcdq_v2.viewstate import CONFIRM


def test_claims_go_on_while_listings_of_work_fail_and_the_listing_backs_off(
        etcd_url: str, queue_name: str, proxy) -> None:
    with quiet_view_whose_head_is_held(etcd_url, proxy.url, queue_name, lock_ttl=10,
                                       items=40) as (_, other, consumer, ids, view, held):
        held_by_other = [held] + [other.claim(timeout=0) for _ in range(9)]
        others: Set[str] = {claim.id for claim in held_by_other}
        assert len(others) == 10
        listed = record_calls(view._protocol, "list")
        proxy.hold(match=work_listing(queue_name))
        got: List[str] = []
        failed: List[BaseException] = []
        try:
            for _ in range(10):  # each misses some of others' items first
                try:
                    claim = consumer.claim(timeout=0)
                except EtcdqError as exc:
                    failed.append(exc)
                    continue
                assert claim is not None
                got.append(claim.id)
                claim.complete()
            work_listings = listed.count("work")
        finally:
            proxy.pass_through()
        assert not failed, failed
        assert len(got) == 10 and not others & set(got)
        # the first miss over the limit tried once; the rest waited for the backoff
        assert 1 <= work_listings <= 2, listed
        # listings answer again: once the backoff is over, a miss lists work/
        assert view.state.relist_after > time.monotonic() - CONFIRM
        wait_until(lambda: time.monotonic() >= view.state.relist_after, 2 * CONFIRM,
                   message="the backoff ends")
        view.behind(1.0)  # what the next miss over the limit does
        assert listed.count("work") == work_listings + 1
        for claim in held_by_other:
            claim.complete()
        while True:
            claim = consumer.claim(timeout=0)
            if claim is None:
                break
            got.append(claim.id)
            claim.complete()
        assert sorted(got + sorted(others)) == sorted(ids)
        assert len(got) == len(set(got))

