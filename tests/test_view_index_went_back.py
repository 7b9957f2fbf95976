"""A watching view goes on offering what is put after etcd came back at a
lower X-Etcd-Index (restarted without its data, or restored from an older
snapshot).

Each listing of work/ is older or newer than the listing last applied by
real time first (docs/protocol.md, "Events and transitions": one read before
that one was sent is dropped, one sent after it was read is taken whatever
its index, and one that overlapped it is taken if its index is as high).  Real etcd,
stopped and started again on the same port with its data dir wiped; the
consumer reaches it through the real TCP proxy (tests/faultproxy.py), which
refuses it meanwhile, so that the item put after the restart is in the
follower's next listing and in no event of its next stream.
"""
from __future__ import annotations

import shutil

from etcdq_v2 import Queue
from etcdq_v2.server import EtcdServer

from faultproxy import FaultProxy


def test_a_watching_view_offers_an_item_put_after_etcd_came_back_at_a_lower_index(
        own_etcd: EtcdServer, proxy_factory, queue_name: str) -> None:
    proxy: FaultProxy = proxy_factory(own_etcd.url)
    with Queue(own_etcd.url, queue_name) as producer, \
            Queue(proxy.url, queue_name) as consumer:
        ids = producer.put_many(range(200))
        for _ in ids:
            claim = consumer.claim(timeout=5)
            assert claim is not None
            claim.complete()
        assert consumer.claim() is None  # nothing left: the view watches the queue
        view = consumer._view
        assert view is not None and view.watching_locks
        high = view.state.known
        proxy.refuse()  # the follower's stream ends; it cannot list again yet
        own_etcd.stop()
        shutil.rmtree(own_etcd.data_dir)
        own_etcd.start()
        item_id = producer.put("after the restart")
        assert int(item_id) < high  # etcd's index went back
        proxy.restart()  # the same round subscribes and lists again: only its listing has it
        claim = consumer.claim(timeout=10)
        assert claim is not None, (
            f"the view never offered {item_id}, put at a lower index than its "
            f"listing at {high} (known: {view.state.known})")
        assert claim.id == item_id
        claim.complete()
