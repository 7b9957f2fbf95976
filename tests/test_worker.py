"""The Worker against a real etcd: results, failures, concurrency, timeouts,
every shutdown path (stop(), signals, grace expiry) and lost locks.

Handlers here block on events the test controls, so each test decides when
an item is "in flight"; every wait is bounded.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest
import trustme

from etcdq_v2 import ConfigError, EtcdqError, Queue, Unavailable, connect
from etcdq_v2.server import EtcdServer, TemporaryEtcd
from etcdq_v2.transport import Transport
from etcdq_v2 import worker as worker_module
from etcdq_v2.worker import CANCEL_WAIT, Worker, current_task

from helpers import wait_until

BOUND = 15.0  # seconds any single wait in these tests may take before it counts as a hang
LOCK_TTL = 3  # short, so that a lost lock is noticed within a second (heartbeat = TTL/3)


@pytest.fixture
def make_queue(etcd_url: str, queue_name: str) -> Iterator[Callable[..., Queue]]:
    """Queues on this test's queue name (the same name: several nodes of one queue)."""
    opened: List[Queue] = []

    def make(**options: Any) -> Queue:
        options.setdefault("lock_ttl", LOCK_TTL)
        queue = Queue(etcd_url, queue_name, **options)
        opened.append(queue)
        return queue

    yield make
    for queue in opened:
        queue.close()


@pytest.fixture
def queue(make_queue: Callable[..., Queue]) -> Queue:
    """max_attempts=1: a failure is final, so its reason is there to read in failed/.

    (Any claim counts as an attempt, a stolen one too, but not a released one:
    tests that claim an item twice use ``make_queue()``.)
    """
    return make_queue(max_attempts=1)


@pytest.fixture
def signal_guard() -> Iterator[List[int]]:
    """Signals that reach the test instead of the worker are recorded here, not fatal.

    Without this, a worker that failed to install its handlers would let
    SIGTERM kill the whole test run; the worker replaces these handlers while
    it runs and must put them back.
    """
    leaked: List[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: leaked.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    yield leaked
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@pytest.fixture
def thread_deaths(monkeypatch: pytest.MonkeyPatch) -> List[str]:
    """Threads that ended on an exception ("Exception in thread ..."), recorded here."""
    deaths: List[str] = []

    def hook(args: Any) -> None:
        name = args.thread.name if args.thread else "?"
        deaths.append(f"{name}: {args.exc_type.__name__}: {args.exc_value}")

    monkeypatch.setattr(threading, "excepthook", hook)
    return deaths


def etcd_http(url: str, method: str, body: bytes = b"") -> None:
    """One request to etcd's v2 API with urllib: the test's hand, not the library's."""
    request = urllib.request.Request(url, data=body or None, method=method)
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=5).close()


def make_worker(queue: Queue, handler: Callable[[Any], Any], **options: Any) -> Worker:
    options.setdefault("claim_timeout", 0.2)
    return Worker(queue, handler, **options)


class Gate:
    """A handler that says when it started and then waits for the test, or for cancel."""

    def __init__(self, result: Any = "done") -> None:
        self.started = threading.Event()
        self.proceed = threading.Event()
        self.saw_cancel = threading.Event()
        self.result = result

    def __call__(self, payload: Any) -> Any:
        self.started.set()
        task = current_task()
        deadline = time.monotonic() + BOUND
        while not self.proceed.is_set() and time.monotonic() < deadline:
            if task.cancelled.wait(0.02):
                self.saw_cancel.set()
                break
        return self.result


def results(queue: Queue) -> dict:
    return {info.payload["n"]: info.result for info in queue.items("completed")}


# -- results and failures -----------------------------------------------------------

