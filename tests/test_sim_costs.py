"""The simulator's cost counts: each request's kind, and what a completed item costs.

``etcdq_v2.testing.sim.costs`` names each request by its method, the queue
directory or key it addresses and the condition it carries; bench/costs.py
counts a run by those kinds.  A lone consumer with a backlog pays the
protocol's writes per item (P1, C1, C2, F1, F2, F3: docs/protocol.md) and
little else.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import costs as bench_costs  # noqa: E402
from etcdq_v2.testing.sim.costs import Costs, kind  # noqa: E402

Q = "/v2/keys/etcdq/q"


@pytest.mark.parametrize("method, target, body, expected", [
    ("POST", f"{Q}/work", "value=x", "POST work/"),
    ("PUT", f"{Q}/locks/00000000000000000001", "value=x&ttl=5&prevExist=false",
     "PUT locks/<id> prevExist=false"),
    ("PUT", f"{Q}/work/00000000000000000001", "value=x&prevIndex=7", "PUT work/<id> prevIndex"),
    ("PUT", f"{Q}/locks/00000000000000000001", "ttl=5&refresh=true&prevExist=true&prevValue=x",
     "PUT locks/<id> refresh prevExist=true prevValue"),
    ("DELETE", f"{Q}/work/00000000000000000001?prevIndex=9", None, "DELETE work/<id> prevIndex"),
    ("GET", f"{Q}/work?sorted=true&quorum=true", None, "GET work/ listing quorum"),
    ("GET", f"{Q}/completed/00000000000000000001?quorum=true", None,
     "GET completed/<id> read quorum"),
    ("GET", f"{Q}?wait=true&recursive=true&stream=true", None, "GET / watch"),
])
def test_each_request_is_named_by_method_place_and_condition(
        method: str, target: str, body: str, expected: str) -> None:
    assert kind(method, target, body) == expected


def test_costs_count_requests_replies_and_streamed_events_by_kind() -> None:
    costs = Costs()
    costs.request("PUT", f"{Q}/work/1", "value=x&prevIndex=7")
    costs.reply(("PUT", f"{Q}/work/1", "value=x&prevIndex=7"), b"12345")
    costs.streamed(f"{Q}?wait=true&recursive=true&stream=true", [b"ab\n", b"cde\n"])
    total = costs.total()
    assert (total.requests, total.replies, total.received) == (1, 1, 5)
    assert (total.events, total.streamed, total.from_etcd) == (2, 7, 12)


def test_a_lone_consumer_pays_the_protocols_writes_per_item() -> None:
    run = bench_costs.measure(1, seed=0, window_per_consumer=10)
    steady = run.steady
    per_item = {name: tally.requests / steady.items for name, tally in steady.kinds.items()}
    for step in ("PUT locks/<id> prevExist=false", "PUT completed/<id> prevExist=false",
                 "DELETE work/<id> prevIndex"):
        assert per_item[step] == pytest.approx(1.0, abs=0.11), (step, per_item)
    assert per_item["PUT work/<id> prevIndex"] == pytest.approx(2.0, abs=0.21)  # C2, F1
    assert 6 <= steady.total().requests / steady.items < 7
    assert steady.total().received > 0
