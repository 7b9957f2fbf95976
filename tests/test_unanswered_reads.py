"""A read unanswered at its request timeout, through the real TCP proxy against real etcd.

A key's GET (and any request but a listing) whose reply has not come by
its timeout is sent again, on a new connection: the one it went out on is
closed, so its late reply is read by no one.  A listing's (a sorted or
recursive GET) connection is kept within its call, to wait for the reply
etcd is still encoding, and closed at the call's end: a call that timed
out on every attempt leaves no connection open, and the next request on
the client reads its own reply, never the stale one of the listing
(docs/protocol.md, **Rounds**).
"""
from __future__ import annotations

from typing import Callable, List

import pytest

from etcdq_v2 import Unavailable, connect

from faultproxy import FaultProxy
from helpers import in_background, wait_until

TIMEOUT = 0.5
BOUND = 15.0  # seconds a call or a count may take before the test counts it as a hang


def _sent(proxy: FaultProxy, line: bytes) -> int:
    """How many requests whose request line begins with ``line`` the proxy saw."""
    return sum(1 for request in proxy.requests if request.startswith(line))


@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_a_request_unanswered_at_its_timeout_is_sent_again_on_a_new_connection(
        etcd_url: str, queue_name: str, proxy: FaultProxy, method: str) -> None:
    """The first reply is held past the timeout (etcd made it at once, with
    the old value); the request is sent again on a connection of its own,
    after the value changed, and its answer is the new value: the first
    connection was closed, not waited on (a key's GET waited on would read
    the old value, or, as a quorum read during a leader change, nothing)."""
    key = f"/etcdq/{queue_name}/k"
    direct = connect(etcd_url)
    direct.put(key, "old")
    transport = connect(proxy.url, timeout=TIMEOUT, deadline=BOUND)
    try:
        transport.get(key)  # one pooled connection, which the request goes on
        assert (proxy.accepted, proxy.open_connections) == (1, 1)
        line = f"{method} /v2/keys{key}".encode()
        before = _sent(proxy, line)
        proxy.hold("down")
        if method == "GET":
            thread, outcome = in_background(lambda: transport.get(key).node["value"])
        else:
            thread, outcome = in_background(lambda: transport.put(key, "new").node["value"])
        wait_until(lambda: proxy.held("down"), BOUND, message="the first reply to be held")
        if method == "GET":
            direct.put(key, "new")
        wait_until(lambda: _sent(proxy, line) >= before + 2, BOUND,
                   message=f"the {method} to be sent again (sent "
                           f"{_sent(proxy, line) - before} time(s))")
        # Each send after the first went on a new connection, and the first
        # one's connection was closed: only the latest send's is open.
        wait_until(lambda: proxy.open_connections == 1, BOUND,
                   message=f"the timed-out connections to close "
                           f"({proxy.open_connections} open)")
        proxy.release()
        thread.join(BOUND)
        assert outcome == {"returned": "new"}, outcome
        assert proxy.accepted == _sent(proxy, line) - before
        assert transport.get(key).node["value"] == "new"
    finally:
        proxy.pass_through()
        transport.close()


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("members", [1, 2])
def test_a_listing_unanswered_until_its_deadline_leaves_no_connection_and_no_stale_reply(
        etcd_url: str, queue_name: str,
        proxy_factory: Callable[[str], FaultProxy], members: int, streamed: bool) -> None:
    """Every member's replies are held: the listing is kept waiting on each
    member's connection until the deadline (read whole, or streamed as an
    export reads it), raises Unavailable, and then no
    connection of it is open.  The key's GET that follows, sent while the
    proxies still hold (so a stale listing reply, were one still due on its
    connection, would come first), reads its own reply once they let go."""
    work, key = f"/etcdq/{queue_name}/work", f"/etcdq/{queue_name}/k"
    direct = connect(etcd_url)
    direct.put(f"{work}/a", "1")
    direct.put(key, "mine")
    proxies: List[FaultProxy] = [proxy_factory(etcd_url) for _ in range(members)]
    transport = connect([p.url for p in proxies], timeout=TIMEOUT, deadline=4 * TIMEOUT)
    try:
        listing = f"GET /v2/keys{work}".encode()
        for proxy in proxies:
            proxy.hold("down")
        if streamed:  # an export's listing, read as it arrives
            thread, outcome = in_background(
                lambda: list(transport.listing(work, sorted=True, quorum=True).nodes()))
        else:
            thread, outcome = in_background(lambda: transport.get(work, sorted=True, quorum=True))
        thread.join(BOUND)
        assert isinstance(outcome.get("raised"), Unavailable), outcome
        for proxy in proxies:
            # Waited for, not sent again: one send per member.
            assert _sent(proxy, listing) == 1, proxy.requests
            wait_until(lambda: proxy.open_connections == 0, BOUND,  # noqa: B023
                       message=f"the listing's connections to close "
                               f"({proxy.open_connections} open)")
        thread, outcome = in_background(lambda: transport.get(key).node)
        wait_until(lambda: sum(_sent(p, f"GET /v2/keys{key}".encode()) for p in proxies),
                   BOUND, message="the key's GET to be sent")
        for proxy in proxies:
            proxy.release()
        thread.join(BOUND)
        node = outcome.get("returned") or {}
        assert (node.get("key"), node.get("value")) == (key, "mine"), outcome
    finally:
        for proxy in proxies:
            proxy.pass_through()
        transport.close()


def test_a_listing_kept_on_a_member_that_closed_it_is_sent_there_again(
        etcd_url: str, queue_name: str, proxy_factory: Callable[[str], FaultProxy]) -> None:
    """Two members, both holding their replies: the listing is kept on each.
    The first then goes away (closes every connection, refuses, listens
    again, as a restarted member): the connection kept there carries no
    reply any more, so the call sends the listing to it again, and that
    send is answered; the connection kept on the other member is closed."""
    work = f"/etcdq/{queue_name}/work"
    connect(etcd_url).put(f"{work}/a", "1")
    first, second = proxy_factory(etcd_url), proxy_factory(etcd_url)
    transport = connect([first.url, second.url], timeout=TIMEOUT, deadline=BOUND / 2)
    listing = f"GET /v2/keys{work}".encode()
    try:
        first.hold("down")
        second.hold("down")
        thread, outcome = in_background(lambda: transport.get(work, sorted=True, quorum=True))
        wait_until(lambda: _sent(first, listing) == _sent(second, listing) == 1, BOUND,
                   message="the listing to be sent to both members")
        first.refuse()
        first.pass_through()
        first.restart()
        thread.join(BOUND)
        reply = outcome.get("returned")
        assert reply is not None, outcome
        assert [node["key"] for node in reply.node["nodes"]] == [f"{work}/a"]
        assert (_sent(first, listing), _sent(second, listing)) == (2, 1)
        wait_until(lambda: second.open_connections == 0, BOUND,
                   message=f"the connection kept on the other member to close "
                           f"({second.open_connections} open)")
    finally:
        first.pass_through()
        second.pass_through()
        transport.close()