def test_handler_results_are_recorded_with_the_completion(queue: Queue) -> None:
    ids = queue.put_many([{"n": n} for n in range(5)])
    seen_ids = []

    def double(payload: Any) -> Any:
        seen_ids.append(current_task().claim.id)
        return payload["n"] * 2

    stats = make_worker(queue, double).run(until_empty=True)
    assert (stats.completed, stats.failed, stats.lost, stats.released) == (5, 0, 0, 0)
    assert results(queue) == {n: n * 2 for n in range(5)}
    assert sorted(seen_ids) == ids


def test_handler_exception_fails_the_item_with_its_type_and_message(queue: Queue) -> None:
    queue.put_many([{"n": n} for n in range(4)])

    def odd_fails(payload: Any) -> Any:
        if payload["n"] % 2:
            raise ValueError(f"odd {payload['n']}")
        return "ok"

    stats = make_worker(queue, odd_fails).run(until_empty=True)
    assert (stats.completed, stats.failed) == (2, 2)
    reasons = {info.payload["n"]: info.reason for info in queue.items("failed")}
    assert reasons == {1: "ValueError: odd 1", 3: "ValueError: odd 3"}


def test_a_result_that_cannot_be_stored_fails_the_item(queue: Queue) -> None:
    queue.put({"n": 0})
    stats = make_worker(queue, lambda payload: {1, 2}).run(until_empty=True)
    assert (stats.completed, stats.failed) == (0, 1)
    [dead] = queue.items("failed")
    assert (dead.reason or "").startswith("result cannot be stored")


def test_concurrency_runs_that_many_handlers_at_once_and_no_more(queue: Queue) -> None:
    queue.put_many([{"n": n} for n in range(6)])
    barrier = threading.Barrier(3, timeout=BOUND)  # breaks unless 3 handlers meet
    lock = threading.Lock()
    running, most = [0], [0]

    def meet(payload: Any) -> Any:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        barrier.wait()
        time.sleep(0.05)  # let any extra handler the worker wrongly starts show up
        with lock:
            running[0] -= 1
        return "met"

    stats = make_worker(queue, meet, concurrency=3).run(until_empty=True)
    assert (stats.completed, most[0]) == (6, 3)


def test_max_items_claims_that_many_then_returns(queue: Queue) -> None:
    queue.put_many([{"n": n} for n in range(5)])
    stats = make_worker(queue, lambda payload: None).run(max_items=2)
    assert stats.completed == 2
    assert queue.stats()["pending"] == 3


def test_item_timeout_fails_the_item_cancels_the_handler_and_drops_its_result(
        queue: Queue) -> None:
    item_id = queue.put({"n": 0})
    gate = Gate(result="too late")
    began = time.monotonic()
    stats = make_worker(queue, gate, item_timeout=0.5).run(until_empty=True)
    assert time.monotonic() - began < 0.5 + CANCEL_WAIT + 3
    assert (stats.completed, stats.failed) == (0, 1)
    assert gate.saw_cancel.is_set()
    info = queue.get(item_id)
    assert (info.state, info.reason, info.result) == ("failed", "timed out after 0.5 s", None)


def test_each_slot_keeps_its_handler_thread_from_item_to_item(queue: Queue) -> None:
    """Issue 14: starting a supervisor and a handler thread for every item cost the
    main thread, which claims every item, a quarter of its time in 8-process drains."""
    queue.put_many([{"n": n} for n in range(12)])
    threads: List[threading.Thread] = []  # kept alive here: no identity is reused

    def note(payload: Any) -> None:
        threads.append(threading.current_thread())

    stats = make_worker(queue, note, concurrency=3).run(until_empty=True)
    assert stats.completed == 12
    assert len(set(threads)) <= 3
    wait_until(lambda: not any(thread.is_alive() for thread in threads), BOUND,
               message="the handler threads to end once run() returned")


