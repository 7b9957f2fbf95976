"""What the lifecycle operations cost: ``python bench/lifecycle.py [--items N] [--repeats R]``.

Starts its own etcd, then for each operation of issue 12 runs ``--items``
of it from one process, ``--repeats`` times, interleaved so that the
machine's noise falls on every row alike, and prints one markdown table:
operations per second (median, range), and what etcd itself counted per
operation (writes, failed conditional writes, reads; bench/servers.py's
``etcd_counters``). bench/README.md, "Lifecycle operations", has a run.

Rows: a put and a delayed put (D1, D2); a claim that completes against one
that releases (R0, R1: the release gives its attempt back); a cancel
(K1-K4) of a pending item; and wait(): how long after ``complete()``
returned a thread blocked in ``wait()`` had the record, and the requests
its watch cost while it waited.

A claim after a release usually costs one failed write and one read more
than a first claim: the release's R0 changed the item, so a view that has not
seen that change yet compares its C2 against the old index, then reads the
item again.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import Spread, markdown_table  # noqa: E402
from bench.servers import EtcdOps, etcd_counters, etcd_server  # noqa: E402
from etcdq_v2 import Queue  # noqa: E402

#: One operation timed over ``items`` items: (seconds it took, etcd ops it caused).
Run = Tuple[float, EtcdOps]


def timed(url: str, action: Callable[[], None]) -> Run:
    before = etcd_counters(url)
    started = time.perf_counter()
    action()
    elapsed = time.perf_counter() - started
    return elapsed, EtcdOps.between(before, etcd_counters(url))


def puts(queue: Queue, items: int, delay: float) -> Callable[[], None]:
    def run() -> None:
        for n in range(items):
            queue.put(n, delay=delay or None)
    return run


def claims(queue: Queue, items: int, end: str) -> Callable[[], None]:
    """Claim each of ``items`` pending items once and complete or release it."""
    def run() -> None:
        for _ in range(items):
            claim = queue.claim(timeout=5)
            assert claim is not None, "the queue ran dry"
            claim.complete() if end == "complete" else claim.release()
    return run


def cancels(queue: Queue, ids: List[str]) -> Callable[[], None]:
    def run() -> None:
        for item_id in ids:
            assert queue.cancel(item_id)
    return run


def wait_latencies(producer: Queue, waiter: Queue, items: int) -> List[float]:
    """Seconds from the complete() call to a blocked wait() returning the record.

    wait() is woken by the commit (F1), the first of complete()'s writes, so
    it usually returns before complete() itself does.
    """
    latencies = []
    for n in range(items):
        item_id = producer.put(n)
        returned: Dict[str, float] = {}

        def wait(item_id: str = item_id, returned: Dict[str, float] = returned) -> None:
            waiter.wait(item_id, timeout=10)
            returned["at"] = time.perf_counter()
        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.02)  # let it block in its watch: the figure is the wake-up
        claim = producer.claim(timeout=5)
        assert claim is not None and claim.id == item_id
        completing = time.perf_counter()
        claim.complete()
        thread.join(10)
        latencies.append(returned["at"] - completing)
    return latencies


def idle_wait_requests(url: str, waiter: Queue, producer: Queue, seconds: float) -> EtcdOps:
    """What etcd counted while a wait() blocked for ``seconds`` on an item nobody ran."""
    item_id = producer.put("never run")
    thread = threading.Thread(target=waiter.wait, args=(item_id,), kwargs={"timeout": seconds})
    thread.start()
    time.sleep(min(1.0, seconds / 3))  # past its stream and first reads
    before = etcd_counters(url)
    thread.join(seconds + 10)
    ops = EtcdOps.between(before, etcd_counters(url))
    producer.cancel(item_id)
    return ops


def one_round(url: str, name: str, items: int) -> Dict[str, Run]:
    """Every row once, on a fresh queue."""
    runs: Dict[str, Run] = {}
    with Queue(url, name) as queue:
        runs["put"] = timed(url, puts(queue, items, 0))
        runs["put(delay=1)"] = timed(url, puts(queue, items, 1))
        time.sleep(2.5)  # the delayed ones are due: 2 * items pending
        runs["claim + complete"] = timed(url, claims(queue, items, "complete"))
        runs["claim + release"] = timed(url, claims(queue, items, "release"))
        ids = [info.id for info in queue.items("pending")]
        runs["cancel (pending item)"] = timed(url, cancels(queue, ids))
    return runs


def rows(rounds: List[Dict[str, Run]], items: int) -> List[List[str]]:
    table = []
    for row in rounds[0]:
        runs = [r[row] for r in rounds]
        rate = Spread.of(items / elapsed for elapsed, _ in runs)
        per = [ops for _, ops in runs]
        table.append([row, rate.text(0), *(f"{statistics.median(getattr(o, field) for o in per) / items:.2f}"
                                         for field in ("writes", "failed_writes", "reads"))])
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work, etcd_server(Path(work)) as server:
        url = server.url
        rounds = [one_round(url, f"lifecycle-{n}", args.items) for n in range(args.repeats)]
        print(markdown_table(["operation", "per second", "writes/op", "failed writes/op",
                              "reads/op"], rows(rounds, args.items)))
        with Queue(url, "lifecycle-wait") as producer, Queue(url, "lifecycle-wait") as waiter:
            latencies = sorted(wait_latencies(producer, waiter, 50))
            idle = idle_wait_requests(url, waiter, producer, 5.0)
        print()
        print(markdown_table(
            ["wait()", "figure"],
            [["returned after complete() was called, median (50 items)",
              f"{statistics.median(latencies) * 1000:.1f} ms"],
             ["the same, 95th percentile", f"{latencies[int(0.95 * len(latencies))] * 1000:.1f} ms"],
             ["requests to etcd while blocked 5 s (writes + reads + watches)",
              str(idle.requests)]]))


if __name__ == "__main__":
    main()
