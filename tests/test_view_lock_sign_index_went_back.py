"""A view offers an item that is free after etcd was restored from an older
snapshot, though it saw the item claimed, at a higher index, before the
restore (docs/protocol.md, "Events and transitions": a listing of work/ sent
after the applied one was read is applied at any index, and a listing or
read of locks/ without the item's lock frees it).

Real etcd: its data dir is copied while it is stopped (the snapshot), the
item is claimed by another process once etcd's index went far past
the snapshot's (puts to another queue), and the copy is put back (the restore).
"""
from __future__ import annotations

import shutil

from etcdq_v2 import Queue
from etcdq_v2.server import EtcdServer


def test_a_view_offers_an_item_claimed_only_after_the_snapshot_etcd_was_restored_from(
        own_etcd: EtcdServer, queue_name: str, tmp_path) -> None:
    snapshot = tmp_path / "snapshot"
    with Queue(own_etcd.url, queue_name) as producer:
        item_id = producer.put("x")
    own_etcd.stop()
    shutil.copytree(own_etcd.data_dir, snapshot)  # x free, no lock
    own_etcd.start()
    with Queue(own_etcd.url, queue_name + "-other") as elsewhere:
        elsewhere.put_many(range(100))  # etcd's index: far above the snapshot's
    with Queue(own_etcd.url, queue_name) as other, Queue(own_etcd.url, queue_name) as consumer:
        claim = other.claim(timeout=5)
        assert claim is not None and claim.id == item_id
        assert consumer.claim(timeout=1) is None  # x runs elsewhere: its view knows
        view = consumer._view
        assert view is not None and item_id in view.state.locks
        sign = view.state.locks[item_id]
        own_etcd.stop()
        shutil.rmtree(own_etcd.data_dir)
        shutil.copytree(snapshot, own_etcd.data_dir)
        own_etcd.start()  # etcd at the snapshot's index: x free, no lock
        with Queue(own_etcd.url, queue_name) as fresh:  # a new process sees it free
            found = fresh.claim(timeout=5)
            assert found is not None and found.id == item_id
            found.release()
        again = consumer.claim(timeout=10)
        assert again is not None, (
            f"the view never offered {item_id}, free in etcd at {view.state.known}, "
            f"locked in the view at {view.state.locks.get(item_id)} (its sign was {sign})")
        assert again.id == item_id
        again.complete()
