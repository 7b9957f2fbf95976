"""Prometheus metrics against a real etcd: the queue exporter and a worker's endpoint.

Every check scrapes over HTTP and reads the exposition with prometheus_client's
own parser.  etcd reads are counted by the proxy in front of etcd (its
``requests`` list holds the request lines), not by the code under test.
"""
from __future__ import annotations

import logging
import os
import queue as queue_module
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Tuple

import pytest

from etcdq_v2 import ConfigError, NotFound, Queue, Unavailable, Worker, connect
from etcdq_v2 import metrics
from etcdq_v2.metrics import MetricsServer, RequestMetrics, export_queues
from etcdq_v2.worker import current_task

from faultproxy import FaultProxy
from helpers import in_background, wait_until

try:
    import prometheus_client
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # the tests of what needs no prometheus_client still run
    prometheus_client = None

#: The tests that scrape: skipped, with the reason, without the extra.
needs_prometheus = pytest.mark.skipif(
    prometheus_client is None,
    reason="prometheus_client is missing: pip install -e '.[metrics]' (the test extra has it)")

BOUND = 15.0
Samples = Dict[str, Dict[FrozenSet[Tuple[str, str]], float]]


def scrape(url: str) -> Samples:
    """The exposition at ``url``: sample name -> labels -> value (parsed by prometheus_client)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=BOUND) as reply:
        text = reply.read().decode("utf-8")
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return found


def value(samples: Samples, name: str, **labels: str) -> Optional[float]:
    return samples.get(name, {}).get(frozenset(labels.items()))


def queue_items(samples: Samples, queue: str) -> Dict[str, float]:
    """The exporter's counts of one queue, by state ({} if it served none)."""
    return {dict(labels)["state"]: number
            for labels, number in samples.get("etcdq_queue_items", {}).items()
            if dict(labels)["queue"] == queue}


def reads_of(proxy: FaultProxy, queue: str) -> List[bytes]:
    """The GETs of the whole queue that went through the proxy."""
    start = f"GET /v2/keys/etcdq/{queue}?".encode()
    return [line for line in proxy.requests if line.startswith(start)]


@pytest.fixture
def opened() -> Iterator[List[Any]]:
    """Queues, servers and workers to close after the test (anything with close())."""
    things: List[Any] = []
    yield things
    for thing in reversed(things):
        thing.close()


@pytest.fixture
def make_queue(etcd_url: str, queue_name: str, opened: List[Any]) -> Callable[..., Queue]:
    def make(url: str = etcd_url, name: str = queue_name, **options: Any) -> Queue:
        options.setdefault("lock_ttl", 3)
        opened.append(Queue(url, name, **options))
        return opened[-1]
    return make


#: What fill_every_state leaves: the requeued item is pending, its tombstone no dead letter.
FILLED = {"pending": 4, "running": 1, "completed": 3, "failed": 2}


def fill_every_state(queue: Queue) -> None:
    """Items in all four states, and the look-alikes a count must not be fooled by
    (a queue with max_attempts=1).  The running item runs until the queue is closed."""
    outcomes = ("complete", "complete", "complete", "fail", "fail")
    queue.put_many(outcomes)
    for outcome in outcomes:                        # a lone consumer claims in FIFO order
        claim = queue.claim(timeout=BOUND)
        assert claim is not None and claim.payload == outcome
        getattr(claim, outcome)(outcome)            # completed x3, dead letters x2
    queue.put("held")
    held = queue.claim(timeout=BOUND)
    assert held is not None and held.payload == "held"  # running
    queue.requeue(queue.items("failed")[0].id)      # a tombstone in failed/, pending again
    queue.put_many(["a", "b"])                      # pending
    queue.put("later", delay=60)                    # pending behind a delay lock
    queue.cancel(queue.put("cancelled"))            # a dead letter by cancel


# -- the exporter -----------------------------------------------------------------

