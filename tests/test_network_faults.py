"""Network faults through a real TCP proxy (tests/faultproxy.py): issue 11's findings.

Each section is one finding of issue 11 ("Reliability II"), reproduced
between the client and a real etcd: a member that never answers, a commit
held in flight past the lock TTL, a TLS handshake that times out, a reply
that arrives after its caller gave up, a server that closed a kept-alive
connection, a connection per item.  The first section checks the proxy
itself.
"""
from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Type

import pytest

from etcdq_v2 import (Claim, ConfigError, EtcdqError, LockLost, Queue, Unavailable, Worker,
                      connect)
from etcdq_v2.protocol import boot_clock
from etcdq_v2.server import EtcdServer

import test_security
from faultproxy import FaultProxy
from helpers import in_background, wait_until

# test_security's TLS etcd (a CA from trustme, client certificates), for this module too.
ca, tls_files, tls_etcd = test_security.ca, test_security.tls_files, test_security.tls_etcd

#: A short per-request timeout keeps the dead-member tests fast; the deadline is 3x.
TIMEOUT = 0.5
#: What a call may take beyond its deadline: thread wake-ups and the live member's reply.
SLACK = 1.0


def within(limit: float, call: Callable[[], Any]) -> Any:
    """``call()``, which must return (not raise) within ``limit`` seconds."""
    started = time.monotonic()
    result = call()
    elapsed = time.monotonic() - started
    assert elapsed < limit, f"took {elapsed:.2f} s, more than {limit:g} s"
    return result


def payloads(queue: Queue, state: str) -> List[Any]:
    return [info.payload for info in queue.items(state)]


class ThreadErrors:
    """Exceptions that ended a thread (threading.excepthook), collected while active."""

    def __init__(self) -> None:
        self.seen: List[str] = []

    def __call__(self, args: Any) -> None:
        self.seen.append(f"{args.thread.name if args.thread else '?'}: "
                         f"{args.exc_type.__name__}: {args.exc_value}")


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> ThreadErrors:
    errors = ThreadErrors()
    monkeypatch.setattr(threading, "excepthook", errors)
    return errors


# -- the proxy itself ------------------------------------------------------------------

def test_the_proxy_forwards_delays_holds_and_counts(proxy: FaultProxy) -> None:
    client = connect(proxy.url, timeout=2)
    client.put("/etcdq-proxy-test/a", "1")
    assert (proxy.accepted, proxy.open_connections) == (1, 1)  # kept alive
    proxy.delay(100)
    started = time.monotonic()
    assert client.get("/etcdq-proxy-test/a").node["value"] == "1"
    assert time.monotonic() - started >= 0.2  # 100 ms each way
    proxy.pass_through()
    proxy.hold("up")
    reply: List[str] = []
    reader = threading.Thread(target=lambda: reply.append(
        client.get("/etcdq-proxy-test/a").node["value"]))
    reader.start()
    wait_until(lambda: b"GET /v2/keys/etcdq-proxy-test/a" in proxy.held(), 5)
    assert reply == []
    proxy.release()
    reader.join(5)
    assert reply == ["1"] and proxy.held() == b""


def test_a_held_request_whose_client_gave_up_lands_on_release(proxy: FaultProxy,
                                                               etcd_url: str) -> None:
    """As a delayed packet would: what the chaos run's "held writes" rely on."""
    key = f"/etcdq-proxy-test/late-{time.monotonic_ns()}"
    proxy.hold("up")
    with pytest.raises(Unavailable):
        connect(proxy.url, timeout=TIMEOUT, deadline=TIMEOUT).put(key, "late")
    direct = connect(etcd_url)
    assert _value(direct, key) is None
    proxy.release()
    wait_until(lambda: _value(direct, key) == "late", 5, message="the held PUT to land")


def _value(client: Any, key: str) -> Any:
    try:
        return client.get(key).node["value"]
    except EtcdqError:
        return None


@pytest.mark.parametrize("fault, cause", [
    ("black_hole", "timed out"), ("reset", "reset|closed"), ("cut", "closed"),
    ("refuse", "refused")])
