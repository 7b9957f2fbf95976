"""A Worker over several queues in priority order, against a real etcd.

``Worker([high, low], handler)`` takes an item of ``high`` whenever ``high``
has a free one, waits for work on every queue at once without polling (no
request reaches etcd while it is idle: counted through the fault proxy), and
still works on a single Queue.  Also here: the ``extra=`` fields of log lines
about an item, and ``etcdq work high,low`` with its exit status.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from etcdq_v2 import (ConfigError, InvalidArgument, LockLost, Queue, Worker, claim_first,
                      current_task)

from faultproxy import FaultProxy
from helpers import wait_until

BOUND = 15.0  # seconds any single wait may take before it counts as a hang
LOCK_TTL = 3

MakeQueues = Callable[..., Tuple[Queue, Queue]]


@pytest.fixture
def opened() -> Iterator[List[Queue]]:
    """Queues a test opened, closed after it."""
    queues: List[Queue] = []
    yield queues
    for queue in queues:
        queue.close()


@pytest.fixture
def make_queues(etcd_url: str, queue_name: str, opened: List[Queue]) -> MakeQueues:
    """``make(url=etcd_url, **options)``: Queues ``<name>-high`` and ``<name>-low``."""
    def make(url: str = etcd_url, **options: Any) -> Tuple[Queue, Queue]:
        options.setdefault("lock_ttl", LOCK_TTL)
        pair = (Queue(url, f"{queue_name}-high", **options),
                Queue(url, f"{queue_name}-low", **options))
        opened.extend(pair)
        return pair
    return make


class Recorder:
    """A handler that records ``(queue name, payload)`` in the order items ran."""

    def __init__(self, then: Optional[Callable[[str, Any], None]] = None) -> None:
        self.seen: List[Tuple[str, Any]] = []
        self.changed = threading.Condition()
        self._then = then

    def __call__(self, payload: Any) -> Any:
        queue = current_task().claim.queue
        with self.changed:
            self.seen.append((queue, payload))
            self.changed.notify_all()
        if self._then is not None:
            self._then(queue, payload)
        return "done"

    def wait_for(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.seen) >= count, BOUND), self.seen


def worker_of(queues: Any, handler: Callable[[Any], Any], **options: Any) -> Worker:
    options.setdefault("claim_timeout", 0.2)
    options.setdefault("install_signal_handlers", False)
    return Worker(queues, handler, **options)


def wait_quiet(proxy: FaultProxy, quiet: float = 0.3) -> None:
    """Wait until no byte went to etcd through ``proxy`` for ``quiet`` seconds."""
    def still() -> bool:
        before = proxy.bytes_up
        time.sleep(quiet)
        return proxy.bytes_up == before
    wait_until(still, BOUND, interval=0, message="the clients to go quiet")


# -- priority --------------------------------------------------------------------------

def test_with_both_queues_holding_free_items_the_high_one_is_always_taken_first(
        make_queues: MakeQueues) -> None:
    high, low = make_queues()
    # Low's items are older: put order alone would run them first.
    low.put_many([{"low": n} for n in range(5)])
    high.put_many([{"high": n} for n in range(5)])
    recorder = Recorder()
    stats = worker_of([high, low], recorder).run(until_empty=True)
    assert stats.completed == 10
    assert recorder.seen == ([(high.name, {"high": n}) for n in range(5)]
                             + [(low.name, {"low": n}) for n in range(5)])


def test_a_high_item_put_while_low_items_run_is_taken_before_the_other_low_items(
        make_queues: MakeQueues) -> None:
    high, low = make_queues()
    low.put_many([{"low": n} for n in range(4)])

    def urgent_after_the_first(queue: str, payload: Any) -> None:
        if payload == {"low": 0}:
            high.put({"high": "urgent"})

    recorder = Recorder(urgent_after_the_first)
    worker_of([high, low], recorder).run(until_empty=True)
    assert [payload for _, payload in recorder.seen] == [
        {"low": 0}, {"high": "urgent"}, {"low": 1}, {"low": 2}, {"low": 3}]


def test_a_low_item_is_taken_when_high_is_empty(make_queues: MakeQueues) -> None:
    high, low = make_queues()
    item_id = low.put({"low": 0})
    claim = claim_first([high, low], timeout=BOUND)
    assert claim is not None and (claim.queue, claim.id) == (low.name, item_id)
    claim.complete("by hand")
    low.put({"low": 1})
    recorder = Recorder()
    assert worker_of([high, low], recorder).run(until_empty=True).completed == 1
    assert recorder.seen == [(low.name, {"low": 1})]
    assert claim_first([high, low]) is None  # timeout 0: nothing free, no wait


@pytest.mark.parametrize("target", ["high", "low"])
def test_an_item_put_into_either_queue_while_idle_wakes_the_worker_promptly(
        make_queues: MakeQueues, proxy: FaultProxy, etcd_url: str, queue_name: str,
        background: Callable, target: str) -> None:
    """The worker claims with a 30 s timeout: only the wake-up can explain a prompt start."""
    high, low = make_queues(proxy.url)
    recorder = Recorder()
    worker = worker_of([high, low], recorder, claim_timeout=30)
    done = background(lambda: worker.run(max_items=2))
    try:
        # A first item, so that both views are up and the worker then waits on both.
        (low if target == "high" else high).put({"first": True})
        recorder.wait_for(1)
        wait_quiet(proxy)  # the worker is idle now: nothing goes to etcd
        with Queue(etcd_url, f"{queue_name}-{target}") as producer:  # another process's put
            put_at = time.monotonic()
            producer.put({"woke": target})
        recorder.wait_for(2)
        latency = time.monotonic() - put_at
    finally:
        worker.stop()  # a no-op once it returned; else it ends at its next claim round
    assert recorder.seen[1] == (f"{queue_name}-{target}", {"woke": target})
    assert latency < 3.0, f"started {latency:.2f} s after the put"
    assert done.result(timeout=BOUND).completed == 2


def test_an_idle_worker_over_two_queues_sends_no_requests_and_does_not_spin(
        make_queues: MakeQueues, proxy: FaultProxy, background: Callable) -> None:
    high, low = make_queues(proxy.url)
    recorder = Recorder()
    # A short claim timeout: the worker's loop goes round 5 times a second.
    worker = worker_of([high, low], recorder, claim_timeout=0.2)
    done = background(worker.run)
    try:
        high.put({"high": 0})
        low.put({"low": 0})
        recorder.wait_for(2)
        wait_quiet(proxy)
        requests, cpu = len(proxy.requests), time.process_time()
        time.sleep(2.0)  # the window observed: nothing may happen in it
        cpu_used = time.process_time() - cpu
    finally:
        worker.stop()
    assert done.result(timeout=BOUND).completed == 2
    assert proxy.requests[requests:] == []
    assert cpu_used < 0.5, f"{cpu_used:.2f} s of CPU in 2 s of idling"


# -- a single queue ---------------------------------------------------------------------

def test_a_single_queue_still_works_alone_or_in_a_list(make_queues: MakeQueues) -> None:
    queue, _ = make_queues()
    for shape in (queue, [queue]):
        queue.put_many([{"n": 0}, {"n": 1}])
        recorder = Recorder()
        worker = worker_of(shape, recorder)
        assert (worker.queue, worker.queues) == (queue, (queue,))
        assert worker.run(until_empty=True).completed == 2
        assert recorder.seen == [(queue.name, {"n": 0}), (queue.name, {"n": 1})]
    claim = claim_first([queue])
    assert claim is None
    item_id = queue.put({"n": 2})
    claim = claim_first([queue], timeout=BOUND)
    assert claim is not None and claim.id == item_id


def test_bad_queue_lists_are_refused(make_queues: MakeQueues, etcd_url: str) -> None:
    high, low = make_queues()
    same_name = Queue(etcd_url, high.name)
    try:
        for bad in ([], [high, high], [high, same_name], [high, "low"], "high"):
            with pytest.raises(ConfigError):
                worker_of(bad, lambda payload: None)
    finally:
        same_name.close()
    with pytest.raises(InvalidArgument):
        claim_first([])


# -- extra= fields of log lines about an item -----------------------------------------------

class Fields(logging.Handler):
    """Keeps the records that carry the item fields, as a JSON formatter would see them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: List[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def about(self, item_id: str) -> List[Dict[str, Any]]:
        return [{"queue": getattr(r, "queue", None), "attempt": getattr(r, "attempt", None),
                 "message": r.getMessage()}
                for r in self.records if getattr(r, "item_id", None) == item_id]


@pytest.fixture
def fields() -> Iterator[Fields]:
    handler = Fields()
    logger = logging.getLogger("etcdq_v2")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_log_lines_about_an_item_carry_its_queue_id_and_attempt(
        make_queues: MakeQueues, fields: Fields) -> None:
    high, low = make_queues(max_attempts=1)
    good, bad = high.put({"ok": True}), low.put({"ok": False})

    def handler(payload: Any) -> Any:
        if not payload["ok"]:
            raise ValueError("no")
        return "yes"

    worker_of([high, low], handler).run(until_empty=True)
    [completed] = fields.about(good)
    assert (completed["queue"], completed["attempt"]) == (high.name, 1)
    assert "completed" in completed["message"]
    [failed] = fields.about(bad)
    assert (failed["queue"], failed["attempt"]) == (low.name, 1)
    assert "ValueError: no" in failed["message"]


def test_a_skipped_junk_item_is_logged_with_the_item_fields_and_no_attempt(
        make_queues: MakeQueues, fields: Fields) -> None:
    high, low = make_queues()
    junk_id = high.etcd.post(high.layout.work, "not json at all").node["key"].rsplit("/", 1)[1]
    assert claim_first([high, low]) is None
    assert [(f["queue"], f["attempt"]) for f in fields.about(junk_id)] == [(high.name, None)]


def test_a_lost_lock_and_a_dead_lettered_item_are_logged_with_the_item_fields(
        make_queues: MakeQueues, etcd_url: str, fields: Fields) -> None:
    high, low = make_queues(lock_ttl=1, max_attempts=1)
    item_id = high.put({"n": 0})
    claim = high.claim(timeout=BOUND)
    assert claim is not None
    # Another lock takes the place of ours (for a second): the next refresh
    # finds it (claim.py's warning).
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(urllib.request.Request(
        f"{etcd_url}/v2/keys{high.layout.key('locks', item_id)}", method="PUT",
        data=b"value=someone-else&ttl=1"), timeout=5).close()
    with pytest.raises(LockLost):
        claim.refresh()
    assert [(f["queue"], f["attempt"]) for f in fields.about(item_id)] == [(high.name, 1)]
    # Its one attempt is spent: once that lock expired, the next claim
    # dead-letters it (protocol.py's warning).
    wait_until(lambda: claim_first([high, low]) is None and high.get(item_id).state == "failed",
               BOUND, message="the item to be dead-lettered")
    assert [(f["queue"], f["attempt"]) for f in fields.about(item_id)][1:] == [(high.name, 1)]


# -- etcdq work high,low ------------------------------------------------------------------

# Appends "<ETCDQ_QUEUE> <payload>" to the file given; fails (exit 3) a payload of "fail".
LOGGING_JOB = """
import os, sys
payload = sys.stdin.read()
with open(sys.argv[1], "a") as out:
    out.write(os.environ["ETCDQ_QUEUE"] + " " + payload + "\\n")
sys.exit(3 if payload == '"fail"' else 0)
"""


def etcdq(etcd_url: str, *args: str) -> "subprocess.CompletedProcess[str]":
    env = {**os.environ, "ETCDQ_ENDPOINTS": etcd_url}
    return subprocess.run([sys.executable, "-m", "etcdq_v2", *args], capture_output=True,
                          text=True, timeout=60, env=env)


@pytest.fixture
def job(tmp_path: Path) -> Tuple[Path, Path]:
    script, log = tmp_path / "job.py", tmp_path / "ran.txt"
    script.write_text(LOGGING_JOB)
    return script, log


def test_work_over_high_low_takes_high_first_and_exits_0_when_nothing_failed(
        make_queues: MakeQueues, etcd_url: str, job: Tuple[Path, Path]) -> None:
    high, low = make_queues()
    low.put_many(["l1", "l2"])
    high.put_many(["h1", "h2"])
    script, log = job
    done = etcdq(etcd_url, "work", f"{high.name},{low.name}", "--until-empty", "--json",
                 "--", sys.executable, str(script), str(log))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["completed"] == 4
    assert log.read_text().splitlines() == [
        f'{high.name} "h1"', f'{high.name} "h2"', f'{low.name} "l1"', f'{low.name} "l2"']
    records = {info.payload: info.node_id for queue in (high, low)
               for info in queue.items("completed")}
    assert len(set(records.values())) == 1, records  # one worker: one node id


def test_work_exits_1_when_an_item_it_handled_failed(
        make_queues: MakeQueues, etcd_url: str, job: Tuple[Path, Path]) -> None:
    high, low = make_queues()
    low.put_many(["fine", "fail"])
    script, log = job
    done = etcdq(etcd_url, "work", f"{high.name},{low.name}", "--until-empty", "--json",
                 "--max-attempts", "1", "--", sys.executable, str(script), str(log))
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout) == {"completed": 1, "attempts_failed": 0, "dead_lettered": 1,
                                       "lost": 0, "released": 0}
    assert [info.payload for info in low.items("failed")] == ["fail"]


@pytest.mark.parametrize("names, fragment", [("a,,b", "invalid queue name"),
                                             ("a,b/c", "invalid queue name"),
                                             ("a,b,a", "named twice")])
def test_work_refuses_a_bad_list_of_queues_with_exit_2(
        etcd_url: str, names: str, fragment: str) -> None:
    done = etcdq(etcd_url, "work", names, "--", "true")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("etcdq: error: ") and fragment in done.stderr


def test_work_help_documents_the_list_of_queues_and_the_exit_status() -> None:
    done = etcdq("http://127.0.0.1:1", "work", "--help")
    text = " ".join(done.stdout.split())
    assert "QUEUE[,QUEUE...]" in text
    assert "exits with status 1 when any attempt it ran failed" in text
    top = " ".join(etcdq("http://127.0.0.1:1", "--help").stdout.split())
    assert "1 any other error" in top and "work: an attempt it ran failed" in top
