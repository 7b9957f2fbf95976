"""The model's member faults do to a watch or a request what they do on real etcd.

A frozen member, a restart, a snapshot restore and a watcher that falls
behind, each run on real members (the default etcd binary) and on the
model, with the outcomes compared.
"""
from __future__ import annotations

import json
import secrets
import socket
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Tuple

import pytest

from etcdq_v2.errors import Unavailable
from etcdq_v2.server import EtcdCluster, EtcdServer
from etcdq_v2.testing.sim import Cluster
from etcdq_v2.testing.sim.store import WATCHER_BUFFER
from etcdq_v2.transport import Transport
from etcdq_v2.wire import Member

from test_model_differential import rfc3339_seconds

T0 = 1_800_000_000.0
#: How long the frozen member holds the request before it thaws.
HELD = 3.0
TTL = 5


def _member(url: str) -> Member:
    return Member(url, tls=None, username=None, password=None)


def _stream_keys(blocks: Iterator[bytes], count: Optional[int] = None) -> List[str]:
    """The keys of what a real stream delivered until it stayed idle or broke off
    (or ``count`` events came)."""
    keys: List[str] = []
    try:
        while count is None or len(keys) < count:
            block = next(blocks, None)
            if block is None:
                break
            keys += [json.loads(line)["node"]["key"] for line in block.splitlines() if line]
    except Unavailable:
        keys.append("<ended>")
    return keys


def _model_keys(watch: Any) -> List[str]:
    keys = [json.loads(line)["node"]["key"] for line in watch.take()]
    return keys + (["<ended>"] if watch.ended else [])


def test_a_request_held_by_a_frozen_member_counts_its_ttl_from_the_thaw(
        own_etcd: EtcdServer, background: Callable[[Callable[[], Any]], "Future[Any]"]
        ) -> None:
    key = f"/held{secrets.token_hex(4)}"
    own_etcd.pause()
    sent = time.time()
    reply = background(lambda: _member(own_etcd.url).request(
        "PUT", f"/v2/keys{key}", f"value=late&ttl={TTL}", 30.0))
    time.sleep(HELD)
    own_etcd.resume()
    real = json.loads(reply.result(timeout=30).body)["node"]
    cluster = Cluster(1, start=T0)
    cluster.freeze(0, T0)
    pending = cluster.request(0, "PUT", f"/v2/keys{key}", f"value=late&ttl={TTL}", T0)
    cluster.thaw(0, T0 + HELD)
    assert pending.reply is not None
    model = json.loads(pending.reply.body)["node"]
    real_offset = rfc3339_seconds(real["expiration"]) - sent
    model_offset = rfc3339_seconds(model["expiration"]) - T0
    assert model_offset == HELD + TTL
    assert abs(real_offset - model_offset) < 1.0, (real, model)
    assert model["ttl"] == TTL and abs(real["ttl"] - TTL) <= 1


def test_a_restart_ends_every_stream_of_the_member(own_etcd: EtcdServer) -> None:
    prefix = f"/rs{secrets.token_hex(4)}"
    blocks = Transport(own_etcd.url).stream(prefix, idle_timeout=2.0).blocks()
    _member(own_etcd.url).request("PUT", f"/v2/keys{prefix}/before", "value=1", 5.0)
    real = _stream_keys(blocks, count=1)
    own_etcd.restart()
    _member(own_etcd.url).request("PUT", f"/v2/keys{prefix}/after", "value=2", 5.0)
    real += _stream_keys(blocks)
    cluster = Cluster(1, start=T0)
    watch = cluster.request(0, "GET", f"/v2/keys{prefix}?wait=true&recursive=true&stream=true",
                            None, T0).reply
    assert watch is not None and watch.watch is not None
    cluster.request(0, "PUT", f"/v2/keys{prefix}/before", "value=1", T0)
    model = _model_keys(watch.watch)
    cluster.restart(0, T0 + 1)
    cluster.request(0, "PUT", f"/v2/keys{prefix}/after", "value=2", T0 + 1)
    model += _model_keys(watch.watch)
    assert model == [f"{prefix}/before", "<ended>"]
    assert real == model


#: etcd snapshots every this many entries; a follower more than this plus the
#: 5,000 entries etcd keeps behind a snapshot is caught up by a snapshot, unless
#: the entries reached it anyway: the leader's sender queues 4,096 messages and
#: the kernel buffers megabytes for a frozen follower.  Values of 2 KB overflow
#: both, so the last entries are dropped and a snapshot must bring them.
SNAPSHOT_COUNT = 1000
BEHIND = 10000
BULK = "x" * 2048
COVERED = 5


@pytest.fixture
def snapshotting_cluster(etcd_binary: str, tmp_path: Path) -> Any:
    members = EtcdCluster(tmp_path / "cluster", 3, binary=etcd_binary)
    for member in members.members:
        member.extra_args = ("--snapshot-count", str(SNAPSHOT_COUNT))
    members.start()
    try:
        yield members
    finally:
        for member in members.members:
            if member.is_paused:
                member.resume()
        members.stop()


def _writes(prefix: str) -> List[str]:
    return [f"{prefix}/other/{n % 100}" for n in range(BEHIND)]