def test_a_handler_that_overran_keeps_its_thread_and_the_next_item_gets_another(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module, "CANCEL_WAIT", 0.1)
    queue.put_many([{"n": 0}, {"n": 1}])
    stuck = threading.Event()
    ran: List[Tuple[int, threading.Thread]] = []

    def handler(payload: Any) -> str:
        ran.append((payload["n"], threading.current_thread()))
        if payload["n"] == 0:
            stuck.wait(BOUND)  # ignores ``cancelled``: its thread is not the next item's
        return "done"

    try:
        stats = make_worker(queue, handler, item_timeout=0.3).run(until_empty=True)
    finally:
        stuck.set()
    assert (stats.failed, stats.completed) == (1, 1)
    assert [n for n, _ in ran] == [0, 1] and ran[0][1] is not ran[1][1]
    assert results(queue) == {1: "done"}


def test_the_lock_is_kept_alive_while_a_long_handler_runs(
        make_queue: Callable[..., Queue], background: Callable) -> None:
    queue, thief = make_queue(lock_ttl=1), make_queue()
    item_id = queue.put({"n": 0})
    gate = Gate(result="slow")
    stolen = background(lambda: gate.started.wait(BOUND) and thief.claim(timeout=2.5))
    background(lambda: stolen.result(timeout=BOUND) or gate.proceed.set())
    stats = make_worker(queue, gate).run(max_items=1)
    assert stolen.result() is None  # 2.5 s = several 1 s TTLs, and the item was never free
    assert (stats.completed, stats.lost) == (1, 0)
    assert (queue.get(item_id).attempts, queue.get(item_id).result) == (1, "slow")


def test_the_worker_keeps_claiming_through_an_etcd_outage(
        background: Callable, caplog: pytest.LogCaptureFixture) -> None:
    with TemporaryEtcd() as server, Queue(connect(server.url, timeout=0.3), "outage") as queue:
        queue.put({"n": 0})
        server.pause()

        def resume_once_the_worker_noticed() -> None:
            wait_until(lambda: any("cannot claim" in record.getMessage()
                                   for record in caplog.records), BOUND,
                       message="the worker to log the outage")
            server.resume()

        background(resume_once_the_worker_noticed)
        with caplog.at_level(logging.ERROR, logger="etcdq_v2"):
            stats = make_worker(queue, lambda payload: "after").run(max_items=1)
        assert stats.completed == 1


def test_the_worker_retries_a_claim_etcd_refused_and_goes_on(
        etcd_url: str, queue: Queue, background: Callable,
        caplog: pytest.LogCaptureFixture, thread_deaths: List[str]) -> None:
    """Not etcd being unreachable: an error reply the library has no name for."""
    queue.put_many([{"n": n} for n in range(3)])
    # A plain key where the locks/ directory goes: etcd refuses every lock
    # ("Not a directory") until it is removed.
    locks = f"{etcd_url}/v2/keys/etcdq/{queue.name}/locks"
    etcd_http(locks, "PUT", b"value=in-the-way")

    def remove_it_once_the_worker_retried() -> None:
        wait_until(lambda: any("cannot claim" in r.getMessage() and "retrying" in r.getMessage()
                               for r in caplog.records), BOUND,
                   message="the worker to log the refused claim")
        etcd_http(locks, "DELETE")

    background(remove_it_once_the_worker_retried)
    with caplog.at_level(logging.ERROR, logger="etcdq_v2"):
        stats = make_worker(queue, lambda payload: payload["n"] * 10).run(max_items=3)
    assert stats.completed == 3
    assert results(queue) == {0: 0, 1: 10, 2: 20}
    assert thread_deaths == []


@pytest.fixture(params=["http", "https"])
def pausable(request: pytest.FixtureRequest, etcd_binary: str,
             tmp_path: Path) -> Iterator[Tuple[EtcdServer, Transport]]:
    """An etcd of this test's own to pause, and a client with a short request timeout.

    Over https a paused etcd also meets new connections with TLS handshakes
    that time out: transient like any other timeout, never a ConfigError.
    """
    options: Dict[str, Any] = {}
    ca_cert: Optional[str] = None
    if request.param == "https":
        ca = trustme.CA()
        cert, ca_cert = tmp_path / "server.pem", str(tmp_path / "ca.pem")
        ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(cert)
        ca.cert_pem.write_to_path(ca_cert)
        options = {"scheme": "https", "extra_args": ["--cert-file", str(cert),
                                                     "--key-file", str(cert)]}
    server = EtcdServer(tmp_path / "data", binary=etcd_binary, **options)
    server.start(wait=False)
    client = connect(server.url, timeout=0.3, ca_cert=ca_cert)
    try:
        wait_until(lambda: client.get("/") is not None, BOUND * 2, ignore=(EtcdqError,),
                   message="etcd to answer")
        yield server, client
    finally:
        client.close()
        server.stop()


