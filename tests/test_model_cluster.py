"""The model of etcd v2: what no single real member can be scripted to show.

Lagging and frozen members, restarts, snapshot restores, leader loss, a
watcher that falls behind, clock skew, determinism and the model's own
imports.  The behaviours come from ../shared/etcd-v2-notes.md (live
observations) and etcd's v2store source; test_model_differential checks the
single-member replies against real etcd.
"""
from __future__ import annotations

import ast
import json
import random
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import etcdq_v2.testing.sim as sim
from etcdq_v2.errors import AlreadyExists, CompareFailed, KeyMissing
from etcdq_v2.testing.sim import Cluster, Reply, gojson
from etcdq_v2.transport import Transport
from etcdq_v2.wire import Response
from etcdq_v2.testing.sim.cluster import REQUEST_TIMEOUT, SWEEP_PERIOD
from etcdq_v2.testing.sim.store import expiration, ttl_left

T0 = 1_800_000_000.0
SIM_DIR = Path(sim.__file__).parent
#: What the model may import: the standard library's pure modules, and itself.
ALLOWED = {"__future__", "collections", "dataclasses", "datetime", "enum", "functools", "heapq",
           "json", "re", "typing", "urllib.parse"}


def _send(cluster: Cluster, member: int, method: str, key: str, body: Optional[str] = None,
          query: str = "", now: float = T0) -> Reply:
    target = f"/v2/keys{key}" + (f"?{query}" if query else "")
    reply = cluster.request(member, method, target, body, now).reply
    assert reply is not None, f"{method} {key} got no reply at {now}"
    return reply


def _body(reply: Reply) -> Dict[str, Any]:
    return json.loads(reply.body)


def _events(reply: Reply) -> List[Dict[str, Any]]:
    assert reply.watch is not None
    return [json.loads(line) for line in reply.watch.take()]


def test_the_model_imports_no_io_clock_or_randomness() -> None:
    # The model's modules; the simulator around it (runtime.py, the scheduler,
    # whose job is threads; net, actors, invariants, simulation, the CLI) is not.
    model = ("__init__.py", "api.py", "cluster.py", "gojson.py", "store.py")
    for source in sorted(p for p in SIM_DIR.glob("*.py") if p.name in model):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [] if node.level else [node.module or ""]
            else:
                continue
            for name in names:
                assert name in ALLOWED, f"{source.name} imports {name}"


def _run(seed: int) -> List[bytes]:
    """A mixed run whose every reply and event is recorded."""
    rng = random.Random(seed)
    cluster = Cluster(3, start=T0, skews=[0.0, 0.2, -0.3], shuffle=rng.shuffle)
    stream = _send(cluster, 1, "GET", "/q", query="wait=true&recursive=true&stream=true")
    out: List[bytes] = []
    now = T0
    for step in range(300):
        now += rng.choice([0.0, 0.01, 0.3])
        member = rng.randrange(3)
        choice = rng.randrange(4)
        if choice == 0:
            reply = _send(cluster, member, "POST", "/q/work", f"value={step}&ttl=1", now=now)
        elif choice == 1:
            reply = _send(cluster, member, "PUT", f"/q/locks/{step % 7}",
                          f"value={step}&ttl=2&prevExist=false", now=now)
        elif choice == 2:
            reply = _send(cluster, member, "GET", "/q/work", now=now)
        else:
            reply = _send(cluster, member, "GET", "/q", query="recursive=true&quorum=true",
                          now=now)
        out += [reply.body, reply.headers["x-etcd-index"].encode()]
        assert stream.watch is not None
        out += stream.watch.take()
    return out


def test_the_same_calls_give_the_same_replies_byte_for_byte() -> None:
    assert _run(7) == _run(7)
    assert _run(7) != _run(8)  # the seed matters: the comparison can fail


def test_a_lagging_member_answers_local_reads_from_its_own_older_copy() -> None:
    cluster = Cluster(3, start=T0)
    _send(cluster, 0, "PUT", "/k", "value=old")
    cluster.hold(2)
    _send(cluster, 0, "PUT", "/k", "value=new")
    assert _body(_send(cluster, 2, "GET", "/k"))["node"]["value"] == "old"
    assert _send(cluster, 2, "GET", "/k").headers["x-etcd-index"] == "1"
    assert _body(_send(cluster, 1, "GET", "/k"))["node"]["value"] == "new"
    quorum = cluster.request(2, "GET", "/v2/keys/k?quorum=true", None, T0)
    assert quorum.reply is None  # answered once the member has applied it
    cluster.apply(2, T0)
    assert quorum.reply is not None and _body(quorum.reply)["node"]["value"] == "new"


