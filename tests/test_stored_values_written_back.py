"""Values that Python's decoder takes but a caller may not put (NaN, a lone
surrogate), stored in etcd by another writer: every step that writes them back
takes them, and every reader shows them; a caller's own value stays strict."""
from __future__ import annotations

import json

import pytest

from etcdq_v2 import InvalidPayload, Queue
from etcdq_v2.protocol import FAILED

from test_cli import Run, etcdq, ok  # noqa: F401 - etcdq is a fixture

PENDING = "pending"


def odd_item(token: str = '"put-token"', payload: str = '"plain"') -> str:
    """An item's value as another writer might store it; ``token`` and ``payload`` as JSON text."""
    return '{"t":' + token + ',"a":0,"ts":1700000000.0,"p":' + payload + "}"


def test_a_result_holding_a_lone_surrogate_is_refused_as_a_payload_would_be(
        etcd_url: str, queue_name: str) -> None:
    """complete(result) is the caller's value: a str result that UTF-8 cannot
    carry is InvalidPayload, as put() of it is, never stored escaped."""
    with Queue(etcd_url, queue_name, lock_ttl=5) as queue:
        with pytest.raises(InvalidPayload):
            queue.put("\ud800")
        item_id = queue.put("ordinary")
        claim = queue.claim(timeout=5)
        assert claim is not None and claim.id == item_id
        with pytest.raises(InvalidPayload):
            claim.complete("\ud800 lone")
        claim.release()
        assert queue.get(item_id).state == PENDING


def test_a_dead_letter_whose_stored_put_token_holds_a_lone_surrogate_is_requeued(
        etcd_url: str, queue_name: str) -> None:
    """Q4's tombstone keeps the dead letter's put token as stored: a token another
    writer stored with a lone surrogate is written back, and the requeue ends."""
    with Queue(etcd_url, queue_name, lock_ttl=5, max_attempts=1) as queue:
        odd = queue.etcd.post(queue.layout.work, odd_item(token='"tok-\\ud800"')
                              ).node["key"].rsplit("/", 1)[-1]
        claim = queue.claim(timeout=5)
        assert claim is not None and claim.id == odd
        claim.fail("no")
        assert queue.get(odd).state == FAILED
        new_id = queue.requeue(odd)
        assert queue.get(new_id).state == PENDING
        assert queue.stats()["failed"] == 0


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_show_prints_an_item_whose_stored_payload_holds_a_lone_surrogate(
        etcdq: Run, etcd_url: str, queue_name: str, as_json: bool) -> None:  # noqa: F811
    """``etcdq show`` of a stored item that Queue.get reads prints it (escaped),
    never a UnicodeEncodeError traceback."""
    with Queue(etcd_url, queue_name, lock_ttl=5) as queue:
        odd = queue.etcd.post(queue.layout.work, odd_item(payload='"\\ud800 x"')
                              ).node["key"].rsplit("/", 1)[-1]
        assert queue.get(odd).payload == "\ud800 x"
    out = ok(etcdq("show", queue_name, odd, *(["--json"] if as_json else [])))
    assert odd in out
    if as_json:
        assert json.loads(out)["payload"] == "\ud800 x"


def test_show_json_of_a_stored_nan_is_json_a_strict_parser_reads(
        etcdq: Run, etcd_url: str, queue_name: str) -> None:  # noqa: F811
    """``--json`` output is JSON: a stored NaN is not printed as the bare word NaN."""
    with Queue(etcd_url, queue_name, lock_ttl=5) as queue:
        odd = queue.etcd.post(queue.layout.work, odd_item(payload='{"x":NaN}')
                              ).node["key"].rsplit("/", 1)[-1]
    out = ok(etcdq("show", queue_name, odd, "--json"))

    def refuse(word: str) -> None:
        raise ValueError(f"not JSON: {word}")
    json.loads(out, parse_constant=refuse)


def test_the_dashboards_json_stays_strict_json_while_an_item_stored_with_a_nan_time_runs(
        etcd_url: str, queue_name: str) -> None:
    """An item whose stored ``ts`` is NaN is claimed now (written back as it
    decoded); the dashboard's document, which a browser's JSON.parse reads,
    carries no bare NaN for its running entry."""
    from etcdq_v2.dashboard.snapshots import Snapshots
    prefix = "/" + queue_name + "-prefix"
    with Queue(etcd_url, "q", prefix=prefix, lock_ttl=5) as queue:
        queue.etcd.post(queue.layout.work,
                        '{"t":"put-token","a":0,"ts":NaN,"p":"plain"}')
        claim = queue.claim(timeout=5)
        assert claim is not None
        snapshots = Snapshots(queue.etcd, prefix, interval=0, window=60, bucket=5,
                              actions=False)
        status, body = snapshots.current()
        snapshots.close()
        claim.release()
    assert status == 200

    def refuse(word: str) -> None:
        raise ValueError(f"not JSON: {word}")
    document = json.loads(body, parse_constant=refuse)
    assert len(document["queues"][0]["running"]) == 1


@pytest.mark.parametrize("stored_time", ["NaN", "Infinity", "1e400"])
def test_show_and_ls_print_an_item_whose_stored_time_is_not_a_finite_number(
        etcdq: Run, etcd_url: str, queue_name: str, stored_time: str) -> None:  # noqa: F811
    """An item stored with ``"ts": NaN`` (or Infinity) decodes, is claimed and
    written back as it is; ``etcdq show`` and ``ls`` print it, its time shown
    as unknown, never a ValueError or OverflowError traceback."""
    with Queue(etcd_url, queue_name, lock_ttl=5) as queue:
        odd = queue.etcd.post(queue.layout.work,
                              '{"t":"put-token","a":0,"ts":' + stored_time + ',"p":"plain"}'
                              ).node["key"].rsplit("/", 1)[-1]
        assert [info.id for info in queue.items()] == [odd]
    assert odd in ok(etcdq("show", queue_name, odd))
    assert odd in ok(etcdq("ls", queue_name))


@pytest.mark.parametrize("stored_time", ["Infinity", "1e400", "NaN"])
def test_the_dashboard_shows_a_queue_whose_stored_record_finished_at_no_finite_time(
        etcd_url: str, queue_name: str, stored_time: str) -> None:
    """A completed record another writer stored with ``"fin": Infinity`` decodes:
    the dashboard's snapshot still answers 200 (the record falls in no bucket
    of the throughput histogram), never a ValueError out of int(NaN)."""
    from etcdq_v2.dashboard.snapshots import Snapshots
    prefix = "/" + queue_name + "-prefix"
    with Queue(etcd_url, "q", prefix=prefix, lock_ttl=5) as queue:
        queue.etcd.put(f"{queue.layout.completed}/{'1' * 20}",
                       '{"c":"claim","n":"node","a":1,"ts":1700000000.0,"fin":'
                       + stored_time + ',"p":1,"r":null}')
        snapshots = Snapshots(queue.etcd, prefix, interval=0, window=60, bucket=5,
                              actions=False)
        try:
            status, body = snapshots.current()
        finally:
            snapshots.close()
    assert status == 200
    assert json.loads(body)["queues"][0]["name"] == "q"