@needs_prometheus
def test_the_exporter_serves_the_counts_stats_gives_for_every_state(
        make_queue: Callable[..., Queue], queue_name: str, opened: List[Any]) -> None:
    queue = make_queue(max_attempts=1)
    fill_every_state(queue)
    expected = FILLED
    assert queue.stats() == expected
    empty = f"{queue_name}-empty"
    server = export_queues([make_queue(), make_queue(name=empty)], 0)
    opened.append(server)
    samples = scrape(server.url)
    assert queue_items(samples, queue_name) == expected
    assert queue_items(samples, empty) == {state: 0 for state in expected}
    assert value(samples, "etcdq_queue_read_errors_total", queue=queue_name) == 0


@needs_prometheus
def test_finished_items_whose_locks_linger_are_not_served_as_running(
        make_queue: Callable[..., Queue], queue_name: str, opened: List[Any]) -> None:
    """issue 14: F4 is skipped (lock_ttl 30 s), so the locks of a completed item and
    a dead letter are still in locks/ when the exporter reads the queue."""
    queue = make_queue(lock_ttl=30, max_attempts=1)
    queue.put_many(["done", "dead", "waiting"])
    queue.claim(timeout=BOUND).complete()
    queue.claim(timeout=BOUND).fail("no")
    assert len(queue._protocol.list("locks")[1]) == 2  # both finishers' locks linger
    server = export_queues([queue], 0)
    opened.append(server)
    assert queue_items(scrape(server.url), queue_name) == \
        {"pending": 1, "running": 0, "completed": 1, "failed": 1}


def test_stats_reads_the_queue_in_one_request(make_queue: Callable[..., Queue],
                                             proxy: FaultProxy, queue_name: str,
                                             opened: List[Any]) -> None:
    fill_every_state(make_queue(max_attempts=1))
    reader = make_queue(proxy.url)  # no claims: no view, no watch through the proxy
    assert reader.stats() == FILLED
    assert proxy.requests == [
        f"GET /v2/keys/etcdq/{queue_name}?quorum=true&recursive=true HTTP/1.1".encode()]
    before = len(proxy.requests)
    assert reader.stats(quorum=False) == FILLED
    assert proxy.requests[before:] == [
        f"GET /v2/keys/etcdq/{queue_name}?recursive=true HTTP/1.1".encode()]


@needs_prometheus
def test_scrapes_within_the_interval_read_etcd_once(
        make_queue: Callable[..., Queue], proxy: FaultProxy, queue_name: str,
        opened: List[Any]) -> None:
    producer = make_queue()
    producer.put_many([1, 2])
    server = export_queues([make_queue(proxy.url)], 0, min_interval=60)
    opened.append(server)
    first = scrape(server.url)
    producer.put(3)  # not seen before the interval is over: the counts are cached
    later = [scrape(server.url) for _ in range(3)]
    assert [queue_items(s, queue_name)["pending"] for s in [first, *later]] == [2, 2, 2, 2]
    assert reads_of(proxy, queue_name) == [
        f"GET /v2/keys/etcdq/{queue_name}?recursive=true HTTP/1.1".encode()]
    assert len(proxy.requests) == 1  # nothing else either
    assert value(later[-1], "etcdq_etcd_requests_total", method="GET") == 1


@needs_prometheus
def test_the_counts_are_read_again_once_the_interval_is_over(
        make_queue: Callable[..., Queue], proxy: FaultProxy, queue_name: str,
        opened: List[Any]) -> None:
    producer = make_queue()
    producer.put(1)
    server = export_queues([make_queue(proxy.url)], 0, min_interval=0.3)
    opened.append(server)
    assert queue_items(scrape(server.url), queue_name)["pending"] == 1
    producer.put(2)
    wait_until(lambda: queue_items(scrape(server.url), queue_name)["pending"] == 2, BOUND,
               message="the exporter to read the queue again")
    assert len(reads_of(proxy, queue_name)) >= 2


@needs_prometheus
def test_a_scrape_during_a_slow_read_waits_for_it_instead_of_reading_again(
        make_queue: Callable[..., Queue], proxy: FaultProxy, queue_name: str,
        opened: List[Any]) -> None:
    make_queue().put_many([1, 2, 3])
    server = export_queues([make_queue(proxy.url)], 0, min_interval=0)
    opened.append(server)
    proxy.delay(700, "down")  # every reply takes 0.7 s
    first, first_out = in_background(lambda: scrape(server.url), "first scrape")
    wait_until(lambda: reads_of(proxy, queue_name), BOUND, message="the first read to start")
    second, second_out = in_background(lambda: scrape(server.url), "second scrape")
    first.join(BOUND)
    second.join(BOUND)
    counts = [queue_items(out["returned"], queue_name) for out in (first_out, second_out)]
    assert counts[0] == counts[1] and counts[0]["pending"] == 3
    # min_interval=0 would read for every scrape: only the read in flight was shared.
    assert len(reads_of(proxy, queue_name)) == 1


