"""How fast one process puts items: ``python bench/producers.py [--items N] [--repeats R]``.

Starts its own etcd (bench/run.py's "producers" section gives it one), then
in each repeat runs every row once, in this order, so that the machine's
noise falls on the rows alike and each row's ratio to the ``put()`` loop is
taken within its repeat:

* ``put()`` loop: N items, one ``put()`` each, one round trip after the other;
* ``put_many(in_flight=1)`` (the default: strictly in the order given);
* ``put_many(in_flight=16)`` and ``put_many(in_flight=64)``: that many POSTs
  awaiting etcd at once, one connection each (docs/protocol.md, "put_many
  with in_flight");
* ``etcdq put Q -`` with N lines on stdin, with and without
  ``--in-flight 16``: a child process, its interpreter's start included.

The library rows run in one spawned process (bench/procs.py), its start
kept out of the figures.  Besides items/s: the putting process's CPU per
item (user + system), etcd's CPU per item (``/proc/<pid>/stat``; Linux), and
etcd's writes per WAL fsync (bench/servers.py's counters): how many POSTs
one disk flush committed.  bench/README.md, "Producers", has a run.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.procs import StartLine, run_workers  # noqa: E402
from bench.report import Spread, markdown_table  # noqa: E402
from bench.servers import EtcdOps, etcd_counters, etcd_server  # noqa: E402
from etcdq_v2 import Queue  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LOOP = "put() loop"
#: The rows of the library, in the order each repeat runs them: row -> in_flight
#: (0: the put() loop).
LIBRARY_ROWS = {LOOP: 0, "put_many(in_flight=1)": 1, "put_many(in_flight=16)": 16,
                "put_many(in_flight=32)": 32,
                "put_many(in_flight=64)": 64}
#: The rows of the command line: row -> its extra arguments.
CLI_ROWS = {"etcdq put - (process start included)": [],
            "etcdq put --in-flight 16 - (process start included)": ["--in-flight", "16"]}
#: The rows that issue 14's target 4 compares with the loop, and the ratio it asks.
TARGET_ROWS, TARGET_RATIO = ("put_many(in_flight=16)", "put_many(in_flight=64)"), 3.0
#: A run that takes longer than this is broken, not slow.
RUN_TIMEOUT = 600.0


@dataclass
class ProducerRun:
    """One row, once: ``items`` put in ``seconds``, and what it cost."""

    row: str
    repeat: int
    items: int
    seconds: float
    client_cpu_s: float            # the putting process: user + system
    etcd_cpu_s: Optional[float]    # None where /proc is missing
    writes: int                    # etcd's successful writes meanwhile
    fsyncs: int                    # etcd's WAL fsyncs meanwhile

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds


def payloads(row: str, repeat: int, items: int) -> List[str]:
    return [f"{row}-{repeat}-{n:07d}" for n in range(items)]


def etcd_cpu(pid: Optional[int]) -> Optional[float]:
    """etcd's user + system CPU seconds so far; None without /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(row: str, repeat: int, items: int, url: str, pid: Optional[int],
          cpu: Callable[[], float], action: Callable[[], None]) -> ProducerRun:
    """Run ``action`` (putting ``items`` items) and measure it."""
    before, etcd_before, cpu_before = etcd_counters(url), etcd_cpu(pid), cpu()
    started = time.perf_counter()
    action()
    seconds = time.perf_counter() - started
    cpu_after, etcd_after = cpu(), etcd_cpu(pid)
    ops = EtcdOps.between(before, etcd_counters(url))
    spent = None if etcd_before is None or etcd_after is None else etcd_after - etcd_before
    return ProducerRun(row, repeat, items, seconds, cpu_after - cpu_before, spent,
                       ops.writes, ops.fsyncs)


def _put(queue: Queue, given: List[str], in_flight: int) -> Callable[[], None]:
    def run() -> None:
        if in_flight:
            ids = queue.put_many(given, in_flight=in_flight)
        else:
            ids = [queue.put(payload) for payload in given]
        assert len(set(ids)) == len(given), "an item is missing"
    return run


def _library_rows(start: StartLine, url: str, pid: Optional[int], repeat: int,
                  items: int) -> List[ProducerRun]:
    """Every library row once, each on a queue of its own (in a worker process)."""
    runs = []
    with Queue(url, "producers-warm-up") as warm:
        warm.put_many(["warm", "up"], in_flight=2)  # imports and first connections
    start()
    for row, in_flight in LIBRARY_ROWS.items():
        with Queue(url, f"producers-{repeat}-{in_flight}") as queue:
            given = payloads(row, repeat, items)
            runs.append(timed(row, repeat, items, url, pid, _own_cpu,
                              _put(queue, given, in_flight)))
    return runs


