"""A record belongs to the item whose put token it carries (docs/protocol.md,
F2 and C3): after etcd was restored from an older backup, it names new items
by ids it gave before, and a finisher's F2 held across the restore can write
the record of an item the new history does not hold. The new item of that id
completes with its own record.

Real etcd: its data dir is copied while it is stopped (the backup); an item is
put, claimed and completed after it (the history etcd then loses); the copy is
put back (the restore), and the finisher's F2 is sent again, as one held in
flight across the restore lands, just before etcd gives the id again.
"""
from __future__ import annotations

import json
import shutil
import time
import urllib.parse
import urllib.request
from typing import Optional

import pytest

from etcdq_v2 import Queue
from etcdq_v2.codec import Record
from etcdq_v2.errors import NotFound
from etcdq_v2.server import EtcdServer


def _send(url: str, method: str, key: str, value: Optional[str] = None, **form: str
          ) -> "tuple[int, dict]":
    """One v2 keys request; (etcd's index, the body)."""
    fields = dict(form, **({"value": value} if value is not None else {}))
    data = urllib.parse.urlencode(fields).encode() if method == "PUT" else None
    request = urllib.request.Request(f"{url}/v2/keys{key}", data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/x-www-form-urlencoded")
    with urllib.request.urlopen(request, timeout=5) as reply:
        return int(reply.headers["X-Etcd-Index"]), json.loads(reply.read())


def _restore(server: EtcdServer, backup) -> None:
    server.stop()
    shutil.rmtree(server.data_dir)
    shutil.copytree(backup, server.data_dir)
    server.start()


def test_a_record_of_the_history_etcd_lost_takes_no_new_item_s_place(
        own_etcd: EtcdServer, queue_name: str, tmp_path) -> None:
    backup, url = tmp_path / "backup", own_etcd.url
    record_key = f"/etcdq/{queue_name}/completed/"
    own_etcd.stop()
    shutil.copytree(own_etcd.data_dir, backup)
    own_etcd.start()
    with Queue(url, queue_name + "-other") as elsewhere:
        elsewhere.put_many(range(50))  # the lost history goes far past the backup
    with Queue(url, queue_name) as first:
        old_id = first.put("old")
        claim = first.claim(timeout=5)
        assert claim is not None and claim.id == old_id
        claim.complete("old result")
        _, body = _send(url, "GET", record_key + old_id, quorum="true")
        old_record = body["node"]["value"]
    _restore(own_etcd, backup)
    with Queue(url, queue_name) as queue:
        index, _ = _send(url, "GET", "/")
        assert index < int(old_id) - 1
        while index < int(old_id) - 2:  # other writes of the new history
            index, _ = _send(url, "PUT", "/filler", "x")
        # The old finisher's F2, held across the restore: an id the new history
        # has not given yet, so the create applies.
        _send(url, "PUT", record_key + old_id, old_record, prevExist="false")
        new_id = queue.put("new")
        assert new_id == old_id  # etcd gave the id again
        claim = queue.claim(timeout=5)
        assert claim is not None and claim.id == new_id
        claim.complete("new result")
        info = queue.get(new_id)
        assert (info.state, info.payload, info.result) == ("completed", "new", "new result")


def test_a_record_of_another_put_token_is_not_reported_as_the_item_s_outcome(
        etcd_url: str, queue_name: str) -> None:
    # The state a finisher's F2 held across a restore leaves (the test above),
    # made directly: completed/<id> holds the record of another item that had
    # the id, while work/<id> holds the pending item etcd named by it again.
    with Queue(etcd_url, queue_name) as queue:
        item_id = _pending_beside_another_record(queue, etcd_url, queue_name)
        assert queue.get(item_id).state == "pending"
        assert queue.wait(item_id, timeout=0) is None
        claim = queue.claim(timeout=5)
        assert claim is not None and claim.id == item_id
        claim.complete("new result")
        info = queue.wait(item_id, timeout=5)
        assert info is not None and (info.payload, info.result) == ("new", "new result")


def test_a_purge_keeps_a_pending_item_beside_a_record_of_another_put_token(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name) as queue:
        item_id = _pending_beside_another_record(queue, etcd_url, queue_name)
        queue.purge(completed=True)
        claim = queue.claim(timeout=5)
        assert claim is not None and claim.id == item_id
        assert claim.payload == "new"




def test_an_item_dead_lettered_beside_another_item_s_record_is_reported_failed(
        etcd_url: str, queue_name: str) -> None:
    """completed/<id> holds another item's record while the item is dead-lettered
    into failed/: once the item left work/, a reader would take completed/'s
    record as its outcome, so its claim (C3) deleted that record first."""
    with Queue(etcd_url, queue_name) as queue:
        item_id = queue.put("new")
        claim = queue.claim(timeout=5)
        assert claim is not None
        claim.fail("again", delay=0)  # a = 1: its next claim reads the records (C3)
        _another_record(etcd_url, queue_name, item_id, "completed")
        claim = queue.claim(timeout=5)
        assert claim is not None and claim.id == item_id
        claim.fail("no use", retry=False)
        info = queue.get(item_id)
        assert (info.state, info.payload, info.reason) == ("failed", "new", "no use")
        waited = queue.wait(item_id, timeout=0)
        assert waited is not None and (waited.state, waited.payload) == ("failed", "new")
        assert (queue.stats()["completed"], queue.stats()["failed"]) == (0, 1)


def test_a_requeue_of_another_item_s_dead_letter_leaves_the_pending_item_alone(
        etcd_url: str, queue_name: str) -> None:
    """failed/<id> holds another item's dead letter beside the pending item etcd
    named by its id again: no dead letter of that item (NotFound), nothing
    written; the item stays, and runs."""
    with Queue(etcd_url, queue_name) as queue:
        item_id = queue.put("new")
        key = f"/etcdq/{queue_name}/failed/{item_id}"
        _another_record(etcd_url, queue_name, item_id, "failed")
        _, before = _send(etcd_url, "GET", key, quorum="true")
        with pytest.raises(NotFound):
            queue.requeue(item_id)
        _, after = _send(etcd_url, "GET", key, quorum="true")
        assert after["node"]["modifiedIndex"] == before["node"]["modifiedIndex"]
        assert queue.get(item_id).state == "pending"
        claim = queue.claim(timeout=5)
        assert claim is not None and (claim.id, claim.payload) == (item_id, "new")


def _pending_beside_another_record(queue: Queue, etcd_url: str, queue_name: str) -> str:
    """A pending item "new" whose completed/<id> holds the record of another
    item that had the id; the item's id."""
    item_id = queue.put("new")
    _another_record(etcd_url, queue_name, item_id, "completed")
    return item_id


def _another_record(etcd_url: str, queue_name: str, item_id: str, kind: str) -> None:
    """``kind/<id>`` holds the record of another item that had the id (another
    put token, another payload)."""
    another = Record("old", "old-claim", "node-b", 1, 1.0, 2.0, "old result",
                     reason="old reason", token="another-put-token").encode()
    _send(etcd_url, "PUT", f"/etcdq/{queue_name}/{kind}/{item_id}", another,
          prevExist="false")


@pytest.mark.xfail(strict=True, reason="a completion leaves another item's dead letter in "
                   "failed/<id>: once completed/<id> goes, it is taken for the item's outcome")
@pytest.mark.parametrize("how", ["purged", "expired"])
def test_a_completed_item_is_never_reported_by_another_item_s_dead_letter(
        etcd_url: str, queue_name: str, how: str) -> None:
    """failed/<id> holds another item's dead letter beside the pending item of
    that id, which completes on its first claim (no C3 read of the records):
    once its own record is gone (purged, or its completed_ttl passed), no
    reader may take the other item's dead letter for its outcome ("Whose
    record": that record must be gone before the item leaves work/)."""
    with Queue(etcd_url, queue_name, completed_ttl=1) as queue:
        item_id = queue.put("new")
        _another_record(etcd_url, queue_name, item_id, "failed")
        claim = queue.claim(timeout=5)
        assert claim is not None and claim.id == item_id
        claim.complete("new result")
        if how == "purged":
            queue.purge(completed=True)
        else:
            time.sleep(2.5)  # the item's own record expires (completed_ttl)
        try:
            info = queue.get(item_id)
        except NotFound:
            return
        assert (info.state, info.payload) != ("failed", "old")


@pytest.mark.xfail(strict=True, reason="a completion leaves another item's dead letter in "
                   "failed/<id>: stats counts the id both completed and failed")
def test_stats_count_a_completed_item_once_beside_another_item_s_dead_letter(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name) as queue:
        item_id = queue.put("new")
        _another_record(etcd_url, queue_name, item_id, "failed")
        claim = queue.claim(timeout=5)
        assert claim is not None and claim.id == item_id
        claim.complete("new result")
        stats = queue.stats()
        assert (stats["completed"], stats["failed"]) == (1, 0)


class _Crash(Exception):
    """The process dies here."""


def test_a_purged_dead_letter_is_never_reported_by_another_item_s_completed_record(
        etcd_url: str, queue_name: str, monkeypatch) -> None:
    """A dead letter's finisher dies after F2, before its read of completed/<id>
    (docs/protocol.md, F2's crash rows): the item is in work/, committed, beside
    another item's record in completed/. A purge of failed/ then removes the
    item and its record; the other item's record must not become its outcome."""
    from etcdq_v2.steps import Steps

    def crash(self, item_id, item):  # type: ignore[no-untyped-def]
        raise _Crash()
        yield  # a step
    with Queue(etcd_url, queue_name) as queue:
        item_id = queue.put("new")
        _another_record(etcd_url, queue_name, item_id, "completed")
        claim = queue.claim(timeout=5)
        assert claim is not None and claim.id == item_id
        with monkeypatch.context() as patched:
            patched.setattr(Steps, "_clear_completed", crash)
            with pytest.raises(_Crash):
                claim.fail("no use", retry=False)
        queue.purge(failed=True)
        try:
            info = queue.get(item_id)
        except NotFound:
            return
        assert (info.state, info.payload) != ("completed", "old")
