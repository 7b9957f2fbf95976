"""Nobody listens: a call whose every endpoint refuses the connection ends after one quick
retry round, not at its deadline; a member that accepts and does not answer still gets the
whole deadline.  Real etcd and the TCP fault proxy throughout."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Callable

import pytest

from etcdq_v2 import Queue, Unavailable, connect
from etcdq_v2.cli import EXIT_UNAVAILABLE
from etcdq_v2.server import EtcdServer, free_port
from etcdq_v2.transport import Refused

from faultproxy import FaultProxy

#: A deadline far longer than a refused call may take: a call that waits it out fails.
LONG_DEADLINE = 30.0
#: What "ends at once" allows: one quick retry round, on a loaded machine.
QUICKLY = 5.0


def refusing_url() -> str:
    """A loopback port with nobody listening on it (connects are refused)."""
    return f"http://127.0.0.1:{free_port()}"


def elapsed(call: Callable[[], object], error: type) -> float:
    started = time.monotonic()
    with pytest.raises(error):
        call()
    return time.monotonic() - started


@pytest.mark.parametrize("members", [1, 3])
def test_a_call_to_endpoints_that_all_refuse_ends_after_one_retry_round(members: int) -> None:
    urls = [refusing_url() for _ in range(members)]
    transport = connect(",".join(urls), timeout=10, deadline=LONG_DEADLINE)
    try:
        started = time.monotonic()
        with pytest.raises(Refused) as raised:
            transport.get("/etcdq/jobs")
        assert time.monotonic() - started < QUICKLY
        assert isinstance(raised.value, Unavailable)  # what callers already catch
        assert raised.value.endpoints == urls
        assert all(url in str(raised.value) for url in urls)
    finally:
        transport.close()


@pytest.mark.parametrize("timeout", [0, 10, None])
def test_a_claim_from_endpoints_that_all_refuse_ends_at_once(timeout: object,
                                                             queue_name: str) -> None:
    """The claim waits for its view's first listing, which the view's thread makes: a
    Refused there ends the claim as it ends any call, whatever the claim's timeout."""
    transport = connect(refusing_url(), timeout=10, deadline=LONG_DEADLINE)
    with Queue(transport, queue_name) as queue:
        assert elapsed(lambda: queue.claim(timeout=timeout), Refused) < QUICKLY


def test_a_refused_put_is_not_ambiguous_and_stores_nothing(
        proxy: FaultProxy, etcd_url: str, queue_name: str) -> None:
    """A refused connect is NotSent: the put raises Refused (never a write in doubt),
    and once etcd listens again the queue holds nothing from it."""
    transport = connect(proxy.url, timeout=10, deadline=LONG_DEADLINE)
    with Queue(transport, queue_name) as queue:
        proxy.refuse()
        assert elapsed(lambda: queue.put("never sent"), Refused) < QUICKLY
        proxy.restart()
        queue.put("sent")
    with Queue(etcd_url, queue_name) as check:
        assert [info.payload for info in check.items()] == ["sent"]


def test_a_frozen_etcd_still_gets_the_whole_deadline(own_etcd: EtcdServer,
                                                     queue_name: str) -> None:
    """A stopped process's kernel still accepts connections: the member may yet
    answer, so the call waits out its deadline and raises a plain Unavailable."""
    with Queue(connect(own_etcd.url, timeout=0.5, deadline=2), queue_name) as queue:
        queue.put("before")
        own_etcd.pause()
        try:
            for call in (queue.stats, lambda: queue.claim(timeout=0)):
                started = time.monotonic()
                with pytest.raises(Unavailable) as raised:
                    call()
                assert time.monotonic() - started >= 1.5  # the deadline, less a last pause
                assert not isinstance(raised.value, Refused)
        finally:
            own_etcd.resume()


def test_a_black_holed_member_beside_a_refusing_one_gets_the_whole_deadline(
        proxy_factory: Callable[[str], FaultProxy], etcd_url: str) -> None:
    """Refusals in a row count only while every member refuses: one that accepts
    and never answers starts the count again, so the deadline holds."""
    silent = proxy_factory(etcd_url)
    silent.black_hole()
    transport = connect(f"{refusing_url()},{silent.url}", timeout=0.5, deadline=2)
    try:
        started = time.monotonic()
        with pytest.raises(Unavailable) as raised:
            transport.get("/etcdq")
        assert time.monotonic() - started >= 1.5  # the deadline, less a last pause
        assert not isinstance(raised.value, Refused)
    finally:
        transport.close()


def test_a_refusing_member_beside_a_live_one_is_passed_over(etcd_url: str,
                                                            queue_name: str) -> None:
    with Queue(connect(f"{refusing_url()},{etcd_url}", timeout=1), queue_name) as queue:
        item_id = queue.put("through the live member")
        assert queue.get(item_id).payload == "through the live member"


def test_the_cli_says_at_once_that_nobody_listens_and_how_to_start_etcd() -> None:
    url = refusing_url()
    env = {**os.environ, "ETCDQ_ENDPOINTS": url, "ETCDQ_TIMEOUT": "10"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "etcdq_v2", "stats", "jobs"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert time.monotonic() - started < 10 + QUICKLY  # the interpreter's start, and a round
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("etcdq: error: "), done.stderr
    assert url in lines[0] and "etcdq server" in lines[0]