def test_the_proxy_faults_show_as_the_network_would(proxy: FaultProxy, fault: str,
                                                    cause: str) -> None:
    client = connect(proxy.url, timeout=TIMEOUT, deadline=1)
    client.put("/etcdq-proxy-test/b", "x" * 100)
    {"black_hole": proxy.black_hole, "reset": proxy.reset, "cut": lambda: proxy.cut(50),
     "refuse": proxy.refuse}[fault]()
    with pytest.raises(Unavailable, match=f"(?i){cause}"):
        client.get("/etcdq-proxy-test/b")
    proxy.pass_through()
    proxy.restart()
    assert client.get("/etcdq-proxy-test/b").node["value"] == "x" * 100


def test_the_proxy_closes_idle_connections_and_stops_every_thread(etcd_url: str) -> None:
    before = set(threading.enumerate())
    with FaultProxy.to(etcd_url) as proxy:
        client = connect(proxy.url, timeout=2)
        client.put("/etcdq-proxy-test/c", "1")
        proxy.close_idle(0.05)
        wait_until(lambda: proxy.open_connections == 0, 5, message="the idle connection closed")
        proxy.pass_through()
        streams = [client.stream("/etcdq-proxy-test", idle_timeout=5) for _ in range(3)]
        assert proxy.open_connections == 3
    assert set(threading.enumerate()) <= before
    for stream in streams:
        stream.release()


# -- item 1: a stale claim cannot commit ------------------------------------------------

#: The requests that commit an outcome (or fence it): writes to the item or its record.
#: Reads and the lock's refresh pass, so the write that is held is the commit itself.
COMMIT = re.compile(rb"^(PUT|DELETE) /v2/keys/\S+/(completed|failed|work)/", re.MULTILINE)


@pytest.mark.parametrize("second_outcome", ["complete", "dead-letter"])
def test_a_commit_held_past_the_lock_ttl_cannot_commit(
        proxy_factory: Callable[[str], FaultProxy], etcd_url: str, queue_name: str,
        second_outcome: str) -> None:
    """A's complete() reaches etcd only after its lock expired and B claimed the item:
    it must raise LockLost, and the item ends with B's outcome alone."""
    proxy_a, proxy_b = proxy_factory(etcd_url), proxy_factory(etcd_url)
    with Queue(connect(proxy_a.url, timeout=8, deadline=20), queue_name, lock_ttl=2) as a, \
            Queue(connect(proxy_b.url, timeout=2), queue_name, lock_ttl=2,
                  max_attempts=2) as b, Queue(etcd_url, queue_name) as observer:
        item_id = observer.put("contested")
        claim_a = a.claim(timeout=5)
        assert claim_a is not None and claim_a.id == item_id
        proxy_a.hold("up", match=COMMIT)
        thread, outcome = in_background(lambda: claim_a.complete("from A"))
        wait_until(lambda: COMMIT.search(proxy_a.held()), 5, message="A's commit to be held")
        claim_b = b.claim(timeout=10)  # after A's lock expired
        assert claim_b is not None and (claim_b.id, claim_b.attempt) == (item_id, 2), \
            (observer.items("running"), observer.items("pending"))
        if second_outcome == "dead-letter":
            claim_b.fail("B gives up")  # attempt 2 of max 2: into failed/
        proxy_a.release()
        thread.join(20)
        assert isinstance(outcome.get("raised"), LockLost), outcome
        if second_outcome == "complete":
            claim_b.complete("from B")
        completed, failed = observer.items("completed"), observer.items("failed")
        assert len(completed) + len(failed) == 1, (completed, failed)
        record = (completed + failed)[0]
        assert (record.state, record.attempts) == (
            ("completed", 2) if second_outcome == "complete" else ("failed", 2))
        assert record.result in (None, "from B")
        assert observer.stats()["pending"] + observer.stats()["running"] == 0


#: A claim's C2: the compare-and-swap of the item that counts the attempt.
CLAIM_CAS = re.compile(rb"^PUT /v2/keys/\S+/work/", re.MULTILINE)


def test_a_claim_whose_item_cas_lands_after_its_lock_expired_is_not_handed_out(
        proxy_factory: Callable[[str], FaultProxy], etcd_url: str, queue_name: str) -> None:
    """A's C1 applies, its C2 is held past the lock TTL, B claims the item meanwhile:
    A's claim must not take the item from B, whose lock is valid."""
    proxy_a = proxy_factory(etcd_url)
    with Queue(connect(proxy_a.url, timeout=8, deadline=20), queue_name, lock_ttl=2) as a, \
            Queue(etcd_url, queue_name, lock_ttl=2) as b:
        item_id = b.put("contested")
        proxy_a.hold("up", match=CLAIM_CAS)
        thread, outcome = in_background(lambda: a.claim(timeout=0))
        wait_until(lambda: CLAIM_CAS.search(proxy_a.held()), 5, message="A's C2 to be held")
        claim_b = b.claim(timeout=10)  # once A's lock expired
        assert claim_b is not None and claim_b.id == item_id
        proxy_a.release()
        thread.join(20)
        assert outcome == {"returned": None}, outcome
        claim_b.refresh()  # B's lock is still B's ...
        claim_b.complete()  # ... and so is the item
        assert [info.attempts for info in b.items("completed")] == [claim_b.attempt]