@needs_prometheus
def test_a_failed_read_serves_no_counts_counts_the_error_and_recovers(
        make_queue: Callable[..., Queue], proxy: FaultProxy, queue_name: str,
        opened: List[Any], caplog: pytest.LogCaptureFixture) -> None:
    make_queue().put(1)
    transport = connect(proxy.url, timeout=0.3, deadline=0.6)
    opened.append(transport)
    server = export_queues([make_queue(transport)], 0, min_interval=0.2)
    opened.append(server)
    assert queue_items(scrape(server.url), queue_name)["pending"] == 1
    proxy.refuse()
    with caplog.at_level(logging.WARNING, logger="etcdq_v2.metrics"):
        samples = wait_until(lambda: failed_read(scrape(server.url), queue_name), BOUND,
                             message="a scrape whose read failed")
    assert queue_items(samples, queue_name) == {}  # no stale counts that look healthy
    assert value(samples, "etcdq_queue_read_errors_total", queue=queue_name) == 1
    assert (value(samples, "etcdq_etcd_request_errors_total", method="GET", error="NotSent")
            or 0) >= 1
    assert any("cannot read queue" in record.getMessage() for record in caplog.records)
    proxy.restart()
    wait_until(lambda: queue_items(scrape(server.url), queue_name).get("pending") == 1, BOUND,
               message="counts again once etcd answers")


@needs_prometheus
def test_a_queue_with_a_directory_nested_600_deep_is_counted_and_the_others_served(
        make_queue: Callable[..., Queue], queue_name: str, opened: List[Any]) -> None:
    """A recursive GET of a queue holding a directory 600 levels deep (junk) is JSON
    too deep to decode: stats falls back to a listing per directory, so the scrape
    serves that queue and every other one (it used to be an HTTP 500 for all)."""
    junk, clean = make_queue(name=f"{queue_name}-junk"), make_queue(name=f"{queue_name}-clean")
    clean.put("counted")
    junk.put("counted too")
    junk.etcd.put(junk.layout.root + "/junk" + "/a" * 600, "v")
    server = export_queues([junk, clean], 0)
    opened.append(server)
    samples = scrape(server.url)
    assert queue_items(samples, clean.name)["pending"] == 1
    assert queue_items(samples, junk.name)["pending"] == 1
    assert value(samples, "etcdq_queue_read_errors_total", queue=junk.name) == 0


class BrokenQueue(Queue):
    """A queue whose stats() fails with an error outside etcdq_v2.errors (a bug)."""

    reads = 0

    def stats(self, *, quorum: bool = True) -> Dict[str, int]:
        BrokenQueue.reads += 1
        raise RuntimeError("a bug in stats")


@needs_prometheus
def test_an_unexpected_error_reading_one_queue_is_counted_and_the_others_served(
        etcd_url: str, make_queue: Callable[..., Queue], queue_name: str,
        opened: List[Any], caplog: pytest.LogCaptureFixture) -> None:
    """Not only EtcdqError: any failure of one queue's read is that queue's alone
    (counted in read_errors, logged with its traceback, not read again within the
    interval); the scrape serves every other queue."""
    broken = BrokenQueue(etcd_url, f"{queue_name}-broken")
    opened.append(broken)
    clean = make_queue()
    clean.put("counted")
    server = export_queues([broken, clean], 0, min_interval=60)
    opened.append(server)
    with caplog.at_level(logging.ERROR, logger="etcdq_v2.metrics"):
        first = scrape(server.url)
        second = scrape(server.url)
    for samples in (first, second):
        assert queue_items(samples, queue_name)["pending"] == 1
        assert queue_items(samples, broken.name) == {}
        assert value(samples, "etcdq_queue_read_errors_total", queue=broken.name) == 1
    assert BrokenQueue.reads == 1  # the failure is kept for the interval
    assert any("a bug in stats" in (record.exc_text or "") for record in caplog.records)