def _cli_put(url: str, queue: str, lines: List[str], extra: List[str]) -> Callable[[], None]:
    command = [sys.executable, "-m", "etcdq_v2", "--endpoints", url, "put", queue, "-", *extra]
    environment = dict(os.environ, PYTHONPATH=str(ROOT))

    def run() -> None:
        done = subprocess.run(command, input="\n".join(lines) + "\n", capture_output=True,
                              text=True, cwd=ROOT, env=environment, timeout=RUN_TIMEOUT)
        if done.returncode != 0 or len(done.stdout.split()) != len(lines):
            raise RuntimeError(f"etcdq put failed ({done.returncode}): {done.stderr[-500:]}")
    return run


def one_repeat(url: str, pid: Optional[int], repeat: int, items: int) -> List[ProducerRun]:
    """Every row once: the library's in a fresh process, then the command line's."""
    runs = run_workers(_library_rows, [(url, pid, repeat, items)], RUN_TIMEOUT)[0]
    for number, (row, extra) in enumerate(CLI_ROWS.items()):
        lines = payloads(row, repeat, items)
        action = _cli_put(url, f"producers-{repeat}-cli{number}", lines, extra)
        runs.append(timed(row, repeat, items, url, pid, _children_cpu, action))
    return runs


def measure(url: str, pid: Optional[int], items: int, repeats: int,
            progress: Callable[[str], None] = lambda message: None) -> List[ProducerRun]:
    runs: List[ProducerRun] = []
    for repeat in range(repeats):
        progress(f"producers: {items:,} items, run {repeat + 1}")
        runs += one_repeat(url, pid, repeat, items)
    return runs


# -- the tables ---------------------------------------------------------------------------

def _ratios(runs: Sequence[ProducerRun], row: str) -> List[float]:
    """Each repeat's items/s of ``row`` divided by that repeat's put() loop."""
    loops = {run.repeat: run.items_per_s for run in runs if run.row == LOOP}
    return [run.items_per_s / loops[run.repeat] for run in runs
            if run.row == row and run.repeat in loops]


def _per_item_us(values: Sequence[Optional[float]], items: int) -> str:
    known = [value for value in values if value is not None]
    return Spread.of(v / items * 1e6 for v in known).text(0) if known else "–"


def table(runs: Sequence[ProducerRun]) -> str:
    rows = []
    for row in [*LIBRARY_ROWS, *CLI_ROWS]:
        same = [run for run in runs if run.row == row]
        if not same:
            continue
        items = same[0].items
        ratios = _ratios(runs, row)
        fsyncs = [run.writes / run.fsyncs for run in same if run.fsyncs]
        rows.append([row, f"{items:,}", Spread.of(r.items_per_s for r in same).text(),
                     Spread.of(ratios).text(2, "×") if ratios else "–",
                     _per_item_us([r.client_cpu_s for r in same], items),
                     _per_item_us([r.etcd_cpu_s for r in same], items),
                     Spread.of(fsyncs).text(1) if fsyncs else "–"])
    return markdown_table(["producer", "items", "items/s", "× put() loop (same run)",
                           "producer CPU µs/item", "etcd CPU µs/item", "writes per WAL fsync"],
                          rows)


def target_table(runs: Sequence[ProducerRun]) -> str:
    """Target 4: each of TARGET_ROWS against the put() loop, median of the ratios."""
    items = f"{runs[0].items:,}" if runs else "no"
    rows = []
    for row in TARGET_ROWS:
        ratios = _ratios(runs, row)
        measured = statistics.median(ratios) if ratios else None
        count = f"{len(ratios)} run{'' if len(ratios) == 1 else 's'}"
        rows.append([f"{row} of {items} items ≥ {TARGET_RATIO:g}× a put() loop",
                     f"{measured:.2f}× (median of {count})" if measured else "not measured",
                     "–" if measured is None else "yes" if measured >= TARGET_RATIO else "no"])
    return markdown_table(["target (issue 14, 4)", "measured", "holds"], rows)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work, etcd_server(Path(work)) as server:
        runs = measure(server.url, server.pid, args.items, args.repeats,
                       lambda message: print(message, file=sys.stderr, flush=True))
    print(table(runs))
    print()
    print(target_table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