# -- item 2: the first endpoint is dead ---------------------------------------------------

def _dead_first(proxy: FaultProxy, etcd_url: str, dead: str) -> str:
    """Endpoints whose first member is ``proxy``, killed as ``dead`` says."""
    {"black_hole": proxy.black_hole, "refused": proxy.refuse}[dead]()
    return f"{proxy.url},{etcd_url}"


def _claim_on_a_new_queue(queue: Queue, setup: Queue) -> None:
    item_id = setup.put("first")
    claim = within(queue.etcd.deadline + SLACK, lambda: queue.claim(timeout=5))
    assert claim is not None and claim.id == item_id
    claim.complete()


def _stats(queue: Queue, setup: Queue) -> None:
    setup.put_many(["a", "b"])
    setup.claim(timeout=5).complete()
    expected = {"pending": 1, "running": 0, "completed": 1, "failed": 0}
    assert within(queue.etcd.deadline + SLACK, queue.stats) == expected


def _items(queue: Queue, setup: Queue) -> None:
    ids = setup.put_many(["a", "b"])
    infos = within(queue.etcd.deadline + SLACK, lambda: queue.items("pending"))
    assert [info.id for info in infos] == ids


def _get(queue: Queue, setup: Queue) -> None:
    item_id = setup.put({"n": 1})
    info = within(queue.etcd.deadline + SLACK, lambda: queue.get(item_id))
    assert (info.state, info.payload) == ("pending", {"n": 1})


def _put(queue: Queue, setup: Queue) -> None:
    """With a black hole first: a member that never answered must not be sent a POST
    first (a frozen member could apply it later, so the put would be ambiguous)."""
    item_id = within(queue.etcd.deadline + SLACK, lambda: queue.put("through the live one"))
    assert [info.id for info in setup.items("pending")] == [item_id]


def _requeue(queue: Queue, setup: Queue) -> None:
    setup.put("dead letter")
    claim = setup.claim(timeout=5)
    claim.fail("no")  # max_attempts=1: into failed/
    new_id = within(queue.etcd.deadline + SLACK, lambda: queue.requeue(claim.id))
    assert [info.id for info in setup.items("pending")] == [new_id]
    assert setup.items("failed") == []


def _purge(queue: Queue, setup: Queue) -> None:
    setup.put("done")
    setup.claim(timeout=5).complete()
    assert within(queue.etcd.deadline + SLACK, lambda: queue.purge(completed=True)) == 1
    assert setup.stats()["completed"] == 0


FROM_THE_START = {"claim": _claim_on_a_new_queue, "stats": _stats, "items": _items,
                  "get": _get, "put": _put, "requeue": _requeue, "purge": _purge}


@pytest.mark.parametrize("dead", ["black_hole", "refused"])
@pytest.mark.parametrize("path", sorted(FROM_THE_START))
def test_every_path_fails_over_from_a_dead_first_member(
        proxy: FaultProxy, etcd_url: str, queue_name: str, dead: str, path: str) -> None:
    """The first member is dead before the queue makes its first request."""
    endpoints = _dead_first(proxy, etcd_url, dead)
    with Queue(etcd_url, queue_name, max_attempts=1) as setup, \
            Queue(connect(endpoints, timeout=TIMEOUT), queue_name, lock_ttl=2,
                  max_attempts=1) as queue:
        FROM_THE_START[path](queue, setup)


def _complete(queue: Queue, setup: Queue, claim: Claim) -> None:
    within(queue.etcd.deadline + SLACK, claim.complete)
    assert setup.stats() == {"pending": 0, "running": 0, "completed": 1, "failed": 0}


def _release(queue: Queue, setup: Queue, claim: Claim) -> None:
    within(queue.etcd.deadline + SLACK, claim.release)
    assert setup.stats() == {"pending": 1, "running": 0, "completed": 0, "failed": 0}