def test_a_member_restored_from_a_snapshot_keeps_its_watch_which_misses_the_covered_events(
        snapshotting_cluster: EtcdCluster) -> None:
    """A frozen follower far behind catches up by the leader's latest snapshot, then by
    the log: its watch stays open, misses what the snapshot covered and gets what came
    after it.  Where etcd's snapshot falls among the watched writes is etcd's choice: the
    events the stream got say where, and the model, with its snapshot taken there, must
    deliver exactly those."""
    prefix = f"/sn{secrets.token_hex(4)}"
    leader_at = snapshotting_cluster.leader_index()
    leader = snapshotting_cluster.members[leader_at]
    follower_at = (leader_at + 1) % 3
    follower = snapshotting_cluster.members[follower_at]
    stream = Transport(follower.url).stream(f"{prefix}/w", idle_timeout=2.0)
    logged = follower.log_path.stat().st_size
    follower.pause()
    writer = _member(leader.url)
    writer.pipeline([("PUT", f"/v2/keys{key}", f"value={BULK}") for key in _writes(prefix)],
                    30.0, lanes=4, depth=16)
    for key in _watched(prefix):
        writer.request("PUT", f"/v2/keys{key}", "value=m", 5.0)
    writer.pipeline([("PUT", f"/v2/keys{key}", "value=x") for key in _after(prefix)], 30.0,
                    lanes=4, depth=16)  # so that a later snapshot covers the watched writes
    follower.resume()
    _caught_up(_member(follower.url), int(writer.request("GET", "/v2/keys/", None, 5.0)
                                          .headers["x-etcd-index"]))
    writer.request("PUT", f"/v2/keys{prefix}/w/seen", "value=s", 5.0)
    real = _stream_keys(stream.blocks())
    watched = _watched(prefix)
    covered = COVERED - (len(real) - 1)  # the watched writes the stream did not get
    with open(follower.log_path, "rb") as log:
        log.seek(logged)
        by_snapshot = b"applied snapshot" in log.read()
    assert real == watched[covered:] + [f"{prefix}/w/seen"], real
    assert by_snapshot or covered == 0

    # The model's leader is member 0, which takes the writes; its follower is 1,
    # whichever real member followed.
    cluster, follower_at = Cluster(3, start=T0), 1
    watch = cluster.request(follower_at, "GET",
                            f"/v2/keys{prefix}/w?wait=true&recursive=true&stream=true", None,
                            T0).reply
    assert watch is not None and watch.watch is not None
    cluster.freeze(follower_at, T0)
    for key in _writes(prefix) + watched[:covered]:
        cluster.request(0, "PUT", f"/v2/keys{key}", "value=x", T0)
    cluster.snapshot(T0)
    for key in watched[covered:] + _after(prefix):
        cluster.request(0, "PUT", f"/v2/keys{key}", "value=x", T0)
    if by_snapshot:
        cluster.restore_from_snapshot(follower_at, T0 + 1)
    cluster.thaw(follower_at, T0 + 1)
    cluster.request(0, "PUT", f"/v2/keys{prefix}/w/seen", "value=s", T0 + 1)
    model = _model_keys(watch.watch)
    assert model == real


def _watched(prefix: str) -> List[str]:
    return [f"{prefix}/w/missed{n}" for n in range(COVERED)]


def _after(prefix: str) -> List[str]:
    return [f"{prefix}/other/after{n % 100}" for n in range(SNAPSHOT_COUNT + 200)]


def _caught_up(member: Member, index: int) -> None:
    """Wait until ``member`` has applied up to ``index`` (it answers local GETs so)."""
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        try:
            if int(member.request("GET", "/v2/keys/", None, 2.0).headers["x-etcd-index"]) \
                    >= index:
                return
        except Exception:  # still catching up: the member may not answer yet
            pass
        time.sleep(0.05)
    raise AssertionError(f"the member never reached index {index}")


#: Values big enough that the kernel's buffers fill after a few hundred events.
BIG = 10_000
FLOOD = 1000


def _unread_stream(url: str, key: str) -> socket.socket:
    """A stream watch whose client reads nothing: a small receive buffer, no recv."""
    port = int(url.rsplit(":", 1)[1])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET /v2/keys{key}?wait=true&recursive=true&stream=true HTTP/1.1\r\n"
                 "Host: etcd\r\n\r\n".encode())
    return sock


def _read_until_silent(sock: socket.socket, quiet: float) -> Tuple[bytes, bool]:
    """Everything that arrives until ``quiet`` seconds pass without data; and
    whether the member closed the connection."""
    sock.settimeout(quiet)
    data = b""
    try:
        while True:
            block = sock.recv(1 << 16)
            if not block:
                return data, True
            data += block
    except socket.timeout:
        return data, False


def test_a_watcher_that_falls_behind_is_dropped_and_its_stream_stays_open_and_silent(
        own_etcd: EtcdServer) -> None:
    prefix = f"/fb{secrets.token_hex(4)}"
    sock = _unread_stream(own_etcd.url, prefix)
    try:
        time.sleep(0.3)  # registered before the writes
        writer = _member(own_etcd.url)
        writes = [("PUT", f"/v2/keys{prefix}/k{n}", "value=" + "x" * BIG) for n in range(FLOOD)]
        writer.pipeline(writes, 30.0, lanes=4, depth=16)
        data, closed = _read_until_silent(sock, 2.0)
        writer.request("PUT", f"/v2/keys{prefix}/after", "value=late", 5.0)
        later, closed_later = _read_until_silent(sock, 1.0)
    finally:
        sock.close()
    real_delivered = data.count(b'"action"')

    cluster = Cluster(1, start=T0)
    watch = cluster.request(0, "GET", f"/v2/keys{prefix}?wait=true&recursive=true&stream=true",
                            None, T0).reply
    assert watch is not None and watch.watch is not None
    for method, target, body in writes:
        cluster.request(0, method, target, body, T0)
    model_delivered = len(watch.watch.take())
    cluster.request(0, "PUT", f"/v2/keys{prefix}/after", "value=late", T0)
    assert watch.watch.dropped and not watch.watch.ended and watch.watch.take() == []

    assert 0 < real_delivered < FLOOD and model_delivered == WATCHER_BUFFER
    assert not closed and not closed_later and later == b""  # silent, open