def failed_read(samples: Samples, queue: str) -> Optional[Samples]:
    errors = value(samples, "etcdq_queue_read_errors_total", queue=queue)
    return samples if errors else None


# -- a worker -----------------------------------------------------------------------

@needs_prometheus
def test_a_worker_counts_its_items_by_outcome_and_serves_them(
        make_queue: Callable[..., Queue], queue_name: str, opened: List[Any]) -> None:
    queue = make_queue(max_attempts=1)
    queue.put_many(["ok", "ok", "bad", "hold"])
    started = threading.Event()

    def handler(payload: str) -> str:
        if payload == "bad":
            raise ValueError("bad")
        if payload == "hold":
            started.set()
            current_task().cancelled.wait(BOUND)
        return payload

    requests_before = dict(queue.etcd.requests)
    worker = Worker(queue, handler, claim_timeout=0.2, install_signal_handlers=False,
                    metrics_port=0)
    opened.append(worker)
    assert worker.metrics_server is not None
    url = worker.metrics_server.url
    assert url.startswith("http://127.0.0.1:")
    thread, outcome = in_background(worker.run, "worker")
    assert started.wait(BOUND)
    running = scrape(url)
    assert value(running, "etcdq_worker_claims_in_flight", queue=queue_name) == 1
    assert worker_items(running, queue_name) == {"completed": 2, "failed": 1, "lost": 0,
                                                 "released": 0}
    worker.stop(grace=False)
    thread.join(BOUND)
    stats = outcome["returned"]
    # A view with a backlog watches nothing: make this one start watching (a claim
    # that finds nothing free), so that a watch is counted too.
    again = queue.claim(timeout=0)  # the held item, released by the forced stop
    assert again is not None and again.payload == "hold"
    again.complete()
    assert queue.claim(timeout=0) is None
    done = scrape(url)  # served until close(), after run() too
    assert worker_items(done, queue_name) == {"completed": 2, "failed": 1, "lost": 0,
                                              "released": 1}
    # The metric's "failed" is every failed attempt: retried or dead-lettered.
    assert (stats.completed, stats.attempts_failed, stats.dead_lettered, stats.lost,
            stats.released) == (2, 0, 1, 0, 1)
    assert value(done, "etcdq_worker_claims_in_flight", queue=queue_name) == 0
    assert value(done, "etcdq_worker_item_duration_seconds_count", queue=queue_name) == 4
    # Every request the worker's transport sent was counted, once (the heartbeat's too).
    for method in ("GET", "PUT", "DELETE"):
        sent = queue.etcd.requests[method] - requests_before.get(method, 0)
        assert sent > 0 and value(done, "etcdq_etcd_requests_total", method=method) == sent
    assert (value(done, "etcdq_etcd_requests_total", method="watch") or 0) >= 1


def worker_items(samples: Samples, queue: str) -> Dict[str, float]:
    return {dict(labels)["outcome"]: number
            for labels, number in samples.get("etcdq_worker_items_total", {}).items()
            if dict(labels)["queue"] == queue}


@needs_prometheus
def test_two_workers_in_one_process_serve_their_own_counts(
        make_queue: Callable[..., Queue], queue_name: str, opened: List[Any]) -> None:
    first, second = make_queue(), make_queue(name=f"{queue_name}-2")
    first.put_many([1, 2])
    workers = [Worker(queue, lambda payload: payload, claim_timeout=0.2,
                      install_signal_handlers=False, metrics_port=0)
               for queue in (first, second)]
    opened.extend(workers)
    for worker in workers:
        worker.run(until_empty=True)
    one, two = (scrape(worker.metrics_server.url) for worker in workers if worker.metrics_server)
    assert worker_items(one, first.name)["completed"] == 2
    assert worker_items(one, second.name) == {}
    assert worker_items(two, second.name)["completed"] == 0