def _fail(queue: Queue, setup: Queue, claim: Claim) -> None:
    within(queue.etcd.deadline + SLACK, lambda: claim.fail("no"))  # max_attempts=1
    assert payloads(setup, "failed") == ["claimed"]
    assert setup.stats()["pending"] == 0


def _refresh(queue: Queue, setup: Queue, claim: Claim) -> None:
    within(queue.etcd.deadline + SLACK, claim.refresh)
    assert not claim.lost
    claim.complete()


def _heartbeat(queue: Queue, setup: Queue, claim: Claim) -> None:
    """A claim held for longer than its lock TTL keeps its lock through the live member."""
    started = time.monotonic()
    wait_until(lambda: claim.lost or time.monotonic() - started > queue.lock_ttl + 1.0,
               queue.lock_ttl + 5, message="one lock TTL to pass")
    assert not claim.lost
    running = setup.items("running")
    assert [(info.id, info.node_id) for info in running] == [(claim.id, queue.node_id)]
    claim.complete()


AFTER_THE_CLAIM = {"complete": _complete, "release": _release, "fail": _fail,
                   "refresh": _refresh, "heartbeat": _heartbeat}


@pytest.mark.parametrize("dead", ["black_hole", "refused"])
@pytest.mark.parametrize("path", sorted(AFTER_THE_CLAIM))
def test_an_open_claim_fails_over_when_its_member_dies(
        proxy: FaultProxy, etcd_url: str, queue_name: str, dead: str, path: str) -> None:
    """The first member answers the claim, then dies: the claim's paths go on."""
    with Queue(etcd_url, queue_name, max_attempts=1) as setup, \
            Queue(connect(f"{proxy.url},{etcd_url}", timeout=TIMEOUT), queue_name,
                  lock_ttl=2, max_attempts=1) as queue:
        setup.put("claimed")
        claim = queue.claim(timeout=5)
        assert claim is not None
        _dead_first(proxy, etcd_url, dead)
        AFTER_THE_CLAIM[path](queue, setup, claim)


# -- item 3: TLS --------------------------------------------------------------------------

@pytest.fixture
def tls_proxy(tls_etcd: EtcdServer, proxy_factory: Callable[[str], FaultProxy]) -> FaultProxy:
    return proxy_factory(tls_etcd.url)


def _tls(url: str, tls_files: Dict[str, str], ca_file: str = "ca", **options: Any) -> Any:
    return connect(url, ca_cert=tls_files[ca_file], cert=tls_files["client_cert"],
                   key=tls_files["client_key"], **options)


@pytest.mark.parametrize("fault", ["hold", "black_hole"])
def test_tls_a_short_freeze_leaves_the_heartbeat_running(
        tls_proxy: FaultProxy, tls_files: Dict[str, str], queue_name: str, fault: str,
        thread_errors: ThreadErrors) -> None:
    """A 2.5 s freeze while a claim is open (lock_ttl 3): the heartbeat outlives it,
    and the claim is either confirmed again (its lock still ours) or marked lost."""
    with Queue(_tls(tls_proxy.url, tls_files, timeout=TIMEOUT), queue_name, lock_ttl=3) as queue:
        queue.put("frozen")
        claim = queue.claim(timeout=5)
        assert claim is not None
        getattr(tls_proxy, fault)()
        frozen = time.monotonic()
        wait_until(lambda: time.monotonic() - frozen >= 2.5, 5, message="the freeze")
        tls_proxy.pass_through()
        thawed = boot_clock()  # the clock of Claim.confirmed_at
        wait_until(lambda: claim.lost or claim.confirmed_at > thawed, 5,
                   message="the heartbeat to confirm the lock again, or mark it lost")
        if not claim.lost:  # then the lock is ours in etcd
            running = queue.items("running")
            assert [(info.id, info.node_id) for info in running] == [(claim.id, queue.node_id)]
        with contextlib.suppress(LockLost):  # lost: etcd decides if it is still ours
            claim.complete()
        queue.put("after")
        again = queue.claim(timeout=5)
        assert again is not None and again.payload == "after"
        again.complete()
        assert queue.stats() == {"pending": 0, "running": 0, "completed": 2, "failed": 0}
        assert thread_errors.seen == []