def test_the_worker_runs_on_through_a_paused_etcd_and_completes_every_item(
        pausable: Tuple[EtcdServer, Transport], background: Callable,
        thread_deaths: List[str]) -> None:
    server, client = pausable
    with Queue(client, "paused", lock_ttl=LOCK_TTL) as queue:
        ids = queue.put_many([{"n": n} for n in range(6)])
        some_done = threading.Event()

        def handler(payload: Any) -> Any:
            if payload["n"] == 1:
                some_done.set()
            time.sleep(0.05)  # a little work, so that the pause meets items in flight
            return payload["n"]

        worker = make_worker(queue, handler, concurrency=2)

        def pause_then_stop_when_all_done() -> None:
            assert some_done.wait(BOUND)
            server.pause()
            paused = time.monotonic()
            wait_until(lambda: time.monotonic() - paused >= 2.5, 5, message="the pause")
            server.resume()
            wait_until(lambda: queue.stats()["completed"] == len(ids), BOUND + LOCK_TTL,
                       ignore=(Unavailable,), message="every item to be completed")
            worker.stop()

        background(pause_then_stop_when_all_done)
        worker.run()
        assert results(queue) == {n: n for n in range(6)}
        assert queue.stats()["running"] == 0
    assert thread_deaths == []


class Unprintable(Exception):
    """A handler's exception whose message cannot be read: describing the failure raises."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")


def test_an_unexpected_error_settling_an_item_is_logged_and_the_claim_abandoned(
        make_queue: Callable[..., Queue], caplog: pytest.LogCaptureFixture,
        thread_deaths: List[str]) -> None:
    queue, other = make_queue(lock_ttl=1), make_queue()
    item_id = queue.put({"n": 0})

    def handler(payload: Any) -> Any:
        raise Unprintable()

    with caplog.at_level(logging.ERROR, logger="etcdq_v2"):
        stats = make_worker(queue, handler).run(max_items=1)
    assert (stats.failed, stats.lost) == (0, 1)
    assert thread_deaths == []
    [record] = [r for r in caplog.records if r.exc_info and item_id in r.getMessage()]
    assert "__str__ exploded" in str(record.exc_info[1])
    # Abandoned: the heartbeat (the queue is still open) no longer holds the lock.
    claim = wait_until(lambda: other.claim(timeout=0.2), BOUND, message="the item to come back")
    assert (claim.id, claim.attempt) == (item_id, 2)
    claim.complete()


def test_current_task_outside_a_handler_raises() -> None:
    with pytest.raises(RuntimeError):
        current_task()


@pytest.mark.parametrize("options", [{"concurrency": 0}, {"item_timeout": 0},
                                     {"grace_period": -1}, {"claim_timeout": -1},
                                     {"claim_timeout": float("nan")},
                                     {"item_timeout": float("inf")}, {"concurrency": 1.5}])
def test_bad_options_raise_config_error(queue: Queue, options: dict) -> None:
    with pytest.raises(ConfigError):
        Worker(queue, lambda payload: None, **options)


# -- shutdown ---------------------------------------------------------------------------

def _send(signum: int) -> Callable[[Worker], None]:
    return lambda worker: os.kill(os.getpid(), signum)


@pytest.mark.parametrize("stop", [lambda worker: worker.stop(), _send(signal.SIGTERM),
                                  _send(signal.SIGINT)], ids=["stop()", "SIGTERM", "SIGINT"])
def test_graceful_stop_finishes_the_running_item_and_claims_no_more(
        queue: Queue, background: Callable, signal_guard: List[int],
        stop: Callable[[Worker], None]) -> None:
    queue.put_many([{"n": n} for n in range(3)])
    gate = Gate()
    worker = make_worker(queue, gate)

    def stop_then_let_finish() -> None:
        assert gate.started.wait(BOUND)
        stop(worker)
        wait_until(lambda: worker.stopping, BOUND, message="the worker to stop claiming")
        gate.proceed.set()

    background(stop_then_let_finish)
    stats = worker.run()
    assert (stats.completed, stats.released) == (1, 0)
    assert not gate.saw_cancel.is_set()
    assert queue.stats() == {"pending": 2, "running": 0, "completed": 1, "failed": 0}
    assert signal_guard == []


@pytest.mark.parametrize("grace_period, stop", [
    (0.3, lambda worker: worker.stop()),
    (None, lambda worker: worker.stop(grace=False)),
], ids=["grace expires", "stop(grace=False)"])
def test_items_still_running_at_the_end_of_the_grace_are_released(
        make_queue: Callable[..., Queue], background: Callable, grace_period: Any,
        stop: Callable[[Worker], None]) -> None:
    queue = make_queue()
    item_id = queue.put({"n": 0})
    gate = Gate()
    worker = make_worker(queue, gate, grace_period=grace_period)

    def stop_when_started() -> None:
        assert gate.started.wait(BOUND)
        stop(worker)

    background(stop_when_started)
    began = time.monotonic()
    stats = worker.run()
    assert time.monotonic() - began < CANCEL_WAIT + 3
    assert (stats.completed, stats.released) == (0, 1)
    assert gate.saw_cancel.is_set()
    assert queue.stats()["running"] == 0
    again = queue.claim(timeout=LOCK_TTL - 1)  # released, not waiting out the lock TTL
    assert again is not None and (again.id, again.attempt) == (item_id, 1)  # not counted
    again.release()


def test_a_second_signal_releases_at_once(queue: Queue, background: Callable,
                                         signal_guard: List[int]) -> None:
    queue.put({"n": 0})
    gate = Gate()
    worker = make_worker(queue, gate)  # no grace limit: only the second signal ends it

    def signal_twice() -> None:
        assert gate.started.wait(BOUND)
        os.kill(os.getpid(), signal.SIGINT)
        wait_until(lambda: worker.stopping, BOUND, message="the first signal to be handled")
        assert not gate.saw_cancel.is_set()
        os.kill(os.getpid(), signal.SIGINT)

    background(signal_twice)
    stats = worker.run()
    assert (stats.completed, stats.released) == (0, 1)
    assert gate.saw_cancel.is_set()
    assert queue.stats()["running"] == 0
    assert signal_guard == []


def test_an_item_claimed_as_the_stop_comes_is_released_unhandled(
        make_queue: Callable[..., Queue]) -> None:
    queue = make_queue()
    queue.put({"n": 0})
    handled: List[Any] = []

    class StopArrivesDuringTheClaim:
        def __getattr__(self, name: str) -> Any:
            return getattr(queue, name)

        def claim(self, timeout: float) -> Any:
            claim = queue.claim(timeout=BOUND)
            worker.stop()
            return claim

    worker = make_worker(StopArrivesDuringTheClaim(), handled.append)  # type: ignore[arg-type]
    stats = worker.run()
    assert (handled, stats.released) == ([], 1)
    assert queue.stats()["pending"] == 1


def test_signal_handlers_are_put_back_after_run(queue: Queue, signal_guard: List[int]) -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    make_worker(queue, lambda payload: None).run(until_empty=True)
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_worker_outside_the_main_thread_runs_without_signal_handlers(queue: Queue) -> None:
    queue.put({"n": 0})
    worker = make_worker(queue, lambda payload: "ok")
    with ThreadPoolExecutor(1) as pool:
        stats = pool.submit(worker.run, until_empty=True).result(timeout=BOUND)
    assert stats.completed == 1


# -- lost locks ---------------------------------------------------------------------------

def _steal(etcd_url: str, queue: Queue, thief: Queue, item_id: str) -> Any:
    """Delete the item's lock behind the worker's back and claim the item as another node."""
    request = urllib.request.Request(f"{etcd_url}/v2/keys/etcdq/{queue.name}/locks/{item_id}",
                                     method="DELETE")
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=5).close()
    claim = wait_until(lambda: thief.claim(timeout=0.2), BOUND, message="the thief's claim")
    assert claim is not None and (claim.id, claim.attempt) == (item_id, 2)
    return claim


def test_a_lock_lost_while_the_handler_runs_cancels_it_and_records_nothing(
        etcd_url: str, make_queue: Callable[..., Queue], background: Callable,
        caplog: pytest.LogCaptureFixture) -> None:
    queue, thief = make_queue(), make_queue()
    item_id = queue.put({"n": 0})
    gate = Gate(result="mine")
    worker = make_worker(queue, gate)
    stolen = background(lambda: gate.started.wait(BOUND) and _steal(etcd_url, queue, thief,
                                                                     item_id))
    with caplog.at_level(logging.WARNING, logger="etcdq_v2"):
        stats = worker.run(max_items=1)
    assert (stats.completed, stats.lost) == (0, 1)
    assert gate.saw_cancel.is_set()  # the heartbeat noticed; the handler was told to stop
    assert any(record.name.startswith("etcdq_v2") and item_id in record.getMessage()
               and "lost" in record.getMessage() for record in caplog.records)
    stolen.result(timeout=BOUND).complete("theirs")  # the thief's claim is intact
    assert queue.get(item_id).result == "theirs"


def test_an_outcome_etcd_refused_leaves_the_item_to_come_back_after_the_lock_ttl(
        make_queue: Callable[..., Queue], monkeypatch) -> None:
    from etcdq_v2 import Unavailable
    queue, other = make_queue(lock_ttl=1), make_queue()
    item_id = queue.put({"n": 0})

    def etcd_went_away(*args: Any, **kwargs: Any) -> None:
        raise Unavailable("etcd went away")

    monkeypatch.setattr(queue._protocol, "finish", etcd_went_away)
    stats = make_worker(queue, lambda payload: "done").run(max_items=1)
    assert (stats.completed, stats.lost) == (0, 1)
    # The worker gave the claim up: its heartbeat no longer holds the lock, so the
    # item comes back within a TTL (the queue, and its heartbeat, are still open).
    claim = wait_until(lambda: other.claim(timeout=0.2), BOUND, message="the item to come back")
    assert (claim.id, claim.attempt) == (item_id, 2)
    claim.complete()


def test_a_lock_taken_before_complete_records_nothing(
        etcd_url: str, make_queue: Callable[..., Queue]) -> None:
    queue, thief = make_queue(lock_ttl=1), make_queue()
    item_id = queue.put({"n": 0})
    stolen = []

    def lose_the_lock_then_return(payload: Any) -> Any:
        # The way a lock is lost under the protocol: its TTL runs out while the
        # heartbeat is held (only a lock's owner ever deletes it), and another
        # node claims the item.  complete() must find out before recording.
        queue._heartbeat.discard(current_task().claim)
        wait_until(lambda: queue._protocol.read("locks", item_id) is None, BOUND,
                   message="the lock's expiry")
        claim = wait_until(lambda: thief.claim(timeout=0.2), BOUND, message="the thief's claim")
        assert (claim.id, claim.attempt) == (item_id, 2)
        stolen.append(claim)
        return "mine"

    stats = make_worker(queue, lose_the_lock_then_return).run(max_items=1)
    assert (stats.completed, stats.lost) == (0, 1)
    stolen[0].complete("theirs")
    assert queue.get(item_id).result == "theirs"
