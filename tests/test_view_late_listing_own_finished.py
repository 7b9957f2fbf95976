"""A consumer left alone claims in put order (docs/guarantees.md, "Order"):
an item it finished while its view's listing of work/ was under way is not
offered again when that listing arrives (a try at it would lose the race to
its own lingering lock, F4 skipped, and widen its window).  Real etcd; the
listing's reply is held at a fault proxy between the consumer and etcd.
"""
from __future__ import annotations

import re

from etcdq_v2 import Queue
from etcdq_v2.viewstate import BACKLOG

from faultproxy import FaultProxy
from helpers import wait_until

#: How late each request reaches etcd while the claim runs (a fault, not a bound).
UP_DELAY_MS = 300


def test_a_lone_consumer_does_not_retry_an_item_it_finished_during_its_listing(
        etcd_url: str, queue_name: str) -> None:
    """The consumer watches (nothing to claim); BACKLOG + 4 items come, heard
    as events.  Its next claim sees a backlog and goes quiet: the new round
    lists work/, and the reply is held while the claim takes and completes
    the head.  Released, the listing shows the head (taken before the claim);
    the next claims take the following items in order, none tries the head."""
    with FaultProxy.to(etcd_url) as proxy, Queue(proxy.url, queue_name) as consumer, \
            Queue(etcd_url, queue_name) as producer:
        assert consumer.claim(timeout=0) is None
        view = consumer._ensure_view()
        assert view.watching_locks
        ids = producer.put_many(range(BACKLOG + 4))
        wait_until(lambda: all(i in view.state.in_free for i in ids), 10,
                   message="the consumer heard the items")
        relists = view.state.relists
        # Every request reaches etcd UP_DELAY_MS late: the round's listing, sent
        # as the claim begins, is taken before the claim's C2 (one round trip
        # later); its reply is held until the claim is complete.
        proxy.delay(UP_DELAY_MS, "up")
        proxy.hold("down", match=re.compile(rb'"action":"get","node":\{"key":"/etcdq/'
                                            + re.escape(queue_name.encode())
                                            + rb'/work","dir":true'))
        first = consumer.claim(timeout=10)
        assert first is not None and first.id == ids[0]
        assert not view.watching_locks, "a backlog: the view went quiet"
        first.complete()
        put = re.compile(rb'"key":"/etcdq/' + re.escape(queue_name.encode()) + rb'/work/'
                         + ids[0].encode() + rb'","value":"(?:[^"\\]|\\.)*",'
                         + rb'"modifiedIndex":' + str(int(ids[0])).encode() + rb',')
        wait_until(lambda: put.search(proxy.held("down")), 10,
                   message=f"the held listing shows {ids[0]} as put (taken before C2)")
        proxy.release()
        proxy.delay(0, "up")
        wait_until(lambda: view.state.relists > relists, 10, message="the listing applied")
        proxy.requests.clear()
        got = []
        for _ in range(3):
            claim = consumer.claim(timeout=5)
            assert claim is not None
            got.append(claim.id)
            claim.complete()
        c1 = re.compile(rb"PUT /v2/keys/etcdq/" + re.escape(queue_name.encode())
                        + rb"/locks/" + ids[0].encode())
        retried = [line for line in proxy.requests if c1.match(line)]
        assert not retried and got == ids[1:4], (
            f"claims {got} after the listing; C1 of the finished {ids[0]}: {retried}")
