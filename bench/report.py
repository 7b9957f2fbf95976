"""Markdown tables of the benchmark's runs: medians with min–max, and ratios to the best peer.

One function per section; each takes the raw runs of that section (several
repeats per configuration) and returns a markdown table as a string.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple, TypeVar

from .designs import DESIGNS, ETCDQ
from .measure import ClaimCostRun, DrainRun, WakeRun
from .servers import EtcdOps

R = TypeVar("R")
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Spread:
    """The median of repeated measurements, with the lowest and highest."""

    median: float
    low: float
    high: float
    runs: int

    @classmethod
    def of(cls, values: Iterable[float]) -> "Spread":
        values = list(values)
        return cls(statistics.median(values), min(values), max(values), len(values))

    def text(self, digits: int = 0, unit: str = "") -> str:
        """``"1,234 (1,200–1,260)"``; just the value when there was one run."""
        def number(value: float) -> str:
            return f"{value:,.{digits}f}{unit}"
        if self.runs == 1 or self.low == self.high:
            return number(self.median)
        return f"{number(self.median)} ({number(self.low)}–{number(self.high)})"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def group(runs: Iterable[R], key: Callable[[R], K]) -> Dict[K, List[R]]:
    """Runs of the same configuration together, in first-seen order."""
    groups: Dict[K, List[R]] = {}
    for run in runs:
        groups.setdefault(key(run), []).append(run)
    return groups


def ratio(value: float, reference: Optional[float]) -> str:
    return f"{value / reference:.2f}×" if reference else "–"


def _label(design: str) -> str:
    return DESIGNS[design].label


# -- 1. raw write rate ---------------------------------------------------------------------

def raw_table(rates: Dict[str, List[float]], skipped: Dict[str, str]) -> str:
    """``rates``: client description -> writes/s of each run."""
    rows = [[client, Spread.of(values).text(), str(len(values))]
            for client, values in rates.items()]
    rows += [[client, f"skipped: {reason}", "0"] for client, reason in skipped.items()]
    return markdown_table(["client", "etcd writes/s", "runs"], rows)


# -- 2. drain ---------------------------------------------------------------------------------

def _by_config(runs: Iterable[DrainRun]) -> Dict[Tuple[str, int], List[DrainRun]]:
    return group(runs, lambda run: (run.design, run.consumers))


def best_peer(by_config: Dict[Tuple[str, int], List[R]], value: Callable[[R], float]
              ) -> Dict[int, float]:
    """For each setting (consumers, or queue length): the best median ``value`` of any peer.

    ``by_config`` maps (design, setting) to that configuration's repeated runs.
    """
    best: Dict[int, float] = {}
    for (design, setting), same in by_config.items():
        if DESIGNS[design].peer:
            best[setting] = max(best.get(setting, 0.0), statistics.median(map(value, same)))
    return best


def best_peer_rates(runs: Iterable[DrainRun]) -> Dict[int, float]:
    """consumers -> the highest median items/s any peer reached with that many consumers."""
    return best_peer(_by_config(runs), lambda run: run.items_per_s)


def _percent_of_items(runs: Sequence[DrainRun], count: Callable[[DrainRun], int]) -> str:
    return Spread.of(100 * count(run) / run.items for run in runs).text(0, " %")


def drain_table(runs: Sequence[DrainRun], skipped: Dict[str, str]) -> str:
    best = best_peer_rates(runs)
    rows = []
    for (design, consumers), same in _by_config(runs).items():
        rates = Spread.of(run.items_per_s for run in same)
        busy = [run.fsync_busy for run in same if run.fsync_busy is not None]
        rows.append([_label(design), str(consumers), rates.text(), ratio(rates.median,
                     best.get(consumers)), _percent_of_items(same, lambda run: run.run_twice),
                     str(sum(run.missing for run in same)),
                     Spread.of(100 * b for b in busy).text(0, " %") if busy else "–"])
    rows += [[_label(design), "–", f"skipped: {reason}", "", "", "", ""]
             for design, reason in skipped.items()]
    return markdown_table(["design", "consumers", "items/s", "× best peer", "run twice",
                           "missing", "etcd busy in WAL fsync"], rows)


def contention_table(runs: Sequence[DrainRun]) -> str:
    rows = []
    for (design, consumers), same in _by_config(runs).items():
        failures = [run.lock_failures_per_claim for run in same]
        if None in failures:
            continue  # the design hides its lost races (Kazoo)
        rows.append([_label(design), str(consumers),
                     Spread.of(f for f in failures if f is not None).text(2),
                     Spread.of(run.items_per_s for run in same).text(),
                     _percent_of_items(same, lambda run: run.run_twice)])
    return markdown_table(["design", "consumers", "failed lock attempts / claim", "items/s",
                           "run twice"], rows)


def _per_item(runs: Sequence[DrainRun], count: Callable[[EtcdOps], float]) -> str:
    """``count`` of each run's put-to-done etcd operations, per item."""
    return Spread.of(count(run.etcd_ops) / run.items for run in runs
                     if run.etcd_ops is not None).text(2)


