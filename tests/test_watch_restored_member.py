"""A watching view on a member restored from a raft snapshot learns what the snapshot covered.

etcd catches up a member that fell far behind with a raft snapshot: it
replaces the member's v2 store, but keeps the watchers registered on it.  A
stream on that member then misses every write the snapshot covered, and stays
open; later events come as usual.  A watching view's round ends ROUND after
its listing, events or not, so within ROUND plus one listing it knows of an
item put in the gap, and frees an item whose lock went in it.
"""
from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, List, Set, Tuple
from urllib.parse import urlsplit

import pytest
import urllib3

import etcdq_v2.viewstate as view_module
from etcdq_v2 import Queue
from etcdq_v2.testing.cluster import EtcdCluster

from helpers import wait_until

#: A member takes a snapshot every this many writes; etcd 3.5 keeps 5,000
#: entries of its log after one, so a member that misses more gets a snapshot.
SNAPSHOT_COUNT = 1000
FILLER_WRITES = 7000
#: Writes in flight at once while filling: raft batches them into fewer fsyncs.
WRITERS = 32
#: The round of the consumer's view here (60 s in use), so the test stays short.
ROUND = 3.0
#: What the member logs once the snapshot replaced its store ("applied incoming
#: Raft snapshot" from etcd 3.5, "applied incoming snapshot at index N" from 3.4).
APPLIED = re.compile(r"applied incoming (raft )?snapshot", re.IGNORECASE)


@pytest.fixture
def snapshot_cluster(etcd_binary: str, tmp_path: Path) -> Iterator[EtcdCluster]:
    """3 members that snapshot every SNAPSHOT_COUNT writes."""
    members = EtcdCluster(tmp_path / "cluster", 3, binary=etcd_binary,
                          snapshot_count=SNAPSHOT_COUNT)
    members.start()
    try:
        yield members
    finally:
        members.stop()


class _Keys:
    """The keys of every event a raw stream on ``url`` delivers for ``key``."""

    def __init__(self, url: str, key: str) -> None:
        parts = urlsplit(url)
        self._connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        self._connection.request("GET", f"/v2/keys{key}?wait=true&recursive=true&stream=true")
        self._response = self._connection.getresponse()  # registered once it answers
        assert self._response.status == 200
        #: (key, modifiedIndex) of each event
        self.seen: Set[Tuple[str, int]] = set()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in iter(self._response.readline, b""):
                if line.strip():
                    node = json.loads(line)["node"]
                    self.seen.add((node["key"], node["modifiedIndex"]))
        except (OSError, ValueError, http.client.HTTPException):
            pass  # closed at the end of the test

    def delivered(self, key: str, index: int) -> bool:
        return (key, index) in self.seen

    def close(self) -> None:
        # Shut down first: close() waits for the reader's lock, held until recv returns.
        sock = self._connection.sock
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
        self._connection.close()


def _fill(url: str, count: int) -> None:
    """``count`` writes outside the queue, through the member at ``url``."""
    http = urllib3.PoolManager(maxsize=WRITERS)

    def write(start: int) -> None:
        for n in range(start, count, WRITERS):
            reply = http.request("PUT", f"{url}/v2/keys/filler/{n}", fields={"value": "x"},
                                 encode_multipart=False)
            assert reply.status in (200, 201), reply.data
    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(write, range(WRITERS)))


def _put_every(queue: Queue, seconds: float, stop: threading.Event) -> List[str]:
    """Put an item every ``seconds`` until ``stop``, in a thread: the ids put.  The
    stream is never silent, so no idle end of it lists again."""
    ids: List[str] = []

    def put() -> None:
        while not stop.wait(seconds):
            ids.append(queue.put({"job": "later"}))
    threading.Thread(target=put, daemon=True).start()
    return ids


def test_a_view_watching_a_member_restored_from_a_snapshot_learns_what_it_covered(
        snapshot_cluster: EtcdCluster, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # raising=False: code without the round keeps its stream as long as events come
    monkeypatch.setattr(view_module, "ROUND", ROUND, raising=False)
    cluster = snapshot_cluster
    leader = cluster.leader_index()
    lagging = (leader + 1) % 3
    member, leader_url = cluster.members[lagging], cluster.members[leader].url
    with Queue(member.url, queue_name) as consumer, Queue(leader_url, queue_name) as producer, \
            Queue(leader_url, queue_name) as holder:
        held_id = producer.put({"job": "held"})
        held = holder.claim()
        assert held is not None and held.id == held_id
        assert consumer.claim(timeout=0) is None  # all taken: the view watches `member`
        view = consumer._ensure_view()
        assert view.watching_locks and not view.state.is_free(held_id)
        raw = _Keys(member.url, consumer.layout.root)
        stop = threading.Event()
        try:
            cluster.pause(lagging)
            # First the writes that make the leader snapshot and compact its log:
            # the gap's, sent before the peer connection filled, would still come.
            _fill(leader_url, FILLER_WRITES)
            gap_start = producer.etcd.put(f"{consumer.layout.root}/gap", "x").written_index
            held.release()  # a lock goes in the gap
            gap_id = producer.put({"job": "X"})  # and an item comes in it
            cluster.resume(lagging)
            resumed = time.monotonic()
            wait_until(lambda: APPLIED.search(member.log_text()), 30,
                       message=f"{member.name} to apply a raft snapshot")
            later = _put_every(producer, 0.3, stop)
            wait_until(lambda: later and raw.delivered(consumer.layout.key("work", later[0]),
                                                       int(later[0])),
                       15, message="the raw stream to deliver a later item")
            gap = {event for event in raw.seen if gap_start < event[1] <= int(gap_id)}
            assert not gap, f"etcd's stream delivered the gap's events: {gap}"
            got = _claims_until(consumer, {gap_id, held_id}, resumed + ROUND
                                + consumer.etcd.deadline + 10)
        finally:
            stop.set()
            raw.close()
        assert {gap_id, held_id} <= got, (
            f"not claimed {ROUND:g} s (the view's round) + a listing after the member caught "
            f"up: {sorted({gap_id, held_id} - got)}; claimed {len(got)} later items; the "
            f"view holds {sorted(view.state.items)}, locks {view.state.locks}")


def _claims_until(queue: Queue, wanted: Set[str], deadline: float) -> Set[str]:
    """Claim and complete until ``deadline`` (time.monotonic()) or until every
    one of ``wanted`` was claimed: the ids claimed."""
    got: Set[str] = set()
    while not wanted <= got and time.monotonic() < deadline:
        claim = queue.claim(timeout=0.2)
        if claim is not None:
            got.add(claim.id)
            claim.complete()
    return got