@needs_prometheus
def test_request_metrics_count_each_request_and_failure_by_method(
        make_queue: Callable[..., Queue], proxy: FaultProxy, opened: List[Any]) -> None:
    transport = connect(proxy.url, timeout=0.3, deadline=0.6)
    opened.append(transport)
    queue = make_queue(transport)
    registry = prometheus_client.CollectorRegistry()
    counted = RequestMetrics(registry)
    counted.watch([transport, transport])  # given twice, counted once
    queue.put(1)
    with pytest.raises(NotFound):
        queue.get("00000000000000000001")  # a GET etcd answers "key not found"
    proxy.refuse()
    with pytest.raises(Unavailable):
        queue.stats()
    proxy.restart()
    server = MetricsServer(registry, 0)
    opened.append(server)
    samples = scrape(server.url)
    assert value(samples, "etcdq_etcd_requests_total", method="POST") == 1
    gets = value(samples, "etcdq_etcd_requests_total", method="GET") or 0
    missing = value(samples, "etcdq_etcd_request_errors_total", method="GET",
                    error="KeyMissing") or 0
    unsent = value(samples, "etcdq_etcd_request_errors_total", method="GET",
                   error="NotSent") or 0
    assert missing >= 1 and unsent >= 1 and gets == transport.requests["GET"]
    assert value(samples, "etcdq_etcd_request_duration_seconds_count", method="GET") == gets
    counted.unwatch()
    queue.put(2)
    assert value(scrape(server.url), "etcdq_etcd_requests_total", method="POST") == 1


def test_an_observer_that_raises_is_logged_and_the_request_goes_on(
        make_queue: Callable[..., Queue], caplog: pytest.LogCaptureFixture) -> None:
    queue = make_queue()

    def broken(method: str, seconds: float, error: Optional[str]) -> None:
        raise RuntimeError("observer bug")

    queue.etcd.add_observer(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="etcdq_v2.transport"):
            item_id = queue.put(1)
        assert queue.get(item_id).payload == 1
    finally:
        queue.etcd.remove_observer(broken)
    assert any("observer" in record.getMessage() for record in caplog.records)


# -- bad input ----------------------------------------------------------------------

@pytest.mark.parametrize("port", [-1, 65536, 1.5, True, "9100"])
def test_a_bad_port_is_a_config_error(make_queue: Callable[..., Queue], port: Any) -> None:
    with pytest.raises(ConfigError, match="port"):
        Worker(make_queue(), print, metrics_port=port)


@needs_prometheus
def test_a_port_in_use_is_a_config_error_and_counts_nothing(
        make_queue: Callable[..., Queue], opened: List[Any]) -> None:
    queue = make_queue()
    server = export_queues([queue], 0)
    opened.append(server)
    with pytest.raises(ConfigError, match=f"127.0.0.1:{server.port}"):
        Worker(queue, print, metrics_port=server.port)
    assert len(queue.etcd._observers) == 1  # the exporter's; the failed worker's is gone


@needs_prometheus
@pytest.mark.parametrize("interval", [-1, float("nan"), float("inf"), "5"])
def test_a_bad_min_interval_is_a_config_error(make_queue: Callable[..., Queue],
                                              interval: Any) -> None:
    with pytest.raises(ConfigError, match="min_interval"):
        export_queues([make_queue()], 0, min_interval=interval)


