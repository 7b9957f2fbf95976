"""Keys another tool left in the queue's directories never stop a consumer,
and nothing that is not the queue's own is deleted."""
from __future__ import annotations

import json
import logging

import pytest

from etcdq_v2 import NotFound, Queue
from etcdq_v2.codec import Item, Junk, Record
from etcdq_v2.protocol import COMPLETED

from helpers import in_background, wait_until


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
    # Held (no claim can take it), so running, as docs S1 say: not claimable pending.
    assert queue.stats() == {"pending": 0, "running": 1, "completed": 1, "failed": 0}
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


#: An item value that carries an outcome but is no record (no "c", no "n").
ITEM_WITH_OUTCOME_NO_RECORD = '{"t":"x","a":0,"p":1,"o":"completed"}'
#: A record whose "a" is no number.
RECORD_WITH_BAD_ATTEMPTS = '{"c":"x","n":"y","a":"zz","p":1}'


@pytest.mark.parametrize("raw, decode", [
    (RECORD_WITH_BAD_ATTEMPTS, Record.decode),
    ('{"c":"x","n":"y","a":[],"p":1}', Record.decode),
    ('{"c":"x","n":"y","ts":"soon","p":1}', Record.decode),
    ('{"t":"x","a":0,"ts":1' + "0" * 400 + ',"p":1}', Item.decode),
], ids=["record-a-str", "record-a-list", "record-ts-str", "item-ts-overflow"])
def test_a_field_of_the_wrong_type_makes_a_value_junk(raw: str, decode) -> None:
    with pytest.raises(Junk):
        decode(raw)


@pytest.mark.parametrize("where, value", [
    ("work", ITEM_WITH_OUTCOME_NO_RECORD),
    (COMPLETED, RECORD_WITH_BAD_ATTEMPTS),
], ids=["item-with-outcome-no-record", "record-with-bad-attempts"])
def test_junk_where_an_item_or_its_record_belongs_is_not_found_for_wait_cancel_and_get(
        queue: Queue, where: str, value: str) -> None:
    """wait, cancel and get read the item and its records: junk there is NotFound
    (or, for an item that says it is finished, nothing to cancel), never a bare
    ValueError from decoding it."""
    item_id = queue.put("x")
    if where != "work":
        queue.etcd.delete(queue.layout.key("work", item_id))
    queue.etcd.put(queue.layout.key(where, item_id), value)
    for call in (lambda: queue.wait(item_id, timeout=0.5), lambda: queue.get(item_id)):
        with pytest.raises(NotFound):
            call()
    if where == "work":
        assert queue.cancel(item_id) is False  # it says it is finished: nothing to cancel
    else:
        with pytest.raises(NotFound):
            queue.cancel(item_id)
    assert queue.items(COMPLETED) == []


def nested_raw(depth: int) -> str:
    """An item whose payload is a list nested ``depth`` deep, as etcd would hold it."""
    return '{"t":"x","a":0,"p":' + "[" * depth + "0" + "]" * depth + "}"


def test_a_value_too_deep_to_decode_is_junk_and_workers_run_the_items_behind_it(
        queue: Queue) -> None:
    """A value nested deeper than a claimer's stack can decode (json.loads recurses per
    level: RecursionError) is junk like any other: skipped by claims, by Worker.run
    and by stats, never a RecursionError that kills the worker and every worker
    restarted after it (the item is at the head of the queue)."""
    from etcdq_v2 import Worker
    deep = queue.etcd.post(queue.layout.work, nested_raw(5000)).node["key"]
    behind = queue.put("an ordinary item behind it")
    done: list = []
    worker = Worker(queue, done.append, claim_timeout=0.5, install_signal_handlers=False)
    worker.run(until_empty=True)
    assert done == ["an ordinary item behind it"]
    assert queue.stats() == {"pending": 0, "running": 0, "completed": 1, "failed": 0}
    assert queue.get(behind).state == COMPLETED
    with pytest.raises(NotFound):
        queue.get(deep.rsplit("/", 1)[-1])
    with pytest.raises(Junk):
        Item.decode(nested_raw(5000))