def operations_table(runs: Sequence[DrainRun]) -> str:
    rows = []
    for (design, consumers), same in _by_config(runs).items():
        if DESIGNS[design].backend != "etcd":
            continue
        batching = Spread.of((ops.writes + ops.failed_writes) / max(1, ops.fsyncs)
                             for ops in (run.drain_ops for run in same) if ops is not None)
        minimum = DESIGNS[design].min_writes_per_item
        rows.append([_label(design), str(consumers),
                     _per_item(same, lambda ops: ops.writes),
                     _per_item(same, lambda ops: ops.failed_writes),
                     _per_item(same, lambda ops: ops.reads),
                     _per_item(same, lambda ops: ops.watches),
                     "–" if minimum is None else str(minimum), batching.text(1)])
    return markdown_table(["design", "consumers", "writes/item", "failed writes/item",
                           "reads/item", "watches/item", "protocol minimum writes/item",
                           "writes per WAL fsync (drain)"], rows)


# -- 3. claim cost ----------------------------------------------------------------------------

def claim_cost_table(runs: Sequence[ClaimCostRun]) -> str:
    by_config = group(runs, lambda run: (run.design, run.pending))
    best = best_peer(by_config, lambda run: run.claims_per_s)
    rows = []
    for (design, pending), same in by_config.items():
        rates = Spread.of(run.claims_per_s for run in same)
        rows.append([_label(design), f"{pending:,}", rates.text(),
                     ratio(rates.median, best.get(pending)),
                     Spread.of(run.round_trips_median for run in same).text(1),
                     Spread.of(run.first_claim_s for run in same).text(2),
                     Spread.of(run.peak_rss_mb for run in same).text(0),
                     str(sum(run.claims for run in same))])
    return markdown_table(["design", "pending", "claims/s", "× best peer",
                           "round trips/claim (median)", "first claim (s)",
                           "consumer peak RSS (MB)", "claims timed"], rows)


# -- 4. wake latency ---------------------------------------------------------------------------

def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def wake_table(runs: Sequence[WakeRun]) -> str:
    rows = [[str(sum(run.puts for run in runs)),
             Spread.of(statistics.median(run.latencies_ms) for run in runs).text(1),
             Spread.of(percentile(run.latencies_ms, 0.9) for run in runs).text(1),
             f"{max(max(run.latencies_ms) for run in runs):.1f}",
             Spread.of(run.idle_requests_per_s for run in runs).text(2)]]
    return markdown_table(["puts", "median (ms)", "p90 (ms)", "max (ms)",
                           "etcd requests/s while idle"], rows)


# -- the targets ------------------------------------------------------------------------

def _median_of(values: Iterable[float]) -> Optional[float]:
    values = list(values)
    return statistics.median(values) if values else None


