"""Run the whole benchmark: ``python bench/run.py [--quick] [--full] [--out bench/results]``.

Starts its own servers (a fresh etcd per section, ZooKeeper for the Kazoo
peer when available), runs every section, prints one markdown table per
section to stdout (progress goes to stderr), and writes into ``--out``:
``results.json`` (every run's raw figures), ``tables.md`` (what was printed)
and ``bench.png`` (when matplotlib is installed).  bench/README.md explains
each table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

if __package__ in (None, ""):
    # Run as a script: make the ``bench`` package importable.  Its modules use
    # package imports, and spawned worker processes import them by that name.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import floor, measure, network, network_tables, plot, producers, report  # noqa: E402
from bench.designs import DESIGNS, ETCDQ, Target  # noqa: E402
from bench.servers import ZooKeeperUnavailable, etcd_server, zookeeper_server  # noqa: E402
from etcdq_v2.server import etcd_version, find_etcd_binary  # noqa: E402

#: Designs raced with more consumers than the drains use, for the contention table.
CONTENTION_DESIGNS = ("literal", ETCDQ)
#: Prefixes of the row names in Results.skipped: which table a skipped row belongs to.
RAW, DRAIN, CLAIM_COST, WAKE = "raw write rate: ", "drain: ", "claim cost: ", "wake latency: "
PRODUCERS = "producers: "
FLOOR = "floor: "


@dataclass(frozen=True)
class Plan:
    """How much of everything to run; ``--quick`` and ``--full`` pick one."""

    repeats: int
    drain_items: int
    raw_seconds: float
    probe_claims: int        # claims timed per claim-cost probe ...
    probe_budget_s: float    # ... or fewer, if these seconds run out first
    literal_lengths: Tuple[int, ...]
    idle_s: float            # how long the blocked consumer is watched for polling
    drain_consumers: Tuple[int, ...] = (1, 4, 8)
    contention_consumers: Tuple[int, ...] = (8, 32)
    #: etcdq_v2 only (issue 14): the cost of an item as consumers are added.
    scale_consumers: Tuple[int, ...] = (8, 32, 64)
    etcdq_lengths: Tuple[int, ...] = (1_000, 10_000, 100_000)
    wrk_connections: int = 64
    wake_puts: int = 50
    producer_items: int = 10_000
    #: The floor (issue 14): etcd writes in all, split over each of scale_consumers.
    floor_writes: int = 32_000

    @classmethod
    def choose(cls, quick: bool, full: bool, repeats: Optional[int]) -> "Plan":
        if quick:
            plan = cls(repeats=1, drain_items=500, raw_seconds=2, probe_claims=200,
                       probe_budget_s=2, literal_lengths=(1_000, 10_000), idle_s=1,
                       floor_writes=3_200)
        else:
            plan = cls(repeats=3, drain_items=2000, raw_seconds=3, probe_claims=300,
                       probe_budget_s=4, literal_lengths=(1_000, 10_000), idle_s=2)
        if full:
            # The literal design at 100,000 pending: ~10 claims/s, each listing 20 MB.
            plan = replace(plan, literal_lengths=(1_000, 10_000, 100_000))
        return replace(plan, repeats=repeats) if repeats else plan


@dataclass
class Results:
    """Every run of every section, as measured."""

    raw: Dict[str, List[float]] = field(default_factory=dict)
    drains: List[measure.DrainRun] = field(default_factory=list)
    claim_costs: List[measure.ClaimCostRun] = field(default_factory=list)
    wakes: List[measure.WakeRun] = field(default_factory=list)
    producers: List[producers.ProducerRun] = field(default_factory=list)
    floor: List[floor.FloorRun] = field(default_factory=list)  # bare writes (issue 14)
    #: The queue's floor and one shared queue beside it, fresh etcds (issue 14).
    floor_drains: List[measure.DrainRun] = field(default_factory=list)
    #: Every consumer's first listing of a drain's backlog, alone (issue 14).
    floor_listings: List[floor.ListingRun] = field(default_factory=list)
    skipped: Dict[str, str] = field(default_factory=dict)  # row name -> why it did not run
    network: Optional[network.NetworkResults] = None  # across a network, resources (issue 14)

    def skipped_in(self, section: str) -> Dict[str, str]:
        """The skipped rows of one section (a row-name prefix), without the prefix."""
        return {name[len(section):]: why for name, why in self.skipped.items()
                if name.startswith(section)}


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextmanager
def row(results: Results, name: str) -> Iterator[None]:
    """Run one row of a table; if it cannot run here or fails, note why and carry on.

    One design failing (the core is still changing) must not lose every
    other design's figures; the traceback still goes to stderr.
    """
    try:
        yield
    except ZooKeeperUnavailable as exc:
        results.skipped[name] = str(exc)
        progress(f"{name}: skipped: {exc}")
    except Exception as exc:
        traceback.print_exc()
        last_line = (str(exc).strip().splitlines() or [""])[-1]
        results.skipped[name] = f"failed: {type(exc).__name__}: {last_line}"
        progress(f"{name}: FAILED")


@contextmanager
def server_for(design: str, workdir: Path) -> Iterator[Tuple[str, Optional[int]]]:
    """A fresh server of the kind ``design`` needs; yields its address, and its
    PID if it is etcd (to count its CPU)."""
    if DESIGNS[design].backend == "zookeeper":
        with zookeeper_server(workdir) as hosts:
            yield hosts, None
    else:
        with etcd_server(workdir) as server:
            yield server.url, server.pid


# -- sections ------------------------------------------------------------------------------

def run_raw(plan: Plan, workdir: Path, results: Results) -> None:
    processes = max(plan.drain_consumers)
    python_rows: Dict[str, Callable[[str], float]] = {
        "Python loop, urllib3, 1 keep-alive connection":
            lambda url: measure.python_write_rate(url, plan.raw_seconds),
        f"{processes} Python loops in {processes} processes, 1 connection each":
            lambda url: measure.parallel_python_write_rate(url, plan.raw_seconds, processes),
    }
    wrk_row = f"wrk, {plan.wrk_connections} keep-alive connections"
    with etcd_server(workdir) as server:
        for name, rate in python_rows.items():
            with row(results, RAW + name):
                results.raw[name] = [rate(server.url) for _ in range(plan.repeats)]
        missing = measure.wrk_missing()
        if missing:
            results.skipped[RAW + wrk_row] = missing
            return
        with row(results, RAW + wrk_row):
            results.raw[wrk_row] = [
                measure.wrk_write_rate(server.url, plan.raw_seconds, plan.wrk_connections)
                for _ in range(plan.repeats)]


def _consumer_counts(plan: Plan, design: str) -> List[int]:
    extra = plan.contention_consumers if design in CONTENTION_DESIGNS else ()
    scale = plan.scale_consumers if design == ETCDQ else ()
    return sorted(set(plan.drain_consumers) | set(extra) | set(scale))


def run_drains(plan: Plan, workdir: Path, results: Results) -> None:
    for design in DESIGNS:
        with row(results, DRAIN + design), server_for(design, workdir) as (address, pid):
            for consumers in _consumer_counts(plan, design):
                for repeat in range(plan.repeats):
                    progress(f"drain: {design}, {consumers} consumers, run {repeat + 1}")
                    target = Target(design, address, f"drain-{consumers}-{repeat}")
                    results.drains.append(
                        measure.drain(target, plan.drain_items, consumers, pid))


def run_claim_costs(plan: Plan, workdir: Path, results: Results) -> None:
    for design, lengths in ((ETCDQ, plan.etcdq_lengths), ("literal", plan.literal_lengths)):
        with row(results, CLAIM_COST + design), etcd_server(workdir) as server:
            queue = measure.QueueAtLength(Target(design, server.url, "claims"))
            for pending in lengths:
                for repeat in range(plan.repeats):
                    progress(f"claim cost: {design}, {pending:,} pending, run {repeat + 1}")
                    results.claim_costs.append(
                        queue.probe(pending, plan.probe_claims, plan.probe_budget_s))


def run_network(plan: Plan, workdir: Path, results: Results) -> None:
    """Across a network and resources (issue 14): bench/network.py, with its own plan
    (its quick one under ``--quick``, whose drains are shorter than 2,000 items)."""
    quick = plan.drain_items < Plan.choose(False, False, None).drain_items
    results.network = network.run_section(network.NetworkPlan.choose(quick, plan.repeats),
                                          workdir, progress)


def run_wake(plan: Plan, workdir: Path, results: Results) -> None:
    with row(results, WAKE + ETCDQ), etcd_server(workdir) as server:
        for repeat in range(plan.repeats):
            progress(f"wake latency: run {repeat + 1}")
            results.wakes.append(
                measure.wake_latency(server.url, f"wake-{repeat}", plan.wake_puts, plan.idle_s))


def run_producers(plan: Plan, workdir: Path, results: Results) -> None:
    with row(results, PRODUCERS + ETCDQ), etcd_server(workdir) as server:
        results.producers += producers.measure(server.url, server.pid, plan.producer_items,
                                               plan.repeats, progress)


def run_floor(plan: Plan, workdir: Path, results: Results) -> None:
    """Bare etcd writes from each of scale_consumers processes, and the queue's floor:
    as many consumers, each alone on its own queue, beside one shared queue
    (bench/floor.py)."""
    with row(results, FLOOR + "etcd writes"):
        results.floor += floor.measure(workdir, plan.scale_consumers, plan.floor_writes,
                                       plan.repeats, progress)
    with row(results, FLOOR + "consumers alone on a queue each, and on one"):
        results.floor_drains += floor.measure_drains(workdir, plan.scale_consumers,
                                                     plan.drain_items, plan.repeats, progress)
    with row(results, FLOOR + "first listings of the backlog"):
        results.floor_listings += floor.measure_listings(workdir, plan.scale_consumers,
                                                         plan.drain_items, plan.repeats,
                                                         progress)


#: The sections, in the order they run: ``--only`` names them.
SECTIONS: Dict[str, Callable[[Plan, Path, Results], None]] = {
    "raw": run_raw, "drains": run_drains, "claim-cost": run_claim_costs, "wake": run_wake,
    "producers": run_producers, "network": run_network, "floor": run_floor}


# -- output ----------------------------------------------------------------------------------

def tables(plan: Plan, results: Results) -> List[Tuple[str, str]]:
    """(title, markdown table) for the core sections that ran, in the order printed."""
    drains = [run for run in results.drains if run.consumers in plan.drain_consumers]
    contention = [run for run in results.drains if run.consumers in plan.contention_consumers
                  and DESIGNS[run.design].backend == "etcd"]
    per_item = [run for run in results.drains
                if run.consumers in (min(plan.drain_consumers), max(plan.drain_consumers))]
    sections: List[Tuple[str, bool, Callable[[], str]]] = [
        ("1. Raw etcd write rate", bool(results.raw) or bool(results.skipped_in(RAW)),
         lambda: report.raw_table(results.raw, results.skipped_in(RAW))),
        (f"2. Drain throughput: {plan.drain_items:,} items, consumer processes", bool(drains),
         lambda: report.drain_table(drains, results.skipped_in(DRAIN))),
        ("3. Claim cost against queue length (one consumer process)",
         bool(results.claim_costs), lambda: report.claim_cost_table(results.claim_costs)),
        ("4. Contention: consumers racing for the head of the queue", bool(contention),
         lambda: report.contention_table(contention)),
        ("5. Blocking-claim wake latency (etcdq_v2)", bool(results.wakes),
         lambda: report.wake_table(results.wakes)),
        ("6. etcd operations per item, counted by etcd itself, put to done", bool(per_item),
         lambda: report.operations_table(per_item)),
        ("Targets of issue 4", bool(drains), lambda: report.targets_table(
            drains, results.claim_costs, results.wakes, max(plan.drain_consumers))),
        (f"7. Scaling with consumers: {plan.drain_items:,}-item drains, consumer processes",
         bool(results.drains), lambda: report.scale_table(results.drains,
                                                          plan.scale_consumers)),
        ("Targets of issue 14, consumers and peers", bool(results.drains),
         lambda: report.scale_targets_table(results.drains, plan.scale_consumers)),
    ]
    # A section not run (``--only``) has no table.
    return [(title, build()) for title, ran, build in sections if ran]


def producer_tables(plan: Plan, results: Results) -> List[Tuple[str, str]]:
    """The producers section's tables (bench/producers.py): the rates, and target 4."""
    if not results.producers:
        return []
    return [(f"Producers: {plan.producer_items:,} items from one process",
             producers.table(results.producers)),
            ("Target 4 of issue 14 (producers)", producers.target_table(results.producers))]


