"""Where etcd spends its CPU during a drain: a Go CPU profile, per item drained.

``python -m bench.etcd_profile 8 64`` (from the repository's root).  For each
number of consumer processes: a fresh etcd started with ``--enable-pprof``, a
2,000-item queue, then etcd's own CPU profile (``/debug/pprof/profile``, 100
samples a second) taken across the drain, and a table of the functions by
CPU per item drained, cumulative (a function and what it calls), side by
side for each count.  The profile is etcd's, not Python's: it says which part
of etcd's work grows with the number of consumers (listing and encoding
directories, raft and the WAL, HTTP), where the drains of bench/run.py give
only the total (bench/README.md, "The profile").  With ``--alone`` each
consumer drains a queue of its own (the items split evenly): what grows
then is not the queue's sharing.

The profile is gzipped protobuf (github.com/google/pprof, profile.proto); the
few fields needed are decoded here, so that nothing but Python is required.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import tempfile
import threading
import urllib.request
from pathlib import Path
from typing import Any, Counter, Dict, Iterator, List, Sequence, Tuple

from etcdq_v2.server import EtcdServer

from .designs import Target, open_design
from .measure import fill
from .procs import StartLine, run_workers

ITEMS = 2000
#: Seconds the profile covers: spawning 64 processes on 2 cores takes ~6 s, then the drain.
SECONDS = 14
TOP = 25


def _varint(data: bytes, at: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def _fields(data: bytes) -> Iterator[Tuple[int, int, Any]]:
    """(field number, wire type, value) of one protobuf message."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        kind: Any
        if key & 7 == 0:
            kind, at = _varint(data, at)
        elif key & 7 == 2:
            size, at = _varint(data, at)
            kind, at = data[at:at + size], at + size
        elif key & 7 == 1:
            kind, at = data[at:at + 8], at + 8
        elif key & 7 == 5:
            kind, at = data[at:at + 4], at + 4
        else:
            raise ValueError(f"wire type {key & 7} is not in profile.proto")
        yield key >> 3, key & 7, kind


def _numbers(wire: int, value: Any) -> List[int]:
    """A repeated integer field's values, packed or not."""
    if wire == 0:
        return [value]
    numbers, at, data = [], 0, value
    while at < len(data):
        number, at = _varint(data, at)
        numbers.append(number)
    return numbers


def cumulative(profile: bytes) -> Tuple[int, Counter[str]]:
    """Nanoseconds of CPU in all, and by function (each sample counted once per
    function on its stack)."""
    data = gzip.decompress(profile)
    samples: List[Tuple[List[int], List[int]]] = []
    locations: Dict[int, List[int]] = {}
    functions: Dict[int, int] = {}
    strings: List[str] = []
    for number, _, value in _fields(data):
        if number == 2:  # Sample: location_id (1), value (2)
            ids: List[int] = []
            values: List[int] = []
            for field, wire, item in _fields(value):
                (ids if field == 1 else values if field == 2 else []).extend(
                    _numbers(wire, item))
            samples.append((ids, values))
        elif number == 4:  # Location: id (1), line (4) with function_id (1)
            location = dict((f, v) for f, _, v in _fields(value))
            locations[location.get(1, 0)] = [
                v for f, _, line in _fields(value) if f == 4
                for g, _, v in _fields(line) if g == 1]
        elif number == 5:  # Function: id (1), name (2, a string index)
            function = dict((f, v) for f, _, v in _fields(value))
            functions[function.get(1, 0)] = function.get(2, 0)
        elif number == 6:
            strings.append(value.decode("utf-8", "replace"))
    spent: Counter[str] = collections.Counter()
    total = 0
    for ids, values in samples:
        total += values[-1]
        names = {strings[functions[f]] for i in ids for f in locations.get(i, [])}
        for name in names:
            spent[name] += values[-1]  # the last sample type: CPU nanoseconds
    return total, spent


def _consume(start: StartLine, target: Target) -> int:
    design = open_design(target)
    start()
    try:
        done = 0
        while design.claim() is not None:
            design.finish()
            done += 1
        return done
    finally:
        design.close()


Run = Tuple[int, int, int, Counter[str]]  # consumers, items drained, total ns, by function


def profile_drain(consumers: int, items: int = ITEMS, seconds: int = SECONDS,
                  alone: bool = False) -> Run:
    """A drain by ``consumers`` processes, and etcd's CPU profile across it.
    ``alone``: the items split over one queue per consumer, each consumer alone
    on its own (the queue's floor of bench/floor.py)."""
    queues = consumers if alone else 1
    with tempfile.TemporaryDirectory() as workdir:
        server = EtcdServer(Path(workdir) / "data", extra_args=["--enable-pprof"]).start()
        try:
            targets = [Target("etcdq_v2", server.url, f"q-{n}") for n in range(queues)]
            for n, target in enumerate(targets):
                fill(target, n * (items // queues), items // queues)
            got: Dict[str, bytes] = {}
            url = f"{server.url}/debug/pprof/profile?seconds={seconds}"
            taker = threading.Thread(target=lambda: got.update(p=urllib.request.urlopen(
                url, timeout=seconds + 30).read()))
            taker.start()
            done = sum(run_workers(_consume, [(targets[i % queues],) for i in range(consumers)],
                                   600))
            taker.join()
        finally:
            server.stop()
    return (consumers, done, *cumulative(got["p"]))


def table(runs: Sequence[Run], top: int = TOP) -> str:
    """Markdown: the ``top`` functions by CPU per item in the last run, µs per item."""
    per_item = [{name: ns / 1e3 / done for name, ns in spent.items()}
                for _, done, _, spent in runs]
    names = sorted(per_item[-1], key=lambda name: -per_item[-1][name])[:top]
    head = "| function (cumulative) | " + " | ".join(
        f"{consumers} consumers, µs/item" for consumers, *_ in runs) + " |"
    rows = [head, "|---|" + "---|" * len(runs)]
    rows.append("| all of etcd's samples | " + " | ".join(
        f"{total / 1e3 / done:.0f}" for _, done, total, _ in runs) + " |")
    for name in names:
        rows.append(f"| `{name}` | " + " | ".join(
            f"{costs.get(name, 0.0):.0f}" for costs in per_item) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("consumers", type=int, nargs="+", help="consumer processes, each a run")
    parser.add_argument("--items", type=int, default=ITEMS)
    parser.add_argument("--seconds", type=int, default=SECONDS, help="the profile's length")
    parser.add_argument("--top", type=int, default=TOP, help="rows of the table")
    parser.add_argument("--alone", action="store_true",
                        help="each consumer alone on a queue of its own (the queue's floor)")
    args = parser.parse_args()
    print(table([profile_drain(n, args.items, args.seconds, args.alone)
                 for n in args.consumers], args.top))


if __name__ == "__main__":
    main()
