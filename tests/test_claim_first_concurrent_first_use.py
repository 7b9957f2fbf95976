"""Threads that use a Queue for the first time at once share one view: every
view made for a Queue is the one its close() closes, so claim_first's wait
ends at close() (its docstring: QueueClosed once any of its queues was closed).

Queue._start_view makes the view unguarded: two threads that both find no
view each make one (QueueView's constructor starts the follower thread, and
Thread.start gives up the GIL), and the one assigned first is orphaned,
followed for ever and never closed.  A claim_first that took the orphan waits
on it and on the other queue's view; close() sets neither, so it waits for
ever.  Real etcd; the race is retried up to ROUNDS times with fresh queues.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import List

import pytest

from etcdq_v2 import Queue, QueueClosed, claim_first

from conftest import BACKGROUND_BOUND
from helpers import wait_until

ROUNDS = 5
THREADS = 2


def test_claim_first_ends_at_close_when_threads_first_claim_at_once(
        etcd_url: str, queue_name: str) -> None:
    for n in range(ROUNDS):
        q1, q2 = Queue(etcd_url, f"{queue_name}-{n}a"), Queue(etcd_url, f"{queue_name}-{n}b")
        barrier = threading.Barrier(THREADS)

        waits: "List[Future[object]]" = [Future() for _ in range(THREADS)]

        def claim(done: "Future[object]", q1: Queue = q1, q2: Queue = q2,
                  barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                done.set_result(claim_first([q1, q2], timeout=None))
            except BaseException as exc:  # noqa: B036 - handed to the test
                done.set_exception(exc)

        # Daemon threads: a hung claim_first must not hold the interpreter's exit.
        for done in waits:
            threading.Thread(target=claim, args=(done,), daemon=True).start()
        try:
            wait_until(lambda q1=q1, q2=q2: q1._view is not None and q1._view.state.ready
                       and q2._view is not None and q2._view.state.ready,
                       BACKGROUND_BOUND, message="both first listings")
            q1.close()
            for waiting in waits:
                try:
                    with pytest.raises(QueueClosed):
                        waiting.result(timeout=BACKGROUND_BOUND)
                except FutureTimeout:
                    pytest.fail(f"round {n}: claim_first still waits {BACKGROUND_BOUND} s "
                                "after one of its queues closed")
        finally:
            q1.close()
            q2.close()