def test_tls_a_claim_whose_lock_expired_while_frozen_is_marked_lost(
        tls_proxy: FaultProxy, tls_etcd: EtcdServer, tls_files: Dict[str, str],
        queue_name: str, thread_errors: ThreadErrors) -> None:
    """Frozen for longer than the lock TTL while another consumer takes the item: the
    first claim is marked lost, and once the network is back its queue works again."""
    with Queue(_tls(tls_proxy.url, tls_files, timeout=TIMEOUT), queue_name, lock_ttl=2) as a, \
            Queue(_tls(tls_etcd.url, tls_files, timeout=2), queue_name, lock_ttl=2) as b:
        b.put("taken over")
        claim_a = a.claim(timeout=5)
        assert claim_a is not None
        tls_proxy.black_hole()
        claim_b = b.claim(timeout=10)  # once A's lock expired
        assert claim_b is not None and (claim_b.id, claim_b.attempt) == (claim_a.id, 2)
        wait_until(lambda: claim_a.lost, 5, message="A's claim to be marked lost")
        tls_proxy.pass_through()
        claim_b.complete()
        b.put("next")
        again = a.claim(timeout=10)
        assert again is not None and again.payload == "next"
        held = time.monotonic()  # the heartbeat keeps the new claim's lock past its TTL
        wait_until(lambda: again.lost or time.monotonic() - held > a.lock_ttl + 1.0, 10)
        assert not again.lost and [i.id for i in b.items("running")] == [again.id]
        again.complete()
        assert thread_errors.seen == []


def _break_the_handshake(proxy: FaultProxy, fault: str) -> None:
    """black_hole: the handshake times out.  reset: RST once the client's hello is
    in.  cut: the connection closes as the server's hello comes back."""
    if fault == "black_hole":
        proxy.black_hole()
    elif fault == "cut":
        proxy.cut(0)
    else:
        proxy.hold("up")
        wait_until(lambda: proxy.held(), 5, message="a client hello to be held")
        proxy.reset()


@pytest.mark.parametrize("fault", ["black_hole", "reset", "cut"])
def test_tls_a_handshake_that_fails_on_the_way_is_unavailable(
        tls_proxy: FaultProxy, tls_files: Dict[str, str], queue_name: str,
        fault: str) -> None:
    """Only a certificate that does not verify (or a TLS alert) is a ConfigError."""
    client = _tls(tls_proxy.url, tls_files, timeout=TIMEOUT)
    queue = Queue(client, queue_name)
    if fault != "reset":
        _break_the_handshake(tls_proxy, fault)
    started = time.monotonic()
    thread, outcome = in_background(queue.stats)
    if fault == "reset":
        _break_the_handshake(tls_proxy, fault)
    thread.join(client.deadline + SLACK + 5)
    assert isinstance(outcome.get("raised"), Unavailable), outcome
    assert time.monotonic() - started < client.deadline + SLACK


def test_tls_a_wrong_ca_through_the_proxy_is_still_a_config_error(
        tls_proxy: FaultProxy, tls_files: Dict[str, str], queue_name: str) -> None:
    client = _tls(tls_proxy.url, tls_files, ca_file="other_ca", timeout=TIMEOUT)
    with pytest.raises(ConfigError, match="(?i)certificate verify failed"):
        Queue(client, queue_name).stats()


def test_tls_a_worker_keeps_claiming_through_a_frozen_network(
        tls_proxy: FaultProxy, tls_etcd: EtcdServer, tls_files: Dict[str, str],
        queue_name: str, thread_errors: ThreadErrors) -> None:
    """The worker's claim loop meets handshake timeouts, and goes on once they end."""
    handled: List[Any] = []
    first_started, first_may_end = threading.Event(), threading.Event()

    def handler(payload: Any) -> Any:
        if payload == "first":
            first_started.set()
            first_may_end.wait(10)
        handled.append(payload)

    with Queue(_tls(tls_proxy.url, tls_files, timeout=TIMEOUT), queue_name, lock_ttl=2) as a:
        worker = Worker(a, handler, concurrency=1, claim_timeout=0.5,
                        install_signal_handlers=False)
        a.put("first")
        runner, outcome = in_background(worker.run)
        first_started.wait(10)
        a.put("second")  # the view has it: the next claim goes to etcd for it
        tls_proxy.black_hole()
        first_may_end.set()  # its completion and the next claim meet the frozen network
        wait_until(lambda: "first" in handled, 5)
        time_frozen = time.monotonic()
        wait_until(lambda: time.monotonic() - time_frozen > 2.0, 5, message="the freeze")
        tls_proxy.pass_through()
        wait_until(lambda: "second" in handled or not runner.is_alive(), 15,
                   message="the worker to claim the second item")
        assert runner.is_alive(), outcome
        worker.stop()
        runner.join(10)
    assert "raised" not in outcome and thread_errors.seen == []


