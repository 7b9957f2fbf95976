"""A listing of locks/ read by etcd before it was restored from an older
snapshot, and answered after the view applied a listing of the restored
etcd, is not applied (docs/protocol.md, "etcd's history changes"): its lock
signs are of the old history, at indexes no sign of the new one outweighs,
and would keep an item free in etcd taken in the view.

Real etcd: its data dir is copied while it is stopped (the snapshot, x free),
etcd's index goes far past it, another process claims x, and the copy is put
back (the restore).  The consumer reaches etcd through the real TCP proxy
(tests/faultproxy.py), which holds the reply of its listing of locks/ (the
one a quiet view makes for due delay locks) across the restore.
"""
from __future__ import annotations

import shutil
import threading
import time

from etcdq_v2 import Queue
from etcdq_v2.server import EtcdServer

from faultproxy import FaultProxy

#: The reply to a listing of locks/ (etcd writes the node's key first).
LOCKS_REPLY = rb'"node":\{"key":"[^"]*/locks","dir":true'


def test_a_listing_of_locks_read_before_a_restore_and_answered_after_it_is_not_applied(
        own_etcd: EtcdServer, proxy_factory, queue_name: str, tmp_path) -> None:
    snapshot = tmp_path / "snapshot"
    with Queue(own_etcd.url, queue_name) as producer:
        x = producer.put("x")
        own_etcd.stop()
        shutil.copytree(own_etcd.data_dir, snapshot)  # x free, no lock
        own_etcd.start()
        with Queue(own_etcd.url, queue_name + "-other") as elsewhere:
            elsewhere.put_many(range(100))  # etcd's index: far above the snapshot's
        z = producer.put("z")  # only in the old history
    proxy: FaultProxy = proxy_factory(own_etcd.url)
    with Queue(own_etcd.url, queue_name) as other, Queue(proxy.url, queue_name) as consumer:
        taken = other.claim(timeout=5)
        assert taken is not None and taken.id == x  # x's lock, high in the old history
        mine = consumer.claim(timeout=5)  # a quiet view: x taken, z free
        assert mine is not None and mine.id == z
        mine.complete()
        view = consumer._view
        assert view is not None and not view.watching_locks and x in view.state.locks
        high = view.state.known
        proxy.hold("down", match=LOCKS_REPLY)
        generation = view.state.generation
        listing = threading.Thread(target=view._list_locks, args=(generation,), daemon=True)
        listing.start()  # read by the old etcd (x locked); its reply held
        deadline = time.monotonic() + 10
        while not proxy.held("down"):
            assert time.monotonic() < deadline, "the reply of locks/ was never held"
            time.sleep(0.01)
        own_etcd.stop()
        shutil.rmtree(own_etcd.data_dir)
        shutil.copytree(snapshot, own_etcd.data_dir)
        own_etcd.start()  # etcd at the snapshot's index: x free, no lock; z never put
        view.relist_work()  # a claimer's relist, read by the restored etcd
        assert view.state.known < high, f"no listing of the restored etcd: {view.state.known}"
        assert view.state.is_free(x)
        proxy.release()
        listing.join(10)
        assert not listing.is_alive()
        assert view.state.is_free(x), (
            f"{x}, free in the restored etcd, is held locked at {view.state.locks.get(x)} by "
            f"the old etcd's listing of locks/ (the view's listing: {view.state.known})")
        again = consumer.claim(timeout=5)
        assert again is not None and again.id == x
        again.complete()
