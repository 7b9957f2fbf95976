"""Export and import (etcdq_v2/transfer.py, docs/protocol.md "export" and "import").

A listing is decoded as it arrives (etcdq_v2/listing.py): cut anywhere, it
gives etcd's nodes; through real etcd it equals the whole reply.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List

import pytest
from hypothesis import given, settings, strategies as st

from etcdq_v2 import Queue, Unavailable, connect
from etcdq_v2.errors import KeyMissing
from etcdq_v2.listing import listed_nodes

from faultproxy import FaultProxy


@pytest.fixture
def target(etcd_url: str, queue_name: str) -> Iterator[Queue]:
    with Queue(etcd_url, f"{queue_name}-to") as queue:
        yield queue


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
