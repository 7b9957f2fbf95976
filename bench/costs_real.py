"""What a completed item costs on a real etcd, counted by etcd and by a proxy.

``python bench/costs_real.py --consumers 8 64`` (one fresh etcd per count).

The same run as bench/costs.py's, with processes for sim-threads: a backlog
of 10 x C items is put straight to etcd, then C consumer processes (claim,
work 0.05-0.45 s, complete) and two producer processes (put one at a time;
put_many of up to 64, in_flight 8) that keep the backlog topped up, all
through one counting proxy (bench/delayproxy.py with no delay).  etcd's
counters (``/v2/stats/store``, ``/metrics``: bench/servers.py) and the
proxy's bytes are read when the consumers start, when each has completed an
item (end of *start*), and after 20 x C more items (end of *steady*).  The
proxy's bytes include HTTP headers, which the simulator's counts leave out.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import procs  # noqa: E402
from bench.delayproxy import DelayProxy, build_c  # noqa: E402
from bench.measure import process_cpu_seconds  # noqa: E402
from bench.servers import WRITE_OPS, etcd_counters, etcd_server  # noqa: E402
from etcdq_v2.queue import Queue  # noqa: E402
from etcdq_v2.transport import connect  # noqa: E402

BACKLOG_PER_CONSUMER = 10
WINDOW_PER_CONSUMER = 20
WORK = (0.05, 0.45)
BATCH = 64
NAME = "q"
_RUN_TIMEOUT = 600.0


def _consumer(start: procs.StartLine, url: str, index: int, done: Any, first: Any,
              stop: Any) -> int:
    queue = Queue(connect(url), NAME, node_id=f"c{index}")
    rng = random.Random(index)
    completed = 0
    start()
    try:
        while not stop.value:
            claim = queue.claim(timeout=1.0)
            if claim is None:
                continue
            time.sleep(rng.uniform(*WORK))
            claim.complete({"by": index})
            completed += 1
            first[index] = 1
            with done.get_lock():
                done.value += 1
    finally:
        queue.close()
    return completed


def _producer(start: procs.StartLine, url: str, batched: bool, backlog: int, done: Any,
              put: Any, stop: Any) -> int:
    queue = Queue(connect(url), NAME, node_id=f"p{int(batched)}")
    made = 0
    start()
    try:
        while not stop.value:
            with put.get_lock():
                room = backlog - (put.value - done.value)
                size = max(0, min(room, BATCH if batched else 1))
                put.value += size
            if not size:
                time.sleep(0.02)
            elif batched:
                queue.put_many([f"item-{made + n}" for n in range(size)], in_flight=8)
            else:
                queue.put(f"item-{made}")
            made += size
    finally:
        queue.close()
    return made


def _snapshot(url: str, proxy: DelayProxy, pid: int) -> Dict[str, float]:
    counters = etcd_counters(url)
    moved = proxy.counters()
    counters.update(bytes_down=moved.bytes_down, bytes_up=moved.bytes_up,
                    connections=moved.accepted, etcd_cpu=process_cpu_seconds(pid))
    return counters


def measure(consumers: int, workdir: Path) -> Tuple[Dict[str, float], Dict[str, float], int, int]:
    """(the steady stretch's counter deltas, the start's, items of steady, of start)."""
    backlog = BACKLOG_PER_CONSUMER * consumers
    binary, why = build_c(workdir)
    if binary is None:
        print(f"costs_real: the Python proxy ({why})", file=sys.stderr)
    with etcd_server(workdir) as etcd, DelayProxy(etcd.url, 0.0, binary) as proxy:
        assert etcd.pid is not None
        Queue(connect(etcd.url), NAME).put_many([f"item-{n}" for n in range(backlog)],
                                                 in_flight=8)
        context = procs._CONTEXT
        done, put, stop = context.Value("i", 0), context.Value("i", backlog), context.Value("i", 0)
        first = context.Array("i", consumers)
        args = [(proxy.url, n, done, first, stop) for n in range(consumers)]
        with procs.Workers(_consumer, args) as takers, \
                procs.Workers(_producer, [(proxy.url, n == 1, backlog, done, put, stop)
                                          for n in range(2)]) as makers:
            makers.go()
            begun = _snapshot(etcd.url, proxy, etcd.pid)
            takers.go()
            _wait(lambda: all(first[:]))
            middle, at = _snapshot(etcd.url, proxy, etcd.pid), done.value
            _wait(lambda: done.value - at >= WINDOW_PER_CONSUMER * consumers)
            end, last = _snapshot(etcd.url, proxy, etcd.pid), done.value
            stop.value = 1
            takers.results(_RUN_TIMEOUT)
            makers.results(_RUN_TIMEOUT)
    return _delta(middle, end), _delta(begun, middle), last - at, at


def _wait(ready: Any) -> None:
    give_up = time.monotonic() + _RUN_TIMEOUT
    while not ready():
        if time.monotonic() > give_up:
            raise RuntimeError("costs_real: the run did not get there in time")
        time.sleep(0.01)


def _delta(before: Dict[str, float], after: Dict[str, float]) -> Dict[str, float]:
    return {key: after[key] - before.get(key, 0) for key in after}


def rows(delta: Dict[str, float], items: int) -> List[Tuple[str, float]]:
    """Per item: etcd's counts by operation, requests, bytes, etcd's CPU."""
    out = []
    for op in WRITE_OPS:
        for outcome in ("Success", "Fail"):
            value = delta.get(op + outcome, 0)
            if value:
                out.append((f"{op}{outcome}", value / items))
    for method in ("GET", "QGET", "PUT", "POST", "DELETE"):
        if delta.get("http" + method):
            out.append((f"HTTP {method} received", delta["http" + method] / items))
    out.append(("watch requests", delta.get("watches", 0) / items))
    writes = sum(delta.get(op + o, 0) for op in WRITE_OPS for o in ("Success", "Fail"))
    requests = writes + delta.get("httpGET", 0) + delta.get("httpQGET", 0) + \
        delta.get("watches", 0)
    out += [("**requests**", requests / items),
            ("**kB from etcd** (proxy, with headers)", delta["bytes_down"] / 1000 / items),
            ("kB to etcd (proxy)", delta["bytes_up"] / 1000 / items),
            ("etcd CPU ms", delta["etcd_cpu"] * 1000 / items)]
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--consumers", type=int, nargs="+", default=[8, 64])
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="costs-real-") as workdir:
        for consumers in args.consumers:
            results.append((consumers, measure(consumers, Path(workdir))))
            print(f"costs_real: {consumers} consumers done", file=sys.stderr)
    for index, stretch in ((0, "steady, per completed item"), (1, "start, per consumer")):
        print(f"\n#### real etcd, {stretch}\n")
        tables = []
        for consumers, measured in results:
            delta, items = measured[index], measured[2 + index]
            tables.append(dict(rows(delta, items if index == 0 else consumers)))
        names = list(dict.fromkeys(name for table in tables for name in table))
        print("| | " + " | ".join(f"{c} c" for c, _ in results) + " |")
        print("|---|" + "---:|" * len(results))
        for name in names:
            print(f"| {name} | " + " | ".join(f"{table.get(name, 0):.2f}" for table in tables)
                  + " |")
        print("| items completed | " + " | ".join(str(m[2 + index]) for _, m in results) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