def nested_stored_item(depth: int) -> str:
    """An item (as etcdq 0.1.0, or etcdq_v2 before the MAX_DEPTH limit, stored it)
    whose payload is a list nested ``depth`` deep: decodable (json.loads manages
    ~990 levels), so an item of ours, not junk."""
    return '{"t":"put-token","a":0,"ts":0,"p":' + "[" * depth + "0" + "]" * depth + "}"


def nested_stored_committed(depth: int) -> str:
    """The same payload in an item committed (F1) by such a version, not yet recorded."""
    return ('{"c":"claim-token","n":"old-node","a":1,"ts":0,"fin":0,"o":"completed",'
            '"t":"put-token","p":' + "[" * depth + "0" + "]" * depth + ',"r":null}')


@pytest.mark.parametrize("stored", ["pending", "committed"])
def test_an_item_stored_deeper_than_max_depth_is_claimed_or_finished_not_refused(
        etcd_url: str, queue_name: str, stored: str) -> None:
    """MAX_DEPTH limits what a caller puts now; a stored payload nested 150 levels
    (put before the limit existed) decodes, so C2 (pending) or the claimer's F2
    (committed by F1) must write it back: never InvalidPayload from claim()."""
    from etcdq_v2.codec import MAX_DEPTH
    raw = nested_stored_item(150) if stored == "pending" else nested_stored_committed(150)
    assert 150 > MAX_DEPTH
    with Queue(etcd_url, queue_name, lock_ttl=5) as queue:
        Item.decode(raw)  # no Junk: it is an item of ours
        deep = queue.etcd.post(queue.layout.work, raw).node["key"].rsplit("/", 1)[-1]
        behind = queue.put("an ordinary item behind it")
        seen = []
        while (claim := queue.claim(timeout=1)) is not None:
            seen.append(claim.id)
            claim.complete("ran")
        assert seen == ([deep, behind] if stored == "pending" else [behind])
        assert queue.get(deep).state == COMPLETED


def test_a_worker_runs_the_items_behind_an_item_stored_deeper_than_max_depth(
        etcd_url: str, queue_name: str) -> None:
    """The same item at the head of the queue does not stall a Worker (FIFO, window 1:
    a claim refusing it would be offered it again, forever)."""
    from etcdq_v2 import Worker
    with Queue(etcd_url, queue_name, lock_ttl=5) as queue:
        queue.etcd.post(queue.layout.work, nested_stored_item(150))
        queue.put("an ordinary item behind it")
        done: list = []
        worker = Worker(queue, done.append, claim_timeout=0.5, install_signal_handlers=False)
        thread, _ = in_background(worker.run)
        try:
            wait_until(lambda: "an ordinary item behind it" in done, 8,
                       message="the worker to run the item behind the deep one")
        finally:
            worker.stop(grace=False)
            thread.join(15)