# -- item 4: an interrupted request --------------------------------------------------------

@contextlib.contextmanager
def interrupt_when(condition: Callable[[], Any], exc_type: Type[BaseException]
                   ) -> Iterator[None]:
    """Raise ``exc_type`` in the main thread once ``condition()`` holds (SIGALRM sent by
    a watching thread), as Ctrl-C or a SIGTERM handler calling sys.exit would."""
    def handler(signum: int, frame: Any) -> None:
        raise exc_type()

    def watch() -> None:
        wait_until(condition, 5, message="the moment to interrupt")
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGALRM)

    previous = signal.signal(signal.SIGALRM, handler)
    watcher = threading.Thread(target=watch, name="interrupter")
    watcher.start()
    try:
        yield
    finally:
        watcher.join(10)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_a_request_interrupted_while_awaiting_its_reply_leaves_no_reply_behind(
        proxy: FaultProxy, queue_name: str, exc_type: Type[BaseException]) -> None:
    client = connect(proxy.url, timeout=5)
    key = f"/etcdq-test/{queue_name}"
    client.put(key, "first")
    proxy.hold("down")
    with pytest.raises(exc_type), interrupt_when(lambda: proxy.held("down"), exc_type):
        client.get(key)  # interrupted once its reply is held at the proxy
    proxy.release()
    with pytest.raises(EtcdqError):  # "already exists", not the GET's old 200
        client.put(key, "second", prev_exist=False)
    assert client.get(key).node["value"] == "first"


def test_a_queue_call_interrupted_mid_request_does_not_skew_the_next(
        proxy: FaultProxy, queue_name: str) -> None:
    with Queue(connect(proxy.url, timeout=5), queue_name) as queue:
        first = queue.put("first")
        proxy.hold("down")
        with pytest.raises(KeyboardInterrupt), \
                interrupt_when(lambda: proxy.held("down"), KeyboardInterrupt):
            queue.get(first)
        proxy.release()
        second = queue.put("second")
        assert second != first
        assert queue.get(second).payload == "second"
        assert payloads(queue, "pending") == ["first", "second"]


# -- item 5: connections the server closed -------------------------------------------------

def test_kept_alive_connections_closed_while_idle_cost_no_put(
        proxy: FaultProxy, queue_name: str) -> None:
    """As a restarted etcd does: the first POST on a closed connection was never sent."""
    proxy.close_idle(0.05)
    with Queue(connect(proxy.url, timeout=1), queue_name) as queue:
        for n in range(10):
            queue.put(n)
            wait_until(lambda: proxy.open_connections == 0, 5,
                       message="the proxy to close the idle connection")
        assert proxy.accepted >= 10  # each put met a closed connection
        assert payloads(queue, "pending") == list(range(10))


def test_restarting_etcd_under_a_producer_costs_no_put(
        etcd_binary: str, tmp_path: Any, queue_name: str) -> None:
    server = EtcdServer(tmp_path / "etcd", binary=etcd_binary).start()
    try:
        with Queue(connect(server.url, timeout=1, deadline=30), queue_name) as queue:
            for round_ in range(3):
                queue.put_many([f"{round_}-{n}" for n in range(5)])
                server.restart()
            queue.put("after")
            expected = [f"{r}-{n}" for r in range(3) for n in range(5)] + ["after"]
            assert payloads(queue, "pending") == expected
    finally:
        server.stop()


# -- item 8: a connection per item ---------------------------------------------------------

def test_a_worker_reuses_its_connections_across_items(
        proxy: FaultProxy, etcd_url: str, queue_name: str) -> None:
    concurrency, items = 4, 200
    with Queue(etcd_url, queue_name) as producer:
        producer.put_many(range(items))
    with Queue(connect(proxy.url), queue_name) as queue:
        worker = Worker(queue, lambda payload: payload, concurrency=concurrency,
                        install_signal_handlers=False)
        stats = worker.run(until_empty=True)
        assert stats.completed == items
    # Each handler slot (with a second connection for the parallel deletes of a
    # completion), the claim loop, the heartbeat and a few watch streams.
    bound = 2 * concurrency + 1 + 1 + 4
    assert proxy.accepted <= bound, f"{proxy.accepted} connections for {items} items"

