"""Keys another tool left in the queue's directories never stop a consumer,
and nothing that is not the queue's own is deleted."""
from __future__ import annotations

import logging

import pytest

from etcdq_v2 import Queue


@pytest.fixture
def queue(etcd_url: str, queue_name: str):
    with Queue(etcd_url, queue_name, lock_ttl=2) as q:
        yield q


def junk_keys(queue: Queue) -> dict:
    etcd, layout = queue.etcd, queue.layout
    junk_item = etcd.post(layout.work, "not json at all").node["key"]
    json_junk = etcd.post(layout.work, '{"some": "other schema"}').node["key"]
    keys = {
        junk_item: "not json at all",
        json_junk: '{"some": "other schema"}',
        f"{layout.work}/readme": "a key with a name we never use",
        f"{layout.work}/sub/nested": "a sub-directory",
        f"{layout.completed}/{'9' * 20}": "<html>junk record</html>",
        f"{layout.failed}/whatever": "junk",
        f"{layout.locks}/not-an-id": "junk lock",
    }
    for key, value in keys.items():
        etcd.put(key, value)
    return keys


def still_there(queue: Queue, keys: dict) -> bool:
    return all(queue.etcd.get(key).node.get("value") == value for key, value in keys.items())


def test_consumers_skip_junk_and_keep_working(queue: Queue, caplog) -> None:
    keys = junk_keys(queue)
    ids = queue.put_many(["a", "b"])
    caplog.set_level(logging.WARNING, logger="etcdq_v2")
    got = []
    while (claim := queue.claim()) is not None:
        got.append(claim.id)
        claim.complete()
    assert got == ids
    assert "skipping item" in caplog.text
    assert queue.stats() == {"pending": 0, "running": 0, "completed": 2, "failed": 0}
    assert queue.purge(completed=True, failed=True) == 2
    assert still_there(queue, keys)
    assert [info.id for info in queue.items("pending")] == []


def test_a_lock_without_ttl_blocks_only_its_item(queue: Queue) -> None:
    stuck, free = queue.put_many(["stuck", "free"])
    queue.etcd.put(queue.layout.key("locks", stuck), "held by some other tool")
    claim = queue.claim()
    assert claim.id == free
    claim.complete()
    assert queue.claim(timeout=0.5) is None
    assert queue.stats()["pending"] == 1
    assert queue.etcd.get(queue.layout.key("locks", stuck)).node["value"] == \
        "held by some other tool"


def test_junk_records_do_not_break_inspection(queue: Queue) -> None:
    junk_keys(queue)
    item_id = queue.put("x")
    queue.claim().fail("nope")
    assert [i.id for i in queue.items("pending")] == [item_id]
    assert queue.items("completed") == []
    assert queue.items("failed") == []


def test_junk_at_an_item_id_is_not_found_never_a_crash(queue: Queue) -> None:
    from etcdq_v2 import NotFound
    junk_id = "7" * 20
    queue.etcd.put(queue.layout.key("failed", junk_id), "not a record")
    queue.etcd.put(queue.layout.key("work", "8" * 20), "not an item")
    for call in (lambda: queue.requeue(junk_id), lambda: queue.get(junk_id),
                 lambda: queue.get("8" * 20)):
        with pytest.raises(NotFound):
            call()
    assert queue.etcd.get(queue.layout.key("failed", junk_id)).node["value"] == "not a record"


def test_a_directory_where_a_record_belongs_is_reported_and_skipped(
        queue: Queue, etcd_url: str, caplog) -> None:
    """etcd refuses the record (error 105: a directory has that name): the caller gets the
    public EtcdRejected, and the item, committed but unrecordable, is skipped
    by every consumer instead of stopping them."""
    from etcdq_v2 import EtcdRejected
    blocked, fine = queue.put_many(["blocked", "fine"])
    queue.etcd.put(f"{queue.layout.completed}/{blocked}/junk", "makes it a directory")
    claim = queue.claim()
    assert claim.id == blocked
    with pytest.raises(EtcdRejected) as raised:
        claim.complete()
    assert raised.value.code == 105 and "not a record" in str(raised.value)
    claim.abandon()
    with Queue(etcd_url, queue.name, lock_ttl=2) as other, caplog.at_level(logging.WARNING):
        got = other.claim(timeout=5)
        assert got is not None and got.id == fine
        got.complete()
        assert other.claim(timeout=3) is None  # the blocked item is skipped, not raised
    assert queue.get(blocked).state == "completed"  # committed, as etcd has it
    assert any(blocked in message for message in caplog.messages)
