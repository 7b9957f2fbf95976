"""Member.arriving() while other threads' requests come and go.

request() notes the connection whose reply it reads in a set without the
pool's lock (an add and a discard are atomic in CPython), and arriving()
copies that set before it looks at it: a look that iterated the set itself
would meet "Set changed size during iteration" whenever another thread's
request began or ended meanwhile.  Real etcd; the interpreter switches
threads as often as it can, so the requests interleave with the copies.
"""
from __future__ import annotations

import sys
import threading
from typing import Iterator, List

import pytest

from etcdq_v2 import connect

LOOKS = 100_000
READERS = 4


@pytest.fixture
def switching() -> Iterator[None]:
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def test_arriving_is_safe_while_other_threads_requests_start_and_end(
        etcd_url: str, queue_name: str, switching: None) -> None:
    key = f"/etcdq/{queue_name}/k"
    transport = connect(etcd_url, timeout=5)
    transport.put(key, "v")
    stop = threading.Event()
    failures: List[BaseException] = []

    def read() -> None:
        while not stop.is_set():
            try:
                assert transport.get(key).node["value"] == "v"
            except BaseException as exc:  # noqa: B036 - handed to the test thread
                failures.append(exc)
                return

    readers = [threading.Thread(target=read, name=f"reader-{n}") for n in range(READERS)]
    for thread in readers:
        thread.start()
    try:
        for _ in range(LOOKS):
            transport.arriving()
    finally:
        stop.set()
        for thread in readers:
            thread.join(30)
        transport.close()
    assert failures == []
    assert transport.requests["GET"] > READERS  # the premise: requests came and went
