"""A lone consumer's view does not offer again an item it finished on a
restored etcd while the listing that tells it etcd's history changed was
under way (docs/protocol.md, "etcd's history changes"; the left marks of
"The view's state": **Order**, a lone consumer never tries its own finished
item).

Real etcd: its data dir is copied while it is stopped (the backup), the view
is told of indexes far past the backup's, and the copy is put back (the
restore).  The consumer reaches etcd through the real TCP proxy
(tests/faultproxy.py), which holds the reply of a relist of work/, read at
the restored etcd's index, while the consumer claims and completes the item
on the restored etcd.  The relist is the view's own (QueueView.relist_work,
of work/ only, as a claimer's after a miss), called from another thread.
"""
from __future__ import annotations

import re
import shutil
import threading

from helpers import wait_until

from etcdq_v2 import Queue
from etcdq_v2.server import EtcdServer
from etcdq_v2.transport import connect

from faultproxy import FaultProxy

#: The reply to a listing of work/ (etcd writes the node's key first).
_WORK_REPLY = re.compile(rb'"node":\{"key":"[^"]*/work","dir":true')
_NEVER = re.compile(rb"\A\Z(?!x)x")  # holds no new connection; the held one stays held


def test_an_item_finished_on_the_restored_etcd_is_not_offered_again_by_a_listing_read_before(
        own_etcd: EtcdServer, proxy_factory, queue_name: str, tmp_path) -> None:
    backup = tmp_path / "backup"
    proxy: FaultProxy = proxy_factory(own_etcd.url)
    with Queue(own_etcd.url, queue_name) as producer:
        x = producer.put("x")
        y = producer.put("y")
    own_etcd.stop()
    shutil.copytree(own_etcd.data_dir, backup)  # x and y free, no lock
    own_etcd.start()
    with Queue(own_etcd.url, queue_name + "-other") as elsewhere:
        elsewhere.put_many(range(100))  # etcd's index: far above the backup's
    with Queue(connect(proxy.url, timeout=30, deadline=90), queue_name) as consumer:
        first = consumer.claim(timeout=5)  # the view is made, and lists at the high index
        assert first is not None and first.id == x
        first.release()
        view = consumer._view
        assert view is not None
        high = view.state.highest
        own_etcd.stop()
        shutil.rmtree(own_etcd.data_dir)
        shutil.copytree(backup, own_etcd.data_dir)
        own_etcd.start()  # the restore: etcd at the backup's index, x and y free
        proxy.hold("down", match=_WORK_REPLY)
        relist = threading.Thread(target=view.relist_work, kwargs={"full": False})
        relist.start()
        try:
            wait_until(lambda: _WORK_REPLY.search(proxy.held("down")), 10,
                       message="the reply of the relist of work/ held")
            proxy.hold("down", match=_NEVER)
            claim = consumer.claim(timeout=10)  # on the restored etcd
            assert claim is not None and claim.id == x, claim
            claim.complete()  # its lock lingers (no F4)
        finally:
            proxy.release()
            relist.join(30)
        assert view.state.history == 1 and view.state.known < high, (
            view.state.history, view.state.known, high)
        assert not view.state.is_free(x), (
            f"{x}, completed by this consumer while the relist was under way, is offered "
            f"again after it (known {view.state.known}): its lingering lock costs a miss")
        again = consumer.claim(timeout=2)
        assert again is not None and again.id == y, again
        again.complete()