def test_a_write_on_a_lagging_member_is_answered_when_it_applies() -> None:
    cluster = Cluster(3, start=T0)
    cluster.hold(1)
    pending = cluster.request(1, "PUT", "/v2/keys/k", "value=v", T0)
    assert pending.reply is None
    assert _body(_send(cluster, 0, "GET", "/k"))["node"]["value"] == "v"  # committed
    cluster.apply(1, T0 + 1)
    assert pending.reply is not None and pending.reply.status == 201


def test_a_restart_ends_every_watch_on_the_member_and_keeps_its_store() -> None:
    cluster = Cluster(3, start=T0)
    watch = _send(cluster, 1, "GET", "/q", query="wait=true&recursive=true&stream=true")
    other = _send(cluster, 2, "GET", "/q", query="wait=true&recursive=true&stream=true")
    _send(cluster, 0, "PUT", "/q/a", "value=1")
    cluster.restart(1, T0 + 1)
    _send(cluster, 0, "PUT", "/q/b", "value=2", now=T0 + 1)
    assert watch.watch is not None and watch.watch.ended and watch.watch.take() == []
    assert [e["node"]["key"] for e in _events(other)] == ["/q/a", "/q/b"]
    assert _body(_send(cluster, 1, "GET", "/q/b", now=T0 + 1))["node"]["value"] == "2"


def test_a_snapshot_restore_keeps_the_watch_open_and_it_misses_what_the_snapshot_covered(
        ) -> None:
    cluster = Cluster(3, start=T0)
    watch = _send(cluster, 1, "GET", "/q", query="wait=true&recursive=true&stream=true")
    cluster.freeze(1, T0)
    for n in range(5):
        _send(cluster, 0, "PUT", f"/q/missed{n}", "value=x")
    cluster.restore_from_snapshot(1, T0 + 1)
    cluster.thaw(1, T0 + 1)
    _send(cluster, 0, "PUT", "/q/seen", "value=y", now=T0 + 1)
    assert [e["node"]["key"] for e in _events(watch)] == ["/q/seen"]
    assert watch.watch is not None and not watch.watch.ended
    assert _send(cluster, 1, "GET", "/q/missed4", now=T0 + 1).status == 200


def test_the_leaders_snapshot_every_n_entries_is_what_a_restored_member_starts_from() -> None:
    cluster = Cluster(3, start=T0, snapshot_count=10)
    watch = _send(cluster, 2, "GET", "/q", query="wait=true&recursive=true&stream=true")
    cluster.freeze(2, T0)
    for n in range(25):  # snapshots after entries 10 and 20
        _send(cluster, 0, "PUT", f"/q/k{n}", "value=x")
    cluster.restore_from_snapshot(2, T0 + 1)
    cluster.thaw(2, T0 + 1)
    assert [e["node"]["key"] for e in _events(watch)] == [f"/q/k{n}" for n in range(20, 25)]
    assert _send(cluster, 2, "GET", "/q/k24", now=T0 + 1).status == 200


def test_catching_up_by_the_log_drops_a_watcher_that_falls_100_events_behind() -> None:
    cluster = Cluster(2, start=T0)
    watch = _send(cluster, 1, "GET", "/q", query="wait=true&recursive=true&stream=true")
    cluster.hold(1)
    for n in range(150):
        _send(cluster, 0, "PUT", f"/q/k{n}", "value=x")
    cluster.release(1, T0 + 1)
    _send(cluster, 0, "PUT", "/q/after", "value=y", now=T0 + 1)
    keys = [e["node"]["key"] for e in _events(watch)]
    assert keys == [f"/q/k{n}" for n in range(100)]  # the buffered 100, then nothing
    assert watch.watch is not None and watch.watch.dropped


def test_keys_expire_at_the_leaders_sweep_after_their_expiration() -> None:
    cluster = Cluster(1, start=T0)
    created = _body(_send(cluster, 0, "PUT", "/lock", "value=me&ttl=1", now=T0 + 0.1))
    assert created["node"]["expiration"] == expiration(round((T0 + 1.1) * 1e9))
    late = _send(cluster, 0, "GET", "/lock", now=T0 + 1.2)  # past expiration, before the sweep
    assert late.status == 200 and "ttl" not in _body(late)["node"]
    assert _send(cluster, 0, "GET", "/lock", now=T0 + 1.5).status == 404
    expired = _send(cluster, 0, "GET", "/lock", query="wait=true&waitIndex=2", now=T0 + 1.5)
    event = _events(expired)[0]
    assert event["action"] == "expire" and event["prevNode"]["value"] == "me"