def _divide(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def _goal(goal: str, measured: Optional[float], shown: str,
          holds: Callable[[float], bool]) -> List[str]:
    """One row: the goal, the figure (``shown`` formats it), and whether it holds."""
    if measured is None:
        return [goal, "not measured", "–"]
    return [goal, shown.format(measured), "yes" if holds(measured) else "**no**"]


def targets_table(drains: Sequence[DrainRun], claim_costs: Sequence[ClaimCostRun],
                  wakes: Sequence[WakeRun], most_consumers: int) -> str:
    """Issue 4's targets, each with the figure measured in this run and whether it holds.

    "The best peer" is read two ways: the best peer with as many consumers
    (the issue's wording), and the best peer with any number of consumers (a
    peer's user would run the number that works best, e.g. one consumer for
    the global-mutex queue, whose waiters stampede).
    """
    rate = _median_of(r.items_per_s for r in drains
                      if r.design == ETCDQ and r.consumers == most_consumers)
    peer_rates = best_peer_rates(drains)
    costs = group((r for r in claim_costs if r.design == ETCDQ), lambda r: r.pending)
    claims_per_s = {pending: statistics.median(r.claims_per_s for r in same)
                    for pending, same in costs.items()}
    shortest, longest = (min(costs), max(costs)) if costs else (0, 0)
    rows = [
        _goal(f"{most_consumers} consumers: ≥ 3× the best peer with {most_consumers}",
              _divide(rate, peer_rates.get(most_consumers)), "{:.2f}×", lambda x: x >= 3),
        _goal(f"{most_consumers} consumers: ≥ 3× the best peer with any number",
              _divide(rate, max(peer_rates.values(), default=None)), "{:.2f}×",
              lambda x: x >= 3),
        _goal(f"{most_consumers} consumers: ≥ 1,000 items/s", rate, "{:,.0f} items/s",
              lambda x: x >= 1000),
        _goal("no item run twice (all etcdq_v2 drains)",
              sum(r.run_twice for r in drains if r.design == ETCDQ), "{:.0f} run twice",
              lambda x: x == 0),
        _goal(f"claims/s at {longest:,} pending ≥ 0.8× at {shortest:,}",
              _divide(claims_per_s.get(longest), claims_per_s.get(shortest)), "{:.2f}×",
              lambda x: x >= 0.8),
        _goal("≤ 2 round trips per claim (median, worst queue length)",
              max((r.round_trips_median for r in claim_costs if r.design == ETCDQ),
                  default=None), "{:.1f}", lambda x: x <= 2),
        _goal("blocking claim wakes within 50 ms (median)",
              _median_of(ms for run in wakes for ms in run.latencies_ms), "{:.1f} ms",
              lambda x: x <= 50),
    ]
    return markdown_table(["target (issue 4)", "measured", "holds"], rows)


# -- 7. scaling with consumers (issue 14) ------------------------------------------------

def _scale_runs(drains: Sequence[DrainRun], counts: Sequence[int]) -> Dict[int, List[DrainRun]]:
    return {consumers: same for (design, consumers), same in _by_config(drains).items()
            if design == ETCDQ and consumers in counts}


def _medians(runs: Dict[int, List[DrainRun]], value: Callable[[DrainRun], Optional[float]]
             ) -> Dict[int, float]:
    found = {n: [v for v in map(value, same) if v is not None] for n, same in runs.items()}
    return {n: statistics.median(values) for n, values in found.items() if values}


def scale_table(drains: Sequence[DrainRun], counts: Sequence[int]) -> str:
    """etcdq_v2's drains as consumers are added: rate, and CPU per item (etcd's, the clients')."""
    runs = _scale_runs(drains, counts)
    rates = _medians(runs, lambda r: r.items_per_s)
    steady = _medians(runs, lambda r: r.steady_items_per_s)
    etcd = _medians(runs, lambda r: r.etcd_cpu_ms_per_item)
    first = min(runs, default=0)
    rows = []
    for consumers, same in sorted(runs.items()):
        etcd_ms = [r.etcd_cpu_ms_per_item for r in same if r.etcd_cpu_ms_per_item is not None]
        rows.append([
            str(consumers), Spread.of(r.items_per_s for r in same).text(),
            ratio(rates[consumers], rates.get(first)),
            _spread_or_dash([r.steady_items_per_s for r in same], 0),
            ratio(steady[consumers], steady.get(first)) if consumers in steady else "–",
            _spread_or_dash([r.first_item_s for r in same], 2),
            Spread.of(etcd_ms).text(2) if etcd_ms else "–",
            ratio(etcd[consumers], etcd.get(first)) if consumers in etcd else "–",
            Spread.of(r.clients_cpu_ms_per_item for r in same).text(2),
            Spread.of(r.drain_ops.failed_writes / r.items for r in same
                      if r.drain_ops is not None).text(2) if same[0].drain_ops else "–",
            Spread.of(r.drain_ops.fsyncs / r.items for r in same
                      if r.drain_ops is not None).text(2) if same[0].drain_ops else "–",
            _percent_of_items(same, lambda run: run.run_twice)])
    return markdown_table(["consumer processes", "items/s", f"× {first}",
                           "steady items/s", f"× {first}", "first item, s",
                           "etcd CPU ms/item", f"× {first}", "clients' CPU ms/item",
                           "failed writes/item", "WAL fsyncs/item", "run twice"], rows)


def _spread_or_dash(values: Sequence[Optional[float]], digits: int) -> str:
    known = [value for value in values if value is not None]
    return Spread.of(known).text(digits) if known else "–"


def scale_targets_table(drains: Sequence[DrainRun], counts: Sequence[int]) -> str:
    """Issue 14's targets 1 and 2 (consumer processes; against the peers)."""
    runs = _scale_runs(drains, counts)
    rates = _medians(runs, lambda r: r.items_per_s)
    etcd = _medians(runs, lambda r: r.etcd_cpu_ms_per_item)
    low, high = (min(runs), max(runs)) if runs else (0, 0)
    peers = best_peer_rates(drains)
    rows = [
        _goal(f"{high} consumers drain at ≥ 0.8× the {low}-consumer rate",
              _divide(rates.get(high), rates.get(low)), "{:.2f}×", lambda x: x >= 0.8),
        _goal(f"etcd CPU per item at {high} consumers ≤ 1.25× at {low}",
              _divide(etcd.get(high), etcd.get(low)), "{:.2f}×", lambda x: x <= 1.25),
        _goal(f"{low} consumers: ≥ 3× the best peer with {low}",
              _divide(rates.get(low), peers.get(low)), "{:.2f}×", lambda x: x >= 3),
        _goal(f"{low} consumers: ≥ 1,000 items/s", rates.get(low), "{:,.0f} items/s",
              lambda x: x >= 1000),
        _goal("no item run twice, none missing (these drains)",
              sum(r.run_twice + r.missing for same in runs.values() for r in same),
              "{:.0f}", lambda x: x == 0),
    ]
    return markdown_table(["target (issue 14)", "measured", "holds"], rows)
