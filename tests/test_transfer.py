"""Export and import (etcdq_v2/transfer.py, docs/protocol.md "export" and "import").

A queue leaves a cluster as JSON lines and comes back in another queue:
every state survives the round trip (bytes payloads, results, reasons,
attempts; a running item comes back pending), importing twice stores each
item once, and so does an import that stopped half-way and ran again
(a write held in the proxy until the deadline; a truncated file).  A lost
reply to an import write is resent and read back, and a resent write that
lands after its item finished does not run it twice.  Two imports take
turns.  Bad lines are refused by number.  Export reads listings as they
arrive: its peak memory does not grow with the queue (tracemalloc).
Network faults go through the real TCP proxy (tests/faultproxy.py).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import threading
import tracemalloc
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
from hypothesis import given, settings, strategies as st

from etcdq_v2 import InvalidArgument, LockLost, Queue, Unavailable, connect
from etcdq_v2.codec import DEFAULT_MAX_PAYLOAD, Item
from etcdq_v2.driver import run
from etcdq_v2.errors import KeyMissing
from etcdq_v2.listing import listed_nodes
from etcdq_v2.protocol import COMPLETED, FAILED

from crashes import commit_then_crash
from faultproxy import FaultProxy
from helpers import in_background, wait_until
from test_cli import assert_user_error, ok, run_etcdq
from test_delay import Once

BOUND = 20.0
#: An import write as the client sends it (the form carries the value: our token shows).
IMPORT_WRITE = rb"^PUT /v2/keys/\S+/(?:work|completed|failed)/\d{20} "


@pytest.fixture
def source(etcd_url: str, queue_name: str) -> Iterator[Queue]:
    # backoff 60 s: an item failed once stays pending (under its delay lock) for the test.
    with Queue(etcd_url, f"{queue_name}-from", max_attempts=2, backoff=[60]) as queue:
        yield queue


@pytest.fixture
def target(etcd_url: str, queue_name: str) -> Iterator[Queue]:
    with Queue(etcd_url, f"{queue_name}-to") as queue:
        yield queue


def tokens(queue: Queue) -> List[str]:
    """Every put token stored in the queue (work/, completed/, failed/), repeats kept."""
    found = []
    for kind in ("work", COMPLETED, FAILED):
        found += [decoded.token for _, decoded in queue._protocol.decoded(kind)]
    return found


def stored_once(queue: Queue, lines: List[str]) -> None:
    """Each line's item is in the queue exactly once, and nothing else is."""
    expected = sorted(json.loads(line)["token"] for line in lines)
    assert sorted(tokens(queue)) == expected


def numbered(count: int, **extra: Any) -> List[str]:
    """``count`` pending lines as export writes them."""
    return [json.dumps({"id": f"{n:020d}", "state": "pending", "token": f"token-{n:04d}",
                        "attempts": 0, "created": 1700000000.0, "payload": {"n": n}, **extra})
            + "\n" for n in range(count)]


def one(queue: Queue, state: str, payload: Any) -> Any:
    [info] = [info for info in queue.items(state) if info.payload == payload]
    return info


# -- the listing, decoded as it arrives ---------------------------------------------------

NODE = st.fixed_dictionaries({
    "key": st.text(max_size=30).map(lambda text: "/q/work/" + text),
    "value": st.text(max_size=200) | st.sampled_from(['"nodes":[', '{"t":"é\\"x"}', "]"]),
    "modifiedIndex": st.integers(1, 2**40), "createdIndex": st.integers(1, 2**40)})


