"""Consumers starting together on a deep queue: first-claim time and etcd's cost.

``python bench/costs_depth.py --pending 100000 --consumers 1 16 64``

One fresh etcd; the queue is filled to ``--pending`` items (bench/measure.py's
fill); then, for each count in turn, that many consumer processes start
together, make one claim each (``claim(timeout=60)``) and complete it.  Per
count: each process's first-claim time (median, max) and how many raised;
etcd's CPU over the whole start (``/proc/<pid>/stat``), the bytes etcd sent
through a counting proxy (bench/delayproxy.py, no delay), and the slowest of
an unrelated PUT made every 0.1 s meanwhile by the parent, straight to etcd.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import procs  # noqa: E402
from bench.delayproxy import DelayProxy, build_c  # noqa: E402
from bench.designs import ETCDQ, Target  # noqa: E402
from bench.measure import fill, process_cpu_seconds  # noqa: E402
from bench.servers import etcd_server  # noqa: E402
from etcdq_v2.errors import EtcdqError  # noqa: E402
from etcdq_v2.queue import Queue  # noqa: E402
from etcdq_v2.transport import connect  # noqa: E402

NAME = "deep"
_TIMEOUT = 900.0


def _first_claim(start: procs.StartLine, url: str, index: int) -> Tuple[float, str]:
    """(seconds to the first claim, "" or the error it raised)."""
    queue = Queue(connect(url), NAME, node_id=f"d{index}")
    try:
        start()
        began = time.monotonic()
        try:
            claim = queue.claim(timeout=60)
        except EtcdqError as exc:
            return time.monotonic() - began, f"{type(exc).__name__}: {exc}"[:200]
        took = time.monotonic() - began
        if claim is None:
            return took, "no item within 60 s"
        claim.complete(None)
        return took, ""
    finally:
        queue.close()


class _Prober:
    """An unrelated PUT every 0.1 s, straight to etcd: the slowest one."""

    def __init__(self, url: str) -> None:
        self._transport = connect(url, timeout=30.0)
        self._stop = threading.Event()
        self.slowest = 0.0
        self.failed = 0
        self._thread = threading.Thread(target=self._run, name="put-prober", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            began = time.monotonic()
            try:
                self._transport.put("/unrelated/key", "x")
            except EtcdqError:
                self.failed += 1
            self.slowest = max(self.slowest, time.monotonic() - began)

    def __enter__(self) -> "_Prober":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._transport.close()


def measure(pending: int, counts: List[int], workdir: Path) -> List[str]:
    binary, _ = build_c(workdir)
    lines = []
    with etcd_server(workdir) as etcd, DelayProxy(etcd.url, 0.0, binary) as proxy:
        assert etcd.pid is not None
        began = time.monotonic()
        fill(Target(ETCDQ, etcd.url, NAME), 0, pending)
        print(f"costs_depth: filled {pending} in {time.monotonic() - began:.0f} s",
              file=sys.stderr)
        for count in counts:
            with procs.Workers(_first_claim, [(proxy.url, n) for n in range(count)]) as workers:
                cpu, sent = process_cpu_seconds(etcd.pid), proxy.counters().bytes_down
                with _Prober(etcd.url) as prober:
                    workers.go()
                    results = workers.results(_TIMEOUT)
                cpu, sent = process_cpu_seconds(etcd.pid) - cpu, proxy.counters().bytes_down - sent
            times = [took for took, error in results]
            errors = [error for took, error in results if error]
            lines.append(f"| {count} | {statistics.median(times):.2f} | {max(times):.2f} | "
                         f"{len(errors)} | {cpu:.1f} | {sent / 1e6:.0f} | "
                         f"{prober.slowest:.2f} |")
            if errors:
                lines.append(f"<!-- {count}: {errors[0]} -->")
            print(f"costs_depth: {count} consumers done", file=sys.stderr)
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--consumers", type=int, nargs="+", default=[1, 16, 64])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="costs-depth-") as workdir:
        lines = measure(args.pending, args.consumers, Path(workdir))
    print(f"\n#### {args.pending:,} pending: consumers starting together\n")
    print("| consumers | first claim, median s | slowest s | raised | etcd CPU s | "
          "MB from etcd | slowest unrelated PUT s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
