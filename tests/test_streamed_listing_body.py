"""A streamed listing (an export's) answered late in its call, through the real TCP
proxy against real etcd: its body is read with the request timeout between
its bytes, not with the little of the call's deadline left when its reply began."""
from __future__ import annotations

import time
from typing import Callable

from etcdq_v2 import connect

from faultproxy import FaultProxy
from helpers import in_background, wait_until

TIMEOUT = 3.0
BOUND = 30.0
KEYS = 1500


def test_a_streamed_listing_answered_near_its_deadline_reads_a_pausing_body_to_its_end(
        etcd_url: str, queue_name: str, proxy_factory: Callable[[str], FaultProxy]) -> None:
    """The first member holds its reply (the call waits on it a whole timeout);
    the second, tried with half a second of the deadline left, sends the
    listing's start and then pauses for less than the request timeout (a busy
    member, a congested link): the listing is read to its end, every key once,
    and the connection kept on the first member is closed."""
    work = f"/etcdq/{queue_name}/work"
    direct = connect(etcd_url)
    direct.post_many(work, [f"value {n:05d} " + "x" * 200 for n in range(KEYS - 1)],
                     lanes=4, depth=16)
    direct.post(work, "the-last-value")  # the last key: in the listing's last chunk
    held, pausing = proxy_factory(etcd_url), proxy_factory(etcd_url)
    transport = connect([held.url, pausing.url], timeout=TIMEOUT, deadline=TIMEOUT + 0.5)
    listing = f"GET /v2/keys{work}".encode()
    try:
        held.hold("down")
        pausing.hold("down", match=rb"the-last-value")  # the listing's last chunk
        thread, outcome = in_background(
            lambda: [node["value"] for node in
                     transport.listing(work, sorted=True, quorum=True).nodes()])
        wait_until(lambda: any(r.startswith(listing) for r in pausing.requests), BOUND,
                   message="the listing to be sent to the second member")
        wait_until(lambda: pausing.held("down"), BOUND, message="the last chunk to be held")
        time.sleep(TIMEOUT / 2)  # the pause: shorter than the request timeout
        pausing.release()
        thread.join(BOUND)
        values = outcome.get("returned")
        assert values is not None, outcome
        assert len(set(values)) == len(values) == KEYS and values[-1] == "the-last-value"
        wait_until(lambda: held.open_connections == 0, BOUND,
                   message=f"the connection kept on the first member to close "
                           f"({held.open_connections} open)")
    finally:
        held.pass_through()
        pausing.pass_through()
        transport.close()