def listing_body(nodes: List[Dict[str, Any]]) -> bytes:
    """A directory's GET reply as etcd writes it (compact JSON, "nodes" omitted if empty)."""
    directory: Dict[str, Any] = {"key": "/q/work", "dir": True}
    if nodes:
        directory["nodes"] = nodes
    directory.update(modifiedIndex=4, createdIndex=4)
    doc = {"action": "get", "node": directory}
    return (json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def cut(body: bytes, points: List[int]) -> List[bytes]:
    edges = sorted({0, len(body), *(p % (len(body) + 1) for p in points)})
    return [body[a:b] for a, b in zip(edges, edges[1:])]


@settings(max_examples=200, deadline=None)
@given(st.lists(NODE, max_size=8), st.lists(st.integers(0, 10**6), max_size=30))
def test_a_listing_cut_anywhere_decodes_to_its_nodes(nodes: List[Dict[str, Any]],
                                                     points: List[int]) -> None:
    """Pieces may split a node, a multi-byte character or the "nodes" key itself."""
    assert list(listed_nodes(cut(listing_body(nodes), points))) == nodes


@pytest.mark.parametrize("body", [b'{"action":"get","node":{"key":"/q","dir":true,"nodes":[{"k',
                                  b'{"action":"get","node":{"key":"/q","dir":true,"nodes":[',
                                  b"<html>not etcd</html>", b'{"action":"get","nodes":[1]}'])
def test_a_listing_that_is_cut_short_or_not_etcds_is_an_error(body: bytes) -> None:
    with pytest.raises(ValueError):
        list(listed_nodes([body[:7], body[7:]]))


def test_a_streamed_listing_equals_etcds_whole_reply(etcd_url: str, target: Queue,
                                                     proxy: FaultProxy) -> None:
    """Through real etcd: a small listing (Content-Length), a big one (one chunk of its
    full size), a missing directory; and a body cut off half-way is Unavailable."""
    transport = connect(proxy.url, timeout=2, deadline=4)
    target.put("small")
    small = target.layout.dir("work")
    assert list(transport.listing(small).nodes()) == transport.get(small).node["nodes"]
    target.put_many([{"n": n, "pad": "é" * 300} for n in range(300)])
    whole = transport.get(small, sorted=True).node["nodes"]
    assert list(transport.listing(small, sorted=True, quorum=True).nodes()) == whole
    with pytest.raises(KeyMissing):
        transport.listing(target.layout.dir("failed"))
    proxy.cut(50_000)
    listing = transport.listing(small)
    with pytest.raises(Unavailable, match="broke off"):
        list(listing.nodes())
    transport.close()


# -- the round trip -----------------------------------------------------------------------

def populate(source: Queue, etcd_url: str) -> Dict[str, Any]:
    """One item or record in every state and shape; what each should become."""
    source.put("retry me")
    source.claim().fail("flaky")                 # pending, attempts 1, under a backoff lock
    source.put(b"\x89PNG\x00\xff")
    source.claim().complete({"ok": True, "list": [1, "two", None]})
    with Queue(etcd_url, source.name, max_attempts=1) as once:
        once.put("poison")
        once.claim().fail("boom")                # a dead letter after one attempt
    source.put("half done")
    commit_then_crash(source, COMPLETED)         # committed (F1) and recorded, still in work/
    source.put("running")
    running = source.claim()                     # running: exported as pending, attempts 1
    source.put_many([{"to": "ada", "n": [1, 2.5, None, "é"]}, b"\x00\xff raw"])
    assert source.cancel(source.put("nope"))     # a dead letter "cancelled", attempts 0
    return {"running": running,
            "pending": [("retry me", 1), ("running", 1),
                        ({"to": "ada", "n": [1, 2.5, None, "é"]}, 0), (b"\x00\xff raw", 0)],
            COMPLETED: {b"\x89PNG\x00\xff": {"ok": True, "list": [1, "two", None]},
                        "half done": "done"},
            FAILED: {"poison": "boom", "nope": "cancelled"}}


def test_every_state_survives_a_round_trip(source: Queue, target: Queue,
                                           etcd_url: str) -> None:
    expected = populate(source, etcd_url)
    before = source.stats()
    lines = list(source.export_items())
    assert source.stats() == before  # export only reads
    assert len({json.loads(line)["token"] for line in lines}) == len(lines) == 8

    assert target.import_items(lines) == {"pending": 4, COMPLETED: 2, FAILED: 2, "skipped": 0}
    assert [(i.payload, i.attempts) for i in target.items("pending")] == expected["pending"]
    for kind in (COMPLETED, FAILED):
        moved = {i.payload: (i.result if kind == COMPLETED else i.reason)
                 for i in target.items(kind)}
        assert moved == expected[kind]
        for info in source.items(kind):  # attempts, node, times: as they were
            copy = one(target, kind, info.payload)
            assert (copy.attempts, copy.node_id) == (info.attempts, info.node_id)
            assert copy.created == pytest.approx(info.created, abs=0.001)
            assert (copy.finished or 0) == pytest.approx(info.finished or 0, abs=0.001)
    claim = target.claim()
    assert (claim.payload, claim.attempt) == ("retry me", 2)  # claimable at once
    claim.complete()
    expected["running"].complete()  # the source's claim is not disturbed


def test_an_item_nested_deeper_than_max_depth_is_exported_with_the_others(
        source: Queue) -> None:
    """An item put before MAX_DEPTH existed (0.1.0 took any JSON), 150 levels deep, is
    exported as stored; the export goes on past it."""
    source.put("first")
    deep = "[" * 150 + "]" * 150
    source.etcd.post(source.layout.dir("work"),
                     '{"t":"legacy-token","a":0,"ts":1700000000.0,"p":%s}' % deep)
    source.put("last")
    lines = [json.loads(line) for line in source.export_items()]
    assert [line["token"] for line in lines][1] == "legacy-token"
    assert [line["payload"] for line in lines] == ["first", json.loads(deep), "last"]


def test_an_item_just_under_the_payload_limit_is_exported_and_imported(
        source: Queue, target: Queue) -> None:
    """The import writes the item with "q" (6 bytes more than put stored); the limit
    applies to the item as put stores it, so what the source held comes back."""
    size = len(Item("", "0" * 24, created=1764523200.123).encode())
    source.put("x" * (DEFAULT_MAX_PAYLOAD - size - 2))  # encoded: 2 bytes under the limit
    source.put("after it")
    lines = list(source.export_items())
    assert len(lines) == 2
    assert target.import_items(lines)["pending"] == 2


def runs_of(queue: Queue) -> List[Any]:
    """The payloads a worker runs, each claim completed, until the queue is empty."""
    runs = []
    claim = queue.claim(timeout=0.5)
    while claim is not None:
        runs.append(claim.payload)
        claim.complete()
        claim = queue.claim(timeout=0.5)
    return runs


def test_a_dead_letter_whose_requeue_stopped_after_q3_is_imported_as_its_new_item_only(
        etcd_url: str, queue_name: str, target: Queue) -> None:
    """A requeue that stopped after Q3 leaves the dead letter marked with its requeue
    token (rq) and the new item carrying it.  Export writes rq; import skips the dead
    letter (its new item came first), so requeuing the target's dead letters does not
    run the payload twice."""
    with Queue(etcd_url, f"{queue_name}-dead", max_attempts=1) as source:
        source.put("once")
        source.claim().fail("boom")
        [dead] = source.items(FAILED)
        protocol = source._protocol
        lock = run(protocol._lock_dead_letter(dead.id), protocol.etcd)                # Q0
        (token, index), record = run(protocol._requeue_token(dead.id, None), protocol.etcd)  # Q1 (Q2: none in work/)
        run(protocol._create_item(f"{index:020d}",
                                  Item(record.payload, token, requeued=True).encode()),
            protocol.etcd)                                                            # Q3
        protocol._drop_lock(dead.id, lock)                      # then the requeue dies
        lines = list(source.export_items())
    assert json.loads(lines[-1])["rq"] == token
    assert target.import_items(lines) == {"pending": 1, COMPLETED: 0, FAILED: 0,
                                          "skipped": 1}
    for info in target.items(FAILED):
        target.requeue(info.id)
    assert runs_of(target) == ["once"]


def test_a_dead_letter_requeued_in_the_target_is_skipped_by_a_second_import(
        etcd_url: str, queue_name: str, target: Queue) -> None:
    """An imported dead letter, requeued in the target (Q4 leaves a tombstone, which
    keeps the put token), then the same file imported again (the first import stopped
    half-way, say): I2 finds the token in the tombstone and skips the dead letter, so
    its payload does not run twice."""
    with Queue(etcd_url, f"{queue_name}-dead", max_attempts=1) as source:
        source.put("once")
        source.claim().fail("boom")
        lines = list(source.export_items())
    target.import_items(lines)
    [dead] = target.items(FAILED)
    target.requeue(dead.id)
    assert target.import_items(lines)["skipped"] == 1
    for info in target.items(FAILED):
        target.requeue(info.id)
    assert runs_of(target) == ["once"]


def test_a_running_item_is_exported_as_pending_and_the_state_filter_selects(
        source: Queue, etcd_url: str) -> None:
    populate(source, etcd_url)

    def exported(state: Optional[str]) -> List[Any]:
        docs = [json.loads(line) for line in source.export_items(state)]
        return [(doc["state"], doc.get("payload", doc.get("payload_base64"))) for doc in docs]

    assert exported("running") == [("pending", "running")]
    assert exported("pending") == [("pending", "retry me"), ("pending", {"to": "ada", "n": [
        1, 2.5, None, "é"]}), ("pending", "AP8gcmF3")]
    assert exported(COMPLETED) == [(COMPLETED, "half done"), (COMPLETED, "iVBORwD/")]
    assert exported(FAILED) == [(FAILED, "poison"), (FAILED, "nope")]
    with pytest.raises(InvalidArgument, match="unknown state"):
        source.export_items("lost")  # at the call, not at the first line


def test_finished_items_whose_locks_linger_are_not_exported_as_running(
        source: Queue, etcd_url: str) -> None:
    """F4 is skipped (lock_ttl 30 s): export lists locks/ first, and the
    locks of finished items are there; they select nothing."""
    done, dead, waiting = source.put_many(["done", "dead", "waiting"])
    source.claim().complete()
    with Queue(etcd_url, source.name, max_attempts=1) as once:
        once.claim().fail("no")                  # a dead letter after one attempt
    assert {e.id for e in source._protocol.list("locks")[1]} >= {done, dead}  # lingering
    assert list(source.export_items("running")) == []
    assert [json.loads(line)["id"] for line in source.export_items("pending")] == [waiting]
    states = {json.loads(line)["id"]: json.loads(line)["state"]
              for line in source.export_items()}
    assert (states[done], states[dead], states[waiting]) == (COMPLETED, FAILED, "pending")


def test_importing_twice_stores_each_item_once(source: Queue, target: Queue,
                                               etcd_url: str) -> None:
    populate(source, etcd_url)
    lines = list(source.export_items())
    target.import_items(lines)
    again = target.import_items(lines + lines[:2])  # a line given twice, too
    assert again == {"pending": 0, COMPLETED: 0, FAILED: 0, "skipped": 10}
    stored_once(target, lines)


def test_a_line_given_twice_in_one_file_is_stored_once(target: Queue) -> None:
    lines = numbered(3)
    assert target.import_items(lines + lines[1:2])["skipped"] == 1
    stored_once(target, lines)


# -- crashes, lost replies, two importers -------------------------------------------------

@contextlib.contextmanager
def through(proxy: FaultProxy, name: str, timeout: float = 0.5, deadline: float = 2.0,
            **options: Any) -> Iterator[Queue]:
    """An importer whose requests go through ``proxy``."""
    transport = connect(proxy.url, timeout=timeout, deadline=deadline)
    try:
        with Queue(transport, name, **options) as queue:
            yield queue
    finally:
        transport.close()


def token_of(line: str) -> bytes:
    return json.loads(line)["token"].encode()


def test_an_import_that_stopped_half_way_runs_again_and_stores_each_item_once(
        proxy: FaultProxy, target: Queue) -> None:
    """The sixth write is held in flight until the deadline (the importer gives up with
    Unavailable, as a crash would stop it); the held copies are dropped.  The re-run
    skips the five stored lines and stores the rest."""
    lines = numbered(10)
    proxy.hold("up", match=token_of(lines[5]))
    with through(proxy, target.name) as importer:
        with pytest.raises(Unavailable):
            importer.import_items(lines)
    proxy.disconnect(abort=True)  # the held copies never reach etcd
    proxy.pass_through()
    assert sorted(tokens(target)) == sorted(json.loads(line)["token"] for line in lines[:5])
    assert target.import_items(lines) == {"pending": 5, COMPLETED: 0, FAILED: 0, "skipped": 5}
    stored_once(target, lines)


def test_an_import_of_a_truncated_file_then_of_the_whole_file_stores_each_item_once(
        target: Queue) -> None:
    lines = numbered(6)
    truncated = lines[:5] + [lines[5][:40]]  # the export was cut off mid-line
    with pytest.raises(InvalidArgument, match="line 6: not JSON"):
        target.import_items(truncated)
    assert len(tokens(target)) == 5
    assert target.import_items(lines)["skipped"] == 5
    stored_once(target, lines)


def test_a_lost_reply_to_an_import_write_is_resent_and_read_back(
        proxy: FaultProxy, target: Queue) -> None:
    """The fourth write applied, its reply was lost: the transport resends it, etcd says
    "already exists", and our put token there says it is ours."""
    lines = numbered(6)
    once = Once(token_of(lines[3]))
    proxy.hold("down", match=once)
    with through(proxy, target.name) as importer:
        counts = importer.import_items(lines)
    assert once.matched and counts["pending"] == 6
    writes = [r for r in proxy.requests if re.match(IMPORT_WRITE, r)]
    assert len(writes) == 7  # the fourth twice
    stored_once(target, lines)


def test_a_resent_import_write_that_lands_after_its_item_finished_does_not_run_it_again(
        proxy: FaultProxy, target: Queue, etcd_url: str) -> None:
    """The first write's first copy is held in flight; the resend stores the item, which
    is claimed and completed; then the held copy lands and creates it again.  It carries
    "q", so its first claim finds the record (C3) and removes it: it never runs twice.
    The finisher's lock lingers (F4 skipped): the copy is held (running, as under any
    lock: docs S1) until the lock expires; then the first claim removes it."""
    lines = numbered(1)
    once = Once(IMPORT_WRITE)
    proxy.hold("up", match=once)
    with through(proxy, target.name) as importer:
        assert importer.import_items(lines)["pending"] == 1
    assert once.matched
    with Queue(etcd_url, target.name, lock_ttl=2) as consumer:
        claim = consumer.claim(timeout=BOUND)
        assert claim is not None and claim.payload == {"n": 0}
        claim.complete()
        proxy.release()  # the held copy lands now
        wait_until(lambda: target._protocol.read("work", claim.id) is not None, BOUND,
                   message="the held copy to land")

        def removed_unrun() -> bool:
            assert consumer.claim(timeout=0.5) is None
            return target._protocol.read("work", claim.id) is None
        wait_until(removed_unrun, BOUND, message="a claim to remove the copy (C3)")
    assert [i.payload for i in target.items(COMPLETED)] == [{"n": 0}]
    assert target.stats() == {"pending": 0, "running": 0, COMPLETED: 1, FAILED: 0}


def test_two_imports_at_once_take_turns(proxy: FaultProxy, target: Queue, etcd_url: str,
                                        caplog: pytest.LogCaptureFixture) -> None:
    """The first import is held at its fourth write; a second one waits for its lock
    instead of listing a queue the first is still writing, then skips every line."""
    lines = numbered(8)
    proxy.hold("up", match=token_of(lines[3]))
    with through(proxy, target.name, timeout=10, deadline=10) as first, \
            Queue(etcd_url, target.name) as second, \
            caplog.at_level(logging.WARNING, logger="etcdq_v2"):
        first_thread, first_done = in_background(lambda: first.import_items(lines))
        wait_until(lambda: proxy.held(), BOUND, message="the first import to be held")
        second_thread, second_done = in_background(lambda: second.import_items(lines))
        wait_until(lambda: "waiting for another import" in caplog.text
                   or not second_thread.is_alive(), BOUND, message="the second import to wait")
        proxy.release()
        first_thread.join(BOUND)
        second_thread.join(BOUND)
    assert first_done["returned"]["pending"] == 8, first_done
    assert second_done["returned"]["skipped"] == 8, second_done
    stored_once(target, lines)


def test_an_import_that_stalls_past_its_lock_stops(proxy: FaultProxy, target: Queue) -> None:
    """A write held longer than lock_ttl: the import lock expires (another import could
    have begun), so the next refresh fails and the import stops; a re-run finishes it."""
    lines = numbered(5)
    proxy.hold("up", match=token_of(lines[2]))
    with through(proxy, target.name, timeout=8, deadline=8, lock_ttl=1) as importer:
        thread, done = in_background(lambda: importer.import_items(lines))
        wait_until(lambda: proxy.held(), BOUND, message="the third write to be held")
        wait_until(lambda: target._protocol.read("locks", "0" * 20) is None, BOUND,
                   message="the import lock to expire")
        proxy.release()
        thread.join(BOUND)
    assert isinstance(done.get("raised"), LockLost), done
    assert len(tokens(target)) == 3
    assert target.import_items(lines)["skipped"] == 3
    stored_once(target, lines)


def test_an_import_whose_listing_outlasts_its_lock_stops_before_writing(
        proxy: FaultProxy, target: Queue, etcd_url: str) -> None:
    """I2 is slow (one listing held in the proxy, as a slow link or a big queue would
    make it): the import lock (lock_ttl 1 s) expires and a second import takes it and
    stores every line.  The first import then ends its listings: its I4 finds the lock
    gone (LockLost) and it writes nothing; each item is stored once."""
    lines = numbered(5)
    proxy.hold("up", match=rb"GET /v2/keys/\S*/completed\?")  # I2's second listing
    with through(proxy, target.name, timeout=8, deadline=8, lock_ttl=1) as first, \
            Queue(etcd_url, target.name, lock_ttl=1) as second:
        thread, done = in_background(lambda: first.import_items(lines))
        wait_until(lambda: proxy.held(), BOUND, message="the first import's I2 to be held")
        assert second.import_items(lines)["pending"] == 5  # waits for the lock to expire
        proxy.release()
        thread.join(BOUND)
    assert isinstance(done.get("raised"), LockLost), done
    stored_once(target, lines)


# -- bad lines ------------------------------------------------------------------------------

GOOD = numbered(1)[0].rstrip("\n")
BAD_LINES = {
    "not JSON": ("{\"state\": ", "not JSON"),
    "not an object": ("[1, 2]", "not a JSON object"),
    "unknown state": (GOOD.replace('"pending"', '"running"'), 'state "running"'),
    "no token": (GOOD.replace('"token"', '"tok"'), "token missing"),
    "bad attempts": (GOOD.replace('"attempts": 0', '"attempts": -1'), "attempts -1"),
    "two payloads": (GOOD[:-1] + ', "payload_base64": ""}', "exactly one of payload"),
    "bad base64": (GOOD.replace('"payload": {"n": 0}', '"payload_base64": "%%"'),
                   "not base64"),
    "NaN": (GOOD.replace('{"n": 0}', "NaN"), "JSON"),
    "record without node": (GOOD.replace('"pending"', '"completed"'), "claim missing"),
    "too large": (GOOD.replace('{"n": 0}', json.dumps("x" * (1 << 20))), "too large"),
    "not UTF-8": (b'{"state": "pending", "token": "\xff"}', "utf-8"),
    # json.loads raises RecursionError, float() OverflowError: neither is a ValueError.
    "deeply nested": (GOOD.replace('{"n": 0}', "[" * 100_000 + "]" * 100_000),
                      "nested too deeply"),
    "huge created": (GOOD.replace("1700000000.0", "1" + "0" * 400), "out of range"),
}


@pytest.mark.parametrize("name", BAD_LINES)
def test_a_bad_line_is_refused_by_number_and_nothing_is_stored_for_it(
        target: Queue, name: str) -> None:
    bad, fragment = BAD_LINES[name]
    lines: List[Any] = ["\n", GOOD + "\n", bad, numbered(2)[1]]  # a blank line is skipped
    with pytest.raises(InvalidArgument, match=r"^line 3: ") as raised:
        target.import_items(lines)
    assert fragment in str(raised.value)
    assert tokens(target) == ["token-0000"]
    assert target._protocol.read("locks", "0" * 20) is None  # the lock went with it


# -- the command line -----------------------------------------------------------------------

def etcdq(url: str, *args: str, **kwargs: Any) -> "Any":
    return run_etcdq(args, env={**os.environ, "ETCDQ_ENDPOINTS": url}, **kwargs)


def test_etcdq_export_and_import(source: Queue, target: Queue, etcd_url: str,
                                 tmp_path: Path) -> None:
    populate(source, etcd_url)
    exported = etcdq(etcd_url, "export", source.name, input=b"")
    assert exported.returncode == 0 and exported.stderr == b""
    assert exported.stdout.decode().splitlines(keepends=True) == list(source.export_items())
    (tmp_path / "items.jsonl").write_bytes(exported.stdout)
    done = ok(etcdq(etcd_url, "import", target.name, str(tmp_path / "items.jsonl")))
    assert done == ("stored 8 (pending 4, completed 2, failed 2); "
                    "skipped 0 already in the queue\n")
    again = etcdq(etcd_url, "--json", "import", target.name, input=exported.stdout)
    assert again.returncode == 0
    assert json.loads(again.stdout) == {"pending": 0, COMPLETED: 0, FAILED: 0, "skipped": 8}
    running = etcdq(etcd_url, "export", source.name, "--state", "running", input=b"")
    assert [json.loads(line)["payload"] for line in running.stdout.splitlines()] == ["running"]


def test_etcdq_export_and_import_exit_codes(source: Queue, target: Queue, etcd_url: str,
                                            tmp_path: Path, proxy: FaultProxy) -> None:
    source.put_many([{"n": n, "pad": "x" * 300} for n in range(300)])
    proxy.cut(50_000)  # the listing breaks off: the output is incomplete
    assert_user_error(etcdq(proxy.url, "export", source.name), 3, "broke off")
    bad = etcdq(etcd_url, "import", target.name, input=GOOD + "\n{oops\n")
    assert_user_error(bad, 2, "line 2: not JSON")
    deep = etcdq(etcd_url, "import", target.name, input=BAD_LINES["deeply nested"][0])
    assert_user_error(deep, 2, "line 1: nested too deeply")
    assert tokens(target) == ["token-0000"]
    assert_user_error(etcdq(etcd_url, "import", target.name, str(tmp_path / "nope")), 2,
                      "cannot read")
    unreachable = etcdq("http://127.0.0.1:9", "--request-timeout", "0.2", "import",
                        target.name, input=GOOD + "\n")
    assert_user_error(unreachable, 3)
    wrong = etcdq(etcd_url, "export", target.name, "--state", "lost")
    assert wrong.returncode == 2 and "invalid choice" in wrong.stderr


@pytest.mark.parametrize("verb", ["export", "import"])
def test_the_verbs_help_says_what_they_do(verb: str) -> None:
    text = ok(run_etcdq([verb, "--help"]))
    assert "ETCDQ_ENDPOINTS" in text and ("put token" in text or "running" in text)
    assert re.search(rf"^\s+{verb}\s", ok(run_etcdq(["--help"])), re.MULTILINE)


# -- memory ---------------------------------------------------------------------------------

def fill(queue: Queue, count: int) -> None:
    """``count`` items of ~300 bytes, put from 8 threads (a few seconds for 20,000)."""
    def put(start: int) -> None:
        queue.put_many([{"n": n, "pad": "x" * 250} for n in range(start, count, 8)])
    threads = [threading.Thread(target=put, args=(start,)) for start in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BOUND * 3)


def export_peak(queue: Queue) -> int:
    """Peak bytes Python allocated while exporting the queue (the lines are counted, not kept)."""
    tracemalloc.start()
    try:
        count = sum(1 for _ in queue.export_items())
        return tracemalloc.get_traced_memory()[1] if count else 0
    finally:
        tracemalloc.stop()


def test_the_exports_memory_does_not_grow_with_the_queue(etcd_url: str,
                                                         queue_name: str) -> None:
    """5,000 items, then 20,000 (a listing of ~7 MB, which decoded whole takes ~60 MB):
    the export's peak stays that of one piece of the body and one item."""
    peaks = {}
    with Queue(etcd_url, queue_name) as queue:
        for count in (5_000, 20_000):
            fill(queue, count - queue.stats()["pending"])
            peaks[count] = export_peak(queue)
    print(f"export peak (tracemalloc): {peaks}")
    assert 0 < peaks[20_000] < peaks[5_000] * 1.25 + 100_000, peaks
    assert peaks[20_000] < 2_000_000, peaks



# -- the documented way off v2 (docs/leaving-etcd-v2.md) ----------------------------------

def readme_command(start: str) -> List[str]:
    """The command line of docs/leaving-etcd-v2.md that starts with ``start``, split as a
    shell would."""
    readme = (Path(__file__).resolve().parent.parent / "docs" / "leaving-etcd-v2.md").read_text()
    [line] = [line for line in readme.splitlines() if line.startswith(start)]
    return shlex.split(line.split("  #")[0])


def etcdctl_beside(etcd_binary: str) -> Optional[str]:
    beside = Path(etcd_binary).with_name("etcdctl")
    return str(beside) if beside.exists() else shutil.which("etcdctl")


@pytest.mark.parametrize("tool", ["curl", "etcdctl"])
def test_the_readmes_command_removes_every_key_of_the_prefix(
        tool: str, etcd_url: str, etcd_binary: str, queue_name: str) -> None:
    """Step 5 of "Leaving etcd v2", as written there (another prefix and host): items,
    locks, records and the directories themselves are gone."""
    prefix = f"t-{queue_name[-8:]}"
    with Queue(etcd_url, "jobs", prefix=f"/{prefix}", max_attempts=1) as queue:
        queue.put_many(["a", "b", "c"])
        queue.claim().complete("done")
        queue.claim().fail("no")
        assert queue.claim() is not None  # its lock stays
    if tool == "curl":
        command = readme_command("curl -X DELETE")
        command[-1] = command[-1].replace("http://old:2379", etcd_url).replace("etcdq", prefix)
    else:
        command = readme_command("ETCDCTL_API=2 etcdctl")
        command = [etcdctl_beside(etcd_binary) or "etcdctl", *command[2:]]
        command = [etcd_url if arg == "http://old:2379" else arg.replace("etcdq", prefix)
                   for arg in command]
    if shutil.which(command[0]) is None:
        pytest.skip(f"no {tool}")
    subprocess.run(command, check=True, capture_output=True, timeout=30,
                   env={**os.environ, "ETCDCTL_API": "2"})
    root = json.loads(urllib.request.urlopen(f"{etcd_url}/v2/keys/").read())
    assert f"/{prefix}" not in [node["key"] for node in root["node"].get("nodes", [])]