def test_no_leader_no_sweep_and_proposals_time_out() -> None:
    cluster = Cluster(3, start=T0)
    _send(cluster, 0, "PUT", "/lock", "value=me&ttl=1")
    cluster.elect(None, T0 + 0.2)
    pending = cluster.request(1, "PUT", "/v2/keys/x", "value=1", T0 + 0.3)
    cluster.advance(T0 + 5)
    assert _send(cluster, 1, "GET", "/lock", now=T0 + 5).status == 200
    assert pending.reply is None
    cluster.advance(T0 + 0.3 + REQUEST_TIMEOUT)
    assert pending.reply is not None and pending.reply.status == 500
    assert _body(pending.reply)["cause"] == \
        "etcdserver: request timed out, possibly due to previous leader failure"
    cluster.elect(2, T0 + 8)
    assert _send(cluster, 1, "GET", "/lock", now=T0 + 8 + SWEEP_PERIOD).status == 404
    assert _send(cluster, 1, "GET", "/x", now=T0 + 9).status == 404  # never applied


def test_a_leader_whose_clock_is_ahead_expires_keys_early() -> None:
    cluster = Cluster(2, start=T0, skews=[0.0, 3.0])
    _send(cluster, 0, "PUT", "/lock", "value=me&ttl=5")
    cluster.elect(1, T0 + 0.1)
    assert _send(cluster, 0, "GET", "/lock", now=T0 + 1.5).status == 200
    assert _send(cluster, 0, "GET", "/lock", now=T0 + 2.1).status == 404


def test_a_request_held_by_a_frozen_member_gets_its_ttl_when_it_thaws() -> None:
    cluster = Cluster(3, start=T0)
    cluster.freeze(2, T0)
    pending = cluster.request(2, "PUT", "/v2/keys/lock", "value=late&ttl=5", T0)
    assert pending.reply is None
    cluster.thaw(2, T0 + 20)
    assert pending.reply is not None
    node = _body(pending.reply)["node"]
    assert node["expiration"] == expiration(round((T0 + 25) * 1e9)) and node["ttl"] == 5


def test_a_stopped_member_refuses_connections() -> None:
    cluster = Cluster(3, start=T0)
    cluster.stop(1, T0)
    with pytest.raises(ConnectionRefusedError):
        cluster.request(1, "GET", "/v2/keys/", None, T0)


@pytest.mark.parametrize("left, reported", [(0, 0), (1, 1), (999_999_999, 1),
                                            (1_000_000_001, 2), (-1, 0), (-1_000_000_001, -1)])
def test_ttl_is_the_seconds_left_rounded_up(left: int, reported: int) -> None:
    assert ttl_left(10**18 + left, 10**18) == reported


def test_expiration_is_written_as_go_writes_a_utc_time() -> None:
    assert expiration(1_800_000_000_120_000_000) == "2027-01-15T08:00:00.12Z"
    assert expiration(1_800_000_000_000_000_000) == "2027-01-15T08:00:00Z"
    assert expiration(1_800_000_000_000_000_001) == "2027-01-15T08:00:00.000000001Z"


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.one_of(st.text(), st.integers(0, 2**64), st.booleans()),
                    lambda inner: st.dictionaries(st.text(max_size=5), inner, max_size=4)
                    | st.lists(inner, max_size=4), max_leaves=12))
def test_the_fast_json_path_writes_what_the_go_transcription_writes(value: Any) -> None:
    assert gojson.encode(value) == gojson._slow(value)
    assert json.loads(gojson.encode(value)) == value


class _ModelMember:
    """What Transport needs of a wire.Member, answered by the model."""

    def __init__(self, cluster: Cluster, member: int) -> None:
        self.cluster, self.member, self.url = cluster, member, f"sim://{member}"

    def request(self, method: str, path: str, body: Optional[str], timeout: float,
                waiting: Any = None) -> Response:
        assert waiting is None  # every reply is made at once: no GET is left unanswered
        reply = self.cluster.request(self.member, method, path, body, T0).reply
        assert reply is not None
        return Response(reply.status, reply.headers, reply.body)

    def close(self) -> None:
        pass


def test_the_library_transport_reads_the_models_replies_as_etcds() -> None:
    cluster = Cluster(3, start=T0)
    transport = Transport("http://127.0.0.1:1")
    transport._members = [_ModelMember(cluster, n) for n in range(3)]  # the shape, not faults
    created = transport.post("/q/work", "item")
    assert created.index == 1 and created.node["key"] == "/q/work/00000000000000000001"
    lock = transport.put("/q/locks/1", "me", ttl=30, prev_exist=False)
    with pytest.raises(AlreadyExists):
        transport.put("/q/locks/1", "you", ttl=30, prev_exist=False)
    with pytest.raises(CompareFailed):
        transport.put("/q/locks/1", "you", prev_index=lock.index + 1)
    transport.delete("/q/locks/1", prev_index=lock.index)
    with pytest.raises(KeyMissing):
        transport.get("/q/locks/1", quorum=True)
    assert [n["value"] for n in transport.get("/q/work", sorted=True).node["nodes"]] == ["item"]