def test_an_item_stored_deeper_than_max_depth_is_released_failed_requeued_and_cancelled(
        etcd_url: str, queue_name: str) -> None:
    """Every write-back of a stored payload passes it through: R0 (release), F1 and
    F2 of a dead letter, Q1 and Q3 (requeue), K3 (cancel); a result or a new
    payload that deep is still refused."""
    from etcdq_v2 import InvalidPayload
    from etcdq_v2.codec import MAX_DEPTH
    from etcdq_v2.protocol import FAILED
    with Queue(etcd_url, queue_name, lock_ttl=5, max_attempts=1) as queue:
        deep = queue.etcd.post(queue.layout.work,
                               nested_stored_item(150)).node["key"].rsplit("/", 1)[-1]
        claim = queue.claim(timeout=1)
        assert claim is not None and claim.id == deep
        claim.release()  # R0
        claim = queue.claim(timeout=1)
        assert claim is not None
        with pytest.raises(InvalidPayload, match="nested"):
            claim.complete(json.loads("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)))
        claim.fail("no")  # F1, F2: a dead letter
        requeued = queue.requeue(deep)  # Q1, Q3
        assert queue.cancel(requeued) is True  # K3
        assert queue.get(requeued).state == FAILED


def test_stats_and_overview_count_a_queue_holding_a_directory_nested_600_deep(
        queue: Queue) -> None:
    """A directory nested 600 levels deep in the queue's directory (junk) makes the
    reply of stats' recursive GET too deep for json.loads (two levels of JSON per
    directory): stats and overview read the four directories one by one instead
    (not recursive: the subtree is never sent), and count as without it."""
    queue.put("pending")
    queue.etcd.put(queue.layout.root + "/junk" + "/a" * 600, "v")
    queue.etcd.put(queue.layout.work + "/deep" + "/a" * 600, "v")
    assert queue.stats() == {"pending": 1, "running": 0, "completed": 0, "failed": 0}
    assert queue.stats(quorum=False)["pending"] == 1
    assert queue.overview().counts["pending"] == 1


def test_an_item_under_an_unreadable_lock_is_running_in_stats_get_items_and_overview(
        queue: Queue) -> None:
    """A lock we cannot read holds its item (C1 gets "already exists": no claim can
    take it), so every read counts the item as running, as docs S1 say: never pending."""
    item_id = queue.put("held by a lock nobody can read")
    queue.etcd.put(queue.layout.key("locks", item_id), "not a lock", ttl=30)
    assert queue.claim(timeout=0.5) is None  # held, indeed
    assert queue.stats() == {"pending": 0, "running": 1, "completed": 0, "failed": 0}
    info = queue.get(item_id)
    assert (info.state, info.node_id) == ("running", None)
    assert [item.id for item in queue.items("running")] == [item_id]
    assert queue.items("pending") == []
    overview = queue.overview()
    assert overview.counts["running"] == 1 and overview.counts["pending"] == 0
    assert [item.id for item in overview.running] == [item_id]


def test_a_directory_where_a_lock_belongs_holds_its_item_and_the_claim_goes_on(
        queue: Queue) -> None:
    """A directory at ``locks/<id>``: no listing or read of locks/ shows it, so
    the view takes the item for free, but its lock create is refused at the
    very index at which the view saw no lock.  etcd's refusal wins: the item
    is taken, as under a lock, and the claim goes on to the next one; a claim
    with nothing else left returns within its timeout, rather than trying the
    item again and again, thousands of refused writes a second, past its
    timeout, until anything else wrote to etcd."""
    stuck, after = queue.put("stuck"), queue.put("after")
    queue.etcd.put(f"{queue.layout.locks}/{stuck}/junk", "makes it a directory")
    claim = queue.claim(timeout=1)
    assert claim is not None and claim.id == after
    claim.complete()
    puts = queue.etcd.requests["PUT"]
    thread, outcome = in_background(lambda: queue.claim(timeout=0.5))
    thread.join(3)
    spun = queue.etcd.requests["PUT"] - puts
    if thread.is_alive():
        queue.put("any write ends the loop")  # a newer index for the refusal
        thread.join(10)
    assert outcome == {"returned": None} and spun < 5, (outcome, f"{spun} PUTs")


def test_a_refused_lock_create_wins_over_the_views_gone_sign_at_the_same_index(
        queue: Queue) -> None:
    """A lock create refused at the very index at which the view took the
    lock for gone: the key was there then (junk no listing shows, or a delay
    lock past its expiry that etcd had not removed), so the
    item is taken on etcd's word.  The other sign a claim brings back, a C2
    that found the item claimed since, carries the item's index, which a
    listing at that same index may rightly show without a lock (a late C2
    whose lock had expired): that item stays free."""
    item_id = queue.put("x")
    view = queue._ensure_view()
    with view._cond:
        view.state.gone[item_id] = index = view.state.items[item_id][0] + 5
    view.taken(item_id)
    view.locked_at(item_id, index)
    assert view.state.is_free(item_id)
    view.taken(item_id)
    view.locked_at(item_id, index, refused=True)
    assert not view.state.is_free(item_id) and view.state.locks[item_id] == index
    with view._cond:
        view.state.unlocked(item_id, index + 1)  # a newer sign that it is gone frees it
    assert view.state.is_free(item_id)


#: Payloads Python's decoder takes but its strict encoder refuses: what another
#: client (or an older version) could have stored in work/.
NOT_STRICT_JSON = {
    "nan": '{"x":NaN}',
    "infinity": '[Infinity,-Infinity]',
    "too-large-for-a-float": '1e400',
    "lone-surrogate": '"\\ud800 and more"',
}


def not_strict_item(payload: str) -> str:
    return '{"t":"put-token","a":0,"ts":1700000000.0,"p":' + payload + "}"


@pytest.mark.parametrize("payload", list(NOT_STRICT_JSON.values()), ids=list(NOT_STRICT_JSON))
def test_an_item_stored_with_values_a_caller_may_not_put_is_claimed_and_completed(
        etcd_url: str, queue_name: str, payload: str) -> None:
    """A stored payload is written back as it decoded (C2, F1): the head of the
    queue never refuses every claim with InvalidPayload, and the item behind it runs."""
    with Queue(etcd_url, queue_name, lock_ttl=5) as queue:
        odd = queue.etcd.post(queue.layout.work,
                              not_strict_item(payload)).node["key"].rsplit("/", 1)[-1]
        behind = queue.put("an ordinary item behind it")
        seen = []
        while (claim := queue.claim(timeout=1)) is not None:
            seen.append(claim.id)
            claim.complete("ran")
        assert seen == [odd, behind]
        assert queue.get(odd).state == COMPLETED
        assert repr(queue.get(odd).payload) == repr(json.loads(payload))


def test_an_item_stored_with_nan_is_released_failed_requeued_and_cancelled_but_a_nan_result_is_refused(
        etcd_url: str, queue_name: str) -> None:
    """R0, F1/F2 of a dead letter, Q1/Q3 and K3 write the stored NaN back; a result
    or a new payload holding NaN is the caller's and is refused."""
    from etcdq_v2 import InvalidPayload
    from etcdq_v2.protocol import FAILED
    with Queue(etcd_url, queue_name, lock_ttl=5, max_attempts=1) as queue:
        odd = queue.etcd.post(queue.layout.work,
                              not_strict_item('{"x":NaN}')).node["key"].rsplit("/", 1)[-1]
        claim = queue.claim(timeout=1)
        assert claim is not None and claim.id == odd
        claim.release()  # R0
        claim = queue.claim(timeout=1)
        assert claim is not None
        with pytest.raises(InvalidPayload, match="JSON"):
            claim.complete(float("nan"))
        with pytest.raises(InvalidPayload, match="JSON"):
            queue.put({"x": float("nan")})
        claim.fail("no")  # F1, F2: a dead letter
        requeued = queue.requeue(odd)  # Q1, Q3
        assert queue.cancel(requeued) is True  # K3
        assert queue.get(requeued).state == FAILED


def test_export_writes_a_stored_nan_and_import_refuses_that_line_by_name(
        etcd_url: str, queue_name: str, tmp_path) -> None:
    """Export keeps what is stored; import takes a file's values as a caller's and
    refuses that line with a clear error, never storing a value put() would refuse."""
    from etcdq_v2 import InvalidArgument
    with Queue(etcd_url, queue_name, lock_ttl=5) as queue:
        queue.etcd.post(queue.layout.work, not_strict_item('{"x":NaN}'))
        lines = list(queue.export_items())
    assert len(lines) == 1 and "NaN" in lines[0]
    with Queue(etcd_url, queue_name + "-copy", lock_ttl=5) as copy:
        with pytest.raises(InvalidArgument, match="line 1"):
            copy.import_items(lines)
        assert copy.stats()["pending"] == 0