def floor_tables(plan: Plan, results: Results) -> List[Tuple[str, str]]:
    """The floor's table; next to the drains, and the bound, when both ran."""
    if not results.floor:
        return []
    low, high = min(plan.scale_consumers), max(plan.scale_consumers)
    sections = [(f"The floor: {plan.floor_writes:,} etcd writes from "
                 f"{', '.join(map(str, plan.scale_consumers))} processes",
                 floor.table(results.floor))]
    shared, alone = floor.shared(results.floor_drains), floor.alone(results.floor_drains)
    held = floor.paced(results.floor_drains)
    if alone:
        sections.append((f"The queue's floor: {plan.drain_items:,} items split over one queue "
                         "per consumer process, each alone on its own",
                         report.scale_table(alone, plan.scale_consumers)))
    if shared:
        sections.append((f"Beside it, one shared queue: {plan.drain_items:,} items, each drain "
                         "on a fresh etcd", report.scale_table(shared, plan.scale_consumers)))
    if held:
        sections.append((f"{low} consumers on one shared queue, held to the rate {high} reached "
                         "(etcd's CPU per item at the same rate)",
                         report.scale_table(held, [low])))
    if results.floor_listings:
        sections.append((f"The first listings: each process lists a queue of "
                         f"{plan.drain_items:,} items once, all at once, nothing else",
                         floor.listings_table(results.floor_listings)))
    label = "one shared queue, fresh etcds (items)" if shared else "etcdq_v2 drains (items)"
    beside = floor.comparison(results.floor, shared or results.drains, low, high, alone, label,
                              results.floor_listings, held)
    if beside is not None:
        sections.append((f"The floor next to the drains: {high} processes against {low}",
                         beside))
    return sections