def test_without_prometheus_client_metrics_are_a_config_error_naming_the_extra(
        make_queue: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # what a missing package does
    with pytest.raises(ConfigError, match=r"etcdq_v2\[metrics\]"):
        Worker(make_queue(), print, metrics_port=0)
    with pytest.raises(ConfigError, match=r"etcdq_v2\[metrics\]"):
        metrics.prometheus()
    Worker(make_queue(), print)  # without metrics, nothing needs it


# -- the command line -------------------------------------------------------------------

def etcdq(*args: str, **options: Any) -> "subprocess.Popen[str]":
    """``python -m etcdq_v2 ARGS`` (this tree's), its stdout and stderr piped."""
    return subprocess.Popen([sys.executable, "-m", "etcdq_v2", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **options)


def lines_of(stream: Optional[IO[str]]) -> "queue_module.Queue[str]":
    """A stream's lines, read in a thread, so that every wait for one is bounded."""
    assert stream is not None
    lines: "queue_module.Queue[str]" = queue_module.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    return lines


def line_matching(lines: "queue_module.Queue[str]", pattern: str) -> "re.Match[str]":
    deadline = time.monotonic() + BOUND
    while True:
        match = re.search(pattern, lines.get(timeout=max(deadline - time.monotonic(), 0.01)))
        if match:
            return match


@needs_prometheus
def test_etcdq_metrics_serves_the_counts_until_sigterm(
        make_queue: Callable[..., Queue], etcd_url: str, queue_name: str) -> None:
    fill_every_state(make_queue(max_attempts=1))
    process = etcdq("--endpoints", etcd_url, "metrics", "--port", "0", queue_name,
                    f"{queue_name}-empty")
    try:
        url = lines_of(process.stdout).get(timeout=BOUND).strip()
        samples = scrape(url)
        assert queue_items(samples, queue_name) == FILLED
        assert queue_items(samples, f"{queue_name}-empty") == dict.fromkeys(FILLED, 0)
        assert not [name for name in samples if name.endswith("_created")]
        assert url.startswith("http://127.0.0.1:")
        process.send_signal(signal.SIGTERM)
        assert process.wait(BOUND) == 0
    finally:
        process.kill()
        process.communicate()


@needs_prometheus
def test_etcdq_work_serves_its_metrics_while_it_runs(
        make_queue: Callable[..., Queue], etcd_url: str, queue_name: str,
        tmp_path: Path) -> None:
    queue = make_queue()
    queue.put_many([{"n": 1}, {"n": 2}, {"n": 3}])
    process = etcdq("--endpoints", etcd_url, "work", queue_name, "--metrics-port", "0",
                    "--max-attempts", "1", "--until-empty", "--",
                    sys.executable, "-c", JOB, str(tmp_path))
    try:
        url = line_matching(lines_of(process.stderr), r"worker metrics at (\S+)").group(1)
        samples = wait_until(lambda: running_third(scrape(url), queue_name), BOUND,
                             message="items 1 and 2 settled, item 3 running")
        assert value(samples, "etcdq_etcd_requests_total", method="PUT")
        (tmp_path / "go").touch()
        assert process.wait(BOUND) == 1  # an item failed
    finally:
        process.kill()
        process.communicate()
    assert queue.stats() == {"pending": 0, "running": 0, "completed": 2, "failed": 1}


# Item 1 completes, item 2 fails, item 3 waits for a file "go" in the directory given.
JOB = """
import json, os, sys, time
n = json.load(sys.stdin)["n"]
if n == 2:
    sys.exit(3)
deadline = time.monotonic() + 30
while n == 3 and not os.path.exists(os.path.join(sys.argv[1], "go")) \\
        and time.monotonic() < deadline:
    time.sleep(0.05)
print(n)
"""


def running_third(samples: Samples, queue: str) -> Optional[Samples]:
    settled = worker_items(samples, queue)
    flying = value(samples, "etcdq_worker_claims_in_flight", queue=queue)
    return samples if (settled["completed"], settled["failed"], flying) == (1, 1, 1) else None


@pytest.mark.parametrize("verb", [["metrics", "--port", "0", "q"],
                                  ["work", "q", "--metrics-port", "0", "--", "true"]])
def test_the_cli_without_prometheus_client_names_the_extra(
        etcd_url: str, tmp_path: Path, verb: List[str]) -> None:
    (tmp_path / "prometheus_client.py").write_text("raise ImportError('not installed')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    process = etcdq("--endpoints", etcd_url, *verb, env=env)
    out, err = process.communicate(timeout=BOUND)
    assert process.returncode == 2, err
    assert "etcdq_v2[metrics]" in err and "Traceback" not in err


@pytest.mark.parametrize("args", [["q"], ["--port", "0", "q", "q"], ["--port", "0", "a/b"]])
def test_etcdq_metrics_usage_errors_exit_2(etcd_url: str, args: List[str]) -> None:
    process = etcdq("--endpoints", etcd_url, "metrics", *args)
    out, err = process.communicate(timeout=BOUND)
    assert process.returncode == 2 and err.startswith("etcdq: error:"), err