def chosen_tables(plan: Plan, results: Results, ran: Sequence[str]) -> List[Tuple[str, str]]:
    """The tables of the sections that ran, and the rows not measured."""
    sections = tables(plan, results)
    sections += producer_tables(plan, results)
    sections += floor_tables(plan, results)
    sections += network_tables.tables(results.network) if results.network else []
    if results.skipped:
        sections.append(("Not measured", report.markdown_table(
            ["row", "why"], [[name, why] for name, why in results.skipped.items()])))
    return sections


def metadata(plan: Plan, argv: Sequence[str], seconds: float) -> Dict[str, Any]:
    binary = find_etcd_binary()
    return {
        "command": " ".join(["python", "bench/run.py", *argv]),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "wall_seconds": round(seconds, 1),
        "plan": asdict(plan),
        "etcd": f"{etcd_version(binary)} ({binary})",
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
    }


def write_outputs(out: Path, results: Results, printed: str,
                  meta: Dict[str, Any]) -> List[Path]:
    out.mkdir(parents=True, exist_ok=True)
    raw = {"meta": meta, "skipped": results.skipped, "raw_write_rate": results.raw,
           "drains": [asdict(run) for run in results.drains],
           "claim_costs": [asdict(run) for run in results.claim_costs],
           "wakes": [asdict(run) for run in results.wakes],
           "producers": [asdict(run) for run in results.producers],
           "floor": [asdict(run) for run in results.floor],
           "floor_drains": [asdict(run) for run in results.floor_drains],
           "floor_listings": [asdict(run) for run in results.floor_listings],
           "network": asdict(results.network) if results.network else None}
    written = [out / "results.json", out / "tables.md"]
    written[0].write_text(json.dumps(raw, indent=1) + "\n")
    written[1].write_text(printed)
    rtt = results.network.drains if results.network else ()
    note = plot.draw(results.drains, results.claim_costs, out / "bench.png", rtt) \
        if results.drains or results.claim_costs or rtt else "nothing to plot: no PNG"
    if note:
        print(f"\n_{note}_")
    else:
        written.append(out / "bench.png")
    return written


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="fewer items and one run per configuration (a few minutes)")
    parser.add_argument("--full", action="store_true",
                        help="also time the literal design at 100,000 pending (slow)")
    parser.add_argument("--repeats", type=int, help="runs per configuration (default 3, 1 quick)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results",
                        help="directory for results.json, tables.md, bench.png")
    parser.add_argument("--keep", action="store_true",
                        help="keep the servers' data directories and logs")
    parser.add_argument("--only", action="append", choices=list(SECTIONS), metavar="SECTION",
                        help=f"run only this section (again for more): {', '.join(SECTIONS)}")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    plan = Plan.choose(args.quick, args.full, args.repeats)
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="etcdq-bench-"))
    results = Results()
    try:
        ran = [name for name in SECTIONS if not args.only or name in args.only]
        for name in ran:
            progress(f"section: {name}")
            SECTIONS[name](plan, workdir, results)
        meta = metadata(plan, argv, time.monotonic() - began)
        printed = "".join(f"### {title}\n\n{table}\n\n"
                          for title, table in chosen_tables(plan, results, ran))
        printed += (f"_`{meta['command']}`: {meta['wall_seconds']:.0f} s, etcd {meta['etcd']}, "
                    f"Python {meta['python']}, {meta['machine']}._\n")
        print(printed, end="", flush=True)
        for path in write_outputs(args.out, results, printed, meta):
            progress(f"wrote {path}")
    finally:
        if args.keep:
            progress(f"kept server data and logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    progress(f"done in {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
